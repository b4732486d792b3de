/* Owns the dump of an attached process's GPU side:
 *
 *   quiesce (the shim closes its gate and drains its streams)
 *   -> take over (the daemon imports every buffer's fd: the memory now has
 *      a holder outside the process)
 *   -> release (the shim unmaps and releases its physical memory, keeps its
 *      address reservations, and disconnects)
 *   -> reply to the requester: the process holds no device memory now
 *   -> write the image in the background, from the daemon's own mappings
 *   -> DumpWait waiters are answered when the image is complete.
 *
 * A concurrent dump (leave-running, DumpRequest.concurrent) lets the process
 * map its memory back and run as soon as the fingerprints at T are taken,
 * in a save epoch: its calls that may write a chunk not yet saved wait in
 * its shim until gpucrd says the chunk is saved (ChunksSaved); the chunks
 * they wait for are saved first (ChunksWanted); every chunk saved is checked
 * against its fingerprint at T, and a mismatch (a write that escaped
 * prediction) fails the image with -ESTALE. The shim is then asked for the
 * suspects (ChunksSaved{all, escaped} -> Suspects: the functions it let
 * run in the epoch), which the failure names; it holds their launches in
 * every later epoch until everything is saved, so the process's later
 * checkpoints run it again as before (the process stays marked as escaped,
 * in its images too). Only when the shim could not remember them all does
 * such a process run early only with a copy made on the GPU.
 *
 * The image's device->host write of a dump that nothing waits for
 * (DumpRequest.image_background) is held back until the driver is done
 * with the process (write_hold below; GPUCR_WRITE_AFTER_DRIVER=0: not).
 *
 * Any failure before the release puts the process back as it was (resume).
 * The memory stays held by the daemon after the image is written (retention)
 * until a restore hands it back or the user drops it. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "gpucrd.h"
#include "log.h"

enum dump_phase {
	PH_QUIESCE,
	PH_TAKEOVER,
	PH_RELEASE,
	PH_WRITING,
	PH_DONE,
};

struct waiter {
	struct conn *c;
	uint64_t id;
	struct waiter *next;
};

struct range {
	uint64_t va, len;
};

/* What a concurrent dump's image writer tells the event loop. */
struct concurrent {
	uv_async_t async;
	pthread_mutex_t lock;
	int fp_ready;
	struct range *saved;        /* every range saved so far, in order */
	size_t nsaved, capsaved, sent;
	struct range *wanted;       /* the shim's requests, a queue */
	size_t nwanted, capwanted, head;
	struct img_hooks hooks;
	int resume_at_end;          /* the shim refused the epoch: plain Resume when written */
	int gated_ok;               /* a save epoch may stand in for a copy on the GPU */
	int decided, copied;        /* the copy at T was tried; it was made */
};

/* For a dump that nothing waits for (unless GPUCR_WRITE_AFTER_DRIVER=0): its
 * device->host write starts once the driver is done with the process, not
 * beside the driver's own work, which it slows down on an H200 (the
 * driver's checkpoint of a process that released 16 GiB took 624 ms beside
 * the write, 410-445 ms at 1 GiB; gpucr dump at 16 GiB kept the process
 * 0.997 s instead of 1.102 s, same run, 2026-11-30): after the driver's checkpoint; in a concurrent dump
 * (left running) after its unlock, and only when the memory was copied on
 * the GPU at T (else the running process waits for the chunks it writes).
 * A dump left running that is not concurrent is not held: the process
 * waits for its image. The fingerprints at T and a copy on the GPU are
 * taken first, as always. A driver operation that never comes (no CRIU
 * plugin, a failed dump) costs at most GPUCR_WRITE_AFTER_DRIVER_TIMEOUT_MS
 * (default 3000); a DumpWait (someone waits now) ends the hold too. The
 * writer waits (hold_write, worker thread); the loop ends the hold
 * (hold_end), under the hold's lock. */
struct write_hold {
	pthread_mutex_t lock;
	pthread_cond_t cond;        /* on CLOCK_MONOTONIC */
	Gpucr__DriverOpKind until;  /* DRV_CHECKPOINT, or DRV_UNLOCK (concurrent) */
	unsigned timeout_ms;
	int ended;                  /* under lock, with why */
	char why[160];
};

struct dump_op {
	struct daemon *d;
	struct proc *p;
	pid_t pid;
	enum dump_phase phase;
	struct conn *req_conn;      /* held until answered */
	uint64_t req_id;
	int dirfd;
	int retain;
	uint64_t t_start;
	uint64_t t_released;
	int err;
	char msg[1024];
	struct img_stats st;
	struct waiter *waiters;
	int gone;                   /* the process went away mid-dump */
	struct concurrent *cc;      /* a concurrent dump, or NULL */
	struct write_hold *hold;    /* its image write waits for the driver, or NULL */
	int answer_at_detach;       /* released: the requester is answered once the shim has gone */
	int finish_at_detach;       /* done before that: finished then */
	int asked;                  /* ChunksSaved{all, escaped} sent: the epoch is over */
	unsigned drain_ms;          /* the drain time the quiesce gave the shim */
	struct precopy *pc;         /* the pre-copy its image is finished from, or NULL */
};

static void answer_requester(struct dump_op *op)
{
	Gpucr__DumpReply dr = GPUCR__DUMP_REPLY__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	if (!op->req_conn)
		return;
	if (op->err) {
		conn_reply_err(op->req_conn, op->req_id, op->err, "%s", op->msg);
	} else {
		dr.has_bytes = 1;
		dr.bytes = op->p ? op->p->bytes : 0;
		dr.has_downtime_ns = 1;
		dr.downtime_ns = op->t_released - op->t_start;
		m.body_case = GPUCR__MSG__BODY_DUMP_REPLY;
		m.dump_reply = &dr;
		conn_reply(op->req_conn, op->req_id, &m, NULL, 0);
	}
	conn_put(op->req_conn);
	op->req_conn = NULL;
}

