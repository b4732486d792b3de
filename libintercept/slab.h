/* Small allocations carved out of slabs: VMM regions of 2 MiB (or the
 * device's granularity, if larger), handed out in 256-byte units, first fit
 * from where the last allocation ended. One empty slab per device is kept
 * for the next request; others are destroyed when they empty.
 * Called with alloc's lock held; errors as vmm.h. */
#ifndef GPUCR_SLAB_H
#define GPUCR_SLAB_H

#include "vmm.h"

#define SLAB_SIZE (2UL << 20)

/* size bytes (0 < size < ALLOC_SUB_MAX) on device, at *ret_ptr, inside the
 * slab region *ret_region. */
int slab_alloc(int device, size_t size, CUdeviceptr *ret_ptr, struct region **ret_region) SHIM_HIDDEN;

/* Returns [ptr, ptr + size) to the slab region r. */
void slab_free(struct region *r, CUdeviceptr ptr, size_t size) SHIM_HIDDEN;

/* Destroys every empty slab (to make room when memory runs out). */
void slab_trim(void) SHIM_HIDDEN;

#endif
