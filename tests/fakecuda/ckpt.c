/* fakecuda ckpt: the driver checkpoint API, called from another process (a
 * daemon, a CRIU plugin, a checkpoint tool) on a target pid, and the scan
 * of the device memory a process holds.  State moves RUNNING -> LOCKED ->
 * CHECKPOINTED -> LOCKED -> RUNNING through the target's state page (see
 * gate.c).  By default a checkpoint succeeds only when the target holds no
 * device memory, which is what lets tests prove that gpucr really released
 * it; a target started with FAKECUDA_CKPT_KEEPS_MEMORY=1 is checkpointed
 * with its memory, as by the driver (tests of the plain driver flow).
 * FAKECUDA_FAIL in the caller makes lock, checkpoint, restore or unlock
 * fail, leaving the target in the state it was in. */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- held memory scan ---- */

struct inodes {
	ino_t *v;
	size_t n, cap;
};

static int inodes_add(struct inodes *s, ino_t ino)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		ino_t *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = ino;
	return 0;
}

static int ino_cmp(const void *a, const void *b)
{
	ino_t x = *(const ino_t *)a, y = *(const ino_t *)b;

	return x < y ? -1 : x > y;
}

static int inodes_has(const struct inodes *s, ino_t ino)
{
	return s->n && bsearch(&ino, s->v, s->n, sizeof(ino), ino_cmp) != NULL;
}

static void inodes_sort(struct inodes *s)
{
	if (s->n > 1)
		qsort(s->v, s->n, sizeof(ino_t), ino_cmp);
}

static int scan_maps(pid_t pid, struct fakecuda_held *h, struct inodes *phys)
{
	char path[64], line[PATH_MAX + 128];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned long start, end, ino;
		int name_at = 0;
		const char *name;

		if (sscanf(line, "%lx-%lx %*s %*x %*x:%*x %lu %n", &start, &end, &ino, &name_at) < 3 || !name_at)
			continue;
		name = line + name_at;
		if (strncmp(name, "/memfd:" FAKECUDA_PHYS_NAME, strlen("/memfd:" FAKECUDA_PHYS_NAME)) == 0) {
			h->mapped_bytes += end - start;
			h->nmaps++;
			if (inodes_add(phys, (ino_t)ino) < 0) {
				fclose(f);
				return -ENOMEM;
			}
		} else if (strncmp(name, "/memfd:" FAKECUDA_MANAGED_NAME, strlen("/memfd:" FAKECUDA_MANAGED_NAME)) == 0) {
			h->managed_bytes += end - start;
			h->nmaps++;
		}
	}
	fclose(f);
	return 0;
}

static int scan_fds(pid_t pid, struct fakecuda_held *h, struct inodes *phys)
{
	char path[64], link[PATH_MAX];
	struct dirent *de;
	DIR *d;
	int rc = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		struct stat st;
		ssize_t n;

		if (de->d_name[0] == '.')
			continue;
		n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
		if (n < 0)
			continue;  /* closed meanwhile */
		link[n] = '\0';
		if (strncmp(link, "/memfd:" FAKECUDA_PHYS_NAME, strlen("/memfd:" FAKECUDA_PHYS_NAME)) != 0)
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, 0) < 0)
			continue;
		if (inodes_has(phys, st.st_ino))
			continue;  /* counted as mapped, or as an earlier fd */
		h->fd_bytes += (uint64_t)st.st_size;
		h->nfds++;
		rc = inodes_add(phys, st.st_ino);
		if (rc < 0)
			break;
		inodes_sort(phys);
	}
	closedir(d);
	return rc;
}

FAKECUDA_API int fakecuda_held_bytes(pid_t pid, struct fakecuda_held *ret)
{
	struct fakecuda_held h = { 0 };
	struct inodes phys = { 0 };
	int rc;

	if (!ret)
		return -EINVAL;
	if (pid == 0)
		pid = getpid();
	rc = scan_maps(pid, &h, &phys);
	if (rc == 0) {
		inodes_sort(&phys);
		rc = scan_fds(pid, &h, &phys);
	}
	free(phys.v);
	if (rc == 0)
		*ret = h;
	return rc;
}

/* ---- the target's state page ---- */

/* True when pid has the state file with this inode mapped: it is a live
 * fake-CUDA process, not a stale file left by an earlier owner of the pid. */
static int maps_state_file(pid_t pid, ino_t want)
{
	char path[64], line[PATH_MAX + 128];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f)) {
		unsigned long ino;
		int name_at = 0;

		if (sscanf(line, "%*x-%*x %*s %*x %*x:%*x %lu %n", &ino, &name_at) >= 1 && name_at &&
		    (ino_t)ino == want && strstr(line + name_at, "fakecuda-ckpt-"))
			found = 1;
	}
	fclose(f);
	return found;
}

