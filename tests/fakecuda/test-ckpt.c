/* test-ckpt: the driver checkpoint API driven from another process.  The
 * parent plays the checkpoint tool; a forked child is the CUDA process that
 * holds VMM and cuMemAlloc memory and obeys commands over a pipe.  Checks:
 * state moves RUNNING/LOCKED/CHECKPOINTED across processes, a locked
 * target's driver calls block until unlock, a lock waits for a running
 * kernel (and times out leaving it RUNNING), checkpoint is refused while
 * device or managed memory is held (naming the bytes) and accepted once
 * the child released it, and non-CUDA pids are refused.  A target that
 * opts into the driver-like mode (FAKECUDA_CKPT_KEEPS_MEMORY,
 * FAKECUDA_RESTORE_THREAD) is checkpointed with its memory intact, and the
 * calls it needs its restore thread for fail while a tracer stops it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#include "fakecuda.h"
#include "testutil.h"

#define MIB (1UL << 20)

static volatile int *shm; /* [0]: keep spinning, [1]: spin kernel running */

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static void spin(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
	shm[1] = 1;
	while (shm[0])
		sleep_ms(1);
	shm[1] = 0;
}

static void put(int fd, const void *buf, size_t n)
{
	CHECK(write(fd, buf, n) == (ssize_t)n);
}

/* Reads n bytes, failing if they take longer than timeout_ms. */
static int get(int fd, void *buf, size_t n, int timeout_ms)
{
	struct pollfd p = { fd, POLLIN, 0 };

	if (poll(&p, 1, timeout_ms) != 1)
		return -1;
	return read(fd, buf, n) == (ssize_t)n ? 0 : -1;
}

static void expect_ack(int fd, char want)
{
	char c = 0;

	CHECK(get(fd, &c, 1, 10000) == 0);
	CHECK(c == want);
}

static void *idle_thread(void *arg)
{
	*(volatile pid_t *)arg = (pid_t)syscall(SYS_gettid);
	for (;;)
		pause();
	return NULL;
}

/* A target that opts into the driver-like behaviour: its checkpoint keeps
 * device memory, and a restore thread of its own serves the API.  Holds
 * 1 MiB with a pattern, checks it on "q" and exits with 0 if intact. */
static int target_like_driver(int cmd, int ack)
{
	CUdeviceptr p;
	CUcontext ctx;
	uint32_t buf[256];
	char c;

	setenv("FAKECUDA_CKPT_KEEPS_MEMORY", "1", 1);
	setenv("FAKECUDA_RESTORE_THREAD", "1", 1);
	CU_OK(cuInit(0)); /* a forked child: its state page is made now */
	CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	CU_OK(cuCtxSetCurrent(ctx));
	CU_OK(cuMemAlloc(&p, 1 * MIB));
	CU_OK(cuMemsetD32(p, 0x5eed, MIB / 4));
	put(ack, "R", 1);
	CHECK(get(cmd, &c, 1, 30000) == 0 && c == 'q');
	CU_OK(cuMemcpyDtoH(buf, p + MIB - sizeof(buf), sizeof(buf)));
	for (size_t i = 0; i < 256; i++)
		CHECK(buf[i] == 0x5eed);
	CU_OK(cuMemFree(p));
	return 0;
}

/* ---- the target ---- */

