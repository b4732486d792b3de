// A deterministic CUDA program for checkpoint/restore tests: many buffers,
// several streams with event dependencies between them, integer-only
// kernels (bit-reproducible), a per-step checksum reduced on the GPU.
//
//   cuda-prog --gib G --steps S --out FILE [--buffers N] [--step-ms MS] [--times FILE] [--escape]
//             [--counts]
//
// --times appends "K SECONDS" (CLOCK_MONOTONIC) after every step: the bench
// measures the time a checkpoint of the running program costs it.
//
// --escape adds two 64 MiB victim buffers and a kernel whose only parameter
// is a small buffer holding their addresses: it updates both victims
// through those pointers, a write no launch decoding can predict. gpucrd
// saves buffers in address order; one victim is allocated first and one
// last, so whichever way the driver hands out addresses, one of them is
// saved late, after the program runs again. The kernel runs ESCAPES_IN_STEP
// times in every step and ESCAPES_IN_SLEEP times spread over the --step-ms
// sleep, so the victims are written all the time a concurrent checkpoint is
// being saved. The victims enter every step's checksum; the number of
// updates per step is fixed, so the output does not depend on timing (nor
// on --step-ms).
//
// Appends "step K SUM" to FILE after every step (opened and closed each time,
// so no file is open across a dump). An uninterrupted run and a run that was
// dumped, killed and restored must write identical files.
//
// --counts prints one line on stdout at exit (nothing else ever goes there):
//
//   CUDAPROG-COUNTS kernels=N copies=N memsets=N shim_kernels=N shim_graphs=N
//                   shim_copies=N shim_memsets=N
//
// kernels, copies, memsets: the kernel launches, cudaMemcpy/cudaMemcpyAsync
// and cudaMemsetAsync calls this program issued; shim_*: what gpucr's shim
// counted (gpucr_shim_counts, gpucr_shim.h) at the same moment, after a
// cudaDeviceSynchronize, or "shim_counts=unavailable" in their place without
// the shim. Under the shim, shim_kernels must equal kernels (every launch
// passed the shim); the runtime may make copies and memsets of its own, so
// shim_copies and shim_memsets may be larger than copies and memsets. The
// counts of a restored process include those before the checkpoint.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpucr_shim.h"

#define CK(x)                                                                          \
	do {                                                                           \
		cudaError_t e_ = (x);                                                  \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "cuda-prog: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
				cudaGetErrorString(e_));                               \
			exit(3);                                                       \
		}                                                                      \
	} while (0)

// What this program issued, for --counts.
static unsigned long long nkernels, ncopies, nmemsets;

// A kernel launch, counted.
#define LAUNCH(k, grid, block, stream, ...)                                            \
	do {                                                                           \
		k<<<grid, block, 0, stream>>>(__VA_ARGS__);                            \
		nkernels++;                                                            \
	} while (0)

__global__ void init_k(uint64_t *p, size_t n, uint64_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
}

// One step on buffer a. key is the previous step's checksum over every
// buffer, so each buffer depends on all the others without two streams ever
// touching the same memory at once.
__global__ void step_k(uint64_t *a, size_t n, uint64_t key)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint64_t x = a[i] ^ (key + i);
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		a[i] = x;
	}
}

#define NVICTIMS 2
#define VICTIM_BYTES (64ull << 20)
#define ESCAPES_IN_STEP 2
#define ESCAPES_IN_SLEEP 5

// The victims' addresses and length, in device memory.
struct holder {
	uint64_t *victim[NVICTIMS];
	size_t n;
};

// Only h is a parameter: the writes go through pointers read from device
// memory. An LCG step per word (odd multiplier: a bijection), so a victim
// saved after more or fewer updates than at the checkpoint changes the sums.
__global__ void escape_k(const struct holder *h)
{
	size_t n = h->n;

	for (int v = 0; v < NVICTIMS; v++) {
		uint64_t *p = h->victim[v];

		for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
		     i += (size_t)gridDim.x * blockDim.x)
			p[i] = p[i] * 6364136223846793005ull + 1442695040888963407ull + i;
	}
}

