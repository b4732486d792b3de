/* The control thread when gpucrd is absent, goes away or is slow, each case
 * in a child process of its own (the shim's state is per process):
 *   drop-quiesced  the daemon dies while the process is quiesced: the gate
 *                  reopens and the blocked thread goes on; a child forked
 *                  meanwhile starts with the gate open;
 *   drop-released  it dies after release: the shim keeps reconnecting with
 *                  restored=1, says it waits for its memory, and a restarted
 *                  daemon gives it back (from new allocations, as from an
 *                  image); the blocked thread then goes on;
 *   no-daemon      nothing listens: the application works;
 *   disabled       GPUCR_DAEMON=0: no control thread, no connection;
 *   refused        a refused Hello is retried; a daemon restarted while the
 *                  process runs gets every chunk reported again;
 *   timeout        the device does not drain (the fake driver is held
 *                  locked): quiesce answers -ETIMEDOUT within its timeout,
 *                  reopens the gate, refuses the next quiesce while the
 *                  stuck drain lasts, and works once it ends;
 *   lost           after a release, a daemon that holds nothing for the
 *                  process answers Hello{restored=1} with -ENOENT: the gate
 *                  opens, the blocked call fails instead of hanging, and
 *                  the process goes on as a new one.
 *
 * Linked against the shim as installed (and common/ for the fake daemon). */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda.h"
#include "fakegpucrd.h"
#include "t.h"

#define MIB (1UL << 20)

static int saved_stderr = -1, log_fd = -1;

static void log_dump(void);

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* The shim's messages (and the checks') go to a file the case reads. */
static void log_capture(void)
{
	char path[] = "/tmp/gpucr-test-log-XXXXXX";

	log_fd = mkstemp(path);
	REQUIRE(log_fd >= 0);
	unlink(path);
	saved_stderr = dup(2);
	dup2(log_fd, 2);
	atexit(log_dump);
}

static char *log_text(void)
{
	static char buf[16384];
	ssize_t n = pread(log_fd, buf, sizeof(buf) - 1, 0);

	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

/* At the end of a case (however it ends): what was logged goes to the real
 * stderr. */
static void log_dump(void)
{
	const char *s;

	fflush(stderr);
	s = log_text();
	if (write(saved_stderr, s, strlen(s)) < 0)
		_exit(1);
}

static int case_done(void)
{
	return t_done();
}

static int control_threads(void)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	char p[300], comm[64];
	int n = 0;

	REQUIRE(dir);
	while ((e = readdir(dir))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(p, "re");
		if (f && fgets(comm, sizeof(comm), f) && strstr(comm, "gpucr-control"))
			n++;
		if (f)
			fclose(f);
	}
	closedir(dir);
	return n;
}

static CUcontext ctx;

static void init_ctx(void)
{
	CUdevice dev;

	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

/* ---- an application thread that makes one call when told --------------- */

struct app_call {
	pthread_t t;
	pthread_barrier_t ready, go;
	CUdeviceptr dst;
	unsigned char src[4096];
	CUresult result;
	int done;
	int alloc; /* cuMemAlloc instead of cuMemcpyHtoD */
};

static void *app_main(void *arg)
{
	struct app_call *a = arg;

	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	pthread_barrier_wait(&a->ready);
	pthread_barrier_wait(&a->go);
	if (a->alloc)
		a->result = cuMemAlloc(&a->dst, 4 * MIB);
	else
		a->result = cuMemcpyHtoD(a->dst, a->src, sizeof(a->src));
	__atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void app_start(struct app_call *a)
{
	pthread_barrier_init(&a->ready, NULL, 2);
	pthread_barrier_init(&a->go, NULL, 2);
	REQUIRE(pthread_create(&a->t, NULL, app_main, a) == 0);
	pthread_barrier_wait(&a->ready);
}

static int app_done_within(struct app_call *a, int ms)
{
	long long end = now_ms() + ms;

	while (!__atomic_load_n(&a->done, __ATOMIC_ACQUIRE) && now_ms() < end)
		usleep(1000);
	return __atomic_load_n(&a->done, __ATOMIC_ACQUIRE);
}

static int connect_and_hello(struct fdd *d, int restored)
{
	if (fdd_accept(d, 5000) || fdd_hello(d, 0, 5000))
		return 0;
	return d->restored == restored;
}

static int wait_bufs(struct fdd *d, size_t n, int ms)
{
	long long end = now_ms() + ms;

	while (d->nbufs != n && now_ms() < end)
		if (fdd_pump(d, 50, NULL) < 0)
			return 0;
	return d->nbufs == n;
}

/* ---- cases ------------------------------------------------------------------ */

static int case_drop_quiesced(void)
{
	struct app_call a = { 0 };
	struct fdd d;
	CUdeviceptr p;
	int status = 0;
	pid_t pid;

	fdd_init(&d);
	init_ctx();
	REQUIRE(connect_and_hello(&d, 0));
	REQUIRE(cuMemAlloc(&p, 2 * MIB) == CUDA_SUCCESS);
	a.dst = p;
	memset(a.src, 0x33, sizeof(a.src));
	app_start(&a);
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, NULL), 0);
	pthread_barrier_wait(&a.go);
	CHECK(!app_done_within(&a, 200));

	/* A child forked while quiesced is not: its gate is open, and the
	 * parent's connection is not its. */
	pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		int n = -1;

		alarm(5);
		cuDeviceGetCount(&n);
		_exit(0);
	}
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(!app_done_within(&a, 50));

	fdd_drop_conn(&d); /* the daemon dies */
	CHECK(app_done_within(&a, 3000));
	pthread_join(a.t, NULL);
	CHECK_EQ_INT(a.result, CUDA_SUCCESS);
	CHECK_EQ_INT(((unsigned char *)(uintptr_t)p)[100], 0x33);
	CHECK_CONTAINS(log_text(), "while the process was quiesced");
	CHECK_EQ_INT(cuCtxSynchronize(), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	fdd_fini(&d);
	return case_done();
}

