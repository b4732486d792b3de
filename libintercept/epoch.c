/* The control thread's side of a save epoch: the merged set of ranges
 * gpucrd saved since the cut, the chunks they complete, and the ranges the
 * gate's waiting calls ask for. See epoch.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buftab.h"
#include "chunkgate.h"
#include "epoch.h"
#include "suspect.h"

struct iv {
	uint64_t lo, hi; /* [lo, hi), hi > lo */
};

static struct {
	bool open;       /* we began a save epoch and it has not ended */
	bool all_saved;  /* ChunksSaved{all} came before the epoch began */
	bool told_full;  /* said once that the interval set is full */
	size_t chunk;    /* the epoch's chunk size */
	uint64_t dropped_seen; /* the gate's requests_dropped already answered with all */
	/* Saved ranges since the cut: sorted, disjoint, never touching. */
	struct iv *iv;
	size_t n, cap;
	/* ChunksWanted's storage (CHUNK_GATE_QUEUE entries each). */
	struct chunk_gate_req *reqs;
	Gpucr__ChunkRange *ranges;
	Gpucr__ChunkRange **pranges;
	/* ChunksWanted's held names. */
	char held[SUSPECT_HELD_MAX][SUSPECT_NAME_MAX];
	char *pheld[SUSPECT_HELD_MAX];
} ep;

/* ---- the interval set ---------------------------------------------------- */

/* The first interval that ends at or after lo (may touch it), or ep.n. */
static size_t iv_first_reaching(uint64_t lo)
{
	size_t a = 0, b = ep.n;

	while (a < b) {
		size_t mid = a + (b - a) / 2;

		if (ep.iv[mid].hi < lo)
			a = mid + 1;
		else
			b = mid;
	}
	return a;
}

/* Adds [lo, hi) and sets *ret to the interval of the set that holds it
 * now (merged with what it overlaps or touches). 0, or -ENOMEM / -ENOSPC
 * when it could not be kept: then *ret is [lo, hi) alone and the set is
 * unchanged. */
static int iv_add(uint64_t lo, uint64_t hi, struct iv *ret)
{
	size_t i = iv_first_reaching(lo), j = i;

	while (j < ep.n && ep.iv[j].lo <= hi)
		j++;
	if (i == j) {
		if (ep.n == ep.cap) {
			size_t cap = ep.cap ? ep.cap * 2 : 64;
			struct iv *v;

			if (cap > EPOCH_MAX_INTERVALS) {
				*ret = (struct iv){ lo, hi };
				return -ENOSPC;
			}
			v = realloc(ep.iv, cap * sizeof(*v));
			if (!v) {
				*ret = (struct iv){ lo, hi };
				return -ENOMEM;
			}
			ep.iv = v;
			ep.cap = cap;
		}
		memmove(&ep.iv[i + 1], &ep.iv[i], (ep.n - i) * sizeof(*ep.iv));
		ep.iv[i] = (struct iv){ lo, hi };
		ep.n++;
		*ret = ep.iv[i];
		return 0;
	}
	if (ep.iv[i].lo < lo)
		lo = ep.iv[i].lo;
	if (ep.iv[j - 1].hi > hi)
		hi = ep.iv[j - 1].hi;
	ep.iv[i] = (struct iv){ lo, hi };
	memmove(&ep.iv[i + 1], &ep.iv[j], (ep.n - j) * sizeof(*ep.iv));
	ep.n -= j - i - 1;
	*ret = ep.iv[i];
	return 0;
}

static void iv_forget(void)
{
	free(ep.iv);
	ep.iv = NULL;
	ep.n = ep.cap = 0;
	ep.told_full = false;
}

/* Marks the gate chunks that [lo, hi) completes, m being the saved
 * interval that holds it. Such a chunk meets [lo, hi) (it was not covered
 * before) and lies in m, so it lies in m cut down to a chunk's length
 * either side of [lo, hi): only that much is walked, however large m has
 * grown. */
