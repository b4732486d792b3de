/* The per-chunk gate: the third mode of the gate (gate.h), for soft
 * copy-on-write during a concurrent checkpoint and for a lazy restore. A
 * launch, copy, memset or graph launch waits until the chunks it touches
 * are saved (a save epoch) or loaded (a load epoch); everything else goes
 * on.
 *
 * An epoch (chunk_gate_begin .. chunk_gate_finish):
 *  - at begin, a table of gpucr's own buffers (BUF_VMM, BUF_SUB, BUF_APP:
 *    the memory the daemon holds and saves or loads) is taken from the buffer table,
 *    with one state bit per chunk: pending / saved, or not loaded / loaded.
 *    Chunks count from each buffer's base in steps of the DAG's chunk size
 *    (dag_chunk_size()), the last one may be short, as in dag.h. Buffers
 *    allocated later are not in the table and never wait (they hold nothing
 *    of the cut, and nothing is loaded into them); nor do the driver's
 *    (its own checkpoint saves them);
 *  - while it is open, launch decoding is on (launch_decode_hold) and every
 *    launch, copy, memset and graph launch computes its access set before
 *    the driver sees it, with the decoding the DAG uses (launch.h, access.h,
 *    graph.h). In a save epoch the chunks it may WRITE must be saved; in a
 *    load epoch the chunks it may READ OR WRITE must be loaded. A launch
 *    reaches whole buffers (so it waits for every chunk of each). When one
 *    such chunk is not done, the call queues a request for the chunks it
 *    waits for (chunk_gate_requests), wakes the server (chunk_gate_request_fd)
 *    and blocks on a futex until chunk_gate_mark_done() has marked all of
 *    them done. A call whose access cannot be bounded (an undecodable
 *    launch, an unbounded or untracked graph, an undecoded copy) waits until
 *    every chunk is done or the epoch finishes. So does, in a save epoch, a
 *    launch of a function (or graph) that escaped prediction in an earlier
 *    one (suspect.h); the launches that go while chunks are still pending
 *    are noted there as the epoch's suspects;
 *  - chunk_gate_finish() ends it: everything counts as done and every
 *    waiter is released. The state and stats stay readable until the next
 *    begin.
 * Outside an epoch the wrappers pay what they paid before: the gate's load
 * and branch and the decoding flag's (launch.h).
 *
 * As for the DAG, a call that passed its decoding check just before begin
 * is not gated: begin the epoch with the gate closed and the device drained
 * (control.c) when that matters. Threads exempt from the gate
 * (gate_exempt_self) pass this one too. Whether the chunk was saved before
 * the call's work runs on the device is the saver's business: marking a
 * chunk done says its bytes are safe (copied, or the copy enqueued ahead on
 * the device) or loaded.
 *
 * Memory: the table (per buffer 32 bytes and its hash slot, one bit per
 * chunk) is allocated at begin for the buffers present, at most
 * CHUNK_GATE_MAX_BUFS buffers and CHUNK_GATE_MAX_CHUNKS chunks (begin says
 * -E2BIG beyond: use quiesce and copy then), and freed at the next begin.
 * The request queue holds CHUNK_GATE_QUEUE entries; requests that find it
 * full are counted as dropped (the waiters still wait: a server that sees
 * drops should save everything soon). A waiter's list of chunk ranges lives
 * on its stack, on the heap beyond CHUNK_GATE_WAIT_INLINE ranges (when that
 * fails it waits for the whole epoch).
 *
 * Thread-safe: one mutex, taken by a call only while an epoch is open, and
 * by the server. The buffer table's lock nests inside it. Never called from
 * a signal handler. */
#ifndef GPUCR_CHUNKGATE_H
#define GPUCR_CHUNKGATE_H

#include "dag.h"
#include "launch.h"
#include "shim.h"

#define CHUNK_GATE_MAX_BUFS (1u << 20)
#define CHUNK_GATE_MAX_CHUNKS (1u << 26) /* 128 TiB of 2 MiB chunks: an 8 MiB bitmap */
#define CHUNK_GATE_QUEUE 4096u
#define CHUNK_GATE_WAIT_INLINE 16u

enum chunk_gate_kind {
	CHUNK_GATE_SAVE = 1, /* waits for writes: copy-on-write */
	CHUNK_GATE_LOAD,     /* waits for reads and writes: lazy restore */
};

/* A request: chunks [first, first + n) of buffer buf_id (at base) are
 * wanted by a waiting call. Only chunks that were not done when it was made
 * are covered, from the first such to the last (chunks between may be done
 * already). buf_id 0 (and n 0): a call waits for the whole epoch. */
