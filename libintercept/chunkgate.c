/* The per-chunk gate: the epoch's table of buffers and chunk state bits,
 * the waiters and their futexes, the request queue and its eventfd, and the
 * checks the launch, copy and graph wrappers make. See chunkgate.h. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "buftab.h"
#include "chunkgate.h"
#include "gate.h"
#include "suspect.h"

int chunk_gate_open;

/* One of gpucr's buffers present at begin; its chunk bits are
 * [bit, bit + nchunks) of cg.done. */
struct cg_buf {
	uint64_t id;
	CUdeviceptr base;
	size_t size;
	uint64_t bit;
	uint32_t nchunks;
};

/* Chunks [lo, hi) of table buffer idx that a waiter needs. */
struct cg_span {
	uint32_t idx, lo, hi;
};

/* A call that waits, on its own stack; linked in cg.waiters while it does.
 * released is its futex: set (under cg.lock) when it may go. */
struct cg_waiter {
	struct cg_waiter *prev, *next;
	uint32_t released;
	bool whole;                /* waits for every chunk */
	bool ended;                /* released by the epoch's end, not by its chunks */
	size_t n, cap;
	struct cg_span *s;         /* inline_s, or heap memory */
	struct cg_span inline_s[CHUNK_GATE_WAIT_INLINE];
};

static struct {
	pthread_mutex_t lock;
	int kind;           /* of the current or last epoch */
	size_t chunk;
	struct cg_buf *bufs; /* in address order */
	uint32_t nbufs;
	uint32_t *hash;     /* buffer id -> index + 1, 0 free */
	size_t hash_size;   /* a power of two, >= 2 * nbufs */
	uint64_t *done;     /* a bit per chunk */
	uint64_t nchunks, ndone;
	struct cg_waiter *waiters;
	struct chunk_gate_req q[CHUNK_GATE_QUEUE];
	size_t qhead, qlen;
	int efd;
	struct chunk_gate_stats st;
} cg = { .lock = PTHREAD_MUTEX_INITIALIZER, .efd = -1 };

static long futex(uint32_t *uaddr, int op, uint32_t val)
{
	return syscall(SYS_futex, uaddr, op, val, NULL, NULL, 0);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the chunk bits ------------------------------------------------------- */

/* The first chunk bit in [b, end) not done, or end. */
static uint64_t next_pending(uint64_t b, uint64_t end)
{
	while (b < end) {
		uint64_t w = ~cg.done[b / 64] >> (b % 64);

		if (w) {
			b += (uint64_t)__builtin_ctzll(w);
			return b < end ? b : end;
		}
		b = (b / 64 + 1) * 64;
	}
	return end;
}

/* The last chunk bit in [lo, end) not done, or end when there is none. */
static uint64_t last_pending(uint64_t lo, uint64_t end)
{
	uint64_t b = end;

	while (b > lo) {
		uint64_t wi = (b - 1) / 64, w = ~cg.done[wi];
		unsigned int top = (unsigned int)((b - 1) % 64);

		if (top < 63)
			w &= (2ull << top) - 1;
		if (w) {
			uint64_t r = wi * 64 + 63 - (uint64_t)__builtin_clzll(w);

			return r >= lo ? r : end;
		}
		b = wi * 64;
	}
	return end;
}

/* Sets bits [lo, hi); returns how many were not set. */
static uint64_t set_done(uint64_t lo, uint64_t hi)
{
	uint64_t n = 0;

	while (lo < hi) {
		unsigned int off = (unsigned int)(lo % 64);
		uint64_t len = hi - lo < 64 - off ? hi - lo : 64 - off;
		uint64_t mask = (len == 64 ? ~0ull : ((1ull << len) - 1)) << off;

		n += (uint64_t)__builtin_popcountll(~cg.done[lo / 64] & mask);
		cg.done[lo / 64] |= mask;
		lo += len;
	}
	return n;
}

static inline size_t id_hash(uint64_t id, size_t size)
{
	return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 32) & (size - 1);
}

/* Index of buffer id in the table, or -1. */
static long find_buf(uint64_t id)
{
	size_t i;

	if (!cg.hash)
		return -1;
	i = id_hash(id, cg.hash_size);
	for (size_t n = 0; n < cg.hash_size; n++, i = (i + 1) & (cg.hash_size - 1)) {
		uint32_t v = cg.hash[i];

		if (!v)
			return -1;
		if (cg.bufs[v - 1].id == id)
			return (long)v - 1;
	}
	return -1;
}

/* ---- waiters ---------------------------------------------------------------- */