static int case_drop_released(void)
{
	struct app_call a = { 0 };
	struct fdd_buf saved[FDD_MAX_BUFS];
	int fds[FDD_MAX_BUFS];
	unsigned char *q;
	struct fdd d;
	CUdeviceptr p;
	size_t n, i;

	setenv("GPUCR_RECONNECT_MS", "100", 1);
	fdd_init(&d);
	init_ctx();
	REQUIRE(connect_and_hello(&d, 0));
	REQUIRE(cuMemAlloc(&p, 6 * MIB) == CUDA_SUCCESS);
	q = (unsigned char *)(uintptr_t)p;
	for (i = 0; i < 6 * MIB; i += 4096)
		q[i] = (unsigned char)(i >> 12);
	REQUIRE(wait_bufs(&d, 1, 5000));
	a.dst = p + MIB;
	memset(a.src, 0x44, sizeof(a.src));
	app_start(&a);
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, NULL), 0);
	pthread_barrier_wait(&a.go);
	CHECK_EQ_INT(fdd_release(&d), 0);
	CHECK(fdd_pump(&d, 3000, NULL) < 0);

	/* The daemon restarts from its image: new physical memory with the
	 * old contents; the old memory is gone with the old daemon. */
	n = d.nbufs;
	for (i = 0; i < n; i++) {
		void *from, *to;

		saved[i] = d.bufs[i];
		fds[i] = memfd_create(FAKECUDA_PHYS_NAME, MFD_CLOEXEC);
		REQUIRE(fds[i] >= 0 && ftruncate(fds[i], (off_t)saved[i].size) == 0);
		from = mmap(NULL, saved[i].size, PROT_READ, MAP_SHARED, saved[i].fd, 0);
		to = mmap(NULL, saved[i].size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		REQUIRE(from != MAP_FAILED && to != MAP_FAILED);
		memcpy(to, from, saved[i].size);
		munmap(from, saved[i].size);
		munmap(to, saved[i].size);
	}
	fdd_forget_bufs(&d);
	fdd_unlisten(&d);
	usleep(300 * 1000); /* it tries, and is refused */
	CHECK_CONTAINS(log_text(), "waiting for it to give it back");
	fdd_relisten(&d);
	/* It comes back by itself (no wake signal here), asks for its memory,
	 * and the daemon falls over once more before answering. */
	REQUIRE(connect_and_hello(&d, 1));
	fdd_drop_conn(&d);
	REQUIRE(connect_and_hello(&d, 1));
	CHECK(!app_done_within(&a, 50));
	CHECK_EQ_INT(fdd_remap(&d, saved, n, fds, true), 0);
	for (i = 0; i < n; i++)
		close(fds[i]);
	CHECK_EQ_INT(fdd_resume(&d), 0);
	CHECK(app_done_within(&a, 3000));
	pthread_join(a.t, NULL);
	CHECK_EQ_INT(a.result, CUDA_SUCCESS);
	for (i = 0; i < 6 * MIB; i += 4096)
		if (i < MIB || i >= MIB + 4096)
			CHECK_EQ_INT(q[i], (unsigned char)(i >> 12));
	CHECK_EQ_INT(q[MIB + 5], 0x44);
	CHECK_CONTAINS(log_text(), "waits for gpucrd to give it back");
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	fdd_fini(&d);
	return case_done();
}

