/* Owns the driver's checkpoint API calls (cuCheckpointProcess*) that gpucrd
 * makes for the CRIU plugin: lock, checkpoint, restore, unlock, state and
 * restore thread of a process, whether or not it runs under gpucr. They can
 * block (lock waits for the GPU work in flight), so they run on a worker.
 *
 * Bounds. Only the lock takes a timeout from the driver; a checkpoint or
 * restore of a process holding tens of GiB takes a minute on the stock
 * path, and a wedged driver never returns. A call still inside the driver
 * GPUCR_DRIVER_TIMEOUT_MS (default 300000) past the time it was given (the
 * lock's timeout; 0 for the others) is answered with -ETIMEDOUT; the worker
 * cannot be cancelled, so the call is left to finish, and until it does
 * every other driver call for that pid is refused (-EBUSY) rather than
 * queued behind it. When it returns, its result, which nobody waits for
 * any more, is undone where it changed the process, so that the process
 * ends as its requester was told it is (the call failed): a late lock is
 * unlocked, a late checkpoint restored and unlocked, a late restore
 * unlocked. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "gpucrd.h"
#include "log.h"

struct drv_job {
	struct daemon *d;
	struct conn *c;
	uint64_t id;
	int pid;
	Gpucr__DriverOpKind op;
	unsigned timeout_ms;
	int err;
	char msg[512];
	Gpucr__DriverState state;
	int tid;
	uint64_t ns;
	uv_timer_t timer;
	unsigned bound_ms;          /* 0: no bound */
	int expired;                /* the requester was told it timed out */
	int skipped;                /* expired before a worker took it: not made */
	int undo;                   /* gpucrd's own call, putting a process back */
	struct drv_job *next;       /* in_flight */
};

/* Every call queued or inside the driver (loop only). */
static struct drv_job *in_flight;

static void drv_queue(struct drv_job *j);

static const char *op_name(Gpucr__DriverOpKind op)
{
	switch (op) {
	case GPUCR__DRIVER_OP_KIND__DRV_GET_STATE:
		return "get-state";
	case GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID:
		return "get-restore-tid";
	case GPUCR__DRIVER_OP_KIND__DRV_LOCK:
		return "lock";
	case GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT:
		return "checkpoint";
	case GPUCR__DRIVER_OP_KIND__DRV_RESTORE:
		return "restore";
	case GPUCR__DRIVER_OP_KIND__DRV_UNLOCK:
		return "unlock";
	default:
		return "?";
	}
}

static void drv_work(void *data)
{
	struct drv_job *j = data;
	const struct cudrv *drv;
	uint64_t t0;
	CUprocessState st = CU_PROCESS_STATE_RUNNING;
	CUresult cr = CUDA_SUCCESS;
	char gmsg[512];
	int r;

	/* The driver alone (cuInit), not gpu_init: these calls need no context
	 * of ours, and must not wait behind the start of the GPU side (contexts
	 * on every device, the fingerprint module, pinned staging), which runs
	 * in the background at startup and can take long or fail on its own. */
	r = cudrv_load(&drv, gmsg, sizeof(gmsg));
	if (r < 0) {
		j->err = r;
		snprintf(j->msg, sizeof(j->msg), "no CUDA driver in gpucrd: %.400s", gmsg);
		return;
	}
	if (!cudrv_has_checkpoint(drv)) {
		j->err = -EOPNOTSUPP;
		snprintf(j->msg, sizeof(j->msg),
			 "the CUDA driver (version %d) has no checkpoint API; r570 or newer is needed",
			 drv->version);
		return;
	}
	if ((unsigned)j->op > CKPT_UNLOCK) {
		j->err = -EINVAL;
		snprintf(j->msg, sizeof(j->msg), "unknown driver operation %d", (int)j->op);
		return;
	}
	/* Its requester gave up while it waited for a worker (behind calls
	 * stuck in the driver): a call nobody waits for is not made. */
	if (__atomic_load_n(&j->expired, __ATOMIC_ACQUIRE)) {
		j->skipped = 1;
		return;
	}
	t0 = now_ns();
	cr = cudrv_ckpt_op(drv, j->pid, (enum cudrv_ckpt_op)j->op, j->timeout_ms, &st, &j->tid);
	if (cr == CUDA_SUCCESS && j->op == GPUCR__DRIVER_OP_KIND__DRV_GET_STATE)
		j->state = msg_driver_state(st);
	j->ns = now_ns() - t0;
	if (cr != CUDA_SUCCESS) {
		j->err = gpucr_err_from_cu(cr);
		snprintf(j->msg, sizeof(j->msg), "pid %d: driver %s failed: %s%s", j->pid, op_name(j->op),
			 gpucr_strerror(j->err),
			 j->op == GPUCR__DRIVER_OP_KIND__DRV_LOCK && cr == CUDA_ERROR_TIMEOUT ?
				 " (a kernel that never finishes keeps the driver from locking the process)" :
				 "");
	}
}

