/* fakecuda procaddr: driver entry-point lookup (cuGetProcAddress, both
 * ABIs) over the fake's own exported symbols, and cuGetExportTable, which
 * the fake does not have.  A name resolves to its newest implemented _vN
 * whose ABI the requested CUDA version knows, else to the plain name.
 * Functions cuda.h declares but the fake does not implement exist as weak
 * aliases of one stub returning CUDA_ERROR_NOT_SUPPORTED (gen-stubs.c):
 * they resolve only when nothing implemented does, as a real driver would
 * hand out a function that then fails. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The CUDA version that introduced an ABI the fake exports under a _vN
 * name; a caller asking for an older version gets the older ABI.  _vN names
 * not listed here date from CUDA 3.2/4.0 and every caller knows them. */
static const struct {
	const char *name;
	int n;
	int since;
} abi_since[] = {
	{ "cuCtxCreate", 4, 12050 },
	{ "cuCtxCreate", 3, 11040 },
	{ "cuGetProcAddress", 2, 12000 },
	{ "cuDeviceGetUuid", 2, 11040 },
	{ "cuEventElapsedTime", 2, 12080 },
	{ "cuDevicePrimaryCtxRelease", 2, 11000 },
	{ "cuDevicePrimaryCtxReset", 2, 11000 },
	{ "cuDevicePrimaryCtxSetFlags", 2, 11000 },
	{ "cuCtxGetDevice", 2, 13000 },
	{ "cuCtxSynchronize", 2, 13000 },
};

static int abi_known(const char *name, int n, int version)
{
	for (size_t i = 0; i < sizeof(abi_since) / sizeof(abi_since[0]); i++)
		if (abi_since[i].n == n && strcmp(abi_since[i].name, name) == 0)
			return version >= abi_since[i].since;
	return 1;
}

/* Our own handle: dlsym through it finds the fake's symbols even when
 * another libcuda.so.1 (gpucr's interceptor) loaded us privately and its
 * symbols come first in the global scope. */
static void *self_handle(void)
{
	static void *handle;
	void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
	Dl_info info;

	if (h)
		return h;
	if (!dladdr((void *)self_handle, &info) || !info.dli_fname)
		return NULL;
	h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
	if (h)
		__atomic_store_n(&handle, h, __ATOMIC_RELEASE);
	return h;
}

CUresult fk_get_proc_address(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status)
{
	char name[256];
	void *h, *fn = NULL;

	if (!symbol || !pfn || cuda_version <= 0 ||
	    (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
		return CUDA_ERROR_INVALID_VALUE;
	if (cuda_version > FK_DRIVER_VERSION)
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	if (strncmp(symbol, "cu", 2) != 0 || strlen(symbol) + 4 >= sizeof(name))
		return CUDA_SUCCESS;
	h = self_handle();
	if (!h)
		return CUDA_ERROR_NOT_SUPPORTED;
	/* Per-thread-stream variants do not exist here: every stream is
	 * synchronous, so the legacy entry point serves both flags. */
	for (int n = 9; n >= 1; n--) {
		void *f;

		if (n == 1)
			snprintf(name, sizeof(name), "%s", symbol);
		else if (abi_known(symbol, n, cuda_version))
			snprintf(name, sizeof(name), "%s_v%d", symbol, n);
		else
			continue;
		f = dlsym(h, name);
		if (f && f != (void *)fk_not_supported) {
			fn = f;
			break;
		}
		if (f && !fn)
			fn = f;  /* a stub: only if nothing better turns up */
	}
	if (fn) {
		*pfn = fn;
		if (status)
			*status = CU_GET_PROC_ADDRESS_SUCCESS;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
				  CUdriverProcAddressQueryResult *symbolStatus)
{
	return fk_get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

FK_LEGACY(CUresult, fk_cuGetProcAddress_v1, "cuGetProcAddress",
	  (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))
{
	return fk_get_proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

/* cudart needs these private tables; the fake has none, so cudart cannot
 * run on it.  Driver-API users never ask. */
CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	(void)pExportTableId;
	if (ppExportTable)
		*ppExportTable = NULL;
	return CUDA_ERROR_NOT_SUPPORTED;
}
