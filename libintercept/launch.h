/* Launch decoding: which of the application's buffers a kernel launch can
 * reach, found by scanning its parameter bytes for values inside a known
 * buffer (buftab.h).
 *
 * Wrapped here (launch.c): cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel and their _ptsz variants. Each passes the gate
 * (gate_pass: a launch changes no memory of gpucr's), is counted (counts.h)
 * and forwards. While decoding is off, that is all a launch costs: the
 * gate's load and branch, the count's atomic add, one more load (this
 * flag), and the forward.
 *
 * While decoding is on (at least one launch_decode_hold() outstanding):
 *  - the parameter layout of each CUfunction (offset and size of every
 *    parameter, from cuFuncGetParamInfo, or cuKernelGetParamInfo when the
 *    handle is a CUkernel) is fetched once and cached in a table that readers
 *    search without a lock;
 *  - each parameter is read as 64-bit words at every 8-byte-aligned offset
 *    of the parameter buffer that it covers, so pointers inside by-value
 *    structs count; a parameter smaller than 8 bytes cannot hold a device
 *    pointer and is skipped. With kernelParams == NULL the packed buffer of
 *    `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) is scanned the same
 *    way, parameter by parameter, or whole when the layout is unknown;
 *  - every word that falls inside a buffer (buftab_lookup) makes that whole
 *    buffer touched. Whole, not the chunk the word points into: a kernel
 *    indexes from a pointer in both directions by any amount, so nothing
 *    narrower is safe. A word that is no pointer but lands in a buffer
 *    anyway only makes the answer larger (never wrong); a pointer to just
 *    past a buffer's end is not seen (it is inside no buffer);
 *  - the decoded launch goes to the DAG (dag.h) when the launch succeeded
 *    and an epoch is open, and, before it is forwarded, to the observer
 *    (tests) and to the per-chunk gate (chunkgate.h), which may make the
 *    launching thread wait.
 * A launch that cannot be decoded (kernelParams with no layout, an `extra`
 * option that is not understood, more distinct buffers than LAUNCH_MAX_TOUCH)
 * is marked LAUNCH_F_UNKNOWN: it may touch anything.
 *
 * Not done: the layout cache is never invalidated, so a CUfunction handle
 * that the driver reuses after cuModuleUnload / cuLibraryUnload keeps the
 * old function's layout (cache entries live for the process). */
#ifndef GPUCR_LAUNCH_H
#define GPUCR_LAUNCH_H

#include "shim.h"

/* Distinct buffers one decoded launch can name; more makes it UNKNOWN. */
#define LAUNCH_MAX_TOUCH 256

/* One buffer a launch can reach: the whole of it [base, base + size). */
struct launch_touch {
	uint64_t buf_id;  /* struct buf's id */
	CUdeviceptr base;
	size_t size;
};

#define LAUNCH_F_UNKNOWN 0x1u   /* may touch any buffer: not decodable */
#define LAUNCH_F_EXTRA 0x2u     /* parameters came from `extra` */

struct launch_decoded {
	CUfunction func;
	CUstream stream;   /* as launched; a _ptsz launch on NULL gives CU_STREAM_PER_THREAD */
	unsigned int flags; /* LAUNCH_F_* */
	unsigned int ntouch;
	struct launch_touch touch[LAUNCH_MAX_TOUCH]; /* in order of first sight */
};

/* The flag the wrappers test: nonzero while decoding is on. The copy and
 * graph wrappers (copy.c, graph.h) test it too. */
extern int launch_decoding SHIM_HIDDEN;

static inline bool launch_decoding_on(void)
{
	return __builtin_expect(__atomic_load_n(&launch_decoding, __ATOMIC_RELAXED) != 0, 0);
}

/* The stream a _ptsz call names by NULL is the calling thread's. */
static inline CUstream launch_ptsz_stream(CUstream s)
{
	return s ? s : CU_STREAM_PER_THREAD;
}

/* Turns decoding on for as long as one hold is outstanding (dag_epoch_begin
 * takes one, dag_epoch_end gives it back; chunk_gate_begin and
 * chunk_gate_finish likewise). Thread-safe. */
void launch_decode_hold(void) SHIM_HIDDEN;
void launch_decode_release(void) SHIM_HIDDEN;

/* Decodes one launch's parameters into *ret (which the caller owns); the
 * wrappers call it, tests may too. Never fails: what cannot be decoded is
 * flagged LAUNCH_F_UNKNOWN. Calls the real driver for the layout on first
 * sight of f. */
void launch_decode(CUfunction f, CUstream stream, void **kernelParams, void **extra,
		   struct launch_decoded *ret) SHIM_HIDDEN;

/* Called, on the launching thread, with every decoded launch before it is
 * forwarded; d is valid during the call only. NULL removes it. One observer
 * at a time; set it while no launch is being decoded. */
typedef void (*launch_observer_fn)(const struct launch_decoded *d, void *arg);
void launch_set_observer(launch_observer_fn fn, void *arg) SHIM_HIDDEN;

/* For tests: how many times cuFuncGetParamInfo / cuKernelGetParamInfo were
 * called to fill the layout cache, and how many layouts it holds. */
uint64_t launch_paraminfo_calls(void) SHIM_HIDDEN;
size_t launch_layouts_cached(void) SHIM_HIDDEN;

#endif
