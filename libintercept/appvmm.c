/* The application's own VMM calls: its virtual handles, the mappings made
 * with them, and the adoption of whole, single mappings as gpucr's buffers.
 * Wraps cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap,
 * cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle,
 * cuMemExportToShareableHandle, cuMemMapArrayAsync(_ptsz),
 * cuMulticastBindMem and cuMulticastBindAddr. An imported handle
 * (cuMemImportFromShareableHandle, forwarded unwrapped) is the driver's:
 * its checkpoint carries that memory. See appvmm.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "appvmm.h"
#include "gate.h"
#include "real.h"

#define VH_BUCKETS 1024u

/* One handle the application got from cuMemCreate, as a virtual value. */
struct vh {
	CUmemGenericAllocationHandle vh;   /* what the application holds */
	CUmemGenericAllocationHandle real; /* the driver's; 0 while adopted (the region has it) */
	struct region *region;             /* adopted: the buffer it is (alloc_adopt_app) */
	CUmemAllocationProp prop;          /* as the application asked for it */
	size_t size;
	unsigned int refs;                 /* the application's references */
	unsigned int nmaps;                /* mappings of it that live */
	const char *pinned;                /* why it stays with the driver for good, or NULL */
	struct vh *next;                   /* hash chain */
};

/* One mapping made with a virtual handle. */
struct vmap {
	CUdeviceptr va;
	size_t size;
	size_t off;
	struct vh *h;
};

static pthread_mutex_t av_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vh *buckets[VH_BUCKETS];
static uint64_t next_id = 1;
static size_t nvh, nadopted;
static struct vmap *maps; /* by address */
static size_t nmaps, maps_cap;

static int mode = -1; /* GPUCR_APP_VMM, once read */

bool appvmm_enabled(void)
{
	int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);

	if (__builtin_expect(m < 0, 0)) {
		const char *s = getenv("GPUCR_APP_VMM");

		m = s && (!strcmp(s, "1") || !strcmp(s, "on") || !strcmp(s, "yes"));
		if (__atomic_exchange_n(&mode, m, __ATOMIC_RELAXED) < 0 && m)
			pr_debug("GPUCR_APP_VMM=1: the application's own VMM memory is tracked\n");
	}
	return m;
}

/* ---- tables (under av_lock) ------------------------------------------------ */

static struct vh *vh_find(CUmemGenericAllocationHandle h)
{
	struct vh *e;

	if (!appvmm_is_virtual(h))
		return NULL;
	for (e = buckets[h % VH_BUCKETS]; e; e = e->next)
		if (e->vh == h)
			return e;
	return NULL;
}

/* The driver's handle that e stands for now. */
static CUmemGenericAllocationHandle vh_real(const struct vh *e)
{
	return e->region ? alloc_app_handle(e->region) : e->real;
}

/* Lets go of e: neither the application nor a mapping holds it any more.
 * gpucr's reference on the driver's handle goes with it. */
static CUresult vh_drop(struct vh *e)
{
	struct vh **pp = &buckets[e->vh % VH_BUCKETS];
	CUresult r = CUDA_SUCCESS;

	while (*pp != e)
		pp = &(*pp)->next;
	*pp = e->next;
	if (e->real)
		r = real.cuMemRelease(e->real);
	if (r != CUDA_SUCCESS)
		pr_debug("app VMM handle %#llx: cuMemRelease(%#llx): %s\n", e->vh, e->real,
			 gpucr_strerror(gpucr_err_from_cu(r)));
	nvh--;
	free(e);
	return r;
}