static void waiter_init(struct cg_waiter *w)
{
	memset(w, 0, offsetof(struct cg_waiter, inline_s));
	w->cap = CHUNK_GATE_WAIT_INLINE;
	w->s = w->inline_s;
}

/* Adds the part of chunks [lo, hi) of buffer idx that is not done, from its
 * first pending chunk to its last. A span that cannot be kept makes the
 * waiter wait for everything. */
static void span_add(struct cg_waiter *w, uint32_t idx, uint32_t lo, uint32_t hi)
{
	uint64_t bit = cg.bufs[idx].bit, first, last;

	if (hi > cg.bufs[idx].nchunks)
		hi = cg.bufs[idx].nchunks;
	first = next_pending(bit + lo, bit + hi);
	if (w->whole || first == bit + hi)
		return;
	last = last_pending(first, bit + hi);
	if (w->n == w->cap) {
		struct cg_span *s = malloc(w->cap * 2 * sizeof(*s));

		if (!s) {
			w->whole = true;
			return;
		}
		memcpy(s, w->s, w->n * sizeof(*s));
		if (w->s != w->inline_s)
			free(w->s);
		w->s = s;
		w->cap *= 2;
	}
	w->s[w->n++] = (struct cg_span){ idx, (uint32_t)(first - bit), (uint32_t)(last + 1 - bit) };
}

static void waiter_release(struct cg_waiter *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		cg.waiters = w->next;
	if (w->next)
		w->next->prev = w->prev;
	w->prev = w->next = NULL;
	__atomic_store_n(&w->released, 1, __ATOMIC_RELEASE);
	futex(&w->released, FUTEX_WAKE_PRIVATE, 1);
}

/* Drops the spans of w that are done now (and trims the others); true
 * when w may go. */
static bool waiter_ready(struct cg_waiter *w)
{
	size_t k = 0;

	if (w->whole)
		return cg.ndone == cg.nchunks;
	for (size_t i = 0; i < w->n; i++) {
		struct cg_span sp = w->s[i];
		uint64_t bit = cg.bufs[sp.idx].bit, first = next_pending(bit + sp.lo, bit + sp.hi);

		if (first < bit + sp.hi) {
			sp.lo = (uint32_t)(first - bit);
			w->s[k++] = sp;
		}
	}
	w->n = k;
	return k == 0;
}

/* Releases every waiter that may go now. */
static void sweep(void)
{
	struct cg_waiter *w = cg.waiters, *next;

	for (; w; w = next) {
		next = w->next;
		if (waiter_ready(w))
			waiter_release(w);
	}
}

static void queue_push(uint64_t id, CUdeviceptr base, uint32_t first, uint32_t n)
{
	if (cg.qlen == CHUNK_GATE_QUEUE) {
		cg.st.requests_dropped++;
		return;
	}
	cg.q[(cg.qhead + cg.qlen++) % CHUNK_GATE_QUEUE] = (struct chunk_gate_req){ id, base, first, n };
	cg.st.requests++;
}

/* Called under cg.lock with an epoch open and w's spans found: returns at
 * once when w needs nothing, else queues its requests and waits until it
 * is released. Unlocks cg.lock either way. Returns whether the call goes
 * while the epoch is open and some chunk of it is not done yet (its work
 * could change a chunk before it is saved: suspect.h). */
static bool settle(struct cg_waiter *w)
{
	uint64_t t0, t1 = 0;
	uint64_t one = 1;
	bool early;

	cg.st.calls_checked++;
	if (w->whole ? cg.ndone == cg.nchunks : w->n == 0) {
		early = cg.ndone < cg.nchunks;
		pthread_mutex_unlock(&cg.lock);
		goto out;
	}
	if (w->whole) {
		queue_push(0, 0, 0, 0);
		cg.st.calls_unbounded++;
	}
	for (size_t i = 0; !w->whole && i < w->n; i++)
		queue_push(cg.bufs[w->s[i].idx].id, cg.bufs[w->s[i].idx].base, w->s[i].lo, w->s[i].hi - w->s[i].lo);
	cg.st.calls_delayed++;
	cg.st.waiting++;
	w->next = cg.waiters;
	if (cg.waiters)
		cg.waiters->prev = w;
	cg.waiters = w;
	/* A failed write leaves a saturated counter: readable anyway. */
	if (cg.efd >= 0 && write(cg.efd, &one, sizeof(one)) < 0)
		cg.st.requests += 0;
	pthread_mutex_unlock(&cg.lock);
	pr_debug("thread %d waits for %zu chunk range(s)%s\n", (int)gettid(), w->n, w->whole ? " (all)" : "");

	t0 = now_ns();
	while (!__atomic_load_n(&w->released, __ATOMIC_ACQUIRE))
		futex(&w->released, FUTEX_WAIT_PRIVATE, 0);
	t1 = now_ns();
	/* The releaser wakes under the lock: once we hold it, it no longer
	 * touches w (which is about to leave the stack). */
	pthread_mutex_lock(&cg.lock);
	cg.st.waiting--;
	cg.st.wait_ns += t1 - t0;
	pthread_mutex_unlock(&cg.lock);
	/* A whole waiter goes once everything is done. */
	early = !w->whole && !w->ended;
out:
	if (w->s != w->inline_s)
		free(w->s);
	return early;
}

