/* Helpers of the driver shim's unit tests: run against the test driver,
 * and look at this process's own mappings. Include after t.h. */
#ifndef GPUCR_SHIMTEST_H
#define GPUCR_SHIMTEST_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

/* Points the shim at the test driver (FAKECUDA_LIB, set by the build),
 * unless the environment names a driver already; skips the test when the
 * test driver is not built. */
static inline void use_fake(void)
{
	if (getenv("GPUCR_REAL_LIBCUDA"))
		return;
	if (access(FAKECUDA_LIB, R_OK) != 0) {
		printf("skip: fake driver %s not built\n", FAKECUDA_LIB);
		exit(T_SKIP);
	}
	setenv("GPUCR_REAL_LIBCUDA", FAKECUDA_LIB, 1);
}

/* Device memory [p, p + n) filled with a pattern of seed, and checked
 * against it (1: the same). */
static inline void fill(CUdeviceptr p, size_t n, unsigned seed)
{
	unsigned char *b = malloc(n);

	REQUIRE(b);
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed + i * 31);
	REQUIRE(cuMemcpyHtoD_v2(p, b, n) == CUDA_SUCCESS);
	free(b);
}

static inline int same(CUdeviceptr p, size_t n, unsigned seed)
{
	unsigned char *b = malloc(n);
	int ok = 1;

	REQUIRE(b);
	if (cuMemcpyDtoH_v2(b, p, n) != CUDA_SUCCESS)
		ok = 0;
	for (size_t i = 0; ok && i < n; i++)
		if (b[i] != (unsigned char)(seed + i * 31))
			ok = 0;
	free(b);
	return ok;
}

/* The start of a test of the shim's internals on the test driver: a time
 * limit, the fake (or a skip), no control thread (GPUCR_DAEMON=0), the
 * driver initialised and device 0's primary context current. */
static inline CUcontext shim_test_start(unsigned int seconds)
{
	CUcontext ctx;
	CUdevice dev;

	alarm(seconds);
	use_fake();
	setenv("GPUCR_DAEMON", "0", 1);
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	return ctx;
}

/* A driver call made on a thread of its own, as an application thread
 * that may wait in the shim's gate: run(job) there, with ctx current. A
 * test's own job struct has it as its first member. */
struct shim_job {
	CUresult (*run)(struct shim_job *);
	CUcontext ctx;
	CUresult r;
	int done;
	pthread_t t;
};

static inline void *shim_job_main(void *arg)
{
	struct shim_job *j = arg;

	REQUIRE(cuCtxSetCurrent(j->ctx) == CUDA_SUCCESS);
	j->r = j->run(j);
	__atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static inline void shim_job_start(struct shim_job *j, CUresult (*run)(struct shim_job *), CUcontext ctx)
{
	j->run = run;
	j->ctx = ctx;
	j->done = 0;
	REQUIRE(pthread_create(&j->t, NULL, shim_job_main, j) == 0);
}

static inline int shim_job_done(const struct shim_job *j)
{
	return __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
}

/* A fake kernel, fill(int *p, int v, int n): p[0 .. n) = v. Registered
 * with three parameters of pointer, int and int size. */
static inline void shim_fill_kernel(void **params, unsigned grid[3], unsigned block[3])
{
	int *p = *(int **)params[0];
	int v = *(int *)params[1], n = *(int *)params[2];

	(void)grid;
	(void)block;
	for (int i = 0; i < n; i++)
		p[i] = v;
}

/* 1 when addr lies in a readable mapping of this process, else 0. */
static inline int readable(CUdeviceptr addr)
{
	FILE *f = fopen("/proc/self/maps", "re");
	unsigned long lo, hi;
	char perms[8], line[512];
	int ret = 0;

	REQUIRE(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && addr >= lo && addr < hi)
			ret = perms[0] == 'r';
	fclose(f);
	return ret;
}

#endif