/* The index of the first mapping at or above va. */
static size_t map_lower(CUdeviceptr va)
{
	size_t lo = 0, hi = nmaps;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (maps[mid].va < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct vmap *map_containing(CUdeviceptr a)
{
	size_t i = map_lower(a);

	if (i < nmaps && maps[i].va == a)
		return &maps[i];
	if (i > 0 && a - maps[i - 1].va < maps[i - 1].size)
		return &maps[i - 1];
	return NULL;
}

/* Records a mapping; returns it, or NULL when out of memory. */
static struct vmap *map_insert(CUdeviceptr va, size_t size, size_t off, struct vh *e)
{
	size_t i;

	if (nmaps == maps_cap) {
		size_t cap = maps_cap ? maps_cap * 2 : 64;
		struct vmap *v = realloc(maps, cap * sizeof(*v));

		if (!v)
			return NULL;
		maps = v;
		maps_cap = cap;
	}
	i = map_lower(va);
	memmove(&maps[i + 1], &maps[i], (nmaps - i) * sizeof(*maps));
	maps[i] = (struct vmap){ .va = va, .size = size, .off = off, .h = e };
	nmaps++;
	return &maps[i];
}

static void map_remove(size_t i)
{
	memmove(&maps[i], &maps[i + 1], (nmaps - i - 1) * sizeof(*maps));
	nmaps--;
}

/* ---- adoption (under av_lock) ---------------------------------------------- */

/* Makes m gpucr's buffer when it is the one mapping of its handle, whole;
 * says in the log why not otherwise. */
static void maybe_adopt(struct vh *e, const struct vmap *m)
{
	const char *why = NULL;
	struct region *r;
	int err;

	if (e->region || !e->real)
		return; /* adopted already; or its memory was lost at a failed remap */
	if (e->pinned)
		why = e->pinned;
	else if (e->nmaps > 1)
		why = "mapped more than once";
	else if (m->off || m->size != e->size)
		why = "mapped in part";
	if (why) {
		pr_debug("app VMM handle %#llx mapped at %#llx (%zu of %zu bytes at offset %zu): %s; "
			 "left to the driver's checkpoint\n",
			 e->vh, (unsigned long long)m->va, m->size, e->size, m->off, why);
		return;
	}
	err = alloc_adopt_app(e->prop.location.id, m->va, e->size, e->real, &r);
	if (err) {
		pr_debug("app VMM handle %#llx mapped at %#llx (%zu bytes): not adopted (%s); "
			 "left to the driver's checkpoint\n",
			 e->vh, (unsigned long long)m->va, e->size, gpucr_strerror(err));
		return;
	}
	e->region = r;
	e->real = 0;
	nadopted++;
	pr_debug("app VMM handle %#llx mapped at %#llx (%zu bytes, device %d): adopted\n", e->vh,
		 (unsigned long long)m->va, e->size, e->prop.location.id);
}

/* Takes e's memory out of gpucr's hands (the application still maps it). */
static void disown(struct vh *e)
{
	if (!e->region)
		return;
	e->real = alloc_disown_app(e->region);
	e->region = NULL;
	nadopted--;
}

/* e stays with the driver's checkpoint from now on: its memory is known to
 * something gpucr cannot put back at restore. */
static void pin(struct vh *e, const char *why)
{
	if (!e->pinned)
		pr_debug("app VMM handle %#llx (%zu bytes) %s: left to the driver's checkpoint\n", e->vh,
			 e->size, why);
	e->pinned = why;
	disown(e);
}

/* ---- wrappers ---------------------------------------------------------------- */

static CUresult create_tracked(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			       unsigned long long flags)
{
	GATE_COUNTED;
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp p;
	struct vh *e;
	CUresult r;

	if (!handle || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !alloc_vmm_usable(prop->location.id))
		return real.cuMemCreate(handle, size, prop, flags);
	/* Exportable, so that gpucrd can hold it while the process is dumped. */
	p = *prop;
	p.requestedHandleTypes |= CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	pthread_mutex_lock(&av_lock);
	r = real.cuMemCreate(&h, size, &p, flags);
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY &&
	    p.requestedHandleTypes != prop->requestedHandleTypes) {
		/* Not with that type (some kinds of memory cannot be exported as
		 * an fd): as asked then, and the driver's to carry. */
		r = real.cuMemCreate(&h, size, prop, flags);
		if (r == CUDA_SUCCESS)
			pr_debug("app VMM handle %#llx (%zu bytes): cannot be exported as an fd; "
				 "left to the driver's checkpoint\n", h, size);
		goto out_real;
	}
	if (r != CUDA_SUCCESS)
		goto out;
	if (appvmm_is_virtual(h)) {
		pr_debug("the driver's handle %#llx looks like one of gpucr's; not tracked\n", h);
		goto out_real;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		goto out_real; /* untracked: the driver carries it, as without gpucr */
	e->vh = APPVMM_TAG | next_id++;
	e->real = h;
	e->prop = *prop;
	e->size = size;
	e->refs = 1;
	e->next = buckets[e->vh % VH_BUCKETS];
	buckets[e->vh % VH_BUCKETS] = e;
	nvh++;
	*handle = e->vh;
	goto out;
out_real:
	if (r == CUDA_SUCCESS)
		*handle = h;
out:
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
				 unsigned long long flags)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!real.cuMemCreate)
		return real_absent("cuMemCreate");
	if (!appvmm_enabled()) {
		gate_pass();
		return real.cuMemCreate(handle, size, prop, flags);
	}
	return create_tracked(handle, size, prop, flags);
}

