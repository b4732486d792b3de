/* VMM regions: creating and destroying them (adopting and disowning the
 * application's), per-device capabilities, the export / release / remap of
 * their physical chunks, and what the daemon has been told of them. Called
 * with alloc's lock held (see vmm.h). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "control.h"
#include "real.h"
#include "vmm.h"

struct vmm_dev {
	bool probed;
	bool disabled;
	bool rdma; /* VMM memory can be GPUDirect RDMA capable, as cudaMalloc's is */
	size_t gran;
};

static struct vmm_dev devs[VMM_MAX_DEVICES];
static struct region *regions; /* every region, newest first */

/* Addresses of reported chunks destroyed since the last vmm_collect(). */
static CUdeviceptr *freed;
static size_t nfreed, freed_cap;

static bool vmm_env_disabled(void)
{
	const char *s = getenv("GPUCR_VMM");

	return s && (!strcmp(s, "0") || !strcmp(s, "off") || !strcmp(s, "no"));
}

static void vmm_prop(int device, CUmemAllocationProp *prop)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop->allocFlags.gpuDirectRDMACapable = devs[device].rdma ? 1 : 0;
}

/* 1 or 0 as the device answers; -1 when it does not. */
static int dev_attr(int device, CUdevice_attribute attr)
{
	int v = 0;

	if (!real.cuDeviceGetAttribute || real.cuDeviceGetAttribute(&v, attr, device) != CUDA_SUCCESS)
		return -1;
	return v != 0;
}

static void vmm_probe(int device)
{
	struct vmm_dev *d = &devs[device];
	CUmemAllocationProp prop;
	const char *why = NULL;
	size_t g = 0;

	d->probed = true;
	if (vmm_env_disabled()) {
		d->disabled = true;
		pr_debug("device %d: GPUCR_VMM=0, device memory left to the driver\n", device);
		return;
	}
	if (!real.cuMemAddressReserve || !real.cuMemAddressFree || !real.cuMemCreate ||
	    !real.cuMemRelease || !real.cuMemMap || !real.cuMemUnmap || !real.cuMemSetAccess ||
	    !real.cuMemExportToShareableHandle || !real.cuMemImportFromShareableHandle ||
	    !real.cuMemGetAllocationGranularity)
		why = "the driver lacks the virtual memory management API";
	else if (dev_attr(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) == 0)
		why = "it does not support virtual memory management";
	else if (dev_attr(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) == 0)
		why = "it cannot export memory as POSIX file descriptors";
	if (why) {
		d->disabled = true;
		pr_info("device %d: %s; its memory stays with the driver's own checkpoint\n", device, why);
		return;
	}
	d->rdma = dev_attr(device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) == 1;
	vmm_prop(device, &prop);
	if (real.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
		    CUDA_SUCCESS ||
	    !g)
		if (real.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
			    CUDA_SUCCESS ||
		    !g)
			g = 2UL << 20;
	d->gran = g;
	pr_debug("device %d: VMM granularity %zu, rdma %d\n", device, g, d->rdma);
}

size_t vmm_granularity(int device)
{
	if (device < 0 || device >= VMM_MAX_DEVICES || !real.handle)
		return 0;
	if (!devs[device].probed)
		vmm_probe(device);
	return devs[device].disabled ? 0 : devs[device].gran;
}

void vmm_disable(int device, int err)
{
	if (device < 0 || device >= VMM_MAX_DEVICES || devs[device].disabled)
		return;
	devs[device].disabled = true;
	pr_warn("device %d: cannot allocate exportable VMM memory (%s); new device memory on it "
		"stays with the driver's own checkpoint\n",
		device, gpucr_strerror(err));
}

