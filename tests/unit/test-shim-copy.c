/* Copies and memsets (copy.c): every memcpy and memset entry point passes
 * the gate (blocked while it is closed), records nothing outside an epoch,
 * and during one becomes a DAG node of kind copy or memset, on the NULL
 * stream (synchronous), CU_STREAM_PER_THREAD (_ptds, and _ptsz on NULL) or
 * its stream, with read edges on the source chunks and write edges on the
 * destination chunks, none for host memory: 1D, peer, batch, 2D and 3D
 * (pitched rows exact per chunk; too many rows make one bounding range)
 * and memsets in 1D and 2D. Failed calls make no node. The fake driver
 * does the copies for real, which is checked too.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * GPUCR_DAEMON=0 keeps the control thread out of it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"
#include "gate.h"
#include "launch.h"
#include "t.h"
#include "shimtest.h"
#include "dagtest.h"

#define MIB (1UL << 20)
#define R DAG_ACCESS_READ
#define W DAG_ACCESS_WRITE
#define PT CU_STREAM_PER_THREAD

static unsigned expect_nodes;

/* Makes the call, which must succeed and add one node of that kind on that
 * stream with nedges edges; leaves it in `n`. */
#define NODE(call, kind_, stream_, nedges_)                                  \
	do {                                                                 \
		CHECK_EQ_INT((call), CUDA_SUCCESS);                          \
		n = last_node();                                             \
		REQUIRE(n);                                                  \
		CHECK_EQ_INT(nseen, ++expect_nodes);                         \
		CHECK_EQ_INT(n->n.kind, kind_);                              \
		CHECK(n->n.stream == (CUstream)(stream_));                   \
		CHECK_EQ_INT(n->nedges, nedges_);                            \
		CHECK_EQ_INT(n->n.flags, 0);                                 \
	} while (0)

#define COPY(call, stream_, nedges_) NODE(call, DAG_NODE_COPY, stream_, nedges_)
#define SET(call, stream_, nedges_) NODE(call, DAG_NODE_MEMSET, stream_, nedges_)

static CUdeviceptr A, B, C;
static CUcontext ctx;

static CUresult gated_results[2];
static int gated_done[2];
static pthread_barrier_t ready_b, go_b;

/* The context is made current while the gate is open; the call comes once
 * main has closed it. */
static void ready(void)
{
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	pthread_barrier_wait(&ready_b);
	pthread_barrier_wait(&go_b);
}