static int target(int cmd, int ack)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	CUmemGenericAllocationHandle h;
	CUdeviceptr va, legacy, managed = 0;
	CUcontext ctx;
	CUfunction fspin;
	CUmodule mod;
	pthread_t thr;
	volatile pid_t tid = 0;
	int fd;

	CU_OK(cuInit(0)); /* already done before the fork: a no-op */
	CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
	CU_OK(cuCtxSetCurrent(ctx));
	CHECK(fakecuda_register_kernel("spin", spin, 0, NULL) == 0);
	CU_OK(cuModuleLoadData(&mod, "image"));
	CU_OK(cuModuleGetFunction(&fspin, mod, "spin"));

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU_OK(cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0));
	CU_OK(cuMemCreate(&h, 2 * MIB, &prop, 0));
	CU_OK(cuMemMap(va, 2 * MIB, 0, h, 0));
	CU_OK(cuMemSetAccess(va, 2 * MIB, &acc, 1));
	CU_OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CU_OK(cuMemAlloc(&legacy, 1 * MIB));
	put(ack, "R", 1);

	for (;;) {
		char c;
		int ms;
		long t0;

		if (read(cmd, &c, 1) != 1)
			return 1;
		switch (c) {
		case 'c': /* one driver call, timed */
			t0 = now_ms();
			CU_OK(cuCtxSynchronize());
			ms = (int)(now_ms() - t0);
			put(ack, &ms, sizeof(ms));
			break;
		case 'r': /* release all device memory, as gpucr's release step */
			CU_OK(cuMemUnmap(va, 2 * MIB));
			CU_OK(cuMemRelease(h));
			close(fd);
			CU_OK(cuMemFree(legacy));
			put(ack, "r", 1);
			break;
		case 'k': /* a kernel that runs until the parent clears shm[0] */
			shm[0] = 1;
			CU_OK(cuLaunchKernel(fspin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
			put(ack, "k", 1);
			break;
		case 'm':
			CU_OK(cuMemAllocManaged(&managed, 1 * MIB, CU_MEM_ATTACH_GLOBAL));
			put(ack, "m", 1);
			break;
		case 'M':
			CU_OK(cuMemFree(managed));
			put(ack, "M", 1);
			break;
		case 't': /* name another thread as the restore thread */
			CHECK(pthread_create(&thr, NULL, idle_thread, (void *)&tid) == 0);
			while (!tid)
				sleep_ms(1);
			CHECK(fakecuda_set_restore_thread(tid) == 0);
			put(ack, (const void *)&tid, sizeof(pid_t));
			break;
		case 'q':
			CU_OK(cuMemAddressFree(va, 4 * MIB));
			return 0;
		default:
			return 1;
		}
	}
}

/* ---- the checkpoint tool ---- */

/* Forks a target fn(cmd, ack) and waits for its 'R'; *ret_cmd, *ret_ack
 * are the parent's ends of the pipes. */
static pid_t spawn(int (*fn)(int cmd, int ack), int *ret_cmd, int *ret_ack)
{
	int to_child[2], from_child[2];
	pid_t pid;

	CHECK(pipe2(to_child, O_CLOEXEC) == 0 && pipe2(from_child, O_CLOEXEC) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(to_child[1]);
		close(from_child[0]);
		exit(fn(to_child[0], from_child[1])); /* exit: the fake removes its state file */
	}
	close(to_child[0]);
	close(from_child[1]);
	*ret_cmd = to_child[1];
	*ret_ack = from_child[0];
	expect_ack(*ret_ack, 'R');
	return pid;
}

static void expect_state(pid_t pid, CUprocessState want)
{
	CUprocessState st = (CUprocessState)99;

	CU_OK(cuCheckpointProcessGetState(pid, &st));
	if (st != want) {
		fprintf(stderr, "pid %d: state %d, expected %d\n", (int)pid, (int)st, (int)want);
		exit(1);
	}
}

/* Runs a checkpoint that must fail, and returns what it printed. */
static void checkpoint_refused(pid_t pid, char *msg, size_t len)
{
	char path[] = "/tmp/fakecuda-test-ckpt-XXXXXX";
	int tmp = mkstemp(path), saved = dup(2);
	ssize_t n;

	CHECK(tmp >= 0 && saved >= 0);
	unlink(path);
	fflush(stderr);
	dup2(tmp, 2);
	CU_EXPECT(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_INVALID_VALUE);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	n = pread(tmp, msg, len - 1, 0);
	close(tmp);
	msg[n > 0 ? n : 0] = '\0';
	fprintf(stderr, "(expected) %s", msg);
}

static void *release_spin(void *arg)
{
	(void)arg;
	sleep_ms(200);
	shm[0] = 0;
	return NULL;
}

int main(void)
{
	int to_child[2], from_child[2], status, tid, ms;
	struct fakecuda_held held;
	CUcheckpointLockArgs largs;
	CUcheckpointRestoreArgs rargs;
	CUcheckpointGpuPair pair;
	char msg[1024], path[256];
	pthread_t thr;
	pid_t pid, other, ntid;
	long t0;

	test_time_limit(60);
	shm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(shm != MAP_FAILED);
	{
		CUprocessState st;

		CU_EXPECT(cuCheckpointProcessGetState(getpid(), &st), CUDA_ERROR_NOT_INITIALIZED);
	}
	CU_OK(cuInit(0));
	expect_state(getpid(), CU_PROCESS_STATE_RUNNING);

	pid = spawn(target, &to_child[1], &from_child[0]);

	/* A forked child is a process of its own to the checkpoint API. */
	expect_state(pid, CU_PROCESS_STATE_RUNNING);
	CU_OK(cuCheckpointProcessGetRestoreThreadId(pid, &tid));
	CHECK(tid == pid);
	CU_EXPECT(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CU_EXPECT(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);

	/* Locked: the child's next driver call waits for the unlock. */
	CU_OK(cuCheckpointProcessLock(pid, NULL));
	expect_state(pid, CU_PROCESS_STATE_LOCKED);
	expect_state(getpid(), CU_PROCESS_STATE_RUNNING);
	CU_EXPECT(cuCheckpointProcessLock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	put(to_child[1], "c", 1);
	CHECK(get(from_child[0], &ms, sizeof(ms), 300) < 0); /* still blocked */

	/* Holding 2 MiB mapped (+ its exported fd) and 1 MiB cuMemAlloc: refused. */
	CHECK(fakecuda_held_bytes(pid, &held) == 0);
	CHECK(held.mapped_bytes == 3 * MIB && held.fd_bytes == 0 && held.managed_bytes == 0);
	checkpoint_refused(pid, msg, sizeof(msg));
	CHECK(strstr(msg, "3145728 bytes of device memory") != NULL);
	expect_state(pid, CU_PROCESS_STATE_LOCKED);

	CU_OK(cuCheckpointProcessUnlock(pid, NULL));
	CHECK(get(from_child[0], &ms, sizeof(ms), 5000) == 0);
	CHECK(ms >= 250);
	expect_state(pid, CU_PROCESS_STATE_RUNNING);

	/* Released: accepted, and the full cycle runs. */
	put(to_child[1], "r", 1);
	expect_ack(from_child[0], 'r');
	CHECK(fakecuda_held_bytes(pid, &held) == 0);
	CHECK(held.mapped_bytes == 0 && held.fd_bytes == 0 && held.nmaps == 0 && held.nfds == 0);
	CU_OK(cuCheckpointProcessLock(pid, NULL));
	CU_OK(cuCheckpointProcessCheckpoint(pid, NULL));
	expect_state(pid, CU_PROCESS_STATE_CHECKPOINTED);
	CU_EXPECT(cuCheckpointProcessCheckpoint(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	CU_EXPECT(cuCheckpointProcessUnlock(pid, NULL), CUDA_ERROR_ILLEGAL_STATE);
	put(to_child[1], "c", 1);
	CHECK(get(from_child[0], &ms, sizeof(ms), 200) < 0); /* blocked while checkpointed too */
	memset(&rargs, 0, sizeof(rargs));
	memset(&pair, 0, sizeof(pair));
	rargs.gpuPairs = &pair;
	rargs.gpuPairsCount = 1; /* remapping onto a GPU this host lacks */
	CU_EXPECT(cuCheckpointProcessRestore(pid, &rargs), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuDeviceGetUuid(&pair.oldUuid, 0));
	pair.newUuid = pair.oldUuid;
	CU_OK(cuCheckpointProcessRestore(pid, &rargs));
	expect_state(pid, CU_PROCESS_STATE_LOCKED);
	CU_OK(cuCheckpointProcessUnlock(pid, NULL));
	expect_state(pid, CU_PROCESS_STATE_RUNNING);
	CHECK(get(from_child[0], &ms, sizeof(ms), 5000) == 0);

	/* A kernel that does not finish: a lock with a timeout gives up and
	 * leaves the process running; one without waits for it. */
	shm[1] = 0;
	put(to_child[1], "k", 1);
	while (!shm[1])
		sleep_ms(1);
	memset(&largs, 0, sizeof(largs));
	largs.timeoutMs = 100;
	t0 = now_ms();
	CU_EXPECT(cuCheckpointProcessLock(pid, &largs), CUDA_ERROR_NOT_READY);
	CHECK(now_ms() - t0 >= 90);
	expect_state(pid, CU_PROCESS_STATE_RUNNING);
	CHECK(pthread_create(&thr, NULL, release_spin, NULL) == 0);
	t0 = now_ms();
	CU_OK(cuCheckpointProcessLock(pid, NULL));
	CHECK(now_ms() - t0 >= 150);
	CHECK(pthread_join(thr, NULL) == 0);
	expect_state(pid, CU_PROCESS_STATE_LOCKED);
	CU_OK(cuCheckpointProcessUnlock(pid, NULL));
	expect_ack(from_child[0], 'k');

	/* Managed memory cannot be checkpointed either. */
	put(to_child[1], "m", 1);
	expect_ack(from_child[0], 'm');
	CU_OK(cuCheckpointProcessLock(pid, NULL));
	checkpoint_refused(pid, msg, sizeof(msg));
	CHECK(strstr(msg, "1048576 bytes of managed memory") != NULL);
	CU_OK(cuCheckpointProcessUnlock(pid, NULL));
	put(to_child[1], "M", 1);
	expect_ack(from_child[0], 'M');

	/* The target may name another thread as its restore thread. */
	put(to_child[1], "t", 1);
	CHECK(get(from_child[0], &ntid, sizeof(ntid), 5000) == 0);
	CU_OK(cuCheckpointProcessGetRestoreThreadId(pid, &tid));
	CHECK(tid == ntid && tid != pid);

	put(to_child[1], "q", 1);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* Its state went with it. */
	snprintf(path, sizeof(path), FAKECUDA_STATE_FMT, getenv("FAKECUDA_STATE_DIR") ? getenv("FAKECUDA_STATE_DIR") : "/dev/shm",
		 (int)pid);
	CHECK(access(path, F_OK) < 0 && errno == ENOENT);
	CU_EXPECT(cuCheckpointProcessLock(pid, NULL), CUDA_ERROR_INVALID_VALUE);

	/* A process that never loaded the fake, even with a stale state file
	 * under its pid, is not a CUDA process. */
	other = fork();
	CHECK(other >= 0);
	if (other == 0) {
		execl("/bin/sleep", "sleep", "30", (char *)NULL);
		_exit(127);
	}
	sleep_ms(50);
	snprintf(path, sizeof(path), FAKECUDA_STATE_FMT, getenv("FAKECUDA_STATE_DIR") ? getenv("FAKECUDA_STATE_DIR") : "/dev/shm",
		 (int)other);
	{
		CUprocessState st;
		int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

		CU_EXPECT(cuCheckpointProcessGetState(other, &st), CUDA_ERROR_INVALID_VALUE);
		CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
		close(fd);
		CU_EXPECT(cuCheckpointProcessGetState(other, &st), CUDA_ERROR_INVALID_VALUE);
		CU_EXPECT(cuCheckpointProcessLock(other, NULL), CUDA_ERROR_INVALID_VALUE);
		unlink(path);
	}
	kill(other, SIGKILL);
	CHECK(waitpid(other, &status, 0) == other);

	/* FAKECUDA_CKPT_KEEPS_MEMORY + FAKECUDA_RESTORE_THREAD in the target:
	 * checkpointed with its memory, and every call but the restore thread
	 * id needs that thread to run (a tracer holding it stopped makes them
	 * time out here; the driver would wait). */
	setenv("FAKECUDA_RESTORE_THREAD_WAIT_MS", "300", 1);
	pid = spawn(target_like_driver, &to_child[1], &from_child[0]);
	CU_OK(cuCheckpointProcessGetRestoreThreadId(pid, &tid));
	CHECK(tid != pid && tid > 0);
	CU_OK(cuCheckpointProcessLock(pid, NULL));
	CHECK(fakecuda_held_bytes(pid, &held) == 0 && held.mapped_bytes == 1 * MIB);
	CU_OK(cuCheckpointProcessCheckpoint(pid, NULL));
	expect_state(pid, CU_PROCESS_STATE_CHECKPOINTED);
	CHECK(ptrace(PTRACE_SEIZE, tid, NULL, 0) == 0);
	CHECK(ptrace(PTRACE_INTERRUPT, tid, NULL, 0) == 0);
	CHECK(waitpid(tid, &status, __WALL) == tid && WIFSTOPPED(status));
	{
		CUprocessState st;

		t0 = now_ms();
		CU_EXPECT(cuCheckpointProcessRestore(pid, NULL), CUDA_ERROR_TIMEOUT);
		CHECK(now_ms() - t0 >= 290);
		CU_EXPECT(cuCheckpointProcessGetState(pid, &st), CUDA_ERROR_TIMEOUT);
		CU_OK(cuCheckpointProcessGetRestoreThreadId(pid, &ntid));
		CHECK(ntid == tid);
	}
	CHECK(ptrace(PTRACE_DETACH, tid, NULL, 0) == 0);
	expect_state(pid, CU_PROCESS_STATE_CHECKPOINTED);
	CU_OK(cuCheckpointProcessRestore(pid, NULL));
	CU_OK(cuCheckpointProcessUnlock(pid, NULL));
	expect_state(pid, CU_PROCESS_STATE_RUNNING);
	put(to_child[1], "q", 1);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	printf("test-ckpt: ok\n");
	return 0;
}
