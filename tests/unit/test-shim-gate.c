/* The gate (gate.h): every forwarded trampoline starts with one load of the
 * gate word and a branch (checked in the machine code of all of them), the
 * few ungated queries only jump; while the gate is closed, application
 * threads block in driver calls made through exported symbols, through
 * pointers from cuGetProcAddress and in gpucr's own wrappers, and all go on
 * with their arguments and errno intact once it opens; ungated queries
 * answer meanwhile; gate_wait_idle() waits for counted wrappers in flight;
 * exempt threads pass; a forked child starts with the gate open.
 *
 * Linked with the shim's objects (libintercept.a) to reach the gate and the
 * trampoline tables; GPUCR_DAEMON=0 keeps the control thread out of it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"
#include "fwd_gen.h"
#include "gate.h"
#include "t.h"
#include "shimtest.h"

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);

static const char *const ungated[] = { "cuGetErrorName", "cuGetErrorString", "cuDriverGetVersion" };

static int32_t rel32(const uint8_t *p)
{
	int32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static bool is_ungated(const char *name)
{
	for (size_t i = 0; i < sizeof(ungated) / sizeof(ungated[0]); i++)
		if (!strcmp(name, ungated[i]))
			return true;
	return false;
}

/* The machine code of trampoline i: the hot path is
 *   83 3d <rel32 to gate_word> 00    cmpl $0, gate_word(%rip)
 *   75 xx                            jne  (slow path)
 *   ff 25 <rel32 to fwd_table[i]>    jmp  *fwd_table[i](%rip)
 * and nothing else; an ungated one is the jmp alone. */
static int check_trampoline(size_t i)
{
	const uint8_t *p = fwd_funcs[i];
	const uint8_t *jmp;

	if (is_ungated(fwd_names[i])) {
		jmp = p;
	} else {
		if (p[0] != 0x83 || p[1] != 0x3d || p[6] != 0x00 ||
		    p + 7 + rel32(p + 2) != (const uint8_t *)&gate_word.closed) {
			fprintf(stderr, "%s: does not start with cmpl $0, gate_word(%%rip)\n", fwd_names[i]);
			return 0;
		}
		if (p[7] != 0x75) {
			fprintf(stderr, "%s: no short jne after the gate test\n", fwd_names[i]);
			return 0;
		}
		jmp = p + 9;
	}
	if (jmp[0] != 0xff || jmp[1] != 0x25 || jmp + 6 + rel32(jmp + 2) != (const uint8_t *)&fwd_table[i]) {
		fprintf(stderr, "%s: no jmp *fwd_table[%zu](%%rip)\n", fwd_names[i], i);
		return 0;
	}
	return 1;
}

/* ---- threads that call the driver while the gate is closed ---------------- */

static CUdeviceptr dbuf;
static CUcontext ctx;
static CUfunction fill_fn;
static pthread_barrier_t ready_b, go_b;

/* Each thread makes the context current while the gate is open, then calls
 * once main has closed it. */
static void ready(void)
{
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	pthread_barrier_wait(&ready_b);
	pthread_barrier_wait(&go_b);
}
static int done[4];
static CUresult results[4];
static int errno_after[4];

