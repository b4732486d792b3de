/* CUDA graphs (graph.h): instantiation precomputes the executable graph's
 * access set from its kernel (whole buffers), memcpy and memset (exact
 * chunks) nodes and its child graphs; cuGraphLaunch (+_ptsz) records
 * nothing outside an epoch and one graph node with those edges during one;
 * cuGraphExec*SetParams and cuGraphExecUpdate recompute the set; a node
 * that cannot be decoded, or one the table does not know, makes the graph
 * unbounded, and its launch a DAG node flagged unbounded (every chunk
 * counts as written); cuGraphExecDestroy drops the entry; a full table
 * leaves new graphs untracked, whose launches count as unbounded, and takes
 * graphs again once one is destroyed. The fake driver runs the graphs for
 * real, which is checked too.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * GPUCR_DAEMON=0 keeps the control thread out of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"
#include "graph.h"
#include "launch.h"
#include "t.h"
#include "shimtest.h"
#include "dagtest.h"

#define MIB (1UL << 20)
#define R DAG_ACCESS_READ
#define W DAG_ACCESS_WRITE
#define RW (DAG_ACCESS_READ | DAG_ACCESS_WRITE)

typedef int (*reg_fn)(const char *, fakecuda_kernel_fn, int, const size_t *);
typedef int (*fault_fn)(const char *, unsigned, CUresult);

/* store(int *p, int v): *p = v */
static void store(void **params, unsigned grid[3], unsigned block[3])
{
	(void)grid;
	(void)block;
	**(int **)params[0] = *(int *)params[1];
}

static CUfunction kstore;
static CUcontext ctx;

static CUgraphNode add_kernel(CUgraph g, CUdeviceptr p, int v)
{
	CUDA_KERNEL_NODE_PARAMS kp;
	void *params[] = { &p, &v };
	CUgraphNode n;

	memset(&kp, 0, sizeof(kp));
	kp.func = kstore;
	kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
	kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
	kp.kernelParams = params;
	REQUIRE(cuGraphAddKernelNode_v2(&n, g, NULL, 0, &kp) == CUDA_SUCCESS);
	return n;
}

static CUDA_MEMSET_NODE_PARAMS memset_params(CUdeviceptr dst, size_t pitch, size_t width, size_t height)
{
	CUDA_MEMSET_NODE_PARAMS m;

	memset(&m, 0, sizeof(m));
	m.dst = dst;
	m.pitch = pitch;
	m.value = 0x01010101;
	m.elementSize = 4;
	m.width = width;
	m.height = height;
	return m;
}

static CUgraphNode add_memset(CUgraph g, CUdeviceptr dst, size_t pitch, size_t width, size_t height)
{
	CUDA_MEMSET_NODE_PARAMS m = memset_params(dst, pitch, width, height);
	CUgraphNode n;

	REQUIRE(cuGraphAddMemsetNode(&n, g, NULL, 0, &m, ctx) == CUDA_SUCCESS);
	return n;
}

static CUDA_MEMCPY3D copy_params(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	CUDA_MEMCPY3D c;

	memset(&c, 0, sizeof(c));
	c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c.srcDevice = src;
	c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c.dstDevice = dst;
	c.WidthInBytes = n;
	c.Height = 1;
	c.Depth = 1;
	return c;
}

/* The graph launch just recorded: node of exec on stream s, flags, nedges. */
static const struct seen_node *launched(CUgraphExec exec, CUstream s, unsigned flags, unsigned nedges)
{
	const struct seen_node *n = last_node();

	REQUIRE(n);
	CHECK_EQ_INT(n->n.kind, DAG_NODE_GRAPH);
	CHECK(n->n.exec == exec);
	CHECK(n->n.stream == s);
	CHECK_EQ_INT(n->n.flags, flags);
	CHECK_EQ_INT(n->nedges, nedges);
	return n;
}

static int readint(CUdeviceptr p)
{
	int v = 0;

	REQUIRE(cuMemcpyDtoH_v2(&v, p, sizeof(v)) == CUDA_SUCCESS);
	return v;
}