/* A pre-copied image's figures into a DumpReply. */
static void figures_reply(Gpucr__DumpReply *dr, const struct dump_figures *f)
{
	if (!f->pre_copied)
		return;
	dr->has_pre_copied = dr->pre_copied = 1;
	dr->has_final_bytes = dr->has_reused_bytes = dr->has_final_ns = 1;
	dr->final_bytes = f->final_bytes;
	dr->reused_bytes = f->reused_bytes;
	dr->final_ns = f->elapsed_ns;
	dr->has_precopy_bytes = dr->has_precopy_rounds = 1;
	dr->precopy_bytes = f->precopy_bytes;
	dr->precopy_rounds = f->precopy_rounds;
}

static void answer_waiters(struct dump_op *op)
{
	Gpucr__DumpReply dr = GPUCR__DUMP_REPLY__INIT;
	struct waiter *w;

	while ((w = op->waiters)) {
		Gpucr__Msg m = GPUCR__MSG__INIT;

		op->waiters = w->next;
		if (op->err) {
			conn_reply_err(w->c, w->id, op->err, "%s", op->msg);
		} else {
			dr.has_bytes = 1;
			dr.bytes = op->st.bytes;
			dr.has_stored_bytes = 1;
			dr.stored_bytes = op->st.stored;
			dr.has_elapsed_ns = 1;
			dr.elapsed_ns = op->st.elapsed_ns;
			dr.has_downtime_ns = 1;
			dr.downtime_ns = op->t_released - op->t_start;
			figures_reply(&dr, &op->p->last);
			m.body_case = GPUCR__MSG__BODY_DUMP_REPLY;
			m.dump_reply = &dr;
			conn_reply(w->c, w->id, &m, NULL, 0);
		}
		conn_put(w->c);
		free(w);
	}
}

static void cc_closed(uv_handle_t *h)
{
	struct concurrent *cc = h->data;

	pthread_mutex_destroy(&cc->lock);
	free(cc->saved);
	free(cc->wanted);
	free(cc);
}

static void hold_free(struct write_hold *h)
{
	if (!h)
		return;
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

static void op_free(struct dump_op *op)
{
	/* No worker runs for op any more: the hold is the loop's alone. */
	hold_free(op->hold);
	if (op->p && op->p->dump == op)
		op->p->dump = NULL;
	if (op->dirfd >= 0)
		close(op->dirfd);
	precopy_free(op->pc);
	if (op->cc) {
		op->cc->async.data = op->cc;
		uv_close((uv_handle_t *)&op->cc->async, cc_closed);
	}
	free(op);
}

/* Ends the dump: answers everyone, frees the op. */
static void op_finish(struct dump_op *op)
{
	if (op->answer_at_detach && op->p && op->p->dump == op) {
		op->finish_at_detach = 1; /* dump_shim_detached() finishes it */
		return;
	}
	answer_requester(op);
	answer_waiters(op);
	op_free(op);
}

static void on_resume_answer(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	(void)fds;
	(void)nfds;
	(void)data;
	if (rep && rep->err)
		pr_warn("pid %d: resume after a failed dump: %s", (int)conn_pid(c),
			rep->err_msg ? rep->err_msg : gpucr_strerror(rep->err));
}

static void send_resume(struct proc *p)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__Resume rs = GPUCR__RESUME__INIT;

	if (!p || !p->shim)
		return;
	m.body_case = GPUCR__MSG__BODY_RESUME;
	m.resume = &rs;
	/* A request (with an id): the shim takes a message without one for a
	 * notice and drops it, which left the gate closed. Nothing waits for
	 * the answer; a shim that does not give one is only logged. */
	conn_request_timed(p->shim, &m, NULL, 0, shim_timeout_ms(), on_resume_answer, NULL, NULL);
}

/* Failure before the release: the process goes on as it was. */
static void fail_early(struct dump_op *op, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fail_early(struct dump_op *op, int err, const char *fmt, ...)
{
	va_list ap;

	op->err = err;
	va_start(ap, fmt);
	vsnprintf(op->msg, sizeof(op->msg), fmt, ap);
	va_end(ap);
	pr_err("%s", op->msg);
	if (op->p) {
		op->p->state = GPUCR__PROC_STATE__PROC_RUNNING;
		/* A dump that failed leaves CRIU nothing to work on: a shim
		 * that released late may come back right away. */
		if (op->p->cr_conn == op->req_conn)
			op->p->cr_conn = NULL;
		send_resume(op->p);
	}
	op_finish(op);
}

/* The shim's own drain bound plus GPUCR_SHIM_TIMEOUT_MS (0: no bound). */
static unsigned shim_bound(uint64_t drain_ms)
{
	uint64_t t = shim_timeout_ms();

	if (!t)
		return 0;
	t += drain_ms;
	return t > UINT32_MAX ? UINT32_MAX : (unsigned)t;
}

/* The shim drains once more before it releases, for at most 10 s
 * (libintercept/control.c, CTL_RELEASE_DRAIN_MS), after a quiesce that
 * drained everything: the release is allowed no more drain time than the
 * quiesce was. A shorter bound is safe, only less exact: a release
 * answered late is handled (on_release_late). */
#define SHIM_RELEASE_DRAIN_MS 10000

/* What a user can make of a shim that does not answer. */
#define SHIM_STUCK_HINT                                                                                    \
	"is the process stopped (SIGSTOP, a debugger) or its control thread stuck in a CUDA call? "         \
	"Raise GPUCR_SHIM_TIMEOUT_MS if it is only slow"

/* ---- concurrent dumps --------------------------------------------------- */

/* A name from the shim, fit for one line of the log: at most len - 1
 * bytes, control bytes as '?'. */
static void clean_name(char *dst, size_t len, const char *src)
{
	size_t i;

	for (i = 0; src && src[i] && i + 1 < len; i++)
		dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
	dst[i] = 0;
}

static int range_push(struct range **v, size_t *n, size_t *cap, uint64_t va, uint64_t len)
{
	if (*n && (*v)[*n - 1].va + (*v)[*n - 1].len == va) {
		(*v)[*n - 1].len += len; /* adjacent: one range */
		return 0;
	}
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct range *nv = realloc(*v, nc * sizeof(**v));

		if (!nv)
			return -ENOMEM;
		*v = nv;
		*cap = nc;
	}
	(*v)[(*n)++] = (struct range){ va, len };
	return 0;
}

