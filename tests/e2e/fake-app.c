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
 * FAKE_APP_ESCAPE=1 adds, before every launch, a kernel whose only parameter
 * is a small buffer holding the address of another buffer (32 MiB, written
 * by nothing else), which it writes through that pointer: a write no launch
 * decoding can predict.
 *
 * FAKE_APP_VMM=1 takes the large buffers (and the escape case's) from the
 * driver's VMM calls, as PyTorch's expandable segments do: one address
 * reservation, grown by creating granule-sized physical handles, mapping
 * them at its end and granting access to what was mapped. gpucr's shim
 * passes those calls through without tracking them, so that memory is
 * carried only by the driver's own checkpoint. FAKE_APP_VMM=2 takes every
 * buffer from it (the small ones sub-allocated in the segment, as a caching
 * allocator does): no cuMemAlloc at all. FAKE_APP_VMM_HOLD=1 keeps the
 * handles (PyTorch keeps them to unmap later) instead of releasing each once
 * mapped. At the end, before "done", the segment is taken down: with the
 * handles held, each one's mapping is first checked (retained from its
 * address, the same handle comes back), unmapped and mapped again with the
 * handle it was created with (its contents unchanged), so that a run
 * restored in between proves its old handles still work; then everything
 * is unmapped and released and the reservation freed. Any failure exits
 * without "done". The output is the same in every mode. */
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

/* An expandable segment: [base, base + mapped) is mapped read-write in
 * handles of gran bytes, [base, base + used) handed out. */
struct seg {
	CUdeviceptr base;
	size_t size, mapped, used, gran;
	CUdevice dev;
	CUmemAllocationProp prop;        /* of every granule */
	CUmemGenericAllocationHandle *h; /* per granule, with FAKE_APP_VMM_HOLD */
};

