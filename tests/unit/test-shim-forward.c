/* The shim forwards every driver symbol it does not wrap: calls reach the
 * (fake) driver, the first call may come from many threads at once, a
 * symbol the driver lacks fails loudly with CUDA_ERROR_NOT_FOUND, and a
 * wrapped call leaves errno alone.
 *
 * Linked against $(BUILD)/lib/gpucr/libcuda.so.1; sets GPUCR_REAL_LIBCUDA to
 * the fake before its first CUDA call (the shim loads the driver lazily). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "t.h"
#include "shimtest.h"

#define NTHREADS 8

static pthread_barrier_t barrier;

static void *first_call(void *arg)
{
	int *version = arg;

	pthread_barrier_wait(&barrier);
	if (cuDriverGetVersion(version) != CUDA_SUCCESS)
		*version = -1;
	return NULL;
}

/* Runs fn with fd 2 sent to a file; returns what was written there. */
static char *capture_stderr(CUresult (*fn)(void), CUresult *ret)
{
	static char buf[4096];
	char path[] = "/tmp/gpucr-test-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	ssize_t n;

	REQUIRE(fd >= 0 && saved >= 0);
	unlink(path);
	fflush(stderr);
	dup2(fd, 2);
	*ret = fn();
	dup2(saved, 2);
	close(saved);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
	return buf;
}

int main(void)
{
	static const char *const void_fns[] = { "cuProfilerStart", "cuProfilerStop",
						"cuCtxResetPersistingL2Cache" };
	int versions[NTHREADS];
	pthread_t th[NTHREADS];
	void *fake, *shim_sym;
	CUresult (*missing)(void) = NULL;
	const char *missing_name = NULL;
	CUcontext ctx;
	CUdevice dev;
	CUdeviceptr p;
	Dl_info info;
	char name[256];
	int i, count = 0;

	alarm(60);
	use_fake();

	/* The very first call of the process, from NTHREADS threads at once:
	 * the driver loads once and the trampoline resolves. */
	pthread_barrier_init(&barrier, NULL, NTHREADS);
	for (i = 0; i < NTHREADS; i++)
		REQUIRE(pthread_create(&th[i], NULL, first_call, &versions[i]) == 0);
	for (i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < NTHREADS; i++)
		CHECK(versions[i] > 0);

	/* What we call is the shim, and it loaded the fake privately. */
	REQUIRE(dladdr((void *)cuInit, &info) && info.dli_fname);
	CHECK_CONTAINS(info.dli_fname, "lib/gpucr/libcuda.so.1");
	fake = dlopen(getenv("GPUCR_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(fake);
	CHECK(dlsym(fake, "cuInit") != (void *)cuInit);

	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	CHECK_EQ_INT(cuDeviceGetCount(&count), CUDA_SUCCESS);
	CHECK(count >= 1);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	CHECK_EQ_INT(cuDeviceGetName(name, sizeof(name), dev), CUDA_SUCCESS);
	CHECK(name[0] != '\0');
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	CHECK_EQ_INT(cuCtxSynchronize(), CUDA_SUCCESS);

	/* First calls with five and six arguments (all argument registers) go
	 * through the lazy stub and arrive intact. */
	{
		const size_t w = 40, h = 8, pitch = 256;
		unsigned int row[64];
		CUstream s;

		REQUIRE(cuMemAlloc(&p, pitch * h) == CUDA_SUCCESS);
		REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemsetD2D32(p, pitch, 0xdeadbeefu, w, h), CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemsetD2D32Async(p + 4 * pitch, pitch, 0x01020304u, w / 2, h / 2, s),
			     CUDA_SUCCESS);
		CHECK_EQ_INT(cuStreamSynchronize(s), CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemcpyDtoH(row, p + 3 * pitch, pitch), CUDA_SUCCESS);
		CHECK(row[0] == 0xdeadbeefu && row[w - 1] == 0xdeadbeefu);
		CHECK_EQ_INT(cuMemcpyDtoH(row, p + 7 * pitch, pitch), CUDA_SUCCESS);
		CHECK(row[0] == 0x01020304u && row[w / 2 - 1] == 0x01020304u && row[w / 2] == 0xdeadbeefu);
		CHECK_EQ_INT(cuStreamDestroy(s), CUDA_SUCCESS);
		CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	}

	/* A wrapped call keeps the application's errno. */
	errno = 4321;
	CHECK_EQ_INT(cuMemAlloc(&p, 1000), CUDA_SUCCESS);
	CHECK_EQ_INT(errno, 4321);
	errno = 4321;
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	CHECK_EQ_INT(errno, 4321);

	/* A symbol the fake does not have: CUDA_ERROR_NOT_FOUND, and a message
	 * that names it. */
	for (i = 0; i < (int)(sizeof(void_fns) / sizeof(void_fns[0])); i++) {
		shim_sym = dlsym(RTLD_DEFAULT, void_fns[i]);
		if (shim_sym && !dlsym(fake, void_fns[i])) {
			missing = (CUresult(*)(void))shim_sym;
			missing_name = void_fns[i];
			break;
		}
	}
	if (missing) {
		CUresult r;
		char *msg = capture_stderr(missing, &r);

		CHECK_EQ_INT(r, CUDA_ERROR_NOT_FOUND);
		CHECK_CONTAINS(msg, missing_name);
		/* Second call: same answer, resolved for good. */
		CHECK_EQ_INT(missing(), CUDA_ERROR_NOT_FOUND);
	} else {
		fprintf(stderr, "note: the fake has every candidate symbol; missing-symbol check not run\n");
	}
	return t_done();
}
