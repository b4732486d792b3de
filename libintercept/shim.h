/* What every file of the shim shares: the driver header as the driver itself
 * sees it, export and errno helpers, and the shim's logging.
 *
 * The shim is compiled with __CUDA_API_VERSION_INTERNAL so that cuda.h
 * declares every exported name as itself (cuMemAlloc_v2, cuMemAllocAsync_ptsz,
 * the 4-argument cuGetProcAddress) instead of mapping old names onto new ones:
 * each wrapper is then defined under exactly the symbol it replaces. */
#ifndef GPUCR_SHIM_H
#define GPUCR_SHIM_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef __CUDA_API_VERSION_INTERNAL
#error "libintercept is compiled with -D__CUDA_API_VERSION_INTERNAL (see build.mk)"
#endif
#include <cuda.h>

#include "err.h"
#include "log.h"

/* Marks a definition that replaces a driver symbol, or one of gpucr's own
 * entry points (gpucr-exports.list, gpucr_shim.h). Everything else in the
 * shim is hidden (-fvisibility=hidden); the version script then keeps
 * exactly the driver's names and gpucr's own. */
#define SHIM_EXPORT __attribute__((visibility("default")))
#define SHIM_HIDDEN __attribute__((visibility("hidden")))

static inline void shim_errno_restore(const int *saved)
{
	errno = *saved;
}

/* First statement of every wrapper: the application's errno comes back
 * unchanged however the wrapper returns. */
#define SHIM_KEEP_ERRNO \
	__attribute__((cleanup(shim_errno_restore))) const int shim_saved_errno_ = errno

#define SHIM_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

#endif