static void access_desc(int device, CUmemAccessDesc *desc)
{
	memset(desc, 0, sizeof(*desc));
	desc->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	desc->location.id = device;
	desc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* Maps handle at va and grants the device access (the n descriptors in
 * access instead when not NULL: none at all when n is 0); undoes the map on
 * failure. */
static CUresult map_chunk(CUdeviceptr va, size_t size, int device, CUmemGenericAllocationHandle h,
			  const CUmemAccessDesc *access, unsigned int n)
{
	CUmemAccessDesc desc;
	CUresult r;

	r = real.cuMemMap(va, size, 0, h, 0);
	if (r != CUDA_SUCCESS)
		return r;
	if (!access) {
		access_desc(device, &desc);
		access = &desc;
		n = 1;
	}
	r = n ? real.cuMemSetAccess(va, size, access, n) : CUDA_SUCCESS;
	if (r != CUDA_SUCCESS)
		real.cuMemUnmap(va, size);
	return r;
}

static void region_link(struct region *r)
{
	r->prev = NULL;
	r->next = regions;
	if (regions)
		regions->prev = r;
	regions = r;
}

static void region_unlink(struct region *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		regions = r->next;
	if (r->next)
		r->next->prev = r->prev;
}

/* A region of one chunk, handle h mapped at [va, va + size), entered in
 * the list (the daemon hears of it); NULL when out of memory. */
static struct region *region_new(int device, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
	struct region *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->chunks = calloc(1, sizeof(*r->chunks));
	if (!r->chunks) {
		free(r);
		return NULL;
	}
	r->va = va;
	r->size = size;
	r->device = device;
	r->nchunks = 1;
	r->chunks[0] = (struct chunk){ .handle = h, .off = 0, .size = size, .mapped = true };
	region_link(r);
	control_kick(); /* the daemon hears of it */
	return r;
}

/* Takes r out of the list and frees it (its memory is the caller's
 * business); the daemon hears of it. */
static void region_forget(struct region *r)
{
	region_unlink(r);
	free(r->access);
	free(r->chunks);
	free(r);
	control_kick();
}

int vmm_region_create(int device, size_t size, struct region **ret_region)
{
	size_t gran = vmm_granularity(device);
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	struct region *r;
	CUdeviceptr va = 0;
	CUresult cr;
	int err;

	if (!gran)
		return -EOPNOTSUPP;
	if (size > SIZE_MAX - gran)
		return gpucr_err_from_cu(CUDA_ERROR_OUT_OF_MEMORY);
	size = SHIM_ALIGN_UP(size, gran);
	cr = real.cuMemAddressReserve(&va, size, gran, 0, 0);
	if (cr != CUDA_SUCCESS) {
		err = gpucr_err_from_cu(cr);
		goto err_out;
	}
	vmm_prop(device, &prop);
	cr = real.cuMemCreate(&h, size, &prop, 0);
	if (cr != CUDA_SUCCESS) {
		err = gpucr_err_from_cu(cr);
		goto err_unreserve;
	}
	cr = map_chunk(va, size, device, h, NULL, 0);
	if (cr != CUDA_SUCCESS) {
		err = gpucr_err_from_cu(cr);
		goto err_release;
	}
	r = region_new(device, va, size, h);
	if (!r) {
		err = -ENOMEM;
		real.cuMemUnmap(va, size);
		goto err_release;
	}
	*ret_region = r;
	return 0;

err_release:
	real.cuMemRelease(h);
err_unreserve:
	real.cuMemAddressFree(va, size);
err_out:
	pr_debug("device %d: VMM region of %zu bytes: %s\n", device, size, gpucr_strerror(err));
	return err;
}

static void note_freed(CUdeviceptr va)
{
	if (nfreed == freed_cap) {
		size_t cap = freed_cap ? freed_cap * 2 : 64;
		CUdeviceptr *v = realloc(freed, cap * sizeof(*v));

		if (!v) {
			/* The daemon keeps a stale record of it until it reconnects. */
			pr_debug("chunk at %#llx freed: no memory to report it\n", (unsigned long long)va);
			return;
		}
		freed = v;
		freed_cap = cap;
	}
	freed[nfreed++] = va;
}

void vmm_region_destroy(struct region *r)
{
	CUresult cr;
	unsigned int i;

	if (!r)
		return;
	for (i = 0; i < r->nchunks; i++) {
		struct chunk *c = &r->chunks[i];

		if (c->reported)
			note_freed(r->va + c->off);
		if (c->mapped && (cr = real.cuMemUnmap(r->va + c->off, c->size)) != CUDA_SUCCESS)
			pr_debug("cuMemUnmap(%#llx, %zu): %s\n", (unsigned long long)(r->va + c->off),
				 c->size, gpucr_strerror(gpucr_err_from_cu(cr)));
		if (c->handle && (cr = real.cuMemRelease(c->handle)) != CUDA_SUCCESS)
			pr_debug("cuMemRelease(chunk at %#llx): %s\n",
				 (unsigned long long)(r->va + c->off), gpucr_strerror(gpucr_err_from_cu(cr)));
	}
	cr = real.cuMemAddressFree(r->va, r->size);
	if (cr != CUDA_SUCCESS)
		pr_debug("cuMemAddressFree(%#llx, %zu): %s\n", (unsigned long long)r->va, r->size,
			 gpucr_strerror(gpucr_err_from_cu(cr)));
	region_forget(r);
}

int vmm_region_adopt(int device, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
		     struct region **ret_region)
{
	struct region *r;

	if (!vmm_granularity(device))
		return -EOPNOTSUPP;
	r = region_new(device, va, size, h);
	if (!r)
		return -ENOMEM;
	r->app = true;
	*ret_region = r;
	return 0;
}

CUmemGenericAllocationHandle vmm_region_disown(struct region *r)
{
	CUmemGenericAllocationHandle h = r->chunks[0].handle;

	if (r->chunks[0].reported)
		note_freed(r->va);
	region_forget(r);
	return h;
}

size_t vmm_chunk_count(size_t *ret_mapped)
{
	size_t n = 0, mapped = 0;
	struct region *r;
	unsigned int i;

	for (r = regions; r; r = r->next)
		for (i = 0; i < r->nchunks; i++) {
			n++;
			mapped += r->chunks[i].mapped;
		}
	if (ret_mapped)
		*ret_mapped = mapped;
	return n;
}

static int cmp_chunk_va(const void *a, const void *b)
{
	CUdeviceptr x = ((const struct alloc_chunk_fd *)a)->va;
	CUdeviceptr y = ((const struct alloc_chunk_fd *)b)->va;

	return x < y ? -1 : x > y;
}

/* Exports chunk c of r into *out. */
static int export_chunk(const struct region *r, const struct chunk *c, struct alloc_chunk_fd *out)
{
	CUresult cr;
	int fd = -1, err;

	cr = real.cuMemExportToShareableHandle(&fd, c->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (cr != CUDA_SUCCESS) {
		err = gpucr_err_from_cu(cr);
		pr_debug("export of chunk at %#llx (%zu bytes): %s\n", (unsigned long long)(r->va + c->off),
			 c->size, gpucr_strerror(err));
		return err;
	}
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	*out = (struct alloc_chunk_fd){
		.va = r->va + c->off,
		.size = c->size,
		.device = r->device,
		.fd = fd,
		.slab = r->slab != NULL,
		.app = r->app,
		.reserve_va = r->va,
		.reserve_size = r->size,
	};
	return 0;
}

int vmm_export_all(struct alloc_chunk_fd *out, size_t cap, size_t *ret_n)
{
	struct region *r;
	size_t n = 0;
	unsigned int i;
	int err = 0;

	for (r = regions; r && !err; r = r->next) {
		for (i = 0; i < r->nchunks; i++) {
			struct chunk *c = &r->chunks[i];

			if (!c->mapped || !c->handle)
				continue;
			if (n == cap) {
				err = -EAGAIN; /* regions changed under a quiesced process? */
				break;
			}
			err = export_chunk(r, c, &out[n]);
			if (err)
				break;
			n++;
		}
	}
	if (err) {
		while (n)
			close(out[--n].fd);
		return err;
	}
	qsort(out, n, sizeof(*out), cmp_chunk_va);
	*ret_n = n;
	return 0;
}

int vmm_collect(struct alloc_changes *ret)
{
	struct alloc_chunk_fd *v = NULL;
	size_t n = 0, cap = 0;
	struct region *r;
	unsigned int i;
	int err = 0;

	for (r = regions; r; r = r->next)
		for (i = 0; i < r->nchunks; i++)
			cap += r->chunks[i].mapped && r->chunks[i].handle && !r->chunks[i].reported;
	if (cap) {
		v = malloc(cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
	}
	for (r = regions; r && !err && n < cap; r = r->next) {
		for (i = 0; i < r->nchunks && n < cap; i++) {
			struct chunk *c = &r->chunks[i];

			if (!c->mapped || !c->handle || c->reported)
				continue;
			err = export_chunk(r, c, &v[n]);
			if (err)
				break;
			n++;
		}
	}
	if (err) {
		while (n)
			close(v[--n].fd);
		free(v);
		return err;
	}
	/* Marked only now that every export worked: a failure leaves them for
	 * the next attempt. */
	for (r = regions; r; r = r->next)
		for (i = 0; i < r->nchunks; i++)
			if (r->chunks[i].mapped && r->chunks[i].handle)
				r->chunks[i].reported = true;
	if (n)
		qsort(v, n, sizeof(*v), cmp_chunk_va);
	ret->added = v;
	ret->nadded = n;
	ret->freed = freed;
	ret->nfreed = nfreed;
	freed = NULL;
	nfreed = freed_cap = 0;
	return 0;
}

void vmm_forget_reports(void)
{
	struct region *r;
	unsigned int i;

	for (r = regions; r; r = r->next)
		for (i = 0; i < r->nchunks; i++)
			r->chunks[i].reported = false;
	free(freed);
	freed = NULL;
	nfreed = freed_cap = 0;
}

/* The access the application granted to its adopted region r, kept for
 * the remap: the driver forgets it with the mapping. Every device is asked
 * (peers the application opened it to included); a driver that cannot say
 * gets the owner's read-write access back, what the application needed to
 * use the memory at all. */
/* The devices an access list may name (at most VMM_MAX_DEVICES; 0 when the
 * driver cannot say). */
static int access_devices(void)
{
	int ndev = 0;

	if (real.cuDeviceGetCount(&ndev) != CUDA_SUCCESS || ndev <= 0)
		return 0;
	return ndev > VMM_MAX_DEVICES ? VMM_MAX_DEVICES : ndev;
}

/* Keeps the access the application gave adopted region r, over ndev
 * devices (access_devices()), for the remap. */
static int save_access(struct region *r, int ndev)
{
	CUmemAccessDesc *v;
	unsigned int n = 0;
	int d;

	v = calloc(ndev ? (size_t)ndev : 1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (d = 0; d < ndev && real.cuMemGetAccess; d++) {
		CUmemLocation loc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d };
		unsigned long long flags = 0;

		if (real.cuMemGetAccess(&flags, &loc, r->va) != CUDA_SUCCESS ||
		    flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
			continue;
		v[n].location = loc;
		v[n].flags = (CUmemAccess_flags)flags;
		n++;
	}
	if (!real.cuMemGetAccess) {
		access_desc(r->device, &v[0]);
		n = 1;
	}
	free(r->access);
	r->access = v;
	r->naccess = n;
	pr_debug("app VMM mapping at %#llx (%zu bytes): access for %u device(s) kept for the remap\n",
		 (unsigned long long)r->va, r->size, n);
	return 0;
}

int vmm_release_all(void)
{
	struct region *r;
	unsigned int i;
	int err, ndev = -1; /* asked at the first adopted region */

	for (r = regions; r; r = r->next) {
		for (i = 0; i < r->nchunks; i++) {
			struct chunk *c = &r->chunks[i];
			CUdeviceptr va = r->va + c->off;
			CUresult cr;

			if (c->mapped && r->app && ndev < 0)
				ndev = access_devices();
			if (c->mapped && r->app && (err = save_access(r, ndev)))
				return err;
			if (c->mapped) {
				cr = real.cuMemUnmap(va, c->size);
				if (cr != CUDA_SUCCESS) {
					pr_debug("cuMemUnmap(%#llx, %zu): %s\n", (unsigned long long)va,
						 c->size, gpucr_strerror(gpucr_err_from_cu(cr)));
					return gpucr_err_from_cu(cr);
				}
				c->mapped = false;
			}
			if (c->handle) {
				cr = real.cuMemRelease(c->handle);
				if (cr != CUDA_SUCCESS) {
					/* Kept: remap maps this handle again. */
					pr_debug("cuMemRelease(chunk at %#llx): %s\n",
						 (unsigned long long)va, gpucr_strerror(gpucr_err_from_cu(cr)));
					return gpucr_err_from_cu(cr);
				}
				c->handle = 0;
			}
		}
	}
	return 0;
}

int vmm_remap_all(const struct alloc_chunk_fd *chunks, size_t count)
{
	struct alloc_chunk_fd *sorted = NULL;
	bool missing = false;
	struct region *r;
	unsigned int i;

	if (count) {
		sorted = malloc(count * sizeof(*sorted));
		if (!sorted)
			return -ENOMEM;
		memcpy(sorted, chunks, count * sizeof(*sorted));
		qsort(sorted, count, sizeof(*sorted), cmp_chunk_va);
	}
	for (r = regions; r; r = r->next) {
		for (i = 0; i < r->nchunks; i++) {
			struct chunk *c = &r->chunks[i];
			struct alloc_chunk_fd key = { .va = r->va + c->off };
			CUmemGenericAllocationHandle h = c->handle;
			const struct alloc_chunk_fd *f;
			CUresult cr;

			if (c->mapped)
				continue;
			if (!h) {
				f = count ? bsearch(&key, sorted, count, sizeof(*sorted), cmp_chunk_va) : NULL;
				if (!f || f->fd < 0) {
					pr_debug("no fd to remap the chunk at %#llx (%zu bytes)\n",
						 (unsigned long long)key.va, c->size);
					missing = true;
					continue;
				}
				if (f->size != c->size) {
					pr_debug("fd for %#llx holds %zu bytes, the chunk %zu\n",
						 (unsigned long long)key.va, f->size, c->size);
					free(sorted);
					return -EINVAL;
				}
				cr = real.cuMemImportFromShareableHandle(
					&h, (void *)(uintptr_t)f->fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
				if (cr != CUDA_SUCCESS) {
					pr_debug("import of the fd for %#llx: %s\n", (unsigned long long)key.va,
						 gpucr_strerror(gpucr_err_from_cu(cr)));
					free(sorted);
					return gpucr_err_from_cu(cr);
				}
			}
			cr = map_chunk(key.va, c->size, r->device, h, r->access, r->naccess);
			if (cr != CUDA_SUCCESS) {
				pr_debug("remap of the chunk at %#llx: %s\n", (unsigned long long)key.va,
					 gpucr_strerror(gpucr_err_from_cu(cr)));
				if (!c->handle)
					real.cuMemRelease(h);
				free(sorted);
				return gpucr_err_from_cu(cr);
			}
			if (!c->handle)
				c->reported = true; /* imported from the caller's fd */
			c->handle = h;
			c->mapped = true;
		}
	}
	free(sorted);
	return missing ? -ENOENT : 0;
}
