/* Owns pre-copies (PreCopyRequest): the GPU memory of a running process
 * written into its image directory ahead of its dump, for migrations, so
 * that the dump has only the chunks written since to store:
 *
 *   snapshot the buffers (a dup of each exported fd: the process may free
 *   and allocate meanwhile, the registry is not touched by the worker)
 *   -> import them (gpucrd's own mappings, released when the rounds end)
 *   -> round 0: every non-zero chunk into the pages files, each chunk's
 *      fingerprint taken from the bytes actually stored (imgio.c)
 *   -> rounds 1..N: fingerprints on the device; the chunks whose
 *      fingerprint is not that of what was stored are dirty and written
 *      again, while the dirty set shrinks by a quarter or more
 *   -> held in proc.precopy until the process's dump into the same
 *      directory takes it (dump.c, imgio_write's final pass), or until it is
 *      discarded, replaced, or the process goes.
 *
 * The process runs throughout: a chunk it writes while being copied is
 * stored torn, and its recorded fingerprint matches nothing it holds later,
 * so it is dirty in the next round or at T. Nothing here needs the shim's
 * predictions: fingerprints decide. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "gpucrd.h"
#include "log.h"

#define PC_ROUNDS_DEFAULT 4
#define PC_ROUNDS_MAX 64

struct precopy {
	struct pc_image img;
	struct daemon *d;
	struct proc *p;
	pid_t pid;
	struct conn *req_conn;      /* held until answered */
	uint64_t req_id;
	unsigned max_rounds;
	int running;                /* a worker holds it */
	int err;
	char msg[1024];
	uint64_t t0, elapsed_ns;
	uint64_t bytes, copied, dirty;
	unsigned rounds;
	uint64_t round_dirty[PC_ROUNDS_MAX];
	unsigned nround_dirty;
};

void precopy_free(struct precopy *pc)
{
	if (!pc)
		return;
	imgio_precopy_free(&pc->img);
	if (pc->req_conn)
		conn_put(pc->req_conn);
	free(pc);
}

int precopy_running(const struct proc *p)
{
	return p->precopy && p->precopy->running;
}

struct pc_image *precopy_image(struct precopy *pc)
{
	return pc ? &pc->img : NULL;
}

void precopy_figures(const struct precopy *pc, uint64_t *ret_bytes, uint32_t *ret_rounds)
{
	*ret_bytes = pc ? pc->copied : 0;
	*ret_rounds = pc ? pc->rounds : 0;
}

