/* The control thread against a fake gpucrd (fakegpucrd.h), the whole cycle
 * of a dump and a restore in one process:
 *  - cuInit starts it; it says Hello with its own thread id;
 *  - every chunk of gpucr's memory arrives as a BufferAdd with a working fd
 *    (the daemon sees through it what the application wrote), kind ALLOC or
 *    SLAB, with the device's UUID; a freed chunk as a BufferFree;
 *  - quiesce closes the gate: threads calling cuLaunchKernel, a
 *    cuMemcpyHtoD looked up with cuGetProcAddress, and cuMemAlloc block;
 *    pure queries still answer;
 *  - release leaves the process holding no device memory (only the daemon's
 *    fds do) and closes the connection;
 *  - the thread stays away until the wake signal (tgkill to its tid), then
 *    says Hello{restored=1}; remap in two batches, one chunk from a new
 *    physical allocation (as from an image), puts the contents back at the
 *    same addresses; resume lets the blocked threads finish;
 *  - quiesce is refused while managed memory exists; unknown requests get
 *    -EOPNOTSUPP.
 *
 * Linked against the shim as installed (and common/ for the fake daemon).
 * The fake driver maps device memory at its device address in the process,
 * so the test reads it directly while the gate keeps it from calling the
 * driver. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"
#include "fakegpucrd.h"
#include "t.h"
#include "shimtest.h"

#define MIB (1UL << 20)

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* fds of the fake's physical memory this process has open. */
static int phys_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	char p[300], target[256];
	int n = 0;

	REQUIRE(dir);
	while ((e = readdir(dir))) {
		ssize_t len;

		snprintf(p, sizeof(p), "/proc/self/fd/%s", e->d_name);
		len = readlink(p, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		n += strstr(target, FAKECUDA_PHYS_NAME) != NULL;
	}
	closedir(dir);
	return n;
}

static void pattern(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(seed + i * 13);
}

static int has_pattern(const unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (unsigned char)(seed + i * 13))
			return 0;
	return 1;
}

/* ---- application threads ------------------------------------------------ */

static CUcontext ctx;
static CUfunction fill_fn;
static CUdeviceptr big, small_buf, late;
static htod_fn htod;
static pthread_barrier_t ready_b, go_b;
static int done[3];
static CUresult results[3];
static unsigned char small_src[1000];

static void ready(void)
{
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	pthread_barrier_wait(&ready_b);
	pthread_barrier_wait(&go_b);
}