static int case_no_daemon(void)
{
	unsigned char in[4096], out[4096];
	CUdeviceptr p, s;

	setenv("GPUCR_SOCKET", "/nonexistent/gpucr/gpucrd.sock", 1);
	init_ctx();
	memset(in, 0x21, sizeof(in));
	CHECK_EQ_INT(cuMemAlloc(&p, 3 * MIB), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemAlloc(&s, 100), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemcpyHtoD(p, in, sizeof(in)), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemcpyDtoD(s, p, 100), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemcpyDtoH(out, s, 100), CUDA_SUCCESS);
	CHECK(!memcmp(in, out, 100));
	CHECK_EQ_INT(cuCtxSynchronize(), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(s), CUDA_SUCCESS);
	CHECK_EQ_INT(control_threads(), 1); /* there, trying every 2 s */
	return case_done();
}

static int case_disabled(void)
{
	struct fdd d;
	CUdeviceptr p;

	setenv("GPUCR_DAEMON", "0", 1);
	fdd_init(&d);
	init_ctx();
	CHECK_EQ_INT(cuMemAlloc(&p, 3 * MIB), CUDA_SUCCESS);
	CHECK(!fdd_readable(d.lfd, 500));
	CHECK_EQ_INT(control_threads(), 0);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	fdd_fini(&d);
	return case_done();
}

static int case_refused(void)
{
	CUdeviceptr p, s;
	struct fdd d;

	setenv("GPUCR_RECONNECT_MS", "100", 1);
	fdd_init(&d);
	init_ctx();
	REQUIRE(cuMemAlloc(&p, 3 * MIB) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc(&s, 100) == CUDA_SUCCESS);
	REQUIRE(fdd_accept(&d, 5000) == 0);
	REQUIRE(fdd_hello(&d, -EAGAIN, 5000) == 0);
	CHECK(fdd_pump(&d, 2000, NULL) < 0); /* it hangs up */
	REQUIRE(connect_and_hello(&d, 0));
	CHECK(wait_bufs(&d, 2, 5000));
	CHECK(fdd_holding(&d, p) && fdd_holding(&d, s));

	/* A daemon restarted while the process runs hears of everything. */
	fdd_forget_bufs(&d);
	fdd_drop_conn(&d);
	REQUIRE(connect_and_hello(&d, 0));
	CHECK(wait_bufs(&d, 2, 5000));
	CHECK(fdd_holding(&d, p) && fdd_holding(&d, s));
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, NULL), 0);
	CHECK_EQ_INT(fdd_resume(&d), 0);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(s), CUDA_SUCCESS);
	CHECK(wait_bufs(&d, 1, 5000)); /* the empty slab is kept */
	fdd_fini(&d);
	return case_done();
}

