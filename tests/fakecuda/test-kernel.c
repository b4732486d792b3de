/* test-kernel: kernels registered as host functions.  Parameter layout
 * through cuFuncGetParamInfo (a by-value struct included), launches with
 * kernelParams and with the CU_LAUNCH_PARAM_BUFFER_POINTER form, the Ex and
 * cooperative launches, modules and libraries, attributes, and the launch
 * error cases. */
#include <errno.h>
#include <string.h>

#include "fakecuda.h"
#include "testutil.h"

struct pair {
	int a;
	double b;
};

struct packed4 {
	int x, y;
};

static unsigned seen_grid[3], seen_block[3];
static int saxpy_version;

/* saxpy(int n, float a, const float *x, float *y) */
static void saxpy(void **params, unsigned grid[3], unsigned block[3])
{
	int n = *(int *)params[0];
	float a = *(float *)params[1];
	const float *x = *(const float **)params[2];
	float *y = *(float **)params[3];

	for (int i = 0; i < n; i++)
		y[i] = a * x[i] + y[i];
	memcpy(seen_grid, grid, sizeof(seen_grid));
	memcpy(seen_block, block, sizeof(seen_block));
	saxpy_version = 1;
}

static void saxpy2(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
	saxpy_version = 2;
}

/* structk(char c, struct pair p, int *out, short s): *out = c + p.a + p.b + s */
static void structk(void **params, unsigned grid[3], unsigned block[3])
{
	char c = *(char *)params[0];
	struct pair p;
	int *out = *(int **)params[2];
	short s = *(short *)params[3];

	(void)grid;
	(void)block;
	memcpy(&p, params[1], sizeof(p)); /* the buffer form need not align it */
	*out = c + p.a + (int)p.b + s;
}

/* packk(int i, struct packed4 v, long *out) */
static void packk(void **params, unsigned grid[3], unsigned block[3])
{
	struct packed4 v;

	(void)grid;
	(void)block;
	memcpy(&v, params[1], sizeof(v));
	**(long **)params[2] = *(int *)params[0] * 100 + v.x * 10 + v.y;
}

static int noargs_runs;

static void noargs(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
	noargs_runs++;
}

static void expect_param(CUfunction f, size_t i, size_t off, size_t size)
{
	size_t o = 99, s = 99;

	CU_OK(cuFuncGetParamInfo(f, i, &o, &s));
	if (o != off || s != size) {
		fprintf(stderr, "param %zu: offset %zu size %zu, expected %zu %zu\n", i, o, s, off, size);
		exit(1);
	}
}