static void mark(uint64_t lo, uint64_t hi, struct iv m)
{
	uint64_t reach = ep.chunk ? ep.chunk - 1 : 0;
	uint64_t a = lo - m.lo > reach ? lo - reach : m.lo; /* m holds [lo, hi) */
	uint64_t b = m.hi - hi > reach ? hi + reach : m.hi;
	long n;

	if (b <= a)
		return;
	n = chunk_gate_mark_range_done((CUdeviceptr)a, (size_t)(b - a));
	if (n < 0)
		pr_debug("save epoch: marking %#llx..%#llx: %s\n", (unsigned long long)a, (unsigned long long)b,
			 gpucr_strerror((int)n));
}

/* ---- the epoch --------------------------------------------------------------- */

bool epoch_is_open(void)
{
	return ep.open;
}

bool epoch_all_saved(void)
{
	return ep.all_saved;
}

int epoch_request_fd(void)
{
	/* chunkgate.h: the same fd for the life of the process once made. */
	return ep.chunk ? chunk_gate_request_fd() : -1;
}

void epoch_end(const char *why)
{
	struct chunk_gate_stats st;

	if (!ep.open)
		return;
	ep.open = false;
	suspect_epoch_end();
	chunk_gate_finish();
	chunk_gate_get_stats(&st);
	/* Not the time they waited: the ones just released add theirs later. */
	pr_info("save epoch over (%s): %llu of %llu call(s) waited for chunks (%llu for all); "
		"%llu request(s) to gpucrd\n",
		why, (unsigned long long)st.calls_delayed, (unsigned long long)st.calls_checked,
		(unsigned long long)st.calls_unbounded, (unsigned long long)st.requests);
}

void epoch_cut(void)
{
	epoch_end("a new quiesce");
	iv_forget();
	ep.all_saved = false;
	suspect_cut();
}

int epoch_begin(char *what, size_t whatlen)
{
	struct chunk_gate_stats st;
	int err;

	what[0] = '\0';
	err = chunk_gate_begin(CHUNK_GATE_SAVE);
	if (err) {
		switch (err) {
		case -E2BIG:
			snprintf(what, whatlen,
				 "the process has more than %u buffers or %u chunks for the per-chunk gate",
				 CHUNK_GATE_MAX_BUFS, CHUNK_GATE_MAX_CHUNKS);
			break;
		case -EBUSY:
			snprintf(what, whatlen, "another per-chunk epoch (a save or a lazy load) is open");
			break;
		default:
			snprintf(what, whatlen, "the per-chunk gate: %s", gpucr_strerror(err));
			break;
		}
		return err;
	}
	chunk_gate_get_stats(&st);
	/* Nothing launches before the gate opens (control.c), so no launch of
	 * the epoch goes unnoted. */
	suspect_epoch_begin();
	ep.open = true;
	ep.chunk = st.chunk_size;
	ep.dropped_seen = 0;
	for (size_t i = 0; i < ep.n; i++)
		mark(ep.iv[i].lo, ep.iv[i].hi, ep.iv[i]);
	chunk_gate_get_stats(&st);
	pr_info("save epoch begun: %u buffers, %llu chunks of %zu bytes, %llu saved already\n", st.bufs,
		(unsigned long long)st.chunks, st.chunk_size, (unsigned long long)st.chunks_done);
	return 0;
}

size_t epoch_escaped(struct suspect_report *ret)
{
	size_t n = suspect_escaped(ret);

	epoch_end("a GPU write escaped prediction");
	return n;
}

int epoch_saved(const Gpucr__ChunksSaved *cs)
{
	int ret = 0;

	if (cs->has_all && cs->all) {
		if (ep.open)
			epoch_end("gpucrd saved everything");
		else
			ep.all_saved = true;
		return 0;
	}
	for (size_t i = 0; i < cs->n_ranges; i++) {
		uint64_t lo = cs->ranges[i]->va, len = cs->ranges[i]->len;
		uint64_t hi = lo + len < lo ? UINT64_MAX : lo + len;
		struct iv m;
		int err;

		if (!len)
			continue;
		err = iv_add(lo, hi, &m);
		if (err && !ret) {
			ret = err;
			if (!ep.told_full) {
				ep.told_full = true;
				pr_info("save epoch: %s for the saved ranges (%zu kept); chunks that straddle "
					"ranges may wait until gpucrd saves everything\n",
					err == -ENOSPC ? "no room" : "no memory", ep.n);
			}
		}
		if (ep.open)
			mark(lo, hi, m);
	}
	return ret;
}

