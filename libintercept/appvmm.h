/* The application's own VMM memory: cuMemCreate, cuMemMap and the rest of
 * the driver's virtual memory management calls that the application (PyTorch
 * with expandable_segments:True, NCCL) makes itself, and what gpucr does
 * with them when GPUCR_APP_VMM=1.
 *
 * Off (the default until it has been measured on a GPU), every wrapper
 * forwards its call unchanged after the gate's load and branch, and that
 * memory is carried by the driver's own checkpoint, which moves it to host
 * memory and back (1.7 s for ~3 GB of PyTorch's segments on an H200, against
 * 0.4 s for a process that holds no device memory).
 *
 * On, device-located PINNED allocations are tracked:
 *  - cuMemCreate asks for a POSIX fd handle type besides the application's
 *    (where the device can export one), and hands out a virtual handle: a
 *    value of APPVMM_TAG | counter, which no driver hands out (its handles
 *    are small indices or user-space addresses, below 2^57) and which is
 *    never reused. Every wrapper that takes a handle translates a virtual
 *    one to the driver's; a value that is not one of gpucr's passes through
 *    untouched (multicast objects, imported handles, memory created before
 *    or without tracking). cuMemGetAllocationPropertiesFromHandle reports the
 *    handle types the application asked for, and export is refused for a
 *    type it did not ask for, as the driver would;
 *  - a tracked handle mapped exactly once, at offset 0 over its whole size,
 *    becomes a buffer of gpucr's (BUF_APP in the buffer table, an adopted
 *    region in vmm.h): its fd goes to gpucrd, a dump releases it and a
 *    restore maps it back at the same address with the access the
 *    application had granted; the virtual handle then stands for the handle
 *    imported at the remap, so the application's cuMemUnmap, cuMemRelease
 *    and cuMemMap with its old value keep working;
 *  - everything else stays with the driver's checkpoint as before, said in
 *    a debug line: a handle mapped in part, or more than once; one the
 *    application exported (the memory is shared with someone gpucr does not
 *    know), bound to a multicast object or mapped into a sparse array (all
 *    three for good); one created without an exportable type; memory
 *    imported from another process. Correctness never depends on tracking.
 *
 * References: gpucr holds one reference on the driver's handle for as long
 * as the application holds one (cuMemCreate, cuMemRetainAllocationHandle,
 * minus cuMemRelease) or a mapping of it lives, and releases it after the
 * last of both, so that memory lives exactly as long as it would without
 * gpucr (the application may release its handle and keep the mapping).
 *
 * Thread-safety: one mutex over the tables, held across the driver calls it
 * guards (lock order: this one, then alloc's, then the buffer table's). The
 * wrappers are counted by the gate (GATE_COUNTED): a dump's release and
 * remap never run beside one. */
#ifndef GPUCR_APPVMM_H
#define GPUCR_APPVMM_H

#include "shim.h"

/* Virtual handle values: the tag in the top 16 bits, a counter below. */
#define APPVMM_TAG 0xc9c0000000000000ULL
#define APPVMM_TAG_MASK 0xffff000000000000ULL

static inline bool appvmm_is_virtual(CUmemGenericAllocationHandle h)
{
	return (h & APPVMM_TAG_MASK) == APPVMM_TAG;
}

/* Whether GPUCR_APP_VMM turned tracking on (read once). */
bool appvmm_enabled(void) SHIM_HIDDEN;

/* The driver's handle that virtual handle vh stands for now: 0, or -ENOENT
 * when vh is not a live one of gpucr's. For tests and logs. */
int appvmm_real_handle(CUmemGenericAllocationHandle vh, CUmemGenericAllocationHandle *ret_real) SHIM_HIDDEN;

/* How many virtual handles are live, and (ret_adopted, may be NULL) how
 * many of them are adopted as gpucr's buffers now. */
size_t appvmm_count(size_t *ret_adopted) SHIM_HIDDEN;

#endif
