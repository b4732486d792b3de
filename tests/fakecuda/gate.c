/* fakecuda gate: what every driver call passes on its way in and out.  It
 * owns this process's checkpoint state page (created at cuInit, recreated
 * in a forked child, unlinked at exit; pages of processes that died
 * RUNNING are swept at the next cuInit), blocks callers while another
 * process holds us LOCKED or CHECKPOINTED, counts the calls in flight so
 * that a lock can wait for them to drain, and applies injected faults
 * (FAKECUDA_FAIL, fakecuda_inject_fault).  With FAKECUDA_RESTORE_THREAD it
 * also runs the thread that serves the checkpoint API in this process. */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static struct fk_page *self_page;
static pid_t self_pid;
static int page_pending;  /* forked child: page not created yet */
static __thread int depth;  /* nesting: a kernel may call the driver */

#define FK_MAX_FAULTS 16

struct fault {
	char fn[64];
	unsigned int nth, calls;
	CUresult err;
};

static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fault faults[FK_MAX_FAULTS];
static int nfaults;

void fk_state_path(char *buf, size_t len, pid_t pid)
{
	const char *dir = getenv("FAKECUDA_STATE_DIR");

	if (!dir || !*dir)
		dir = "/dev/shm";
	snprintf(buf, len, FAKECUDA_STATE_FMT, dir, (int)pid);
}

static int env_on(const char *name)
{
	const char *v = getenv(name);

	return v && *v && strcmp(v, "0") != 0;
}

/* FAKECUDA_RESTORE_THREAD: the driver serves the checkpoint API through a
 * thread of its own in the target (cuCheckpointProcessGetRestoreThreadId),
 * so a lock, checkpoint, restore, unlock or state query of a process whose
 * threads are all stopped (a tracer holds them) does not complete until a
 * tool lets that thread run.  This thread answers every call posted on the
 * page; a stopped one answers none. */
static void *restore_thread(void *arg)
{
	static const struct timespec pause = { 0, 500000 };
	struct fk_page *p = arg;

	__atomic_store_n(&p->restore_tid, (int32_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
	for (;;) {
		uint32_t c = __atomic_load_n(&p->calls, __ATOMIC_ACQUIRE);

		if (__atomic_load_n(&p->served, __ATOMIC_RELAXED) != c)
			__atomic_store_n(&p->served, c, __ATOMIC_RELEASE);
		nanosleep(&pause, NULL);
	}
	return NULL;
}

/* Starts the restore thread of page p (signals blocked: they are the
 * application's) and waits until it has published its tid. */
static void restore_thread_start(struct fk_page *p)
{
	static const struct timespec pause = { 0, 100000 };
	sigset_t all, old;
	pthread_attr_t a;
	pthread_t th;
	int r;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 << 10);
	r = pthread_create(&th, &a, restore_thread, p);
	pthread_attr_destroy(&a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		fprintf(stderr, "fakecuda: cannot start the restore thread: %s\n", strerror(r));
		return;
	}
	while (__atomic_load_n(&p->restore_tid, __ATOMIC_ACQUIRE) == p->pid)
		nanosleep(&pause, NULL);
}

static struct fk_page *page_create(void)
{
	char path[PATH_MAX];
	pid_t pid = getpid();
	struct fk_page *p;
	int fd;

	fk_state_path(path, sizeof(path), pid);
	/* O_TRUNC: a file left by an earlier process with our pid is stale. */
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, FK_PAGE_SIZE) < 0) {
		close(fd);
		unlink(path);
		return NULL;
	}
	p = mmap(NULL, FK_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		unlink(path);
		return NULL;
	}
	p->version = FK_PAGE_VERSION;
	p->pid = pid;
	p->state = CU_PROCESS_STATE_RUNNING;
	p->restore_tid = pid;
	p->flags = (env_on("FAKECUDA_CKPT_KEEPS_MEMORY") ? FK_PAGE_KEEPS_MEMORY : 0) |
		   (env_on("FAKECUDA_RESTORE_THREAD") ? FK_PAGE_RESTORE_THREAD : 0);
	if (p->flags & FK_PAGE_RESTORE_THREAD)
		restore_thread_start(p);
	__atomic_store_n(&p->magic, FK_PAGE_MAGIC, __ATOMIC_RELEASE);
	self_pid = pid;
	return p;
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&fk_lock);
	pthread_mutex_lock(&fault_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&fault_lock);
	pthread_mutex_unlock(&fk_lock);
}