static int same_dir(int a, int b)
{
	struct stat sa, sb;

	return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

struct precopy *precopy_take(struct proc *p, int dirfd)
{
	struct precopy *pc = p->precopy;

	if (!pc || pc->running)
		return NULL;
	p->precopy = NULL;
	if (!same_dir(pc->img.dirfd, dirfd)) {
		pr_info("pid %d (%s): its pre-copy was made into another directory than its dump's: dropped, the dump "
			"writes everything",
			(int)p->pid, p->comm);
		precopy_free(pc);
		return NULL;
	}
	return pc;
}

static int cmp_pcbuf(const void *a, const void *b)
{
	const struct pc_buf *x = a, *y = b;

	return x->rb.va < y->rb.va ? -1 : x->rb.va > y->rb.va;
}

/* Loop thread: what the worker will copy (the registry stays the loop's). */
static int snapshot(struct precopy *pc, struct proc *p)
{
	struct rbuf *b;
	size_t n = 0;

	pc->img.bufs = calloc(p->nbufs ? p->nbufs : 1, sizeof(*pc->img.bufs));
	if (!pc->img.bufs)
		return -ENOMEM;
	for (b = p->bufs; b; b = b->next) {
		struct pc_buf *pb = &pc->img.bufs[n];

		if (b->fd < 0) {
			/* Nothing to import it from: written in full at T. */
			pr_debug("pid %d: buffer 0x%" PRIx64 " has no exported fd: not pre-copied", (int)p->pid,
				 b->va + b->phys_offset);
			continue;
		}
		pb->rb.fd = fcntl(b->fd, F_DUPFD_CLOEXEC, 0);
		if (pb->rb.fd < 0)
			return -errno;
		pb->rb.va = b->va + b->phys_offset;
		pb->rb.size = pb->rb.phys_size = b->phys_size;
		pb->rb.device = b->device;
		pb->rb.kind = b->kind;
		pb->rb.mem.fd = -1;
		memcpy(pb->rb.uuid, b->uuid, sizeof(pb->rb.uuid));
		pc->bytes += b->phys_size;
		pc->img.nbufs = ++n;
	}
	qsort(pc->img.bufs, n, sizeof(*pc->img.bufs), cmp_pcbuf);
	return 0;
}

static int import_all(struct precopy *pc)
{
	char gmsg[512];
	size_t i;
	int r = gpu_init(gmsg, sizeof(gmsg));

	if (r < 0) {
		snprintf(pc->msg, sizeof(pc->msg), "no GPU access in gpucrd: %.400s", gmsg);
		return r;
	}
	for (i = 0; i < pc->img.nbufs; i++) {
		r = rbuf_import(&pc->img.bufs[i].rb, pc->msg, sizeof(pc->msg));
		if (r < 0)
			return r;
	}
	return 0;
}

/* The rounds stop once the dirty set no longer shrinks by a quarter: the
 * application writes as fast as they copy, and the final pass at T takes
 * what is left. */
static int shrinks(uint64_t dirty, uint64_t before)
{
	return dirty * 4 <= before * 3;
}

static void precopy_work(void *data)
{
	struct precopy *pc = data;
	uint64_t written = 0, dirty = 0, before;
	size_t i;
	int r;

	r = import_all(pc);
	if (!r)
		r = imgio_precopy_open(&pc->img, pc->pid, pc->msg, sizeof(pc->msg));
	if (!r)
		r = imgio_precopy_round(&pc->img, pc->pid, 1, &dirty, &written, pc->msg, sizeof(pc->msg));
	pc->copied = written;
	before = written;
	pc->dirty = 0;
	while (!r && pc->rounds < pc->max_rounds) {
		/* The fingerprints alone first: a round that would not shrink
		 * the dirty set is not run. */
		r = imgio_precopy_round(&pc->img, pc->pid, 0, &dirty, NULL, pc->msg, sizeof(pc->msg));
		if (r < 0)
			break;
		pc->dirty = dirty;
		if (!dirty || !shrinks(dirty, before))
			break;
		pc->round_dirty[pc->nround_dirty++] = dirty;
		written = 0;
		r = imgio_precopy_round(&pc->img, pc->pid, 1, &dirty, &written, pc->msg, sizeof(pc->msg));
		if (r < 0)
			break;
		pc->rounds++;
		pc->copied += written;
		pc->dirty = dirty;
		before = dirty;
		pr_debug("pid %d: pre-copy round %u: %" PRIu64 " KiB dirty, %" PRIu64 " KiB written", (int)pc->pid,
			 pc->rounds, dirty >> 10, written >> 10);
	}
	if (!r && pc->rounds == pc->max_rounds) {
		/* What is dirty after the last round, for the report. */
		r = imgio_precopy_round(&pc->img, pc->pid, 0, &dirty, NULL, pc->msg, sizeof(pc->msg));
		pc->dirty = dirty;
	}
	/* The dump takes the memory over itself: no mapping kept meanwhile. */
	for (i = 0; i < pc->img.nbufs; i++)
		rbuf_release(&pc->img.bufs[i].rb);
	pc->err = r;
	pc->elapsed_ns = now_ns() - pc->t0;
}

static void precopy_reply(struct precopy *pc)
{
	Gpucr__PreCopyReply pr = GPUCR__PRE_COPY_REPLY__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	if (!pc->req_conn)
		return;
	if (pc->err) {
		conn_reply_err(pc->req_conn, pc->req_id, pc->err, "%s", pc->msg);
	} else {
		pr.has_bytes = pr.has_copied_bytes = pr.has_rounds = pr.has_dirty_bytes = pr.has_elapsed_ns = 1;
		pr.bytes = pc->bytes;
		pr.copied_bytes = pc->copied;
		pr.rounds = pc->rounds;
		pr.dirty_bytes = pc->dirty;
		pr.elapsed_ns = pc->elapsed_ns;
		pr.n_round_dirty = pc->nround_dirty;
		pr.round_dirty = pc->round_dirty;
		m.body_case = GPUCR__MSG__BODY_PRE_COPY_REPLY;
		m.pre_copy_reply = &pr;
		conn_reply(pc->req_conn, pc->req_id, &m, NULL, 0);
	}
	conn_put(pc->req_conn);
	pc->req_conn = NULL;
}

static void precopy_done(void *data, int status)
{
	struct precopy *pc = data;
	struct proc *p = pc->p;
	struct daemon *d = pc->d;

	(void)status;
	pc->running = 0;
	p->busy--;
	if (p->state == GPUCR__PROC_STATE__PROC_GONE || !p->shim) {
		pc->err = pc->err ? pc->err : -ESRCH;
		snprintf(pc->msg, sizeof(pc->msg), "pid %d exited during its pre-copy", (int)pc->pid);
	}
	if (pc->err) {
		pr_err("pid %d: pre-copy failed: %s; its dump will write everything", (int)pc->pid, pc->msg);
		p->precopy = NULL;
		precopy_reply(pc);
		precopy_free(pc);
		if (p->state == GPUCR__PROC_STATE__PROC_GONE && !p->shim)
			registry_drop(d, p);
		return;
	}
	pr_info("pid %d (%s): pre-copied %" PRIu64 " MiB of %" PRIu64 " MiB in %u round(s) after the first copy, "
		"%.2f s; %" PRIu64 " KiB dirty at the last fingerprints, left for the dump",
		(int)pc->pid, p->comm, pc->copied >> 20, pc->bytes >> 20, pc->rounds, pc->elapsed_ns / 1e9,
		pc->dirty >> 10);
	precopy_reply(pc);
}

int precopy_request(struct daemon *d, struct conn *c, const Gpucr__Msg *req, int *dirfdp)
{
	int dirfd = *dirfdp;
	const Gpucr__PreCopyRequest *rq = req->pre_copy;
	struct proc *p = registry_find(d, (pid_t)rq->pid);
	uint64_t id = req->has_id ? req->id : 0;
	struct precopy *pc;
	int r;

	if (!p || !registry_may_act(conn_uid(c), p))
		return conn_reply_err(c, id, -ESRCH, "pid %u is not attached to gpucrd%s", rq->pid,
				      p ? " or is not yours" : "");
	if (precopy_running(p))
		return conn_reply_err(c, id, -EBUSY, "pid %u: a pre-copy of this process is already running", rq->pid);
	if (rq->has_discard && rq->discard) {
		if (p->precopy)
			pr_info("pid %d (%s): pre-copy discarded", (int)p->pid, p->comm);
		precopy_free(p->precopy);
		p->precopy = NULL;
		return conn_reply(c, id, NULL, NULL, 0);
	}
	if (dirfd < 0)
		return conn_reply_err(c, id, -EINVAL, "pre_copy needs the image directory's fd");
	if (p->dump || p->busy || p->state != GPUCR__PROC_STATE__PROC_RUNNING || !p->shim)
		return conn_reply_err(c, id, -EBUSY, "pid %u is not running under gpucr right now, or is being dumped",
				      rq->pid);
	precopy_free(p->precopy); /* replaced */
	p->precopy = NULL;
	pc = calloc(1, sizeof(*pc));
	if (!pc)
		return conn_reply_err(c, id, -ENOMEM, "out of memory");
	pc->img.dirfd = -1;
	pc->d = d;
	pc->p = p;
	pc->pid = p->pid;
	pc->t0 = now_ns();
	pc->max_rounds = rq->has_max_rounds ? rq->max_rounds : PC_ROUNDS_DEFAULT;
	if (pc->max_rounds > PC_ROUNDS_MAX)
		pc->max_rounds = PC_ROUNDS_MAX;
	r = snapshot(pc, p);
	if (r < 0) {
		precopy_free(pc);
		return conn_reply_err(c, id, r, "pid %u: pre-copy: %s", rq->pid, strerror(-r));
	}
	pc->img.dirfd = dirfd; /* ours from here */
	*dirfdp = -1;
	pc->req_conn = c;
	pc->req_id = id;
	conn_hold(c);
	pc->running = 1;
	p->precopy = pc;
	p->busy++;
	pr_info("pid %d (%s): pre-copy requested by pid %d (%" PRIu64 " MiB in %zu buffers, at most %u rounds)",
		(int)p->pid, p->comm, (int)conn_pid(c), pc->bytes >> 20, pc->img.nbufs, pc->max_rounds);
	if (daemon_queue_work(d, precopy_work, precopy_done, pc) < 0) {
		p->busy--;
		p->precopy = NULL;
		pc->img.dirfd = -1; /* the caller keeps it on failure */
		*dirfdp = dirfd;
		conn_put(c);
		pc->req_conn = NULL;
		precopy_free(pc);
		return conn_reply_err(c, id, -ENOMEM, "pid %u: cannot queue the pre-copy", rq->pid);
	}
	return 0;
}