/* ---- the checks the wrappers make ------------------------------------------- */

/* Takes cg.lock if a call must be checked: false when it passes as is. */
static bool check_begin(void)
{
	if (!chunk_gate_on() || gate_self_exempt())
		return false;
	pthread_mutex_lock(&cg.lock);
	if (!chunk_gate_open) {
		pthread_mutex_unlock(&cg.lock);
		return false;
	}
	return true;
}

/* Whether a launch of h (a function or a graph) in this epoch waits for
 * all of it because it escaped prediction before (suspect.h). Under
 * cg.lock. */
static bool hold_suspect(enum suspect_kind kind, const void *h)
{
	if (cg.kind != CHUNK_GATE_SAVE || !suspect_hold(kind, h, cg.ndone < cg.nchunks))
		return false;
	pr_debug("thread %d: %s %p escaped prediction before: held until the epoch is saved\n", (int)gettid(),
		 kind == SUSPECT_GRAPH ? "graph" : "function", h);
	return true;
}

void chunk_gate_launch(const struct launch_decoded *d)
{
	struct cg_waiter w;
	int saved = errno;
	bool save;

	if (!check_begin())
		return;
	save = cg.kind == CHUNK_GATE_SAVE;
	waiter_init(&w);
	w.whole = (d->flags & LAUNCH_F_UNKNOWN) != 0 || hold_suspect(SUSPECT_FUNC, d->func);
	/* A launch reads and writes whole buffers (launch.h): every chunk. */
	for (unsigned int i = 0; i < d->ntouch && !w.whole; i++) {
		long idx = find_buf(d->touch[i].buf_id);

		if (idx >= 0)
			span_add(&w, (uint32_t)idx, 0, cg.bufs[idx].nchunks);
	}
	/* Noted before the driver sees it (suspect.h). */
	if (settle(&w) && save)
		suspect_note(SUSPECT_FUNC, d->func);
	errno = saved;
}

static int range_spans(const struct buf *b, size_t lo, size_t hi, void *arg)
{
	struct cg_waiter *w = arg;
	long idx = find_buf(b->id);

	if (idx >= 0)
		span_add(w, (uint32_t)idx, (uint32_t)(lo / cg.chunk), (uint32_t)((hi + cg.chunk - 1) / cg.chunk));
	return w->whole;
}

/* The ranges' check; exec: a graph launch's (its standing as a suspect
 * counts), or NULL. */
static void gate_ranges(const struct dag_range *r, size_t n, bool unbounded, CUgraphExec exec)
{
	uint32_t need;
	struct cg_waiter w;
	int saved = errno;
	bool save;

	if (!check_begin())
		return;
	save = cg.kind == CHUNK_GATE_SAVE;
	need = save ? DAG_ACCESS_WRITE : DAG_ACCESS_READ | DAG_ACCESS_WRITE;
	waiter_init(&w);
	w.whole = unbounded || (exec && hold_suspect(SUSPECT_GRAPH, exec));
	for (size_t i = 0; i < n && !w.whole; i++)
		if (r[i].access & need)
			dag_range_for_each_buf(&r[i], range_spans, &w);
	if (settle(&w) && save && exec)
		suspect_note(SUSPECT_GRAPH, exec);
	errno = saved;
}

void chunk_gate_ranges(const struct dag_range *r, size_t n, bool unbounded)
{
	gate_ranges(r, n, unbounded, NULL);
}

void chunk_gate_graph(CUgraphExec exec, const struct dag_range *r, size_t n, bool unbounded)
{
	gate_ranges(r, n, unbounded, exec);
}

/* ---- the epoch ------------------------------------------------------------------ */

struct fill {
	struct cg_buf *bufs;
	uint32_t n, cap;
	uint64_t chunks;
	size_t chunk;
};

