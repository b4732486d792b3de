/* Device allocation: the wrappers of the synchronous allocation calls
 * (cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemFree_v2, cuMemGetAddressRange_v2,
 * cuMemAllocManaged), the lock over gpucr's memory, deferred frees, and the
 * export / release / remap entry points for the control thread. See alloc.h.
 *
 * Lock order: alloc_lock, then the buffer table's. The driver is called
 * under alloc_lock (creating and mapping memory) but never waited on there
 * except by alloc_reap(true), which only the out-of-memory and release paths
 * use. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "buftab.h"
#include "gate.h"
#include "real.h"
#include "slab.h"
#include "vmm.h"

/* Pitch alignment of cuMemAllocPitch: what the driver hands out in practice. */
#define PITCH_ALIGN 512UL

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;

struct pending_free {
	struct buf buf;
	CUevent event;
	struct pending_free *next;
};

static struct pending_free *pending; /* under alloc_lock */
static int npending;                 /* read without the lock as a hint */

CUresult alloc_err_to_cu(int err)
{
	if (!err)
		return CUDA_SUCCESS;
	if (gpucr_err_is_cu(err))
		return gpucr_err_to_cu(err);
	switch (err) {
	case -ENOMEM:
		return CUDA_ERROR_OUT_OF_MEMORY;
	case -EINVAL:
		return CUDA_ERROR_INVALID_VALUE;
	case -EOPNOTSUPP:
		return CUDA_ERROR_NOT_SUPPORTED;
	default:
		return CUDA_ERROR_UNKNOWN;
	}
}

/* While another stream captures in global mode, "unsafe" calls such as
 * cuMemCreate or cuEventQuery would fail and invalidate that capture; the
 * driver calls gpucr makes for itself run in relaxed mode (as PyTorch's
 * allocator does). Returns the thread's mode to put back, or -1. */
static int capture_relax(void)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (!real.cuThreadExchangeStreamCaptureMode ||
	    real.cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
		return -1;
	return (int)m;
}

static void capture_restore(int mode)
{
	CUstreamCaptureMode m = (CUstreamCaptureMode)mode;

	if (mode >= 0)
		real.cuThreadExchangeStreamCaptureMode(&m);
}

/* Under alloc_lock. */
static void free_owned_locked(const struct buf *b)
{
	if (b->kind == BUF_SUB)
		slab_free(b->region, b->base, b->size);
	else if (b->kind == BUF_VMM)
		vmm_region_destroy(b->region);
}

/* Under alloc_lock. */
static size_t reap_locked(bool wait)
{
	struct pending_free **pp = &pending;
	size_t left = 0;

	while (*pp) {
		struct pending_free *p = *pp;
		CUresult r = wait ? real.cuEventSynchronize(p->event) : real.cuEventQuery(p->event);

		if (r == CUDA_ERROR_NOT_READY) {
			left++;
			pp = &p->next;
			continue;
		}
		/* Done, or the event (its context) is gone, and the work with it. */
		if (r != CUDA_SUCCESS)
			pr_debug("deferred free of %#llx: event: %s; freeing\n",
				 (unsigned long long)p->buf.base, gpucr_strerror(gpucr_err_from_cu(r)));
		real.cuEventDestroy_v2(p->event);
		free_owned_locked(&p->buf);
		*pp = p->next;
		free(p);
		__atomic_sub_fetch(&npending, 1, __ATOMIC_RELAXED);
	}
	return left;
}

size_t alloc_reap(bool wait)
{
	size_t left;
	int mode;

	if (!__atomic_load_n(&npending, __ATOMIC_RELAXED))
		return 0;
	mode = capture_relax();
	pthread_mutex_lock(&alloc_lock);
	left = reap_locked(wait);
	pthread_mutex_unlock(&alloc_lock);
	capture_restore(mode);
	return left;
}

