/* The gate: every driver call the application makes passes it. Open, calls
 * go through; closed (quiesce), every new call from an application thread
 * blocks on a futex until the gate opens again. Nothing spins.
 *
 * Where it is checked:
 *  - each generated trampoline (gen-forward.sh) starts with
 *    `cmpl $0, gate_word(%rip); jne slow`: one load and a branch while open.
 *    The slow path (lazy.S) saves the argument registers, calls
 *    gate_slow_fwd(), which waits, and jumps on. Names in ungated.list get
 *    no check;
 *  - each C wrapper: gate_pass() (the same load and branch) for queries of
 *    gpucr's own tables, or GATE_COUNTED for the wrappers that change
 *    gpucr's memory (allocation and free), which are also counted in
 *    flight so that gate_wait_idle() can tell when the last has left.
 *    cuGetProcAddress* and cuGetExportTable are not gated: pure lookups
 *    that cudart may make from any thread at any time.
 *
 * Calls already past the check when the gate closes are not seen (counting
 * every call would cost an atomic read-modify-write on a shared line per
 * call). The control thread therefore drains the device after closing the
 * gate (control.c says how, and what remains).
 *
 * The control thread and its helpers mark themselves exempt (gate_exempt_self)
 * and call the real driver through `real`, never through exported symbols;
 * an exempt thread that reaches the gate anyway passes it.
 *
 * After fork() the child's gate is open (gate_reset_after_fork). */
#ifndef GPUCR_GATE_H
#define GPUCR_GATE_H

#include "shim.h"

/* The word the trampolines test: 0 open, 1 closed. A cache line of its own,
 * read by every thread on every driver call and written only when the gate
 * moves. Also the futex that waiters sleep on. */
struct gate_line {
	uint32_t closed;
} __attribute__((aligned(64)));

extern struct gate_line gate_word SHIM_HIDDEN;

static inline bool gate_is_closed(void)
{
	return __atomic_load_n(&gate_word.closed, __ATOMIC_ACQUIRE) != 0;
}

/* Blocks the calling thread while the gate is closed (returns at once for
 * an exempt thread). Keeps errno. */
void gate_wait(void) SHIM_HIDDEN;

/* The check at the top of a C wrapper that only reads. */
static inline void gate_pass(void)
{
	if (__builtin_expect(gate_is_closed(), 0))
		gate_wait();
}

/* Counted passage for wrappers that change gpucr's memory: gate_enter()
 * waits while closed and then counts the call in flight, gate_leave() ends
 * it. Use GATE_COUNTED as the statement after SHIM_KEEP_ERRNO (the leave
 * runs when the wrapper returns, before errno is put back). */
void gate_enter(void) SHIM_HIDDEN;
void gate_leave(void) SHIM_HIDDEN;

static inline void gate_leave_cleanup(const int *token)
{
	(void)token;
	gate_leave();
}

#define GATE_COUNTED \
	__attribute__((cleanup(gate_leave_cleanup))) const int gate_token_ = (gate_enter(), 0)

/* Trampoline slow path (lazy.S): waits, then returns where forwarded name
 * idx jumps now (fwd_table[idx]). */
void *gate_slow_fwd(unsigned long idx) SHIM_HIDDEN;

/* ---- for the control thread ---------------------------------------------- */

/* Closes the gate: new calls block from now on. */
void gate_close(void) SHIM_HIDDEN;
/* Opens it and wakes every waiter. */
void gate_open(void) SHIM_HIDDEN;

/* Waits until no counted call is in flight: 0, or -ETIMEDOUT after
 * timeout_ms (< 0: no limit). Meant for a closed gate. */
int gate_wait_idle(int timeout_ms) SHIM_HIDDEN;

/* Threads blocked at the gate now (for logs and tests). */
unsigned int gate_waiters(void) SHIM_HIDDEN;

/* Marks the calling thread as gpucr's own: the gate never blocks it. */
void gate_exempt_self(void) SHIM_HIDDEN;
/* Whether the calling thread is (the per-chunk gate lets it pass too). */
bool gate_self_exempt(void) SHIM_HIDDEN;

/* In a forked child: open, nothing in flight, nobody waiting. */
void gate_reset_after_fork(void) SHIM_HIDDEN;

#endif
