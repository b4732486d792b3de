/* The per-chunk gate (chunkgate.h), on the fake driver: in a save epoch a
 * launch that can write an unsaved chunk waits until it is marked saved and
 * then runs; one that touches only saved chunks does not wait; reads do not
 * wait, writes do (a copy whose destination spans two chunks waits for
 * both); in a load epoch reads wait too; an undecodable launch and an
 * unbounded graph wait for the whole epoch; several threads waiting on
 * different chunks are each released exactly when theirs are done; the
 * request queue (and its eventfd) says which chunks were asked for; a
 * graph launch waits for its memset's chunks; finish releases everyone;
 * buffers allocated after begin never wait; outside an epoch nothing is
 * decoded.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * GPUCR_DAEMON=0 keeps the control thread out of it. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buftab.h"
#include "chunkgate.h"
#include "dag.h"
#include "fakecuda.h"
#include "launch.h"
#include "t.h"
#include "shimtest.h"
#include "dagtest.h"
#include "gatetest.h"

#define MIB (1UL << 20)

typedef int (*reg_fn)(const char *, fakecuda_kernel_fn, int, const size_t *);

static CUcontext ctx;
static CUfunction k1, k2;
static CUdeviceptr A, B, C, D; /* 4, 2, 1 (a sub-allocation) and 4 chunks of 1 MiB */
static struct buf bA, bB, bC, bD;
static unsigned char host[8192];

static void noop(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
}

/* ---- calls made on a thread of their own ------------------------------------ */

enum op { OP_LAUNCH1, OP_LAUNCH2, OP_UNKNOWN, OP_HTOD, OP_DTOH, OP_DTOD, OP_MEMSET, OP_GRAPH };

struct job {
	struct shim_job base;
	enum op op;
	CUdeviceptr a, b;
	size_t n;
	CUgraphExec exec;
};

static CUresult run_op(struct job *j)
{
	void *p1[] = { &j->a };
	void *p2[] = { &j->a, &j->b };
	void *bad_extra[] = { (void *)(uintptr_t)0x77, NULL, CU_LAUNCH_PARAM_END };

	switch (j->op) {
	case OP_LAUNCH1:
		return cuLaunchKernel(k1, 1, 1, 1, 1, 1, 1, 0, NULL, p1, NULL);
	case OP_LAUNCH2:
		return cuLaunchKernel(k2, 1, 1, 1, 1, 1, 1, 0, NULL, p2, NULL);
	case OP_UNKNOWN:
		/* An `extra` option the decoder does not know: undecodable (the
		 * fake refuses the launch after the gate let it through). */
		cuLaunchKernel(k1, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, bad_extra);
		return CUDA_SUCCESS;
	case OP_HTOD:
		return cuMemcpyHtoD_v2(j->a, host, j->n);
	case OP_DTOH:
		return cuMemcpyDtoH_v2(host, j->a, j->n);
	case OP_DTOD:
		return cuMemcpyDtoDAsync_v2(j->a, j->b, j->n, NULL);
	case OP_MEMSET:
		return cuMemsetD8_v2(j->a, 7, j->n);
	case OP_GRAPH:
		return cuGraphLaunch(j->exec, NULL);
	}
	return CUDA_ERROR_UNKNOWN;
}

static CUresult run_job(struct shim_job *b)
{
	return run_op((struct job *)b);
}

static void start(struct job *j)
{
	shim_job_start(&j->base, run_job, ctx);
}

static int done(const struct job *j)
{
	return shim_job_done(&j->base);
}

static void finish_job(struct job *j)
{
	pthread_join(j->base.t, NULL);
	CHECK_EQ_INT(j->base.r, CUDA_SUCCESS);
}

static void until_done(struct job *j)
{
	until_job_done(&j->base);
}

/* The call runs on the main thread: it must not wait. */
static void no_wait(enum op op, CUdeviceptr a, CUdeviceptr b, size_t n)
{
	struct job j = { .op = op, .a = a, .b = b, .n = n };
	struct chunk_gate_stats before, after;

	chunk_gate_get_stats(&before);
	CHECK_EQ_INT(run_op(&j), CUDA_SUCCESS);
	chunk_gate_get_stats(&after);
	CHECK_EQ_INT(after.calls_delayed, before.calls_delayed);
	CHECK_EQ_INT(after.calls_checked, before.calls_checked + 1);
}

/* The queue holds exactly the requests given, in order. */
static void expect_requests(const struct chunk_gate_req *want, size_t n)
{
	struct chunk_gate_req got[16];
	size_t k = chunk_gate_requests(got, 16);

	CHECK_EQ_INT(k, n);
	for (size_t i = 0; i < k && i < n; i++) {
		CHECK_EQ_INT(got[i].buf_id, want[i].buf_id);
		CHECK_EQ_INT(got[i].first, want[i].first);
		CHECK_EQ_INT(got[i].n, want[i].n);
		if (want[i].buf_id)
			CHECK(got[i].base == buf_of(got[i].base).base);
	}
}