static void *t_launch(void *arg)
{
	int v = 7, n = 256;
	void *params[] = { &dbuf, &v, &n };

	(void)arg;
	ready();
	errno = 4242;
	results[0] = cuLaunchKernel(fill_fn, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
	errno_after[0] = errno;
	__atomic_store_n(&done[0], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *t_memcpy_ptr(void *arg)
{
	htod_fn htod = (htod_fn)arg;
	static int src[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };

	ready();
	errno = 4343;
	results[1] = htod(dbuf + 4096, src, sizeof(src));
	errno_after[1] = errno;
	__atomic_store_n(&done[1], 1, __ATOMIC_RELEASE);
	return NULL;
}

static CUdeviceptr new_alloc;

static void *t_alloc(void *arg)
{
	(void)arg;
	ready();
	errno = 4444;
	results[2] = cuMemAlloc_v2(&new_alloc, 4 << 20);
	errno_after[2] = errno;
	__atomic_store_n(&done[2], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *t_sync(void *arg)
{
	(void)arg;
	ready();
	results[3] = cuCtxSynchronize();
	errno_after[3] = 0;
	__atomic_store_n(&done[3], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *t_counted(void *arg)
{
	int *release = arg;

	gate_enter(); /* as a counted wrapper does */
	while (!__atomic_load_n(release, __ATOMIC_ACQUIRE))
		usleep(1000);
	gate_leave();
	return NULL;
}

static void *t_exempt(void *arg)
{
	int *out = arg;
	int n = -1;

	gate_exempt_self();
	cuDeviceGetCount(&n);
	*out = n;
	return NULL;
}

static int wait_waiters(unsigned n, int ms)
{
	for (int i = 0; i < ms; i++) {
		if (gate_waiters() >= n)
			return 1;
		usleep(1000);
	}
	return 0;
}

int main(void)
{
	const size_t fill_sizes[] = { sizeof(void *), sizeof(int), sizeof(int) };
	int (*reg)(const char *, fakecuda_kernel_fn, int, const size_t *);
	pthread_t th[4], tc, te;
	int bad = 0, release = 0, exempt_n = -1, ver = 0, host[256];
	CUdevice dev;
	CUmodule mod;
	gpa_v2_fn gpa;
	htod_fn htod = NULL;
	CUdriverProcAddressQueryResult st;
	const char *s = NULL;
	size_t i;

	alarm(60);
	use_fake();
	setenv("GPUCR_DAEMON", "0", 1);

	/* Every forwarded driver function is gated but the three queries. */
	for (i = 0; i < FWD_COUNT; i++)
		bad += !check_trampoline(i);
	CHECK_EQ_INT(bad, 0);
	for (i = 0; i < sizeof(ungated) / sizeof(ungated[0]); i++) {
		const char *const *hit = NULL;

		for (size_t k = 0; k < FWD_COUNT; k++)
			if (!strcmp(fwd_names[k], ungated[i]))
				hit = &fwd_names[k];
		CHECK(hit != NULL);
	}
	/* fwd_names is in strcmp order (cuGetProcAddress searches it). */
	for (i = 1; i < FWD_COUNT; i++)
		CHECK(strcmp(fwd_names[i - 1], fwd_names[i]) < 0);

	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	reg = (int (*)(const char *, fakecuda_kernel_fn, int, const size_t *))fakecuda_sym(
		"fakecuda_register_kernel");
	REQUIRE(reg);
	REQUIRE(reg("fill", shim_fill_kernel, 3, fill_sizes) == 0);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fill_fn, mod, "fill") == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&dbuf, 8192) == CUDA_SUCCESS);
	REQUIRE(cuMemsetD8_v2(dbuf, 0, 8192) == CUDA_SUCCESS);

	/* cudart's way in: a looked-up cuMemcpyHtoD is gpucr's trampoline. */
	REQUIRE(cuGetProcAddress_v2("cuGetProcAddress", (void **)&gpa, CUDA_VERSION, 0, &st) ==
		CUDA_SUCCESS);
	REQUIRE(gpa("cuMemcpyHtoD", (void **)&htod, CUDA_VERSION, 0, &st) == CUDA_SUCCESS);
	CHECK((void *)htod == (void *)cuMemcpyHtoD_v2);

	pthread_barrier_init(&ready_b, NULL, 5);
	pthread_barrier_init(&go_b, NULL, 5);
	REQUIRE(pthread_create(&th[0], NULL, t_launch, NULL) == 0);
	REQUIRE(pthread_create(&th[1], NULL, t_memcpy_ptr, (void *)htod) == 0);
	REQUIRE(pthread_create(&th[2], NULL, t_alloc, NULL) == 0);
	REQUIRE(pthread_create(&th[3], NULL, t_sync, NULL) == 0);
	pthread_barrier_wait(&ready_b);
	gate_close();
	pthread_barrier_wait(&go_b);
	CHECK(wait_waiters(4, 5000));
	usleep(50 * 1000);
	for (i = 0; i < 4; i++)
		CHECK_EQ_INT(__atomic_load_n(&done[i], __ATOMIC_ACQUIRE), 0);

	/* Pure queries answer while closed. */
	CHECK_EQ_INT(cuDriverGetVersion(&ver), CUDA_SUCCESS);
	CHECK(ver > 0);
	CHECK_EQ_INT(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s), CUDA_SUCCESS);
	CHECK(s != NULL);
	{
		void *p = NULL;

		CHECK_EQ_INT(gpa("cuLaunchKernel", &p, CUDA_VERSION, 0, &st), CUDA_SUCCESS);
		CHECK(p == (void *)cuLaunchKernel);
	}
	/* gpucr's own threads pass. */
	REQUIRE(pthread_create(&te, NULL, t_exempt, &exempt_n) == 0);
	pthread_join(te, NULL);
	CHECK_EQ_INT(exempt_n, 1);

	/* A forked child starts with the gate open. */
	{
		pid_t pid = fork();
		int status = 0;

		REQUIRE(pid >= 0);
		if (pid == 0) {
			int n = -1;

			alarm(5);
			cuDeviceGetCount(&n); /* returns (whatever it says) instead of blocking */
			_exit(gate_is_closed() ? 2 : 0);
		}
		REQUIRE(waitpid(pid, &status, 0) == pid);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	CHECK_EQ_INT(gate_waiters(), 4);

	gate_open();
	for (i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < 4; i++)
		CHECK_EQ_INT(results[i], CUDA_SUCCESS);
	CHECK_EQ_INT(errno_after[0], 4242);
	CHECK_EQ_INT(errno_after[1], 4343);
	CHECK_EQ_INT(errno_after[2], 4444);
	CHECK_EQ_INT(gate_waiters(), 0);
	REQUIRE(cuMemcpyDtoH_v2(host, dbuf, sizeof(host)) == CUDA_SUCCESS);
	CHECK_EQ_INT(host[0], 7);
	CHECK_EQ_INT(host[255], 7);
	REQUIRE(cuMemcpyDtoH_v2(host, dbuf + 4096, 16 * sizeof(int)) == CUDA_SUCCESS);
	CHECK_EQ_INT(host[0], 1);
	CHECK_EQ_INT(host[15], 16);
	CHECK(new_alloc != 0);
	CHECK_EQ_INT(cuMemFree_v2(new_alloc), CUDA_SUCCESS);

	/* Counted wrappers in flight: the closer waits for them. */
	REQUIRE(pthread_create(&tc, NULL, t_counted, &release) == 0);
	usleep(20 * 1000);
	gate_close();
	CHECK_EQ_INT(gate_wait_idle(50), -ETIMEDOUT);
	__atomic_store_n(&release, 1, __ATOMIC_RELEASE);
	CHECK_EQ_INT(gate_wait_idle(5000), 0);
	pthread_join(tc, NULL);
	gate_open();

	CHECK_EQ_INT(cuMemFree_v2(dbuf), CUDA_SUCCESS);
	return t_done();
}