static void *t_launch(void *arg)
{
	int v = 7, n = 1024;
	void *params[] = { &big, &v, &n };

	(void)arg;
	ready();
	results[0] = cuLaunchKernel(fill_fn, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
	__atomic_store_n(&done[0], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *t_memcpy(void *arg)
{
	(void)arg;
	ready();
	results[1] = htod(small_buf, small_src, sizeof(small_src));
	__atomic_store_n(&done[1], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *t_alloc(void *arg)
{
	(void)arg;
	ready();
	results[2] = cuMemAlloc(&late, 4 * MIB);
	__atomic_store_n(&done[2], 1, __ATOMIC_RELEASE);
	return NULL;
}

static int any_done(void)
{
	int n = 0;

	for (int i = 0; i < 3; i++)
		n += __atomic_load_n(&done[i], __ATOMIC_ACQUIRE);
	return n;
}

static int pump_until_bufs(struct fdd *d, size_t n, int ms)
{
	long long end = now_ms() + ms;

	while (d->nbufs != n && now_ms() < end)
		if (fdd_pump(d, 100, NULL) < 0)
			return 0;
	return d->nbufs == n;
}

int main(void)
{
	const size_t fill_sizes[] = { sizeof(void *), sizeof(int), sizeof(int) };
	int (*reg)(const char *, fakecuda_kernel_fn, int, const size_t *);
	unsigned char big_src[3 * 1024];
	struct fdd_buf *bb, *sb, saved[2];
	CUdeviceptr gone, managed;
	Gpucr__Msg *r = NULL;
	struct fdd d;
	pthread_t th[3];
	CUdevice dev;
	CUmodule mod;
	CUuuid uuid;
	gpa_v2_fn gpa;
	CUdriverProcAddressQueryResult st;
	char path[64], comm[64];
	int fds[2], ver = 0, i, newfd;
	long long t0;

	alarm(60);
	use_fake();
	/* Only the wake signal brings it back soon after a release. */
	setenv("GPUCR_RECONNECT_MS", "30000", 1);
	fdd_init(&d);

	/* ---- Hello ---- */
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(fdd_accept(&d, 5000) == 0);
	REQUIRE(fdd_hello(&d, 0, 5000) == 0);
	CHECK(d.control_tid > 0 && d.control_tid != (uint32_t)getpid());
	snprintf(path, sizeof(path), "/proc/self/task/%u/comm", d.control_tid);
	{
		FILE *f = fopen(path, "re");

		CHECK(f != NULL);
		if (f) {
			CHECK(fgets(comm, sizeof(comm), f) != NULL);
			CHECK_CONTAINS(comm, "gpucr-control");
			fclose(f);
		}
	}
	CHECK_EQ_INT(d.restored, 0);
	{
		FILE *f = fopen("/proc/self/comm", "re");

		REQUIRE(f && fgets(comm, sizeof(comm), f));
		fclose(f);
		comm[strcspn(comm, "\n")] = '\0';
		CHECK(!strcmp(d.comm, comm));
	}

	/* ---- BufferAdd / BufferFree ---- */
	reg = (int (*)(const char *, fakecuda_kernel_fn, int, const size_t *))fakecuda_sym(
		"fakecuda_register_kernel");
	REQUIRE(reg && reg("fill", shim_fill_kernel, 3, fill_sizes) == 0);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fill_fn, mod, "fill") == CUDA_SUCCESS);
	REQUIRE(cuDeviceGetUuid(&uuid, dev) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc(&big, 3 * MIB + 5) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc(&small_buf, 1000) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc(&gone, 16 * MIB) == CUDA_SUCCESS);
	pattern(big_src, sizeof(big_src), 1);
	pattern(small_src, sizeof(small_src), 2);
	REQUIRE(cuMemcpyHtoD(big, big_src, sizeof(big_src)) == CUDA_SUCCESS);
	REQUIRE(cuMemcpyHtoD(small_buf, small_src, sizeof(small_src)) == CUDA_SUCCESS);
	CHECK(pump_until_bufs(&d, 3, 5000));
	bb = fdd_holding(&d, big);
	sb = fdd_holding(&d, small_buf);
	REQUIRE(bb && sb && bb != sb);
	CHECK_EQ_INT(bb->kind, GPUCR__BUFFER_KIND__BUF_ALLOC);
	CHECK_EQ_INT(sb->kind, GPUCR__BUFFER_KIND__BUF_SLAB);
	CHECK(bb->size >= 3 * MIB + 5);
	CHECK_EQ_INT(bb->device, 0);
	CHECK(bb->has_uuid && !memcmp(bb->uuid, uuid.bytes, 16));
	{
		/* The daemon sees the application's data through the fd. */
		unsigned char *img = mmap(NULL, bb->size, PROT_READ, MAP_SHARED, bb->fd, 0);

		CHECK(img != MAP_FAILED);
		if (img != MAP_FAILED) {
			CHECK(has_pattern(img + (big - bb->va), sizeof(big_src), 1));
			munmap(img, bb->size);
		}
	}
	REQUIRE(cuMemFree(gone) == CUDA_SUCCESS);
	CHECK(pump_until_bufs(&d, 2, 5000));
	CHECK_EQ_INT(d.nfreed, 1);
	CHECK_EQ_INT(d.freed[0], gone);
	bb = fdd_holding(&d, big);
	sb = fdd_holding(&d, small_buf);
	REQUIRE(bb && sb);

	/* ---- quiesce: application threads block ---- */
	REQUIRE(cuGetProcAddress("cuGetProcAddress", (void **)&gpa, CUDA_VERSION, 0, &st) == CUDA_SUCCESS);
	REQUIRE(gpa("cuMemcpyHtoD", (void **)&htod, CUDA_VERSION, 0, &st) == CUDA_SUCCESS && htod);
	pthread_barrier_init(&ready_b, NULL, 4);
	pthread_barrier_init(&go_b, NULL, 4);
	REQUIRE(pthread_create(&th[0], NULL, t_launch, NULL) == 0);
	REQUIRE(pthread_create(&th[1], NULL, t_memcpy, NULL) == 0);
	REQUIRE(pthread_create(&th[2], NULL, t_alloc, NULL) == 0);
	pthread_barrier_wait(&ready_b);
	memset(small_src, 0x5c, sizeof(small_src)); /* what t_memcpy will write */
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, &r), 0);
	CHECK(r && r->body_case == GPUCR__MSG__BODY_SHIM_STATS);
	if (r && r->body_case == GPUCR__MSG__BODY_SHIM_STATS) {
		CHECK_EQ_INT(r->shim_stats->buffers, 2);
		CHECK_EQ_INT(r->shim_stats->bytes, 3 * MIB + 5 + 1000);
		CHECK_EQ_INT(r->shim_stats->managed_bytes, 0);
		/* No kernel launched yet: t_launch waits for go_b. */
		CHECK(r->shim_stats->has_launches);
		CHECK_EQ_INT(r->shim_stats->launches, 0);
	}
	msg_free(r);
	pthread_barrier_wait(&go_b);
	usleep(300 * 1000);
	CHECK_EQ_INT(any_done(), 0);
	CHECK_EQ_INT(cuDriverGetVersion(&ver), CUDA_SUCCESS); /* ungated */
	/* A second quiesce is answered at once. */
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, NULL), 0);

	/* ---- release: no device memory left in the process ---- */
	CHECK_EQ_INT(fdd_release(&d), 0);
	CHECK(fdd_pump(&d, 3000, NULL) < 0); /* the shim closed the connection */
	fdd_drop_conn(&d);
	CHECK(!readable(big));
	CHECK(!readable(small_buf));
	CHECK_EQ_INT(phys_fds(), (int)d.nbufs); /* the daemon's, nobody else's */
	{
		int (*held)(pid_t, struct fakecuda_held *) =
			(int (*)(pid_t, struct fakecuda_held *))fakecuda_sym("fakecuda_held_bytes");
		struct fakecuda_held h;

		REQUIRE(held && held(0, &h) == 0);
		CHECK_EQ_INT(h.mapped_bytes, 0);
		CHECK_EQ_INT(h.fd_bytes, bb->size + sb->size);
	}
	CHECK_EQ_INT(any_done(), 0);

	/* ---- wake: back only when signalled ---- */
	CHECK(!fdd_readable(d.lfd, 500));
	t0 = now_ms();
	REQUIRE(syscall(SYS_tgkill, getpid(), d.control_tid, SIGRTMIN + 11) == 0);
	REQUIRE(fdd_accept(&d, 5000) == 0);
	CHECK(now_ms() - t0 < 1000);
	REQUIRE(fdd_hello(&d, 0, 5000) == 0);
	CHECK_EQ_INT(d.restored, 1);
	fdd_drain(&d, 100);
	CHECK_EQ_INT(d.nbufs, 2); /* nothing new reported: nothing is mapped */

	/* ---- remap: two batches; the slab from a new physical allocation ---- */
	saved[0] = *sb;
	saved[1] = *bb;
	newfd = memfd_create(FAKECUDA_PHYS_NAME, MFD_CLOEXEC);
	REQUIRE(newfd >= 0 && ftruncate(newfd, (off_t)sb->size) == 0);
	{
		unsigned char *from = mmap(NULL, sb->size, PROT_READ, MAP_SHARED, sb->fd, 0);
		unsigned char *to = mmap(NULL, sb->size, PROT_READ | PROT_WRITE, MAP_SHARED, newfd, 0);

		REQUIRE(from != MAP_FAILED && to != MAP_FAILED);
		memcpy(to, from, sb->size);
		munmap(from, sb->size);
		munmap(to, sb->size);
	}
	fds[0] = newfd;
	fds[1] = bb->fd;
	CHECK_EQ_INT(fdd_remap(&d, &saved[0], 1, &fds[0], false), 0);
	CHECK(!readable(small_buf)); /* mapped only with the last batch */
	CHECK_EQ_INT(fdd_remap(&d, &saved[1], 1, &fds[1], true), 0);
	CHECK(readable(big));
	CHECK(readable(small_buf));
	CHECK(has_pattern((const unsigned char *)(uintptr_t)big, sizeof(big_src), 1));
	pattern(big_src, sizeof(small_src), 2);
	CHECK(!memcmp((const void *)(uintptr_t)small_buf, big_src, sizeof(small_src)));
	{
		/* The slab is the new allocation now. */
		unsigned char *img = mmap(NULL, saved[0].size, PROT_READ, MAP_SHARED, newfd, 0);

		REQUIRE(img != MAP_FAILED);
		((volatile unsigned char *)(uintptr_t)small_buf)[3] = 0xa5;
		CHECK_EQ_INT(img[small_buf - saved[0].va + 3], 0xa5);
		munmap(img, saved[0].size);
	}
	close(newfd);
	CHECK_EQ_INT(any_done(), 0);

	/* ---- resume: the blocked threads finish ---- */
	CHECK_EQ_INT(fdd_resume(&d), 0);
	for (i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < 3; i++)
		CHECK_EQ_INT(results[i], CUDA_SUCCESS);
	CHECK_EQ_INT(((int *)(uintptr_t)big)[0], 7);
	CHECK_EQ_INT(((int *)(uintptr_t)big)[1023], 7);
	CHECK(!memcmp((const void *)(uintptr_t)small_buf, small_src, sizeof(small_src)));
	CHECK(pump_until_bufs(&d, 3, 5000)); /* t_alloc's new chunk */
	CHECK(fdd_holding(&d, late) != NULL);

	/* ---- managed memory refuses a dump ---- */
	REQUIRE(cuMemAllocManaged(&managed, 8192, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, &r), -EBUSY);
	CHECK(r && r->err_msg);
	if (r && r->err_msg) {
		CHECK_CONTAINS(r->err_msg, "managed");
		CHECK_CONTAINS(r->err_msg, "8192");
	}
	msg_free(r);
	CHECK_EQ_INT(cuMemFree(managed), CUDA_SUCCESS);
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, &r), 0);
	CHECK(r && r->body_case == GPUCR__MSG__BODY_SHIM_STATS);
	if (r && r->body_case == GPUCR__MSG__BODY_SHIM_STATS)
		CHECK_EQ_INT(r->shim_stats->launches, 1); /* t_launch's */
	msg_free(r);
	CHECK_EQ_INT(fdd_resume(&d), 0);
	CHECK_EQ_INT(fdd_resume(&d), 0); /* running already: fine */

	/* ---- requests the shim does not serve ---- */
	{
		Gpucr__PsRequest ps = GPUCR__PS_REQUEST__INIT;
		Gpucr__Msg m = GPUCR__MSG__INIT;
		Gpucr__Remap rm = GPUCR__REMAP__INIT;

		m.body_case = GPUCR__MSG__BODY_PS;
		m.ps = &ps;
		CHECK_EQ_INT(fdd_request(&d, &m, NULL, 0, 5000, NULL), -EOPNOTSUPP);
		m.body_case = GPUCR__MSG__BODY_REMAP;
		m.remap = &rm;
		CHECK_EQ_INT(fdd_request(&d, &m, NULL, 0, 5000, NULL), -EINVAL); /* not released */
		CHECK_EQ_INT(fdd_release(&d), -EINVAL);                          /* not quiesced */
	}

	/* Still ordinary memory to the application. */
	CHECK_EQ_INT(cuMemFree(late), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(big), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(small_buf), CUDA_SUCCESS);
	fdd_fini(&d);
	return t_done();
}