static int fd_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* ---- the cases ---------------------------------------------------------------- */

static void save_epoch(void)
{
	struct job j = { .op = OP_LAUNCH2, .a = A + 3 * MIB + 5, .b = 42 };
	struct chunk_gate_stats st;
	CUdeviceptr late;
	int fd;

	REQUIRE(chunk_gate_begin(CHUNK_GATE_SAVE) == 0);
	CHECK_EQ_INT(chunk_gate_begin(CHUNK_GATE_SAVE), -EBUSY);
	CHECK(launch_decoding != 0);
	chunk_gate_get_stats(&st);
	CHECK(st.open);
	CHECK_EQ_INT(st.kind, CHUNK_GATE_SAVE);
	CHECK_EQ_INT(st.chunk_size, MIB);
	CHECK_EQ_INT(st.bufs, 4);
	CHECK_EQ_INT(st.chunks, 4 + 2 + 1 + 4);
	CHECK_EQ_INT(st.chunks_done, 0);
	fd = chunk_gate_request_fd();
	CHECK(fd >= 0);
	CHECK(!fd_readable(fd));

	/* A launch that can write A (every chunk of it) waits for all four. */
	start(&j);
	until_waiting(1);
	CHECK(!done(&j));
	CHECK(fd_readable(fd));
	expect_requests((struct chunk_gate_req[]){ { bA.id, 0, 0, 4 } }, 1);
	CHECK(!fd_readable(fd));
	CHECK_EQ_INT(chunk_gate_mark_done(bA.id, 0, 2), 2);
	CHECK_EQ_INT(chunk_gate_mark_done(bA.id, 0, 2), 0); /* already */
	usleep(20 * 1000);
	CHECK(!done(&j));
	CHECK_EQ_INT(chunk_gate_chunk_done(bA.id, 1), 1);
	CHECK_EQ_INT(chunk_gate_chunk_done(bA.id, 2), 0);
	CHECK_EQ_INT(chunk_gate_mark_done(bA.id, 2, 2), 2);
	until_done(&j);
	finish_job(&j);
	chunk_gate_get_stats(&st);
	CHECK_EQ_INT(st.calls_delayed, 1);
	CHECK(st.wait_ns >= 20 * 1000 * 1000);
	CHECK_EQ_INT(st.waiting, 0);
	CHECK_EQ_INT(st.chunks_done, 4);

	/* Only saved chunks: no wait. Reads do not wait in a save epoch. */
	no_wait(OP_LAUNCH1, A, 0, 0);
	no_wait(OP_DTOH, D + MIB, 0, 4096);
	no_wait(OP_DTOD, A, D, 3 * MIB); /* reads D, writes saved A */
	/* A buffer allocated after begin holds nothing of the cut. */
	REQUIRE(cuMemAlloc_v2(&late, 3 * MIB) == CUDA_SUCCESS);
	no_wait(OP_LAUNCH2, late, A, 0);
	no_wait(OP_MEMSET, late, 0, 3 * MIB);
	CHECK_EQ_INT(chunk_gate_mark_done(buf_of(late).id, 0, 1), -ENOENT);
	CHECK_EQ_INT(cuMemFree_v2(late), CUDA_SUCCESS);
	expect_requests(NULL, 0);

	/* A copy into D across the boundary of chunks 0 and 1 waits for both. */
	j = (struct job){ .op = OP_HTOD, .a = D + MIB - 2048, .n = 4096 };
	start(&j);
	until_waiting(1);
	CHECK(!done(&j));
	expect_requests((struct chunk_gate_req[]){ { bD.id, 0, 0, 2 } }, 1);
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 1, 1), 1);
	usleep(20 * 1000);
	CHECK(!done(&j));
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 0, 1), 1);
	until_done(&j);
	finish_job(&j);

	/* Errors. */
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 3, 2), -ERANGE);
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 5, 0), -ERANGE);
	CHECK_EQ_INT(chunk_gate_mark_done(12345, 0, 1), -ENOENT);
	CHECK_EQ_INT(chunk_gate_chunk_done(bD.id, 4), -ERANGE);

	/* An undecodable launch waits for the whole epoch, and finish
	 * releases it together with a copy waiting for its chunk. */
	j = (struct job){ .op = OP_UNKNOWN };
	start(&j);
	until_waiting(1);
	{
		struct job j2 = { .op = OP_MEMSET, .a = C, .n = 100 };

		start(&j2);
		until_waiting(2);
		expect_requests((struct chunk_gate_req[]){ { 0, 0, 0, 0 }, { bC.id, 0, 0, 1 } }, 2);
		/* Every chunk but one of B done: the undecodable launch still waits. */
		CHECK_EQ_INT(chunk_gate_mark_done(bB.id, 0, 2), 2);
		CHECK_EQ_INT(chunk_gate_mark_range_done(D, 4 * MIB), 2); /* chunks 2, 3 */
		usleep(20 * 1000);
		CHECK(!done(&j));
		CHECK(!done(&j2));
		CHECK_EQ_INT(gate_waiting(), 2);
		CHECK_EQ_INT(chunk_gate_finish(), 0);
		until_done(&j);
		until_done(&j2);
		finish_job(&j);
		finish_job(&j2);
	}
	chunk_gate_get_stats(&st);
	CHECK(!st.open);
	CHECK_EQ_INT(st.chunks_done, st.chunks);
	CHECK_EQ_INT(st.calls_delayed, 4);
	CHECK_EQ_INT(st.calls_unbounded, 1);
	CHECK_EQ_INT(st.waiting, 0);
	CHECK_EQ_INT(chunk_gate_finish(), -EINVAL);
	CHECK_EQ_INT(chunk_gate_mark_done(bA.id, 0, 1), -EINVAL);
	CHECK_EQ_INT(chunk_gate_chunk_done(bC.id, 0), 1);
	expect_requests(NULL, 0);
}