/* Worker side (imgio's hooks). */
static void hook_fingerprinted(void *data)
{
	struct concurrent *cc = data;

	__atomic_store_n(&cc->fp_ready, 1, __ATOMIC_RELEASE);
	uv_async_send(&cc->async);
}

static void hook_saved(void *data, uint64_t va, uint64_t len)
{
	struct concurrent *cc = data;

	pthread_mutex_lock(&cc->lock);
	/* Out of memory here loses only the early notice: ChunksSaved{all}
	 * comes at the end anyway. */
	range_push(&cc->saved, &cc->nsaved, &cc->capsaved, va, len);
	pthread_mutex_unlock(&cc->lock);
	uv_async_send(&cc->async);
}

static void hook_copied(void *data, int made)
{
	struct concurrent *cc = data;

	__atomic_store_n(&cc->copied, made, __ATOMIC_RELAXED);
	__atomic_store_n(&cc->decided, 1, __ATOMIC_RELEASE);
	uv_async_send(&cc->async);
}

static int hook_wanted(void *data, uint64_t *va, uint64_t *len)
{
	struct concurrent *cc = data;
	int r = 0;

	pthread_mutex_lock(&cc->lock);
	if (cc->head < cc->nwanted) {
		*va = cc->wanted[cc->head].va;
		*len = cc->wanted[cc->head].len;
		cc->head++;
		r = 1;
	}
	if (cc->head == cc->nwanted)
		cc->head = cc->nwanted = 0;
	pthread_mutex_unlock(&cc->lock);
	return r;
}

static void on_saved_reply(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	(void)c;
	(void)fds;
	(void)nfds;
	(void)data;
	if (rep && rep->err)
		pr_warn("ChunksSaved refused by the process: %s", rep->err_msg ? rep->err_msg : gpucr_strerror(rep->err));
}

/* Tells the shim which ranges are saved (all: the epoch is over). */
static void send_saved(struct proc *p, const struct range *v, size_t n, int all)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__ChunksSaved cs = GPUCR__CHUNKS_SAVED__INIT;
	Gpucr__ChunkRange *rs = NULL, **rp = NULL;
	size_t i;

	if (!p->shim)
		return;
	if (n) {
		rs = calloc(n, sizeof(*rs));
		rp = calloc(n, sizeof(*rp));
		if (!rs || !rp) {
			/* Only the early notice is lost: ChunksSaved{all} ends the epoch. */
			free(rs);
			free(rp);
			return;
		}
	}
	for (i = 0; i < n; i++) {
		gpucr__chunk_range__init(&rs[i]);
		rs[i].va = v[i].va;
		rs[i].len = v[i].len;
		rp[i] = &rs[i];
	}
	cs.n_ranges = n;
	cs.ranges = rp;
	cs.has_all = all;
	cs.all = all;
	m.body_case = GPUCR__MSG__BODY_CHUNKS_SAVED;
	m.chunks_saved = &cs;
	conn_request(p->shim, &m, NULL, 0, on_saved_reply, NULL);
	free(rs);
	free(rp);
}

/* Sends what was saved since the last time, once the shim runs in the epoch. */
static void flush_saved(struct dump_op *op)
{
	struct concurrent *cc = op->cc;
	struct range *v = NULL;
	size_t n = 0;

	if (!op->p || op->p->save_epoch != 2)
		return;
	pthread_mutex_lock(&cc->lock);
	if (cc->sent < cc->nsaved) {
		n = cc->nsaved - cc->sent;
		v = malloc(n * sizeof(*v));
		if (v)
			memcpy(v, cc->saved + cc->sent, n * sizeof(*v));
		cc->sent = cc->nsaved;
	}
	pthread_mutex_unlock(&cc->lock);
	if (v)
		send_saved(op->p, v, n, 0);
	free(v);
}

/* Event loop side: the writer has news. */
static void on_cc_async(uv_async_t *h)
{
	struct dump_op *op = h->data;
	struct proc *p = op->p;

	if (!p)
		return;
	if (dump_remap_now(p) && p->remap_waiting) {
		/* It came back before the fingerprints were taken. */
		struct conn *w = p->remap_waiting;

		p->remap_waiting = NULL;
		if (conn_is_open(w) && p->shim == w)
			restore_shim_reattached(op->d, p, w);
		conn_put(w);
	}
	flush_saved(op);
}

void dump_shim_detached(struct proc *p)
{
	struct dump_op *op = p->dump;

	if (op && op->answer_at_detach) {
		op->answer_at_detach = 0;
		if (op->finish_at_detach)
			op_finish(op);
		else
			answer_requester(op);
	}
}

int dump_remap_now(struct proc *p)
{
	struct concurrent *cc = p->dump ? p->dump->cc : NULL;

	if (!cc || p->dump->phase != PH_WRITING || !__atomic_load_n(&cc->fp_ready, __ATOMIC_ACQUIRE))
		return 0;
	/* After a write escaped prediction in one of its epochs, the process
	 * runs early only with a copy made on the GPU at T. */
	return cc->gated_ok ||
	       (__atomic_load_n(&cc->decided, __ATOMIC_ACQUIRE) && __atomic_load_n(&cc->copied, __ATOMIC_RELAXED));
}

