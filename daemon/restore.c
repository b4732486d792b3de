/* Owns giving a process its GPU memory back: after `criu restore` (the CRIU
 * plugin's RestoreRequest makes the memory ready: retained memory as it is,
 * or the image loaded into new GPU memory and checked against its
 * fingerprints), and when the process's control thread reconnects, the
 * remap (fds handed back, mapped at the same addresses) and the resume. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "gpucrd.h"
#include "image.h"
#include "log.h"

#define REMAP_BATCH 64

/* An image loading in the background (RestoreRequest.background): the
 * request that started it has its reply; the next request for the pid
 * waits here for the outcome, or finds it here if the load ended first. */
struct early_load {
	pid_t pid;
	int done, err;
	char msg[1024];
	struct conn *wc;            /* the waiting request, held */
	uint64_t wid;
	struct early_load *next;
};

struct restore_op {
	struct daemon *d;
	pid_t pid;
	uid_t uid;
	uid_t cuid;                 /* the requester's */
	struct conn *c;             /* NULL for a background load */
	struct early_load *e;       /* set for a background load */
	uint64_t id;
	int dirfd;
	int err;
	char msg[1024];
	struct rbuf *bufs;
	struct img_stats st;
	uint32_t control_tid;
	uint64_t t_start;
};

static int reply_restore(struct conn *c, uint64_t id, int retained, uint64_t bytes, uint64_t ns,
			 uint32_t tid)
{
	Gpucr__RestoreReply rr = GPUCR__RESTORE_REPLY__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	rr.has_from_retained = 1;
	rr.from_retained = retained;
	rr.has_bytes = 1;
	rr.bytes = bytes;
	rr.has_elapsed_ns = 1;
	rr.elapsed_ns = ns;
	rr.has_control_tid = tid != 0;
	rr.control_tid = tid;
	m.body_case = GPUCR__MSG__BODY_RESTORE_REPLY;
	m.restore_reply = &rr;
	return conn_reply(c, id, &m, NULL, 0);
}

static void load_work(void *data)
{
	struct restore_op *op = data;

	op->err = imgio_read(op->pid, op->dirfd, &op->bufs, &op->st, op->msg, sizeof(op->msg));
	op->control_tid = op->st.control_tid;
}

static struct early_load *early_find(struct daemon *d, pid_t pid)
{
	struct early_load *e;

	for (e = d->early; e; e = e->next)
		if (e->pid == pid)
			return e;
	return NULL;
}