int main(void)
{
	static const size_t store_sizes[] = { 8, 4 };
	CUdeviceptr A, B, C, D, E;
	struct buf bA, bB, bC, bD, bE;
	CUgraph g, child, g2, gbad;
	CUgraphNode nk, ncp, nms, nchild, nk2, inner;
	CUgraphExec ex, ex2, exbad, full[3];
	CUDA_GRAPH_INSTANTIATE_PARAMS ip;
	CUDA_MEMCPY3D cp;
	struct dag_range r[16];
	struct dag_config cfg;
	struct graph_stats gs;
	struct dag_stats st;
	const struct seen_node *n;
	uint64_t bits[1];
	bool unb;
	CUdevice dev;
	CUmodule mod;
	CUstream s1;
	reg_fn reg;
	fault_fn fault;

	alarm(60);
	use_fake();
	setenv("GPUCR_DAEMON", "0", 1);
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	reg = (reg_fn)fakecuda_sym("fakecuda_register_kernel");
	fault = (fault_fn)fakecuda_sym("fakecuda_inject_fault");
	REQUIRE(reg && fault);
	REQUIRE(reg("store", store, 2, store_sizes) == 0);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&kstore, mod, "store") == CUDA_SUCCESS);
	REQUIRE(cuStreamCreate(&s1, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&A, 3 * MIB) == CUDA_SUCCESS); /* 3 chunks of 1 MiB */
	REQUIRE(cuMemAlloc_v2(&B, 4 * MIB) == CUDA_SUCCESS); /* 4 */
	REQUIRE(cuMemAlloc_v2(&C, 4 * MIB) == CUDA_SUCCESS); /* 4 */
	REQUIRE(cuMemAlloc_v2(&D, 2 * MIB) == CUDA_SUCCESS); /* 2 */
	REQUIRE(cuMemAlloc_v2(&E, 6 * MIB) == CUDA_SUCCESS); /* 6 */
	bA = buf_of(A);
	bB = buf_of(B);
	bC = buf_of(C);
	bD = buf_of(D);
	bE = buf_of(E);
	memset(&cfg, 0, sizeof(cfg));
	cfg.chunk_size = MIB;
	REQUIRE(dag_configure(&cfg) == 0);

	/* g: store(A + 16, 42); copy B + 1 MiB -> C + 2 MiB (4 KiB); memset of
	 * D's second chunk; an empty node; a child graph that memsets rows
	 * 2 MiB apart in E (chunks 0, 2, 4). */
	REQUIRE(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
	nk = add_kernel(g, A + 16, 42);
	cp = copy_params(C + 2 * MIB, B + MIB, 4096);
	REQUIRE(cuGraphAddMemcpyNode(&ncp, g, &nk, 1, &cp, ctx) == CUDA_SUCCESS);
	nms = add_memset(g, D + MIB, 0, 256, 1);
	{
		CUgraphNode e;

		REQUIRE(cuGraphAddEmptyNode(&e, g, &nms, 1) == CUDA_SUCCESS);
	}
	REQUIRE(cuGraphCreate(&child, 0) == CUDA_SUCCESS);
	add_memset(child, E, 2 * MIB, 16, 3);
	REQUIRE(cuGraphAddChildGraphNode(&nchild, g, NULL, 0, child) == CUDA_SUCCESS);
	REQUIRE(cuGraphChildGraphNodeGetGraph(nchild, &child) == CUDA_SUCCESS); /* the node's own copy */
	{
		size_t k = 1;

		REQUIRE(cuGraphGetNodes(child, &inner, &k) == CUDA_SUCCESS && k == 1);
	}

	/* Instantiation precomputes the set. */
	REQUIRE(cuGraphInstantiateWithFlags(&ex, g, 0) == CUDA_SUCCESS);
	CHECK_EQ_INT(graph_exec_ranges(ex, &unb, r, 16), 7);
	CHECK(!unb);
	CHECK(r[0].addr == bA.base && r[0].len == bA.size && r[0].access == RW && r[0].flags == DAG_RANGE_WHOLE);
	CHECK(r[1].addr == B + MIB && r[1].len == 4096 && r[1].access == R);
	CHECK(r[2].addr == C + 2 * MIB && r[2].len == 4096 && r[2].access == W);
	CHECK(r[3].addr == D + MIB && r[3].len == 1024 && r[3].access == W);
	CHECK(r[4].addr == E && r[4].len == 64 && r[4].access == W);
	CHECK(r[5].addr == E + 2 * MIB && r[5].len == 64 && r[5].access == W);
	CHECK(r[6].addr == E + 4 * MIB && r[6].len == 64 && r[6].access == W);
	graph_get_stats(&gs);
	CHECK_EQ_INT(gs.execs, 1);

	/* Outside an epoch a launch records nothing; the graph runs. */
	CHECK_EQ_INT(cuGraphLaunch(ex, s1), CUDA_SUCCESS);
	CHECK_EQ_INT(readint(A + 16), 42);
	CHECK_EQ_INT(readint(D + MIB + 1020), 0x01010101);
	CHECK_EQ_INT(readint(E + 4 * MIB + 60), 0x01010101);
	CHECK_EQ_INT(readint(E + 4 * MIB + 64), 0);
	dag_get_stats(&st);
	CHECK_EQ_INT(st.nodes, 0);

	REQUIRE(dag_epoch_begin() == 0);
	CHECK_EQ_INT(cuGraphLaunch(ex, s1), CUDA_SUCCESS);
	n = launched(ex, s1, 0, 7);
	CHECK(has_edge(n, bA.id, 0, 3, RW));
	CHECK(has_edge(n, bB.id, 1, 2, R));
	CHECK(has_edge(n, bC.id, 2, 3, W));
	CHECK(has_edge(n, bD.id, 1, 2, W));
	CHECK(has_edge(n, bE.id, 0, 1, W));
	CHECK(has_edge(n, bE.id, 2, 3, W));
	CHECK(has_edge(n, bE.id, 4, 5, W));
	CHECK_EQ_INT(cuGraphLaunch_ptsz(ex, NULL), CUDA_SUCCESS);
	n = launched(ex, CU_STREAM_PER_THREAD, 0, 7);
	CHECK_EQ_INT(cuGraphLaunch_ptsz(ex, s1), CUDA_SUCCESS);
	n = launched(ex, s1, 0, 7);
	CHECK_EQ_INT(n->n.stream_seq, 1);
	CHECK_EQ_INT(dag_written(bB.id, bB.size, bits, 1), 0);
	CHECK_EQ_INT(dag_written(bE.id, bE.size, bits, 1), 3);
	CHECK_EQ_INT(bits[0], 0x15);

	/* New parameters: the node's part of the set follows. */
	{
		CUDA_KERNEL_NODE_PARAMS kp;
		CUdeviceptr p = B + 8;
		int v = 7;
		void *params[] = { &p, &v };
		CUDA_MEMSET_NODE_PARAMS m = memset_params(D, 0, 4, 1);

		memset(&kp, 0, sizeof(kp));
		kp.func = kstore;
		kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
		kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
		kp.kernelParams = params;
		CHECK_EQ_INT(cuGraphExecKernelNodeSetParams_v2(ex, nk, &kp), CUDA_SUCCESS);
		CHECK_EQ_INT(cuGraphExecMemsetNodeSetParams(ex, nms, &m, ctx), CUDA_SUCCESS);
		cp = copy_params(A, C + 3 * MIB, 16);
		CHECK_EQ_INT(cuGraphExecMemcpyNodeSetParams(ex, ncp, &cp, ctx), CUDA_SUCCESS);
	}
	CHECK_EQ_INT(graph_exec_ranges(ex, &unb, r, 16), 7);
	CHECK(!unb);
	CHECK_EQ_INT(cuGraphLaunch(ex, s1), CUDA_SUCCESS);
	n = launched(ex, s1, 0, 7);
	CHECK_EQ_INT(readint(B + 8), 7); /* (a copy: a node of its own) */
	CHECK(has_edge(n, bB.id, 0, 4, RW));
	CHECK(has_edge(n, bC.id, 3, 4, R));
	CHECK(has_edge(n, bA.id, 0, 1, W));
	CHECK(has_edge(n, bD.id, 0, 1, W));
	CHECK(has_edge(n, bE.id, 2, 3, W));

	/* A child graph replaced: recomputed from the new one. */
	REQUIRE(cuGraphCreate(&g2, 0) == CUDA_SUCCESS);
	add_memset(g2, C, 0, 4, 1);
	CHECK_EQ_INT(cuGraphExecChildGraphNodeSetParams(ex, nchild, g2), CUDA_SUCCESS);
	CHECK_EQ_INT(cuGraphLaunch(ex, s1), CUDA_SUCCESS);
	n = launched(ex, s1, 0, 5);
	CHECK(has_edge(n, bC.id, 0, 1, W));
	CHECK_EQ_INT(graph_exec_ranges(ex, &unb, NULL, 0), 5);

	/* New parameters the driver refuses (for a node inside the child)
	 * change nothing. */
	{
		CUDA_MEMSET_NODE_PARAMS m = memset_params(E, 0, 4, 1);

		CHECK(cuGraphExecMemsetNodeSetParams(ex, inner, &m, ctx) != CUDA_SUCCESS); /* the fake refuses */
		CHECK_EQ_INT(graph_exec_ranges(ex, &unb, NULL, 0), 5);
		CHECK(!unb);
	}

	/* cuGraphExecUpdate: the set of the new graph. */
	REQUIRE(cuGraphCreate(&g2, 0) == CUDA_SUCCESS);
	nk2 = add_kernel(g2, D, 1);
	cp = copy_params(E + 5 * MIB, A, 8);
	REQUIRE(cuGraphAddMemcpyNode(&ncp, g2, NULL, 0, &cp, ctx) == CUDA_SUCCESS);
	add_memset(g2, B, 0, 4, 1);
	{
		CUgraphNode e;

		REQUIRE(cuGraphAddEmptyNode(&e, g2, NULL, 0) == CUDA_SUCCESS);
	}
	REQUIRE(cuGraphCreate(&child, 0) == CUDA_SUCCESS);
	REQUIRE(cuGraphAddChildGraphNode(&nchild, g2, NULL, 0, child) == CUDA_SUCCESS);
	{
		CUgraphExecUpdateResultInfo info;

		CHECK_EQ_INT(cuGraphExecUpdate_v2(ex, g2, &info), CUDA_SUCCESS);
	}
	CHECK_EQ_INT(cuGraphLaunch(ex, s1), CUDA_SUCCESS);
	n = launched(ex, s1, 0, 4);
	CHECK(has_edge(n, bD.id, 0, 2, RW));
	CHECK(has_edge(n, bA.id, 0, 1, R));
	CHECK(has_edge(n, bE.id, 5, 6, W));
	CHECK(has_edge(n, bB.id, 0, 1, W));
	/* Nodes of g2 are now known; a kernel node set to parameters that
	 * cannot be decoded makes the graph unbounded. */
	{
		CUDA_KERNEL_NODE_PARAMS_v2 kp;
		CUdeviceptr p = A;
		int v = 3;
		void *params[] = { &p, &v };
		CUfunction kfresh;

		/* A function whose layout the driver will not give. */
		REQUIRE(reg("store_fresh", store, 2, store_sizes) == 0);
		REQUIRE(cuModuleGetFunction(&kfresh, mod, "store_fresh") == CUDA_SUCCESS);
		REQUIRE(fault("cuFuncGetParamInfo", 1, CUDA_ERROR_UNKNOWN) == 0);
		memset(&kp, 0, sizeof(kp));
		kp.func = kfresh;
		kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
		kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
		kp.kernelParams = params;
		CHECK_EQ_INT(cuGraphExecKernelNodeSetParams_v2(ex, nk2, &kp), CUDA_SUCCESS);
		CHECK_EQ_INT(graph_exec_ranges(ex, &unb, NULL, 0), 3);
		CHECK(unb);
	}
	CHECK_EQ_INT(cuGraphLaunch(ex, s1), CUDA_SUCCESS);
	n = launched(ex, s1, DAG_NODE_F_UNBOUNDED, 3);
	dag_get_stats(&st);
	CHECK(st.unbounded && !st.overflowed);
	CHECK_EQ_INT(dag_written(bC.id, bC.size, bits, 1), 4); /* every chunk now */
	CHECK_EQ_INT(dag_epoch_end(), 0);

	/* A graph whose nodes cannot be read is unbounded from the start. */
	REQUIRE(cuGraphCreate(&gbad, 0) == CUDA_SUCCESS);
	add_kernel(gbad, A, 1);
	add_memset(gbad, B, 0, 4, 1);
	REQUIRE(fault("cuGraphKernelNodeGetParams", 1, CUDA_ERROR_UNKNOWN) == 0);
	memset(&ip, 0, sizeof(ip));
	REQUIRE(cuGraphInstantiateWithParams(&exbad, gbad, &ip) == CUDA_SUCCESS);
	CHECK_EQ_INT(graph_exec_ranges(exbad, &unb, r, 16), 1);
	CHECK(unb);
	CHECK(r[0].addr == B && r[0].access == W);
	REQUIRE(dag_epoch_begin() == 0);
	CHECK_EQ_INT(cuGraphLaunch(exbad, s1), CUDA_SUCCESS);
	n = launched(exbad, s1, DAG_NODE_F_UNBOUNDED, 1);
	CHECK(has_edge(n, bB.id, 0, 1, W));
	CHECK_EQ_INT(dag_written(bA.id, bA.size, bits, 1), 3);
	CHECK_EQ_INT(dag_epoch_end(), 0);

	/* Destroy drops the entry. */
	graph_get_stats(&gs);
	CHECK_EQ_INT(gs.execs, 2);
	CHECK_EQ_INT(graph_configure(2), -EBUSY);
	CHECK_EQ_INT(cuGraphExecDestroy(exbad), CUDA_SUCCESS);
	CHECK_EQ_INT(graph_exec_ranges(exbad, NULL, NULL, 0), -ENOENT);
	CHECK_EQ_INT(cuGraphExecDestroy(ex), CUDA_SUCCESS);
	graph_get_stats(&gs);
	CHECK_EQ_INT(gs.execs, 0);

	/* A table of two: the third graph is not tracked, and its launches
	 * count as unbounded; a destroy makes room again. */
	CHECK_EQ_INT(graph_configure(2), 0);
	for (int i = 0; i < 3; i++)
		REQUIRE(cuGraphInstantiateWithFlags(&full[i], g, 0) == CUDA_SUCCESS);
	graph_get_stats(&gs);
	CHECK_EQ_INT(gs.execs, 2);
	CHECK_EQ_INT(gs.untracked, 1);
	CHECK_EQ_INT(graph_exec_ranges(full[0], NULL, NULL, 0), 7);
	CHECK_EQ_INT(graph_exec_ranges(full[1], NULL, NULL, 0), 7);
	CHECK_EQ_INT(graph_exec_ranges(full[2], NULL, NULL, 0), -ENOENT);
	REQUIRE(dag_epoch_begin() == 0);
	CHECK_EQ_INT(cuGraphLaunch(full[1], s1), CUDA_SUCCESS);
	launched(full[1], s1, 0, 7);
	CHECK_EQ_INT(cuGraphLaunch(full[2], s1), CUDA_SUCCESS);
	launched(full[2], s1, DAG_NODE_F_UNBOUNDED, 0);
	CHECK_EQ_INT(dag_epoch_end(), 0);
	CHECK_EQ_INT(cuGraphExecDestroy(full[0]), CUDA_SUCCESS);
	REQUIRE(cuGraphInstantiateWithFlags(&ex2, g, 0) == CUDA_SUCCESS);
	CHECK_EQ_INT(graph_exec_ranges(ex2, NULL, NULL, 0), 7);
	CHECK_EQ_INT(graph_exec_ranges(full[1], NULL, NULL, 0), 7);
	for (int i = 1; i < 3; i++)
		CHECK_EQ_INT(cuGraphExecDestroy(full[i]), CUDA_SUCCESS);
	CHECK_EQ_INT(cuGraphExecDestroy(ex2), CUDA_SUCCESS);
	graph_get_stats(&gs);
	CHECK_EQ_INT(gs.execs, 0);
	CHECK_EQ_INT(graph_configure(0), 0);

	CHECK_EQ_INT(cuMemFree_v2(A), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(B), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(C), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(D), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(E), CUDA_SUCCESS);
	return t_done();
}