struct chunk_gate_req {
	uint64_t buf_id;
	CUdeviceptr base;
	uint32_t first, n;
};

struct chunk_gate_stats {
	int kind;              /* enum chunk_gate_kind of the last epoch, 0 if none */
	bool open;             /* begun and not finished */
	size_t chunk_size;
	uint32_t bufs;
	uint64_t chunks, chunks_done;
	uint64_t calls_checked;  /* calls that computed their access during the epoch */
	uint64_t calls_delayed;  /* of those, calls that waited */
	uint64_t calls_unbounded; /* of those, calls that waited for the whole epoch */
	uint64_t wait_ns;        /* time they waited, summed */
	uint32_t waiting;        /* threads waiting now */
	uint64_t requests;       /* requests queued */
	uint64_t requests_dropped; /* requests that found the queue full */
};

/* Opens an epoch of that kind, forgetting the last one: every chunk of
 * gpucr's buffers present now is pending (not loaded). 0, -EBUSY when one
 * is open, -EINVAL for a bad kind, -E2BIG beyond the limits above, -ENOMEM,
 * -EAGAIN when buffers kept appearing while the table was taken. */
int chunk_gate_begin(enum chunk_gate_kind kind) SHIM_HIDDEN;

/* Marks chunks [first_chunk, first_chunk + n) of buffer buf_id done (saved
 * or loaded) and wakes exactly the waiters all of whose chunks are now
 * done. Returns how many chunks were newly marked; -EINVAL when no epoch is
 * open, -ENOENT when the buffer is not in the epoch's table, -ERANGE when
 * the chunks run past its end. */
long chunk_gate_mark_done(uint64_t buf_id, uint32_t first_chunk, uint32_t n) SHIM_HIDDEN;

/* The same for every chunk of the table's buffers that lies wholly in
 * [addr, addr + len) (a buffer's short last chunk counts when the range
 * reaches the buffer's end): for a saver that works by address ranges.
 * Returns how many chunks were newly marked, or -EINVAL. */
long chunk_gate_mark_range_done(CUdeviceptr addr, size_t len) SHIM_HIDDEN;

/* Ends the epoch: every chunk done, every waiter released, decoding hold
 * given back. -EINVAL when none is open. */
int chunk_gate_finish(void) SHIM_HIDDEN;

/* Whether chunk i of buffer buf_id is done: 1, 0, or -ENOENT (-ERANGE).
 * Answers for the last epoch after it finished. */
int chunk_gate_chunk_done(uint64_t buf_id, uint32_t chunk) SHIM_HIDDEN;

/* Takes up to max requests off the queue, oldest first, into ret; returns
 * how many. The request fd is readable while the queue holds any. */
size_t chunk_gate_requests(struct chunk_gate_req *ret, size_t max) SHIM_HIDDEN;

/* An eventfd (O_CLOEXEC, nonblocking) that becomes readable when requests
 * are queued, for the server's poll loop; -1 before the first begin (or
 * when it could not be made: then only polling the queue works). Owned by
 * the chunk gate, valid for the life of the process. */
int chunk_gate_request_fd(void) SHIM_HIDDEN;

void chunk_gate_get_stats(struct chunk_gate_stats *ret) SHIM_HIDDEN;

/* ---- for the wrappers (only while decoding is on) ------------------------ */

/* Nonzero while an epoch is open. */
extern int chunk_gate_open SHIM_HIDDEN;

static inline bool chunk_gate_on(void)
{
	return __builtin_expect(__atomic_load_n(&chunk_gate_open, __ATOMIC_ACQUIRE) != 0, 0);
}

/* Waits, if an epoch is open, until the chunks the decoded launch can reach
 * are done (every chunk when it could not be decoded). Keeps errno. */
void chunk_gate_launch(const struct launch_decoded *d) SHIM_HIDDEN;

/* The same for ranges with their access (DAG_ACCESS_*, DAG_RANGE_WHOLE as
 * in dag.h); unbounded: the call may touch anything. */
void chunk_gate_ranges(const struct dag_range *r, size_t n, bool unbounded) SHIM_HIDDEN;

/* The same for a launch of graph exec, whose ranges these are. */
void chunk_gate_graph(CUgraphExec exec, const struct dag_range *r, size_t n, bool unbounded) SHIM_HIDDEN;

/* In a forked child: no epoch (the parent's waiters are not here). */
void chunk_gate_reset_after_fork(void) SHIM_HIDDEN;

#endif
