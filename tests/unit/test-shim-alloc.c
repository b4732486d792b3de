/* Device allocation through the shim becomes exportable VMM memory: large
 * requests get their own region, small ones 256-byte aligned pieces of a
 * slab; the address range and pointer attributes answer as for the original
 * allocation; frees (synchronous and stream-ordered) give memory back; a
 * VMM failure falls back to the driver's allocator; managed memory passes
 * through; threads allocating at once each get their own memory.
 *
 * Linked against the shim; sets GPUCR_REAL_LIBCUDA to the fake. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"
#include "t.h"
#include "shimtest.h"

#define NSMALL 200
#define MIB (1UL << 20)

static CUcontext ctx_main;

static void ctx_init(void)
{
	CUdevice dev;

	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx_main, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx_main) == CUDA_SUCCESS);
}

/* VMM memory has an allocation handle, exportable as a POSIX fd. */
static int is_vmm(CUdeviceptr p)
{
	CUmemGenericAllocationHandle h;
	int fd = -1, ok;

	if (cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)p) != CUDA_SUCCESS)
		return 0;
	ok = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
		     CUDA_SUCCESS &&
	     fd >= 0;
	if (fd >= 0)
		close(fd);
	cuMemRelease(h);
	return ok;
}

static void check_range(CUdeviceptr p, size_t size)
{
	CUdeviceptr base = 0, start = 0;
	size_t got = 0, rsize = 0;

	CHECK_EQ_INT(cuMemGetAddressRange(&base, &got, p + size / 2), CUDA_SUCCESS);
	CHECK_EQ_INT(base, p);
	CHECK_EQ_INT(got, size);
	CHECK_EQ_INT(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + size - 1),
		     CUDA_SUCCESS);
	CHECK_EQ_INT(start, p);
	CHECK_EQ_INT(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p), CUDA_SUCCESS);
	CHECK_EQ_INT(rsize, size);
}

static void test_large(void)
{
	CUdeviceptr p;
	size_t size = 5 * MIB + 3;

	REQUIRE(cuMemAlloc(&p, size) == CUDA_SUCCESS);
	CHECK(p % 256 == 0);
	CHECK(is_vmm(p));
	check_range(p, size);
	CHECK_EQ_INT(cuMemsetD8(p, 0xab, size), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(p + 1), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	CHECK(cuMemFree(p) != CUDA_SUCCESS);
}

static void test_small(void)
{
	static CUdeviceptr p[NSMALL];
	static size_t sz[NSMALL];
	unsigned long long id0 = 0, id1 = 0;
	unsigned char *buf = malloc(MIB);
	CUpointer_attribute attrs[2] = { CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
					 CU_POINTER_ATTRIBUTE_RANGE_SIZE };
	CUdeviceptr start = 0;
	size_t rsize = 0;
	void *data[2] = { &start, &rsize };
	int i, j, bad = 0;

	REQUIRE(buf);
	for (i = 0; i < NSMALL; i++) {
		sz[i] = 1 + (size_t)(i * 7919) % 20000;
		REQUIRE(cuMemAlloc(&p[i], sz[i]) == CUDA_SUCCESS);
		CHECK(p[i] % 256 == 0);
		CHECK_EQ_INT(cuMemsetD8(p[i], (unsigned char)i, sz[i]), CUDA_SUCCESS);
	}
	/* Pieces of shared slabs: VMM memory, neighbours within one 2 MiB slab. */
	CHECK(is_vmm(p[0]));
	CHECK(is_vmm(p[NSMALL - 1]));
	CHECK(p[1] > p[0] ? p[1] - p[0] < 2 * MIB : p[0] - p[1] < 2 * MIB);
	for (i = 0; i < NSMALL; i++)
		for (j = i + 1; j < NSMALL; j++)
			if (p[i] < p[j] + sz[j] && p[j] < p[i] + sz[i])
				bad++;
	CHECK_EQ_INT(bad, 0);
	/* Each answers for itself, contents intact. */
	for (i = 0; i < NSMALL; i++) {
		check_range(p[i], sz[i]);
		CHECK_EQ_INT(cuMemcpyDtoH(buf, p[i], sz[i]), CUDA_SUCCESS);
		for (j = 0; j < (int)sz[i]; j++)
			if (buf[j] != (unsigned char)i)
				bad++;
	}
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(cuPointerGetAttributes(2, attrs, data, p[3] + 1), CUDA_SUCCESS);
	CHECK_EQ_INT(start, p[3]);
	CHECK_EQ_INT(rsize, sz[3]);
	CHECK_EQ_INT(cuPointerGetAttribute(&id0, CU_POINTER_ATTRIBUTE_BUFFER_ID, p[0]), CUDA_SUCCESS);
	CHECK_EQ_INT(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p[1]), CUDA_SUCCESS);
	CHECK(id0 != id1);

	/* Free every other one, reallocate: still aligned and disjoint. */
	for (i = 0; i < NSMALL; i += 2)
		CHECK_EQ_INT(cuMemFree(p[i]), CUDA_SUCCESS);
	for (i = 0; i < NSMALL; i += 2) {
		REQUIRE(cuMemAlloc(&p[i], sz[i]) == CUDA_SUCCESS);
		CHECK(p[i] % 256 == 0);
	}
	for (i = 0; i < NSMALL; i++)
		for (j = i + 1; j < NSMALL; j++)
			if (p[i] < p[j] + sz[j] && p[j] < p[i] + sz[i])
				bad++;
	CHECK_EQ_INT(bad, 0);
	for (i = 1; i < NSMALL; i += 2) {
		CHECK_EQ_INT(cuMemcpyDtoH(buf, p[i], sz[i]), CUDA_SUCCESS);
		for (j = 0; j < (int)sz[i]; j++)
			if (buf[j] != (unsigned char)i)
				bad++;
	}
	CHECK_EQ_INT(bad, 0);
	for (i = 0; i < NSMALL; i++)
		CHECK_EQ_INT(cuMemFree(p[i]), CUDA_SUCCESS);
	free(buf);
}

