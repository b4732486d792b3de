/* Owns the plugin's calls of the driver checkpoint API: through gpucrd when
 * it runs (it has the driver loaded and initialised once), else through the
 * driver loaded into CRIU here, so plain CUDA processes are checkpointed
 * with or without the daemon. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cudrv.h"
#include "err.h"
#include "plugin.h"

static int local_op(int pid, Gpucr__DriverOpKind op, unsigned timeout_ms, Gpucr__DriverState *ret_state,
		    int *ret_tid, char *msg, size_t msglen)
{
	const struct cudrv *d;
	CUresult cr = CUDA_SUCCESS;
	int r;

	r = cudrv_load(&d, msg, msglen);
	if (r < 0)
		return r;
	if (!cudrv_has_checkpoint(d)) {
		snprintf(msg, msglen, "the CUDA driver (version %d) has no checkpoint API; r570 or newer is needed",
			 d->version);
		return -EOPNOTSUPP;
	}
	switch (op) {
	case GPUCR__DRIVER_OP_KIND__DRV_GET_STATE: {
		CUprocessState st;

		cr = d->cuCheckpointProcessGetState(pid, &st);
		if (cr == CUDA_SUCCESS && ret_state)
			*ret_state = st == CU_PROCESS_STATE_RUNNING	 ? GPUCR__DRIVER_STATE__DRV_STATE_RUNNING :
				     st == CU_PROCESS_STATE_LOCKED	 ? GPUCR__DRIVER_STATE__DRV_STATE_LOCKED :
				     st == CU_PROCESS_STATE_CHECKPOINTED ? GPUCR__DRIVER_STATE__DRV_STATE_CHECKPOINTED :
									   GPUCR__DRIVER_STATE__DRV_STATE_FAILED;
		break;
	}
	case GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID:
		cr = d->cuCheckpointProcessGetRestoreThreadId ?
			     d->cuCheckpointProcessGetRestoreThreadId(pid, ret_tid) :
			     CUDA_ERROR_NOT_SUPPORTED;
		break;
	case GPUCR__DRIVER_OP_KIND__DRV_LOCK: {
		CUcheckpointLockArgs a;

		memset(&a, 0, sizeof(a));
		a.timeoutMs = timeout_ms;
		cr = d->cuCheckpointProcessLock(pid, &a);
		break;
	}
	case GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT: {
		CUcheckpointCheckpointArgs a;

		memset(&a, 0, sizeof(a));
		cr = d->cuCheckpointProcessCheckpoint(pid, &a);
		break;
	}
	case GPUCR__DRIVER_OP_KIND__DRV_RESTORE: {
		CUcheckpointRestoreArgs a;

		memset(&a, 0, sizeof(a));
		cr = d->cuCheckpointProcessRestore(pid, &a);
		break;
	}
	case GPUCR__DRIVER_OP_KIND__DRV_UNLOCK: {
		CUcheckpointUnlockArgs a;

		memset(&a, 0, sizeof(a));
		cr = d->cuCheckpointProcessUnlock(pid, &a);
		break;
	}
	default:
		return -EINVAL;
	}
	if (cr != CUDA_SUCCESS) {
		r = gpucr_err_from_cu(cr);
		snprintf(msg, msglen, "pid %d: driver call failed: %s", pid, gpucr_strerror(r));
		return r;
	}
	return 0;
}

int drv_op(int pid, Gpucr__DriverOpKind op, unsigned timeout_ms, Gpucr__DriverState *ret_state,
	   int *ret_tid, char *msg, size_t msglen)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__DriverOp o = GPUCR__DRIVER_OP__INIT;
	int r;

	if (client_connect() < 0)
		return local_op(pid, op, timeout_ms, ret_state, ret_tid, msg, msglen);
	o.pid = (uint32_t)pid;
	o.op = op;
	o.has_timeout_ms = timeout_ms != 0;
	o.timeout_ms = timeout_ms;
	m.body_case = GPUCR__MSG__BODY_DRIVER_OP;
	m.driver_op = &o;
	r = client_call(&m, -1, &rep);
	if (r < 0) {
		snprintf(msg, msglen, "gpucrd did not answer: %s", strerror(-r));
		return r;
	}
	if (rep->err) {
		r = rep->err;
		snprintf(msg, msglen, "%s", rep->err_msg ? rep->err_msg : gpucr_strerror(r));
	} else if (rep->body_case == GPUCR__MSG__BODY_DRIVER_OP_REPLY) {
		if (ret_state && rep->driver_op_reply->has_state)
			*ret_state = rep->driver_op_reply->state;
		if (ret_tid && rep->driver_op_reply->has_restore_tid)
			*ret_tid = (int)rep->driver_op_reply->restore_tid;
	}
	msg_free(rep);
	return r;
}
