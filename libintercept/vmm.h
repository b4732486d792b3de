/* Device memory that gpucr owns: regions of exportable VMM memory.
 *
 * A region is one VA reservation (cuMemAddressReserve) with physical chunks
 * (cuMemCreate, PINNED on the device, POSIX fd handles) mapped into it and
 * made read-write for the owning device. It backs either one large
 * allocation or a slab of small ones. Regions can give up their physical
 * memory while keeping the reservation (release) and take it back from
 * exported fds at the same addresses (remap).
 *
 * An adopted region (vmm_region_adopt) is the application's own: one
 * exportable handle it created and mapped itself, in a reservation of its
 * own (appvmm.h). It is exported, released and remapped like gpucr's, but
 * gpucr neither created nor unreserves it, and at remap it gets back the
 * access the application had granted (read at release), not gpucr's.
 *
 * Every function here is called with alloc's lock held (alloc.c); errors are
 * gpucr error codes (-errno or gpucr_err_from_cu()). */
#ifndef GPUCR_VMM_H
#define GPUCR_VMM_H

#include "shim.h"

#define VMM_MAX_DEVICES 64

struct slab;

struct chunk {
	CUmemGenericAllocationHandle handle; /* 0 while released */
	size_t off;                          /* from the region's va */
	size_t size;
	bool mapped;
	bool reported;                       /* the daemon has been told of it (vmm_collect) */
};

struct region {
	CUdeviceptr va;
	size_t size;          /* reserved = mapped bytes, a multiple of the granularity */
	int device;
	unsigned int nchunks;
	struct chunk *chunks;
	struct slab *slab;    /* set when the region is a slab (slab.c) */
	bool app;             /* adopted: the application's mapping (vmm_region_adopt) */
	unsigned int naccess; /* app: the access to grant at remap, read at release */
	CUmemAccessDesc *access;
	struct region *prev, *next;
};

/* The allocation granularity gpucr uses on device (the driver's recommended
 * one), or 0 when VMM memory with POSIX fd handles cannot be used there:
 * the device says so, GPUCR_VMM=0, or an earlier attempt failed. */
size_t vmm_granularity(int device) SHIM_HIDDEN;

/* Stops using VMM memory on device after err (a failure other than running
 * out of memory), with one message saying why. */
void vmm_disable(int device, int err) SHIM_HIDDEN;

/* A new region of at least size bytes on device (rounded up to the
 * granularity), mapped read-write for it. */
int vmm_region_create(int device, size_t size, struct region **ret_region) SHIM_HIDDEN;

/* Unmaps, releases and unreserves r, and frees it. Accepts NULL. The caller
 * has made sure no queued work still uses it. Not for adopted regions. */
void vmm_region_destroy(struct region *r) SHIM_HIDDEN;

/* A region for the application's mapping of handle h (exportable as a POSIX
 * fd, mapped by the application at [va, va + size) and still its own) on
 * device: from now on released at a dump and remapped at restore. The
 * region takes over gpucr's reference on h (appvmm.c's), until
 * vmm_region_disown(). -EOPNOTSUPP when gpucr cannot use VMM memory on
 * device, -ENOMEM. */
int vmm_region_adopt(int device, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
		     struct region **ret_region) SHIM_HIDDEN;

/* Forgets adopted region r (the daemon hears that it was freed) and frees
 * it, touching neither the mapping nor the handle, and returns the handle
 * that holds its memory now: the one adopted, or the one imported at the
 * last remap; 0 when released (the caller then has none). */
CUmemGenericAllocationHandle vmm_region_disown(struct region *r) SHIM_HIDDEN;

/* How many chunks all regions hold, and how many of them are mapped. */
size_t vmm_chunk_count(size_t *ret_mapped) SHIM_HIDDEN;

/* One record per chunk, for alloc_export_all(); see alloc.h. */
struct alloc_chunk_fd;
int vmm_export_all(struct alloc_chunk_fd *out, size_t cap, size_t *ret_n) SHIM_HIDDEN;
int vmm_release_all(void) SHIM_HIDDEN;
int vmm_remap_all(const struct alloc_chunk_fd *chunks, size_t count) SHIM_HIDDEN;
/* See alloc_collect() and alloc_forget_reports(). */
struct alloc_changes;
int vmm_collect(struct alloc_changes *ret) SHIM_HIDDEN;
void vmm_forget_reports(void) SHIM_HIDDEN;


#endif
