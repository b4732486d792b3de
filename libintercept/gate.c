/* The gate's state and its slow paths: futex waits while closed, the count
 * of wrapper calls in flight, opening and closing. See gate.h. */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fwd_gen.h"
#include "gate.h"

struct gate_line gate_word;

/* Counted wrapper calls in flight, and threads asleep at the gate: written
 * on slow paths and by allocation wrappers only, on another line than the
 * word every call reads. */
static struct {
	uint32_t inflight;
	uint32_t idle_waiters; /* threads in gate_wait_idle() */
	uint32_t waiters;
} gate_count __attribute__((aligned(64)));

static __thread bool gate_exempt;

static long futex(uint32_t *uaddr, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, uaddr, op, val, ts, NULL, 0);
}

void gate_exempt_self(void)
{
	gate_exempt = true;
}

bool gate_self_exempt(void)
{
	return gate_exempt;
}

void gate_wait(void)
{
	int saved = errno;

	if (gate_exempt)
		return;
	__atomic_add_fetch(&gate_count.waiters, 1, __ATOMIC_RELAXED);
	pr_debug("thread %d waits at the closed gate\n", (int)gettid());
	/* Spurious wakeups and signals just test the word again. */
	while (__atomic_load_n(&gate_word.closed, __ATOMIC_ACQUIRE))
		futex(&gate_word.closed, FUTEX_WAIT_PRIVATE, 1, NULL);
	__atomic_sub_fetch(&gate_count.waiters, 1, __ATOMIC_RELAXED);
	errno = saved;
}

void *gate_slow_fwd(unsigned long idx)
{
	gate_wait();
	return __atomic_load_n(&fwd_table[idx], __ATOMIC_ACQUIRE);
}

void gate_enter(void)
{
	for (;;) {
		if (__builtin_expect(gate_is_closed(), 0))
			gate_wait();
		/* Count first, then look again (the closer stores, then reads the
		 * count: with both sequentially consistent, one of the two sees
		 * the other). */
		__atomic_add_fetch(&gate_count.inflight, 1, __ATOMIC_SEQ_CST);
		if (__builtin_expect(!__atomic_load_n(&gate_word.closed, __ATOMIC_SEQ_CST), 1) ||
		    gate_exempt)
			return;
		gate_leave();
	}
}

void gate_leave(void)
{
	int saved = errno;

	/* Whoever waits for the count to drain may have reopened the gate
	 * meanwhile (a quiesce that timed out): wake on its count, not the gate. */
	if (__atomic_sub_fetch(&gate_count.inflight, 1, __ATOMIC_SEQ_CST) == 0 &&
	    __atomic_load_n(&gate_count.idle_waiters, __ATOMIC_SEQ_CST))
		futex(&gate_count.inflight, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
	errno = saved;
}

void gate_close(void)
{
	__atomic_store_n(&gate_word.closed, 1, __ATOMIC_SEQ_CST);
}

void gate_open(void)
{
	__atomic_store_n(&gate_word.closed, 0, __ATOMIC_SEQ_CST);
	futex(&gate_word.closed, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int gate_wait_idle(int timeout_ms)
{
	int64_t deadline = timeout_ms >= 0 ? now_ms() + timeout_ms : 0;
	int err = 0;
	uint32_t n;

	__atomic_add_fetch(&gate_count.idle_waiters, 1, __ATOMIC_SEQ_CST);
	while ((n = __atomic_load_n(&gate_count.inflight, __ATOMIC_SEQ_CST)) != 0) {
		struct timespec ts, *tsp = NULL;

		if (timeout_ms >= 0) {
			int64_t left = deadline - now_ms();

			if (left <= 0) {
				err = -ETIMEDOUT;
				break;
			}
			ts.tv_sec = left / 1000;
			ts.tv_nsec = (left % 1000) * 1000000;
			tsp = &ts;
		}
		futex(&gate_count.inflight, FUTEX_WAIT_PRIVATE, n, tsp);
	}
	__atomic_sub_fetch(&gate_count.idle_waiters, 1, __ATOMIC_SEQ_CST);
	return err;
}

unsigned int gate_waiters(void)
{
	return __atomic_load_n(&gate_count.waiters, __ATOMIC_RELAXED);
}

void gate_reset_after_fork(void)
{
	/* Only the forking thread lives on in the child: nobody waits, nothing
	 * is in flight but, perhaps, the fork's caller itself (not a wrapper). */
	__atomic_store_n(&gate_word.closed, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&gate_count.inflight, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&gate_count.idle_waiters, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&gate_count.waiters, 0, __ATOMIC_SEQ_CST);
}