int main(void)
{
	const size_t saxpy_sizes[] = { sizeof(int), sizeof(float), sizeof(void *), sizeof(void *) };
	const size_t struct_sizes[] = { sizeof(char), sizeof(struct pair), sizeof(void *), sizeof(short) };
	const size_t pack_sizes[] = { sizeof(int), sizeof(struct packed4), sizeof(void *) };
	const size_t pack_aligns[] = { 0, _Alignof(struct packed4), 0 };
	CUfunction f, fs, fp, fn, f2;
	CUmodule mod, mod2;
	CUlibrary lib;
	CUkernel k;
	CUcontext ctx;
	CUdevice dev;
	CUdeviceptr dx, dy, dout;
	float x[64], y[64];
	int n = 64, out = 0, attr;
	float a = 2.0f;
	const char *name;

	test_time_limit(60);
	/* Registration works before cuInit, as a test's constructor would do it. */
	CHECK(fakecuda_register_kernel("saxpy", saxpy, 4, saxpy_sizes) == 0);
	CHECK(fakecuda_register_kernel("structk", structk, 4, struct_sizes) == 0);
	CHECK(fakecuda_register_kernel_aligned("packk", packk, 3, pack_sizes, pack_aligns) == 0);
	CHECK(fakecuda_register_kernel("noargs", noargs, 0, NULL) == 0);
	CHECK(fakecuda_register_kernel("bad", NULL, 0, NULL) == -EINVAL);
	CHECK(fakecuda_register_kernel("bad", noargs, 2, NULL) == -EINVAL);

	CU_OK(cuInit(0));
	CU_OK(cuDeviceGet(&dev, 0));
	CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU_OK(cuCtxPushCurrent(ctx));
	CU_EXPECT(cuModuleLoad(&mod, "/nonexistent/kernels.cubin"), CUDA_ERROR_FILE_NOT_FOUND);
	CU_OK(cuModuleLoadData(&mod, "not really a cubin"));
	CU_OK(cuModuleGetFunction(&f, mod, "saxpy"));
	CU_OK(cuModuleGetFunction(&fs, mod, "structk"));
	CU_OK(cuModuleGetFunction(&fp, mod, "packk"));
	CU_OK(cuModuleGetFunction(&fn, mod, "noargs"));
	CU_EXPECT(cuModuleGetFunction(&f2, mod, "nosuchkernel"), CUDA_ERROR_NOT_FOUND);

	/* Layout: natural alignment, as a C struct of the parameters. */
	expect_param(f, 0, 0, 4);
	expect_param(f, 1, 4, 4);
	expect_param(f, 2, 8, 8);
	expect_param(f, 3, 16, 8);
	CU_EXPECT(cuFuncGetParamInfo(f, 4, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_param(fs, 0, 0, 1);
	expect_param(fs, 1, 8, 16);
	expect_param(fs, 2, 24, 8);
	expect_param(fs, 3, 32, 2);
	CU_EXPECT(cuFuncGetParamInfo(fs, 4, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_param(fp, 0, 0, 4);
	expect_param(fp, 1, 4, 8); /* explicit 4-byte alignment */
	expect_param(fp, 2, 16, 8);
	CU_EXPECT(cuFuncGetParamInfo(fn, 0, NULL, NULL), CUDA_ERROR_INVALID_VALUE);

	/* kernelParams launch on device memory. */
	for (int i = 0; i < n; i++) {
		x[i] = (float)i;
		y[i] = 1.0f;
	}
	CU_OK(cuMemAlloc(&dx, sizeof(x)));
	CU_OK(cuMemAlloc(&dy, sizeof(y)));
	CU_OK(cuMemcpyHtoD(dx, x, sizeof(x)));
	CU_OK(cuMemcpyHtoD(dy, y, sizeof(y)));
	{
		void *params[] = { &n, &a, &dx, &dy };

		CU_OK(cuLaunchKernel(f, 2, 3, 4, 32, 2, 1, 0, NULL, params, NULL));
	}
	CHECK(seen_grid[0] == 2 && seen_grid[1] == 3 && seen_grid[2] == 4);
	CHECK(seen_block[0] == 32 && seen_block[1] == 2 && seen_block[2] == 1);
	CU_OK(cuMemcpyDtoH(y, dy, sizeof(y)));
	for (int i = 0; i < n; i++)
		CHECK(y[i] == 2.0f * (float)i + 1.0f);

	/* The packed-buffer form, split by the registered layout. */
	CU_OK(cuMemAlloc(&dout, sizeof(int)));
	{
		_Alignas(8) unsigned char buf[34];
		struct pair p = { 40, 2.0 };
		char c = 7;
		short s = 300;
		size_t size = sizeof(buf);
		void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
				  CU_LAUNCH_PARAM_END };

		memset(buf, 0, sizeof(buf));
		memcpy(buf + 0, &c, sizeof(c));
		memcpy(buf + 8, &p, sizeof(p));
		memcpy(buf + 24, &dout, sizeof(dout));
		memcpy(buf + 32, &s, sizeof(s));
		CU_OK(cuLaunchKernel(fs, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
		CU_OK(cuMemcpyDtoH(&out, dout, sizeof(out)));
		CHECK(out == 7 + 40 + 2 + 300);

		size = 33; /* one byte short of the last parameter */
		CU_EXPECT(cuLaunchKernel(fs, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra), CUDA_ERROR_INVALID_VALUE);
		{
			void *params[] = { &c, &p, &dout, &s };

			CU_EXPECT(cuLaunchKernel(fs, 1, 1, 1, 1, 1, 1, 0, NULL, params, extra), CUDA_ERROR_INVALID_VALUE);
			/* Ex and cooperative launches. */
			CUlaunchConfig cfg;
			CUlaunchAttribute la;

			memset(&cfg, 0, sizeof(cfg));
			memset(&la, 0, sizeof(la));
			la.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
			la.value.cooperative = 1;
			cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
			cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
			cfg.attrs = &la;
			cfg.numAttrs = 1;
			p.a = 1000;
			CU_OK(cuLaunchKernelEx(&cfg, fs, params, NULL));
			CU_OK(cuMemcpyDtoH(&out, dout, sizeof(out)));
			CHECK(out == 7 + 1000 + 2 + 300);
			p.a = 2000;
			CU_OK(cuLaunchCooperativeKernel(fs, 1, 1, 1, 64, 1, 1, 0, NULL, params));
			CU_OK(cuMemcpyDtoH(&out, dout, sizeof(out)));
			CHECK(out == 7 + 2000 + 2 + 300);
		}
	}
	{
		int i = 3;
		struct packed4 v = { 4, 5 };
		long r = 0, *rp = &r;
		void *params[] = { &i, &v, &rp };

		CU_OK(cuLaunchKernel(fp, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
		CHECK(r == 345);
	}

	/* Launch errors. */
	{
		void *params[] = { &n, &a, &dx, &dy };

		CU_EXPECT(cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE);
		CU_EXPECT(cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE);
		CU_EXPECT(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
		CU_EXPECT(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 64 * 1024, NULL, params, NULL), CUDA_ERROR_INVALID_VALUE);
		CU_EXPECT(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_ERROR_INVALID_HANDLE);
		/* Raising the dynamic shared memory limit allows the launch. */
		CU_OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100 * 1024));
		CU_OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 64 * 1024, NULL, params, NULL));
	}
	CU_OK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	CHECK(noargs_runs == 1);

	/* Attributes and names. */
	CU_OK(cuFuncGetAttribute(&attr, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
	CHECK(attr == 1024);
	CU_OK(cuFuncGetAttribute(&attr, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
	CHECK(attr == 100 * 1024);
	CU_OK(cuFuncGetName(&name, f));
	CHECK(strcmp(name, "saxpy") == 0);
	CU_OK(cuFuncGetModule(&mod2, f));
	CHECK(mod2 == mod);

	/* Libraries: a CUkernel is its CUfunction. */
	CU_OK(cuLibraryLoadData(&lib, "not really a fatbin", NULL, NULL, 0, NULL, NULL, 0));
	CU_OK(cuLibraryGetKernel(&k, lib, "saxpy"));
	CU_OK(cuKernelGetFunction(&f2, k));
	CHECK(f2 == f);
	CU_OK(cuKernelGetName(&name, k));
	CHECK(strcmp(name, "saxpy") == 0);
	{
		size_t o, s;

		CU_OK(cuKernelGetParamInfo(k, 3, &o, &s));
		CHECK(o == 16 && s == 8);
	}
	CU_OK(cuLibraryGetModule(&mod2, lib));
	CU_OK(cuModuleGetFunction(&f2, mod2, "structk"));
	CHECK(f2 == fs);
	CU_EXPECT(cuLibraryGetKernel(&k, lib, "nosuchkernel"), CUDA_ERROR_NOT_FOUND);

	/* Re-registering replaces the body; handles stay valid. */
	CHECK(fakecuda_register_kernel("saxpy", saxpy2, 4, saxpy_sizes) == 0);
	{
		void *params[] = { &n, &a, &dx, &dy };

		CU_OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
		CHECK(saxpy_version == 2);
	}

	/* Found through fakecuda_sym too, as behind gpucr's interceptor. */
	CHECK(fakecuda_sym("fakecuda_register_kernel") == (void *)fakecuda_register_kernel);

	CU_OK(cuLibraryUnload(lib));
	CU_OK(cuModuleUnload(mod));
	CU_EXPECT(cuModuleGetFunction(&f2, mod, "saxpy"), CUDA_ERROR_INVALID_HANDLE);
	CU_OK(cuMemFree(dx));
	CU_OK(cuMemFree(dy));
	CU_OK(cuMemFree(dout));
	printf("test-kernel: ok\n");
	return 0;
}
