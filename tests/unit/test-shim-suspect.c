/* Suspects (suspect.h) with the control thread's side of a save epoch
 * (epoch.h) and the per-chunk gate, on the fake driver:
 *  - the launches an epoch lets go while chunks are pending are its
 *    suspects, named by the driver, in the order first let go, each once;
 *    a launch that waited for the whole epoch, or went once everything was
 *    saved, is none; a graph is named by its handle, a function the driver
 *    has no name for too;
 *  - after the escape, in the next epoch a suspect's launch waits for the
 *    whole epoch even when it touches nothing, and is queued once for the
 *    held notice (ChunksWanted.held); other launches go as before; once
 *    everything is saved a suspect goes without a notice;
 *  - a report holds SUSPECT_REPORT_MAX names and counts the rest; an escape
 *    with nothing let go marks the process lost for per-function gating.
 *
 * Linked with the shim's objects (libintercept.a); GPUCR_DAEMON=0 keeps the
 * control thread out of it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buftab.h"
#include "chunkgate.h"
#include "dag.h"
#include "epoch.h"
#include "fakecuda.h"
#include "launch.h"
#include "suspect.h"
#include "t.h"
#include "shimtest.h"
#include "dagtest.h"
#include "gatetest.h"

#define MIB (1UL << 20)
#define NEXTRA 20

typedef int (*reg_fn)(const char *, fakecuda_kernel_fn, int, const size_t *);

static CUcontext ctx;
static CUfunction alpha, beta, gamma_, extra[NEXTRA];
static CUdeviceptr A, B;

static void noop(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
}

/* ---- launches -------------------------------------------------------------------- */

struct job {
	struct shim_job base;
	CUfunction f;
	uint64_t arg;      /* a buffer's address, or a plain number */
	bool undecodable;
};

