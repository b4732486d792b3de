/* The shim's own call counts (gpucr_shim.h): gpucr_shim_counts() is in the
 * shim's dynamic symbol table, and after a known mix of calls its counters
 * equal exactly what was issued:
 *  - kernels: cuLaunchKernel, cuLaunchKernelEx and cuLaunchCooperativeKernel,
 *    by the exported symbols and through pointers from cuGetProcAddress (as
 *    cudart resolves them: first "cuGetProcAddress" itself, then every name
 *    through that), a launch the driver refuses, and launches from several
 *    threads at once;
 *  - graphs: cuGraphLaunch, cuGraphLaunch_ptsz and a looked-up pointer; the
 *    kernel, memcpy and memset nodes inside the graph count nowhere;
 *  - copies and memsets: synchronous and asynchronous ones, their
 *    _ptds/_ptsz twins, 2D and 3D forms, and looked-up pointers;
 *  - nothing else counts: allocation, synchronisation, graph building.
 * Every wrapper macro (launch.c, graph.c, copy.c) is exercised, so one that
 * stops counting fails here.
 *
 * Linked against the shim as installed; sets GPUCR_REAL_LIBCUDA to the fake. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"
#include "gpucr_shim.h"
#include "t.h"
#include "shimtest.h"

#define NTHREADS 4
#define PER_THREAD 1000
#define BUF 65536

typedef int (*reg_fn)(const char *, fakecuda_kernel_fn, int, const size_t *);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
			      unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*launch_coop_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
				   unsigned int, unsigned int, unsigned int, CUstream, void **);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_async_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*set32_fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*set8_async_fn)(CUdeviceptr, unsigned char, size_t, CUstream);

static struct gpucr_shim_counts want;
static CUcontext ctx;
static CUfunction fill_fn;
static CUdeviceptr A, B;
static gpa_v2_fn gpa;
static launch_fn lk;

/* Issues one call that the shim counts as `what`; the driver must take it. */
#define ISSUE(what, call)                                     \
	do {                                                  \
		CHECK_EQ_INT((call), CUDA_SUCCESS);           \
		want.what++;                                  \
	} while (0)

static void *lookup(const char *name, cuuint64_t flags)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *p = NULL;

	REQUIRE(gpa(name, &p, CUDA_VERSION, flags, &st) == CUDA_SUCCESS);
	REQUIRE(st == CU_GET_PROC_ADDRESS_SUCCESS && p);
	return p;
}

/* The shim's counts equal want; where names the step. */
static void expect(const char *where)
{
	struct gpucr_shim_counts c;

	memset(&c, 0xff, sizeof(c));
	CHECK_EQ_INT(gpucr_shim_counts(&c, sizeof(c)), (int)sizeof(c));
	if (memcmp(&c, &want, sizeof(c)))
		fprintf(stderr, "%s: counts kernels=%llu graphs=%llu copies=%llu memsets=%llu, issued %llu %llu %llu %llu\n",
			where, (unsigned long long)c.kernels, (unsigned long long)c.graphs,
			(unsigned long long)c.copies, (unsigned long long)c.memsets,
			(unsigned long long)want.kernels, (unsigned long long)want.graphs,
			(unsigned long long)want.copies, (unsigned long long)want.memsets);
	CHECK_EQ_INT(c.kernels, want.kernels);
	CHECK_EQ_INT(c.graphs, want.graphs);
	CHECK_EQ_INT(c.copies, want.copies);
	CHECK_EQ_INT(c.memsets, want.memsets);
}

static int read_int(CUdeviceptr p)
{
	int v = 0;

	REQUIRE(cuMemcpyDtoH_v2(&v, p, sizeof(v)) == CUDA_SUCCESS);
	want.copies++;
	return v;
}

