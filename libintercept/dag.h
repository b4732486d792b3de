/* The DAG of one checkpoint epoch: every decoded launch (launch.h) made
 * between dag_epoch_begin() and dag_epoch_end() becomes a node with edges to
 * the chunks of the buffers it can reach.
 *
 * - A node: the stream, the function, a global sequence number and one per
 *   stream (stream order), and its edges. Launches on one stream are
 *   ordered by their stream sequence; across streams nothing is assumed
 *   (events and stream waits are not recorded yet).
 * - An edge: one buffer and a range of its chunks [chunk_lo, chunk_hi).
 *   Chunks count from the buffer's base in steps of the chunk size
 *   (DAG_CHUNK_DEFAULT, 2 MiB, unless dag_configure() says otherwise); the
 *   last one may be short. Every edge is read+write: from the parameters
 *   alone a launch's writes cannot be told from its reads (that needs the
 *   kernel's code or its const qualifiers, which the driver does not give),
 *   so every chunk a launch can reach counts as possibly written.
 * - Bounded memory: nodes, edges, buffers and bitmap bits live in arenas of
 *   fixed capacity, allocated at the first dag_epoch_begin() and reused. On
 *   overflow, or on a launch that could not be decoded, the epoch is marked
 *   overflowed, recording stops, and every chunk of every buffer counts as
 *   written (dag_written says so).
 *
 * The epoch holds launch decoding on (launch_decode_hold) while it is open.
 * A launch that passed its decoding check just before dag_epoch_begin() is
 * not recorded: begin the epoch with the gate closed and the device drained
 * (control.c) when that matters, and note that work enqueued before the
 * epoch may still run during it.
 *
 * Thread-safe: recording and the queries take one mutex (only while an
 * epoch is open does a launch take it). */
#ifndef GPUCR_DAG_H
#define GPUCR_DAG_H

#include "launch.h"
#include "shim.h"

#define DAG_CHUNK_DEFAULT (2UL << 20)
#define DAG_MAX_NODES_DEFAULT (64u * 1024)
#define DAG_MAX_EDGES_DEFAULT (1024u * 1024)
#define DAG_MAX_BUFS_DEFAULT (16u * 1024)
#define DAG_MAX_BITS_DEFAULT (16u * 1024 * 1024) /* 32 TiB of 2 MiB chunks */

#define DAG_ACCESS_READ 0x1u
#define DAG_ACCESS_WRITE 0x2u

struct dag_edge {
	uint32_t buf;       /* index of the epoch's buffer (dag_buffer) */
	uint32_t chunk_lo;  /* first chunk */
	uint32_t chunk_hi;  /* one past the last */
	uint32_t access;    /* DAG_ACCESS_*: always both, see above */
};

struct dag_node {
	uint64_t seq;        /* order of recording in the epoch, from 0 */
	uint64_t stream_seq; /* order on its stream, from 0 */
	CUstream stream;
	CUfunction func;
	uint32_t edge_first; /* edges [edge_first, edge_first + nedges) */
	uint32_t nedges;
};

/* A buffer that some node of the epoch reaches. */
struct dag_buffer {
	uint64_t buf_id;
	CUdeviceptr base;
	size_t size;
	uint32_t nchunks;
};

struct dag_config {
	size_t chunk_size;   /* a power of two >= 4096 */
	uint32_t max_nodes, max_edges, max_bufs;
	uint32_t max_bits;   /* bitmap bits over all buffers */
};

struct dag_stats {
	bool open;
	bool overflowed;
	uint32_t nodes, edges, bufs;
	size_t chunk_size;
};

/* Sets the chunk size and capacities (0 members keep the default) for
 * epochs that begin later. -EBUSY while an epoch is open, -EINVAL for a bad
 * chunk size, -ENOMEM when the arenas cannot be allocated (the old ones
 * stay). */
int dag_configure(const struct dag_config *cfg) SHIM_HIDDEN;

/* Opens an epoch, forgetting the last one: -EBUSY if one is open, -ENOMEM
 * when the arenas cannot be allocated. */
int dag_epoch_begin(void) SHIM_HIDDEN;
/* Closes it; what was recorded stays readable until the next begin.
 * -EINVAL when none is open. */
int dag_epoch_end(void) SHIM_HIDDEN;

/* Records a decoded launch as a node if an epoch is open (launch.c calls
 * it after a successful launch). */
void dag_record_launch(const struct launch_decoded *d) SHIM_HIDDEN;

void dag_get_stats(struct dag_stats *ret) SHIM_HIDDEN;

/* Calls fn for each node in recording order with its edges and the epoch's
 * buffer table (index it with edge.buf), under the DAG's lock: fn must not
 * launch or call dag_*. Stops at and returns the first nonzero value of
 * fn; 0 when all were visited. */
int dag_for_each_node(int (*fn)(const struct dag_node *n, const struct dag_edge *edges,
				const struct dag_buffer *bufs, void *arg),
		      void *arg) SHIM_HIDDEN;

/* The chunks of buffer (buf_id, size) possibly written since the epoch
 * began, as a bitmap: bit i (word i / 64, bit i % 64) is chunk i. nwords
 * must be at least DAG_BITMAP_WORDS(size, chunk size). Every bit is set when
 * the epoch overflowed. Returns the number of bits set, or -ENOSPC when
 * nwords is too small. */
#define DAG_BITMAP_WORDS(size, chunk) (((size) + (chunk) * 64 - 1) / ((chunk) * 64))
long dag_written(uint64_t buf_id, size_t size, uint64_t *ret_bits, size_t nwords) SHIM_HIDDEN;

#endif