/* Threads waiting on different chunks go exactly when theirs are done. */
static void many_waiters(void)
{
	struct job j[4] = {
		{ .op = OP_MEMSET, .a = D, .n = 100 },                 /* D chunk 0 */
		{ .op = OP_MEMSET, .a = D + 2 * MIB + 10, .n = 100 },  /* D chunk 2 */
		{ .op = OP_LAUNCH1, .a = B + 100 },                    /* B chunks 0, 1 */
		{ .op = OP_HTOD, .a = D + 3 * MIB - 100, .n = 200 },   /* D chunks 2, 3 */
	};

	REQUIRE(chunk_gate_begin(CHUNK_GATE_SAVE) == 0);
	for (int i = 0; i < 4; i++) {
		start(&j[i]);
		until_waiting((unsigned int)i + 1);
	}
	expect_requests((struct chunk_gate_req[]){ { bD.id, 0, 0, 1 },
						   { bD.id, 0, 2, 1 },
						   { bB.id, 0, 0, 2 },
						   { bD.id, 0, 2, 2 } },
			4);
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 2, 1), 1);
	until_done(&j[1]);
	until_waiting(3);
	CHECK(!done(&j[0]) && !done(&j[2]) && !done(&j[3]));
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 3, 1), 1);
	until_done(&j[3]);
	until_waiting(2);
	CHECK(!done(&j[0]) && !done(&j[2]));
	CHECK_EQ_INT(chunk_gate_mark_done(bB.id, 0, 1), 1);
	usleep(20 * 1000);
	CHECK(!done(&j[2]));
	CHECK_EQ_INT(chunk_gate_mark_done(bB.id, 1, 1), 1);
	until_done(&j[2]);
	until_waiting(1);
	CHECK(!done(&j[0]));
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 0, 1), 1);
	until_done(&j[0]);
	for (int i = 0; i < 4; i++)
		finish_job(&j[i]);
	CHECK_EQ_INT(gate_waiting(), 0);
	CHECK_EQ_INT(chunk_gate_finish(), 0);
}

/* In a load epoch reads wait too; marking every chunk done releases even
 * a call that waits for the whole epoch. */
static void load_epoch(void)
{
	struct job r = { .op = OP_DTOH, .a = A + MIB, .n = 4096 };
	struct job c = { .op = OP_DTOD, .a = B, .b = C, .n = 64 };
	struct job u = { .op = OP_UNKNOWN };
	struct chunk_gate_stats st;

	REQUIRE(chunk_gate_begin(CHUNK_GATE_LOAD) == 0);
	start(&r);
	until_waiting(1);
	CHECK(!done(&r));
	/* Source loaded, destination not: still waits. */
	CHECK_EQ_INT(chunk_gate_mark_done(bC.id, 0, 1), 1);
	start(&c);
	until_waiting(2);
	CHECK(!done(&c));
	expect_requests((struct chunk_gate_req[]){ { bA.id, 0, 1, 1 }, { bB.id, 0, 0, 1 } }, 2);
	CHECK_EQ_INT(chunk_gate_mark_range_done(A + MIB + 1, MIB), 0); /* no whole chunk */
	usleep(20 * 1000);
	CHECK(!done(&r));
	CHECK_EQ_INT(chunk_gate_mark_range_done(A + MIB, MIB), 1);
	until_done(&r);
	finish_job(&r);
	CHECK_EQ_INT(chunk_gate_mark_done(bB.id, 0, 1), 1);
	until_done(&c);
	finish_job(&c);

	start(&u);
	until_waiting(1);
	/* Everything, by address: the last short chunk of C too. */
	CHECK_EQ_INT(chunk_gate_mark_range_done(0x1000, ~(size_t)0 - 0x2000), 11 - 3);
	until_done(&u);
	finish_job(&u);
	chunk_gate_get_stats(&st);
	CHECK(st.open);
	CHECK_EQ_INT(st.kind, CHUNK_GATE_LOAD);
	CHECK_EQ_INT(st.chunks_done, st.chunks);
	CHECK_EQ_INT(st.calls_delayed, 3);
	CHECK_EQ_INT(chunk_gate_finish(), 0);
}