static int fill_one(const struct buf *b, void *arg)
{
	struct fill *f = arg;
	uint64_t nch;

	if (!buf_held(b))
		return 0;
	nch = (b->size + f->chunk - 1) / f->chunk;
	if (f->n == f->cap)
		return 1;
	if (f->bufs)
		f->bufs[f->n] = (struct cg_buf){ b->id, b->base, b->size, f->chunks, (uint32_t)nch };
	f->n++;
	f->chunks += nch;
	return f->chunks > CHUNK_GATE_MAX_CHUNKS ? 2 : 0;
}

static void table_free(void)
{
	free(cg.bufs);
	free(cg.hash);
	free(cg.done);
	cg.bufs = NULL;
	cg.hash = NULL;
	cg.done = NULL;
	cg.nbufs = 0;
	cg.hash_size = 0;
	cg.nchunks = cg.ndone = 0;
}

/* Takes the table of gpucr's buffers present now, under cg.lock. */
static int table_take(size_t chunk)
{
	for (int attempt = 0; attempt < 4; attempt++) {
		struct fill f = { .cap = CHUNK_GATE_MAX_BUFS, .chunk = chunk };
		size_t words;
		int ret;

		/* Count, then copy into room for a few more (allocations made
		 * meanwhile, if the gate is open). */
		if (buftab_for_each(fill_one, &f))
			return -E2BIG;
		f.cap = f.n + 64 < CHUNK_GATE_MAX_BUFS ? f.n + 64 : CHUNK_GATE_MAX_BUFS;
		f.n = 0;
		f.chunks = 0;
		f.bufs = calloc(f.cap ? f.cap : 1, sizeof(*f.bufs));
		if (!f.bufs)
			return -ENOMEM;
		ret = buftab_for_each(fill_one, &f);
		if (ret == 1 && f.cap < CHUNK_GATE_MAX_BUFS) {
			free(f.bufs);
			continue;
		}
		if (ret) {
			free(f.bufs);
			return -E2BIG;
		}
		table_free();
		cg.bufs = f.bufs;
		cg.nbufs = f.n;
		cg.nchunks = f.chunks;
		cg.hash_size = 1;
		while (cg.hash_size < 2 * (size_t)f.n)
			cg.hash_size *= 2;
		words = (f.chunks + 63) / 64;
		cg.hash = calloc(cg.hash_size, sizeof(*cg.hash));
		cg.done = calloc(words ? words : 1, sizeof(*cg.done));
		if (!cg.hash || !cg.done) {
			table_free();
			return -ENOMEM;
		}
		for (uint32_t k = 0; k < f.n; k++) {
			size_t i = id_hash(cg.bufs[k].id, cg.hash_size);

			while (cg.hash[i])
				i = (i + 1) & (cg.hash_size - 1);
			cg.hash[i] = k + 1;
		}
		return 0;
	}
	return -EAGAIN;
}

int chunk_gate_begin(enum chunk_gate_kind kind)
{
	size_t chunk = dag_chunk_size();
	int err;

	if (kind != CHUNK_GATE_SAVE && kind != CHUNK_GATE_LOAD)
		return -EINVAL;
	pthread_mutex_lock(&cg.lock);
	if (chunk_gate_open) {
		err = -EBUSY;
		goto out;
	}
	if (cg.efd < 0)
		cg.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	cg.chunk = chunk;
	err = table_take(chunk);
	if (err)
		goto out;
	cg.kind = kind;
	cg.qhead = cg.qlen = 0;
	memset(&cg.st, 0, sizeof(cg.st));
	/* Hold decoding before opening, so that a call that sees the gate
	 * open has its access decoded. */
	launch_decode_hold();
	__atomic_store_n(&chunk_gate_open, 1, __ATOMIC_RELEASE);
	pr_debug("chunk gate: %s epoch over %u buffers, %llu chunks of %zu bytes\n",
		 kind == CHUNK_GATE_SAVE ? "save" : "load", cg.nbufs, (unsigned long long)cg.nchunks, chunk);
out:
	pthread_mutex_unlock(&cg.lock);
	return err;
}

long chunk_gate_mark_done(uint64_t buf_id, uint32_t first_chunk, uint32_t n)
{
	long idx, ret;

	pthread_mutex_lock(&cg.lock);
	if (!chunk_gate_open) {
		ret = -EINVAL;
		goto out;
	}
	idx = find_buf(buf_id);
	if (idx < 0) {
		ret = -ENOENT;
		goto out;
	}
	if (first_chunk > cg.bufs[idx].nchunks || n > cg.bufs[idx].nchunks - first_chunk) {
		ret = -ERANGE;
		goto out;
	}
	ret = (long)set_done(cg.bufs[idx].bit + first_chunk, cg.bufs[idx].bit + first_chunk + n);
	cg.ndone += (uint64_t)ret;
	if (ret)
		sweep();
out:
	pthread_mutex_unlock(&cg.lock);
	return ret;
}

