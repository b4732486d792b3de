/* fakecuda module: the kernel registry (kernels are host functions that
 * tests register by name), fake modules and libraries that resolve any
 * registered name, function/kernel queries (parameter layout, attributes,
 * names) and the launch entry points, which run the host function
 * synchronously on the calling thread.  A CUkernel is the same object as
 * its CUfunction, as the driver lets one be cast to the other. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

struct CUfunc_st {
	uint32_t magic;
	char *name;
	struct CUmod_st *mod;  /* the module it was first looked up through */
	int attr[CU_FUNC_ATTRIBUTE_MAX];
	struct CUfunc_st *next;
	/* Replaced as a whole on re-registration; old layouts are kept, not
	 * freed, so a launch that read them under the lock can keep using them. */
	fakecuda_kernel_fn fn;
	int nparams;
	const size_t *size, *off;
	size_t argbytes;
};

struct CUmod_st {
	uint32_t magic;
};

struct CUlib_st {
	uint32_t magic;
	struct CUmod_st *mod;
};

static struct CUfunc_st *kernels;

static struct CUfunc_st *func_of(CUfunction f)
{
	return f && f->magic == FK_FUNC ? f : NULL;
}

static struct CUfunc_st *func_of_kernel(CUkernel k)
{
	return func_of((CUfunction)(void *)k);
}

static struct CUfunc_st *kernel_find(const char *name)
{
	for (struct CUfunc_st *f = kernels; f; f = f->next)
		if (strcmp(f->name, name) == 0)
			return f;
	return NULL;
}

static void default_attrs(int *a)
{
	a[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] = 1024;
	a[CU_FUNC_ATTRIBUTE_NUM_REGS] = 32;
	a[CU_FUNC_ATTRIBUTE_PTX_VERSION] = 90;
	a[CU_FUNC_ATTRIBUTE_BINARY_VERSION] = 90;
	a[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES] = 49152;
	a[CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT] = -1;
}

static size_t natural_align(size_t size)
{
	size_t a = size & -size;  /* largest power of two dividing size */

	return a == 0 || a > 8 ? 8 : a;
}

FAKECUDA_API int fakecuda_register_kernel_aligned(const char *name, fakecuda_kernel_fn fn, int nparams,
						  const size_t *param_sizes, const size_t *param_aligns)
{
	size_t *size = NULL, *off = NULL, end = 0;
	struct CUfunc_st *f;
	char *dup = NULL;

	if (!name || !*name || !fn || nparams < 0 || (nparams > 0 && !param_sizes))
		return -EINVAL;
	if (nparams > 0) {
		size = fk_obj_alloc((size_t)nparams * sizeof(*size));
		off = fk_obj_alloc((size_t)nparams * sizeof(*off));
		if (!size || !off)
			return -ENOMEM;
	}
	for (int i = 0; i < nparams; i++) {
		size_t a = param_aligns && param_aligns[i] ? param_aligns[i] : natural_align(param_sizes[i]);

		if (param_sizes[i] == 0 || (a & (a - 1)))
			return -EINVAL;
		end = FK_ALIGN_UP(end, a);
		off[i] = end;
		size[i] = param_sizes[i];
		end += param_sizes[i];
	}
	f = fk_obj_alloc(sizeof(*f));
	dup = fk_obj_alloc(strlen(name) + 1);
	if (!f || !dup)
		return -ENOMEM;
	fk_lock_take();
	struct CUfunc_st *old = kernel_find(name);

	if (old) {
		f = old;  /* the fresh f and dup stay unused */
	} else {
		memcpy(dup, name, strlen(name) + 1);
		f->magic = FK_FUNC;
		f->name = dup;
		default_attrs(f->attr);
		f->next = kernels;
		kernels = f;
	}
	f->fn = fn;
	f->nparams = nparams;
	f->size = size;
	f->off = off;
	f->argbytes = end;
	fk_lock_drop();
	return 0;
}

