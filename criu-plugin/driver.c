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
	CUprocessState st = CU_PROCESS_STATE_RUNNING;
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
	if ((unsigned)op > CKPT_UNLOCK)
		return -EINVAL;
	cr = cudrv_ckpt_op(d, pid, (enum cudrv_ckpt_op)op, timeout_ms, &st, ret_tid);
	if (cr == CUDA_SUCCESS && op == GPUCR__DRIVER_OP_KIND__DRV_GET_STATE && ret_state)
		*ret_state = msg_driver_state(st);
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
