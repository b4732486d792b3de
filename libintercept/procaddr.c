/* Entry-point lookup: cuGetProcAddress (4 arguments, CUDA 11.3+),
 * cuGetProcAddress_v2 (with the query result, CUDA 12+) and cuGetExportTable.
 *
 * cudart asks the driver for "cuGetProcAddress" itself and resolves every
 * other entry point through the pointer it gets back; NCCL, Triton and
 * cudaGetDriverEntryPoint users go the same way. So the query is answered by
 * the real driver, which alone knows how cudaVersion and the stream flags
 * select a variant (cuMemAlloc -> cuMemAlloc_v2, cuLaunchKernel ->
 * cuLaunchKernel_ptsz), and when its answer is the driver's own function for a
 * symbol gpucr wraps, gpucr's function for that exact symbol is handed out
 * instead. "cuGetProcAddress" thus yields gpucr's lookup, and the loop
 * closes. Matching is by address against what dlsym gave for each wrapped
 * name, and by name (the requested symbol must be a version of the wrapped
 * one).
 *
 * Every other answer is replaced by gpucr's trampoline of the same name, so
 * that calls through looked-up pointers pass the gate (gate.h) as calls
 * through the exported symbols do: dladdr names the driver's symbol at that
 * exact address ("cuLaunchKernel_ptsz"), and gpucr's export of that name is
 * handed out. An address that is no exported driver symbol, or one gpucr
 * does not export (a driver newer than the shim's stub), passes through
 * ungated, with one warning per process. cuGetExportTable's private tables
 * hold no exported driver function and pass through unchanged. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "real.h"

/* Length of a wrapped symbol's base name: without _ptsz/_ptds, then _vN. */
static size_t base_len(const char *name)
{
	size_t n = strlen(name);

	if (n > 5 && (!strcmp(name + n - 5, "_ptsz") || !strcmp(name + n - 5, "_ptds")))
		n -= 5;
	for (size_t i = n; i > 2; i--) {
		if (name[i - 1] >= '0' && name[i - 1] <= '9')
			continue;
		if (i < n && name[i - 1] == 'v' && name[i - 2] == '_')
			n = i - 2;
		break;
	}
	return n;
}

/* Whether two symbols name versions of one function (cuMemAlloc and
 * cuMemAlloc_v2, cuMemFreeAsync and cuMemFreeAsync_ptsz). */
static bool same_base(const char *a, const char *b)
{
	size_t n = base_len(a);

	return n == base_len(b) && !strncmp(a, b, n);
}

static int cmp_name(const void *key, const void *elem)
{
	return strcmp(key, *(const char *const *)elem);
}

/* Whether addr lies in the shim itself. */
static bool in_shim(const void *addr)
{
	static Dl_info self;
	Dl_info info;

	if (!__atomic_load_n(&self.dli_fbase, __ATOMIC_ACQUIRE)) {
		Dl_info me;

		if (!dladdr((void *)cmp_name, &me))
			return false;
		self.dli_fname = me.dli_fname;
		__atomic_store_n(&self.dli_fbase, me.dli_fbase, __ATOMIC_RELEASE);
	}
	return dladdr(addr, &info) && info.dli_fbase == self.dli_fbase;
}

/* Graphics-interop entry points (OpenGL, EGL, VDPAU, Direct3D) that newer
 * drivers keep but the shim's stub no longer lists: cudart looks every one
 * up at start, and none allocates the device memory gpucr manages, so
 * their passing through is no news worth a warning. */
