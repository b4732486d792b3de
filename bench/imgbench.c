/* imgbench: gpucrd's image engine alone, on a real GPU: GPU memory -> image
 * files -> new GPU memory, with the daemon's own code (daemon/imgio.c,
 * daemon/gpu.c), and a check that the fingerprint kernel agrees with the
 * CPU definition bit for bit.
 *
 *   imgbench --gib G --dir DIR [--buffers N] [--zero-frac F] [--ceilings]
 *
 * Prints one line per phase: bytes, seconds, GB/s. --ceilings adds what
 * the host allows each half of the write path on its own: GPU -> pinned
 * memory with no file, and memory -> files in DIR with no GPU, each from
 * as many threads as the image engine uses. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "fingerprint.h"
#include "gpucrd.h"
#include "log.h"

/* imgio's registry helpers expect these; the bench has no server. */
void dump_proc_gone(struct daemon *d, struct proc *p)
{
	(void)d;
	(void)p;
}

void dump_shim_detached(struct proc *p)
{
	(void)p;
}

int precopy_running(const struct proc *p)
{
	(void)p;
	return 0;
}

void precopy_free(struct precopy *pc)
{
	(void)pc;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- --ceilings ---- */
struct ceil_arg {
	int idx, nth, dirfd;
	struct rbuf *b;
	uint64_t bytes;
	int err;
	pthread_barrier_t *go; /* set-up (pinning, streams, files) stays out of the timing */
};

static void *ceil_d2h(void *a_)
{
	struct ceil_arg *a = a_;
	const struct cudrv *drv = gpu_drv();
	size_t piece = 32u << 20;
	void *h = NULL;
	CUstream st;
	uint64_t off;

	if (gpu_use(a->b->mem.dev) < 0 || gpu_host_alloc(piece, &h) < 0 || drv->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)) {
		a->err = 1;
		pthread_barrier_wait(a->go);
		return NULL;
	}
	pthread_barrier_wait(a->go);
	for (off = (uint64_t)a->idx * piece; off + piece <= a->b->phys_size; off += (uint64_t)a->nth * piece) {
		drv->cuMemcpyDtoHAsync(h, a->b->mem.va + off, piece, st);
		drv->cuStreamSynchronize(st);
		a->bytes += piece;
	}
	drv->cuStreamDestroy(st);
	gpu_host_free(h);
	return NULL;
}

static void *ceil_write(void *a_)
{
	struct ceil_arg *a = a_;
	size_t piece = 32u << 20;
	char name[64], *h = malloc(piece);
	uint64_t off;
	int fd;

	snprintf(name, sizeof(name), "ceiling.%d", a->idx);
	fd = openat(a->dirfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || !h) {
		a->err = 1;
		free(h);
		pthread_barrier_wait(a->go);
		return NULL;
	}
	memset(h, 0x5a, piece);
	pthread_barrier_wait(a->go);
	for (off = 0; off < a->bytes; off += piece)
		if (pwrite(fd, h, piece, (off_t)off) != (ssize_t)piece) {
			a->err = 1;
			break;
		}
	close(fd);
	unlinkat(a->dirfd, name, 0);
	free(h);
	return NULL;
}

static void ceilings(struct rbuf *b, int dirfd, uint64_t total)
{
	int nth = 16, i;
	pthread_t th[64];
	struct ceil_arg a[64];
	pthread_barrier_t go;
	uint64_t bytes = 0;
	double t0, t1;

	if (getenv("GPUCR_IO_THREADS"))
		nth = atoi(getenv("GPUCR_IO_THREADS"));
	if (nth < 1 || nth > 64)
		nth = 16;
	memset(a, 0, sizeof(a));
	pthread_barrier_init(&go, NULL, (unsigned)nth + 1);
	for (i = 0; i < nth; i++) {
		a[i] = (struct ceil_arg){ .idx = i, .nth = nth, .b = b, .go = &go };
		pthread_create(&th[i], NULL, ceil_d2h, &a[i]);
	}
	pthread_barrier_wait(&go);
	t0 = now();
	for (i = 0; i < nth; i++) {
		pthread_join(th[i], NULL);
		bytes += a[i].bytes;
	}
	t1 = now();
	printf("ceiling       GPU -> pinned memory, %d threads, no file: %.2f GiB in %.3f s: %.1f GB/s\n", nth,
	       bytes / 1073741824.0, t1 - t0, bytes / (t1 - t0) / 1e9);
	pthread_barrier_destroy(&go);
	pthread_barrier_init(&go, NULL, (unsigned)nth + 1);
	for (i = 0; i < nth; i++) {
		a[i] = (struct ceil_arg){ .idx = i, .nth = nth, .dirfd = dirfd, .bytes = total / (uint64_t)nth, .go = &go };
		pthread_create(&th[i], NULL, ceil_write, &a[i]);
	}
	pthread_barrier_wait(&go);
	t0 = now();
	for (i = 0; i < nth; i++)
		pthread_join(th[i], NULL);
	t1 = now();
	pthread_barrier_destroy(&go);
	printf("ceiling       memory -> %d files, pwrite, no GPU: %.2f GiB in %.3f s: %.1f GB/s\n", nth,
	       total / 1073741824.0, t1 - t0, total / (t1 - t0) / 1e9);
}