/* The child is a new CUDA process as far as checkpointing goes: it must
 * not answer for (or block on) its parent's page.  It gets its own at its
 * first driver call, not now, so that fork+exec leaves no state behind. */
static void atfork_child(void)
{
	pthread_mutex_unlock(&fault_lock);
	pthread_mutex_unlock(&fk_lock);
	if (self_page) {
		munmap(self_page, FK_PAGE_SIZE);
		self_page = NULL;
		__atomic_store_n(&page_pending, 1, __ATOMIC_RELEASE);
	}
}

/* Creates the page a forked child is owed.  fk_lock held. */
static void page_settle_locked(void)
{
	if (!__atomic_load_n(&page_pending, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&self_page, page_create(), __ATOMIC_RELEASE);
	__atomic_store_n(&page_pending, 0, __ATOMIC_RELEASE);
}

__attribute__((destructor)) static void page_remove(void)
{
	char path[PATH_MAX];

	if (!self_page || self_pid != getpid())
		return;
	fk_state_path(path, sizeof(path), self_pid);
	unlink(path);
}

/* "cuMemAlloc" matches cuMemAlloc and cuMemAlloc_v2; "cuMemAlloc_v2" only itself. */
static int name_match(const char *pat, const char *fn)
{
	size_t n = strlen(pat);
	const char *p;

	if (strncmp(pat, fn, n) != 0)
		return 0;
	if (!fn[n])
		return 1;
	if (fn[n] != '_' || fn[n + 1] != 'v' || !isdigit((unsigned char)fn[n + 2]))
		return 0;
	for (p = fn + n + 2; isdigit((unsigned char)*p); p++)
		;
	return *p == '\0';
}

CUresult fk_fault_check(const char *fn)
{
	CUresult rc = CUDA_SUCCESS;

	pthread_mutex_lock(&fault_lock);
	for (int i = 0; i < nfaults; i++) {
		if (!name_match(faults[i].fn, fn))
			continue;
		if (++faults[i].calls == faults[i].nth) {
			rc = faults[i].err;
			memmove(&faults[i], &faults[i + 1], (size_t)(nfaults - i - 1) * sizeof(faults[0]));
			__atomic_store_n(&nfaults, nfaults - 1, __ATOMIC_RELAXED);
		}
		break;
	}
	pthread_mutex_unlock(&fault_lock);
	return rc;
}

FAKECUDA_API int fakecuda_inject_fault(const char *fn, unsigned nth, CUresult err)
{
	int i, rc = 0;

	if (!fn || !*fn || strlen(fn) >= sizeof(faults[0].fn))
		return -EINVAL;
	pthread_mutex_lock(&fault_lock);
	for (i = 0; i < nfaults; i++)
		if (strcmp(faults[i].fn, fn) == 0)
			break;
	if (nth == 0) {
		if (i < nfaults) {
			memmove(&faults[i], &faults[i + 1], (size_t)(nfaults - i - 1) * sizeof(faults[0]));
			__atomic_store_n(&nfaults, nfaults - 1, __ATOMIC_RELAXED);
		}
	} else if (i == nfaults && nfaults == FK_MAX_FAULTS) {
		rc = -ENOSPC;
	} else {
		snprintf(faults[i].fn, sizeof(faults[i].fn), "%s", fn);
		faults[i].nth = nth;
		faults[i].calls = 0;
		faults[i].err = err;
		if (i == nfaults)
			__atomic_store_n(&nfaults, nfaults + 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&fault_lock);
	return rc;
}

/* FAKECUDA_FAIL=fn[:nth[:code]][,...]; malformed entries are skipped. */
static void faults_from_env(void)
{
	const char *env = getenv("FAKECUDA_FAIL");
	char *s, *save = NULL;

	if (!env || !*env || !(s = strdup(env)))
		return;
	for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *nth = strchr(tok, ':'), *code = NULL;
		unsigned long n = 1, c = CUDA_ERROR_UNKNOWN;

		if (nth) {
			*nth++ = '\0';
			code = strchr(nth, ':');
			if (code)
				*code++ = '\0';
			n = strtoul(nth, NULL, 0);
			if (code)
				c = strtoul(code, NULL, 0);
		}
		if (n > 0)
			fakecuda_inject_fault(tok, (unsigned)n, (CUresult)c);
	}
	free(s);
}

/* Removes the state files of processes that died RUNNING without their
 * destructor (_exit, a signal).  A process killed after a driver checkpoint
 * (CHECKPOINTED: CRIU dumped it) keeps its file for the restore. */
static void sweep_stale(void)
{
	const char *dir = getenv("FAKECUDA_STATE_DIR");
	struct dirent *de;
	DIR *d;

	if (!dir || !*dir)
		dir = "/dev/shm";
	d = opendir(dir);
	if (!d)
		return;
	while ((de = readdir(d))) {
		struct fk_page page;
		char *end;
		long pid;
		int fd;

		if (strncmp(de->d_name, "fakecuda-ckpt-", 14) != 0)
			continue;
		pid = strtol(de->d_name + 14, &end, 10);
		if (*end || pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			continue;
		if (pread(fd, &page, sizeof(page), 0) == (ssize_t)sizeof(page) && page.magic == FK_PAGE_MAGIC &&
		    page.pid == pid && page.state == CU_PROCESS_STATE_RUNNING)
			unlinkat(dirfd(d), de->d_name, 0);
		close(fd);
	}
	closedir(d);
}

CUresult fk_gate_init(void)
{
	static int atfork_done;

	if (fk.initialized) {
		page_settle_locked();  /* cuInit again in a forked child */
		return self_page ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
	}
	faults_from_env();
	sweep_stale();
	self_page = page_create();
	if (!self_page)
		return CUDA_ERROR_OPERATING_SYSTEM;
	if (!atfork_done && pthread_atfork(atfork_prepare, atfork_parent, atfork_child) == 0)
		atfork_done = 1;
	return CUDA_SUCCESS;
}

FAKECUDA_API int fakecuda_set_restore_thread(pid_t tid)
{
	if (tid <= 0)
		return -EINVAL;
	fk_lock_take();
	page_settle_locked();
	fk_lock_drop();
	if (!self_page)
		return -EINVAL;
	__atomic_store_n(&self_page->restore_tid, (int32_t)tid, __ATOMIC_RELEASE);
	return 0;
}

CUresult fk_gate_enter(const char *fn, struct fk_gate *g)
{
	static const struct timespec pause = { 0, 1000000 };
	struct fk_page *p;

	g->saved_errno = errno;
	if (!__atomic_load_n(&fk.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (__atomic_load_n(&nfaults, __ATOMIC_RELAXED)) {
		CUresult rc = fk_fault_check(fn);

		if (rc != CUDA_SUCCESS)
			return rc;
	}
	g->entered = 1;
	if (__atomic_load_n(&page_pending, __ATOMIC_ACQUIRE)) {
		fk_lock_take();
		page_settle_locked();
		fk_lock_drop();
	}
	p = __atomic_load_n(&self_page, __ATOMIC_ACQUIRE);
	if (depth++ > 0 || !p)
		return CUDA_SUCCESS;
	/* Raise `active` and then re-check the state: the locker sets the state
	 * and then waits for `active` to drain, so one of us sees the other. */
	for (;;) {
		if (__atomic_load_n(&p->state, __ATOMIC_SEQ_CST) == CU_PROCESS_STATE_RUNNING) {
			__atomic_add_fetch(&p->active, 1, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&p->state, __ATOMIC_SEQ_CST) == CU_PROCESS_STATE_RUNNING) {
				g->page = p;
				return CUDA_SUCCESS;
			}
			__atomic_sub_fetch(&p->active, 1, __ATOMIC_SEQ_CST);
		}
		nanosleep(&pause, NULL);
	}
}

void fk_gate_leave(struct fk_gate *g)
{
	/* After a fork inside a call the page is the child's new one. */
	if (g->page && g->page == __atomic_load_n(&self_page, __ATOMIC_ACQUIRE))
		__atomic_sub_fetch(&g->page->active, 1, __ATOMIC_SEQ_CST);
	if (g->entered)
		depth--;
	errno = g->saved_errno;
}