static void drv_free(uv_handle_t *h)
{
	struct drv_job *j = h->data;

	if (j->c)
		conn_put(j->c);
	free(j);
}

static void in_flight_remove(struct drv_job *j)
{
	struct drv_job **pp;

	for (pp = &in_flight; *pp; pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			break;
		}
}

/* A call gpucrd makes itself (no requester, no bound). */
static void undo_start(struct daemon *d, int pid, Gpucr__DriverOpKind op)
{
	struct drv_job *j = calloc(1, sizeof(*j));

	if (!j) {
		pr_err("pid %d: out of memory: cannot make the driver %s that puts it back", pid, op_name(op));
		return;
	}
	j->d = d;
	j->pid = pid;
	j->op = op;
	j->undo = 1;
	pr_warn("pid %d: driver %s, to put it back as its requester was told it is", pid, op_name(op));
	drv_queue(j);
}

/* What a late call's success changed, undone (see the top of the file). */
static void undo_late(struct drv_job *j)
{
	switch (j->op) {
	case GPUCR__DRIVER_OP_KIND__DRV_LOCK:
	case GPUCR__DRIVER_OP_KIND__DRV_RESTORE:
		undo_start(j->d, j->pid, GPUCR__DRIVER_OP_KIND__DRV_UNLOCK);
		break;
	case GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT:
		undo_start(j->d, j->pid, GPUCR__DRIVER_OP_KIND__DRV_RESTORE);
		break;
	default:
		break;
	}
}

static void drv_done(void *data, int status)
{
	struct drv_job *j = data;
	Gpucr__DriverOpReply dr = GPUCR__DRIVER_OP_REPLY__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	(void)status;
	in_flight_remove(j);
	uv_timer_stop(&j->timer);
	if (j->undo) {
		if (j->err) {
			pr_err("%s; it could not be put back", j->msg);
		} else {
			pr_info("pid %d: driver %s done (%.1f ms): put back", j->pid, op_name(j->op), j->ns / 1e6);
			if (j->op == GPUCR__DRIVER_OP_KIND__DRV_RESTORE)
				undo_start(j->d, j->pid, GPUCR__DRIVER_OP_KIND__DRV_UNLOCK);
		}
	} else if (j->expired && j->skipped) {
		pr_info("pid %d: driver %s not made: its requester had given up on it", j->pid, op_name(j->op));
	} else if (j->expired) {
		/* Its requester was told it failed: the process is put back to
		 * match, whatever the driver did. */
		pr_warn("pid %d: driver %s returned after %.1f s, past its bound of %u ms: %s", j->pid,
			op_name(j->op), j->ns / 1e9, j->bound_ms, j->err ? j->msg : "done; undoing it");
		if (!j->err)
			undo_late(j);
	} else if (j->err) {
		if (j->op != GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID &&
		    j->op != GPUCR__DRIVER_OP_KIND__DRV_GET_STATE)
			pr_err("%s", j->msg);
		conn_reply_err(j->c, j->id, j->err, "%s", j->msg);
	} else {
		pr_debug("pid %d: driver %s in %.1f ms", j->pid, op_name(j->op), j->ns / 1e6);
		dr.has_state = j->op == GPUCR__DRIVER_OP_KIND__DRV_GET_STATE;
		dr.state = j->state;
		dr.has_restore_tid = j->op == GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID;
		dr.restore_tid = (uint32_t)j->tid;
		dr.has_elapsed_ns = 1;
		dr.elapsed_ns = j->ns;
		m.body_case = GPUCR__MSG__BODY_DRIVER_OP_REPLY;
		m.driver_op_reply = &dr;
		conn_reply(j->c, j->id, &m, NULL, 0);
	}
	/* After the line above: a GPU run's log shows the driver done first,
	 * then the image write it held back. An expired call told the dump
	 * already, and the pid's dump may be another one by now. */
	if (!j->undo && !j->expired)
		dump_driver_op_done(registry_find(j->d, (pid_t)j->pid), j->op, j->err);
	uv_close((uv_handle_t *)&j->timer, drv_free);
}

