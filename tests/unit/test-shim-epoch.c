/* The control thread in a save epoch (a concurrent checkpoint), against a
 * fake gpucrd (fakegpucrd.h):
 *  - quiesce, release, reconnect, remap, then Resume{save_epoch}: a range
 *    gpucrd said was saved before the resume counts (a launch on it does
 *    not wait);
 *  - a launch writing a buffer not yet saved waits; the fake receives a
 *    ChunksWanted naming that buffer's chunks, up to the buffer's end (a
 *    sub-allocation's short chunk does not reach into its neighbours); ChunksSaved for it in two
 *    halves, each covering only part of a gate chunk: the launch goes only
 *    after the second (coverage is cumulative), and its write lands;
 *  - a launch that cannot be decoded asks for all; ChunksSaved{all} ends
 *    the epoch and releases every waiter;
 *  - the connection dropping during an epoch releases its waiters and ends
 *    the epoch; so does a new quiesce;
 *  - when the epoch cannot begin (another per-chunk epoch is open), the
 *    resume is answered with the error and the gate stays closed until a
 *    plain resume; Resume{save_epoch} of a running process is refused;
 *  - ChunksSaved{all, escaped} ends the epoch and is answered with the
 *    Suspects, which name the function launched in it; the next quiesce's
 *    ShimStats counts it as unpredictable, and in the next epoch its
 *    launch waits for the whole epoch, named once in ChunksWanted.held.
 *
 * Linked with the shim's objects (libintercept.a) to see the gate's state
 * and to make chunk_gate_begin fail; the control thread runs (GPUCR_DAEMON
 * is not 0). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chunkgate.h"
#include "dag.h"
#include "fakecuda.h"
#include "fakegpucrd.h"
#include "gate.h"
#include "t.h"
#include "shimtest.h"
#include "gatetest.h"

#define MIB (1UL << 20)

static CUcontext ctx;
static CUfunction fill_fn;
static CUdeviceptr A, B, S; /* 3 MiB + 5 (two gate chunks), 2 MiB, 1000 bytes (in a slab) */
static struct fdd d;

/* The ChunksWanted the fake received. */
#define MAX_WANTED 64
static struct {
	uint64_t va, len;
} wanted[MAX_WANTED];
static size_t nwanted, nwanted_msgs, nwanted_all;
static char held[8][64]; /* ChunksWanted.held */
static size_t nheld;

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* ---- launches on a thread of their own ------------------------------------ */

struct job {
	struct shim_job sj; /* first: shimtest.h's */
	CUdeviceptr p;
	int v;
	bool undecodable;
};