int dump_allows_reattach(struct proc *p)
{
	/* After the plugin's Wake (or its close) CRIU is done with the
	 * process: it may reconnect, and waits (remap_waiting) unless its dump
	 * is concurrent. */
	return p->dump && p->dump->phase == PH_WRITING && !p->cr_conn;
}

int dump_resume_save_epoch(struct proc *p)
{
	if (!dump_remap_now(p))
		return 0;
	p->save_epoch = 1;
	return 1;
}

void dump_save_epoch_answered(struct proc *p, int ok)
{
	if (p->save_epoch != 1)
		return;
	if (!ok) {
		/* The shim kept its gate closed: it waits for the image. */
		p->save_epoch = 0;
		if (p->dump && p->dump->cc)
			p->dump->cc->resume_at_end = 1;
		else
			send_resume(p);
		return;
	}
	if (!p->dump) {
		/* The image was done first; ChunksSaved{all} is already on its way. */
		p->save_epoch = 0;
		return;
	}
	p->save_epoch = 2;
	pr_info("pid %d (%s): running again while its GPU memory is saved", (int)p->pid, p->comm);
	flush_saved(p->dump);
}

int dump_chunks_wanted(struct proc *p, struct conn *c, const Gpucr__Msg *req)
{
	const Gpucr__ChunksWanted *cw = req->chunks_wanted;
	uint64_t id = req->has_id ? req->id : 0;
	size_t i;

	if (!p || c != p->shim)
		return conn_reply_err(c, id, -EPERM, "chunks_wanted is for attached processes only");
	if (p->dump && p->dump->cc) {
		struct concurrent *cc = p->dump->cc;

		pthread_mutex_lock(&cc->lock);
		for (i = 0; i < cw->n_ranges; i++)
			range_push(&cc->wanted, &cc->nwanted, &cc->capwanted, cw->ranges[i]->va, cw->ranges[i]->len);
		pthread_mutex_unlock(&cc->lock);
	}
	for (i = 0; i < cw->n_held; i++) {
		char name[96];

		clean_name(name, sizeof(name), cw->held[i]);
		pr_info("pid %d: %s launched during a save epoch: held until the epoch is saved "
			"(it escaped prediction before)",
			(int)p->pid, name);
	}
	return conn_reply(c, id, NULL, NULL, 0);
}

static int cc_start(struct dump_op *op)
{
	struct concurrent *cc = calloc(1, sizeof(*cc));

	if (!cc)
		return -ENOMEM;
	if (uv_async_init(op->d->loop, &cc->async, on_cc_async) < 0) {
		free(cc);
		return -ENOMEM;
	}
	cc->async.data = op;
	pthread_mutex_init(&cc->lock, NULL);
	cc->hooks.data = cc;
	cc->hooks.fingerprinted = hook_fingerprinted;
	cc->hooks.saved = hook_saved;
	cc->hooks.wanted = hook_wanted;
	cc->hooks.copied = hook_copied;
	/* Decided again at the quiesce, from what the shim holds. */
	cc->gated_ok = !op->p->escaped;
	op->cc = cc;
	op->st.hooks = &cc->hooks;
	return 0;
}

/* ---- the image write held back until the driver is done ---------------- */

static int env_off(const char *name)
{
	const char *v = getenv(name);

	return v && !strcmp(v, "0");
}

static const char *drv_op_name(Gpucr__DriverOpKind op)
{
	switch (op) {
	case GPUCR__DRIVER_OP_KIND__DRV_LOCK:
		return "lock";
	case GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT:
		return "checkpoint";
	case GPUCR__DRIVER_OP_KIND__DRV_UNLOCK:
		return "unlock";
	default:
		return "operation";
	}
}

static struct write_hold *hold_new(Gpucr__DriverOpKind until)
{
	struct write_hold *h = calloc(1, sizeof(*h));
	pthread_condattr_t ca;

	if (!h)
		return NULL;
	if (pthread_condattr_init(&ca) != 0) {
		free(h);
		return NULL;
	}
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&h->cond, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		free(h);
		return NULL;
	}
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&h->lock, NULL);
	h->until = until;
	h->timeout_ms = env_ms("GPUCR_WRITE_AFTER_DRIVER_TIMEOUT_MS", 3000);
	return h;
}

