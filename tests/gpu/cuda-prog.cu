// A deterministic CUDA program for checkpoint/restore tests: many buffers,
// several streams with event dependencies between them, integer-only
// kernels (bit-reproducible), a per-step checksum reduced on the GPU.
//
//   cuda-prog --gib G --steps S --out FILE [--buffers N] [--step-ms MS] [--times FILE]
//
// --times appends "K SECONDS" (CLOCK_MONOTONIC) after every step: the bench
// measures the time a checkpoint of the running program costs it.
//
// Appends "step K SUM" to FILE after every step (opened and closed each time,
// so no file is open across a dump). An uninterrupted run and a run that was
// dumped, killed and restored must write identical files.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                          \
	do {                                                                           \
		cudaError_t e_ = (x);                                                  \
		if (e_ != cudaSuccess) {                                               \
			fprintf(stderr, "cuda-prog: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, \
				cudaGetErrorString(e_));                               \
			exit(3);                                                       \
		}                                                                      \
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

__global__ void sum_k(const uint64_t *p, size_t n, unsigned long long *out)
{
	uint64_t s = 0;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		s += p[i] * (i | 1);
	atomicAdd(out, (unsigned long long)s);
}

int main(int argc, char **argv)
{
	double gib = 1;
	int steps = 20, nbuf = 16, step_ms = 100, nstreams = 4;
	const char *out = NULL, *times = NULL;
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
		else {
			fprintf(stderr, "usage: cuda-prog --gib G --steps S --out FILE [--buffers N] [--step-ms MS] [--times FILE]\n");
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

	for (int s = 0; s < nstreams; s++)
		CK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
	for (int b = 0; b < nbuf; b++) {
		CK(cudaMalloc(&buf[b], n * sizeof(uint64_t)));
		init_k<<<1024, 256, 0, st[b % nstreams]>>>(buf[b], n, (uint64_t)b * 1000003);
		CK(cudaEventCreateWithFlags(&ev[b % 64], cudaEventDisableTiming));
	}
	CK(cudaMalloc(&dsum, sizeof(*dsum)));
	CK(cudaDeviceSynchronize());
	unlink(out);
	for (int k = 1; k <= steps; k++) {
		for (int b = 0; b < nbuf; b++)
			step_k<<<1024, 256, 0, st[b % nstreams]>>>(buf[b], n, hsum * 31 + (uint64_t)k);
		for (int b = 0; b < nbuf; b++) {
			CK(cudaEventRecord(ev[b % 64], st[b % nstreams]));
			CK(cudaStreamWaitEvent(st[0], ev[b % 64], 0));
		}
		CK(cudaMemsetAsync(dsum, 0, sizeof(*dsum), st[0]));
		for (int b = 0; b < nbuf; b++)
			sum_k<<<256, 256, 0, st[0]>>>(buf[b], n, dsum);
		CK(cudaMemcpyAsync(&hsum, dsum, sizeof(hsum), cudaMemcpyDeviceToHost, st[0]));
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
		if (step_ms > 0) {
			struct timespec ts = { step_ms / 1000, (step_ms % 1000) * 1000000L };
			nanosleep(&ts, NULL);
		}
	}
	FILE *f = fopen(out, "a");
	if (f) {
		fprintf(f, "done\n");
		fclose(f);
	}
	return 0;
}
