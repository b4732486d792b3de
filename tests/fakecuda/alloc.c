/* fakecuda alloc: the classic allocators (cuMemAlloc, cuMemAllocPitch,
 * cuMemAllocAsync, cuMemAllocManaged and their frees), memory info, and the
 * pointer queries (cuMemGetAddressRange, cuPointerGetAttribute(s)) over all
 * device memory.  Each allocation is its own memfd mapping, "fakecuda-phys"
 * (or "fakecuda-managed"), so that it shows as device memory held in
 * /proc/PID/maps; the fd itself is closed at once. */
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static CUresult alloc_block(CUdeviceptr *dptr, size_t bytes, enum fk_kind kind)
{
	struct CUctx_st *c = fk_ctx_current();
	struct fk_region r = { 0 };
	size_t size = FK_ALIGN_UP(bytes, (size_t)sysconf(_SC_PAGESIZE));
	struct fk_device *d;
	CUresult rc = CUDA_SUCCESS;
	void *va;
	int fd;

	if (!dptr || bytes == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	d = &fk.dev[c->dev];
	fk_lock_take();
	if (kind != FK_MANAGED && d->used + size > d->total)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else if (kind != FK_MANAGED)
		d->used += size;  /* claimed now, so racing allocations see it */
	fk_lock_drop();
	if (rc != CUDA_SUCCESS)
		return rc;

	fd = memfd_create(kind == FK_MANAGED ? FAKECUDA_MANAGED_NAME : FAKECUDA_PHYS_NAME, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_fd;
	}
	va = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (va == MAP_FAILED) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto fail_fd;
	}
	close(fd);
	r.base = (uintptr_t)va;
	r.size = size;
	r.kind = kind;
	r.prot = PROT_READ | PROT_WRITE;
	r.req = bytes;
	r.dev = c->dev;
	r.ctx = c;
	r.id = fk_next_id();
	fk_lock_take();
	if (fk_tab_insert(&fk_regions, &r) < 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	fk_lock_drop();
	if (rc != CUDA_SUCCESS) {
		munmap(va, size);
		goto fail;
	}
	*dptr = (CUdeviceptr)r.base;
	return CUDA_SUCCESS;

fail_fd:
	if (fd >= 0)
		close(fd);
fail:
	if (kind != FK_MANAGED) {
		fk_lock_take();
		d->used -= size;
		fk_lock_drop();
	}
	return rc;
}

static CUresult free_block(CUdeviceptr dptr)
{
	struct fk_region r;
	ssize_t i;

	fk_lock_take();
	i = fk_tab_find(&fk_regions, (uintptr_t)dptr);
	if (i < 0 || FK_TAB_AT(&fk_regions, i, struct fk_region)->base != dptr ||
	    FK_TAB_AT(&fk_regions, i, struct fk_region)->kind == FK_VMM) {
		fk_lock_drop();
		return CUDA_ERROR_INVALID_VALUE;
	}
	r = *FK_TAB_AT(&fk_regions, i, struct fk_region);
	fk_tab_remove(&fk_regions, (size_t)i);
	if (r.kind != FK_MANAGED)
		fk.dev[r.dev].used -= r.size;
	fk_lock_drop();
	munmap((void *)r.base, r.size);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	FK_ENTER();
	return alloc_block(dptr, bytesize, FK_LEGACY);
}

CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
				 unsigned int ElementSizeBytes)
{
	size_t pitch;
	CUresult rc;

	FK_ENTER();
	if (!pPitch || WidthInBytes == 0 || Height == 0 ||
	    (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
		return CUDA_ERROR_INVALID_VALUE;
	pitch = FK_ALIGN_UP(WidthInBytes, 512);
	rc = alloc_block(dptr, pitch * Height, FK_LEGACY);
	if (rc == CUDA_SUCCESS)
		*pPitch = pitch;
	return rc;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	FK_ENTER();
	return free_block(dptr);
}

/* Stream-ordered allocation completes at once: every stream is synchronous. */
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	CUresult rc;

	FK_ENTER();
	rc = fk_stream_check(hStream);
	if (rc != CUDA_SUCCESS)
		return rc;
	return alloc_block(dptr, bytesize, FK_LEGACY);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	CUresult rc;

	FK_ENTER();
	rc = fk_stream_check(hStream);
	if (rc != CUDA_SUCCESS)
		return rc;
	return free_block(dptr);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	FK_ENTER();
	if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
		return CUDA_ERROR_INVALID_VALUE;
	return alloc_block(dptr, bytesize, FK_MANAGED);
}

CUresult CUDAAPI cuMemGetInfo(size_t *free, size_t *total)
{
	struct CUctx_st *c = fk_ctx_current();

	FK_ENTER();
	if (!free || !total)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	fk_lock_take();
	*total = fk.dev[c->dev].total;
	*free = fk.dev[c->dev].total - fk.dev[c->dev].used;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

/* The range a pointer belongs to: the allocation as requested, or the
 * whole VMM mapping. */
static void region_range(const struct fk_region *r, uintptr_t *base, size_t *size)
{
	*base = r->base;
	*size = r->kind == FK_VMM ? r->size : r->req;
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	ssize_t i;
	CUresult rc = CUDA_ERROR_NOT_FOUND;

	FK_ENTER();
	fk_lock_take();
	i = fk_tab_find(&fk_regions, (uintptr_t)dptr);
	if (i >= 0) {
		uintptr_t base;
		size_t size;

		region_range(FK_TAB_AT(&fk_regions, i, struct fk_region), &base, &size);
		if (pbase)
			*pbase = (CUdeviceptr)base;
		if (psize)
			*psize = size;
		rc = CUDA_SUCCESS;
	}
	fk_lock_drop();
	return rc;
}

/* Writes one attribute of region r (NULL: not device memory) for ptr.
 * fk_lock held. */
static CUresult pointer_attr(void *data, CUpointer_attribute a, const struct fk_region *r, uintptr_t ptr)
{
	uintptr_t base = 0;
	size_t size = 0;

	if (r)
		region_range(r, &base, &size);
	switch (a) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = r ? r->ctx : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = r ? CU_MEMORYTYPE_DEVICE : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = r ? (CUdeviceptr)ptr : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		/* Device memory has no host alias, except managed memory. */
		*(void **)data = r && r->kind == FK_MANAGED ? (void *)ptr : NULL;
		return r && r->kind != FK_MANAGED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
		*(int *)data = 1;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = r ? r->id : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(unsigned int *)data = r && r->kind == FK_MANAGED;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = r ? r->dev : -2;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(unsigned int *)data = r && r->kind == FK_LEGACY;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)base;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(unsigned int *)data = r != NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		*(unsigned long long *)data =
			r && r->kind == FK_VMM ? (unsigned long long)r->phys->prop.requestedHandleTypes : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		*(unsigned int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
		*(unsigned int *)data = !r ? 0
					: (r->prot & PROT_WRITE) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
					: (r->prot & PROT_READ)  ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
								 : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
		*(void **)data = NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		*(size_t *)data = r ? r->size : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		*(void **)data = r ? (void *)r->base : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
		*(unsigned long long *)data = r ? r->id : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
		*(unsigned int *)data = 0;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

static const struct fk_region *region_of(uintptr_t p)
{
	ssize_t i = fk_tab_find(&fk_regions, p);

	return i < 0 ? NULL : FK_TAB_AT(&fk_regions, i, struct fk_region);
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	const struct fk_region *r;
	CUresult rc;

	FK_ENTER();
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	r = region_of((uintptr_t)ptr);
	rc = r ? pointer_attr(data, attribute, r, (uintptr_t)ptr) : CUDA_ERROR_INVALID_VALUE;
	fk_lock_drop();
	return rc;
}

/* Unlike the single query, an unknown pointer is not an error here: its
 * attributes read as zero/NULL. */
CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
					CUdeviceptr ptr)
{
	const struct fk_region *r;
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	if (!attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	r = region_of((uintptr_t)ptr);
	for (unsigned int i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++) {
		if (!data[i]) {
			rc = CUDA_ERROR_INVALID_VALUE;
			break;
		}
		rc = pointer_attr(data[i], attributes[i], r, (uintptr_t)ptr);
		if (rc != CUDA_SUCCESS && attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER)
			rc = CUDA_SUCCESS;  /* reads as NULL */
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuPointerSetAttribute(const void *value, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	bool known;

	FK_ENTER();
	if (!value || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	known = region_of((uintptr_t)ptr) != NULL;
	fk_lock_drop();
	return known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
