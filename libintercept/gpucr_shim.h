/* gpucr_shim.h: what gpucr's driver shim (libcuda.so.1 in gpucr's lib dir)
 * exports beyond the driver's own symbols. Applications and benchmarks
 * reach these with dlsym() on the loaded shim (or ctypes); the real driver
 * has none of them, so their presence also tells that the shim is the
 * libcuda.so.1 in use.
 *
 * The ABI only grows: structs gain fields at their end, and each call takes
 * the size the caller knows, so an old caller works with a new shim and a
 * new caller learns what an old shim filled. */
#ifndef GPUCR_SHIM_PUBLIC_H
#define GPUCR_SHIM_PUBLIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls that passed the shim's wrappers in this process, since it was
 * loaded: every call, whether the driver then accepted it or not, counted
 * on entry (after the gate). Calls made by the driver itself, by gpucr's own
 * threads through its private table, or through an entry point that
 * bypasses the shim (see procaddr.c) are not counted; a forked child starts
 * from its parent's counts. */
struct gpucr_shim_counts {
	/* cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel and
	 * their _ptsz forms: one per launch call. */
	uint64_t kernels;
	/* cuGraphLaunch and cuGraphLaunch_ptsz (the kernels inside a graph
	 * are not counted). */
	uint64_t graphs;
	/* The wrapped copies: cuMemcpy*, 1D/2D/3D/peer, sync and async, the
	 * batch calls (one per call, not per copy in the batch); _ptds/_ptsz
	 * forms included. */
	uint64_t copies;
	/* The wrapped memsets: cuMemsetD{8,16,32} and cuMemsetD2D{8,16,32},
	 * sync and async, _ptds/_ptsz forms included. */
	uint64_t memsets;
};

/* Copies the counts into *out: min(size, sizeof(struct gpucr_shim_counts))
 * bytes (pass sizeof(*out)). Returns the number of bytes filled, or -EINVAL
 * when out is NULL. Lock-free and thread-safe; each counter is read on its
 * own, so counts taken while other threads launch are each exact for some
 * moment of the call but not a snapshot of one moment. Never calls the
 * driver. */
int gpucr_shim_counts(struct gpucr_shim_counts *out, size_t size)
	__attribute__((visibility("default")));

#ifdef __cplusplus
}
#endif

#endif
