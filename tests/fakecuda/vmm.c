/* fakecuda vmm: the virtual memory management API.  Address reservations are
 * PROT_NONE anonymous mappings; physical allocations are memfds named
 * "fakecuda-phys"; cuMemMap maps the memfd MAP_SHARED|MAP_FIXED over the
 * reservation (no access until cuMemSetAccess, as on the GPU), cuMemUnmap
 * puts the PROT_NONE reservation back.  Export hands out a dup of the memfd,
 * import takes one in, so memory crosses processes as it does on a GPU.
 * A handle's memfd is closed once it is released and no mapping uses it. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* Handles are FK_HANDLE_TAG | index into phys_tab; indices are not reused,
 * so a released handle never aliases a later one. */
#define FK_HANDLE_TAG 0xfa00000000000000ULL
#define FK_HANDLE_IDX 0x00ffffffffffffffULL

static struct fk_phys **phys_tab;
static size_t phys_n, phys_cap;

static struct fk_phys *phys_lookup(CUmemGenericAllocationHandle h)
{
	size_t i;

	if ((h & ~FK_HANDLE_IDX) != FK_HANDLE_TAG)
		return NULL;
	i = (size_t)(h & FK_HANDLE_IDX);
	if (i >= phys_n || !phys_tab[i] || phys_tab[i]->refs <= 0)
		return NULL;
	return phys_tab[i];
}

static CUresult phys_add(struct fk_phys *p)
{
	if (phys_n == phys_cap) {
		size_t cap = phys_cap ? phys_cap * 2 : 256;
		struct fk_phys **t = realloc(phys_tab, cap * sizeof(*t));

		if (!t)
			return CUDA_ERROR_OUT_OF_MEMORY;
		phys_tab = t;
		phys_cap = cap;
	}
	p->handle = FK_HANDLE_TAG | phys_n;
	phys_tab[phys_n++] = p;
	return CUDA_SUCCESS;
}

/* Drops the physical memory once nothing refers to it.  fk_lock held. */
static void phys_maybe_free(struct fk_phys *p)
{
	if (p->refs > 0 || p->nmaps > 0)
		return;
	phys_tab[p->handle & FK_HANDLE_IDX] = NULL;
	close(p->fd);
	if (!p->imported)
		fk.dev[p->prop.location.id].used -= p->size;
	free(p);
}

static int is_fake_memfd(int fd)
{
	char path[64], link[128];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return 0;
	link[n] = '\0';
	return strncmp(link, "/memfd:" FAKECUDA_PHYS_NAME, strlen("/memfd:" FAKECUDA_PHYS_NAME)) == 0;
}