long chunk_gate_mark_range_done(CUdeviceptr addr, size_t len)
{
	CUdeviceptr end = addr + len < addr ? ~(CUdeviceptr)0 : addr + len;
	uint32_t lo = 0, hi;
	uint64_t n = 0;

	pthread_mutex_lock(&cg.lock);
	if (!chunk_gate_open) {
		pthread_mutex_unlock(&cg.lock);
		return -EINVAL;
	}
	hi = cg.nbufs;
	/* The first buffer that ends after addr (the table is in address
	 * order, without overlaps). */
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (cg.bufs[mid].base + cg.bufs[mid].size <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < cg.nbufs && cg.bufs[lo].base < end; lo++) {
		const struct cg_buf *b = &cg.bufs[lo];
		uint64_t first = addr > b->base ? (addr - b->base + cg.chunk - 1) / cg.chunk : 0;
		uint64_t last = end >= b->base + b->size ? b->nchunks : (end - b->base) / cg.chunk;

		if (first < last)
			n += set_done(b->bit + first, b->bit + last);
	}
	cg.ndone += n;
	if (n)
		sweep();
	pthread_mutex_unlock(&cg.lock);
	return (long)n;
}

int chunk_gate_finish(void)
{
	pthread_mutex_lock(&cg.lock);
	if (!chunk_gate_open) {
		pthread_mutex_unlock(&cg.lock);
		return -EINVAL;
	}
	cg.ndone += set_done(0, cg.nchunks);
	while (cg.waiters) {
		cg.waiters->ended = true;
		waiter_release(cg.waiters);
	}
	__atomic_store_n(&chunk_gate_open, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&cg.lock);
	launch_decode_release();
	return 0;
}

int chunk_gate_chunk_done(uint64_t buf_id, uint32_t chunk)
{
	long idx;
	int ret;

	pthread_mutex_lock(&cg.lock);
	idx = find_buf(buf_id);
	if (idx < 0)
		ret = -ENOENT;
	else if (chunk >= cg.bufs[idx].nchunks)
		ret = -ERANGE;
	else
		ret = next_pending(cg.bufs[idx].bit + chunk, cg.bufs[idx].bit + chunk + 1) != cg.bufs[idx].bit + chunk;
	pthread_mutex_unlock(&cg.lock);
	return ret;
}

size_t chunk_gate_requests(struct chunk_gate_req *ret, size_t max)
{
	size_t n = 0;
	uint64_t v;

	pthread_mutex_lock(&cg.lock);
	for (; n < max && cg.qlen; n++, cg.qlen--) {
		ret[n] = cg.q[cg.qhead];
		cg.qhead = (cg.qhead + 1) % CHUNK_GATE_QUEUE;
	}
	/* A failed read: the counter was already zero. */
	if (!cg.qlen && cg.efd >= 0 && read(cg.efd, &v, sizeof(v)) < 0)
		v = 0;
	pthread_mutex_unlock(&cg.lock);
	return n;
}

int chunk_gate_request_fd(void)
{
	int fd;

	pthread_mutex_lock(&cg.lock);
	fd = cg.efd;
	pthread_mutex_unlock(&cg.lock);
	return fd;
}

void chunk_gate_get_stats(struct chunk_gate_stats *ret)
{
	pthread_mutex_lock(&cg.lock);
	*ret = cg.st;
	ret->kind = cg.kind;
	ret->open = chunk_gate_open != 0;
	ret->chunk_size = cg.chunk;
	ret->bufs = cg.nbufs;
	ret->chunks = cg.nchunks;
	ret->chunks_done = cg.ndone;
	pthread_mutex_unlock(&cg.lock);
}

void chunk_gate_reset_after_fork(void)
{
	/* Only the forking thread lives on: nobody waits. The eventfd is the
	 * parent's file: leave it to the parent. */
	pthread_mutex_init(&cg.lock, NULL);
	if (chunk_gate_open) {
		chunk_gate_open = 0;
		launch_decode_release();
	}
	cg.waiters = NULL;
	cg.st.waiting = 0;
	cg.qlen = 0;
	if (cg.efd >= 0)
		close(cg.efd);
	cg.efd = -1;
}
