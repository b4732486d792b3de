/* The DAG of a checkpoint epoch: nodes for decoded launches, copies,
 * memsets and graph launches, edges to buffer chunks, per-stream order and
 * the written-chunk bitmaps, all in fixed-capacity arenas. See dag.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "buftab.h"
#include "dag.h"

#define DAG_MAX_STREAMS 1024u /* distinct streams per epoch; a power of two */

struct dag_stream {
	CUstream s;
	uint64_t next;
	bool used;
};

static pthread_mutex_t dag_lock = PTHREAD_MUTEX_INITIALIZER;

static struct dag_config dag_cfg = {
	.chunk_size = DAG_CHUNK_DEFAULT,
	.max_nodes = DAG_MAX_NODES_DEFAULT,
	.max_edges = DAG_MAX_EDGES_DEFAULT,
	.max_bufs = DAG_MAX_BUFS_DEFAULT,
	.max_bits = DAG_MAX_BITS_DEFAULT,
};

/* The arenas, sized by dag_cfg. buf_hash maps a buffer id to its index + 1
 * (0 free); each buffer's bits start at a word of its own (buf_word). */
struct dag_arena {
	struct dag_node *nodes;
	struct dag_edge *edges;
	struct dag_buffer *bufs;
	uint32_t *buf_word;
	uint32_t *buf_hash;
	size_t hash_size; /* a power of two, >= 2 * max_bufs */
	uint64_t *bits;
	size_t nwords;
};

static struct dag_arena arena;
static struct dag_stream streams[DAG_MAX_STREAMS];
static uint32_t nnodes, nedges, nbufs;
static size_t words_used;
static int dag_open; /* read without the lock by the recorders */
static bool dag_overflowed;
static bool dag_unbounded;

static void arena_free(struct dag_arena *a)
{
	free(a->nodes);
	free(a->edges);
	free(a->bufs);
	free(a->buf_word);
	free(a->buf_hash);
	free(a->bits);
	memset(a, 0, sizeof(*a));
}

static int arena_alloc(struct dag_arena *a, const struct dag_config *c)
{
	memset(a, 0, sizeof(*a));
	a->hash_size = 1;
	while (a->hash_size < 2 * (size_t)c->max_bufs)
		a->hash_size *= 2;
	a->nwords = ((size_t)c->max_bits + 63) / 64;
	a->nodes = calloc(c->max_nodes, sizeof(*a->nodes));
	a->edges = calloc(c->max_edges, sizeof(*a->edges));
	a->bufs = calloc(c->max_bufs, sizeof(*a->bufs));
	a->buf_word = calloc(c->max_bufs, sizeof(*a->buf_word));
	a->buf_hash = calloc(a->hash_size, sizeof(*a->buf_hash));
	a->bits = calloc(a->nwords ? a->nwords : 1, sizeof(*a->bits));
	if (!a->nodes || !a->edges || !a->bufs || !a->buf_word || !a->buf_hash || !a->bits) {
		arena_free(a);
		return -ENOMEM;
	}
	return 0;
}

int dag_configure(const struct dag_config *cfg)
{
	struct dag_config c = dag_cfg;
	struct dag_arena a;
	int err;

	if (cfg->chunk_size)
		c.chunk_size = cfg->chunk_size;
	if (cfg->max_nodes)
		c.max_nodes = cfg->max_nodes;
	if (cfg->max_edges)
		c.max_edges = cfg->max_edges;
	if (cfg->max_bufs)
		c.max_bufs = cfg->max_bufs;
	if (cfg->max_bits)
		c.max_bits = cfg->max_bits;
	if (c.chunk_size < 4096 || (c.chunk_size & (c.chunk_size - 1)))
		return -EINVAL;
	pthread_mutex_lock(&dag_lock);
	if (dag_open) {
		pthread_mutex_unlock(&dag_lock);
		return -EBUSY;
	}
	err = arena_alloc(&a, &c);
	if (!err) {
		arena_free(&arena);
		arena = a;
		dag_cfg = c;
		nnodes = nedges = nbufs = 0;
		words_used = 0;
		dag_overflowed = false;
		dag_unbounded = false;
	}
	pthread_mutex_unlock(&dag_lock);
	return err;
}