static void on_drv_timeout(uv_timer_t *t)
{
	struct drv_job *j = t->data;

	__atomic_store_n(&j->expired, 1, __ATOMIC_RELEASE);
	pr_err("pid %d: driver %s did not return within %u ms (GPUCR_DRIVER_TIMEOUT_MS); its requester is told "
	       "so, and the call is left to finish",
	       j->pid, op_name(j->op), j->bound_ms);
	conn_reply_err(j->c, j->id, -ETIMEDOUT,
		       "pid %d: the driver's %s did not return within %u ms (GPUCR_DRIVER_TIMEOUT_MS, beyond the "
		       "time the call was given): the driver is stuck, or slow with a process holding much GPU "
		       "memory (raise the bound then). gpucrd makes no other driver call for this pid until it "
		       "returns, then puts the process back as before the call",
		       j->pid, op_name(j->op), j->bound_ms);
	/* The image write a dump holds back for this call need not wait. */
	dump_driver_op_done(registry_find(j->d, (pid_t)j->pid), j->op, -ETIMEDOUT);
}

static void drv_queue(struct drv_job *j)
{
	uv_loop_t *loop = j->d->loop;

	uv_timer_init(loop, &j->timer);
	j->timer.data = j;
	if (daemon_queue_work(j->d, drv_work, drv_done, j) < 0) {
		if (j->c)
			conn_reply_err(j->c, j->id, -ENOMEM, "cannot queue the driver operation");
		else
			pr_err("pid %d: cannot queue the driver %s", j->pid, op_name(j->op));
		uv_close((uv_handle_t *)&j->timer, drv_free);
		return;
	}
	j->next = in_flight;
	in_flight = j;
	if (j->bound_ms)
		uv_timer_start(&j->timer, on_drv_timeout, j->bound_ms, 0);
}

int driver_op(struct daemon *d, struct conn *c, const Gpucr__Msg *req)
{
	const Gpucr__DriverOp *o = req->driver_op;
	uint64_t id = req->has_id ? req->id : 0;
	struct drv_job *j;
	uint64_t bound;
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%u", o->pid);
	if (stat(path, &st) < 0)
		return conn_reply_err(c, id, -ESRCH, "pid %u: no such process", o->pid);
	if (conn_uid(c) != 0 && conn_uid(c) != st.st_uid)
		return conn_reply_err(c, id, -EPERM, "pid %u is not yours", o->pid);
	for (j = in_flight; j; j = j->next)
		if (j->pid == (int)o->pid && (j->expired || j->undo))
			return conn_reply_err(c, id, -EBUSY,
					      "pid %u: the driver's %s of it %s; no other driver call is made for it "
					      "until that returns (is the driver stuck?)",
					      o->pid, op_name(j->op),
					      j->undo ? "that puts it back after a late call is still running" :
							"timed out and has not returned yet");
	j = calloc(1, sizeof(*j));
	if (!j)
		return conn_reply_err(c, id, -ENOMEM, "out of memory");
	j->d = d;
	j->c = c;
	j->id = id;
	j->pid = (int)o->pid;
	j->op = o->op;
	j->timeout_ms = o->has_timeout_ms ? o->timeout_ms : 10000;
	bound = env_ms("GPUCR_DRIVER_TIMEOUT_MS", 300000);
	if (bound && j->op == GPUCR__DRIVER_OP_KIND__DRV_LOCK)
		bound += j->timeout_ms;
	j->bound_ms = bound > UINT32_MAX ? UINT32_MAX : (unsigned)bound;
	conn_hold(c);
	drv_queue(j);
	return 0;
}