static CUresult target_open(int pid, struct fk_page **ret)
{
	char path[PATH_MAX];
	struct fk_page *p;
	struct stat st;
	int fd;

	if (!__atomic_load_n(&fk.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (pid <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	fk_state_path(path, sizeof(path), pid);
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == EACCES || errno == EPERM ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_INVALID_VALUE;
	if (fstat(fd, &st) < 0 || st.st_size < FK_PAGE_SIZE || !maps_state_file(pid, st.st_ino)) {
		close(fd);
		return CUDA_ERROR_INVALID_VALUE;
	}
	p = mmap(NULL, FK_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (__atomic_load_n(&p->magic, __ATOMIC_ACQUIRE) != FK_PAGE_MAGIC || p->pid != pid) {
		munmap(p, FK_PAGE_SIZE);
		return CUDA_ERROR_INVALID_VALUE;
	}
	*ret = p;
	return CUDA_SUCCESS;
}

static int move_state(struct fk_page *p, CUprocessState from, CUprocessState to)
{
	uint32_t expect = from;

	if (!__atomic_compare_exchange_n(&p->state, &expect, (uint32_t)to, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		return 0;
	__atomic_add_fetch(&p->transitions, 1, __ATOMIC_RELAXED);
	return 1;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* FAKECUDA_CKPT_DELAY_MS in the caller: checkpoint and restore take that
 * long, as the driver's do even for a process that released its device
 * memory (0.4 s and 0.25 s on an H200), so tests can order other work
 * against them. */
static void ckpt_delay(void)
{
	const char *env = getenv("FAKECUDA_CKPT_DELAY_MS");
	unsigned long ms = env && *env ? strtoul(env, NULL, 10) : 0;
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
	int saved = errno;

	while (ms && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	errno = saved;
}

/* With FAKECUDA_RESTORE_THREAD in the target: the call needs the target's
 * restore thread to run (see gate.c).  The driver would wait for it without
 * end; the fake gives up after FAKECUDA_RESTORE_THREAD_WAIT_MS (default
 * 5000) with CUDA_ERROR_TIMEOUT and a line on stderr, so that a tool that
 * calls it with that thread stopped fails a test instead of hanging it. */
static CUresult restore_thread_call(struct fk_page *p, const char *fn)
{
	static const struct timespec pause = { 0, 200000 };
	const char *env = getenv("FAKECUDA_RESTORE_THREAD_WAIT_MS");
	unsigned wait_ms = env && *env ? (unsigned)strtoul(env, NULL, 10) : 5000;
	uint64_t deadline;
	uint32_t mine;

	if (!(__atomic_load_n(&p->flags, __ATOMIC_ACQUIRE) & FK_PAGE_RESTORE_THREAD))
		return CUDA_SUCCESS;
	mine = __atomic_add_fetch(&p->calls, 1, __ATOMIC_SEQ_CST);
	deadline = now_ms() + wait_ms;
	while ((int32_t)(__atomic_load_n(&p->served, __ATOMIC_ACQUIRE) - mine) < 0) {
		if (now_ms() >= deadline) {
			fprintf(stderr,
				"fakecuda: %s: pid %d: its restore thread %d did not run for %u ms (stopped by a "
				"tracer?); the driver would wait for it forever\n",
				fn, (int)p->pid, (int)__atomic_load_n(&p->restore_tid, __ATOMIC_ACQUIRE), wait_ms);
			return CUDA_ERROR_TIMEOUT;
		}
		nanosleep(&pause, NULL);
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	struct fk_page *p;
	CUresult rc;

	if (!state)
		return CUDA_ERROR_INVALID_VALUE;
	rc = target_open(pid, &p);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = restore_thread_call(p, __func__);
	if (rc == CUDA_SUCCESS)
		*state = (CUprocessState)__atomic_load_n(&p->state, __ATOMIC_SEQ_CST);
	munmap(p, FK_PAGE_SIZE);
	return rc;
}

CUresult CUDAAPI cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	struct fk_page *p;
	CUresult rc;

	if (!tid)
		return CUDA_ERROR_INVALID_VALUE;
	rc = target_open(pid, &p);
	if (rc != CUDA_SUCCESS)
		return rc;
	*tid = __atomic_load_n(&p->restore_tid, __ATOMIC_ACQUIRE);
	munmap(p, FK_PAGE_SIZE);
	return CUDA_SUCCESS;
}

/* Stops new driver calls in the target, then waits for those in flight
 * to return (a kernel that never ends keeps the lock waiting, as on a GPU).
 * On timeout the target is left RUNNING and CUDA_ERROR_NOT_READY returned. */
CUresult CUDAAPI cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	static const struct timespec pause = { 0, 1000000 };
	unsigned int timeout = args ? args->timeoutMs : 0;
	uint64_t deadline = now_ms() + timeout;
	struct fk_page *p;
	CUresult rc;

	rc = fk_fault_check(__func__); /* the target is left as it was */
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = target_open(pid, &p);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = restore_thread_call(p, __func__);
	if (rc != CUDA_SUCCESS)
		goto out;
	if (!move_state(p, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED)) {
		rc = CUDA_ERROR_ILLEGAL_STATE;
		goto out;
	}
	while (__atomic_load_n(&p->active, __ATOMIC_SEQ_CST) > 0) {
		if (timeout && now_ms() >= deadline) {
			move_state(p, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
			rc = CUDA_ERROR_NOT_READY;
			goto out;
		}
		nanosleep(&pause, NULL);
	}
out:
	munmap(p, FK_PAGE_SIZE);
	return rc;
}

CUresult CUDAAPI cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	struct fakecuda_held h;
	struct fk_page *p;
	CUresult rc;
	int err;

	(void)args;
	rc = fk_fault_check(__func__); /* the target is left as it was */
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = target_open(pid, &p);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (__atomic_load_n(&p->state, __ATOMIC_SEQ_CST) != CU_PROCESS_STATE_LOCKED) {
		rc = CUDA_ERROR_ILLEGAL_STATE;
		goto out;
	}
	rc = restore_thread_call(p, __func__);
	if (rc != CUDA_SUCCESS)
		goto out;
	/* FAKECUDA_CKPT_KEEPS_MEMORY: as the driver, which moves device memory
	 * into the process's host memory; the fake's already is host memory
	 * (memfd mappings, which CRIU dumps and restores with their bytes). */
	if (__atomic_load_n(&p->flags, __ATOMIC_ACQUIRE) & FK_PAGE_KEEPS_MEMORY)
		goto checkpointed;
	err = fakecuda_held_bytes(pid, &h);
	if (err < 0) {
		rc = err == -EACCES || err == -EPERM ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_OPERATING_SYSTEM;
		goto out;
	}
	if (h.mapped_bytes || h.fd_bytes || h.managed_bytes) {
		fprintf(stderr,
			"fakecuda: cuCheckpointProcessCheckpoint: pid %d still holds %" PRIu64
			" bytes of device memory (%" PRIu64 " mapped, %" PRIu64 " in open fds; %u mappings, %u fds) and %" PRIu64
			" bytes of managed memory; the fake driver can only checkpoint a process that holds none\n",
			pid, h.mapped_bytes + h.fd_bytes, h.mapped_bytes, h.fd_bytes, h.nmaps, h.nfds, h.managed_bytes);
		rc = CUDA_ERROR_INVALID_VALUE;
		goto out;
	}
checkpointed:
	ckpt_delay();
	if (!move_state(p, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED))
		rc = CUDA_ERROR_ILLEGAL_STATE;
out:
	munmap(p, FK_PAGE_SIZE);
	return rc;
}

static int known_uuid(const CUuuid *u)
{
	for (int i = 0; i < fk.ndev; i++)
		if (memcmp(u->bytes, fk.dev[i].uuid.bytes, sizeof(u->bytes)) == 0)
			return 1;
	return 0;
}

CUresult CUDAAPI cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	struct fk_page *p;
	CUresult rc;

	/* A remap may only name devices this (the restoring) host has. */
	if (args && args->gpuPairsCount) {
		if (!args->gpuPairs)
			return CUDA_ERROR_INVALID_VALUE;
		for (unsigned int i = 0; i < args->gpuPairsCount; i++)
			if (!known_uuid(&args->gpuPairs[i].newUuid))
				return CUDA_ERROR_INVALID_VALUE;
	}
	rc = fk_fault_check(__func__); /* the target is left as it was */
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = target_open(pid, &p);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = restore_thread_call(p, __func__);
	if (rc == CUDA_SUCCESS && __atomic_load_n(&p->state, __ATOMIC_SEQ_CST) == CU_PROCESS_STATE_CHECKPOINTED)
		ckpt_delay();
	if (rc == CUDA_SUCCESS && !move_state(p, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED))
		rc = CUDA_ERROR_ILLEGAL_STATE;
	munmap(p, FK_PAGE_SIZE);
	return rc;
}

CUresult CUDAAPI cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	struct fk_page *p;
	CUresult rc;

	(void)args;
	rc = fk_fault_check(__func__); /* the target is left as it was */
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = target_open(pid, &p);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = restore_thread_call(p, __func__);
	if (rc == CUDA_SUCCESS && !move_state(p, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING))
		rc = CUDA_ERROR_ILLEGAL_STATE;
	munmap(p, FK_PAGE_SIZE);
	return rc;
}