int dag_epoch_begin(void)
{
	int err = 0;

	pthread_mutex_lock(&dag_lock);
	if (dag_open) {
		err = -EBUSY;
		goto out;
	}
	if (!arena.nodes) {
		err = arena_alloc(&arena, &dag_cfg);
		if (err)
			goto out;
	}
	memset(arena.buf_hash, 0, arena.hash_size * sizeof(*arena.buf_hash));
	memset(streams, 0, sizeof(streams));
	nnodes = nedges = nbufs = 0;
	words_used = 0;
	dag_overflowed = false;
	dag_unbounded = false;
	__atomic_store_n(&dag_open, 1, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&dag_lock);
	if (!err)
		launch_decode_hold();
	return err;
}

int dag_epoch_end(void)
{
	pthread_mutex_lock(&dag_lock);
	if (!dag_open) {
		pthread_mutex_unlock(&dag_lock);
		return -EINVAL;
	}
	__atomic_store_n(&dag_open, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&dag_lock);
	launch_decode_release();
	return 0;
}

static inline size_t id_hash(uint64_t id, size_t size)
{
	return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 32) & (size - 1);
}

/* Index of the epoch's buffer with that id, or -1. */
static long buf_find(uint64_t id)
{
	size_t i = id_hash(id, arena.hash_size);

	for (size_t n = 0; n < arena.hash_size; n++, i = (i + 1) & (arena.hash_size - 1)) {
		uint32_t v = arena.buf_hash[i];

		if (!v)
			return -1;
		if (arena.bufs[v - 1].buf_id == id)
			return (long)v - 1;
	}
	return -1;
}

/* Index of buffer id (at base, size bytes) in the epoch, added if new; -1
 * when full. */
static long buf_get(uint64_t id, CUdeviceptr base, size_t size)
{
	long idx = buf_find(id);
	size_t nch, words, i;
	struct dag_buffer *b;

	if (idx >= 0)
		return idx;
	nch = (size + dag_cfg.chunk_size - 1) / dag_cfg.chunk_size;
	words = (nch + 63) / 64;
	if (nbufs >= dag_cfg.max_bufs || nch > UINT32_MAX || words > arena.nwords - words_used)
		return -1;
	b = &arena.bufs[nbufs];
	b->buf_id = id;
	b->base = base;
	b->size = size;
	b->nchunks = (uint32_t)nch;
	arena.buf_word[nbufs] = (uint32_t)words_used;
	memset(arena.bits + words_used, 0, words * sizeof(uint64_t));
	words_used += words;
	i = id_hash(id, arena.hash_size);
	while (arena.buf_hash[i])
		i = (i + 1) & (arena.hash_size - 1);
	arena.buf_hash[i] = nbufs + 1;
	return (long)nbufs++;
}

static void set_bits(uint64_t *w, uint32_t lo, uint32_t hi)
{
	for (uint32_t i = lo; i < hi; i++)
		w[i / 64] |= 1ull << (i % 64);
}

/* The next sequence number on stream s; false when the table is full. */
static bool stream_next(CUstream s, uint64_t *ret)
{
	size_t i = id_hash((uint64_t)(uintptr_t)s, DAG_MAX_STREAMS);

	for (size_t n = 0; n < DAG_MAX_STREAMS; n++, i = (i + 1) & (DAG_MAX_STREAMS - 1)) {
		if (!streams[i].used) {
			streams[i].used = true;
			streams[i].s = s;
			streams[i].next = 0;
		}
		if (streams[i].s == s) {
			*ret = streams[i].next++;
			return true;
		}
	}
	return false;
}

/* ---- recording, under dag_lock ------------------------------------------ */

/* A new node, its edges to follow (edge_add); NULL when the arenas or the
 * stream table are full. */
static struct dag_node *node_new(enum dag_node_kind kind, CUstream s, CUfunction func, CUgraphExec exec,
				 unsigned int flags)
{
	struct dag_node *n;
	uint64_t sseq;

	if (nnodes >= dag_cfg.max_nodes || !stream_next(s, &sseq))
		return NULL;
	n = &arena.nodes[nnodes];
	n->seq = nnodes;
	n->stream_seq = sseq;
	n->stream = s;
	n->func = func;
	n->exec = exec;
	n->kind = kind;
	n->flags = flags;
	n->edge_first = nedges;
	n->nedges = 0;
	return n;
}

