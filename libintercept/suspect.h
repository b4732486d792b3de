/* Suspects: the functions (and graphs) a process launched during a save
 * epoch that failed because a GPU write escaped prediction (a saved chunk
 * was not what it was at the cut: some kernel wrote where its parameters
 * did not say, e.g. through a pointer held in device memory). Any of them
 * may have made that write; each becomes unpredictable for the life of the
 * process: in its later save epochs, a launch of it waits at the per-chunk
 * gate until every chunk is saved, as an undecodable launch does
 * (chunkgate.h). The process can then be checkpointed while it runs again,
 * with only those launches held.
 *
 * Which launches count (chunkgate.c notes them): a launch let go while its
 * save epoch was open and some chunk of it was not yet saved. Launches that
 * waited for the whole epoch (undecodable ones, the unpredictable ones) ran
 * only once everything was saved and cannot have changed a saved chunk's
 * bytes at the cut; nor can a launch that went after the epoch ended. Work
 * queued before the cut was drained at the quiesce. A launch is noted
 * before it reaches the driver, so one whose work could have made the write
 * was noted before gpucrd found the mismatch and asked.
 *
 * The record of an epoch: a cut (epoch_cut) forgets the last one's
 * launches; suspect_epoch_begin starts noting (the save epoch opens);
 * suspect_epoch_end stops; suspect_escaped stops too, makes every launch
 * noted since the cut unpredictable and reports them (ChunksSaved.escaped ->
 * Suspects in proto/rpc.proto).
 *
 * Names come from the driver when it has them (cuFuncGetName, then
 * cuKernelGetName for a CUkernel launched as a function), looked up when a
 * function is first noted in an epoch and copied (at most
 * SUSPECT_NAME_MAX - 1 bytes, non-printable bytes as '?'); otherwise
 * "function 0x..." / "graph 0x...". Handles are compared by value: a
 * handle the driver reuses after a module unload keeps its old standing
 * (which only holds more launches than needed).
 *
 * Bounds: at most SUSPECT_MAX distinct handles are known at once (the
 * unpredictable ones and the current epoch's launches). A launch that finds
 * no room makes the epoch's record incomplete; an escape in such an epoch
 * (or one with no launch to blame) marks the process as lost for
 * per-function gating (suspect_get_stats), and gpucrd then falls back to
 * keeping the process stopped, or copying its memory on the GPU, in its
 * later checkpoints.
 *
 * Memory: the table is allocated at the first note and kept for the life of
 * the process (in its memory, so a restored process has it back), names on
 * the heap. Thread-safe: one mutex, nested inside the chunk gate's lock;
 * suspect_note may call the driver (names) with no lock held. */
#ifndef GPUCR_SUSPECT_H
#define GPUCR_SUSPECT_H

#include "shim.h"

#define SUSPECT_MAX 6144u        /* distinct handles known at once */
#define SUSPECT_NAME_MAX 128u    /* bytes of a name, with its NUL */
#define SUSPECT_REPORT_MAX 16u   /* names in one report; the rest are counted */
#define SUSPECT_HELD_MAX 64u     /* held notices queued between two takes */

enum suspect_kind {
	SUSPECT_FUNC = 1, /* a CUfunction (or a CUkernel launched as one) */
	SUSPECT_GRAPH,    /* a CUgraphExec */
};

/* What suspect_escaped says: the first SUSPECT_REPORT_MAX launches of the
 * epoch by name, in the order they were first let go, and how many more. */
struct suspect_report {
	size_t n;
	uint32_t more;
	bool incomplete; /* some launches of the epoch could not be noted */
	char name[SUSPECT_REPORT_MAX][SUSPECT_NAME_MAX];
};

struct suspect_stats {
	uint32_t unpredictable; /* handles held in every save epoch */
	uint32_t noted;         /* launches noted in the current (or last) epoch */
	bool lost;              /* an escape whose suspects could not all be kept (or had none) */
};

/* A new cut: forgets the last epoch's launches, stops noting. */
void suspect_cut(void) SHIM_HIDDEN;

/* The save epoch opens (noting starts) / ends (it stops). */
void suspect_epoch_begin(void) SHIM_HIDDEN;
void suspect_epoch_end(void) SHIM_HIDDEN;

/* On the launching thread, before the call is gated: whether launches of h
 * must wait for the whole epoch (h escaped prediction before). The first
 * time in an epoch that says yes for h with waits set (the call will wait:
 * some chunk is not saved yet), its name is queued for suspect_take_held.
 * A load and a branch while nothing is unpredictable. */
bool suspect_hold(enum suspect_kind kind, const void *h, bool waits) SHIM_HIDDEN;

/* On the launching thread, before the driver sees the call: h is let go
 * while the save epoch is open and not everything is saved. Remembers it as
 * one of the epoch's launches (no-op outside noting, or when already
 * noted). May call the driver for h's name. Keeps errno. */
void suspect_note(enum suspect_kind kind, const void *h) SHIM_HIDDEN;

/* The epoch failed: a write escaped prediction. Stops noting, makes every
 * launch noted since the cut unpredictable and fills *ret (the caller's
 * storage) with them. Returns how many launches were noted. */
size_t suspect_escaped(struct suspect_report *ret) SHIM_HIDDEN;

/* Takes up to max names queued by suspect_hold since the last take, into
 * ret (the caller's storage); returns how many. */
size_t suspect_take_held(char (*ret)[SUSPECT_NAME_MAX], size_t max) SHIM_HIDDEN;

void suspect_get_stats(struct suspect_stats *ret) SHIM_HIDDEN;

/* In a forked child: the lock is made anew, no epoch is noted; what is
 * unpredictable stays so. */
void suspect_reset_after_fork(void) SHIM_HIDDEN;

/* For tests: forget everything, unpredictable ones included. */
void suspect_reset(void) SHIM_HIDDEN;

#endif
