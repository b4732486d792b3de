/* Owns the ptrace steps around the driver's restore thread. CRIU holds the
 * process stopped while its device hooks run, but the driver's checkpoint
 * and restore need that one thread running: let it run with every signal
 * blocked, and stop it again afterwards, as CRIU's cuda plugin does. */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>

#include "plugin.h"

#ifndef PTRACE_GETSIGMASK
#define PTRACE_GETSIGMASK 0x420a
#define PTRACE_SETSIGMASK 0x420b
#endif
#ifndef PTRACE_O_SUSPEND_SECCOMP
#define PTRACE_O_SUSPEND_SECCOMP (1 << 21)
#endif

int thread_resume(int tid, struct held_thread *h)
{
	uint64_t block = ~0ull & ~(1ull << (SIGTRAP - 1));

	memset(h, 0, sizeof(*h));
	h->tid = tid;
	if (ptrace(PTRACE_GETSIGMASK, tid, sizeof(h->sigmask), &h->sigmask) < 0) {
		if (errno == ESRCH) {
			/* The caller decides what that means. */
			pl_warn("thread %d: not stopped by CRIU (not traced, or gone)", tid);
			return -ESRCH;
		}
		pl_err("thread %d: cannot read its signal mask: %s", tid, strerror(errno));
		return -errno;
	}
	if (ptrace(PTRACE_SETSIGMASK, tid, sizeof(block), &block) < 0 ||
	    ptrace(PTRACE_SETOPTIONS, tid, NULL, 0) < 0 || ptrace(PTRACE_CONT, tid, NULL, 0) < 0) {
		pl_err("thread %d: cannot let it run: %s", tid, strerror(errno));
		return -errno;
	}
	return 0;
}

int thread_stop_again(struct held_thread *h)
{
	int status;

	if (ptrace(PTRACE_INTERRUPT, h->tid, NULL, 0) < 0) {
		pl_err("thread %d: cannot stop it again: %s; the process may be in a strange state", h->tid,
		       strerror(errno));
		return -errno;
	}
	for (;;) {
		pid_t r = waitpid(h->tid, &status, __WALL);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			pl_err("thread %d: wait after interrupt: %s", h->tid, strerror(errno));
			return -errno;
		}
		if (WIFSTOPPED(status))
			break;
		if (WIFEXITED(status) || WIFSIGNALED(status)) {
			pl_err("thread %d exited while the driver restored it", h->tid);
			return -ESRCH;
		}
	}
	if (ptrace(PTRACE_SETOPTIONS, h->tid, NULL, PTRACE_O_SUSPEND_SECCOMP | PTRACE_O_TRACESYSGOOD) < 0 ||
	    ptrace(PTRACE_SETSIGMASK, h->tid, sizeof(h->sigmask), &h->sigmask) < 0) {
		pl_err("thread %d: cannot restore its ptrace state: %s", h->tid, strerror(errno));
		return -errno;
	}
	return 0;
}