/* Adds to n an edge on chunks [lo, hi) of the epoch's buffer b, or widens
 * n's last edge when it is on the same buffer with the same access and
 * meets this one. false when the edge arena is full. */
static bool edge_add(struct dag_node *n, long b, uint32_t lo, uint32_t hi, uint32_t access)
{
	struct dag_edge *e = n->nedges ? &arena.edges[nedges + n->nedges - 1] : NULL;

	if (e && e->buf == (uint32_t)b && e->access == access && lo <= e->chunk_hi && hi >= e->chunk_lo) {
		e->chunk_lo = lo < e->chunk_lo ? lo : e->chunk_lo;
		e->chunk_hi = hi > e->chunk_hi ? hi : e->chunk_hi;
	} else {
		if (nedges + n->nedges >= dag_cfg.max_edges)
			return false;
		e = &arena.edges[nedges + n->nedges++];
		e->buf = (uint32_t)b;
		e->chunk_lo = lo;
		e->chunk_hi = hi;
		e->access = access;
	}
	if (access & DAG_ACCESS_WRITE)
		set_bits(arena.bits + arena.buf_word[b], lo, hi);
	return true;
}

/* Makes n part of the epoch. */
static void node_commit(struct dag_node *n)
{
	nedges += n->nedges;
	nnodes++;
	if (n->flags & DAG_NODE_F_UNBOUNDED)
		dag_unbounded = true;
}

int dag_range_for_each_buf(const struct dag_range *r,
			   int (*fn)(const struct buf *b, size_t lo, size_t hi, void *arg), void *arg)
{
	CUdeviceptr a = r->addr, end = r->addr + (r->len ? r->len : 1);
	struct buf b;
	int ret;

	if (!r->len && !(r->flags & DAG_RANGE_WHOLE))
		return 0;
	if (end < a)
		end = ~(CUdeviceptr)0; /* wraps: as far as buffers go */
	while (a < end && buftab_lookup(a, &b) == 0) {
		CUdeviceptr bend = b.base + b.size;

		if (r->flags & DAG_RANGE_WHOLE)
			ret = fn(&b, 0, b.size, arg);
		else
			ret = fn(&b, a - b.base, (end < bend ? end : bend) - b.base, arg);
		if (ret)
			return ret;
		a = bend;
	}
	return 0;
}

struct edge_arg {
	struct dag_node *n;
	uint32_t access;
};

static int range_edge(const struct buf *b, size_t lo, size_t hi, void *arg)
{
	const struct edge_arg *e = arg;
	size_t chunk = dag_cfg.chunk_size;
	long idx = buf_get(b->id, b->base, b->size);

	if (idx < 0 || !edge_add(e->n, idx, (uint32_t)(lo / chunk), (uint32_t)((hi + chunk - 1) / chunk), e->access))
		return -1;
	return 0;
}

/* Adds n's edges for range r: false when an arena is full. */
static bool range_edges(struct dag_node *n, const struct dag_range *r)
{
	struct edge_arg e = { n, r->access };

	return dag_range_for_each_buf(r, range_edge, &e) == 0;
}

/* Records one node if an epoch is open: add_edges gives it its edges,
 * false when they do not fit (the epoch overflows). */