__global__ void sum_k(const uint64_t *p, size_t n, unsigned long long *out)
{
	uint64_t s = 0;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		s += p[i] * (i | 1);
	atomicAdd(out, (unsigned long long)s);
}

// The loaded objects named libcuda*, to ask each for gpucr_shim_counts.
#define MAX_LIBS 4
struct libs {
	char path[MAX_LIBS][512];
	int n;
};

static int note_lib(struct dl_phdr_info *info, size_t, void *arg)
{
	struct libs *l = (struct libs *)arg;
	const char *base = strrchr(info->dlpi_name, '/');

	base = base ? base + 1 : info->dlpi_name;
	if (!strncmp(base, "libcuda.so", 10) && l->n < MAX_LIBS)
		snprintf(l->path[l->n++], sizeof(l->path[0]), "%s", info->dlpi_name);
	return 0;
}

// gpucr_shim_counts from the global scope or, as the runtime loads
// libcuda.so.1 itself (perhaps RTLD_LOCAL), from any loaded libcuda object
// asked by path (RTLD_NOLOAD: nothing new is loaded). NULL without the shim.
typedef int (*shim_counts_fn)(struct gpucr_shim_counts *, size_t);

static shim_counts_fn find_shim_counts(void)
{
	void *f = dlsym(RTLD_DEFAULT, "gpucr_shim_counts");
	struct libs l;

	if (f)
		return (shim_counts_fn)f;
	l.n = 0;
	dl_iterate_phdr(note_lib, &l); // dlopen only after it returns
	for (int i = 0; !f && i < l.n; i++) {
		void *h = dlopen(l.path[i], RTLD_NOLOAD | RTLD_LAZY);

		if (!h)
			continue;
		f = dlsym(h, "gpucr_shim_counts");
		dlclose(h); // drops the reference NOLOAD took; the object stays loaded
	}
	return (shim_counts_fn)f;
}

