/* test-driver: the fake's driver-wide surface.  Calls before cuInit, the
 * environment (FAKECUDA_DEVICES, FAKECUDA_MEM_MB, FAKECUDA_FAIL), devices
 * and attributes, context stacks per thread, cuGetProcAddress (versions,
 * unimplemented stubs, unknown names), error names, fault injection and
 * errno preservation. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "fakecuda.h"
#include "testutil.h"

typedef CUresult (*pfn_get_proc_v1)(const char *, void **, int, cuuint64_t);
typedef CUresult (*pfn_noargs)(void);

static void *lib_sym(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);

	if (!p) {
		fprintf(stderr, "symbol %s not exported\n", name);
		exit(1);
	}
	return p;
}

static void expect_proc(const char *symbol, int version, const char *want)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *fn = NULL;

	CU_OK(cuGetProcAddress(symbol, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &st));
	if (fn != lib_sym(want) || st != CU_GET_PROC_ADDRESS_SUCCESS) {
		fprintf(stderr, "cuGetProcAddress(%s, %d) gave %p, expected %s (%p)\n", symbol, version, fn, want,
			lib_sym(want));
		exit(1);
	}
}

static void *other_thread(void *arg)
{
	CUcontext c = (CUcontext)1;

	(void)arg;
	/* Context stacks are per thread: a new thread has none. */
	CU_OK(cuCtxGetCurrent(&c));
	CHECK(c == NULL);
	return NULL;
}