static int range_cmp(const void *a, const void *b)
{
	const Gpucr__ChunkRange *x = a, *y = b;

	return x->va < y->va ? -1 : x->va > y->va;
}

bool epoch_wanted(Gpucr__ChunksWanted *ret)
{
	struct chunk_gate_stats st;
	size_t n, k = 0, nheld;
	bool all = false;

	if (!ep.reqs) {
		struct chunk_gate_req one;

		ep.reqs = calloc(CHUNK_GATE_QUEUE, sizeof(*ep.reqs));
		ep.ranges = calloc(CHUNK_GATE_QUEUE, sizeof(*ep.ranges));
		ep.pranges = calloc(CHUNK_GATE_QUEUE, sizeof(*ep.pranges));
		if (!ep.reqs || !ep.ranges || !ep.pranges) {
			free(ep.reqs);
			free(ep.ranges);
			free(ep.pranges);
			ep.reqs = NULL;
			ep.ranges = NULL;
			ep.pranges = NULL;
			/* Without room for the ranges, ask for everything (the
			 * queue is emptied a request at a time). */
			while (chunk_gate_requests(&one, 1))
				;
			gpucr__chunks_wanted__init(ret);
			ret->has_all = ret->all = true;
			return ep.open;
		}
	}
	n = chunk_gate_requests(ep.reqs, CHUNK_GATE_QUEUE);
	/* Taken after the requests: a held call queues its notice first. */
	nheld = suspect_take_held(ep.held, SUSPECT_HELD_MAX);
	if (!ep.open)
		return false;
	chunk_gate_get_stats(&st);
	if (st.requests_dropped > ep.dropped_seen) {
		ep.dropped_seen = st.requests_dropped;
		all = true;
	}
	for (size_t i = 0; i < n; i++) {
		const struct chunk_gate_req *q = &ep.reqs[i];
		uint64_t va = q->base + (uint64_t)q->first * ep.chunk, end = va + (uint64_t)q->n * ep.chunk;
		struct buf b;

		if (!q->buf_id) {
			all = true;
			continue;
		}
		/* A buffer's last chunk may be short: a sub-allocation's whole
		 * chunk would reach into its neighbours, and gpucrd would save
		 * them first for nothing. */
		if (!buftab_lookup(q->base, &b) && b.id == q->buf_id && b.base + b.size < end)
			end = b.base + b.size;
		if (end <= va)
			continue;
		gpucr__chunk_range__init(&ep.ranges[k]);
		ep.ranges[k].va = va;
		ep.ranges[k].len = end - va;
		k++;
	}
	if (!k && !all && !nheld)
		return false;
	/* Several calls often wait for the same chunks: one range each. */
	qsort(ep.ranges, k, sizeof(*ep.ranges), range_cmp);
	n = k;
	k = 0;
	for (size_t i = 0; i < n; i++) {
		Gpucr__ChunkRange *r = &ep.ranges[i];

		if (k && r->va <= ep.ranges[k - 1].va + ep.ranges[k - 1].len) {
			uint64_t end = r->va + r->len;

			if (end > ep.ranges[k - 1].va + ep.ranges[k - 1].len)
				ep.ranges[k - 1].len = end - ep.ranges[k - 1].va;
			continue;
		}
		ep.ranges[k++] = *r;
	}
	for (size_t i = 0; i < k; i++)
		ep.pranges[i] = &ep.ranges[i];
	gpucr__chunks_wanted__init(ret);
	ret->n_ranges = k;
	ret->ranges = ep.pranges;
	if (all)
		ret->has_all = ret->all = true;
	for (size_t i = 0; i < nheld; i++)
		ep.pheld[i] = ep.held[i];
	ret->n_held = nheld;
	ret->held = ep.pheld;
	return true;
}

void epoch_reset_after_fork(void)
{
	/* The child's chunk gate has no epoch (chunk_gate_reset_after_fork);
	 * the parent's cut is not the child's. */
	ep.open = false;
	ep.all_saved = false;
	ep.chunk = 0;
	iv_forget();
}
