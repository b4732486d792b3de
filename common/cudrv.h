/* The CUDA driver, loaded at run time (NCCL's cudawrap idea): gpucrd, the
 * CRIU plugin and the tools dlopen libcuda.so.1 and resolve the entry points
 * they use once, into a table. So they start, and say clearly what is
 * missing, on hosts without a driver; and tests can point them at the test
 * double with GPUCR_DRIVER_LIBCUDA.
 *
 * Names in the table are cuda.h's (cuMemcpyDtoH expands to cuMemcpyDtoH_v2
 * there, and so does the symbol looked up). Functions a driver lacks (the
 * checkpoint API before r570) are NULL. */
#ifndef GPUCR_CUDRV_H
#define GPUCR_CUDRV_H

#include <cuda.h>

#define CUDRV_FUNCS(X)                                  \
	X(cuInit)                                       \
	X(cuDriverGetVersion)                           \
	X(cuGetErrorName)                               \
	X(cuGetErrorString)                             \
	X(cuDeviceGetCount)                             \
	X(cuDeviceGet)                                  \
	X(cuDeviceGetName)                              \
	X(cuDeviceGetUuid)                              \
	X(cuDeviceTotalMem)                             \
	X(cuDeviceGetAttribute)                         \
	X(cuDevicePrimaryCtxRetain)                     \
	X(cuDevicePrimaryCtxRelease)                    \
	X(cuCtxSetCurrent)                              \
	X(cuCtxSynchronize)                             \
	X(cuMemGetInfo)                                 \
	X(cuMemGetAllocationGranularity)                \
	X(cuMemCreate)                                  \
	X(cuMemRelease)                                 \
	X(cuMemAddressReserve)                          \
	X(cuMemAddressFree)                             \
	X(cuMemMap)                                     \
	X(cuMemUnmap)                                   \
	X(cuMemSetAccess)                               \
	X(cuMemExportToShareableHandle)                 \
	X(cuMemImportFromShareableHandle)               \
	X(cuMemAlloc)                                   \
	X(cuMemFree)                                    \
	X(cuMemHostAlloc)                               \
	X(cuMemFreeHost)                                \
	X(cuMemcpyDtoH)                                 \
	X(cuMemcpyHtoD)                                 \
	X(cuMemcpyDtoHAsync)                            \
	X(cuMemcpyHtoDAsync)                            \
	X(cuMemcpyDtoDAsync)                            \
	X(cuMemsetD8)                                   \
	X(cuMemsetD8Async)                              \
	X(cuStreamCreate)                               \
	X(cuStreamDestroy)                              \
	X(cuStreamSynchronize)                          \
	X(cuEventCreate)                                \
	X(cuEventRecord)                                \
	X(cuEventSynchronize)                           \
	X(cuEventDestroy)                               \
	X(cuModuleLoadData)                             \
	X(cuModuleGetFunction)                          \
	X(cuModuleUnload)                               \
	X(cuLaunchKernel)                               \
	X(cuCheckpointProcessLock)                      \
	X(cuCheckpointProcessCheckpoint)                \
	X(cuCheckpointProcessRestore)                   \
	X(cuCheckpointProcessUnlock)                    \
	X(cuCheckpointProcessGetState)                  \
	X(cuCheckpointProcessGetRestoreThreadId)

struct cudrv {
	void *handle;
	char path[256];
	int version;                    /* cuDriverGetVersion */
#define CUDRV_FIELD(f) __typeof__(&f) f;
	CUDRV_FUNCS(CUDRV_FIELD)
#undef CUDRV_FIELD
};

/* Loads the driver ($GPUCR_DRIVER_LIBCUDA, else libcuda.so.1 from the
 * library path) and runs cuInit(0). On failure returns -errno or a CUDA
 * error code (err.h) and says why in msg. The table lives until exit. */
int cudrv_load(const struct cudrv **ret, char *msg, size_t msglen);

/* The checkpoint API's operations; numbered as rpc.proto's DriverOpKind. */
enum cudrv_ckpt_op {
	CKPT_GET_STATE = 0,
	CKPT_GET_RESTORE_TID = 1,
	CKPT_LOCK = 2,
	CKPT_CHECKPOINT = 3,
	CKPT_RESTORE = 4,
	CKPT_UNLOCK = 5,
};

/* Runs one of them on pid (timeout_ms for CKPT_LOCK; *ret_state for
 * CKPT_GET_STATE, *ret_tid for CKPT_GET_RESTORE_TID). Returns the driver's
 * result; CUDA_ERROR_NOT_SUPPORTED where the driver lacks the call. */
CUresult cudrv_ckpt_op(const struct cudrv *d, int pid, enum cudrv_ckpt_op op, unsigned timeout_ms,
		       CUprocessState *ret_state, int *ret_tid);

/* True when the driver offers the checkpoint API (r570 or newer). */
static inline int cudrv_has_checkpoint(const struct cudrv *d)
{
	return d->cuCheckpointProcessLock && d->cuCheckpointProcessCheckpoint &&
	       d->cuCheckpointProcessRestore && d->cuCheckpointProcessUnlock &&
	       d->cuCheckpointProcessGetState;
}

#endif