static void print_counts(void)
{
	shim_counts_fn fn = find_shim_counts();
	struct gpucr_shim_counts c;

	printf("CUDAPROG-COUNTS kernels=%llu copies=%llu memsets=%llu", nkernels, ncopies, nmemsets);
	memset(&c, 0, sizeof(c));
	if (fn && fn(&c, sizeof(c)) == (int)sizeof(c))
		printf(" shim_kernels=%llu shim_graphs=%llu shim_copies=%llu shim_memsets=%llu\n",
		       (unsigned long long)c.kernels, (unsigned long long)c.graphs,
		       (unsigned long long)c.copies, (unsigned long long)c.memsets);
	else
		printf(" shim_counts=unavailable\n");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	double gib = 1;
	int steps = 20, nbuf = 16, step_ms = 100, nstreams = 4;
	const char *out = NULL, *times = NULL;
	int escape = 0, counts = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--gib") && i + 1 < argc)
			gib = atof(argv[++i]);
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--buffers") && i + 1 < argc)
			nbuf = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--step-ms") && i + 1 < argc)
			step_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out = argv[++i];
		else if (!strcmp(argv[i], "--times") && i + 1 < argc)
			times = argv[++i];
		else if (!strcmp(argv[i], "--escape"))
			escape = 1;
		else if (!strcmp(argv[i], "--counts"))
			counts = 1;
		else {
			fprintf(stderr, "usage: cuda-prog --gib G --steps S --out FILE [--buffers N] [--step-ms MS] [--times FILE] [--escape] [--counts]\n");
			return 2;
		}
	}
	if (!out || nbuf < 2)
		return 2;
	size_t total = (size_t)(gib * (1ull << 30));
	size_t n = total / nbuf / sizeof(uint64_t);
	uint64_t **buf = (uint64_t **)calloc(nbuf, sizeof(*buf));
	cudaStream_t st[4];
	cudaEvent_t ev[64];
	unsigned long long *dsum, hsum = 0;
	struct holder *dholder = NULL;
	uint64_t *victim[NVICTIMS] = { NULL };
	size_t nv = VICTIM_BYTES / sizeof(uint64_t);

	for (int s = 0; s < nstreams; s++)
		CK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
	if (escape)
		CK(cudaMalloc(&victim[0], nv * sizeof(uint64_t)));
	for (int b = 0; b < nbuf; b++) {
		CK(cudaMalloc(&buf[b], n * sizeof(uint64_t)));
		LAUNCH(init_k, 1024, 256, st[b % nstreams], buf[b], n, (uint64_t)b * 1000003);
		CK(cudaEventCreateWithFlags(&ev[b % 64], cudaEventDisableTiming));
	}
	CK(cudaMalloc(&dsum, sizeof(*dsum)));
	if (escape) {
		struct holder h;

		CK(cudaMalloc(&dholder, sizeof(*dholder)));
		CK(cudaMalloc(&victim[NVICTIMS - 1], nv * sizeof(uint64_t)));
		for (int v = 0; v < NVICTIMS; v++) {
			LAUNCH(init_k, 1024, 256, st[0], victim[v], nv, 0xe5ca9eull + (uint64_t)v);
			h.victim[v] = victim[v];
		}
		h.n = nv;
		CK(cudaMemcpy(dholder, &h, sizeof(h), cudaMemcpyHostToDevice));
		ncopies++;
	}
	CK(cudaDeviceSynchronize());
	unlink(out);
	for (int k = 1; k <= steps; k++) {
		// The victims are touched on st[0] only: their updates and sums
		// keep their order.
		if (escape)
			LAUNCH(escape_k, 1024, 256, st[0], dholder);
		for (int b = 0; b < nbuf; b++)
			LAUNCH(step_k, 1024, 256, st[b % nstreams], buf[b], n, hsum * 31 + (uint64_t)k);
		for (int e = 1; escape && e < ESCAPES_IN_STEP; e++)
			LAUNCH(escape_k, 1024, 256, st[0], dholder);
		for (int b = 0; b < nbuf; b++) {
			CK(cudaEventRecord(ev[b % 64], st[b % nstreams]));
			CK(cudaStreamWaitEvent(st[0], ev[b % 64], 0));
		}
		CK(cudaMemsetAsync(dsum, 0, sizeof(*dsum), st[0]));
		nmemsets++;
		for (int b = 0; b < nbuf; b++)
			LAUNCH(sum_k, 256, 256, st[0], buf[b], n, dsum);
		for (int v = 0; escape && v < NVICTIMS; v++)
			LAUNCH(sum_k, 256, 256, st[0], victim[v], nv, dsum);
		CK(cudaMemcpyAsync(&hsum, dsum, sizeof(hsum), cudaMemcpyDeviceToHost, st[0]));
		ncopies++;
		CK(cudaStreamSynchronize(st[0]));
		CK(cudaDeviceSynchronize());
		FILE *f = fopen(out, "a");
		if (!f)
			return 4;
		fprintf(f, "step %d %llu\n", k, hsum);
		fclose(f);
		if (times) {
			struct timespec now;
			FILE *t = fopen(times, "a");

			clock_gettime(CLOCK_MONOTONIC, &now);
			if (t) {
				fprintf(t, "%d %.6f\n", k, now.tv_sec + now.tv_nsec / 1e9);
				fclose(t);
			}
		}
		if (escape) {
			// The sleep in ESCAPES_IN_SLEEP pieces, a write through the
			// holder after each (no waiting for it: the next step's sum
			// follows it on st[0]).
			long us = step_ms > 0 ? step_ms * 1000L / ESCAPES_IN_SLEEP : 0;

			for (int e = 0; e < ESCAPES_IN_SLEEP; e++) {
				if (us > 0) {
					struct timespec ts = { us / 1000000, (us % 1000000) * 1000L };
					nanosleep(&ts, NULL);
				}
				LAUNCH(escape_k, 1024, 256, st[0], dholder);
			}
		} else if (step_ms > 0) {
			struct timespec ts = { step_ms / 1000, (step_ms % 1000) * 1000000L };
			nanosleep(&ts, NULL);
		}
	}
	FILE *f = fopen(out, "a");
	if (f) {
		fprintf(f, "done\n");
		fclose(f);
	}
	if (counts) {
		CK(cudaDeviceSynchronize());
		print_counts();
	}
	return 0;
}