int main(void)
{
	CUdriverProcAddressQueryResult st;
	CUcontext p0, p1, c1, c;
	CUuuid u0, u1;
	CUdevice dev;
	CUdeviceptr d;
	CUstream s;
	char name[64], bus[32];
	const char *str;
	unsigned int flags;
	int n, v, active;
	size_t total;
	void *fn;
	pthread_t thr;

	test_time_limit(30);
	/* Before cuInit only the version, error names and entry points work. */
	CU_EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
	CU_OK(cuDriverGetVersion(&v));
	CHECK(v == 13000);
	CU_OK(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &str));
	CHECK(strcmp(str, "CUDA_ERROR_INVALID_VALUE") == 0);
	CU_OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &str));
	CHECK(str && *str);
	CU_EXPECT(cuGetErrorName((CUresult)12345, &str), CUDA_ERROR_INVALID_VALUE);
	CHECK(str == NULL);

	setenv("FAKECUDA_DEVICES", "2", 1);
	setenv("FAKECUDA_MEM_MB", "1024", 1);
	setenv("FAKECUDA_FAIL", "cuMemAlloc:2:2,cuStreamCreate", 1);
	CU_EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuInit(0));
	CU_OK(cuInit(0));

	/* Devices. */
	CU_OK(cuDeviceGetCount(&n));
	CHECK(n == 2);
	CU_EXPECT(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
	CU_OK(cuDeviceGet(&dev, 1));
	CHECK(dev == 1);
	CU_OK(cuDeviceGetName(name, sizeof(name), 1));
	CHECK(strlen(name) > 0);
	CU_OK(cuDeviceGetUuid(&u0, 0));
	CU_OK(cuDeviceGetUuid(&u1, 1));
	CHECK(memcmp(u0.bytes, u1.bytes, sizeof(u0.bytes)) != 0);
	CHECK(memcmp(u0.bytes, "fakecuda", 8) == 0);
	CU_OK(cuDeviceTotalMem(&total, 1));
	CHECK(total == 1024UL << 20);
	CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
	CHECK(v == 9);
	CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
	CHECK(v == 1);
	CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
	CHECK(v == 1);
	CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1));
	CHECK(v == 1);
	CU_OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
	CHECK(v > 0);
	CU_EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7), CUDA_ERROR_INVALID_DEVICE);
	CU_OK(cuDeviceGetPCIBusId(bus, sizeof(bus), 1));
	CU_OK(cuDeviceGetByPCIBusId(&dev, bus));
	CHECK(dev == 1);

	/* Primary contexts and the context stack. */
	CU_OK(cuDevicePrimaryCtxRetain(&p0, 0));
	CU_OK(cuDevicePrimaryCtxRetain(&p1, 0));
	CHECK(p0 == p1);
	CU_OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
	CHECK(active == 1);
	CU_EXPECT(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
	CU_EXPECT(cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
	CU_OK(cuCtxSetCurrent(p0));
	CU_OK(cuCtxCreate(&c1, NULL, 0, 1)); /* pushed on top */
	CU_OK(cuCtxGetCurrent(&c));
	CHECK(c == c1);
	CU_OK(cuCtxGetDevice(&dev));
	CHECK(dev == 1);
	CHECK(pthread_create(&thr, NULL, other_thread, NULL) == 0);
	CHECK(pthread_join(thr, NULL) == 0);
	CU_OK(cuCtxDestroy(c1)); /* popped with it */
	CU_OK(cuCtxGetCurrent(&c));
	CHECK(c == p0);
	CU_EXPECT(cuCtxDestroy(p0), CUDA_ERROR_INVALID_CONTEXT); /* primary */
	CU_OK(cuCtxPushCurrent(p0));
	CU_OK(cuCtxPopCurrent(&c));
	CHECK(c == p0);
	CU_OK(cuDevicePrimaryCtxRelease(0));
	CU_OK(cuDevicePrimaryCtxRelease(0));
	CU_EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
	CU_OK(cuDevicePrimaryCtxRetain(&p0, 0));

	/* Entry points: the newest ABI the caller's version knows. */
	expect_proc("cuMemAlloc", 13000, "cuMemAlloc_v2");
	expect_proc("cuCtxCreate", 13000, "cuCtxCreate_v4");
	expect_proc("cuCtxCreate", 12000, "cuCtxCreate_v3");
	expect_proc("cuCtxCreate", 3020, "cuCtxCreate_v2");
	expect_proc("cuGetProcAddress", 13000, "cuGetProcAddress_v2");
	expect_proc("cuGetProcAddress", 11030, "cuGetProcAddress");
	expect_proc("cuDeviceGetUuid", 11000, "cuDeviceGetUuid");
	expect_proc("cuLaunchKernel", 13000, "cuLaunchKernel");
	expect_proc("cuStreamGetCtx", 13000, "cuStreamGetCtx"); /* not the unimplemented _v2 */
	expect_proc("cuCheckpointProcessLock", 13000, "cuCheckpointProcessLock");
	/* The v1 entry point, as cudart finds it. */
	fn = NULL;
	CU_OK(((pfn_get_proc_v1)lib_sym("cuGetProcAddress"))("cuMemFree", &fn, 13000, 0));
	CHECK(fn == lib_sym("cuMemFree_v2"));
	/* Declared by cuda.h but not implemented: a stub that says so. */
	CU_OK(cuGetProcAddress("cuTexObjectCreate", &fn, 13000, 0, &st));
	CHECK(fn && st == CU_GET_PROC_ADDRESS_SUCCESS);
	CHECK(((pfn_noargs)fn)() == CUDA_ERROR_NOT_SUPPORTED);
	CU_OK(cuGetProcAddress("cuNoSuchFunction", &fn, 13000, 0, &st));
	CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	CU_EXPECT(cuGetProcAddress("cuMemAlloc", &fn, 14000, 0, &st), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuGetExportTable((const void **)&fn, &u0), CUDA_ERROR_NOT_SUPPORTED);

	/* FAKECUDA_FAIL: the 2nd cuMemAlloc fails with 2, the 1st cuStreamCreate
	 * with CUDA_ERROR_UNKNOWN; each only once. */
	CU_OK(cuCtxSetCurrent(p0));
	CU_OK(cuMemAlloc(&d, 64));
	CU_OK(cuMemFree(d));
	CU_EXPECT(cuMemAlloc(&d, 64), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cuMemAlloc(&d, 64));
	CU_OK(cuMemFree(d));
	CU_EXPECT(cuStreamCreate(&s, 0), CUDA_ERROR_UNKNOWN);
	CU_OK(cuStreamCreate(&s, 0));
	CU_OK(cuStreamDestroy(s));
	/* And from code. */
	CHECK(fakecuda_inject_fault("cuStreamSynchronize", 2, CUDA_ERROR_LAUNCH_FAILED) == 0);
	CU_OK(cuStreamSynchronize(NULL));
	CU_EXPECT(cuStreamSynchronize(NULL), CUDA_ERROR_LAUNCH_FAILED);
	CU_OK(cuStreamSynchronize(NULL));
	CHECK(fakecuda_inject_fault("cuMemFree_v2", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0);
	CHECK(fakecuda_inject_fault("cuMemFree_v2", 0, CUDA_SUCCESS) == 0); /* withdrawn */
	CU_OK(cuMemAlloc(&d, 64));
	CU_OK(cuMemFree(d));
	CHECK(fakecuda_inject_fault("", 1, CUDA_ERROR_UNKNOWN) == -EINVAL);

	/* The fake leaves errno alone, failing or not. */
	errno = 4242;
	CU_OK(cuDeviceGetCount(&n));
	CHECK(errno == 4242);
	CU_EXPECT(cuMemFree(12345), CUDA_ERROR_INVALID_VALUE);
	CHECK(errno == 4242);
	CU_OK(cuMemAlloc(&d, 1 << 20));
	CHECK(errno == 4242);
	CU_OK(cuMemFree(d));

	CU_OK(cuDevicePrimaryCtxRelease(0));
	printf("test-driver: ok\n");
	return 0;
}
