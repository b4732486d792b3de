/* experiment: GPU <-> tmpfs files through cuMemHostRegister on the file mapping */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <linux/falloc.h>

#define CK(x) do { CUresult e_ = (x); if (e_) { const char *s; cuGetErrorName(e_, &s); fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s); exit(1);} } while (0)
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static CUcontext ctx; static CUdeviceptr dbuf; static size_t total, per; static int T; static const char *dir;
static int mode; /* 0 fallocate, 1 populate-write, 2 none */
static int regflags;
static double ph[8][64];
static pthread_barrier_t bar;
static int writing;
static void *th(void *a) {
	int i = (int)(long)a; char path[512]; double t0;
	CK(cuCtxSetCurrent(ctx));
	CUstream st; CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	snprintf(path, sizeof path, "%s/f.%d", dir, i);
	int fd = open(path, writing ? O_RDWR|O_CREAT|O_TRUNC : O_RDWR, 0600);
	if (fd < 0) { perror(path); exit(1); }
	pthread_barrier_wait(&bar);
	t0 = now();
	if (writing) {
		if (mode == 0) { if (fallocate(fd, 0, 0, per)) { perror("fallocate"); exit(1);} }
		else if (ftruncate(fd, per)) { perror("ftruncate"); exit(1);}
	}
	ph[0][i] = now() - t0; t0 = now();
	void *p = mmap(NULL, per, PROT_READ|PROT_WRITE, MAP_SHARED | (mode==1 && writing ? MAP_POPULATE : 0), fd, 0);
	if (p == MAP_FAILED) { perror("mmap"); exit(1);}
	ph[1][i] = now() - t0; t0 = now();
	CK(cuMemHostRegister(p, per, regflags));
	ph[2][i] = now() - t0; t0 = now();
	size_t piece = 64u<<20;
	for (size_t o = 0; o < per; o += piece) {
		size_t n = per - o < piece ? per - o : piece;
		if (writing) CK(cuMemcpyDtoHAsync((char*)p + o, dbuf + i*per + o, n, st));
		else CK(cuMemcpyHtoDAsync(dbuf + i*per + o, (char*)p + o, n, st));
	}
	CK(cuStreamSynchronize(st));
	ph[3][i] = now() - t0; t0 = now();
	CK(cuMemHostUnregister(p));
	ph[4][i] = now() - t0; t0 = now();
	munmap(p, per); close(fd);
	ph[5][i] = now() - t0;
	cuStreamDestroy(st);
	return NULL;
}
static void run(const char *what) {
	pthread_t t[64]; double t0 = now();
	pthread_barrier_init(&bar, NULL, T);
	for (long i = 0; i < T; i++) pthread_create(&t[i], NULL, th, (void*)i);
	for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
	double el = now() - t0, mx[6] = {0};
	for (int k = 0; k < 6; k++) for (int i = 0; i < T; i++) if (ph[k][i] > mx[k]) mx[k] = ph[k][i];
	printf("%-28s T=%2d %.2f GiB: total %.3f s = %.1f GB/s | max per thread: alloc %.3f mmap %.3f register %.3f copy %.3f (%.1f GB/s) unregister %.3f unmap %.3f\n",
	       what, T, total/1073741824.0, el, total/el/1e9, mx[0], mx[1], mx[2], mx[3], total/mx[3]/1e9, mx[4], mx[5]);
	fflush(stdout);
}
int main(int argc, char **argv) {
	double gib = atof(argv[1]); dir = argv[2]; T = atoi(argv[3]); mode = atoi(argv[4]);
	CUdevice dev; CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
	int ro = 0; cuDeviceGetAttribute(&ro, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, dev);
	total = (size_t)(gib * 1073741824.0); per = total / T; per &= ~((size_t)(2u<<20) - 1); total = per * T;
	CK(cuMemAlloc(&dbuf, total));
	for (size_t o = 0; o < total; o += 64u<<20) CK(cuMemsetD32(dbuf + o, (unsigned)(o >> 20) * 2654435761u, (64u<<20)/4));
	CK(cuCtxSynchronize());
	char name[64];
	writing = 1; snprintf(name, sizeof name, "write mode=%d", mode); run(name);
	CK(cuMemsetD32(dbuf, 0, total/4)); CK(cuCtxSynchronize());
	writing = 0; snprintf(name, sizeof name, "read"); run(name);
	/* verify a word per 64 MiB */
	int bad = 0;
	for (size_t o = 0; o < total; o += 64u<<20) { unsigned v; CK(cuMemcpyDtoH(&v, dbuf + o + 4096, 4)); if (v != (unsigned)(o >> 20) * 2654435761u) bad++; }
	printf("verify: %s (ro-register supported=%d)\n", bad ? "BAD" : "ok", ro);
	return bad;
}
