/* The DAG of one checkpoint epoch: every decoded launch (launch.h), copy and
 * memset (copy.c) and graph launch (graph.h) made between dag_epoch_begin()
 * and dag_epoch_end() becomes a node with edges to the chunks of the
 * buffers it can reach.
 *
 * - A node: its kind (DAG_NODE_*), the stream, the function (launches) or
 *   executable graph (graph launches), a global sequence number and one per
 *   stream (stream order), flags and its edges. Work on one stream is
 *   ordered by its stream sequence; across streams nothing is assumed
 *   (events and stream waits are not recorded yet). Synchronous copies and
 *   memsets are on the NULL stream (the legacy stream, as a launch on NULL
 *   is), their _ptds variants on CU_STREAM_PER_THREAD.
 * - An edge: one buffer, a range of its chunks [chunk_lo, chunk_hi) and how
 *   the node uses them (DAG_ACCESS_*). Chunks count from the buffer's base
 *   in steps of the chunk size (DAG_CHUNK_DEFAULT, 2 MiB, unless
 *   dag_configure() says otherwise); the last one may be short. A launch's
 *   edges are read+write and cover whole buffers: from the parameters alone
 *   a launch's writes cannot be told from its reads (that needs the
 *   kernel's code or its const qualifiers, which the driver does not give),
 *   so every chunk a launch can reach counts as possibly written. A copy's
 *   edges are exact: read edges on its source chunks, write edges on its
 *   destination chunks (dag_record_ranges). Host memory makes no edges.
 * - An unbounded node (DAG_NODE_F_UNBOUNDED: a graph launch whose writes
 *   cannot be predicted, graph.h) is recorded with the edges that are known,
 *   and from then on every chunk of every buffer counts as written, as on
 *   overflow, but recording goes on.
 * - Bounded memory: nodes, edges, buffers and bitmap bits live in arenas of
 *   fixed capacity, allocated at the first dag_epoch_begin() and reused. On
 *   overflow, or on a launch that could not be decoded, the epoch is marked
 *   overflowed, recording stops, and every chunk of every buffer counts as
 *   written (dag_written says so).
 *
 * The epoch holds launch decoding on (launch_decode_hold) while it is open;
 * the copy and graph wrappers test the same flag. A launch that passed its
 * decoding check just before dag_epoch_begin() is not recorded: begin the
 * epoch with the gate closed and the device drained (control.c) when that
 * matters, and note that work enqueued before the epoch may still run
 * during it.
 *
 * Thread-safe: recording and the queries take one mutex (only while an
 * epoch is open does a launch or copy take it). Recording looks buffers up
 * (buftab.h) under it: the buffer table's lock nests inside the DAG's. */
#ifndef GPUCR_DAG_H
#define GPUCR_DAG_H

#include "buftab.h"
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
	uint32_t access;    /* DAG_ACCESS_*: both for launches, see above */
};

enum dag_node_kind {
	DAG_NODE_LAUNCH = 1,
	DAG_NODE_COPY,
	DAG_NODE_MEMSET,
	DAG_NODE_GRAPH,
};

#define DAG_NODE_F_UNBOUNDED 0x1u /* may write anywhere: see above */

struct dag_node {
	uint64_t seq;        /* order of recording in the epoch, from 0 */
	uint64_t stream_seq; /* order on its stream, from 0 */
	CUstream stream;
	CUfunction func;     /* DAG_NODE_LAUNCH, else NULL */
	CUgraphExec exec;    /* DAG_NODE_GRAPH, else NULL */
	uint32_t kind;       /* enum dag_node_kind */
	uint32_t flags;      /* DAG_NODE_F_* */
	uint32_t edge_first; /* edges [edge_first, edge_first + nedges) */
	uint32_t nedges;
};

/* A range of device addresses an operation reads or writes, for
 * dag_record_ranges: [addr, addr + len), or with DAG_RANGE_WHOLE every
 * buffer that range meets, whole (how a kernel's pointer reaches). */
#define DAG_RANGE_WHOLE 0x1u

struct dag_range {
	CUdeviceptr addr;
	size_t len;
	uint32_t access; /* DAG_ACCESS_* */
	uint32_t flags;  /* DAG_RANGE_* */
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
	bool unbounded;      /* an unbounded node was recorded */
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

/* Records a node of that kind on stream s if an epoch is open: each range
 * becomes an edge on the chunks of every buffer it meets (a range that
 * runs from one buffer into the next, as sub-allocations of one slab can,
 * gives an edge on each); ranges in no buffer (host memory) give none, and
 * consecutive ranges on the same chunks of a buffer with the same access
 * give one edge. exec names the graph of a DAG_NODE_GRAPH node; flags are
 * DAG_NODE_F_*. The copy and graph wrappers call it after a successful
 * call. */
void dag_record_ranges(enum dag_node_kind kind, CUstream s, CUgraphExec exec, unsigned int flags,
		       const struct dag_range *r, size_t n) SHIM_HIDDEN;

/* Calls fn for each buffer (buftab.h) that range r meets, in address
 * order, with the bytes [lo, hi) of it that r covers (all of it with
 * DAG_RANGE_WHOLE); parts of r in no buffer give no call. Looks each
 * buffer up (buftab_lookup); no lock of the buffer table is held while fn
 * runs. Stops at and returns the first nonzero value of fn; 0 otherwise.
 * Needs no epoch (the per-chunk gate walks ranges the same way). */
int dag_range_for_each_buf(const struct dag_range *r,
			   int (*fn)(const struct buf *b, size_t lo, size_t hi, void *arg), void *arg) SHIM_HIDDEN;

/* The chunk size of the current (or next) epoch. */
size_t dag_chunk_size(void) SHIM_HIDDEN;

void dag_get_stats(struct dag_stats *ret) SHIM_HIDDEN;

/* Calls fn for each node in recording order with its edges and the epoch's
 * buffer table (index it with edge.buf), under the DAG's lock: fn must not
 * launch or call dag_*. Stops at and returns the first nonzero value of
 * fn; 0 when all were visited. */
int dag_for_each_node(int (*fn)(const struct dag_node *n, const struct dag_edge *edges,
				const struct dag_buffer *bufs, void *arg),
		      void *arg) SHIM_HIDDEN;

/* The chunks of buffer (buf_id, size) possibly written since the epoch
 * began, as a bitmap: bit i (word i / 64, bit i % 64) is chunk i: those of
 * its write edges. nwords must be at least DAG_BITMAP_WORDS(size, chunk
 * size). Every bit is set when the epoch overflowed or holds an unbounded
 * node. Returns the number of bits set, or -ENOSPC when
 * nwords is too small. */
#define DAG_BITMAP_WORDS(size, chunk) (((size) + (chunk) * 64 - 1) / ((chunk) * 64))
long dag_written(uint64_t buf_id, size_t size, uint64_t *ret_bits, size_t nwords) SHIM_HIDDEN;

#endif