static CUresult release_tracked(CUmemGenericAllocationHandle handle)
{
	GATE_COUNTED;
	CUresult r = CUDA_SUCCESS;
	struct vh *e;

	pthread_mutex_lock(&av_lock);
	e = vh_find(handle);
	if (!e)
		r = real.cuMemRelease(handle);
	else if (!e->refs)
		r = CUDA_ERROR_INVALID_VALUE; /* released already; the mappings hold it */
	else if (!--e->refs && !e->nmaps)
		r = vh_drop(e);
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!real.cuMemRelease)
		return real_absent("cuMemRelease");
	if (!appvmm_enabled() || !appvmm_is_virtual(handle)) {
		gate_pass();
		return real.cuMemRelease(handle);
	}
	return release_tracked(handle);
}

static CUresult map_tracked(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			    unsigned long long flags)
{
	GATE_COUNTED;
	struct vmap *m;
	struct vh *e;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	e = vh_find(handle);
	r = real.cuMemMap(ptr, size, offset, e ? vh_real(e) : handle, flags);
	if (r != CUDA_SUCCESS || !e)
		goto out;
	m = map_insert(ptr, size, offset, e);
	if (!m) {
		/* Unrecorded, gpucr would not see it go. */
		pin(e, "mapped where gpucr had no memory to record it");
		goto out;
	}
	e->nmaps++;
	if (e->region) {
		pr_debug("app VMM handle %#llx mapped again at %#llx: no longer adopted\n", e->vh,
			 (unsigned long long)ptr);
		disown(e);
	}
	maybe_adopt(e, m);
out:
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			      unsigned long long flags)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!real.cuMemMap)
		return real_absent("cuMemMap");
	if (!appvmm_enabled() || !appvmm_is_virtual(handle)) {
		gate_pass();
		return real.cuMemMap(ptr, size, offset, handle, flags);
	}
	return map_tracked(ptr, size, offset, handle, flags);
}

static CUresult unmap_tracked(CUdeviceptr ptr, size_t size)
{
	GATE_COUNTED;
	size_t lo, hi, i;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	lo = map_lower(ptr);
	for (hi = lo; hi < nmaps && maps[hi].va - ptr < size; hi++)
		;
	/* Out of gpucr's hands before the driver unmaps them: the control
	 * thread exports adopted memory whenever it likes. */
	for (i = lo; i < hi; i++)
		disown(maps[i].h);
	r = real.cuMemUnmap(ptr, size);
	if (r != CUDA_SUCCESS) {
		for (i = lo; i < hi; i++)
			maybe_adopt(maps[i].h, &maps[i]);
		goto out;
	}
	for (i = hi; i-- > lo;) {
		struct vh *e = maps[i].h;

		map_remove(i);
		if (!--e->nmaps && !e->refs)
			vh_drop(e);
	}
out:
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!real.cuMemUnmap)
		return real_absent("cuMemUnmap");
	if (!appvmm_enabled()) {
		gate_pass();
		return real.cuMemUnmap(ptr, size);
	}
	return unmap_tracked(ptr, size);
}

typedef CUresult (*retain_fn)(CUmemGenericAllocationHandle *, void *);