FAKECUDA_API int fakecuda_register_kernel(const char *name, fakecuda_kernel_fn fn, int nparams,
					  const size_t *param_sizes)
{
	return fakecuda_register_kernel_aligned(name, fn, nparams, param_sizes, NULL);
}

/* ---- modules and libraries ---- */

static CUresult module_new(CUmodule *pmod, const void *image)
{
	struct CUmod_st *m;

	if (!pmod || !image)
		return CUDA_ERROR_INVALID_VALUE;
	m = fk_obj_alloc(sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->magic = FK_MODULE;
	*pmod = m;
	return CUDA_SUCCESS;
}

static int module_ok(CUmodule m)
{
	return m && m->magic == FK_MODULE;
}

CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
	FK_ENTER();
	if (!fname)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (access(fname, R_OK) < 0)
		return CUDA_ERROR_FILE_NOT_FOUND;
	return module_new(module, fname);
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
	FK_ENTER();
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	return module_new(module, image);
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
				    CUjit_option *options, void **optionValues)
{
	FK_ENTER();
	(void)numOptions;
	(void)options;
	(void)optionValues;
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	return module_new(module, image);
}

CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
	FK_ENTER();
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	return module_new(module, fatCubin);
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
	FK_ENTER();
	if (!module_ok(hmod))
		return CUDA_ERROR_INVALID_HANDLE;
	hmod->magic = FK_DEAD;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
	FK_ENTER();
	if (!mode)
		return CUDA_ERROR_INVALID_VALUE;
	*mode = CU_MODULE_EAGER_LOADING;
	return CUDA_SUCCESS;
}

static CUresult lookup(CUfunction *pf, CUmodule mod, const char *name)
{
	struct CUfunc_st *f;

	if (!pf || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!module_ok(mod))
		return CUDA_ERROR_INVALID_HANDLE;
	fk_lock_take();
	f = kernel_find(name);
	if (f && !f->mod)
		f->mod = mod;
	fk_lock_drop();
	if (!f)
		return CUDA_ERROR_NOT_FOUND;
	*pf = f;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	FK_ENTER();
	return lookup(hfunc, hmod, name);
}

/* Every module holds every registered kernel. */
static CUresult count_kernels(unsigned int *count, CUmodule mod)
{
	unsigned int n = 0;

	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	if (!module_ok(mod))
		return CUDA_ERROR_INVALID_HANDLE;
	fk_lock_take();
	for (struct CUfunc_st *f = kernels; f; f = f->next)
		n++;
	fk_lock_drop();
	*count = n;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int *count, CUmodule mod)
{
	FK_ENTER();
	return count_kernels(count, mod);
}

static CUresult library_new(CUlibrary *plib, const void *code)
{
	struct CUlib_st *l;
	CUmodule m;
	CUresult rc;

	if (!plib)
		return CUDA_ERROR_INVALID_VALUE;
	rc = module_new(&m, code);
	if (rc != CUDA_SUCCESS)
		return rc;
	l = fk_obj_alloc(sizeof(*l));
	if (!l)
		return CUDA_ERROR_OUT_OF_MEMORY;
	l->magic = FK_LIBRARY;
	l->mod = m;
	*plib = l;
	return CUDA_SUCCESS;
}

static int library_ok(CUlibrary l)
{
	return l && l->magic == FK_LIBRARY;
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
				   void **jitOptionsValues, unsigned int numJitOptions,
				   CUlibraryOption *libraryOptions, void **libraryOptionValues,
				   unsigned int numLibraryOptions)
{
	FK_ENTER();
	(void)jitOptions;
	(void)jitOptionsValues;
	(void)numJitOptions;
	(void)libraryOptions;
	(void)libraryOptionValues;
	(void)numLibraryOptions;
	return library_new(library, code);
}

CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
				       void **jitOptionsValues, unsigned int numJitOptions,
				       CUlibraryOption *libraryOptions, void **libraryOptionValues,
				       unsigned int numLibraryOptions)
{
	FK_ENTER();
	(void)jitOptions;
	(void)jitOptionsValues;
	(void)numJitOptions;
	(void)libraryOptions;
	(void)libraryOptionValues;
	(void)numLibraryOptions;
	if (!fileName)
		return CUDA_ERROR_INVALID_VALUE;
	if (access(fileName, R_OK) < 0)
		return CUDA_ERROR_FILE_NOT_FOUND;
	return library_new(library, fileName);
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library)
{
	FK_ENTER();
	if (!library_ok(library))
		return CUDA_ERROR_INVALID_HANDLE;
	library->magic = FK_DEAD;
	library->mod->magic = FK_DEAD;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
	FK_ENTER();
	if (!pMod)
		return CUDA_ERROR_INVALID_VALUE;
	if (!library_ok(library))
		return CUDA_ERROR_INVALID_HANDLE;
	*pMod = library->mod;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
	CUfunction f;
	CUresult rc;

	FK_ENTER();
	if (!pKernel)
		return CUDA_ERROR_INVALID_VALUE;
	if (!library_ok(library))
		return CUDA_ERROR_INVALID_HANDLE;
	rc = lookup(&f, library->mod, name);
	if (rc == CUDA_SUCCESS)
		*pKernel = (CUkernel)(void *)f;
	return rc;
}

CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
	FK_ENTER();
	if (!library_ok(lib))
		return CUDA_ERROR_INVALID_HANDLE;
	return count_kernels(count, lib->mod);
}

CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
	FK_ENTER();
	if (!pFunc)
		return CUDA_ERROR_INVALID_VALUE;
	if (!func_of_kernel(kernel))
		return CUDA_ERROR_INVALID_HANDLE;
	*pFunc = (CUfunction)(void *)kernel;
	return CUDA_SUCCESS;
}

/* ---- function queries ---- */

static CUresult param_info(struct CUfunc_st *f, size_t index, size_t *offset, size_t *size)
{
	CUresult rc = CUDA_SUCCESS;

	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	fk_lock_take();
	if (index >= (size_t)f->nparams) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		if (offset)
			*offset = f->off[index];
		if (size)
			*size = f->size[index];
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
	FK_ENTER();
	return param_info(func_of(func), paramIndex, paramOffset, paramSize);
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
	FK_ENTER();
	return param_info(func_of_kernel(kernel), paramIndex, paramOffset, paramSize);
}

static CUresult get_attr(int *pi, CUfunction_attribute a, struct CUfunc_st *f)
{
	if (!pi || (unsigned)a >= CU_FUNC_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	fk_lock_take();
	*pi = f->attr[a];
	fk_lock_drop();
	return CUDA_SUCCESS;
}

static CUresult set_attr(CUfunction_attribute a, int v, struct CUfunc_st *f)
{
	if ((unsigned)a >= CU_FUNC_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	fk_lock_take();
	f->attr[a] = v;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
	FK_ENTER();
	return get_attr(pi, attrib, func_of(hfunc));
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
	FK_ENTER();
	return set_attr(attrib, value, func_of(hfunc));
}

CUresult CUDAAPI cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
	FK_ENTER();
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	return get_attr(pi, attrib, func_of_kernel(kernel));
}

CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
	FK_ENTER();
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	return set_attr(attrib, val, func_of_kernel(kernel));
}

CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
	FK_ENTER();
	(void)config;
	return func_of(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev)
{
	FK_ENTER();
	(void)config;
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	return func_of_kernel(kernel) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
	struct CUfunc_st *f = func_of(hfunc);

	FK_ENTER();
	if (!hmod)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	*hmod = f->mod;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc)
{
	struct CUfunc_st *f = func_of(hfunc);

	FK_ENTER();
	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	*name = f->name;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
	struct CUfunc_st *f = func_of_kernel(hfunc);

	FK_ENTER();
	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	*name = f->name;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState *state, CUfunction function)
{
	FK_ENTER();
	if (!state)
		return CUDA_ERROR_INVALID_VALUE;
	if (!func_of(function))
		return CUDA_ERROR_INVALID_HANDLE;
	*state = CU_FUNCTION_LOADING_STATE_LOADED;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncLoad(CUfunction function)
{
	FK_ENTER();
	return func_of(function) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- launches ---- */

CUresult fk_func_layout(CUfunction func, int *nparams, const size_t **off, const size_t **size, size_t *argbytes)
{
	struct CUfunc_st *f = func_of(func);

	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	fk_lock_take();
	*nparams = f->nparams;
	*off = f->off;
	*size = f->size;
	*argbytes = f->argbytes;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

CUresult fk_launch(CUfunction func, const unsigned int grid[3], const unsigned int block[3], unsigned int shmem,
		   CUstream s, void **params, void **extra)
{
	struct CUfunc_st *f = func_of(func);
	unsigned int g[3] = { grid[0], grid[1], grid[2] };
	unsigned int b[3] = { block[0], block[1], block[2] };
	fakecuda_kernel_fn fn;
	const size_t *off;
	size_t argbytes;
	int nparams, max_dyn;
	void **argv = params;
	CUresult rc;

	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	rc = fk_stream_check(s);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (!g[0] || !g[1] || !g[2] || g[1] > 65535 || g[2] > 65535 || !b[0] || !b[1] || !b[2] || b[0] > 1024 ||
	    b[1] > 1024 || b[2] > 64 || (unsigned long long)b[0] * b[1] * b[2] > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	fn = f->fn;
	nparams = f->nparams;
	off = f->off;
	argbytes = f->argbytes;
	max_dyn = f->attr[CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES];
	fk_lock_drop();
	if (max_dyn >= 0 && shmem > (unsigned int)max_dyn)
		return CUDA_ERROR_INVALID_VALUE;
	if (params && extra)
		return CUDA_ERROR_INVALID_VALUE;
	if (extra) {
		char *buf = NULL;
		size_t bufsize = 0;
		int have_size = 0;

		for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
			if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
				buf = extra[i + 1];
			} else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
				if (!extra[i + 1])
					return CUDA_ERROR_INVALID_VALUE;
				bufsize = *(size_t *)extra[i + 1];
				have_size = 1;
			} else {
				return CUDA_ERROR_INVALID_VALUE;
			}
		}
		if (nparams > 0 && (!buf || !have_size || bufsize < argbytes))
			return CUDA_ERROR_INVALID_VALUE;
		argv = nparams > 0 ? calloc((size_t)nparams, sizeof(*argv)) : NULL;
		if (nparams > 0 && !argv)
			return CUDA_ERROR_OUT_OF_MEMORY;
		for (int i = 0; i < nparams; i++)
			argv[i] = buf + off[i];
	} else if (nparams > 0 && !params) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	fn(argv, g, b);
	if (argv != params)
		free(argv);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
				unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
				unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	const unsigned int g[3] = { gridDimX, gridDimY, gridDimZ }, b[3] = { blockDimX, blockDimY, blockDimZ };

	FK_ENTER();
	return fk_launch(f, g, b, sharedMemBytes, hStream, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	FK_ENTER();
	if (!config || (config->numAttrs && !config->attrs))
		return CUDA_ERROR_INVALID_VALUE;
	const unsigned int g[3] = { config->gridDimX, config->gridDimY, config->gridDimZ };
	const unsigned int b[3] = { config->blockDimX, config->blockDimY, config->blockDimZ };

	return fk_launch(f, g, b, config->sharedMemBytes, config->hStream, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
					   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
					   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
					   void **kernelParams)
{
	const unsigned int g[3] = { gridDimX, gridDimY, gridDimZ }, b[3] = { blockDimX, blockDimY, blockDimZ };

	FK_ENTER();
	return fk_launch(f, g, b, sharedMemBytes, hStream, kernelParams, NULL);
}