void alloc_defer_free(const struct buf *b, CUevent event)
{
	struct pending_free *p = malloc(sizeof(*p));

	pthread_mutex_lock(&alloc_lock);
	if (!p) {
		/* Cannot remember it: wait for the stream here instead. */
		real.cuEventSynchronize(event);
		real.cuEventDestroy_v2(event);
		free_owned_locked(b);
	} else {
		p->buf = *b;
		p->event = event;
		p->next = pending;
		pending = p;
		__atomic_add_fetch(&npending, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&alloc_lock);
}

static int alloc_try(int device, size_t size, CUdeviceptr *ret_ptr, struct region **ret_region,
		     enum buf_kind *ret_kind)
{
	int err;

	if (size < ALLOC_SUB_MAX) {
		*ret_kind = BUF_SUB;
		return slab_alloc(device, size, ret_ptr, ret_region);
	}
	*ret_kind = BUF_VMM;
	err = vmm_region_create(device, size, ret_region);
	if (!err)
		*ret_ptr = (*ret_region)->va;
	return err;
}

int alloc_owned(int device, size_t size, unsigned int flags, CUdeviceptr *ret_ptr)
{
	struct region *region = NULL;
	enum buf_kind kind;
	CUdeviceptr ptr = 0;
	struct buf b;
	int err, mode;

	if (!size)
		return -EINVAL;
	mode = capture_relax();
	pthread_mutex_lock(&alloc_lock);
	if (!vmm_granularity(device)) {
		err = -EOPNOTSUPP;
		goto out;
	}
	if (pending)
		reap_locked(false);
	err = alloc_try(device, size, &ptr, &region, &kind);
	if (err == gpucr_err_from_cu(CUDA_ERROR_OUT_OF_MEMORY)) {
		/* Memory that frees in stream order may be what is missing. */
		reap_locked(true);
		slab_trim();
		err = alloc_try(device, size, &ptr, &region, &kind);
	}
	if (err) {
		if (err != gpucr_err_from_cu(CUDA_ERROR_OUT_OF_MEMORY) && err != -ENOMEM) {
			vmm_disable(device, err);
			err = -EOPNOTSUPP;
		}
		goto out;
	}
	b = (struct buf){
		.base = ptr,
		.size = size,
		.id = buftab_new_id(),
		.region = region,
		.device = device,
		.kind = kind,
		.flags = flags,
	};
	err = buftab_insert(&b);
	if (err) {
		pr_debug("buffer table: %#llx (%zu bytes): %s\n", (unsigned long long)ptr, size,
			 gpucr_strerror(err));
		free_owned_locked(&b);
		goto out;
	}
	*ret_ptr = ptr;
out:
	pthread_mutex_unlock(&alloc_lock);
	capture_restore(mode);
	return err;
}

void alloc_free_owned(const struct buf *b)
{
	int mode = capture_relax();

	pthread_mutex_lock(&alloc_lock);
	free_owned_locked(b);
	pthread_mutex_unlock(&alloc_lock);
	capture_restore(mode);
}

/* Records memory the driver allocated; an allocation works without it. */
static void record_driver(CUdeviceptr ptr, size_t size, int device, enum buf_kind kind,
			  unsigned int flags)
{
	struct buf b = {
		.base = ptr, .size = size, .id = buftab_new_id(), .device = device,
		.kind = kind, .flags = flags,
	};
	int err = buftab_insert(&b);

	if (err)
		pr_debug("buffer table: driver memory %#llx (%zu bytes): %s\n",
			 (unsigned long long)ptr, size, gpucr_strerror(err));
}

/* ---- wrappers ----------------------------------------------------------- */

/* Common to cuMemAlloc_v2 and cuMemAllocPitch_v2: gpucr's memory, or the
 * driver's where gpucr cannot have VMM memory. */
static CUresult alloc_sync(CUdeviceptr *dptr, size_t bytesize)
{
	CUdeviceptr p = 0;
	CUdevice dev;
	CUresult r;
	int err;

	r = real.cuCtxGetDevice(&dev);
	if (r != CUDA_SUCCESS)
		return r;
	err = alloc_owned(dev, bytesize, 0, &p);
	if (!err) {
		*dptr = p;
		return CUDA_SUCCESS;
	}
	if (err != -EOPNOTSUPP)
		return alloc_err_to_cu(err);
	r = real.cuMemAlloc_v2(&p, bytesize);
	if (r == CUDA_SUCCESS) {
		record_driver(p, bytesize, dev, BUF_DRIVER, 0);
		*dptr = p;
	}
	return r;
}

SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;

	real_ensure();
	if (!real.cuMemAlloc_v2 || !real.cuCtxGetDevice)
		return real_absent("cuMemAlloc_v2");
	/* The driver checks the arguments (and its context) as it always does. */
	if (!dptr || !bytesize)
		return real.cuMemAlloc_v2(dptr, bytesize);
	return alloc_sync(dptr, bytesize);
}

SHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
					size_t Height, unsigned int ElementSizeBytes)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	size_t pitch;
	CUresult r;

	real_ensure();
	if (!real.cuMemAllocPitch_v2 || !real.cuCtxGetDevice)
		return real_absent("cuMemAllocPitch_v2");
	if (!dptr || !pPitch || !WidthInBytes || !Height ||
	    (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) ||
	    WidthInBytes > SIZE_MAX - PITCH_ALIGN)
		return real.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	pitch = SHIM_ALIGN_UP(WidthInBytes, PITCH_ALIGN);
	if (Height > SIZE_MAX / pitch)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = alloc_sync(dptr, pitch * Height);
	if (r == CUDA_SUCCESS)
		*pPitch = pitch;
	return r;
}

SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	struct buf b;
	CUresult r;

	real_ensure();
	if (!real.cuMemFree_v2)
		return real_absent("cuMemFree_v2");
	alloc_reap(false);
	if (!dptr || buftab_lookup(dptr, &b) < 0)
		return real.cuMemFree_v2(dptr);
	if (!buf_owned(&b)) {
		/* The application's VMM memory (BUF_APP) goes with its cuMemUnmap,
		 * whatever the driver says to a cuMemFree of it. */
		r = real.cuMemFree_v2(dptr);
		if (r == CUDA_SUCCESS && b.base == dptr && !buf_held(&b))
			buftab_remove(dptr, NULL);
		return r;
	}
	if (b.base != dptr)
		return CUDA_ERROR_INVALID_VALUE;
	/* cuMemFree waits for the device: work queued before it may still use
	 * the memory, which is about to be reused or unmapped. */
	if (real.cuCtxSynchronize)
		real.cuCtxSynchronize();
	if (buftab_remove(dptr, &b) < 0)
		return CUDA_ERROR_INVALID_VALUE; /* another thread freed it meanwhile */
	alloc_free_owned(&b);
	return CUDA_SUCCESS;
}

SHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	SHIM_KEEP_ERRNO;
	struct buf b;

	gate_pass();
	real_ensure();
	if (!real.cuMemGetAddressRange_v2)
		return real_absent("cuMemGetAddressRange_v2");
	if (buftab_lookup(dptr, &b) < 0 || !buf_owned(&b))
		return real.cuMemGetAddressRange_v2(pbase, psize, dptr);
	if (pbase)
		*pbase = b.base;
	if (psize)
		*psize = b.size;
	return CUDA_SUCCESS;
}

SHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	CUresult r;

	real_ensure();
	if (!real.cuMemAllocManaged)
		return real_absent("cuMemAllocManaged");
	r = real.cuMemAllocManaged(dptr, bytesize, flags);
	if (r == CUDA_SUCCESS && dptr && bytesize)
		record_driver(*dptr, bytesize, -1, BUF_MANAGED, 0);
	return r;
}

/* ---- the application's own VMM memory (appvmm.c) ------------------------- */

