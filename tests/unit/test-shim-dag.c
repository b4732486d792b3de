/* The epoch DAG (dag.h): launches on two streams made while an epoch is
 * open become nodes in stream order with read+write edges to whole-buffer
 * chunk ranges; the written-chunk bitmaps; a configurable chunk size;
 * failed launches and launches outside an epoch (decoding off) are not
 * recorded; overflow of nodes or edges marks every chunk written.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * GPUCR_DAEMON=0 keeps the control thread out of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buftab.h"
#include "dag.h"
#include "fakecuda.h"
#include "launch.h"
#include "t.h"
#include "shimtest.h"
#include "dagtest.h"

#define MIB (1UL << 20)

typedef int (*reg_fn)(const char *, fakecuda_kernel_fn, int, const size_t *);

static void noop(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
}

static CUfunction k2;

/* k2(a, b) on stream s. */
static CUresult launch2(CUstream s, CUdeviceptr a, CUdeviceptr b)
{
	void *params[] = { &a, &b };

	return cuLaunchKernel(k2, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

/* Node i has an edge to buffer id over chunks [lo, hi), read+write. */
static int has_rw(unsigned i, uint64_t id, uint32_t lo, uint32_t hi)
{
	return has_edge(&seen[i], id, lo, hi, DAG_ACCESS_READ | DAG_ACCESS_WRITE);
}

int main(void)
{
	static const size_t sizes[] = { 8, 8 };
	CUdeviceptr A, B, C, D;
	struct buf bA, bB, bC, bD;
	struct dag_stats st;
	struct dag_config cfg;
	CUstream s1, s2;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	uint64_t bits[4];
	reg_fn reg;

	use_fake();
	setenv("GPUCR_DAEMON", "0", 1);
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	reg = (reg_fn)fakecuda_sym("fakecuda_register_kernel");
	REQUIRE(reg);
	REQUIRE(reg("k2", noop, 2, sizes) == 0);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&k2, mod, "k2") == CUDA_SUCCESS);
	REQUIRE(cuStreamCreate(&s1, 0) == CUDA_SUCCESS);
	REQUIRE(cuStreamCreate(&s2, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&A, 5 * MIB) == CUDA_SUCCESS);  /* 3 chunks of 2 MiB */
	REQUIRE(cuMemAlloc_v2(&B, 64 * 1024) == CUDA_SUCCESS); /* 1 */
	REQUIRE(cuMemAlloc_v2(&C, 8 * MIB) == CUDA_SUCCESS);  /* 4 */
	REQUIRE(cuMemAlloc_v2(&D, 4 * MIB) == CUDA_SUCCESS);  /* never launched on */
	bA = buf_of(A);
	bB = buf_of(B);
	bC = buf_of(C);
	bD = buf_of(D);

	/* No epoch: decoding off, nothing recorded. */
	CHECK_EQ_INT(launch_decoding, 0);
	CHECK_EQ_INT(launch2(s1, A, B), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK(!st.open);
	CHECK_EQ_INT(st.nodes, 0);
	CHECK_EQ_INT(launch_paraminfo_calls(), 0);
	CHECK_EQ_INT(dag_written(bA.id, bA.size, bits, 4), 0);
	CHECK_EQ_INT(dag_epoch_end(), -EINVAL);

	/* An epoch over two streams. */
	REQUIRE(dag_epoch_begin() == 0);
	CHECK_EQ_INT(dag_epoch_begin(), -EBUSY);
	memset(&cfg, 0, sizeof(cfg));
	cfg.chunk_size = MIB;
	CHECK_EQ_INT(dag_configure(&cfg), -EBUSY);
	CHECK(launch_decoding != 0);
	CHECK_EQ_INT(launch2(s1, A, B), CUDA_SUCCESS);            /* node 0: s1 #0 */
	CHECK_EQ_INT(launch2(s2, C + 3 * MIB, 12345), CUDA_SUCCESS); /* node 1: s2 #0 */
	{
		CUlaunchConfig lc;
		CUdeviceptr a = A + 4 * MIB, b = 0;
		void *params[] = { &a, &b };

		memset(&lc, 0, sizeof(lc));
		lc.gridDimX = lc.gridDimY = lc.gridDimZ = 1;
		lc.blockDimX = lc.blockDimY = lc.blockDimZ = 1;
		lc.hStream = s1;
		CHECK_EQ_INT(cuLaunchKernelEx(&lc, k2, params, NULL), CUDA_SUCCESS); /* node 2: s1 #1 */
	}
	{
		unsigned char packed[16];
		size_t size = sizeof(packed);
		void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
				  CU_LAUNCH_PARAM_END };

		memcpy(packed, &B, 8);
		memcpy(packed + 8, &C, 8);
		CHECK_EQ_INT(cuLaunchKernel(k2, 1, 1, 1, 1, 1, 1, 0, s2, NULL, extra), CUDA_SUCCESS); /* node 3: s2 #1 */
	}
	/* A launch the driver refuses is no node. */
	{
		void *params[] = { &A, &D };

		CHECK(cuLaunchKernel(k2, 0, 1, 1, 1, 1, 1, 0, s1, params, NULL) != CUDA_SUCCESS);
	}
	dag_get_stats(&st);
	CHECK(st.open);
	CHECK(!st.overflowed);
	CHECK_EQ_INT(st.nodes, 4);
	CHECK_EQ_INT(st.edges, 6);
	CHECK_EQ_INT(st.bufs, 3);
	CHECK_EQ_INT(st.chunk_size, DAG_CHUNK_DEFAULT);

	collect_all();
	REQUIRE(nseen == 4);
	for (unsigned i = 0; i < 4; i++) {
		CHECK_EQ_INT(seen[i].n.seq, i);
		CHECK(seen[i].n.func == k2);
	}
	CHECK(seen[0].n.stream == s1 && seen[0].n.stream_seq == 0);
	CHECK(seen[1].n.stream == s2 && seen[1].n.stream_seq == 0);
	CHECK(seen[2].n.stream == s1 && seen[2].n.stream_seq == 1);
	CHECK(seen[3].n.stream == s2 && seen[3].n.stream_seq == 1);
	CHECK_EQ_INT(seen[0].nedges, 2);
	CHECK(has_rw(0, bA.id, 0, 3));
	CHECK(has_rw(0, bB.id, 0, 1));
	CHECK_EQ_INT(seen[1].nedges, 1);
	CHECK(has_rw(1, bC.id, 0, 4));
	CHECK_EQ_INT(seen[2].nedges, 1);
	CHECK(has_rw(2, bA.id, 0, 3));
	CHECK_EQ_INT(seen[3].nedges, 2);
	CHECK(has_rw(3, bB.id, 0, 1));
	CHECK(has_rw(3, bC.id, 0, 4));

	/* Written chunks, per buffer. */
	CHECK_EQ_INT(dag_written(bA.id, bA.size, bits, 4), 3);
	CHECK_EQ_INT(bits[0], 0x7);
	CHECK_EQ_INT(dag_written(bC.id, bC.size, bits, 4), 4);
	CHECK_EQ_INT(bits[0], 0xf);
	CHECK_EQ_INT(dag_written(bB.id, bB.size, bits, 4), 1);
	CHECK_EQ_INT(bits[0], 0x1);
	CHECK_EQ_INT(dag_written(bD.id, bD.size, bits, 4), 0);
	CHECK_EQ_INT(bits[0], 0);
	CHECK_EQ_INT(dag_written(bA.id, 200 * 64 * MIB, bits, 4), -ENOSPC);

	/* Closed: decoding off again, nothing more recorded, the record stays. */
	CHECK_EQ_INT(dag_epoch_end(), 0);
	CHECK_EQ_INT(launch_decoding, 0);
	CHECK_EQ_INT(launch2(s1, D, D), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK(!st.open);
	CHECK_EQ_INT(st.nodes, 4);
	CHECK_EQ_INT(dag_written(bD.id, bD.size, bits, 4), 0);

	/* A chunk size of 1 MiB: A is 5 chunks, B 1. */
	CHECK_EQ_INT(dag_configure(&cfg), 0);
	REQUIRE(dag_epoch_begin() == 0);
	CHECK_EQ_INT(launch2(s2, A + 1, B + 4), CUDA_SUCCESS);
	collect_all();
	REQUIRE(nseen == 1);
	CHECK(has_rw(0, bA.id, 0, 5));
	CHECK(has_rw(0, bB.id, 0, 1));
	CHECK(seen[0].n.stream == s2 && seen[0].n.stream_seq == 0);
	CHECK_EQ_INT(dag_written(bA.id, bA.size, bits, 4), 5);
	CHECK_EQ_INT(bits[0], 0x1f);
	CHECK_EQ_INT(dag_epoch_end(), 0);

	/* Overflow of nodes: recording stops, every chunk counts as written. */
	memset(&cfg, 0, sizeof(cfg));
	cfg.chunk_size = DAG_CHUNK_DEFAULT;
	cfg.max_nodes = 2;
	CHECK_EQ_INT(dag_configure(&cfg), 0);
	REQUIRE(dag_epoch_begin() == 0);
	CHECK_EQ_INT(launch2(s1, A, 0), CUDA_SUCCESS);
	CHECK_EQ_INT(launch2(s2, B, 0), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK(!st.overflowed);
	CHECK_EQ_INT(dag_written(bD.id, bD.size, bits, 4), 0);
	CHECK_EQ_INT(launch2(s1, C, 0), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK(st.overflowed);
	CHECK_EQ_INT(st.nodes, 2);
	CHECK_EQ_INT(launch2(s1, C, 0), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK_EQ_INT(st.nodes, 2);
	CHECK_EQ_INT(dag_written(bD.id, bD.size, bits, 4), 2);
	CHECK_EQ_INT(bits[0], 0x3);
	CHECK_EQ_INT(dag_written(bC.id, bC.size, bits, 4), 4);
	CHECK_EQ_INT(dag_epoch_end(), 0);

	/* A new epoch forgets the overflow. Overflow of edges: 3 fit, not 4. */
	cfg.max_nodes = 0;
	cfg.max_edges = 3;
	CHECK_EQ_INT(dag_configure(&cfg), 0);
	REQUIRE(dag_epoch_begin() == 0);
	dag_get_stats(&st);
	CHECK(!st.overflowed);
	CHECK_EQ_INT(st.nodes, 0);
	CHECK_EQ_INT(launch2(s1, A, B), CUDA_SUCCESS);
	CHECK_EQ_INT(launch2(s1, C, 0), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK(!st.overflowed);
	CHECK_EQ_INT(st.edges, 3);
	CHECK_EQ_INT(launch2(s1, D, 0), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK(st.overflowed);
	CHECK_EQ_INT(st.nodes, 2);
	CHECK_EQ_INT(dag_written(bD.id, bD.size, bits, 4), 2);
	CHECK_EQ_INT(dag_epoch_end(), 0);
	CHECK_EQ_INT(launch_decoding, 0);

	CHECK_EQ_INT(cuMemFree_v2(A), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(B), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(C), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(D), CUDA_SUCCESS);
	return t_done();
}