static void record(enum dag_node_kind kind, CUstream s, CUfunction func, CUgraphExec exec, unsigned int flags,
		   bool (*add_edges)(struct dag_node *n, const void *arg), const void *arg)
{
	struct dag_node *n;

	if (!__atomic_load_n(&dag_open, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&dag_lock);
	if (!dag_open || dag_overflowed)
		goto out;
	n = node_new(kind, s, func, exec, flags);
	if (!n || !add_edges(n, arg)) {
		dag_overflowed = true;
		goto out;
	}
	node_commit(n);
out:
	pthread_mutex_unlock(&dag_lock);
}

static bool launch_edges(struct dag_node *n, const void *arg)
{
	const struct launch_decoded *d = arg;

	for (unsigned int i = 0; i < d->ntouch; i++) {
		const struct launch_touch *t = &d->touch[i];
		long b = buf_get(t->buf_id, t->base, t->size);

		/* Whole buffers (launch.h says why): every chunk of it. */
		if (b < 0 || !edge_add(n, b, 0, arena.bufs[b].nchunks, DAG_ACCESS_READ | DAG_ACCESS_WRITE))
			return false;
	}
	return true;
}

void dag_record_launch(const struct launch_decoded *d)
{
	if (d->flags & LAUNCH_F_UNKNOWN) {
		if (__atomic_load_n(&dag_open, __ATOMIC_ACQUIRE)) {
			pthread_mutex_lock(&dag_lock);
			if (dag_open)
				dag_overflowed = true;
			pthread_mutex_unlock(&dag_lock);
		}
		return;
	}
	record(DAG_NODE_LAUNCH, d->stream, d->func, NULL, 0, launch_edges, d);
}

struct ranges_arg {
	const struct dag_range *r;
	size_t n;
};

static bool ranges_edges(struct dag_node *n, const void *arg)
{
	const struct ranges_arg *a = arg;

	for (size_t i = 0; i < a->n; i++)
		if (a->r[i].access && !range_edges(n, &a->r[i]))
			return false;
	return true;
}

void dag_record_ranges(enum dag_node_kind kind, CUstream s, CUgraphExec exec, unsigned int flags,
		       const struct dag_range *r, size_t nr)
{
	const struct ranges_arg a = { r, nr };

	record(kind, s, NULL, exec, flags, ranges_edges, &a);
}

size_t dag_chunk_size(void)
{
	size_t c;

	pthread_mutex_lock(&dag_lock);
	c = dag_cfg.chunk_size;
	pthread_mutex_unlock(&dag_lock);
	return c;
}

void dag_get_stats(struct dag_stats *ret)
{
	pthread_mutex_lock(&dag_lock);
	ret->open = dag_open != 0;
	ret->overflowed = dag_overflowed;
	ret->unbounded = dag_unbounded;
	ret->nodes = nnodes;
	ret->edges = nedges;
	ret->bufs = nbufs;
	ret->chunk_size = dag_cfg.chunk_size;
	pthread_mutex_unlock(&dag_lock);
}

int dag_for_each_node(int (*fn)(const struct dag_node *n, const struct dag_edge *edges,
				const struct dag_buffer *bufs, void *arg),
		      void *arg)
{
	int ret = 0;

	pthread_mutex_lock(&dag_lock);
	for (uint32_t i = 0; i < nnodes && !ret; i++)
		ret = fn(&arena.nodes[i], arena.edges + arena.nodes[i].edge_first, arena.bufs, arg);
	pthread_mutex_unlock(&dag_lock);
	return ret;
}

long dag_written(uint64_t buf_id, size_t size, uint64_t *ret_bits, size_t nwords)
{
	size_t nch, words;
	long idx, count = 0;

	pthread_mutex_lock(&dag_lock);
	nch = (size + dag_cfg.chunk_size - 1) / dag_cfg.chunk_size;
	words = (nch + 63) / 64;
	if (nwords < words) {
		pthread_mutex_unlock(&dag_lock);
		return -ENOSPC;
	}
	memset(ret_bits, 0, words * sizeof(*ret_bits));
	if (dag_overflowed || dag_unbounded) {
		set_bits(ret_bits, 0, (uint32_t)(nch > UINT32_MAX ? UINT32_MAX : nch));
	} else {
		idx = arena.buf_hash ? buf_find(buf_id) : -1;
		if (idx >= 0) {
			size_t have = (arena.bufs[idx].nchunks + 63) / 64;

			memcpy(ret_bits, arena.bits + arena.buf_word[idx],
			       (have < words ? have : words) * sizeof(*ret_bits));
			if (nch % 64 && have >= words)
				ret_bits[words - 1] &= (1ull << (nch % 64)) - 1;
		}
	}
	for (size_t i = 0; i < words; i++)
		count += __builtin_popcountll(ret_bits[i]);
	pthread_mutex_unlock(&dag_lock);
	return count;
}