/* Event loop: the write may start now; why says what ended the hold. */
static void hold_end(struct dump_op *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void hold_end(struct dump_op *op, const char *fmt, ...)
{
	struct write_hold *h = op->hold;
	va_list ap;
	int now = 0;

	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	if (!h->ended) {
		va_start(ap, fmt);
		vsnprintf(h->why, sizeof(h->why), fmt, ap);
		va_end(ap);
		h->ended = now = 1;
		pthread_cond_signal(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
	if (now)
		pr_debug("pid %d: its image write may start: %s", (int)op->pid, h->why);
}

/* Worker (imgio_write's before_data): waits until the hold ends or times out. */
static void hold_write(void *data, int spare)
{
	struct dump_op *op = data;
	struct write_hold *h = op->hold;
	uint64_t t0 = now_ns(), dl;
	struct timespec ts;
	char why[sizeof(h->why)];
	int held = 0, r = 0;

	if (op->cc && !spare) {
		/* The process runs and waits for the chunks it writes: they are
		 * saved from its own memory, and nothing may hold that back. */
		pr_debug("pid %d: image write not held back: no copy on the GPU to write it from", (int)op->pid);
		return;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	dl = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (uint64_t)h->timeout_ms * 1000000ull;
	ts.tv_sec = (time_t)(dl / 1000000000ull);
	ts.tv_nsec = (long)(dl % 1000000000ull);
	pthread_mutex_lock(&h->lock);
	while (!h->ended && r != ETIMEDOUT) {
		held = 1;
		r = pthread_cond_timedwait(&h->cond, &h->lock, &ts);
	}
	if (!h->ended) {
		snprintf(h->why, sizeof(h->why),
			 "the timeout: no driver %s of the process came within %u ms (GPUCR_WRITE_AFTER_DRIVER_TIMEOUT_MS)",
			 drv_op_name(h->until), h->timeout_ms);
		h->ended = 1;
	}
	memcpy(why, h->why, sizeof(why));
	pthread_mutex_unlock(&h->lock);
	if (held)
		pr_info("pid %d: image write held back %.0f ms, until %s", (int)op->pid, (now_ns() - t0) / 1e6, why);
	else
		pr_debug("pid %d: image write not held back: %s before its data was ready", (int)op->pid, why);
}

void dump_driver_op_done(struct proc *p, Gpucr__DriverOpKind kind, int err)
{
	struct dump_op *op = p ? p->dump : NULL;

	if (!op || !op->hold)
		return;
	switch (kind) {
	case GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT:
		/* Left running, the driver's restore follows: wait for the unlock. */
		if (op->hold->until == GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT)
			hold_end(op, "the driver's checkpoint %s", err ? "failed" : "was done");
		break;
	case GPUCR__DRIVER_OP_KIND__DRV_UNLOCK:
		hold_end(op, "the driver's unlock %s", err ? "failed" : "was done (the process runs again)");
		break;
	case GPUCR__DRIVER_OP_KIND__DRV_LOCK:
		if (err)
			hold_end(op, "the driver's lock failed (no checkpoint follows)");
		break;
	default:
		break;
	}
}

void dump_release_holds(struct daemon *d)
{
	struct proc *p;

	for (p = d->procs; p; p = p->next)
		if (p->dump)
			hold_end(p->dump, "gpucrd is stopping");
}

static void write_work(void *data)
{
	struct dump_op *op = data;

	if (op->hold) {
		op->st.before_data = hold_write;
		op->st.before_data_arg = op;
	}
	op->st.progress_done = &op->p->io_done;
	op->st.progress_total = &op->p->io_total;
	op->st.precopy = precopy_image(op->pc);
	op->err = imgio_write(op->p, op->dirfd, &op->st, op->msg, sizeof(op->msg));
}

/* Appends the suspects to op->msg: "; suspects: a, b and N more
 * (functions launched since the cut)", as many names as fit. */
static void append_suspects(struct dump_op *op, const Gpucr__Suspects *su)
{
	size_t len = strlen(op->msg), cap = sizeof(op->msg), i, shown = 0;
	uint64_t total = su->n_names + (su->has_more ? su->more : 0);
	char name[96], tail[96];

	if (!total) {
		snprintf(op->msg + len, cap - len,
			 "; no function was launched early in the epoch: the write came from elsewhere");
		return;
	}
	len += (size_t)snprintf(op->msg + len, cap - len, "; suspects: ");
	for (i = 0; i < su->n_names && len < cap; i++) {
		clean_name(name, sizeof(name), su->names[i]);
		/* Room kept for the longest tail. */
		if (len + strlen(name) + 2 + 110 >= cap)
			break;
		len += (size_t)snprintf(op->msg + len, cap - len, "%s%s", i ? ", " : "", name);
		shown++;
	}
	if (total > shown)
		snprintf(tail, sizeof(tail), " and %llu more", (unsigned long long)(total - shown));
	else
		tail[0] = 0;
	snprintf(op->msg + len, cap - len, "%s (function%s launched since the cut)%s", tail, total > 1 ? "s" : "",
		 su->has_incomplete && su->incomplete ? "; not all of them could be remembered" : "");
}

static void write_finish(struct dump_op *op);

static void on_suspects(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	struct dump_op *op = data;

	(void)c;
	(void)fds;
	(void)nfds;
	if (rep && !rep->err && rep->body_case == GPUCR__MSG__BODY_SUSPECTS)
		append_suspects(op, rep->suspects);
	else
		snprintf(op->msg + strlen(op->msg), sizeof(op->msg) - strlen(op->msg),
			 "; the process did not name the functions it launched since the cut%s%s%s",
			 !rep ? " (its connection closed)" : conn_reply_timed_out(rep) ? " (" : "",
			 conn_reply_timed_out(rep) ? rep->err_msg : "", conn_reply_timed_out(rep) ? ")" : "");
	write_finish(op);
}

/* A write escaped prediction: the epoch ends and the shim names (and from
 * now on holds) the functions it let run in it. 0 when asked (on_suspects
 * finishes the dump). */
static int ask_suspects(struct dump_op *op)
{
	struct proc *p = op->p;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__ChunksSaved cs = GPUCR__CHUNKS_SAVED__INIT;

	if (!p->shim || !p->save_epoch)
		return -ENOENT;
	cs.has_all = cs.all = 1;
	cs.has_escaped = cs.escaped = 1;
	m.body_case = GPUCR__MSG__BODY_CHUNKS_SAVED;
	m.chunks_saved = &cs;
	/* p->save_epoch stays: a Resume answer still on its way comes first
	 * (one connection, in order) and is handled as usual. */
	/* Bounded: the dump's waiters wait for this answer. */
	if (conn_request_timed(p->shim, &m, NULL, 0, shim_bound(0), on_suspects, NULL, op) < 0)
		return -ECONNRESET;
	op->asked = 1;
	return 0;
}

static void write_done(void *data, int status)
{
	struct dump_op *op = data;

	(void)status;
	op->phase = PH_DONE;
	/* The proc stays busy until write_finish. */
	if (op->cc && op->err == -ESTALE && ask_suspects(op) == 0)
		return;
	write_finish(op);
}

static void write_finish(struct dump_op *op)
{
	struct proc *p = op->p;
	struct conn *waiting;
	struct daemon *op_d;
	uint64_t pc_bytes;
	uint32_t pc_rounds;

	/* The proc cannot go away while busy: drop refuses, and a released
	 * process's disconnect keeps it. */
	p->busy--;
	precopy_figures(op->pc, &pc_bytes, &pc_rounds);
	if (op->err) {
		pr_err("pid %d: the GPU image was not written: %s", (int)op->pid, op->msg);
		p->dump_err = op->err;
		snprintf(p->dump_msg, sizeof(p->dump_msg), "%s", op->msg);
	} else {
		pr_info("pid %d (%s): GPU image written: %llu MiB of %llu MiB stored in %.2f s (%.1f GB/s)%s",
			(int)op->pid, p->comm, (unsigned long long)(op->st.stored >> 20),
			(unsigned long long)(op->st.bytes >> 20), op->st.elapsed_ns / 1e9,
			op->st.elapsed_ns ? op->st.stored / (op->st.elapsed_ns / 1e9) / 1e9 : 0.0,
			op->st.held_ns >= 1000000 ? ", after it was held back for the driver" : "");
		if (op->st.pre_copied)
			pr_info("pid %d (%s): finished from its pre-copy (%llu MiB in %u round(s)): %llu MiB written at T, "
				"%llu MiB kept; final pass %.3f s",
				(int)op->pid, p->comm, (unsigned long long)(pc_bytes >> 20), pc_rounds,
				(unsigned long long)(op->st.final_bytes >> 20),
				(unsigned long long)(op->st.reused_bytes >> 20), op->st.elapsed_ns / 1e9);
		if (p->state == GPUCR__PROC_STATE__PROC_RELEASED)
			p->state = GPUCR__PROC_STATE__PROC_DUMPED;
		p->image_done = 1;
		p->t_dumped = now_ns();
	}
	if (op->cc) {
		/* The epoch is over, saved or not: no call may wait any longer. */
		if (p->save_epoch) {
			if (!op->asked) {
				flush_saved(op);
				send_saved(p, NULL, 0, 1);
			}
			p->save_epoch = 0;
		}
		if (op->cc->resume_at_end)
			send_resume(p);
		if (op->err == -ESTALE) {
			pr_warn("pid %d (%s): %s", (int)op->pid, p->comm, op->msg);
			p->escaped = 1;
		}
	}
	memset(&p->last, 0, sizeof(p->last));
	if (!op->err) {
		p->last.stored = op->st.stored;
		p->last.elapsed_ns = op->st.elapsed_ns;
		p->last.pre_copied = op->st.pre_copied;
		p->last.final_bytes = op->st.final_bytes;
		p->last.reused_bytes = op->st.reused_bytes;
		p->last.precopy_bytes = pc_bytes;
		p->last.precopy_rounds = pc_rounds;
	}
	waiting = p->remap_waiting;
	p->remap_waiting = NULL;
	op_d = op->d;
	op_finish(op);
	if (!waiting)
		registry_enforce_cap(op_d); /* may free p */
	if (waiting) {
		/* A leave-running dump whose process came back early. */
		if (conn_is_open(waiting) && p->shim == waiting)
			restore_shim_reattached(op_d, p, waiting);
		conn_put(waiting);
	}
}

static void on_release_reply(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	struct dump_op *op = data;
	struct proc *p = op->p;

	(void)c;
	(void)fds;
	(void)nfds;
	if (!p || op->gone) {
		op->p = NULL;
		fail_early(op, -ESRCH, "pid %d exited during its dump", (int)op->pid);
		return;
	}
	if (!rep) {
		fail_early(op, -ECONNRESET, "pid %d: the process's control connection closed during release",
			   (int)op->pid);
		return;
	}
	if (conn_reply_timed_out(rep)) {
		/* The Release is in its socket: the shim may still carry it out
		 * when it runs again (on_release_late). gpucrd holds the memory
		 * either way (taken over), so it is not lost; the Resume that
		 * fail_early sends comes after the Release, and opens the gate
		 * if the shim does not release. */
		p->release_late = 1;
		fail_early(op, -ETIMEDOUT,
			   "pid %d: release: %s (its drain time plus GPUCR_SHIM_TIMEOUT_MS); " SHIM_STUCK_HINT
			   ". The dump is abandoned; the process keeps its GPU memory, or gets it back from gpucrd "
			   "if it releases it late",
			   (int)op->pid, rep->err_msg);
		return;
	}
	if (rep->err) {
		fail_early(op, rep->err, "pid %d: release failed: %s", (int)op->pid,
			   rep->err_msg ? rep->err_msg : gpucr_strerror(rep->err));
		return;
	}
	op->t_released = now_ns();
	p->state = GPUCR__PROC_STATE__PROC_RELEASED;
	pr_info("pid %d (%s): released %llu MiB of GPU memory to gpucrd after %.1f ms", (int)op->pid,
		p->comm, (unsigned long long)(p->bytes >> 20), (op->t_released - op->t_start) / 1e6);
	/* The shim closes its connection right after this reply. The requester
	 * (CRIU's plugin) goes on to dump the process's files: answered before
	 * the close, CRIU can still find the socket there and refuse the dump
	 * ("External socket is used"). So it is answered once the shim is gone. */
	if (p->shim == c && conn_is_open(c))
		op->answer_at_detach = 1;
	else
		answer_requester(op);
	op->phase = PH_WRITING;
	p->busy++;
	if (daemon_queue_work(op->d, write_work, write_done, op) < 0) {
		p->busy--;
		op->err = -ENOMEM;
		snprintf(op->msg, sizeof(op->msg), "cannot start writing the image");
		op_finish(op);
	}
}

/* The shim's answer to a Release whose dump gave up on it (above). */
static void on_release_late(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	struct proc *p = conn_proc(c);

	(void)fds;
	(void)nfds;
	(void)data;
	if (!p)
		return;
	p->release_late = 0;
	if (rep->err) {
		pr_info("pid %d (%s): its late answer to the release: %s; it runs on with its memory", (int)p->pid,
			p->comm, rep->err_msg ? rep->err_msg : gpucr_strerror(rep->err));
		return;
	}
	/* Released: its connection closes next, and only gpucrd's hold keeps
	 * the memory. As released it is kept through the detach, and mapped
	 * back when the shim reconnects (restored). */
	p->state = GPUCR__PROC_STATE__PROC_RELEASED;
	pr_warn("pid %d (%s): released its GPU memory after its dump had given up on it; it gets it back when "
		"its control thread reconnects",
		(int)p->pid, p->comm);
}

static void takeover_work(void *data)
{
	struct dump_op *op = data;

	op->err = registry_take_over(op->p, op->msg, sizeof(op->msg));
}

static void takeover_done(void *data, int status)
{
	struct dump_op *op = data;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__Release rel = GPUCR__RELEASE__INIT;
	int r;

	(void)status;
	if (op->p)
		op->p->busy--;
	if (!op->p || op->gone || op->p->state == GPUCR__PROC_STATE__PROC_GONE) {
		struct proc *p = op->p;

		op->p = NULL;
		if (p && !p->shim)
			registry_drop(op->d, p);
		fail_early(op, -ESRCH, "pid %d exited during its dump", (int)op->pid);
		return;
	}
	if (op->err) {
		int err = op->err;

		op->err = 0;
		fail_early(op, err, "pid %d: %s", (int)op->pid, op->msg);
		return;
	}
	if (!op->p->shim) {
		fail_early(op, -ECONNRESET, "pid %d: control connection lost", (int)op->pid);
		return;
	}
	op->phase = PH_RELEASE;
	m.body_case = GPUCR__MSG__BODY_RELEASE;
	m.release = &rel;
	r = conn_request_timed(op->p->shim, &m, NULL, 0,
			       shim_bound(op->drain_ms < SHIM_RELEASE_DRAIN_MS ? op->drain_ms : SHIM_RELEASE_DRAIN_MS),
			       on_release_reply, on_release_late, op);
	if (r < 0)
		fail_early(op, r, "pid %d: cannot ask for release: %s", (int)op->pid, strerror(-r));
}

/* A process a write escaped prediction from before: it may run in a save
 * epoch again when its shim holds the suspects' launches there (and could
 * remember every one); else only with a copy made on the GPU at T. */
static void decide_gated(struct dump_op *op, const Gpucr__ShimStats *st)
{
	struct proc *p = op->p;

	if (st && st->has_unpredictable && st->unpredictable && !(st->has_unpredictable_lost && st->unpredictable_lost)) {
		op->cc->gated_ok = 1;
		pr_info("pid %d (%s): a GPU write escaped prediction in an earlier checkpoint: this one runs it "
			"while its memory is saved, holding the launches of its %u suspect function(s) until "
			"everything is saved",
			(int)p->pid, p->comm, st->unpredictable);
		return;
	}
	op->cc->gated_ok = 0;
	pr_info("pid %d (%s): a GPU write escaped prediction in an earlier checkpoint%s: this one lets it run "
		"early only with a copy of its memory made on the GPU",
		(int)p->pid, p->comm,
		st && st->has_unpredictable_lost && st->unpredictable_lost
			? " and not every suspect function could be remembered"
			: " (its shim holds no suspect functions)");
}

static void on_quiesce_reply(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds, void *data)
{
	struct dump_op *op = data;

	(void)c;
	(void)fds;
	(void)nfds;
	if (!op->p || op->gone) {
		op->p = NULL;
		fail_early(op, -ESRCH, "pid %d exited during its dump", (int)op->pid);
		return;
	}
	if (!rep) {
		fail_early(op, -ECONNRESET, "pid %d: the process's control connection closed during quiesce",
			   (int)op->pid);
		return;
	}
	if (conn_reply_timed_out(rep)) {
		/* The Resume fail_early sends comes after the Quiesce: a shim
		 * that runs again quiesces (its late answer is dropped), then
		 * opens its gate. */
		fail_early(op, -ETIMEDOUT,
			   "pid %d: cannot quiesce: %s (its drain time plus GPUCR_SHIM_TIMEOUT_MS); " SHIM_STUCK_HINT
			   ". The dump is abandoned; the process runs on",
			   (int)op->pid, rep->err_msg);
		return;
	}
	if (rep->err) {
		fail_early(op, rep->err, "pid %d: cannot quiesce: %s", (int)op->pid,
			   rep->err_msg ? rep->err_msg : gpucr_strerror(rep->err));
		return;
	}
	op->p->state = GPUCR__PROC_STATE__PROC_QUIESCED;
	if (op->cc && op->p->escaped)
		decide_gated(op, rep->body_case == GPUCR__MSG__BODY_SHIM_STATS ? rep->shim_stats : NULL);
	op->phase = PH_TAKEOVER;
	op->p->busy++;
	if (daemon_queue_work(op->d, takeover_work, takeover_done, op) < 0) {
		op->p->busy--;
		fail_early(op, -ENOMEM, "pid %d: cannot queue work", (int)op->pid);
	}
}

int dump_start(struct daemon *d, struct conn *c, const Gpucr__Msg *req, int dirfd)
{
	const Gpucr__DumpRequest *dr = req->dump;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__Quiesce q = GPUCR__QUIESCE__INIT;
	struct proc *p = registry_find(d, (pid_t)dr->pid);
	struct dump_op *op;
	uint64_t id = req->has_id ? req->id : 0;
	int r;

	if (!p || !registry_may_act(conn_uid(c), p)) {
		conn_reply_err(c, id, -ESRCH,
			       "pid %u is not attached to gpucrd%s (was it started with 'gpucr run'?)",
			       dr->pid, p ? " or is not yours" : "");
		return -ESRCH;
	}
	if (p->dump) {
		conn_reply_err(c, id, -EBUSY, "pid %u: a dump of this process is already running%s", dr->pid,
			       p->dump->phase == PH_WRITING ? " (its GPU image is still being written)" : "");
		return -EBUSY;
	}
	if (p->shim && (p->state == GPUCR__PROC_STATE__PROC_DUMPED || p->state == GPUCR__PROC_STATE__PROC_RESTORING)) {
		/* Left running by a dump that just ended: it is mapping its
		 * memory back. */
		conn_reply_err(c, id, -EAGAIN,
			       "pid %u is still getting its GPU memory back after its previous dump; try again in a moment",
			       dr->pid);
		return -EAGAIN;
	}
	if (p->release_late) {
		conn_reply_err(c, id, -EBUSY,
			       "pid %u has not answered the release of its previous dump, which timed out; it may "
			       "still release its memory: try again once it runs (is it stopped?)",
			       dr->pid);
		return -EBUSY;
	}
	if (p->state != GPUCR__PROC_STATE__PROC_RUNNING || !p->shim) {
		conn_reply_err(c, id, -EBUSY, "pid %u is not running under gpucr right now (state %d)",
			       dr->pid, p->state);
		return -EBUSY;
	}
	if (precopy_running(p)) {
		conn_reply_err(c, id, -EBUSY, "pid %u: its pre-copy is still running; dump it once that is answered",
			       dr->pid);
		return -EBUSY;
	}
	op = calloc(1, sizeof(*op));
	if (!op) {
		conn_reply_err(c, id, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	op->d = d;
	op->p = p;
	op->pid = p->pid;
	op->dirfd = dirfd;
	op->retain = dr->has_retain ? dr->retain : 1;
	op->req_conn = c;
	op->req_id = id;
	op->t_start = now_ns();
	op->pc = precopy_take(p, dirfd);
	if (dr->has_concurrent && dr->concurrent && dr->has_leave_running && dr->leave_running && cc_start(op) < 0)
		pr_warn("pid %d: no concurrent dump (out of memory); it waits for its image", (int)p->pid);
	if (dr->has_image_background && dr->image_background && !env_off("GPUCR_WRITE_AFTER_DRIVER")) {
		if (dr->has_leave_running && dr->leave_running && !op->cc) {
			/* Left running but not concurrent: the process itself waits
			 * for its image once the driver has put it back. */
			pr_debug("pid %d: image write not held back: the process waits for it", (int)p->pid);
		} else {
			op->hold = hold_new(op->cc ? GPUCR__DRIVER_OP_KIND__DRV_UNLOCK : GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT);
			if (!op->hold)
				pr_warn("pid %d: its image write is not held back for the driver (out of memory)",
					(int)p->pid);
		}
	}
	conn_hold(c);
	p->dump = op;
	p->cr_conn = c;
	p->dump_err = 0;
	p->image_done = 0;
	p->io_done = p->io_total = 0;
	p->image_dir[0] = 0;
	{
		char link[64];
		ssize_t n;

		snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
		n = readlink(link, p->image_dir, sizeof(p->image_dir) - 1);
		p->image_dir[n > 0 ? n : 0] = 0;
	}
	pr_info("pid %d (%s): dump requested by pid %d into %s (%llu MiB in %llu buffers)", (int)p->pid,
		p->comm, (int)conn_pid(c), p->image_dir, (unsigned long long)(p->bytes >> 20),
		(unsigned long long)p->nbufs);
	q.has_timeout_ms = 1;
	q.timeout_ms = dr->has_timeout_ms ? dr->timeout_ms : 10000;
	op->drain_ms = q.timeout_ms;
	m.body_case = GPUCR__MSG__BODY_QUIESCE;
	m.quiesce = &q;
	op->phase = PH_QUIESCE;
	r = conn_request_timed(p->shim, &m, NULL, 0, shim_bound(q.timeout_ms), on_quiesce_reply, NULL, op);
	if (r < 0) {
		op->dirfd = -1; /* the caller keeps it on failure */
		fail_early(op, r, "pid %d: cannot reach its control thread: %s", (int)p->pid, strerror(-r));
		return r;
	}
	return 0;
}

int dump_wait(struct daemon *d, struct conn *c, const Gpucr__Msg *req)
{
	struct proc *p = registry_find(d, (pid_t)req->dump_wait->pid);
	uint64_t id = req->has_id ? req->id : 0;
	Gpucr__DumpReply dr = GPUCR__DUMP_REPLY__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	struct waiter *w;

	if (!p || !registry_may_act(conn_uid(c), p))
		return conn_reply_err(c, id, -ESRCH, "pid %u: not known to gpucrd", req->dump_wait->pid);
	if (!p->dump) {
		if (p->dump_err)
			return conn_reply_err(c, id, p->dump_err, "%s", p->dump_msg);
		if (!p->image_done)
			return conn_reply_err(c, id, -ENOENT,
					      "pid %u: no dump in progress and no complete image", req->dump_wait->pid);
		dr.has_bytes = 1;
		dr.bytes = p->bytes;
		dr.has_stored_bytes = dr.has_elapsed_ns = 1;
		dr.stored_bytes = p->last.stored;
		dr.elapsed_ns = p->last.elapsed_ns;
		figures_reply(&dr, &p->last);
		m.body_case = GPUCR__MSG__BODY_DUMP_REPLY;
		m.dump_reply = &dr;
		return conn_reply(c, id, &m, NULL, 0);
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return conn_reply_err(c, id, -ENOMEM, "out of memory");
	w->c = c;
	w->id = id;
	conn_hold(c);
	hold_end(p->dump, "a DumpWait came (pid %d waits for the image)", (int)conn_pid(c));
	w->next = p->dump->waiters;
	p->dump->waiters = w;
	return 0;
}

void dump_proc_gone(struct daemon *d, struct proc *p)
{
	(void)d;
	if (!p->dump)
		return;
	/* The op keeps going only while a worker holds the proc; mark it. */
	p->dump->gone = 1;
	hold_end(p->dump, "the process went away");
	if (p->dump->phase == PH_QUIESCE || p->dump->phase == PH_RELEASE) {
		/* Its request callbacks will run (connection closing) and end
		 * the op; detach it from the proc being freed. */
		p->dump->p = NULL;
		p->dump = NULL;
	}
}