static CUresult launch(struct job *j)
{
	void *params[] = { &j->arg };
	void *bad_extra[] = { (void *)(uintptr_t)0x77, NULL, CU_LAUNCH_PARAM_END };

	if (j->undecodable) { /* the fake refuses it after the gate let it through */
		cuLaunchKernel(j->f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, bad_extra);
		return CUDA_SUCCESS;
	}
	return cuLaunchKernel(j->f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
}

static CUresult run_job(struct shim_job *b)
{
	return launch((struct job *)b);
}

static void start(struct job *j)
{
	shim_job_start(&j->base, run_job, ctx);
}

static int done(const struct job *j)
{
	return shim_job_done(&j->base);
}

static void until_done(struct job *j)
{
	until_job_done(&j->base);
	pthread_join(j->base.t, NULL);
	CHECK_EQ_INT(j->base.r, CUDA_SUCCESS);
}

/* On this thread: the launch must not wait. */
static void no_wait(CUfunction f, uint64_t arg)
{
	struct job j = { .f = f, .arg = arg };
	struct chunk_gate_stats before, after;

	chunk_gate_get_stats(&before);
	CHECK_EQ_INT(launch(&j), CUDA_SUCCESS);
	chunk_gate_get_stats(&after);
	CHECK_EQ_INT(after.calls_delayed, before.calls_delayed);
}

static void begin(void)
{
	char what[256];

	epoch_cut();
	REQUIRE(epoch_begin(what, sizeof(what)) == 0);
}

static size_t take_held(char (*names)[SUSPECT_NAME_MAX])
{
	return suspect_take_held(names, SUSPECT_HELD_MAX);
}

/* ---- the cases ---------------------------------------------------------------------- */

static struct suspect_report rep;

static void escape_names_the_early_ones(void)
{
	struct job ju = { .f = gamma_, .undecodable = true }, ja = { .f = alpha, .arg = 0 };
	struct suspect_stats st;

	begin();
	start(&ju); /* waits for the whole epoch: no suspect */
	until_waiting(1);
	no_wait(beta, 42); /* touches nothing: goes at once, while A and B are pending */
	ja.arg = A;
	start(&ja); /* waits for A, then goes while B is pending */
	until_waiting(2);
	CHECK(chunk_gate_mark_range_done(A, 2 * MIB) > 0);
	until_done(&ja);
	no_wait(beta, 43); /* once only */
	suspect_note(SUSPECT_GRAPH, (const void *)(uintptr_t)0x1234);
	CHECK(chunk_gate_mark_range_done(B, MIB) > 0); /* everything saved */
	until_done(&ju);
	no_wait(gamma_, 42); /* nothing pending any more: no suspect */

	CHECK_EQ_INT(epoch_escaped(&rep), 3);
	CHECK(!epoch_is_open());
	CHECK_EQ_INT(rep.n, 3);
	CHECK(!strcmp(rep.name[0], "beta"));
	CHECK(!strcmp(rep.name[1], "alpha"));
	CHECK(!strcmp(rep.name[2], "graph 0x1234"));
	CHECK_EQ_INT(rep.more, 0);
	CHECK(!rep.incomplete);
	suspect_get_stats(&st);
	CHECK_EQ_INT(st.unpredictable, 3);
	CHECK(!st.lost);
	/* Outside an epoch nothing is held. */
	no_wait(beta, 44);
}

static void suspects_held_later(void)
{
	char names[SUSPECT_HELD_MAX][SUSPECT_NAME_MAX];
	struct job jb = { .f = beta, .arg = 42 }, jb2 = { .f = beta, .arg = 43 };
	struct chunk_gate_req req[8];
	struct suspect_stats st;
	size_t n;

	begin();
	CHECK_EQ_INT(take_held(names), 0);
	no_wait(gamma_, 42); /* not a suspect: goes */
	start(&jb); /* a suspect: waits for everything although it touches nothing */
	until_waiting(1);
	n = chunk_gate_requests(req, 8);
	CHECK_EQ_INT(n, 1);
	CHECK_EQ_INT(req[0].buf_id, 0); /* all */
	CHECK_EQ_INT(take_held(names), 1);
	CHECK(!strcmp(names[0], "beta"));
	start(&jb2);
	until_waiting(2);
	CHECK_EQ_INT(take_held(names), 0); /* named once per epoch */
	CHECK(chunk_gate_mark_range_done(A, 2 * MIB) > 0);
	usleep(50 * 1000);
	CHECK(!done(&jb) && !done(&jb2));
	CHECK(chunk_gate_mark_range_done(B, MIB) > 0);
	until_done(&jb);
	until_done(&jb2);
	no_wait(alpha, A); /* everything saved: goes, no notice */
	CHECK_EQ_INT(take_held(names), 0);
	suspect_get_stats(&st);
	CHECK_EQ_INT(st.noted, 1); /* gamma */
	epoch_end("test");
	chunk_gate_requests(req, 8);
}

static void report_bounded_and_lost(void)
{
	struct suspect_stats st;
	unsigned char *unknown = calloc(1, 256); /* no function of the driver's */

	REQUIRE(unknown);
	begin();
	suspect_note(SUSPECT_FUNC, unknown);
	for (int i = 0; i < NEXTRA; i++)
		no_wait(extra[i], 42);
	CHECK_EQ_INT(epoch_escaped(&rep), NEXTRA + 1);
	CHECK_EQ_INT(rep.n, SUSPECT_REPORT_MAX);
	CHECK_EQ_INT(rep.more, NEXTRA + 1 - SUSPECT_REPORT_MAX);
	CHECK(!strncmp(rep.name[0], "function 0x", 11));
	CHECK(!strcmp(rep.name[1], "x00"));
	CHECK(!strcmp(rep.name[SUSPECT_REPORT_MAX - 1], "x14"));
	suspect_get_stats(&st);
	CHECK_EQ_INT(st.unpredictable, 3 + NEXTRA + 1);
	CHECK(!st.lost);

	/* An escape in an epoch that let nothing go: holding launches cannot
	 * help. */
	begin();
	CHECK_EQ_INT(epoch_escaped(&rep), 0);
	CHECK_EQ_INT(rep.n, 0);
	suspect_get_stats(&st);
	CHECK(st.lost);
	free(unknown);
}

int main(void)
{
	static const size_t sizes1[] = { 8 };
	struct dag_config cfg;
	CUmodule mod;
	reg_fn reg;

	ctx = shim_test_start(60);
	reg = (reg_fn)fakecuda_sym("fakecuda_register_kernel");
	REQUIRE(reg);
	REQUIRE(reg("alpha", noop, 1, sizes1) == 0);
	REQUIRE(reg("beta", noop, 1, sizes1) == 0);
	REQUIRE(reg("gamma", noop, 1, sizes1) == 0);
	for (int i = 0; i < NEXTRA; i++) {
		char name[8];

		snprintf(name, sizeof(name), "x%02d", i);
		REQUIRE(reg(name, noop, 1, sizes1) == 0);
	}
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&alpha, mod, "alpha") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&beta, mod, "beta") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&gamma_, mod, "gamma") == CUDA_SUCCESS);
	for (int i = 0; i < NEXTRA; i++) {
		char name[8];

		snprintf(name, sizeof(name), "x%02d", i);
		REQUIRE(cuModuleGetFunction(&extra[i], mod, name) == CUDA_SUCCESS);
	}
	memset(&cfg, 0, sizeof(cfg));
	cfg.chunk_size = MIB;
	REQUIRE(dag_configure(&cfg) == 0);
	REQUIRE(cuMemAlloc_v2(&A, 2 * MIB) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&B, MIB) == CUDA_SUCCESS);

	escape_names_the_early_ones();
	suspects_held_later();
	report_bounded_and_lost();
	suspect_reset();
	return t_done();
}