static CUresult job_run(struct shim_job *sj)
{
	struct job *j = (struct job *)sj;
	int n = 1024;
	void *params[] = { &j->p, &j->v, &n };
	void *bad_extra[] = { (void *)(uintptr_t)0x77, NULL, CU_LAUNCH_PARAM_END };

	if (j->undecodable) { /* an `extra` option the decoder does not know (the fake refuses it) */
		cuLaunchKernel(fill_fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, bad_extra);
		return CUDA_ERROR_UNKNOWN;
	}
	return cuLaunchKernel(fill_fn, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
}

static void start(struct job *j, CUdeviceptr p, int v)
{
	j->p = p;
	j->v = v;
	shim_job_start(&j->sj, job_run, ctx);
}

static int done(struct job *j)
{
	return shim_job_done(&j->sj);
}

/* Waits up to ms for j to finish; joins it when it did. */
static int until_done(struct job *j, int ms)
{
	long long end = now_ms() + ms;

	while (!done(j) && now_ms() < end)
		usleep(1000);
	if (!done(j))
		return 0;
	pthread_join(j->sj.t, NULL);
	return 1;
}

/* ---- the fake daemon's side --------------------------------------------------- */

/* Notes a ChunksWanted (and answers it); other messages are left alone.
 * Returns 1 for a ChunksWanted. Also fdd_request's d.other. */
static int note(Gpucr__Msg *m)
{
	Gpucr__Msg r = GPUCR__MSG__INIT;
	const Gpucr__ChunksWanted *cw;

	if (m->body_case != GPUCR__MSG__BODY_CHUNKS_WANTED)
		return 0;
	CHECK(m->has_id && m->id > 0); /* a request */
	cw = m->chunks_wanted;
	nwanted_msgs++;
	if (cw->has_all && cw->all)
		nwanted_all++;
	for (size_t i = 0; i < cw->n_held && nheld < 8; i++)
		snprintf(held[nheld++], sizeof(held[0]), "%s", cw->held[i]);
	for (size_t i = 0; i < cw->n_ranges && nwanted < MAX_WANTED; i++) {
		wanted[nwanted].va = cw->ranges[i]->va;
		wanted[nwanted].len = cw->ranges[i]->len;
		nwanted++;
	}
	r.has_reply_to = true;
	r.reply_to = m->id;
	r.has_err = true;
	r.err = 0;
	CHECK_EQ_INT(msg_send(d.conn, &r, NULL, 0), 0);
	return 1;
}

static void note_other(struct fdd *fd, Gpucr__Msg *m)
{
	(void)fd;
	note(m);
}

static void forget_wanted(void)
{
	nwanted = nwanted_msgs = nwanted_all = nheld = 0;
}

/* Takes messages for up to ms, or until a ChunksWanted came. */
static int wait_wanted(int ms)
{
	long long end = now_ms() + ms;

	while (now_ms() < end) {
		Gpucr__Msg *m = NULL;
		int rc = fdd_pump(&d, 50, &m), got = 0;

		if (rc < 0)
			return 0;
		if (m) {
			got = note(m);
			msg_free(m);
		}
		if (got)
			return 1;
	}
	return 0;
}

/* Whether one range the fake was asked for covers [va, va + len). */
static int wanted_covers(uint64_t va, uint64_t len)
{
	for (size_t i = 0; i < nwanted; i++)
		if (wanted[i].va <= va && wanted[i].va + wanted[i].len >= va + len)
			return 1;
	return 0;
}

static int resume(bool save_epoch, Gpucr__Msg **ret)
{
	return fdd_resume_epoch(&d, save_epoch, ret);
}

/* ChunksSaved{[va, va + len)}, or {all} when len is 0. */
static int saved(uint64_t va, uint64_t len)
{
	Gpucr__ChunkRange r = GPUCR__CHUNK_RANGE__INIT, *pr = &r;
	Gpucr__ChunksSaved cs = GPUCR__CHUNKS_SAVED__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	int err;

	if (len) {
		r.va = va;
		r.len = len;
		cs.n_ranges = 1;
		cs.ranges = &pr;
	} else {
		cs.has_all = cs.all = true;
	}
	m.body_case = GPUCR__MSG__BODY_CHUNKS_SAVED;
	m.chunks_saved = &cs;
	err = fdd_request(&d, &m, NULL, 0, 10000, &rep);
	if (rep)
		CHECK(rep->body_case == GPUCR__MSG__BODY__NOT_SET); /* OK, no body */
	msg_free(rep);
	return err;
}

static int quiesce(void)
{
	return fdd_quiesce(&d, 5000, NULL);
}

static void connect_fake(void)
{
	REQUIRE(fdd_accept(&d, 5000) == 0);
	REQUIRE(fdd_hello(&d, 0, 5000) == 0);
}

static int pump_until_bufs(size_t n, int ms)
{
	long long end = now_ms() + ms;

	while (d.nbufs != n && now_ms() < end)
		if (fdd_pump(&d, 100, NULL) < 0)
			return 0;
	return d.nbufs == n;
}

/* ---- the cases ------------------------------------------------------------------ */

/* The leave-running dump's order: quiesce, release, reconnect, remap,
 * Resume{save_epoch}; then copy-on-write by halves, and all. */
static void cycle_and_halves(void)
{
	struct fdd_buf bufs[FRAME_MAX_FDS];
	int fds[FRAME_MAX_FDS];
	struct fdd_buf *slab, *ab;
	struct job js = { 0 }, ja = { 0 }, jb = { 0 }, ju = { 0 };
	size_t n;

	CHECK_EQ_INT(quiesce(), 0);
	CHECK_EQ_INT(fdd_release(&d), 0);
	CHECK(fdd_pump(&d, 3000, NULL) < 0); /* the shim closed the connection */
	fdd_drop_conn(&d);
	connect_fake(); /* GPUCR_RECONNECT_MS */
	CHECK_EQ_INT(d.restored, 1);
	n = d.nbufs;
	REQUIRE(n <= FRAME_MAX_FDS);
	for (size_t i = 0; i < n; i++) {
		bufs[i] = d.bufs[i];
		fds[i] = d.bufs[i].fd;
	}
	CHECK_EQ_INT(fdd_remap(&d, bufs, n, fds, true), 0);
	CHECK(readable(A));

	/* Saved before the epoch begins: S's whole slab. */
	slab = fdd_holding(&d, S);
	ab = fdd_holding(&d, A);
	REQUIRE(slab && ab && slab != ab);
	CHECK_EQ_INT(saved(slab->va, slab->size), 0);

	forget_wanted();
	CHECK_EQ_INT(resume(true, NULL), 0);
	CHECK(chunk_gate_on());
	CHECK(!gate_is_closed());

	start(&js, S, 3); /* its chunk is saved: goes */
	CHECK(until_done(&js, 5000));
	CHECK_EQ_INT(js.sj.r, CUDA_SUCCESS);
	CHECK_EQ_INT(((int *)(uintptr_t)S)[0], 3);

	start(&ja, A, 9); /* not saved: waits, and the fake is asked for A */
	CHECK(wait_wanted(5000));
	CHECK(!done(&ja));
	CHECK_EQ_INT(nwanted_all, 0);
	CHECK(wanted_covers(A, 3 * MIB + 5));
	CHECK(!wanted_covers(A, 3 * MIB + 6)); /* its short last chunk, no further */
	CHECK(((int *)(uintptr_t)A)[0] != 9);

	/* Two halves, each covering only part of A's first chunk (A .. A+2 MiB). */
	CHECK_EQ_INT(saved(A, MIB), 0);
	usleep(200 * 1000);
	CHECK(!done(&ja));
	CHECK_EQ_INT(saved(A + MIB, ab->va + ab->size - (A + MIB)), 0);
	CHECK(until_done(&ja, 5000));
	CHECK_EQ_INT(ja.sj.r, CUDA_SUCCESS);
	CHECK_EQ_INT(((int *)(uintptr_t)A)[0], 9);
	CHECK_EQ_INT(((int *)(uintptr_t)A)[1023], 9);
	CHECK(chunk_gate_on());

	/* B waits; so does an undecodable launch, which asks for all. */
	forget_wanted();
	start(&jb, B, 5);
	CHECK(wait_wanted(5000));
	CHECK(wanted_covers(B, 2 * MIB));
	ju.undecodable = true;
	start(&ju, A, 0);
	CHECK(wait_wanted(5000));
	CHECK(nwanted_all >= 1);
	until_waiting(2);
	CHECK(!done(&jb) && !done(&ju));

	/* all: the epoch is over. */
	CHECK_EQ_INT(saved(0, 0), 0);
	CHECK(until_done(&jb, 5000));
	CHECK(until_done(&ju, 5000));
	CHECK_EQ_INT(jb.sj.r, CUDA_SUCCESS);
	CHECK_EQ_INT(((int *)(uintptr_t)B)[0], 5);
	CHECK(!chunk_gate_on());
	/* ... and stays over: a late range changes nothing. */
	CHECK_EQ_INT(saved(A, MIB), 0);
	CHECK(!chunk_gate_on());
}

/* The connection drops while a launch waits: it goes, the epoch ends. */
static void drop_releases(void)
{
	struct job j = { 0 };

	CHECK_EQ_INT(quiesce(), 0);
	forget_wanted();
	CHECK_EQ_INT(resume(true, NULL), 0);
	CHECK(chunk_gate_on());
	start(&j, A, 11);
	CHECK(wait_wanted(5000));
	CHECK(!done(&j));
	fdd_drop_conn(&d);
	CHECK(until_done(&j, 5000));
	CHECK_EQ_INT(j.sj.r, CUDA_SUCCESS);
	CHECK(!chunk_gate_on());
	connect_fake();
	CHECK_EQ_INT(d.restored, 0);
}

/* A new quiesce while a launch waits: it goes, the epoch ends. */
static void quiesce_releases(void)
{
	struct job j = { 0 };

	CHECK_EQ_INT(quiesce(), 0);
	forget_wanted();
	CHECK_EQ_INT(resume(true, NULL), 0);
	start(&j, S, 13);
	CHECK(wait_wanted(5000));
	CHECK(wanted_covers(S, 1000));
	CHECK(!wanted_covers(S, 1001)); /* a sub-allocation: not its slab neighbours */
	CHECK(!done(&j));
	CHECK_EQ_INT(quiesce(), 0);
	CHECK(until_done(&j, 5000));
	CHECK_EQ_INT(j.sj.r, CUDA_SUCCESS);
	CHECK(!chunk_gate_on());
	CHECK(gate_is_closed());
	CHECK_EQ_INT(resume(false, NULL), 0);
	CHECK(!chunk_gate_on()); /* a plain resume opens no epoch */
	CHECK(!gate_is_closed());
}

/* chunk_gate_begin fails (another epoch is open): the error comes back and
 * the gate stays closed until a plain resume. */
static void begin_fails(void)
{
	Gpucr__Msg *r = NULL;
	struct job j = { 0 };

	CHECK_EQ_INT(resume(true, &r), -EINVAL); /* running */
	CHECK(r && r->err_msg);
	msg_free(r);
	r = NULL;

	CHECK_EQ_INT(quiesce(), 0);
	REQUIRE(chunk_gate_begin(CHUNK_GATE_LOAD) == 0);
	CHECK_EQ_INT(resume(true, &r), -EBUSY);
	CHECK(r && r->err_msg);
	if (r && r->err_msg)
		CHECK_CONTAINS(r->err_msg, "save epoch");
	msg_free(r);
	CHECK(gate_is_closed());
	start(&j, S, 17);
	usleep(300 * 1000);
	CHECK(!done(&j));
	CHECK_EQ_INT(chunk_gate_finish(), 0); /* the test's load epoch */
	usleep(100 * 1000);
	CHECK(!done(&j));
	CHECK_EQ_INT(resume(false, NULL), 0);
	CHECK(until_done(&j, 5000));
	CHECK_EQ_INT(j.sj.r, CUDA_SUCCESS);
	CHECK_EQ_INT(((int *)(uintptr_t)S)[0], 17);
}

/* A write escaped prediction: the shim names the launch it let go, and
 * holds that function in the next epoch. */
static void escaped_suspects(void)
{
	Gpucr__ChunksSaved cs = GPUCR__CHUNKS_SAVED__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT, *r = NULL;
	struct job j = { 0 }, j2 = { 0 };

	CHECK_EQ_INT(quiesce(), 0);
	forget_wanted();
	CHECK_EQ_INT(resume(true, NULL), 0);
	start(&j, A, 23); /* waits for A, then goes while B is not saved */
	CHECK(wait_wanted(5000));
	CHECK_EQ_INT(nheld, 0);
	CHECK_EQ_INT(saved(A, 3 * MIB + 5), 0);
	CHECK(until_done(&j, 5000));

	cs.has_all = cs.all = true;
	cs.has_escaped = cs.escaped = true;
	m.body_case = GPUCR__MSG__BODY_CHUNKS_SAVED;
	m.chunks_saved = &cs;
	CHECK_EQ_INT(fdd_request(&d, &m, NULL, 0, 10000, &r), 0);
	CHECK(!chunk_gate_on());
	REQUIRE(r);
	CHECK_EQ_INT(r->body_case, GPUCR__MSG__BODY_SUSPECTS);
	if (r->body_case == GPUCR__MSG__BODY_SUSPECTS) {
		CHECK_EQ_INT(r->suspects->n_names, 1);
		if (r->suspects->n_names == 1)
			CHECK(!strcmp(r->suspects->names[0], "fill"));
		CHECK(!(r->suspects->has_more && r->suspects->more));
		CHECK(!(r->suspects->has_incomplete && r->suspects->incomplete));
	}
	msg_free(r);
	r = NULL;

	/* The next cut: fill is held in its epoch. */
	CHECK_EQ_INT(fdd_quiesce(&d, 5000, &r), 0);
	REQUIRE(r);
	CHECK_EQ_INT(r->body_case, GPUCR__MSG__BODY_SHIM_STATS);
	if (r->body_case == GPUCR__MSG__BODY_SHIM_STATS) {
		CHECK(r->shim_stats->has_unpredictable);
		CHECK_EQ_INT(r->shim_stats->unpredictable, 1);
		CHECK(!r->shim_stats->unpredictable_lost);
	}
	msg_free(r);
	forget_wanted();
	CHECK_EQ_INT(resume(true, NULL), 0);
	start(&j, S, 29); /* S alone would not wait for A or B */
	CHECK(wait_wanted(5000));
	CHECK(nwanted_all >= 1);
	CHECK_EQ_INT(nheld, 1);
	CHECK(!strcmp(held[0], "fill"));
	start(&j2, S, 31);
	until_waiting(2);
	usleep(100 * 1000);
	while (wait_wanted(200))
		;
	CHECK_EQ_INT(nheld, 1); /* named once per epoch */
	CHECK_EQ_INT(saved(S, 1000), 0);
	usleep(200 * 1000);
	CHECK(!done(&j) && !done(&j2));
	CHECK_EQ_INT(saved(0, 0), 0);
	CHECK(until_done(&j, 5000));
	CHECK(until_done(&j2, 5000));
	CHECK_EQ_INT(j.sj.r, CUDA_SUCCESS);
	CHECK_EQ_INT(j2.sj.r, CUDA_SUCCESS);
}

int main(void)
{
	const size_t fill_sizes[] = { sizeof(void *), sizeof(int), sizeof(int) };
	int (*reg)(const char *, fakecuda_kernel_fn, int, const size_t *);
	CUdevice dev;
	CUmodule mod;

	alarm(90);
	use_fake();
	setenv("GPUCR_RECONNECT_MS", "200", 1);
	fdd_init(&d);
	d.other = note_other;
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	connect_fake();

	reg = (int (*)(const char *, fakecuda_kernel_fn, int, const size_t *))fakecuda_sym(
		"fakecuda_register_kernel");
	REQUIRE(reg && reg("fill", shim_fill_kernel, 3, fill_sizes) == 0);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fill_fn, mod, "fill") == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&A, 3 * MIB + 5) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&B, 2 * MIB) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&S, 1000) == CUDA_SUCCESS);
	REQUIRE(dag_chunk_size() == 2 * MIB);
	CHECK(pump_until_bufs(3, 5000));

	cycle_and_halves();
	drop_releases();
	quiesce_releases();
	begin_fails();
	escaped_suspects();

	CHECK_EQ_INT(cuMemFree_v2(A), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(B), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(S), CUDA_SUCCESS);
	fdd_fini(&d);
	return t_done();
}