static CUresult retain_tracked(CUmemGenericAllocationHandle *handle, void *addr)
{
	GATE_COUNTED;
	CUmemGenericAllocationHandle h = 0;
	struct vmap *m;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	m = map_containing((CUdeviceptr)(uintptr_t)addr);
	if (!m) {
		r = REAL_WRAPPED_CALL(cuMemRetainAllocationHandle, retain_fn, (handle, addr));
		goto out;
	}
	if (!handle) {
		r = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
	/* The driver checks the call; the reference it took is the virtual
	 * handle's (gpucr holds one on the driver's for all of them). */
	r = REAL_WRAPPED_CALL(cuMemRetainAllocationHandle, retain_fn, (&h, addr));
	if (r != CUDA_SUCCESS)
		goto out;
	real.cuMemRelease(h);
	m->h->refs++;
	*handle = m->h->vh;
out:
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!appvmm_enabled()) {
		gate_pass();
		return REAL_WRAPPED_CALL(cuMemRetainAllocationHandle, retain_fn, (handle, addr));
	}
	return retain_tracked(handle, addr);
}

typedef CUresult (*props_fn)(CUmemAllocationProp *, CUmemGenericAllocationHandle);

SHIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							    CUmemGenericAllocationHandle handle)
{
	SHIM_KEEP_ERRNO;
	struct vh *e;
	CUresult r;

	real_ensure();
	gate_pass();
	if (!appvmm_enabled() || !appvmm_is_virtual(handle))
		return REAL_WRAPPED_CALL(cuMemGetAllocationPropertiesFromHandle, props_fn, (prop, handle));
	pthread_mutex_lock(&av_lock);
	e = vh_find(handle);
	r = REAL_WRAPPED_CALL(cuMemGetAllocationPropertiesFromHandle, props_fn, (prop, e ? vh_real(e) : handle));
	/* The fd type gpucr added is its own business. */
	if (r == CUDA_SUCCESS && e && prop)
		prop->requestedHandleTypes = e->prop.requestedHandleTypes;
	pthread_mutex_unlock(&av_lock);
	return r;
}

static CUresult export_tracked(void *shareableHandle, CUmemGenericAllocationHandle handle,
			       CUmemAllocationHandleType handleType, unsigned long long flags)
{
	GATE_COUNTED;
	struct vh *e;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	e = vh_find(handle);
	if (!e) {
		r = real.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
	} else if (handleType && !(e->prop.requestedHandleTypes & handleType)) {
		/* As the driver answers for a type the application did not ask
		 * for: it must not come to depend on the one gpucr added. */
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		r = real.cuMemExportToShareableHandle(shareableHandle, vh_real(e), handleType, flags);
		if (r == CUDA_SUCCESS)
			pin(e, "exported");
	}
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
						  CUmemAllocationHandleType handleType, unsigned long long flags)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!real.cuMemExportToShareableHandle)
		return real_absent("cuMemExportToShareableHandle");
	if (!appvmm_enabled() || !appvmm_is_virtual(handle)) {
		gate_pass();
		return real.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
	}
	return export_tracked(shareableHandle, handle, handleType, flags);
}

/* Sparse arrays: a generic handle's memory mapped into an array. */
typedef CUresult (*map_array_fn)(CUarrayMapInfo *, unsigned int, CUstream);

static CUresult map_array(CUarrayMapInfo *list, unsigned int count, CUstream s, bool ptsz)
{
	GATE_COUNTED;
	CUarrayMapInfo *copy = NULL;
	unsigned int i;
	struct vh *e;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	for (i = 0; list && i < count; i++) {
		if (list[i].memHandleType != CU_MEM_HANDLE_TYPE_GENERIC ||
		    !(e = vh_find(list[i].memHandle.memHandle)))
			continue;
		if (!copy) {
			copy = malloc(count * sizeof(*copy));
			if (!copy) {
				r = CUDA_ERROR_OUT_OF_MEMORY;
				goto out;
			}
			memcpy(copy, list, count * sizeof(*copy));
		}
		copy[i].memHandle.memHandle = vh_real(e);
		pin(e, "mapped into a sparse array");
	}
	if (ptsz)
		r = REAL_WRAPPED_CALL(cuMemMapArrayAsync_ptsz, map_array_fn, (copy ? copy : list, count, s));
	else
		r = REAL_WRAPPED_CALL(cuMemMapArrayAsync, map_array_fn, (copy ? copy : list, count, s));
out:
	pthread_mutex_unlock(&av_lock);
	free(copy);
	return r;
}