static bool graphics_interop(const char *symbol)
{
	static const char *const prefixes[] = { "cuGL", "cuWGL", "cuEGL", "cuVDPAU", "cuD3D", "cuGraphicsGL",
						"cuGraphicsEGL", "cuGraphicsVDPAU", "cuGraphicsD3D",
						"cuGraphicsResourceGetMappedEgl" };
	size_t i;

	for (i = 0; symbol && i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
		if (!strncmp(symbol, prefixes[i], strlen(prefixes[i])))
			return true;
	return false;
}

/* gpucr's trampoline for the driver function fn, which was the answer for
 * symbol; fn itself when there is none. */
static void *trampoline_for(const char *symbol, void *fn)
{
	static int warned;
	const char *const *hit;
	Dl_info info;

	if (in_shim(fn))
		return fn; /* the driver found the shim's own symbol */
	if (dladdr(fn, &info) && info.dli_sname && info.dli_saddr == fn) {
		hit = bsearch(info.dli_sname, fwd_names, FWD_COUNT, sizeof(fwd_names[0]), cmp_name);
		if (hit)
			return fwd_funcs[hit - fwd_names];
	}
	if (!graphics_interop(symbol) && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		pr_warn("cuGetProcAddress(\"%s\") returned %p (%s), which gpucr does not export; calls "
			"through it bypass gpucr's gate (further cases are logged at debug level)\n",
			symbol, fn, info.dli_sname && info.dli_saddr == fn ? info.dli_sname : "not a driver symbol");
	else
		pr_debug("cuGetProcAddress(\"%s\") returned %p, which gpucr does not export\n", symbol, fn);
	return fn;
}

static void *substitute(const char *symbol, void *fn, int version, cuuint64_t flags)
{
	static int warned[WRAP_COUNT];
	size_t i;

	if (!fn)
		return fn;
	/* The name must agree too: a driver may export one stub under many
	 * names (functions it does not support), and only the function asked
	 * for may be replaced. */
	for (i = 0; i < WRAP_COUNT; i++)
		if (real_wrapped[i] == fn && same_base(symbol, wrap_names[i]))
			return wrap_funcs[i];
	for (i = 0; i < WRAP_COUNT; i++)
		if (wrap_funcs[i] == fn)
			return fn; /* the driver looked it up in the global scope: already ours */
	/* The lookup itself must be ours whatever the driver hands out for it,
	 * or cudart resolves everything else past gpucr: by name, then. */
	if (!strcmp(symbol, "cuGetProcAddress"))
		return version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
	if (!strcmp(symbol, "cuGetExportTable"))
		return (void *)cuGetExportTable;
	/* The driver handed out something that is not one of its exported
	 * functions for a name gpucr wraps: calls through it bypass gpucr. */
	for (i = 0; i < WRAP_COUNT; i++) {
		if (same_base(symbol, wrap_names[i])) {
			if (!__atomic_exchange_n(&warned[i], 1, __ATOMIC_RELAXED))
				pr_warn("cuGetProcAddress(\"%s\", %d, %#llx) returned %p, which is not an "
					"exported driver function; calls through it bypass gpucr\n",
					symbol, version, (unsigned long long)flags, fn);
			return fn;
		}
	}
	return trampoline_for(symbol, fn);
}

SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
					 cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	SHIM_KEEP_ERRNO;
	CUresult r;

	real_ensure();
	if (!real.cuGetProcAddress_v2)
		return real_absent("cuGetProcAddress_v2");
	r = real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (r == CUDA_SUCCESS && symbol && pfn)
		*pfn = substitute(symbol, *pfn, cudaVersion, flags);
	return r;
}

SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				      cuuint64_t flags)
{
	SHIM_KEEP_ERRNO;
	CUresult r;

	real_ensure();
	if (!real.cuGetProcAddress)
		return real_absent("cuGetProcAddress");
	r = real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
	if (r == CUDA_SUCCESS && symbol && pfn)
		*pfn = substitute(symbol, *pfn, cudaVersion, flags);
	return r;
}

SHIM_EXPORT CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	SHIM_KEEP_ERRNO;

	real_ensure();
	if (!real.cuGetExportTable)
		return real_absent("cuGetExportTable");
	return real.cuGetExportTable(ppExportTable, pExportTableId);
}
