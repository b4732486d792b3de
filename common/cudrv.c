/* Owns loading the CUDA driver into gpucr's own processes (not the
 * application's: the shim is the driver there). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudrv.h"
#include "err.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static struct cudrv drv;
static int load_ret = 1;
static char load_msg[512];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static int load(void)
{
	const char *path = getenv("GPUCR_DRIVER_LIBCUDA");
	CUresult cr;

	if (!path || !*path)
		path = "libcuda.so.1";
	snprintf(drv.path, sizeof(drv.path), "%s", path);
	drv.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!drv.handle) {
		snprintf(load_msg, sizeof(load_msg),
			 "cannot load the CUDA driver (%s): %s; is the NVIDIA driver installed?", path,
			 dlerror());
		return -ENOENT;
	}
#define CUDRV_LOOKUP(f) drv.f = (__typeof__(drv.f))dlsym(drv.handle, STR(f));
	CUDRV_FUNCS(CUDRV_LOOKUP)
#undef CUDRV_LOOKUP
	if (!drv.cuInit || !drv.cuDriverGetVersion || !drv.cuMemCreate || !drv.cuMemcpyDtoH) {
		snprintf(load_msg, sizeof(load_msg), "%s lacks basic driver entry points (cuInit, cuMemCreate)", path);
		return -ENOSYS;
	}
	cr = drv.cuInit(0);
	if (cr != CUDA_SUCCESS) {
		snprintf(load_msg, sizeof(load_msg), "cuInit failed: %s", gpucr_strerror(gpucr_err_from_cu(cr)));
		return gpucr_err_from_cu(cr);
	}
	drv.cuDriverGetVersion(&drv.version);
	return 0;
}

int cudrv_load(const struct cudrv **ret, char *msg, size_t msglen)
{
	int r;

	pthread_mutex_lock(&load_lock);
	if (load_ret == 1)
		load_ret = load();
	r = load_ret;
	pthread_mutex_unlock(&load_lock);
	if (r < 0) {
		if (msg)
			snprintf(msg, msglen, "%s", load_msg);
		return r;
	}
	*ret = &drv;
	return 0;
}

CUresult cudrv_ckpt_op(const struct cudrv *d, int pid, enum cudrv_ckpt_op op, unsigned timeout_ms,
		       CUprocessState *ret_state, int *ret_tid)
{
	switch (op) {
	case CKPT_GET_STATE:
		return d->cuCheckpointProcessGetState(pid, ret_state);
	case CKPT_GET_RESTORE_TID:
		if (!d->cuCheckpointProcessGetRestoreThreadId)
			return CUDA_ERROR_NOT_SUPPORTED;
		return d->cuCheckpointProcessGetRestoreThreadId(pid, ret_tid);
	case CKPT_LOCK: {
		CUcheckpointLockArgs a;

		memset(&a, 0, sizeof(a));
		a.timeoutMs = timeout_ms;
		return d->cuCheckpointProcessLock(pid, &a);
	}
	case CKPT_CHECKPOINT: {
		CUcheckpointCheckpointArgs a;

		memset(&a, 0, sizeof(a));
		return d->cuCheckpointProcessCheckpoint(pid, &a);
	}
	case CKPT_RESTORE: {
		CUcheckpointRestoreArgs a;

		memset(&a, 0, sizeof(a));
		return d->cuCheckpointProcessRestore(pid, &a);
	}
	case CKPT_UNLOCK: {
		CUcheckpointUnlockArgs a;

		memset(&a, 0, sizeof(a));
		return d->cuCheckpointProcessUnlock(pid, &a);
	}
	}
	return CUDA_ERROR_INVALID_VALUE;
}