static void test_pitch(void)
{
	CUdeviceptr p;
	size_t pitch = 0;

	REQUIRE(cuMemAllocPitch(&p, &pitch, 100, 10, 4) == CUDA_SUCCESS);
	CHECK(pitch >= 100 && pitch % 256 == 0);
	check_range(p, pitch * 10);
	CHECK(is_vmm(p));
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	CHECK(cuMemAllocPitch(&p, &pitch, 100, 10, 3) != CUDA_SUCCESS);
}

static void test_async(void)
{
	size_t free0, free1, free2, total;
	CUdeviceptr p, q;
	CUstream s;

	REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	REQUIRE(cuMemGetInfo(&free0, &total) == CUDA_SUCCESS);
	REQUIRE(cuMemAllocAsync(&p, 8 * MIB, s) == CUDA_SUCCESS);
	CHECK(is_vmm(p));
	check_range(p, 8 * MIB);
	CHECK_EQ_INT(cuMemsetD32Async(p, 0x12345678, 2 * MIB, s), CUDA_SUCCESS);
	REQUIRE(cuMemGetInfo(&free1, &total) == CUDA_SUCCESS);
	CHECK(free1 + 8 * MIB <= free0);
	CHECK_EQ_INT(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	CHECK_EQ_INT(cuStreamSynchronize(s), CUDA_SUCCESS);
	/* The free completes on the stream; the next allocation call reaps it. */
	REQUIRE(cuMemAlloc(&q, 1000) == CUDA_SUCCESS);
	REQUIRE(cuMemGetInfo(&free2, &total) == CUDA_SUCCESS);
	CHECK(free2 + 2 * MIB >= free0); /* at most the slab behind q is missing */
	CHECK_EQ_INT(cuMemFree(q), CUDA_SUCCESS);
	/* Small stream-ordered allocations come from slabs as well. */
	REQUIRE(cuMemAllocAsync(&p, 300, s) == CUDA_SUCCESS);
	CHECK(p % 256 == 0);
	check_range(p, 300);
	CHECK_EQ_INT(cuMemFreeAsync(p + 256, s), CUDA_ERROR_INVALID_VALUE);
	CHECK_EQ_INT(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	CHECK_EQ_INT(cuStreamSynchronize(s), CUDA_SUCCESS);
	CHECK_EQ_INT(cuStreamDestroy(s), CUDA_SUCCESS);
}

static void test_managed(void)
{
	CUdeviceptr p;

	REQUIRE(cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
	CHECK(!is_vmm(p));
	CHECK_EQ_INT(cuMemsetD8(p, 1, 4096), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
}

/* cuMemCreate failing for a reason other than memory: the driver allocates
 * instead, from then on; running out of memory once: one retry. */
static void test_fallback(void)
{
	int (*inject)(const char *, unsigned, CUresult) =
		(int (*)(const char *, unsigned, CUresult))fakecuda_sym("fakecuda_inject_fault");
	CUdeviceptr p;

	if (!inject) {
		fprintf(stderr, "note: fakecuda_inject_fault not found; fallback not tested\n");
		return;
	}
	REQUIRE(inject("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
	REQUIRE(cuMemAlloc(&p, 4 * MIB) == CUDA_SUCCESS);
	CHECK(is_vmm(p));
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);

	REQUIRE(inject("cuMemCreate", 1, CUDA_ERROR_NOT_SUPPORTED) == 0);
	REQUIRE(cuMemAlloc(&p, 4 * MIB) == CUDA_SUCCESS);
	CHECK(!is_vmm(p));
	check_range(p, 4 * MIB);
	CHECK_EQ_INT(cuMemsetD8(p, 7, 4 * MIB), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	/* Small ones too, now that the device is off VMM. */
	REQUIRE(cuMemAlloc(&p, 64) == CUDA_SUCCESS);
	CHECK(!is_vmm(p));
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
}

/* Threads allocating and freeing at once: every buffer stays its own. */
#define NTHREADS 4
#define ROUNDS 300

static void *churn(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg, *bad = malloc(sizeof(*bad));
	CUdeviceptr p[8] = { 0 };
	size_t sz[8] = { 0 };
	unsigned char buf[4096];

	*bad = 0;
	if (cuCtxSetCurrent(ctx_main) != CUDA_SUCCESS) {
		*bad = 1;
		return bad;
	}
	for (int r = 0; r < ROUNDS; r++) {
		int k = rand_r(&seed) % 8;

		if (p[k]) {
			if (cuMemcpyDtoH(buf, p[k], sz[k]) != CUDA_SUCCESS)
				(*bad)++;
			for (size_t j = 0; j < sz[k]; j++)
				if (buf[j] != (unsigned char)(p[k] >> 8))
					(*bad)++;
			if (cuMemFree(p[k]) != CUDA_SUCCESS)
				(*bad)++;
			p[k] = 0;
		} else {
			sz[k] = 1 + rand_r(&seed) % sizeof(buf);
			if (cuMemAlloc(&p[k], sz[k]) != CUDA_SUCCESS ||
			    cuMemsetD8(p[k], (unsigned char)(p[k] >> 8), sz[k]) != CUDA_SUCCESS)
				(*bad)++;
		}
	}
	for (int k = 0; k < 8; k++)
		if (p[k] && cuMemFree(p[k]) != CUDA_SUCCESS)
			(*bad)++;
	return bad;
}

static void test_threads(void)
{
	pthread_t th[NTHREADS];
	void *ret;
	int i;

	for (i = 0; i < NTHREADS; i++)
		REQUIRE(pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(i + 1)) == 0);
	for (i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], &ret);
		CHECK_EQ_INT(*(unsigned int *)ret, 0);
		free(ret);
	}
}

/* GPUCR_VMM=0: everything is the driver's, and still works. */
static int child_no_vmm(void)
{
	CUdeviceptr p;

	setenv("GPUCR_VMM", "0", 1);
	ctx_init();
	REQUIRE(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
	CHECK(!is_vmm(p));
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	return t_done();
}

int main(void)
{
	int status;
	pid_t pid;

	alarm(60);
	use_fake();

	/* Before this process makes its first CUDA call. */
	pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0)
		_exit(child_no_vmm());
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	ctx_init();
	test_large();
	test_small();
	test_pitch();
	test_async();
	test_managed();
	test_threads();
	test_fallback();
	return t_done();
}