static int case_timeout(void)
{
	CUresult (*lock)(int, CUcheckpointLockArgs *);
	CUresult (*unlock)(int, CUcheckpointUnlockArgs *);
	CUcheckpointLockArgs la = { 0 };
	struct app_call a = { .alloc = 1 };
	Gpucr__Msg *r = NULL;
	struct fdd d;
	long long t0;
	void *fake;

	fdd_init(&d);
	init_ctx();
	REQUIRE(connect_and_hello(&d, 0));
	/* The fake's own checkpoint API, not the shim's (gated) trampolines. */
	fake = dlopen(getenv("GPUCR_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(fake);
	lock = (CUresult(*)(int, CUcheckpointLockArgs *))dlsym(fake, "cuCheckpointProcessLock");
	unlock = (CUresult(*)(int, CUcheckpointUnlockArgs *))dlsym(fake, "cuCheckpointProcessUnlock");
	REQUIRE(lock && unlock);

	/* An allocation stuck in the driver (locked by "someone else"). */
	app_start(&a);
	REQUIRE(lock(getpid(), &la) == CUDA_SUCCESS);
	pthread_barrier_wait(&a.go);
	CHECK(!app_done_within(&a, 100));

	t0 = now_ms();
	CHECK_EQ_INT(fdd_quiesce(&d, 300, &r), -ETIMEDOUT);
	CHECK(now_ms() - t0 < 2000);
	CHECK(r && r->err_msg && strstr(r->err_msg, "300 ms"));
	msg_free(r);
	CHECK_EQ_INT(fdd_quiesce(&d, 300, NULL), -EBUSY); /* the drain is still stuck */
	CHECK(!app_done_within(&a, 50));

	REQUIRE(unlock(getpid(), NULL) == CUDA_SUCCESS);
	CHECK(app_done_within(&a, 3000)); /* the gate was reopened */
	pthread_join(a.t, NULL);
	CHECK_EQ_INT(a.result, CUDA_SUCCESS);
	usleep(100 * 1000); /* the abandoned drain finishes */
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, NULL), 0);
	CHECK_EQ_INT(fdd_resume(&d), 0);
	CHECK_CONTAINS(log_text(), "did not drain within 300 ms");
	CHECK_EQ_INT(cuMemFree(a.dst), CUDA_SUCCESS);
	fdd_fini(&d);
	return case_done();
}

static int case_lost(void)
{
	struct app_call a = { 0 };
	struct fdd d;
	CUdeviceptr p, q;

	setenv("GPUCR_RECONNECT_MS", "100", 1);
	fdd_init(&d);
	init_ctx();
	REQUIRE(connect_and_hello(&d, 0));
	REQUIRE(cuMemAlloc(&p, 2 * MIB) == CUDA_SUCCESS);
	a.dst = p;
	app_start(&a);
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, NULL), 0);
	pthread_barrier_wait(&a.go);
	CHECK_EQ_INT(fdd_release(&d), 0);
	CHECK(fdd_pump(&d, 3000, NULL) < 0);
	fdd_forget_bufs(&d); /* the memory is gone */

	/* A daemon that has neither the memory nor an image says so. */
	REQUIRE(fdd_accept(&d, 5000) == 0);
	REQUIRE(fdd_hello(&d, -ENOENT, 5000) == 0);
	CHECK_EQ_INT(d.restored, 1);
	CHECK(app_done_within(&a, 3000)); /* not blocked for ever ... */
	pthread_join(a.t, NULL);
	CHECK(a.result != CUDA_SUCCESS);  /* ... and told */
	CHECK_CONTAINS(log_text(), "device memory is lost");
	/* The process goes on as a new one: new memory works and is reported. */
	REQUIRE(connect_and_hello(&d, 0));
	CHECK_EQ_INT(cuMemAlloc(&q, 3 * MIB), CUDA_SUCCESS);
	CHECK(wait_bufs(&d, 1, 5000));
	CHECK(fdd_holding(&d, q) != NULL);
	CHECK_EQ_INT(cuMemFree(q), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree(p), CUDA_SUCCESS);
	fdd_fini(&d);
	return case_done();
}

static const struct {
	const char *name;
	int (*fn)(void);
} cases[] = {
	{ "drop-quiesced", case_drop_quiesced },
	{ "drop-released", case_drop_released },
	{ "no-daemon", case_no_daemon },
	{ "disabled", case_disabled },
	{ "refused", case_refused },
	{ "timeout", case_timeout },
	{ "lost", case_lost },
};

int main(void)
{
	int failed = 0;

	alarm(110);
	if (!getenv("GPUCR_REAL_LIBCUDA")) {
		if (access(FAKECUDA_LIB, R_OK) != 0) {
			printf("skip: fake driver %s not built\n", FAKECUDA_LIB);
			return T_SKIP;
		}
		setenv("GPUCR_REAL_LIBCUDA", FAKECUDA_LIB, 1);
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int status = 0;
		pid_t pid;

		fflush(stdout);
		fflush(stderr);
		pid = fork();
		REQUIRE(pid >= 0);
		if (pid == 0) {
			alarm(30);
			log_capture();
			exit(cases[i].fn());
		}
		REQUIRE(waitpid(pid, &status, 0) == pid);
		if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
			printf("ok    %s\n", cases[i].name);
		} else {
			printf("FAIL  %s (%s %d)\n", cases[i].name, WIFEXITED(status) ? "exit" : "signal",
			       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
			failed++;
		}
	}
	return failed ? 1 : 0;
}