static void *t_copy(void *arg)
{
	(void)arg;
	ready();
	gated_results[0] = cuMemcpyDtoD_v2(B, A, 4096);
	__atomic_store_n(&gated_done[0], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *t_memset(void *arg)
{
	(void)arg;
	ready();
	gated_results[1] = cuMemsetD8Async_ptsz(C, 3, 100, NULL);
	__atomic_store_n(&gated_done[1], 1, __ATOMIC_RELEASE);
	return NULL;
}

static void gate_blocks_copies(void)
{
	pthread_t t[2];

	pthread_barrier_init(&ready_b, NULL, 3);
	pthread_barrier_init(&go_b, NULL, 3);
	REQUIRE(pthread_create(&t[0], NULL, t_copy, NULL) == 0);
	REQUIRE(pthread_create(&t[1], NULL, t_memset, NULL) == 0);
	pthread_barrier_wait(&ready_b);
	gate_close();
	pthread_barrier_wait(&go_b);
	for (int i = 0; i < 5000 && gate_waiters() < 2; i++)
		usleep(1000);
	CHECK_EQ_INT(gate_waiters(), 2);
	usleep(20 * 1000);
	CHECK_EQ_INT(__atomic_load_n(&gated_done[0], __ATOMIC_ACQUIRE), 0);
	CHECK_EQ_INT(__atomic_load_n(&gated_done[1], __ATOMIC_ACQUIRE), 0);
	gate_open();
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	pthread_barrier_destroy(&ready_b);
	pthread_barrier_destroy(&go_b);
	CHECK_EQ_INT(gated_results[0], CUDA_SUCCESS);
	CHECK_EQ_INT(gated_results[1], CUDA_SUCCESS);
}

int main(void)
{
	const struct seen_node *n;
	struct dag_config cfg;
	struct dag_stats st;
	struct buf bA, bB, bC;
	CUDA_MEMCPY2D c2, c2b;
	CUDA_MEMCPY3D c3;
	CUDA_MEMCPY3D_PEER p3;
	CUmemcpyAttributes attr;
	CUdevice dev;
	CUstream s1;
	unsigned char *host;
	size_t attr_idx = 0;

	alarm(60);
	use_fake();
	setenv("GPUCR_DAEMON", "0", 1);
	host = calloc(1, 8 * MIB);
	REQUIRE(host);
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuStreamCreate(&s1, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&A, 6 * MIB) == CUDA_SUCCESS); /* 6 chunks of 1 MiB */
	REQUIRE(cuMemAlloc_v2(&B, 4 * MIB) == CUDA_SUCCESS); /* 4 */
	REQUIRE(cuMemAlloc_v2(&C, 64 * 1024) == CUDA_SUCCESS); /* 1 */
	bA = buf_of(A);
	bB = buf_of(B);
	bC = buf_of(C);

	/* The copies are real. */
	memset(host, 0x5a, 4096);
	CHECK_EQ_INT(cuMemcpyHtoD_v2_ptds(A + 100, host, 4096), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemcpyDtoDAsync_v2_ptsz(B, A + 100, 4096, NULL), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemsetD16Async_ptsz(B + 8, 0x1234, 2, s1), CUDA_SUCCESS);
	memset(host, 0, 4096);
	CHECK_EQ_INT(cuMemcpyDtoH_v2(host, B, 4096), CUDA_SUCCESS);
	CHECK(host[0] == 0x5a && host[7] == 0x5a && host[8] == 0x34 && host[9] == 0x12 && host[12] == 0x5a &&
	      host[4095] == 0x5a);
	memset(&c2, 0, sizeof(c2));
	c2.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c2.srcDevice = B;
	c2.srcPitch = 8;
	c2.dstMemoryType = CU_MEMORYTYPE_HOST;
	c2.dstHost = host + 4096;
	c2.dstPitch = 8;
	c2.WidthInBytes = 4;
	c2.Height = 2;
	CHECK_EQ_INT(cuMemcpy2D_v2_ptds(&c2), CUDA_SUCCESS);
	CHECK(host[4096] == 0x5a && host[4099] == 0x5a && host[4100] == 0 && host[4104] == 0x34 && host[4105] == 0x12 &&
	      host[4108] == 0);

	/* No epoch: nothing recorded, whatever the variant. */
	CHECK_EQ_INT(launch_decoding, 0);
	CHECK_EQ_INT(cuMemcpy(B, A, 4096), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemsetD2D32_v2(A, 4096, 1, 16, 4), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemcpyAsync_ptsz(B, A, 4096, s1), CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK_EQ_INT(st.nodes, 0);

	/* The gate holds copies and memsets back while closed. */
	gate_blocks_copies();

	memset(&cfg, 0, sizeof(cfg));
	cfg.chunk_size = MIB;
	REQUIRE(dag_configure(&cfg) == 0);
	REQUIRE(dag_epoch_begin() == 0);

	/* ---- 1D ---- */
	COPY(cuMemcpy(B, A + 2 * MIB + 5, 100), NULL, 2);
	CHECK(has_edge(n, bA.id, 2, 3, R));
	CHECK(has_edge(n, bB.id, 0, 1, W));
	COPY(cuMemcpy_ptds(B + 2 * MIB, A, 2 * MIB), PT, 2);
	CHECK(has_edge(n, bA.id, 0, 2, R));
	CHECK(has_edge(n, bB.id, 2, 4, W));
	COPY(cuMemcpyDtoD_v2(A + MIB, B, 3 * MIB), NULL, 2);
	CHECK(has_edge(n, bB.id, 0, 3, R));
	CHECK(has_edge(n, bA.id, 1, 4, W));
	COPY(cuMemcpyDtoD_v2_ptds(C, A + 5 * MIB, 4096), PT, 2);
	CHECK(has_edge(n, bA.id, 5, 6, R));
	CHECK(has_edge(n, bC.id, 0, 1, W));
	COPY(cuMemcpyHtoD_v2(A + 4 * MIB - 10, host, 20), NULL, 1);
	CHECK(has_edge(n, bA.id, 3, 5, W));
	COPY(cuMemcpyHtoD_v2_ptds(B, host, 10), PT, 1);
	CHECK(has_edge(n, bB.id, 0, 1, W));
	COPY(cuMemcpyDtoH_v2(host, B + MIB, MIB + 1), NULL, 1);
	CHECK(has_edge(n, bB.id, 1, 3, R));
	COPY(cuMemcpyDtoH_v2_ptds(host, C, 100), PT, 1);
	CHECK(has_edge(n, bC.id, 0, 1, R));
	COPY(cuMemcpy((CUdeviceptr)host, A + 3 * MIB, 10), NULL, 1); /* unified: host side, no edge */
	CHECK(has_edge(n, bA.id, 3, 4, R));
	COPY(cuMemcpyPeer(B + MIB, ctx, A, ctx, 10), NULL, 2);
	CHECK(has_edge(n, bA.id, 0, 1, R));
	CHECK(has_edge(n, bB.id, 1, 2, W));
	COPY(cuMemcpyPeer_ptds(B + MIB, ctx, A, ctx, 10), PT, 2);
	CHECK(has_edge(n, bB.id, 1, 2, W));

	COPY(cuMemcpyAsync(B, A, 10, s1), s1, 2);
	COPY(cuMemcpyAsync_ptsz(B, A, 10, NULL), PT, 2);
	COPY(cuMemcpyAsync_ptsz(B, A, 10, s1), s1, 2);
	CHECK_EQ_INT(n->n.stream_seq, 1);
	COPY(cuMemcpyDtoDAsync_v2(A + 4 * MIB, B + 2 * MIB, 10, s1), s1, 2);
	CHECK(has_edge(n, bB.id, 2, 3, R));
	CHECK(has_edge(n, bA.id, 4, 5, W));
	COPY(cuMemcpyDtoDAsync_v2_ptsz(A, B, 10, NULL), PT, 2);
	COPY(cuMemcpyHtoDAsync_v2(A + 5 * MIB, host, 10, s1), s1, 1);
	CHECK(has_edge(n, bA.id, 5, 6, W));
	COPY(cuMemcpyHtoDAsync_v2_ptsz(A + 5 * MIB, host, 10, NULL), PT, 1);
	CHECK(has_edge(n, bA.id, 5, 6, W));
	COPY(cuMemcpyDtoHAsync_v2(host, B + 2 * MIB, 10, s1), s1, 1);
	CHECK(has_edge(n, bB.id, 2, 3, R));
	COPY(cuMemcpyDtoHAsync_v2_ptsz(host, B + 2 * MIB, 10, s1), s1, 1);
	CHECK(has_edge(n, bB.id, 2, 3, R));
	COPY(cuMemcpyPeerAsync(C, ctx, B + 3 * MIB, ctx, 10, s1), s1, 2);
	CHECK(has_edge(n, bB.id, 3, 4, R));
	CHECK(has_edge(n, bC.id, 0, 1, W));
	COPY(cuMemcpyPeerAsync_ptsz(C, ctx, B + 3 * MIB, ctx, 10, NULL), PT, 2);
	CHECK(has_edge(n, bC.id, 0, 1, W));

	/* A batch: one node, every copy's edges. */
	{
		CUdeviceptr dsts[2] = { B + 2 * MIB, C }, srcs[2] = { A, (CUdeviceptr)host };
		size_t sizes[2] = { 10, 10 };

		memset(&attr, 0, sizeof(attr));
		attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
		COPY(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, &attr, &attr_idx, 1, s1), s1, 3);
		CHECK(has_edge(n, bA.id, 0, 1, R));
		CHECK(has_edge(n, bB.id, 2, 3, W));
		CHECK(has_edge(n, bC.id, 0, 1, W));
		COPY(cuMemcpyBatchAsync_v2_ptsz(dsts, srcs, sizes, 2, &attr, &attr_idx, 1, NULL), PT, 3);
	}

	/* ---- 2D: rows 2 MiB apart touch every other chunk, exactly ---- */
	memset(&c2, 0, sizeof(c2));
	c2.srcMemoryType = CU_MEMORYTYPE_HOST;
	c2.srcHost = host;
	c2.srcPitch = 4096;
	c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c2.dstDevice = A;
	c2.dstPitch = 2 * MIB;
	c2.WidthInBytes = 4096;
	c2.Height = 3;
	COPY(cuMemcpy2D_v2(&c2), NULL, 3);
	CHECK(has_edge(n, bA.id, 0, 1, W));
	CHECK(has_edge(n, bA.id, 2, 3, W));
	CHECK(has_edge(n, bA.id, 4, 5, W));
	COPY(cuMemcpy2D_v2_ptds(&c2), PT, 3);
	COPY(cuMemcpy2DUnaligned_v2(&c2), NULL, 3);
	COPY(cuMemcpy2DUnaligned_v2_ptds(&c2), PT, 3);
	COPY(cuMemcpy2DAsync_v2(&c2, s1), s1, 3);
	COPY(cuMemcpy2DAsync_v2_ptsz(&c2, NULL), PT, 3);
	CHECK(has_edge(n, bA.id, 4, 5, W));
	/* Rows closer than a chunk: one range; the offset (srcY) counts. */
	memset(&c2b, 0, sizeof(c2b));
	c2b.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c2b.srcDevice = B;
	c2b.srcY = 200;
	c2b.srcPitch = 8192;
	c2b.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
	c2b.dstDevice = (CUdeviceptr)host;
	c2b.dstPitch = 4096;
	c2b.WidthInBytes = 4096;
	c2b.Height = 100; /* B + 1.56 MiB .. B + 2.35 MiB */
	COPY(cuMemcpy2D_v2(&c2b), NULL, 1);
	CHECK(has_edge(n, bB.id, 1, 3, R));

	/* ---- 3D: a slice of two close rows per chunk pair; a contiguous source ---- */
	memset(&c3, 0, sizeof(c3));
	c3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c3.srcDevice = B;
	c3.srcPitch = 1024;
	c3.srcHeight = 2;
	c3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c3.dstDevice = A;
	c3.dstXInBytes = 16;
	c3.dstY = 1;
	c3.dstPitch = 256 * 1024;
	c3.dstHeight = 8; /* slices 2 MiB apart */
	c3.WidthInBytes = 1024;
	c3.Height = 2;
	c3.Depth = 3;
	COPY(cuMemcpy3D_v2(&c3), NULL, 4);
	CHECK(has_edge(n, bB.id, 0, 1, R));
	CHECK(has_edge(n, bA.id, 0, 1, W));
	CHECK(has_edge(n, bA.id, 2, 3, W));
	CHECK(has_edge(n, bA.id, 4, 5, W));
	COPY(cuMemcpy3D_v2_ptds(&c3), PT, 4);
	COPY(cuMemcpy3DAsync_v2(&c3, s1), s1, 4);
	COPY(cuMemcpy3DAsync_v2_ptsz(&c3, NULL), PT, 4);
	CHECK(has_edge(n, bA.id, 2, 3, W));
	memset(&p3, 0, sizeof(p3));
	p3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	p3.srcDevice = B + 3 * MIB;
	p3.srcContext = ctx;
	p3.srcPitch = 1024;
	p3.srcHeight = 2;
	p3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	p3.dstDevice = A;
	p3.dstContext = ctx;
	p3.dstPitch = 1024;
	p3.dstHeight = 2048; /* slices 2 MiB apart */
	p3.WidthInBytes = 512;
	p3.Height = 2;
	p3.Depth = 2;
	COPY(cuMemcpy3DPeer(&p3), NULL, 3);
	CHECK(has_edge(n, bB.id, 3, 4, R));
	CHECK(has_edge(n, bA.id, 0, 1, W));
	CHECK(has_edge(n, bA.id, 2, 3, W));
	COPY(cuMemcpy3DPeer_ptds(&p3), PT, 3);
	COPY(cuMemcpy3DPeerAsync(&p3, s1), s1, 3);
	COPY(cuMemcpy3DPeerAsync_ptsz(&p3, s1), s1, 3);

	/* ---- memsets ---- */
	SET(cuMemsetD8_v2(A + MIB, 1, 10), NULL, 1);
	CHECK(has_edge(n, bA.id, 1, 2, W));
	SET(cuMemsetD8_v2_ptds(A + MIB, 1, 10), PT, 1);
	SET(cuMemsetD16_v2(A + MIB - 2, 1, 2), NULL, 1);
	CHECK(has_edge(n, bA.id, 0, 2, W));
	SET(cuMemsetD16_v2_ptds(A, 1, 2), PT, 1);
	SET(cuMemsetD32_v2(B, 0, MIB / 4 + 1), NULL, 1);
	CHECK(has_edge(n, bB.id, 0, 2, W));
	SET(cuMemsetD32_v2_ptds(B + 3 * MIB, 0, 1), PT, 1);
	CHECK(has_edge(n, bB.id, 3, 4, W));
	SET(cuMemsetD8Async(C, 1, 10, s1), s1, 1);
	CHECK(has_edge(n, bC.id, 0, 1, W));
	SET(cuMemsetD8Async_ptsz(C, 1, 10, NULL), PT, 1);
	SET(cuMemsetD16Async(A + 2 * MIB, 1, 10, s1), s1, 1);
	CHECK(has_edge(n, bA.id, 2, 3, W));
	SET(cuMemsetD16Async_ptsz(A, 1, 10, NULL), PT, 1);
	SET(cuMemsetD32Async(B + MIB, 1, MIB / 4, s1), s1, 1);
	CHECK(has_edge(n, bB.id, 1, 2, W));
	SET(cuMemsetD32Async_ptsz(B, 1, 10, NULL), PT, 1);
	SET(cuMemsetD2D8_v2(A, 2 * MIB, 7, 100, 3), NULL, 3);
	CHECK(has_edge(n, bA.id, 0, 1, W));
	CHECK(has_edge(n, bA.id, 2, 3, W));
	CHECK(has_edge(n, bA.id, 4, 5, W));
	SET(cuMemsetD2D8_v2_ptds(A, 2 * MIB, 7, 100, 3), PT, 3);
	SET(cuMemsetD2D16_v2(A + MIB, 2 * MIB, 7, 50, 3), NULL, 3);
	CHECK(has_edge(n, bA.id, 1, 2, W));
	CHECK(has_edge(n, bA.id, 3, 4, W));
	CHECK(has_edge(n, bA.id, 5, 6, W));
	SET(cuMemsetD2D16_v2_ptds(A + MIB, 2 * MIB, 7, 50, 3), PT, 3);
	SET(cuMemsetD2D32_v2(B, 4096, 7, 25, 3), NULL, 1);
	CHECK(has_edge(n, bB.id, 0, 1, W));
	SET(cuMemsetD2D32_v2_ptds(B, 4096, 7, 25, 3), PT, 1);
	SET(cuMemsetD2D8Async(A, 2 * MIB, 7, 100, 2, s1), s1, 2);
	SET(cuMemsetD2D8Async_ptsz(A, 2 * MIB, 7, 100, 2, NULL), PT, 2);
	SET(cuMemsetD2D16Async(A, 2 * MIB, 7, 100, 2, s1), s1, 2);
	SET(cuMemsetD2D16Async_ptsz(A, 2 * MIB, 7, 100, 2, NULL), PT, 2);
	SET(cuMemsetD2D32Async(A, 2 * MIB, 7, 100, 2, s1), s1, 2);
	SET(cuMemsetD2D32Async_ptsz(A, 2 * MIB, 7, 100, 2, NULL), PT, 2);
	CHECK(has_edge(n, bA.id, 2, 3, W));

	/* Failed calls are no nodes: a bad address, arrays the fake lacks. */
	CHECK(cuMemcpyDtoD_v2(A, 4096, 10) != CUDA_SUCCESS);
	CHECK(cuMemsetD8Async(A + 6 * MIB + 4096, 0, 10, s1) != CUDA_SUCCESS);
	CHECK(cuMemcpyDtoA_v2(NULL, 0, A, 10) != CUDA_SUCCESS);
	CHECK(cuMemcpyAtoD_v2(A, NULL, 0, 10) != CUDA_SUCCESS);
	dag_get_stats(&st);
	CHECK_EQ_INT(st.nodes, expect_nodes);
	CHECK(!st.overflowed && !st.unbounded);

	/* Written chunks: only write edges count (C was written, A all over). */
	{
		uint64_t bits[1];

		CHECK_EQ_INT(dag_written(bC.id, bC.size, bits, 1), 1);
		CHECK_EQ_INT(dag_written(bA.id, bA.size, bits, 1), 6);
	}
	CHECK_EQ_INT(dag_epoch_end(), 0);

	/* Rows a chunk or more apart: exact up to ACCESS_SIDE_MAX rows, then
	 * one bounding range. */
	cfg.chunk_size = 4096;
	REQUIRE(dag_configure(&cfg) == 0);
	REQUIRE(dag_epoch_begin() == 0);
	expect_nodes = 0;
	SET(cuMemsetD2D8_v2(A, 8192, 1, 16, 200), NULL, 200 > SEEN_MAX_EDGES ? SEEN_MAX_EDGES : 200);
	dag_get_stats(&st);
	CHECK_EQ_INT(st.edges, 200);
	CHECK(has_edge(n, bA.id, 0, 1, W));
	CHECK(has_edge(n, bA.id, 2, 3, W));
	SET(cuMemsetD2D8_v2(A, 8192, 1, 16, 300), NULL, 1);
	CHECK(has_edge(n, bA.id, 0, 599, W));
	CHECK_EQ_INT(dag_epoch_end(), 0);

	CHECK_EQ_INT(cuMemFree_v2(A), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(B), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(C), CUDA_SUCCESS);
	free(host);
	return t_done();
}
