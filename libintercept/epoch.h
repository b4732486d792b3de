/* The control thread's side of a save epoch (a concurrent checkpoint,
 * proto/rpc.proto Resume.save_epoch, ChunksSaved, ChunksWanted): it opens
 * and ends the per-chunk gate's save epoch (chunkgate.h), turns the ranges
 * gpucrd says are saved into chunks marked done, and the gate's requests
 * into the ranges the shim asks gpucrd for.
 *
 * Ranges and chunks do not line up: gpucrd saves by its own physical
 * regions (a 2 MiB slab holds many sub-allocations), while the gate counts
 * chunks from each buffer's base. A gate chunk is done once the union of
 * every range gpucrd said was saved since the cut (the last quiesce) covers
 * it, even when no single ChunksSaved did: the ranges are kept merged, as a
 * sorted set of disjoint intervals, at most EPOCH_MAX_INTERVALS of them.
 * Beyond that a range still marks the chunks it covers alone but is not
 * remembered (so a chunk it covers only in part may wait until gpucrd
 * saves everything): never more done than was saved.
 *
 * Ranges that arrive between the cut and Resume{save_epoch} (gpucrd may
 * start saving as soon as it holds the memory) are kept and applied when
 * the epoch begins; a ChunksSaved{all} there makes the epoch unnecessary.
 *
 * Called by the control thread only (not thread-safe); the memory (the
 * interval set, the ChunksWanted buffers) is the module's, allocated on
 * demand and kept for the next epoch. */
#ifndef GPUCR_EPOCH_H
#define GPUCR_EPOCH_H

#include <stdbool.h>
#include <stddef.h>

#include "msg.h"
#include "shim.h"
#include "suspect.h"

#define EPOCH_MAX_INTERVALS (1u << 16)

/* A new cut (quiesce): ends an open epoch (chunk_gate_finish, every waiter
 * released) and forgets the saved ranges. */
void epoch_cut(void) SHIM_HIDDEN;

/* Ends the epoch if one is open (releasing every waiter); why is for the
 * log. The saved ranges are kept (epoch_cut forgets them). */
void epoch_end(const char *why) SHIM_HIDDEN;

bool epoch_is_open(void) SHIM_HIDDEN;

/* Whether gpucrd said every chunk of the cut is saved before the epoch
 * began (nothing would wait). */
bool epoch_all_saved(void) SHIM_HIDDEN;

/* Opens the save epoch (chunk_gate_begin(CHUNK_GATE_SAVE)) and marks what
 * was saved already. Call with the gate closed. 0, or chunk_gate_begin's
 * -errno with what (NUL-terminated) saying why. */
int epoch_begin(char *what, size_t whatlen) SHIM_HIDDEN;

/* gpucrd found a saved chunk changed since the cut (ChunksSaved.escaped):
 * every launch the epoch let go becomes unpredictable and *ret names them
 * (suspect_escaped), then the epoch ends. Returns how many there were. */
size_t epoch_escaped(struct suspect_report *ret) SHIM_HIDDEN;

/* gpucrd saved these ranges (or all): marks the chunks they complete, or
 * ends the epoch for all. Outside an epoch the ranges are kept for the
 * next one. 0, or -ENOMEM when a range could not be remembered (its chunks
 * are marked anyway). */
int epoch_saved(const Gpucr__ChunksSaved *cs) SHIM_HIDDEN;

/* The gate's request eventfd, for the control thread's poll (-1 before the
 * first epoch). */
int epoch_request_fd(void) SHIM_HIDDEN;

/* Takes every queued request off the gate. Returns true and fills *ret (a
 * ChunksWanted whose ranges stay valid until the next call) when there is
 * something to ask gpucrd for: the ranges the waiting calls need, merged,
 * and all when a call waits for the whole epoch or a request was dropped;
 * held: the unpredictable functions (suspect.h) whose launches began to
 * wait, once per epoch each. false when nothing is wanted, or no epoch is
 * open (requests left over from an epoch that ended are dropped). */
bool epoch_wanted(Gpucr__ChunksWanted *ret) SHIM_HIDDEN;

/* In a forked child: no epoch, nothing saved. */
void epoch_reset_after_fork(void) SHIM_HIDDEN;

#endif