SHIM_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!appvmm_enabled()) {
		gate_pass();
		return REAL_WRAPPED_CALL(cuMemMapArrayAsync, map_array_fn, (mapInfoList, count, hStream));
	}
	return map_array(mapInfoList, count, hStream, false);
}

SHIM_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!appvmm_enabled()) {
		gate_pass();
		return REAL_WRAPPED_CALL(cuMemMapArrayAsync_ptsz, map_array_fn, (mapInfoList, count, hStream));
	}
	return map_array(mapInfoList, count, hStream, true);
}

/* Multicast: the object's own handle is never one of gpucr's and passes
 * through; memory bound to one is shared with the team, so it stays with
 * the driver. */
typedef CUresult (*bind_mem_fn)(CUmemGenericAllocationHandle, size_t, CUmemGenericAllocationHandle, size_t, size_t,
				unsigned long long);
typedef CUresult (*bind_addr_fn)(CUmemGenericAllocationHandle, size_t, CUdeviceptr, size_t, unsigned long long);

static CUresult bind_mem_tracked(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
				 CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
				 unsigned long long flags)
{
	GATE_COUNTED;
	struct vh *e;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	e = vh_find(memHandle);
	r = REAL_WRAPPED_CALL(cuMulticastBindMem, bind_mem_fn,
			      (mcHandle, mcOffset, e ? vh_real(e) : memHandle, memOffset, size, flags));
	if (r == CUDA_SUCCESS && e)
		pin(e, "bound to a multicast object");
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
					CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
					unsigned long long flags)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!appvmm_enabled() || !appvmm_is_virtual(memHandle)) {
		gate_pass();
		return REAL_WRAPPED_CALL(cuMulticastBindMem, bind_mem_fn,
					 (mcHandle, mcOffset, memHandle, memOffset, size, flags));
	}
	return bind_mem_tracked(mcHandle, mcOffset, memHandle, memOffset, size, flags);
}

static CUresult bind_addr_tracked(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,
				  size_t size, unsigned long long flags)
{
	GATE_COUNTED;
	size_t i;
	CUresult r;

	pthread_mutex_lock(&av_lock);
	r = REAL_WRAPPED_CALL(cuMulticastBindAddr, bind_addr_fn, (mcHandle, mcOffset, memptr, size, flags));
	if (r == CUDA_SUCCESS) {
		/* Every mapping the range touches, the one it starts in too
		 * (that one lies below memptr: addresses are compared, not
		 * offsets from memptr, which would wrap). */
		i = map_lower(memptr);
		if (i > 0 && memptr - maps[i - 1].va < maps[i - 1].size)
			i--;
		for (; i < nmaps && maps[i].va < memptr + size; i++)
			pin(maps[i].h, "bound to a multicast object");
	}
	pthread_mutex_unlock(&av_lock);
	return r;
}

SHIM_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,
					 size_t size, unsigned long long flags)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!appvmm_enabled()) {
		gate_pass();
		return REAL_WRAPPED_CALL(cuMulticastBindAddr, bind_addr_fn, (mcHandle, mcOffset, memptr, size, flags));
	}
	return bind_addr_tracked(mcHandle, mcOffset, memptr, size, flags);
}

/* ---- for tests and logs ------------------------------------------------------ */

int appvmm_real_handle(CUmemGenericAllocationHandle vh, CUmemGenericAllocationHandle *ret_real)
{
	struct vh *e;
	int err = -ENOENT;

	pthread_mutex_lock(&av_lock);
	e = vh_find(vh);
	if (e) {
		*ret_real = vh_real(e);
		err = 0;
	}
	pthread_mutex_unlock(&av_lock);
	return err;
}

size_t appvmm_count(size_t *ret_adopted)
{
	size_t n;

	pthread_mutex_lock(&av_lock);
	n = nvh;
	if (ret_adopted)
		*ret_adopted = nadopted;
	pthread_mutex_unlock(&av_lock);
	return n;
}
