/* CUDA graphs: the access set of every executable graph, precomputed when
 * it is instantiated, so that a cuGraphLaunch made during an epoch becomes
 * one DAG node (dag.h) with the edges of all the work the graph does.
 *
 * Wrapped here (graph.c):
 *  - cuGraphInstantiate, _v2, WithFlags, WithParams (+_ptsz): after a
 *    successful instantiation the source graph is walked (cuGraphGetNodes,
 *    cuGraphNodeGetType and the node's parameters, child graphs
 *    recursively to GRAPH_MAX_DEPTH levels): kernel nodes reach whole
 *    buffers as a launch does (launch_decode), memcpy and memset nodes their
 *    exact ranges (access.h); empty, host, event, semaphore and memory
 *    alloc/free nodes touch no buffer of the application. A node that
 *    cannot be decoded (a kernel whose parameters cannot be, a batch
 *    memory-op or conditional node, a node of a type this code does not
 *    know, a driver query that fails, nesting too deep) makes the graph
 *    unbounded: its writes cannot be predicted.
 *  - cuGraphLaunch (+_ptsz): passes the gate and is counted (counts.h);
 *    with decoding off (no epoch) that is all. While the per-chunk gate is open (chunkgate.h) the launch
 *    first waits for the chunks of the graph's ranges (for everything when
 *    the graph is unbounded or not in the table). During an epoch a
 *    successful launch records one DAG_NODE_GRAPH node with the graph's
 *    ranges, flagged DAG_NODE_F_UNBOUNDED when the graph is unbounded or not
 *    in the table.
 *  - cuGraphExecDestroy drops the entry (before the driver sees the call,
 *    so a handle the driver reuses at once is never confused with the old).
 *  - cuGraphExecKernelNodeSetParams (+_v2), cuGraphExecMemcpyNodeSetParams,
 *    cuGraphExecMemsetNodeSetParams, cuGraphExecChildGraphNodeSetParams and
 *    cuGraphExecNodeSetParams recompute that node's part of the set; a node
 *    not known at the top level of the graph makes it unbounded.
 *    cuGraphExecUpdate (+_v2) recomputes the whole set from the new graph.
 *
 * Ranges are addresses, not buffers: they are looked up when a launch is
 * recorded, so buffers freed and allocated again between instantiation and
 * launch are found as they are then. A kernel node's pointer that was in no
 * buffer at instantiation is not seen (as for a launch).
 *
 * Bounded memory: at most GRAPH_MAX_EXECS_DEFAULT (graph_configure)
 * executable graphs are tracked, each with at most GRAPH_MAX_RANGES ranges
 * (more make it unbounded, its ranges dropped). An instantiation that finds
 * the table full is not tracked: its launches count as unbounded.
 *
 * Not covered: graphs instantiated for device launch
 * (CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) launched from a kernel; graph
 * work enqueued on a capturing stream (recorded as if it ran).
 *
 * Thread-safe: one mutex around the table; a launch takes it only during an
 * epoch, and records under it (the DAG's lock nests inside it). */
#ifndef GPUCR_GRAPH_H
#define GPUCR_GRAPH_H

#include "dag.h"
#include "shim.h"

#define GRAPH_MAX_EXECS_DEFAULT 4096u
#define GRAPH_MAX_RANGES (64u * 1024)
#define GRAPH_MAX_DEPTH 8

struct graph_stats {
	size_t execs;     /* executable graphs in the table */
	uint64_t untracked; /* instantiations that found the table full */
};

/* Sets how many executable graphs the table holds (0: the default).
 * -EBUSY while it holds any, -ENOMEM. */
int graph_configure(size_t max_execs) SHIM_HIDDEN;

void graph_get_stats(struct graph_stats *ret) SHIM_HIDDEN;

/* The access set of exec: whether it is unbounded, and up to max of its
 * ranges copied to ret (may be NULL with max 0). Returns the number of
 * ranges it holds, or -ENOENT when exec is not in the table. */
long graph_exec_ranges(CUgraphExec exec, bool *ret_unbounded, struct dag_range *ret, size_t max) SHIM_HIDDEN;

#endif