static void early_remove(struct daemon *d, struct early_load *e)
{
	struct early_load **pp;

	for (pp = &d->early; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	if (e->wc)
		conn_put(e->wc);
	free(e);
}

/* The outcome of a load goes to the request that waits for it: the one
 * that asked (a plain load), the one that came later (a background load),
 * or, for a background load nobody waits for yet, into its record. */
static void load_outcome(struct restore_op *op, int err, const char *msg)
{
	struct early_load *e = op->e;

	if (!e) {
		if (err)
			conn_reply_err(op->c, op->id, err, "%s", msg);
		else
			reply_restore(op->c, op->id, 0, op->st.bytes, now_ns() - op->t_start, op->control_tid);
		return;
	}
	if (e->wc) {
		if (err)
			conn_reply_err(e->wc, e->wid, err, "%s", msg);
		else
			reply_restore(e->wc, e->wid, 0, op->st.bytes, now_ns() - op->t_start, op->control_tid);
		early_remove(op->d, e);
		return;
	}
	if (!err) {
		early_remove(op->d, e); /* the process's memory is in the registry now */
		return;
	}
	e->done = 1;
	e->err = err;
	snprintf(e->msg, sizeof(e->msg), "%s", msg);
}

static void load_done(void *data, int status)
{
	struct restore_op *op = data;
	struct proc *p;
	struct rbuf *b;
	char msg[1024];
	int err = 0;

	(void)status;
	if (op->err) {
		pr_err("pid %d: restore from the image failed: %s", (int)op->pid, op->msg);
		err = op->err;
		snprintf(msg, sizeof(msg), "%.1000s", op->msg);
		goto out;
	}
	if (op->uid == (uid_t)-1)
		op->uid = op->st.uid;
	if (op->cuid != 0 && op->cuid != op->uid) {
		err = -EPERM;
		snprintf(msg, sizeof(msg), "pid %d: the image belongs to uid %u", (int)op->pid, (unsigned)op->uid);
		goto out;
	}
	p = registry_find(op->d, op->pid);
	if (p && (p->shim || p->nbufs)) {
		err = -EBUSY;
		snprintf(msg, sizeof(msg), "pid %d: gpucrd already holds a process with this pid", (int)op->pid);
		goto out;
	}
	if (!p)
		p = registry_attach(op->d, op->pid, op->uid, op->st.comm[0] ? op->st.comm : NULL);
	if (!p) {
		err = -ENOMEM;
		snprintf(msg, sizeof(msg), "out of memory");
		goto out;
	}
	while ((b = op->bufs)) {
		op->bufs = b->next;
		b->next = p->bufs;
		p->bufs = b;
		p->nbufs++;
		p->bytes += b->phys_size;
	}
	p->state = GPUCR__PROC_STATE__PROC_RESTORING;
	p->control_tid = (pid_t)op->control_tid;
	p->escaped = op->st.escaped;
	p->t_restore = op->t_start;
	pr_info("pid %d: %llu MiB loaded from the image in %.2f s (%.1f GB/s)%s; waiting for the process to map it",
		(int)op->pid, (unsigned long long)(op->st.bytes >> 20), op->st.elapsed_ns / 1e9,
		op->st.elapsed_ns ? op->st.stored / (op->st.elapsed_ns / 1e9) / 1e9 : 0.0,
		op->e ? " in the background" : "");
out:
	load_outcome(op, err, msg);
	while ((b = op->bufs)) {
		op->bufs = b->next;
		rbuf_free(b);
	}
	if (op->c)
		conn_put(op->c);
	close(op->dirfd);
	free(op);
}

/* A background load: the image's records and file sizes are checked here
 * (so a truncated or mismatched image fails the request that starts the
 * restore), the data is loaded and checked on a worker. */
static int early_start(struct daemon *d, struct conn *c, uint64_t id, struct restore_op *op)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb;
	struct early_load *e;
	uint64_t bytes = 0;
	uint32_t tid;
	size_t i;
	int r;

	r = img_read(op->dirfd, (uint32_t)op->pid, &img, &eb);
	if (r < 0) {
		conn_reply_err(c, id, r, "%s", eb.msg);
		return r;
	}
	for (i = 0; i < img->nbuffers; i++)
		bytes += img->buffers[i]->size;
	tid = img->hdr->has_control_tid ? img->hdr->control_tid : 0;
	img_free(img);
	e = calloc(1, sizeof(*e));
	if (!e) {
		conn_reply_err(c, id, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	e->pid = op->pid;
	e->next = d->early;
	d->early = e;
	op->e = e;
	op->c = NULL;
	if (daemon_queue_work(d, load_work, load_done, op) < 0) {
		early_remove(d, e);
		conn_reply_err(c, id, -ENOMEM, "cannot queue the image load");
		return -ENOMEM;
	}
	pr_info("pid %d: loading %llu MiB from the image in the background", (int)op->pid,
		(unsigned long long)(bytes >> 20));
	{
		Gpucr__RestoreReply rr = GPUCR__RESTORE_REPLY__INIT;
		Gpucr__Msg m = GPUCR__MSG__INIT;

		rr.has_bytes = 1;
		rr.bytes = bytes;
		rr.has_loading = 1;
		rr.loading = 1;
		rr.has_control_tid = tid != 0;
		rr.control_tid = tid;
		m.body_case = GPUCR__MSG__BODY_RESTORE_REPLY;
		m.restore_reply = &rr;
		conn_reply(c, id, &m, NULL, 0);
	}
	return 0;
}

int restore_start(struct daemon *d, struct conn *c, const Gpucr__Msg *req, int dirfd)
{
	const Gpucr__RestoreRequest *rq = req->restore;
	uint64_t id = req->has_id ? req->id : 0;
	struct proc *p = registry_find(d, (pid_t)rq->pid);
	int allow_retained = rq->has_allow_retained ? rq->allow_retained : 1;
	struct restore_op *op;
	struct early_load *e;
	char path[64];
	struct stat st;

	/* Called twice by the CRIU plugin: when a restore starts (the process
	 * does not exist yet: the memory is made ready, so a bad image fails
	 * the restore before any process is created), and once CRIU has
	 * recreated it (its owner must be the one the memory belongs to). */
	e = early_find(d, (pid_t)rq->pid);
	if (e && e->done) {
		/* A background load that failed before anyone asked. */
		conn_reply_err(c, id, e->err, "%s", e->msg);
		early_remove(d, e);
		close(dirfd);
		return -EIO;
	}
	if (e) {
		/* Still loading: this request gets the outcome. */
		if (e->wc) {
			conn_reply_err(c, id, -EBUSY, "pid %u: its image is already being waited for", rq->pid);
			close(dirfd);
			return -EBUSY;
		}
		e->wc = c;
		e->wid = id;
		conn_hold(c);
		close(dirfd);
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/%u", rq->pid);
	if (stat(path, &st) < 0) {
		st.st_uid = p ? p->uid : (uid_t)-1; /* -1: learnt from the image */
	} else if (conn_uid(c) != 0 && conn_uid(c) != st.st_uid) {
		conn_reply_err(c, id, -EPERM, "pid %u belongs to uid %u", rq->pid, (unsigned)st.st_uid);
		return -EPERM;
	}
	if (p && conn_uid(c) != 0 && conn_uid(c) != p->uid) {
		conn_reply_err(c, id, -EPERM, "pid %u: the memory gpucrd holds for it belongs to uid %u", rq->pid,
			       (unsigned)p->uid);
		return -EPERM;
	}
	if (p && st.st_uid != (uid_t)-1 && p->uid != st.st_uid) {
		conn_reply_err(c, id, -EPERM, "pid %u: the memory gpucrd holds under this pid belongs to uid %u",
			       rq->pid, (unsigned)p->uid);
		return -EPERM;
	}
	if (p && allow_retained && !p->shim && registry_keeps(p)) {
		/* Zero-copy: the memory never left the GPU (or there is none:
		 * a process whose memory is all its own VMM memory, which the
		 * driver's checkpoint carries, waits for nothing here, not
		 * even an image still being written). */
		if (p->state != GPUCR__PROC_STATE__PROC_RESTORING) {
			p->t_restore = now_ns();
			pr_info("pid %d (%s): restoring from retained GPU memory (%llu MiB, nothing to copy)",
				(int)p->pid, p->comm, (unsigned long long)(p->bytes >> 20));
		}
		p->state = GPUCR__PROC_STATE__PROC_RESTORING;
		reply_restore(c, id, 1, p->bytes, 0, (uint32_t)p->control_tid);
		close(dirfd);
		return 0;
	}
	if (p && (p->shim || p->busy || p->dump)) {
		conn_reply_err(c, id, -EBUSY, "pid %u is attached and running; nothing to restore", rq->pid);
		return -EBUSY;
	}
	if (p) /* stale memory of an earlier life of this pid */
		registry_drop(d, p);
	op = calloc(1, sizeof(*op));
	if (!op) {
		conn_reply_err(c, id, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	op->d = d;
	op->pid = (pid_t)rq->pid;
	op->uid = st.st_uid;
	op->cuid = conn_uid(c);
	op->c = c;
	op->id = id;
	op->dirfd = dirfd;
	op->t_start = now_ns();
	if (rq->has_background && rq->background) {
		int r = early_start(d, c, id, op);

		if (r < 0) {
			close(dirfd);
			free(op);
		}
		return r;
	}
	conn_hold(c);
	if (daemon_queue_work(d, load_work, load_done, op) < 0) {
		conn_put(c);
		free(op);
		conn_reply_err(c, id, -ENOMEM, "cannot queue the image load");
		return -ENOMEM;
	}
	return 0;
}

/* The shim did not answer a Remap or Resume in time: the connection is
 * closed, so that the process's state in gpucrd does not stay RESTORING
 * for ever. Nothing is lost: what was sent is still in its socket. A shim
 * that runs again reads it, then the close: with its memory not all mapped
 * (still released) it reconnects as restored and is sent its memory again
 * (gpucrd keeps it: RESTORING); with everything mapped its gate reopens on
 * the close and it runs on, then reconnects as a running process. */
static void cut_off(struct proc *p, struct conn *c, const Gpucr__Msg *rep)
{
	pr_err("pid %d (%s): %s (GPUCR_SHIM_TIMEOUT_MS): is the process stopped (SIGSTOP, a debugger) or its "
	       "control thread stuck in a CUDA call? Its connection is closed; gpucrd keeps its GPU memory and "
	       "sends it again when it reconnects",
	       (int)p->pid, p->comm, rep->err_msg);
	p->remap_cut = 1;
	conn_shutdown(c);
}

static void on_resume_reply(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	struct proc *p = data;

	(void)fds;
	(void)nfds;
	if (!rep)
		return; /* the process went away; registry_detach handles it */
	if (conn_reply_timed_out(rep)) {
		cut_off(p, c, rep);
		return;
	}
	if (rep->err) {
		pr_err("pid %d: resume failed: %s", (int)p->pid, rep->err_msg ? rep->err_msg : "?");
		dump_save_epoch_answered(p, 0);
		return;
	}
	dump_save_epoch_answered(p, 1);
	p->state = GPUCR__PROC_STATE__PROC_RUNNING;
	p->remap_cut = 0;
	if (p->t_restore)
		pr_info("pid %d (%s): running again with %llu MiB of GPU memory in place (%.1f ms after the restore "
			"request)",
			(int)p->pid, p->comm, (unsigned long long)(p->bytes >> 20), (now_ns() - p->t_restore) / 1e6);
	else
		pr_info("pid %d (%s): running again with %llu MiB of GPU memory in place", (int)p->pid, p->comm,
			(unsigned long long)(p->bytes >> 20));
	p->t_restore = 0;
}

/* Every chunk is mapped back (or there was none): the gate may open. */
static int resume_restored(struct proc *p, struct conn *c)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__Resume rs = GPUCR__RESUME__INIT;

	rs.has_save_epoch = rs.save_epoch = dump_resume_save_epoch(p);
	m.body_case = GPUCR__MSG__BODY_RESUME;
	m.resume = &rs;
	return conn_request_timed(c, &m, NULL, 0, shim_timeout_ms(), on_resume_reply, NULL, p);
}

static void on_remap_reply(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	struct proc *p = data;

	(void)fds;
	(void)nfds;
	if (!rep)
		return;
	if (conn_reply_timed_out(rep)) {
		cut_off(p, c, rep);
		return;
	}
	if (rep->err) {
		pr_err("pid %d: remapping its GPU memory failed: %s", (int)p->pid,
		       rep->err_msg ? rep->err_msg : gpucr_strerror(rep->err));
		p->remaps_left = 0;
		return;
	}
	if (--p->remaps_left > 0)
		return;
	if (resume_restored(p, c) < 0)
		pr_err("pid %d: cannot tell it to resume", (int)p->pid);
}

void restore_shim_reattached(struct daemon *d, struct proc *p, struct conn *c)
{
	Gpucr__BufferAdd adds[REMAP_BATCH], *addp[REMAP_BATCH];
	int fds[REMAP_BATCH];
	struct rbuf *b;
	int nb = 0, batches, r;

	(void)d;
	if (!p->nbufs && !registry_keeps(p)) {
		pr_warn("pid %d reattached after a restore, but gpucrd holds no GPU memory for it; "
			"restore it with 'criu restore' and gpucr's plugin, which loads its GPU image",
			(int)p->pid);
		return;
	}
	if (p->dump && !dump_remap_now(p)) {
		/* The image is still being written from this memory (a restore
		 * right after a dump whose image is written in the background):
		 * hand it back only when that is done (dump.c calls us again);
		 * a concurrent dump's process gets it back once the fingerprints
		 * at T are taken, and runs in a save epoch. */
		p->remap_waiting = c;
		conn_hold(c);
		return;
	}
	if (p->state == GPUCR__PROC_STATE__PROC_RUNNING)
		return;
	if (!p->nbufs) {
		/* Nothing of gpucr's to map back: the shim only opens its gate. */
		p->state = GPUCR__PROC_STATE__PROC_RESTORING;
		p->remaps_left = 0;
		if (resume_restored(p, c) < 0)
			pr_err("pid %d: cannot tell it to resume", (int)p->pid);
		return;
	}
	batches = (int)((p->nbufs + REMAP_BATCH - 1) / REMAP_BATCH);
	p->remaps_left = batches;
	p->state = GPUCR__PROC_STATE__PROC_RESTORING;
	for (b = p->bufs; b; b = b->next) {
		Gpucr__BufferAdd *a = &adds[nb];

		gpucr__buffer_add__init(a);
		a->va = b->va;
		a->size = b->size;
		a->device = b->device;
		a->has_phys_size = 1;
		a->phys_size = b->phys_size;
		a->has_phys_offset = 1;
		a->phys_offset = b->phys_offset;
		a->has_device_uuid = 1;
		a->device_uuid.data = b->uuid;
		a->device_uuid.len = 16;
		addp[nb] = a;
		fds[nb++] = b->fd;
		if (nb == REMAP_BATCH || !b->next) {
			Gpucr__Msg m = GPUCR__MSG__INIT;
			Gpucr__Remap rm = GPUCR__REMAP__INIT;

			rm.n_buffers = (size_t)nb;
			rm.buffers = addp;
			rm.has_last = 1;
			rm.last = b->next == NULL;
			m.body_case = GPUCR__MSG__BODY_REMAP;
			m.remap = &rm;
			/* Importing and mapping a batch is quick; the bound is
			 * for a shim that does not run at all. */
			r = conn_request_timed(c, &m, fds, (unsigned)nb, shim_timeout_ms(), on_remap_reply, NULL, p);
			if (r < 0) {
				pr_err("pid %d: cannot send its memory back: %s", (int)p->pid, strerror(-r));
				return;
			}
			nb = 0;
		}
	}
}