/* ---- waking a control thread ------------------------------------------- */

struct wake_job {
	struct conn *c;
	uint64_t id;
	pid_t pid, tid;
	int err;
	char msg[256];
};

/* The thread's tracer (CRIU, until it lets the process go), or -1. */
static int tracer_of(pid_t pid, pid_t tid)
{
	char path[96], line[256];
	int tracer = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid, (int)tid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "TracerPid: %d", &tracer) == 1)
			break;
	fclose(f);
	return tracer;
}

static void wake_work(void *data)
{
	struct wake_job *j = data;
	int i, t = -1;

	/* CRIU still traces the thread while its hooks run; a signal sent
	 * then would stop it for the tracer. Wait until it is let go. */
	for (i = 0; i < 60000; i++) {
		t = tracer_of(j->pid, j->tid);
		if (t <= 0)
			break;
		usleep(1000);
	}
	if (t < 0) {
		j->err = -ESRCH;
		snprintf(j->msg, sizeof(j->msg), "pid %d: no thread %d to wake", (int)j->pid, (int)j->tid);
		return;
	}
	if (t > 0) {
		j->err = -ETIMEDOUT;
		snprintf(j->msg, sizeof(j->msg), "pid %d: thread %d still traced by %d after 60 s", (int)j->pid,
			 (int)j->tid, t);
		return;
	}
	if (syscall(SYS_tgkill, j->pid, j->tid, gpucr_wake_signal()) < 0) {
		j->err = -errno;
		snprintf(j->msg, sizeof(j->msg), "pid %d: signal to thread %d: %s", (int)j->pid, (int)j->tid,
			 strerror(errno));
	}
}

static void wake_done(void *data, int status)
{
	struct wake_job *j = data;

	(void)status;
	if (j->err)
		conn_reply_err(j->c, j->id, j->err, "%s", j->msg);
	else
		conn_reply(j->c, j->id, NULL, NULL, 0);
	conn_put(j->c);
	free(j);
}

int wake_proc(struct daemon *d, struct conn *c, const Gpucr__Msg *req)
{
	const Gpucr__Wake *w = req->wake;
	uint64_t id = req->has_id ? req->id : 0;
	struct proc *p = registry_find(d, (pid_t)w->pid);
	struct wake_job *j;
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%u", w->pid);
	if (stat(path, &st) < 0)
		return conn_reply_err(c, id, -ESRCH, "pid %u: no such process", w->pid);
	if (conn_uid(c) != 0 && conn_uid(c) != st.st_uid)
		return conn_reply_err(c, id, -EPERM, "pid %u is not yours", w->pid);
	j = calloc(1, sizeof(*j));
	if (!j)
		return conn_reply_err(c, id, -ENOMEM, "out of memory");
	j->c = c;
	j->id = id;
	j->pid = (pid_t)w->pid;
	j->tid = w->has_tid ? (pid_t)w->tid : (p ? p->control_tid : 0);
	if (!j->tid) {
		free(j);
		return conn_reply_err(c, id, -ENOENT, "pid %u: gpucrd does not know its control thread", w->pid);
	}
	if (p)
		p->cr_conn = NULL; /* CRIU is done with it: it may reconnect (concurrent dumps) */
	conn_hold(c);
	if (daemon_queue_work(d, wake_work, wake_done, j) < 0) {
		conn_put(c);
		free(j);
		return conn_reply_err(c, id, -ENOMEM, "cannot queue the wake-up");
	}
	return 0;
}
