/* Helpers of the shim tests that look at the epoch DAG (dag.h): copies of
 * the recorded nodes and their edges, by buffer id. Include after t.h. */
#ifndef GPUCR_DAGTEST_H
#define GPUCR_DAGTEST_H

#include <stdio.h>

#include "buftab.h"
#include "dag.h"

#define SEEN_MAX_NODES 256
#define SEEN_MAX_EDGES 16

struct seen_edge {
	uint64_t buf_id;
	uint32_t lo, hi, access;
};

struct seen_node {
	struct dag_node n;
	unsigned nedges;
	struct seen_edge e[SEEN_MAX_EDGES];
};

static struct seen_node seen[SEEN_MAX_NODES];
static unsigned nseen;

static int seen_collect(const struct dag_node *n, const struct dag_edge *edges, const struct dag_buffer *bufs,
			void *arg)
{
	struct seen_node *s;

	(void)arg;
	if (nseen == SEEN_MAX_NODES)
		return 1;
	s = &seen[nseen++];
	s->n = *n;
	s->nedges = n->nedges < SEEN_MAX_EDGES ? n->nedges : SEEN_MAX_EDGES;
	for (unsigned i = 0; i < s->nedges; i++) {
		s->e[i].buf_id = bufs[edges[i].buf].buf_id;
		s->e[i].lo = edges[i].chunk_lo;
		s->e[i].hi = edges[i].chunk_hi;
		s->e[i].access = edges[i].access;
	}
	return 0;
}

/* Copies every node of the epoch into seen[0..nseen). */
static inline void collect_all(void)
{
	nseen = 0;
	CHECK_EQ_INT(dag_for_each_node(seen_collect, NULL), 0);
}

/* The last node recorded, or NULL when there is none. */
static inline const struct seen_node *last_node(void)
{
	collect_all();
	return nseen ? &seen[nseen - 1] : NULL;
}

/* Node s has an edge to buffer id over chunks [lo, hi) with that access. */
static inline int has_edge(const struct seen_node *s, uint64_t id, uint32_t lo, uint32_t hi, uint32_t access)
{
	for (unsigned k = 0; k < s->nedges; k++)
		if (s->e[k].buf_id == id && s->e[k].lo == lo && s->e[k].hi == hi && s->e[k].access == access)
			return 1;
	fprintf(stderr, "node %llu: no edge to %llx [%u, %u) access %u; it has:\n", (unsigned long long)s->n.seq,
		(unsigned long long)id, lo, hi, access);
	for (unsigned k = 0; k < s->nedges; k++)
		fprintf(stderr, "  %llx [%u, %u) access %u\n", (unsigned long long)s->e[k].buf_id, s->e[k].lo,
			s->e[k].hi, s->e[k].access);
	return 0;
}

static inline struct buf buf_of(CUdeviceptr p)
{
	struct buf b;

	REQUIRE(buftab_lookup(p, &b) == 0);
	return b;
}

#endif
