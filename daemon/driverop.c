/* Owns the driver's checkpoint API calls (cuCheckpointProcess*) that gpucrd
 * makes for the CRIU plugin: lock, checkpoint, restore, unlock, state and
 * restore thread of a process, whether or not it runs under gpucr. They can
 * block (lock waits for the GPU work in flight), so they run on a worker. */
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
};

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

static void drv_done(void *data, int status)
{
	struct drv_job *j = data;
	Gpucr__DriverOpReply dr = GPUCR__DRIVER_OP_REPLY__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	(void)status;
	if (j->err) {
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
	 * then the image write it held back. */
	dump_driver_op_done(registry_find(j->d, (pid_t)j->pid), j->op, j->err);
	conn_put(j->c);
	free(j);
}

int driver_op(struct daemon *d, struct conn *c, const Gpucr__Msg *req)
{
	const Gpucr__DriverOp *o = req->driver_op;
	uint64_t id = req->has_id ? req->id : 0;
	struct drv_job *j;
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%u", o->pid);
	if (stat(path, &st) < 0)
		return conn_reply_err(c, id, -ESRCH, "pid %u: no such process", o->pid);
	if (conn_uid(c) != 0 && conn_uid(c) != st.st_uid)
		return conn_reply_err(c, id, -EPERM, "pid %u is not yours", o->pid);
	j = calloc(1, sizeof(*j));
	if (!j)
		return conn_reply_err(c, id, -ENOMEM, "out of memory");
	j->d = d;
	j->c = c;
	j->id = id;
	j->pid = (int)o->pid;
	j->op = o->op;
	j->timeout_ms = o->has_timeout_ms ? o->timeout_ms : 10000;
	conn_hold(c);
	if (daemon_queue_work(d, drv_work, drv_done, j) < 0) {
		conn_put(c);
		free(j);
		return conn_reply_err(c, id, -ENOMEM, "cannot queue the driver operation");
	}
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
	if (p && p->dump)
		p->dump_woken = 1; /* CRIU is done with it: it may reconnect (concurrent dumps) */
	if (p)
		p->cr_conn = NULL;
	conn_hold(c);
	if (daemon_queue_work(d, wake_work, wake_done, j) < 0) {
		conn_put(c);
		free(j);
		return conn_reply_err(c, id, -ENOMEM, "cannot queue the wake-up");
	}
	return 0;
}