static CUresult check_prop(const CUmemAllocationProp *prop)
{
	if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!fk_dev_ok(prop->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
					       CUmemAllocationGranularity_flags option)
{
	CUresult rc;

	FK_ENTER();
	if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
			     option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
		return CUDA_ERROR_INVALID_VALUE;
	rc = check_prop(prop);
	if (rc != CUDA_SUCCESS)
		return rc;
	*granularity = FK_GRANULARITY;
	return CUDA_SUCCESS;
}

/* Maps size bytes PROT_NONE, aligned to align, at hint if that is free. */
static void *reserve_va(size_t size, size_t align, uintptr_t hint)
{
	const int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	char *p, *a;

	if (hint && hint % align == 0) {
		p = mmap((void *)hint, size, PROT_NONE, fl | MAP_FIXED_NOREPLACE, -1, 0);
		if (p == (void *)hint)
			return p;
		/* Kernels before 4.17 take MAP_FIXED_NOREPLACE as a plain hint. */
		if (p != MAP_FAILED)
			munmap(p, size);
	}
	p = mmap(NULL, size + align, PROT_NONE, fl, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	a = (char *)FK_ALIGN_UP((uintptr_t)p, align);
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + size < p + size + align)
		munmap(a + size, (size_t)(p + size + align - (a + size)));
	return a;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				     unsigned long long flags)
{
	struct fk_resv r;
	void *va;
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	(void)flags;
	if (!ptr || size == 0 || size % FK_GRANULARITY)
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment == 0)
		alignment = FK_GRANULARITY;
	if (alignment & (alignment - 1))
		return CUDA_ERROR_INVALID_VALUE;
	if (alignment < FK_GRANULARITY)
		alignment = FK_GRANULARITY;
	va = reserve_va(size, alignment, (uintptr_t)addr);
	if (!va)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r.base = (uintptr_t)va;
	r.size = size;
	fk_lock_take();
	if (fk_tab_insert(&fk_resvs, &r) < 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	fk_lock_drop();
	if (rc != CUDA_SUCCESS) {
		munmap(va, size);
		return rc;
	}
	*ptr = (CUdeviceptr)r.base;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	ssize_t i;
	size_t j;
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	fk_lock_take();
	i = fk_tab_find(&fk_resvs, (uintptr_t)ptr);
	if (i < 0 || FK_TAB_AT(&fk_resvs, i, struct fk_resv)->base != ptr ||
	    FK_TAB_AT(&fk_resvs, i, struct fk_resv)->size != size) {
		rc = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* The driver wants the range unmapped first; so does the fake. */
	j = fk_tab_lower(&fk_regions, (uintptr_t)ptr);
	if (j < fk_regions.n && FK_TAB_AT(&fk_regions, j, struct fk_region)->base < ptr + size) {
		rc = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	munmap((void *)(uintptr_t)ptr, size);
	fk_tab_remove(&fk_resvs, (size_t)i);
out:
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			     unsigned long long flags)
{
	struct fk_phys *p;
	struct fk_device *d;
	CUresult rc;
	int fd;

	FK_ENTER();
	if (!handle || size == 0 || size % FK_GRANULARITY || flags)
		return CUDA_ERROR_INVALID_VALUE;
	rc = check_prop(prop);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	p = calloc(1, sizeof(*p));
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fd = memfd_create(FAKECUDA_PHYS_NAME, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
		if (fd >= 0)
			close(fd);
		free(p);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	p->fd = fd;
	p->size = size;
	p->prop = *prop;
	p->refs = 1;
	fk_lock_take();
	d = &fk.dev[prop->location.id];
	if (d->used + size > d->total)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else
		rc = phys_add(p);
	if (rc == CUDA_SUCCESS) {
		d->used += size;
		*handle = p->handle;
	}
	fk_lock_drop();
	if (rc != CUDA_SUCCESS) {
		close(fd);
		free(p);
	}
	return rc;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct fk_phys *p;
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	fk_lock_take();
	p = phys_lookup(handle);
	if (!p) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		p->refs--;
		phys_maybe_free(p);
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			  unsigned long long flags)
{
	struct fk_region r = { 0 };
	struct fk_phys *p;
	struct fk_resv *rv;
	ssize_t i;
	size_t j;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FK_ENTER();
	if (flags || size == 0 || ptr % FK_GRANULARITY || size % FK_GRANULARITY || offset % FK_GRANULARITY ||
	    ptr + size < ptr)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	p = phys_lookup(handle);
	if (!p || offset > p->size || size > p->size - offset)
		goto out;
	i = fk_tab_find(&fk_resvs, (uintptr_t)ptr);
	if (i < 0)
		goto out;
	rv = FK_TAB_AT(&fk_resvs, i, struct fk_resv);
	if (ptr + size > rv->base + rv->size)
		goto out;
	j = fk_tab_lower(&fk_regions, (uintptr_t)ptr);
	if (j > 0) {
		struct fk_region *prev = FK_TAB_AT(&fk_regions, j - 1, struct fk_region);

		if (prev->base + prev->size > ptr)
			goto out;
	}
	if (j < fk_regions.n && FK_TAB_AT(&fk_regions, j, struct fk_region)->base < ptr + size)
		goto out;
	if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset) ==
	    MAP_FAILED) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	r.base = (uintptr_t)ptr;
	r.size = size;
	r.kind = FK_VMM;
	r.prot = PROT_NONE;
	r.phys = p;
	r.offset = offset;
	r.dev = p->prop.location.id;
	r.ctx = fk_ctx_current();
	r.id = fk_next_id();
	if (fk_tab_insert(&fk_regions, &r) < 0) {
		mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		     -1, 0);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	p->nmaps++;
	rc = CUDA_SUCCESS;
out:
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	size_t j, k;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FK_ENTER();
	if (size == 0 || ptr + size < ptr)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	/* Every mapping touched must lie wholly inside the range. */
	j = fk_tab_lower(&fk_regions, (uintptr_t)ptr);
	if (j > 0) {
		struct fk_region *prev = FK_TAB_AT(&fk_regions, j - 1, struct fk_region);

		if (prev->base + prev->size > ptr)
			goto out;
	}
	for (k = j; k < fk_regions.n; k++) {
		struct fk_region *r = FK_TAB_AT(&fk_regions, k, struct fk_region);

		if (r->base >= ptr + size)
			break;
		if (r->kind != FK_VMM || r->base + r->size > ptr + size)
			goto out;
	}
	if (k == j)
		goto out;
	while (k-- > j) {
		struct fk_region *r = FK_TAB_AT(&fk_regions, k, struct fk_region);
		struct fk_phys *p = r->phys;

		mmap((void *)r->base, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		     -1, 0);
		fk_tab_remove(&fk_regions, k);
		p->nmaps--;
		phys_maybe_free(p);
	}
	rc = CUDA_SUCCESS;
out:
	fk_lock_drop();
	return rc;
}

static int access_prot(CUmemAccess_flags f)
{
	switch (f) {
	case CU_MEM_ACCESS_FLAGS_PROT_NONE: return PROT_NONE;
	case CU_MEM_ACCESS_FLAGS_PROT_READ: return PROT_READ;
	case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: return PROT_READ | PROT_WRITE;
	default: return -1;
	}
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	uintptr_t p = (uintptr_t)ptr, end = (uintptr_t)ptr + size;
	int prot = PROT_NONE;
	ssize_t i;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FK_ENTER();
	if (!desc || count == 0 || size == 0 || end < p)
		return CUDA_ERROR_INVALID_VALUE;
	/* The host stands in for every device: the widest access granted to
	 * any of them is what the mapping gets. */
	for (size_t d = 0; d < count; d++) {
		int pr = access_prot(desc[d].flags);

		if (desc[d].location.type != CU_MEM_LOCATION_TYPE_DEVICE || pr < 0)
			return CUDA_ERROR_INVALID_VALUE;
		if (!fk_dev_ok(desc[d].location.id))
			return CUDA_ERROR_INVALID_DEVICE;
		prot |= pr;
	}
	fk_lock_take();
	i = fk_tab_find(&fk_regions, p);
	if (i < 0 || FK_TAB_AT(&fk_regions, i, struct fk_region)->base != p)
		goto out;
	/* The range must be covered by whole, adjacent VMM mappings. */
	for (size_t k = (size_t)i; p < end; k++) {
		struct fk_region *r;

		if (k >= fk_regions.n)
			goto out;
		r = FK_TAB_AT(&fk_regions, k, struct fk_region);
		if (r->base != p || r->kind != FK_VMM || r->base + r->size > end)
			goto out;
		p += r->size;
	}
	p = (uintptr_t)ptr;
	for (size_t k = (size_t)i; p < end; k++) {
		struct fk_region *r = FK_TAB_AT(&fk_regions, k, struct fk_region);

		if (mprotect((void *)r->base, r->size, prot) < 0) {
			rc = CUDA_ERROR_OUT_OF_MEMORY;
			goto out;
		}
		r->prot = prot;
		p += r->size;
	}
	rc = CUDA_SUCCESS;
out:
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
	ssize_t i;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FK_ENTER();
	if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_dev_ok(location->id))
		return CUDA_ERROR_INVALID_DEVICE;
	fk_lock_take();
	i = fk_tab_find(&fk_regions, (uintptr_t)ptr);
	if (i >= 0 && FK_TAB_AT(&fk_regions, i, struct fk_region)->kind == FK_VMM) {
		int prot = FK_TAB_AT(&fk_regions, i, struct fk_region)->prot;

		*flags = (prot & PROT_WRITE) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
			 : (prot & PROT_READ) ? CU_MEM_ACCESS_FLAGS_PROT_READ
					      : CU_MEM_ACCESS_FLAGS_PROT_NONE;
		rc = CUDA_SUCCESS;
	}
	fk_lock_drop();
	return rc;
}

/* Multicast objects are not modelled: binding a range to one succeeds (a
 * range of no bytes is refused) and changes nothing, which is enough for
 * the shim's bookkeeping of what was bound. */
CUresult CUDAAPI cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,
				     size_t size, unsigned long long flags)
{
	(void)mcHandle;
	(void)mcOffset;
	(void)memptr;
	(void)flags;
	return size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
					      CUmemAllocationHandleType handleType, unsigned long long flags)
{
	struct fk_phys *p;
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	if (!shareableHandle || flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fk_lock_take();
	p = phys_lookup(handle);
	if (!p || !(p->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);

		if (fd < 0)
			rc = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)shareableHandle = fd;
	}
	fk_lock_drop();
	return rc;
}