static void seg_init(struct seg *s, CUdevice dev, size_t size)
{
	memset(&s->prop, 0, sizeof(s->prop));
	s->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	s->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	s->prop.location.id = dev;
	CK(cuMemGetAllocationGranularity(&s->gran, &s->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	s->size = (size + s->gran - 1) / s->gran * s->gran;
	s->dev = dev;
	s->mapped = s->used = 0;
	s->h = NULL;
	if (getenv("FAKE_APP_VMM_HOLD") && atoi(getenv("FAKE_APP_VMM_HOLD")))
		s->h = calloc(s->size / s->gran, sizeof(*s->h));
	CK(cuMemAddressReserve(&s->base, s->size, 0, 0, 0));
}

static void seg_access(struct seg *s, CUdeviceptr at, size_t n)
{
	CUmemAccessDesc acc = { 0 };

	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = s->dev;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CK(cuMemSetAccess(at, n, &acc, 1));
}

static void seg_fini(struct seg *s)
{
	unsigned char *a = malloc(s->gran), *b = malloc(s->gran);
	size_t g;

	if (!a || !b)
		exit(3);
	for (g = 0; s->h && g < s->mapped / s->gran; g++) {
		CUdeviceptr at = s->base + g * s->gran;
		CUmemGenericAllocationHandle r = 0;
		CUmemAllocationProp prop;

		CK(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(at + 4096)));
		if (r != s->h[g]) {
			fprintf(stderr, "fake-app: granule %zu: retained handle %#llx, created %#llx\n", g, r, s->h[g]);
			exit(3);
		}
		CK(cuMemRelease(r));
		CK(cuMemGetAllocationPropertiesFromHandle(&prop, s->h[g]));
		CK(cuMemcpyDtoH(a, at, s->gran));
		CK(cuMemUnmap(at, s->gran));
		CK(cuMemMap(at, s->gran, 0, s->h[g], 0));
		seg_access(s, at, s->gran);
		CK(cuMemcpyDtoH(b, at, s->gran));
		if (memcmp(a, b, s->gran)) {
			fprintf(stderr, "fake-app: granule %zu: contents changed when mapped again\n", g);
			exit(3);
		}
	}
	if (s->mapped)
		CK(cuMemUnmap(s->base, s->mapped));
	for (g = 0; s->h && g < s->mapped / s->gran; g++)
		CK(cuMemRelease(s->h[g]));
	CK(cuMemAddressFree(s->base, s->size));
	free(a);
	free(b);
	free(s->h);
}

/* bytes from the segment, 512-byte aligned, mapping more of it as needed. */
static CUdeviceptr seg_alloc(struct seg *s, size_t bytes)
{
	size_t at = (s->used + 511) & ~(size_t)511, start = s->mapped;

	if (at + bytes > s->size) {
		fprintf(stderr, "fake-app: segment of %zu bytes full\n", s->size);
		exit(3);
	}
	while (s->mapped < at + bytes) {
		CUmemGenericAllocationHandle h;

		CK(cuMemCreate(&h, s->gran, &s->prop, 0));
		CK(cuMemMap(s->base + s->mapped, s->gran, 0, h, 0));
		/* The mapping keeps the memory; PyTorch keeps the handle to
		 * unmap later, the app needs it only when told to hold it. */
		if (s->h)
			s->h[s->mapped / s->gran] = h;
		else
			CK(cuMemRelease(h));
		s->mapped += s->gran;
	}
	if (s->mapped > start)
		seg_access(s, s->base + start, s->mapped - start);
	s->used = at + bytes;
	return s->base + at;
}

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

/* Writes, every 512th word, the buffer whose address the parameter's
 * buffer holds: holder = { words, address }. */
static void escape_kernel(void **params, unsigned grid[3], unsigned block[3])
{
	const uint64_t *holder = *(const uint64_t **)params[0];
	uint64_t *p = (uint64_t *)(uintptr_t)holder[1];
	size_t n = (size_t)holder[0], i;

	(void)grid;
	(void)block;
	for (i = 0; i < n; i += 512)
		p[i] ^= (p[i] >> 7) + 0x9e3779b97f4a7c15ull;
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
	CUdeviceptr holder = 0, victim = 0;
	size_t vicn = (size_t)32 << 17; /* 32 MiB of u64 */
	uint64_t *vhost = NULL;
	const char *times = NULL;
	int escape = getenv("FAKE_APP_ESCAPE") && atoi(getenv("FAKE_APP_ESCAPE"));
	int vmm = getenv("FAKE_APP_VMM") ? atoi(getenv("FAKE_APP_VMM")) : 0;
	struct seg seg;
	CUmodule mod;
	CUdevice dev;
	CUcontext ctx;

	/* "--times FILE" anywhere: "K SECONDS" (monotonic) after every step */
	for (k = 1; k + 1 < argc; k++)
		if (!strcmp(argv[k], "--times")) {
			times = argv[k + 1];
			memmove(&argv[k], &argv[k + 2], (size_t)(argc - k - 1) * sizeof(*argv));
			argc -= 2;
			break;
		}
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
	if (escape)
		vhost = malloc(vicn * 8);
	if (vmm)
		seg_init(&seg, dev, (size_t)1 << 30);
	for (b = 0; b < nbig; b++) {
		size_t i;

		if (vmm)
			big[b] = seg_alloc(&seg, bign * 8);
		else
			CK(cuMemAlloc(&big[b], bign * 8));
		for (i = 0; i < bign; i++)
			host[i] = i * 31 + (uint64_t)b;
		CK(cuMemcpyHtoD(big[b], host, bign * 8));
	}
	for (b = 0; b < nsmall; b++) {
		if (vmm >= 2)
			small[b] = seg_alloc(&seg, smalln * 8);
		else
			CK(cuMemAlloc(&small[b], smalln * 8));
		CK(cuMemsetD32(small[b], (unsigned)b + 1, smalln * 2));
	}
	if (escape) {
		/* A buffer only that kernel writes, big enough that saving it
		 * takes a while: no decoded call ever asks for it first. */
		uint64_t h[2] = { vicn, 0 };
		size_t i;

		if (vmm)
			victim = seg_alloc(&seg, vicn * 8);
		else
			CK(cuMemAlloc(&victim, vicn * 8));
		for (i = 0; i < vicn; i++)
			vhost[i] = i * 7 + 1;
		CK(cuMemcpyHtoD(victim, vhost, vicn * 8));
		h[1] = (uint64_t)victim;

		if (vmm >= 2)
			holder = seg_alloc(&seg, sizeof(h));
		else
			CK(cuMemAlloc(&holder, sizeof(h)));
		CK(cuMemcpyHtoD(holder, h, sizeof(h)));
	}
	unlink(argv[1]);
	for (k = 1; k <= steps; k++) {
		uint64_t sum = 0, step = (uint64_t)k;
		size_t i;
		FILE *f;

		for (b = 0; b < nbig + nsmall; b++) {
			CUdeviceptr p = b < nbig ? big[b] : small[b - nbig];
			size_t n = b < nbig ? bign : smalln;
			void *args[3] = { &p, &n, &step };

			if (escape) {
				void *eargs[1] = { &holder };

				CK(cuLaunchKernel(efn, 1, 1, 1, 1, 1, 1, 0, NULL, eargs, NULL));
			}

			CK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
		}
		CK(cuCtxSynchronize());
		for (b = 0; b < nbig; b++) {
			CK(cuMemcpyDtoH(host, big[b], bign * 8));
			for (i = 0; i < bign; i++)
				sum += host[i] * (i | 1);
		}
		if (escape) {
			CK(cuMemcpyDtoH(vhost, victim, vicn * 8));
			for (i = 0; i < vicn; i++)
				sum += vhost[i] * (i | 1);
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
		if (times) {
			struct timespec now;

			clock_gettime(CLOCK_MONOTONIC, &now);
			f = fopen(times, "a");
			if (f) {
				fprintf(f, "%d %.6f\n", k, now.tv_sec + now.tv_nsec / 1e9);
				fclose(f);
			}
		}
		nanosleep(&ts, NULL);
	}
	if (vmm)
		seg_fini(&seg);
	{
		FILE *f = fopen(argv[1], "a");

		if (f) {
			fprintf(f, "done\n");
			fclose(f);
		}
	}
	free(host);
	free(vhost);
	if (children)
		kill(0, SIGTERM);
	return 0;
}
