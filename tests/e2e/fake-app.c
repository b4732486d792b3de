/* A CUDA application for end-to-end C/R tests on the test driver: several
 * cuMemAlloc buffers (large ones and many small sub-allocated ones), a
 * "kernel" (a host function registered with the test driver) launched on
 * each every step, and a checksum read back with cuMemcpyDtoH.
 *
 *   fake-app OUT STEPS [MIB] [CHILDREN]
 *
 * Appends "step K SUM" to OUT every step (20 ms apart), "done" at the end.
 * With CHILDREN > 0 it forks that many plain (non-CUDA) worker children
 * first, which just sleep, like a dataloader's workers. A run that was
 * dumped, killed and restored must write the same file as one that was not.
 *
 * FAKE_APP_ESCAPE=1 adds, first in every step, a kernel whose only parameter
 * is a small buffer holding the addresses of the big buffers, which it
 * writes through those pointers: writes no launch decoding can predict. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"

#define CK(x)                                                                           \
	do {                                                                            \
		CUresult r_ = (x);                                                      \
		if (r_ != CUDA_SUCCESS) {                                               \
			fprintf(stderr, "fake-app: %s:%d: %s = %d\n", __FILE__, __LINE__, #x, (int)r_); \
			exit(3);                                                        \
		}                                                                       \
	} while (0)

static void step_kernel(void **params, unsigned grid[3], unsigned block[3])
{
	uint64_t *p = *(uint64_t **)params[0];
	size_t n = *(size_t *)params[1], i;
	uint64_t step = *(uint64_t *)params[2];

	(void)grid;
	(void)block;
	for (i = 0; i < n; i++)
		p[i] = p[i] * 6364136223846793005ull + step + i;
}

/* Writes the buffers whose addresses the parameter's buffer holds:
 * holder = { count, words, address... }. */
static void escape_kernel(void **params, unsigned grid[3], unsigned block[3])
{
	const uint64_t *holder = *(const uint64_t **)params[0];
	size_t n = (size_t)holder[1], i, k;

	(void)grid;
	(void)block;
	for (k = 0; k < holder[0]; k++) {
		uint64_t *p = (uint64_t *)(uintptr_t)holder[2 + k];

		for (i = 0; i < n; i++)
			p[i] ^= (p[i] >> 7) + 0x9e3779b97f4a7c15ull;
	}
}

int main(int argc, char **argv)
{
	int (*reg)(const char *, fakecuda_kernel_fn, int, const size_t *);
	const size_t psz[3] = { sizeof(void *), sizeof(size_t), sizeof(uint64_t) };
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	int steps, mib, children, nbig = 3, nsmall = 40, b, k;
	CUdeviceptr big[3], small[40];
	size_t bign, smalln = 1000;
	uint64_t *host;
	CUfunction fn, efn = NULL;
	CUdeviceptr holder = 0;
	int escape = getenv("FAKE_APP_ESCAPE") && atoi(getenv("FAKE_APP_ESCAPE"));
	CUmodule mod;
	CUdevice dev;
	CUcontext ctx;

	if (argc < 3)
		return 2;
	steps = atoi(argv[2]);
	mib = argc > 3 ? atoi(argv[3]) : 4;
	children = argc > 4 ? atoi(argv[4]) : 0;
	for (k = 0; k < children; k++)
		if (fork() == 0) {
			for (;;)
				pause();
		}
	bign = (size_t)mib << 17; /* u64 words */
	CK(cuInit(0));
	reg = (int (*)(const char *, fakecuda_kernel_fn, int, const size_t *))fakecuda_sym("fakecuda_register_kernel");
	if (!reg) {
		fprintf(stderr, "fake-app: not running on the test driver\n");
		return 77;
	}
	reg("step", step_kernel, 3, psz);
	reg("escape", escape_kernel, 1, psz);
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuModuleLoadData(&mod, "fake"));
	CK(cuModuleGetFunction(&fn, mod, "step"));
	CK(cuModuleGetFunction(&efn, mod, "escape"));
	host = malloc(bign * 8);
	for (b = 0; b < nbig; b++) {
		size_t i;

		CK(cuMemAlloc(&big[b], bign * 8));
		for (i = 0; i < bign; i++)
			host[i] = i * 31 + (uint64_t)b;
		CK(cuMemcpyHtoD(big[b], host, bign * 8));
	}
	for (b = 0; b < nsmall; b++) {
		CK(cuMemAlloc(&small[b], smalln * 8));
		CK(cuMemsetD32(small[b], (unsigned)b + 1, smalln * 2));
	}
	if (escape) {
		uint64_t h[2 + 3] = { (uint64_t)nbig, bign / 2 };

		for (b = 0; b < nbig; b++)
			h[2 + b] = (uint64_t)big[b];

		CK(cuMemAlloc(&holder, sizeof(h)));
		CK(cuMemcpyHtoD(holder, h, sizeof(h)));
	}
	unlink(argv[1]);
	for (k = 1; k <= steps; k++) {
		uint64_t sum = 0, step = (uint64_t)k;
		size_t i;
		FILE *f;

		if (escape) {
			void *args[1] = { &holder };

			CK(cuLaunchKernel(efn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
		}
		for (b = 0; b < nbig + nsmall; b++) {
			CUdeviceptr p = b < nbig ? big[b] : small[b - nbig];
			size_t n = b < nbig ? bign : smalln;
			void *args[3] = { &p, &n, &step };

			CK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
		}
		CK(cuCtxSynchronize());
		for (b = 0; b < nbig; b++) {
			CK(cuMemcpyDtoH(host, big[b], bign * 8));
			for (i = 0; i < bign; i++)
				sum += host[i] * (i | 1);
		}
		for (b = 0; b < nsmall; b++) {
			CK(cuMemcpyDtoH(host, small[b], smalln * 8));
			for (i = 0; i < smalln; i++)
				sum ^= host[i] + (uint64_t)b;
		}
		f = fopen(argv[1], "a");
		if (!f)
			return 4;
		fprintf(f, "step %d %llu\n", k, (unsigned long long)sum);
		fclose(f);
		nanosleep(&ts, NULL);
	}
	{
		FILE *f = fopen(argv[1], "a");

		if (f) {
			fprintf(f, "done\n");
			fclose(f);
		}
	}
	free(host);
	if (children)
		kill(0, SIGTERM);
	return 0;
}
