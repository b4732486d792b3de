/* The real driver: found by path, loaded once, and the entry points of it that
 * gpucr itself calls.
 *
 * Loading happens on the first call into the shim from any thread (never at
 * load time, so an application that links CUDA but never uses it pays
 * nothing, and a test may set GPUCR_REAL_LIBCUDA before its first call).
 * Where it looks: $GPUCR_REAL_LIBCUDA if set (and then nowhere else), or the
 * standard driver locations; a file that is the shim itself (same device and
 * inode, or the same loaded object) is refused. If no driver loads, every
 * entry point answers CUDA_ERROR_NO_DEVICE and one message says where the
 * shim looked. */
#ifndef GPUCR_REAL_H
#define GPUCR_REAL_H

#include "shim.h"
#include "fwd_gen.h"

/* Entry points gpucr calls itself, by their exported names. A member is NULL
 * when the loaded driver lacks it (or none loaded): callers check optional
 * ones; required ones go through real_absent(). */
#define REAL_FNS(X)                          \
	X(cuGetProcAddress)                  \
	X(cuGetProcAddress_v2)               \
	X(cuGetExportTable)                  \
	X(cuInit)                            \
	X(cuDeviceGetCount)                  \
	X(cuDeviceGetUuid_v2)                \
	X(cuDevicePrimaryCtxGetState)        \
	X(cuDevicePrimaryCtxRetain)          \
	X(cuDevicePrimaryCtxRelease_v2)      \
	X(cuCtxPushCurrent_v2)               \
	X(cuCtxPopCurrent_v2)                \
	X(cuCtxGetDevice)                    \
	X(cuCtxSynchronize)                  \
	X(cuDeviceGetAttribute)              \
	X(cuDeviceGetMemPool)                \
	X(cuDeviceGetDefaultMemPool)         \
	X(cuMemGetAllocationGranularity)     \
	X(cuMemAddressReserve)               \
	X(cuMemAddressFree)                  \
	X(cuMemCreate)                       \
	X(cuMemRelease)                      \
	X(cuMemMap)                          \
	X(cuMemUnmap)                        \
	X(cuMemSetAccess)                    \
	X(cuMemGetAccess)                    \
	X(cuMemExportToShareableHandle)      \
	X(cuMemImportFromShareableHandle)    \
	X(cuMemAlloc_v2)                     \
	X(cuMemAllocPitch_v2)                \
	X(cuMemFree_v2)                      \
	X(cuMemGetAddressRange_v2)           \
	X(cuMemAllocManaged)                 \
	X(cuMemAllocAsync)                   \
	X(cuMemAllocAsync_ptsz)              \
	X(cuMemAllocFromPoolAsync)           \
	X(cuMemAllocFromPoolAsync_ptsz)      \
	X(cuMemFreeAsync)                    \
	X(cuMemFreeAsync_ptsz)               \
	X(cuPointerGetAttribute)             \
	X(cuPointerGetAttributes)            \
	X(cuEventCreate)                     \
	X(cuEventRecord)                     \
	X(cuEventRecord_ptsz)                \
	X(cuEventQuery)                      \
	X(cuEventSynchronize)                \
	X(cuEventDestroy_v2)                 \
	X(cuStreamIsCapturing)               \
	X(cuStreamIsCapturing_ptsz)          \
	X(cuStreamGetDevice)                 \
	X(cuStreamGetDevice_ptsz)            \
	X(cuThreadExchangeStreamCaptureMode) \
	X(cuGraphGetNodes)                   \
	X(cuGraphNodeGetType)                \
	X(cuGraphKernelNodeGetParams_v2)     \
	X(cuGraphMemcpyNodeGetParams)        \
	X(cuGraphMemsetNodeGetParams)        \
	X(cuGraphChildGraphNodeGetGraph)     \
	X(cuFuncGetName)                     \
	X(cuKernelGetName)

struct real_driver {
	void *handle;     /* dlopen handle; NULL when no driver was found */
	const char *path; /* the file it was loaded from */
#define REAL_MEMBER(name) __typeof__(&name) name;
	REAL_FNS(REAL_MEMBER)
#undef REAL_MEMBER
};

/* Filled once by real_ensure(); read-only afterwards. */
extern struct real_driver real SHIM_HIDDEN;
/* real_wrapped[i]: the real driver's own function for wrap_names[i], or NULL.
 * cuGetProcAddress compares what the driver hands out against these. */
extern void *real_wrapped[WRAP_COUNT] SHIM_HIDDEN;

extern int real_loaded SHIM_HIDDEN;
void real_load_once(void) SHIM_HIDDEN;

/* Loads the driver if this is the first call of the process (any thread;
 * others wait for it). Afterwards `real` is complete. */
static inline void real_ensure(void)
{
	if (__builtin_expect(!__atomic_load_n(&real_loaded, __ATOMIC_ACQUIRE), 0))
		real_load_once();
}

/* The real driver's function for name, one of wrap_names (real_wrapped),
 * or NULL when the driver lacks it. Loads the driver first. */
void *real_wrapped_fn(const char *name) SHIM_HIDDEN;

/* The same, remembered in *cache (a wrapper's static): one load once found. */
static inline void *real_wrapped_cached(void **cache, const char *name)
{
	void *fn = __atomic_load_n(cache, __ATOMIC_ACQUIRE);

	if (__builtin_expect(!fn, 0)) {
		fn = real_wrapped_fn(name);
		__atomic_store_n(cache, fn, __ATOMIC_RELEASE);
	}
	return fn;
}

/* Calls the real driver's function for the wrapped name (an identifier),
 * of type fntype, with args (in parentheses); real_absent(name) when the
 * driver lacks it. An expression of type CUresult. */
#define REAL_WRAPPED_CALL(name, fntype, args)                                      \
	({                                                                         \
		static void *real_fn_;                                             \
		fntype fn_ = (fntype)real_wrapped_cached(&real_fn_, #name);        \
		fn_ ? fn_ args : real_absent(#name);                               \
	})

/* What a wrapper returns when the driver entry point `name` it needs is
 * missing: CUDA_ERROR_NO_DEVICE without a driver, else CUDA_ERROR_NOT_FOUND
 * (and a message naming the symbol, once per process). */
CUresult real_absent(const char *name) SHIM_HIDDEN;

#endif