int main(int argc, char **argv)
{
	double gib = 4, zero_frac = 0.0, t0, t1;
	int nbuf = 4, i, r, dirfd, ceil = 0;
	const char *dir = NULL;
	struct proc p;
	struct rbuf *loaded = NULL, *b;
	struct img_stats st = { 0 };
	char msg[1024];
	const struct cudrv *drv;
	uint64_t per, seed = 0x1234;
	uint8_t *host;
	size_t hsize = 64u << 20;

	log_init("imgbench");
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--gib") && i + 1 < argc)
			gib = atof(argv[++i]);
		else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--buffers") && i + 1 < argc)
			nbuf = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--zero-frac") && i + 1 < argc)
			zero_frac = atof(argv[++i]);
		else if (!strcmp(argv[i], "--ceilings"))
			ceil = 1;
		else {
			fprintf(stderr, "usage: imgbench --gib G --dir DIR [--buffers N] [--zero-frac F] [--ceilings]\n");
			return 2;
		}
	}
	if (!dir || nbuf < 1)
		return 2;
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		perror(dir);
		return 1;
	}
	r = gpu_init(msg, sizeof(msg));
	if (r < 0) {
		fprintf(stderr, "imgbench: %s\n", msg);
		return 77;
	}
	drv = gpu_drv();
	memset(&p, 0, sizeof(p));
	p.pid = getpid();
	p.uid = getuid();
	snprintf(p.comm, sizeof(p.comm), "imgbench");
	per = (uint64_t)(gib * (1ull << 30)) / (uint64_t)nbuf;
	per = (per + (2u << 20) - 1) & ~((uint64_t)(2u << 20) - 1);
	host = malloc(hsize);
	for (size_t k = 0; k < hsize / 8; k++) {
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		((uint64_t *)host)[k] = seed;
	}
	for (i = 0; i < nbuf; i++) {
		uint64_t off;

		b = calloc(1, sizeof(*b));
		b->fd = -1;
		r = gpu_mem_create(gpu_dev_by_ordinal(0), per, &b->mem);
		if (r < 0) {
			fprintf(stderr, "imgbench: allocating %llu MiB: %s\n", (unsigned long long)(per >> 20),
				gpucr_strerror(r));
			return 1;
		}
		b->fd = b->mem.fd;
		b->mem.fd = -1;
		b->va = b->mem.va;
		b->size = b->phys_size = per;
		b->device = 0;
		memcpy(b->uuid, b->mem.dev->uuid.bytes, 16);
		/* Random data, except the first zero_frac of each buffer. */
		for (off = 0; off < per; off += hsize) {
			uint64_t n = per - off < hsize ? per - off : hsize;

			if (off < (uint64_t)(zero_frac * per))
				drv->cuMemsetD8(b->mem.va + off, 0, n);
			else
				drv->cuMemcpyHtoD(b->mem.va + off, host + (off / hsize % 7) * 8, n - 64);
		}
		b->next = p.bufs;
		p.bufs = b;
		p.nbufs++;
		p.bytes += per;
	}
	drv->cuCtxSynchronize();

	/* The GPU fingerprint kernel against the CPU definition. */
	{
		uint64_t fp[2], cpu;
		uint8_t nz[2];
		void *h = malloc(4u << 20);

		b = p.bufs;
		r = gpu_fingerprint(b->mem.dev, b->mem.va + per / 2, 4u << 20, 2u << 20, fp, nz);
		drv->cuMemcpyDtoH(h, b->mem.va + per / 2, 2u << 20);
		cpu = fp_chunk(h, 2u << 20, 0);
		printf("fingerprint   gpu=%016llx cpu=%016llx %s (kernel %s)\n", (unsigned long long)fp[0],
		       (unsigned long long)cpu, !r && fp[0] == cpu ? "MATCH" : "DIFFER",
		       b->mem.dev->fp_fn ? "on the GPU" : "absent: CPU fallback");
		free(h);
		if (r || fp[0] != cpu)
			return 1;
		t0 = now();
		r = gpu_fingerprint(b->mem.dev, b->mem.va, per, 2u << 20, NULL, NULL);
		(void)t0;
	}
	{
		uint64_t n = (per + (2u << 20) - 1) / (2u << 20);
		uint64_t *fp = calloc(n, 8);
		uint8_t *nz = calloc(n, 1);

		t0 = now();
		for (b = p.bufs; b; b = b->next)
			gpu_fingerprint(b->mem.dev, b->mem.va, per, 2u << 20, fp, nz);
		t1 = now();
		printf("fingerprints  %.2f GiB in %.1f ms (%.0f GB/s)\n", p.bytes / 1073741824.0, (t1 - t0) * 1e3,
		       p.bytes / (t1 - t0) / 1e9);
		free(fp);
		free(nz);
	}

	t0 = now();
	r = imgio_write(&p, dirfd, &st, msg, sizeof(msg));
	t1 = now();
	if (r < 0) {
		fprintf(stderr, "imgbench: write: %s\n", msg);
		return 1;
	}
	printf("write         %.2f GiB (%.2f GiB stored) in %.3f s: %.1f GB/s\n", st.bytes / 1073741824.0,
	       st.stored / 1073741824.0, t1 - t0, st.bytes / (t1 - t0) / 1e9);

	t0 = now();
	r = imgio_read(p.pid, dirfd, &loaded, &st, msg, sizeof(msg));
	t1 = now();
	if (r < 0) {
		fprintf(stderr, "imgbench: read: %s\n", msg);
		return 1;
	}
	printf("read+verify   %.2f GiB in %.3f s: %.1f GB/s (fingerprints checked)\n",
	       st.bytes / 1073741824.0, t1 - t0, st.bytes / (t1 - t0) / 1e9);
	if (ceil)
		ceilings(p.bufs, dirfd, p.bytes);
	while ((b = loaded)) {
		loaded = b->next;
		rbuf_free(b);
	}
	while ((b = p.bufs)) {
		p.bufs = b->next;
		rbuf_free(b);
	}
	free(host);
	return 0;
}