/* The caller keeps its fd; the handle holds a dup.  The fake cannot tell
 * which device an fd came from: imports report device 0. */
CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						CUmemAllocationHandleType shHandleType)
{
	int fd = (int)(intptr_t)osHandle, dup_fd;
	struct fk_phys *p;
	struct stat st;
	CUresult rc;

	FK_ENTER();
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (fd < 0 || fstat(fd, &st) < 0 || !is_fake_memfd(fd) || st.st_size <= 0 ||
	    (size_t)st.st_size % FK_GRANULARITY)
		return CUDA_ERROR_INVALID_VALUE;
	p = calloc(1, sizeof(*p));
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0) {
		free(p);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	p->fd = dup_fd;
	p->size = (size_t)st.st_size;
	p->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->prop.location.id = 0;
	p->refs = 1;
	p->imported = 1;
	fk_lock_take();
	rc = phys_add(p);
	if (rc == CUDA_SUCCESS)
		*handle = p->handle;
	fk_lock_drop();
	if (rc != CUDA_SUCCESS) {
		close(dup_fd);
		free(p);
	}
	return rc;
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	ssize_t i;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FK_ENTER();
	if (!handle)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	i = fk_tab_find(&fk_regions, (uintptr_t)addr);
	if (i >= 0 && FK_TAB_AT(&fk_regions, i, struct fk_region)->kind == FK_VMM) {
		struct fk_phys *p = FK_TAB_AT(&fk_regions, i, struct fk_region)->phys;

		p->refs++;
		*handle = p->handle;
		rc = CUDA_SUCCESS;
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							CUmemGenericAllocationHandle handle)
{
	struct fk_phys *p;
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	if (!prop)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	p = phys_lookup(handle);
	if (p)
		*prop = p->prop;
	else
		rc = CUDA_ERROR_INVALID_VALUE;
	fk_lock_drop();
	return rc;
}