bool alloc_vmm_usable(int device)
{
	bool ok;

	pthread_mutex_lock(&alloc_lock);
	ok = vmm_granularity(device) != 0;
	pthread_mutex_unlock(&alloc_lock);
	return ok;
}

int alloc_adopt_app(int device, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
		    struct region **ret_region)
{
	struct region *r = NULL;
	struct buf b;
	int err;

	pthread_mutex_lock(&alloc_lock);
	err = vmm_region_adopt(device, va, size, h, &r);
	if (err)
		goto out;
	b = (struct buf){
		.base = va, .size = size, .id = buftab_new_id(), .region = r, .device = device,
		.kind = BUF_APP,
	};
	err = buftab_insert(&b);
	if (err) {
		vmm_region_disown(r);
		goto out;
	}
	*ret_region = r;
out:
	pthread_mutex_unlock(&alloc_lock);
	return err;
}

CUmemGenericAllocationHandle alloc_disown_app(struct region *r)
{
	CUmemGenericAllocationHandle h;

	pthread_mutex_lock(&alloc_lock);
	buftab_remove(r->va, NULL);
	h = vmm_region_disown(r);
	pthread_mutex_unlock(&alloc_lock);
	return h;
}

CUmemGenericAllocationHandle alloc_app_handle(const struct region *r)
{
	CUmemGenericAllocationHandle h;

	pthread_mutex_lock(&alloc_lock);
	h = r->chunks[0].handle;
	pthread_mutex_unlock(&alloc_lock);
	return h;
}

/* ---- control thread ----------------------------------------------------- */

size_t alloc_chunk_count(size_t *ret_mapped)
{
	size_t n;

	pthread_mutex_lock(&alloc_lock);
	n = vmm_chunk_count(ret_mapped);
	pthread_mutex_unlock(&alloc_lock);
	return n;
}

int alloc_export_all(struct alloc_chunk_fd **ret_chunks, size_t *ret_count)
{
	struct alloc_chunk_fd *v;
	size_t cap, n = 0;
	int err;

	pthread_mutex_lock(&alloc_lock);
	reap_locked(false);
	slab_trim(); /* empty slabs are not worth saving */
	cap = vmm_chunk_count(NULL);
	v = malloc((cap ? cap : 1) * sizeof(*v));
	if (!v) {
		err = -ENOMEM;
		goto out;
	}
	err = vmm_export_all(v, cap, &n);
	if (err) {
		free(v);
		goto out;
	}
	*ret_chunks = v;
	*ret_count = n;
out:
	pthread_mutex_unlock(&alloc_lock);
	return err;
}

int alloc_release_all(void)
{
	int err;

	pthread_mutex_lock(&alloc_lock);
	reap_locked(true);
	slab_trim();
	err = vmm_release_all();
	pthread_mutex_unlock(&alloc_lock);
	return err;
}

int alloc_remap_all(const struct alloc_chunk_fd *chunks, size_t count)
{
	int err;

	pthread_mutex_lock(&alloc_lock);
	err = vmm_remap_all(chunks, count);
	pthread_mutex_unlock(&alloc_lock);
	return err;
}

int alloc_collect(struct alloc_changes *ret)
{
	int err;

	memset(ret, 0, sizeof(*ret));
	pthread_mutex_lock(&alloc_lock);
	reap_locked(false);
	err = vmm_collect(ret);
	pthread_mutex_unlock(&alloc_lock);
	return err;
}

void alloc_changes_free(struct alloc_changes *c)
{
	size_t i;

	if (!c)
		return;
	for (i = 0; i < c->nadded; i++)
		if (c->added[i].fd >= 0)
			close(c->added[i].fd);
	free(c->added);
	free(c->freed);
	memset(c, 0, sizeof(*c));
}

void alloc_forget_reports(void)
{
	pthread_mutex_lock(&alloc_lock);
	vmm_forget_reports();
	pthread_mutex_unlock(&alloc_lock);
}