static void *launcher(void *arg)
{
	int v = (int)(intptr_t)arg, n = 16;
	void *params[] = { &B, &v, &n };
	CUresult r = CUDA_SUCCESS;

	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	for (int i = 0; i < PER_THREAD && r == CUDA_SUCCESS; i++)
		r = (i & 1) ? lk(fill_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL)
			    : cuLaunchKernel(fill_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
	return (void *)(intptr_t)r;
}

static void kernels(void)
{
	int v = 3, n = 256;
	void *params[] = { &A, &v, &n };
	CUlaunchConfig cfg;
	CUstream s;

	REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
	for (int i = 0; i < 5; i++)
		ISSUE(kernels, cuLaunchKernel(fill_fn, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
	memset(&cfg, 0, sizeof(cfg));
	cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
	cfg.blockDimX = 32;
	cfg.blockDimY = cfg.blockDimZ = 1;
	cfg.hStream = s;
	ISSUE(kernels, cuLaunchKernelEx(&cfg, fill_fn, params, NULL));
	ISSUE(kernels, cuLaunchCooperativeKernel(fill_fn, 1, 1, 1, 32, 1, 1, 0, s, params));
	CHECK_EQ_INT(read_int(A + 255 * sizeof(int)), 3);
	expect("exported launches");

	/* Through looked-up pointers: gpucr's wrappers, which count. */
	lk = (launch_fn)lookup("cuLaunchKernel", CU_GET_PROC_ADDRESS_DEFAULT);
	for (int i = 0; i < 7; i++)
		ISSUE(kernels, lk(fill_fn, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
	ISSUE(kernels, ((launch_fn)lookup("cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(
			       fill_fn, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
	ISSUE(kernels, ((launch_ex_fn)lookup("cuLaunchKernelEx", CU_GET_PROC_ADDRESS_DEFAULT))(&cfg, fill_fn, params,
											      NULL));
	ISSUE(kernels, ((launch_coop_fn)lookup("cuLaunchCooperativeKernel", CU_GET_PROC_ADDRESS_DEFAULT))(
			       fill_fn, 1, 1, 1, 32, 1, 1, 0, s, params));
	/* A launch call counts whether or not the driver takes it. */
	CHECK_EQ_INT(cuLaunchKernel(fill_fn, 0, 1, 1, 32, 1, 1, 0, s, params, NULL), CUDA_ERROR_INVALID_VALUE);
	want.kernels++;
	expect("looked-up launches");

	/* Not launches: synchronisation, allocation, queries. */
	{
		CUdeviceptr tmp;
		size_t fr, tot;

		CHECK_EQ_INT(cuStreamSynchronize(s), CUDA_SUCCESS);
		CHECK_EQ_INT(cuCtxSynchronize(), CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemAlloc_v2(&tmp, 4096), CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemFree_v2(tmp), CUDA_SUCCESS);
		expect("calls that are no launch, copy or memset");
	}
	CHECK_EQ_INT(cuStreamDestroy_v2(s), CUDA_SUCCESS);

	/* Threads at once: every launch counted, none lost. */
	{
		pthread_t th[NTHREADS];
		void *ret;

		for (int i = 0; i < NTHREADS; i++)
			REQUIRE(pthread_create(&th[i], NULL, launcher, (void *)(intptr_t)(i + 10)) == 0);
		for (int i = 0; i < NTHREADS; i++) {
			REQUIRE(pthread_join(th[i], &ret) == 0);
			CHECK_EQ_INT((intptr_t)ret, CUDA_SUCCESS);
		}
		want.kernels += NTHREADS * PER_THREAD;
		expect("launches from threads");
	}
}

static void graphs(void)
{
	CUDA_KERNEL_NODE_PARAMS kp;
	CUDA_MEMSET_NODE_PARAMS mp;
	CUDA_MEMCPY3D cp;
	CUgraphNode kn, mn, cn;
	CUgraphExec exec;
	CUgraph g;
	CUstream s;
	int v = 9, n = 64;
	void *params[] = { &A, &v, &n };

	REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
	REQUIRE(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
	memset(&kp, 0, sizeof(kp));
	kp.func = fill_fn;
	kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
	kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
	kp.kernelParams = params;
	REQUIRE(cuGraphAddKernelNode_v2(&kn, g, NULL, 0, &kp) == CUDA_SUCCESS);
	memset(&mp, 0, sizeof(mp));
	mp.dst = B;
	mp.value = 0x01010101;
	mp.elementSize = 4;
	mp.width = 64;
	mp.height = 1;
	REQUIRE(cuGraphAddMemsetNode(&mn, g, &kn, 1, &mp, ctx) == CUDA_SUCCESS);
	memset(&cp, 0, sizeof(cp));
	cp.srcMemoryType = cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	cp.srcDevice = A;
	cp.dstDevice = B + 1024;
	cp.WidthInBytes = 256;
	cp.Height = cp.Depth = 1;
	REQUIRE(cuGraphAddMemcpyNode(&cn, g, &mn, 1, &cp, ctx) == CUDA_SUCCESS);
	REQUIRE(cuGraphInstantiateWithFlags(&exec, g, 0) == CUDA_SUCCESS);
	expect("graph building");

	for (int i = 0; i < 3; i++)
		ISSUE(graphs, cuGraphLaunch(exec, s));
	ISSUE(graphs, cuGraphLaunch_ptsz(exec, NULL));
	ISSUE(graphs, ((graph_launch_fn)lookup("cuGraphLaunch", CU_GET_PROC_ADDRESS_DEFAULT))(exec, s));
	CHECK_EQ_INT(read_int(B), 0x01010101);
	CHECK_EQ_INT(read_int(B + 1024), 9);
	expect("graph launches");

	CHECK_EQ_INT(cuGraphExecDestroy(exec), CUDA_SUCCESS);
	CHECK_EQ_INT(cuGraphDestroy(g), CUDA_SUCCESS);
	CHECK_EQ_INT(cuStreamDestroy_v2(s), CUDA_SUCCESS);
	expect("graph teardown");
}

static void copies_and_memsets(void)
{
	static unsigned char host[BUF];
	CUDA_MEMCPY2D c2;
	CUDA_MEMCPY3D c3;
	CUstream s;

	REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
	memset(host, 0x11, sizeof(host));
	ISSUE(copies, cuMemcpyHtoD_v2(A, host, 4096));
	ISSUE(copies, cuMemcpyHtoD_v2_ptds(A, host, 4096));
	ISSUE(copies, cuMemcpyDtoH_v2(host, A, 4096));
	ISSUE(copies, cuMemcpyDtoD_v2(B, A, 4096));
	ISSUE(copies, cuMemcpy(B, A, 128));
	ISSUE(copies, cuMemcpy_ptds(B, A, 128));
	ISSUE(copies, cuMemcpyAsync(B, A, 128, s));
	ISSUE(copies, cuMemcpyAsync_ptsz(B, A, 128, NULL));
	ISSUE(copies, cuMemcpyHtoDAsync_v2(A, host, 4096, s));
	ISSUE(copies, cuMemcpyDtoHAsync_v2_ptsz(host, A, 4096, s));
	memset(&c2, 0, sizeof(c2));
	c2.srcMemoryType = c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c2.srcDevice = A;
	c2.dstDevice = B;
	c2.srcPitch = c2.dstPitch = 1024;
	c2.WidthInBytes = 512;
	c2.Height = 4;
	ISSUE(copies, cuMemcpy2D_v2(&c2));
	ISSUE(copies, cuMemcpy2DAsync_v2_ptsz(&c2, s));
	memset(&c3, 0, sizeof(c3));
	c3.srcMemoryType = c3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c3.srcDevice = A;
	c3.dstDevice = B;
	c3.WidthInBytes = 256;
	c3.Height = c3.Depth = 1;
	ISSUE(copies, cuMemcpy3D_v2(&c3));
	ISSUE(copies, ((htod_fn)lookup("cuMemcpyHtoD", CU_GET_PROC_ADDRESS_DEFAULT))(A, host, 64));
	ISSUE(copies, ((dtoh_async_fn)lookup("cuMemcpyDtoHAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(
			      host, A, 64, s));
	expect("copies");

	ISSUE(memsets, cuMemsetD8_v2(A, 0x22, 100));
	ISSUE(memsets, cuMemsetD16_v2_ptds(A, 0x2222, 100));
	ISSUE(memsets, cuMemsetD32_v2(A, 0x22222222, 100));
	ISSUE(memsets, cuMemsetD8Async(A, 0x22, 100, s));
	ISSUE(memsets, cuMemsetD32Async_ptsz(A, 0x22222222, 100, NULL));
	ISSUE(memsets, cuMemsetD2D32_v2(A, 1024, 0x33333333, 16, 4));
	ISSUE(memsets, cuMemsetD2D8Async_ptsz(A, 1024, 0x33, 16, 4, s));
	ISSUE(memsets, ((set32_fn)lookup("cuMemsetD32", CU_GET_PROC_ADDRESS_DEFAULT))(A, 0x44444444, 1));
	ISSUE(memsets, ((set8_async_fn)lookup("cuMemsetD8Async", CU_GET_PROC_ADDRESS_DEFAULT))(A + 4, 0x55, 4, s));
	CHECK_EQ_INT(cuStreamSynchronize(s), CUDA_SUCCESS);
	CHECK_EQ_INT(read_int(A), 0x44444444);
	CHECK_EQ_INT(read_int(A + 4), 0x55555555);
	expect("memsets");
	CHECK_EQ_INT(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

int main(void)
{
	static const size_t fill_sizes[] = { sizeof(void *), sizeof(int), sizeof(int) };
	CUdriverProcAddressQueryResult st;
	struct gpucr_shim_counts c;
	CUmodule mod;
	reg_fn reg;
	void *self;

	ctx = shim_test_start(120);

	/* In the shim's dynamic symbol table, found as ctypes finds it. */
	CHECK(dlsym(RTLD_DEFAULT, "gpucr_shim_counts") == (void *)gpucr_shim_counts);
	self = dlopen(SHIM_LIB, RTLD_NOW | RTLD_NOLOAD);
	CHECK(self != NULL);
	if (self) {
		CHECK(dlsym(self, "gpucr_shim_counts") == (void *)gpucr_shim_counts);
		dlclose(self);
	}
	self = dlopen(getenv("GPUCR_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(self);
	CHECK(dlsym(self, "gpucr_shim_counts") == NULL); /* the driver has none */
	dlclose(self);
	CHECK_EQ_INT(gpucr_shim_counts(NULL, sizeof(c)), -EINVAL);
	/* A caller that knows fewer fields gets those only. */
	memset(&c, 0xee, sizeof(c));
	CHECK_EQ_INT(gpucr_shim_counts(&c, sizeof(c.kernels)), (int)sizeof(c.kernels));
	CHECK_EQ_INT(c.kernels, 0);
	CHECK(c.graphs == 0xeeeeeeeeeeeeeeeeull);
	CHECK_EQ_INT(gpucr_shim_counts(&c, 2 * sizeof(c)), (int)sizeof(c));

	reg = (reg_fn)fakecuda_sym("fakecuda_register_kernel");
	REQUIRE(reg && reg("fill_fn", shim_fill_kernel, 3, fill_sizes) == 0);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fill_fn, mod, "fill_fn") == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&A, BUF) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&B, BUF) == CUDA_SUCCESS);
	/* cudart's way in: the lookup itself, then everything through it. */
	REQUIRE(cuGetProcAddress_v2("cuGetProcAddress", (void **)&gpa, CUDA_VERSION, 0, &st) == CUDA_SUCCESS);
	REQUIRE(gpa);
	expect("start"); /* all zero: setting up counts nothing */

	kernels();
	graphs();
	copies_and_memsets();
	return t_done();
}