/* A graph launch waits for the chunks of its nodes' ranges. */
static void graph_launch(void)
{
	struct job g = { .op = OP_GRAPH };
	CUDA_MEMSET_NODE_PARAMS m;
	CUgraphNode n;
	CUgraph graph;

	memset(&m, 0, sizeof(m));
	m.dst = D + 3 * MIB;
	m.value = 1;
	m.elementSize = 1;
	m.width = 4096;
	m.height = 1;
	REQUIRE(cuGraphCreate(&graph, 0) == CUDA_SUCCESS);
	REQUIRE(cuGraphAddMemsetNode(&n, graph, NULL, 0, &m, ctx) == CUDA_SUCCESS);
	REQUIRE(cuGraphInstantiateWithFlags(&g.exec, graph, 0) == CUDA_SUCCESS);

	REQUIRE(chunk_gate_begin(CHUNK_GATE_SAVE) == 0);
	start(&g);
	until_waiting(1);
	CHECK(!done(&g));
	expect_requests((struct chunk_gate_req[]){ { bD.id, 0, 3, 1 } }, 1);
	CHECK_EQ_INT(chunk_gate_mark_done(bD.id, 3, 1), 1);
	until_done(&g);
	finish_job(&g);
	CHECK_EQ_INT(chunk_gate_finish(), 0);
	CHECK_EQ_INT(cuGraphExecDestroy(g.exec), CUDA_SUCCESS);
	CHECK_EQ_INT(cuGraphDestroy(graph), CUDA_SUCCESS);
}

int main(void)
{
	static const size_t sizes1[] = { 8 }, sizes2[] = { 8, 8 };
	struct dag_config cfg;
	struct chunk_gate_stats st;
	CUmodule mod;
	reg_fn reg;

	ctx = shim_test_start(60);
	reg = (reg_fn)fakecuda_sym("fakecuda_register_kernel");
	REQUIRE(reg);
	REQUIRE(reg("k1", noop, 1, sizes1) == 0);
	REQUIRE(reg("k2", noop, 2, sizes2) == 0);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&k1, mod, "k1") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&k2, mod, "k2") == CUDA_SUCCESS);
	memset(&cfg, 0, sizeof(cfg));
	cfg.chunk_size = MIB;
	REQUIRE(dag_configure(&cfg) == 0);
	REQUIRE(cuMemAlloc_v2(&A, 4 * MIB) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&B, 2 * MIB) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&C, 64 * 1024) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&D, 4 * MIB) == CUDA_SUCCESS);
	bA = buf_of(A);
	bB = buf_of(B);
	bC = buf_of(C);
	bD = buf_of(D);

	/* No epoch: nothing decoded, nothing waits. */
	CHECK_EQ_INT(chunk_gate_begin((enum chunk_gate_kind)0), -EINVAL);
	CHECK_EQ_INT(chunk_gate_finish(), -EINVAL);
	CHECK_EQ_INT(chunk_gate_mark_done(bA.id, 0, 1), -EINVAL);
	CHECK_EQ_INT(launch_decoding, 0);
	{
		struct job j = { .op = OP_LAUNCH2, .a = A, .b = D };

		CHECK_EQ_INT(run_op(&j), CUDA_SUCCESS);
	}
	chunk_gate_get_stats(&st);
	CHECK(!st.open);
	CHECK_EQ_INT(st.calls_checked, 0);
	CHECK_EQ_INT(launch_paraminfo_calls(), 0);

	save_epoch();
	CHECK_EQ_INT(launch_decoding, 0);
	many_waiters();
	load_epoch();
	graph_launch();
	CHECK_EQ_INT(launch_decoding, 0);

	/* After the epochs: calls on chunks never marked pass. */
	{
		struct job j = { .op = OP_HTOD, .a = A, .n = 4096 };

		CHECK_EQ_INT(run_op(&j), CUDA_SUCCESS);
	}
	return t_done();
}
