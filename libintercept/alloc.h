/* Device allocation through exportable VMM memory, and what the rest of gpucr
 * does with that memory: export it, release it, map it back.
 *
 * The application's cuMemAlloc* calls (alloc.c, allocasync.c) become VMM
 * regions (vmm.h); requests below ALLOC_SUB_MAX are carved out of 2 MiB
 * slabs with cudaMalloc's 256-byte alignment (slab.h). Where VMM memory
 * with POSIX fd handles cannot be had (device, driver or GPUCR_VMM=0), the
 * driver's own cuMemAlloc serves the request and the buffer is left to the
 * driver's checkpoint: correctness never depends on gpucr owning memory.
 *
 * Stream-ordered allocation (cuMemAllocAsync and the device's default pool)
 * allocates at once: the memory is valid earlier than the stream needs it,
 * which no program can tell. A stream-ordered free cannot take effect at
 * once: an event is recorded on the stream and the memory is freed once the
 * event has completed, checked on later allocation calls, on release, and
 * when an allocation runs out of memory (which then waits for them). The
 * event is polled, never a host callback: host functions may not call the
 * driver. Allocations from pools the application created, and any during
 * stream capture, go to the driver untouched (a graph owns those), as does
 * managed memory, which is recorded (buftab.h) so that a dump can refuse it.
 *
 * Thread-safety: all functions are. The ones for the control thread below
 * expect the application to be quiesced (no queued work touching gpucr's
 * memory, no allocation calls racing them): the gate's job. */
#ifndef GPUCR_ALLOC_H
#define GPUCR_ALLOC_H

#include "shim.h"

/* Requests of fewer bytes than this are sub-allocated from slabs. */
#define ALLOC_SUB_MAX (1UL << 20)
/* Alignment of every allocation gpucr hands out (cudaMalloc's). */
#define ALLOC_ALIGN 256UL

/* ---- for the shim's wrappers ------------------------------------------ */

/* A new allocation of size bytes on device, owned by gpucr and entered in
 * the buffer table with flags (BUF_F_*). -EOPNOTSUPP when VMM memory cannot
 * be used there (the caller then asks the driver), a driver error
 * (gpucr_err_from_cu) or -ENOMEM otherwise. */
int alloc_owned(int device, size_t size, unsigned int flags, CUdeviceptr *ret_ptr) SHIM_HIDDEN;

struct buf;
/* Gives the memory of b back (b already removed from the buffer table). The
 * caller has made sure that no queued work still uses it. */
void alloc_free_owned(const struct buf *b) SHIM_HIDDEN;

/* Frees b once event has completed (it is recorded on the stream that freed
 * it; alloc takes the event over and destroys it). */
void alloc_defer_free(const struct buf *b, CUevent event) SHIM_HIDDEN;

/* Frees whatever deferred frees have completed; with wait, first waits for
 * all of them. Returns how many remain pending. */
size_t alloc_reap(bool wait) SHIM_HIDDEN;

/* The application's own VMM memory (appvmm.h). alloc_adopt_app() makes the
 * application's mapping of h at [va, va + size) on device a buffer of
 * gpucr's (BUF_APP, entered in the buffer table; see vmm_region_adopt());
 * -EOPNOTSUPP when gpucr cannot use VMM memory there, -EEXIST, -ENOMEM.
 * alloc_disown_app() takes it out again (before the application unmaps it,
 * or when it stops qualifying) and returns the handle holding its memory
 * now, which the caller owns again; alloc_app_handle() says which that is
 * (it changes when the memory is remapped at restore; 0 while released). */
struct region;
/* Whether gpucr can use exportable VMM memory on device (vmm_granularity). */
bool alloc_vmm_usable(int device) SHIM_HIDDEN;
int alloc_adopt_app(int device, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
		    struct region **ret_region) SHIM_HIDDEN;
CUmemGenericAllocationHandle alloc_disown_app(struct region *r) SHIM_HIDDEN;
CUmemGenericAllocationHandle alloc_app_handle(const struct region *r) SHIM_HIDDEN;

/* The driver result that stands for a gpucr error code. */
CUresult alloc_err_to_cu(int err) SHIM_HIDDEN;

/* ---- for the control thread (dump / restore) ------------------------------ */

/* One physical chunk of gpucr-owned device memory: where it is mapped, and a
 * POSIX fd for its physical memory. For alloc_remap_all() only va, size and
 * fd matter. */
struct alloc_chunk_fd {
	CUdeviceptr va;
	size_t size;
	int device;
	int fd;
	bool slab;               /* the chunk is a slab of small allocations */
	bool app;                /* the application's own VMM mapping (appvmm.h) */
	CUdeviceptr reserve_va;  /* the VA reservation (region) holding it */
	size_t reserve_size;
};

/* Exports every mapped chunk as an fd (O_CLOEXEC). On success *ret_chunks is a
 * malloc'd array of *ret_count records in address order; the caller closes the
 * fds and frees the array. The chunks stay mapped; the fds keep the physical
 * memory alive wherever they are sent (SCM_RIGHTS). Completed deferred frees
 * are reaped first. */
int alloc_export_all(struct alloc_chunk_fd **ret_chunks, size_t *ret_count) SHIM_HIDDEN;

/* Unmaps and releases the physical memory of every chunk, keeping every VA
 * reservation, so the driver's checkpoint has no device memory of gpucr's to
 * save. Waits for pending deferred frees first. Memory that nothing else
 * holds (no exported fd alive) is gone. Stops at the first failure and
 * returns it; alloc_remap_all() then puts back what was released. */
int alloc_release_all(void) SHIM_HIDDEN;

/* Maps every released chunk back at its old address: the fd whose va (and
 * size) match is imported (fds stay the caller's: not closed, not kept), or
 * the old handle is reused where releasing it had failed. Access is granted
 * to the owning device as before. A chunk imported from an fd counts as
 * reported (whoever gave the fd knows it). Returns 0 when every chunk is mapped
 * again, -ENOENT when some had no fd (the others are mapped), -EINVAL for a
 * size mismatch, or the first driver error (stopping there). */
int alloc_remap_all(const struct alloc_chunk_fd *chunks, size_t count) SHIM_HIDDEN;

/* How many chunks gpucr owns, and (ret_mapped, may be NULL) how many are
 * mapped now. */
size_t alloc_chunk_count(size_t *ret_mapped) SHIM_HIDDEN;

/* What changed since the daemon was last told: chunks created (exported,
 * fds O_CLOEXEC, in address order) and the addresses of reported chunks
 * destroyed since, in the order they went. Both arrays are malloc'd (NULL
 * when empty) and the caller's, with the fds; alloc_changes_free() closes
 * the fds not yet taken (set to -1 when taken) and frees the arrays. */
struct alloc_changes {
	struct alloc_chunk_fd *added;
	size_t nadded;
	CUdeviceptr *freed;
	size_t nfreed;
};

/* Exports the mapped chunks not yet reported and marks them reported; takes
 * the list of reported chunks destroyed since the last call. Chunks created
 * or destroyed later ring vmm_changed() again. */
int alloc_collect(struct alloc_changes *ret) SHIM_HIDDEN;
void alloc_changes_free(struct alloc_changes *c) SHIM_HIDDEN;
/* Forgets what was reported (a new daemon connection starts from nothing):
 * the next alloc_collect() reports every mapped chunk and no frees. */
void alloc_forget_reports(void) SHIM_HIDDEN;

#endif
