/* CUDA graphs: the table of executable graphs and their access sets, the
 * graph walk that fills it at instantiation, and the wrappers of
 * instantiation, launch, destruction and parameter updates. See graph.h. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "chunkgate.h"
#include "counts.h"
#include "gate.h"
#include "graph.h"
#include "launch.h"
#include "real.h"

/* One top-level node of the graph and its ranges [first, first + n). */
struct graph_seg {
	CUgraphNode node;
	size_t first, n;
	bool unbounded;
};

struct graph_exec {
	CUgraphExec exec;
	bool unbounded;    /* beyond what the segments say: not walked whole */
	size_t nunbounded; /* unbounded segments */
	size_t nseg;
	struct graph_seg *seg;
	size_t nr;
	struct dag_range *r;
};

static void exec_free(struct graph_exec *e)
{
	if (!e)
		return;
	free(e->seg);
	free(e->r);
	free(e);
}

static inline bool exec_unbounded(const struct graph_exec *e)
{
	return e->unbounded || e->nunbounded;
}

/* ---- the graph walk (driver queries through `real`, never the gate) -------- */

/* The nodes of g into *ret (malloc'ed, the caller frees; NULL when none)
 * and their count: 0, or -1 when the driver cannot say. */
static int graph_nodes(CUgraph g, CUgraphNode **ret, size_t *ret_n)
{
	CUgraphNode *v;
	size_t n = 0;

	*ret = NULL;
	*ret_n = 0;
	if (!real.cuGraphGetNodes || real.cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS)
		return -1;
	if (!n)
		return 0;
	v = malloc(n * sizeof(*v));
	if (!v || real.cuGraphGetNodes(g, v, &n) != CUDA_SUCCESS) {
		free(v);
		return -1;
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

static bool node_access(struct access_set *s, CUgraphNode n, int depth);

/* Node types that reach no buffer of the application. */
static bool node_type_harmless(CUgraphNodeType t)
{
	switch (t) {
	case CU_GRAPH_NODE_TYPE_EMPTY:
	case CU_GRAPH_NODE_TYPE_HOST:
	case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
	case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
	case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
	case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
	/* Memory of the graph's own pool: the driver's, saved by its checkpoint. */
	case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
	case CU_GRAPH_NODE_TYPE_MEM_FREE:
		return true;
	default: /* batch memory ops, conditionals, what is newer than this code */
		return false;
	}
}

/* Every node of g, nested depth levels down; false when one cannot be
 * decoded. */
static bool graph_access(struct access_set *s, CUgraph g, int depth)
{
	CUgraphNode *nodes;
	size_t count;
	bool ok = true;

	if (depth > GRAPH_MAX_DEPTH || graph_nodes(g, &nodes, &count) < 0)
		return false;
	for (size_t i = 0; i < count && ok; i++)
		ok = node_access(s, nodes[i], depth);
	free(nodes);
	return ok;
}

static bool kernel_access(struct access_set *s, CUfunction func, CUkernel kern, void **params, void **extra)
{
	return access_kernel(s, func ? func : (CUfunction)(void *)kern, params, extra);
}

/* The ranges node n (at nesting depth) reaches, appended to s; false when
 * it cannot be decoded. */
static bool node_access(struct access_set *s, CUgraphNode n, int depth)
{
	CUgraphNodeType type;

	if (!real.cuGraphNodeGetType || real.cuGraphNodeGetType(n, &type) != CUDA_SUCCESS)
		return false;
	switch (type) {
	case CU_GRAPH_NODE_TYPE_KERNEL: {
		CUDA_KERNEL_NODE_PARAMS_v2 p;

		memset(&p, 0, sizeof(p));
		if (!real.cuGraphKernelNodeGetParams_v2 || real.cuGraphKernelNodeGetParams_v2(n, &p) != CUDA_SUCCESS)
			return false;
		return kernel_access(s, p.func, p.kern, p.kernelParams, p.extra);
	}
	case CU_GRAPH_NODE_TYPE_MEMCPY: {
		CUDA_MEMCPY3D c;

		if (!real.cuGraphMemcpyNodeGetParams || real.cuGraphMemcpyNodeGetParams(n, &c) != CUDA_SUCCESS)
			return false;
		access_copy3d(s, &c);
		return true;
	}
	case CU_GRAPH_NODE_TYPE_MEMSET: {
		CUDA_MEMSET_NODE_PARAMS m;

		if (!real.cuGraphMemsetNodeGetParams || real.cuGraphMemsetNodeGetParams(n, &m) != CUDA_SUCCESS)
			return false;
		access_memset(s, m.dst, m.pitch, m.elementSize, m.width, m.height);
		return true;
	}
	case CU_GRAPH_NODE_TYPE_GRAPH: {
		CUgraph child;

		if (!real.cuGraphChildGraphNodeGetGraph || real.cuGraphChildGraphNodeGetGraph(n, &child) != CUDA_SUCCESS)
			return false;
		return graph_access(s, child, depth + 1);
	}
	default:
		return node_type_harmless(type);
	}
}

/* Moves the ranges of s into e (unbounded when there are too many). */
static void exec_take(struct graph_exec *e, struct access_set *s)
{
	if (s->unbounded)
		e->unbounded = true;
	if (s->n > GRAPH_MAX_RANGES) {
		e->unbounded = true;
		for (size_t i = 0; i < e->nseg; i++)
			e->seg[i].first = e->seg[i].n = 0;
		return;
	}
	if (!s->n)
		return;
	e->r = malloc(s->n * sizeof(*e->r));
	if (!e->r) {
		e->unbounded = true;
		for (size_t i = 0; i < e->nseg; i++)
			e->seg[i].first = e->seg[i].n = 0;
		return;
	}
	memcpy(e->r, s->r, s->n * sizeof(*e->r));
	e->nr = s->n;
}

/* The access set of exec, instantiated from g, by top-level node; NULL
 * without memory. */
static struct graph_exec *exec_build(CUgraphExec exec, CUgraph g)
{
	struct graph_exec *e = calloc(1, sizeof(*e));
	struct access_set s;
	CUgraphNode *nodes;
	size_t count;

	if (!e)
		return NULL;
	e->exec = exec;
	access_init(&s);
	if (graph_nodes(g, &nodes, &count) < 0 || (count && !(e->seg = calloc(count, sizeof(*e->seg))))) {
		e->unbounded = true;
		count = 0;
	}
	for (size_t i = 0; i < count; i++) {
		struct graph_seg *sg = &e->seg[e->nseg++];

		sg->node = nodes[i];
		sg->first = s.n;
		sg->unbounded = !node_access(&s, nodes[i], 0);
		sg->n = s.n - sg->first;
		e->nunbounded += sg->unbounded;
	}
	free(nodes);
	exec_take(e, &s);
	access_free(&s);
	return e;
}

/* Replaces the ranges of segment k of e by those of s; ok says whether
 * the node was decoded. */
static void seg_replace(struct graph_exec *e, size_t k, struct access_set *s, bool ok)
{
	struct graph_seg *sg = &e->seg[k];
	size_t nr = e->nr - sg->n + s->n, tail = e->nr - sg->first - sg->n;
	struct dag_range *r = NULL;

	ok = ok && !s->unbounded;
	e->nunbounded += (size_t)!ok - (size_t)sg->unbounded;
	sg->unbounded = !ok;
	if (nr > GRAPH_MAX_RANGES || (nr && !(r = malloc(nr * sizeof(*r))))) {
		e->unbounded = true; /* the old ranges stay, no longer the whole truth */
		return;
	}
	if (nr) {
		memcpy(r, e->r, sg->first * sizeof(*r));
		memcpy(r + sg->first, s->r, s->n * sizeof(*r));
		memcpy(r + sg->first + s->n, e->r + sg->first + sg->n, tail * sizeof(*r));
	}
	for (size_t i = k + 1; i < e->nseg; i++)
		e->seg[i].first = e->seg[i].first - sg->n + s->n;
	free(e->r);
	e->r = r;
	e->nr = nr;
	sg->n = s->n;
}

/* ---- the table ---------------------------------------------------------------
 * Open addressing keyed by the exec handle, linear probing, backward-shift
 * deletion; under graph_lock. */

static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static struct graph_exec **tab;
static size_t tab_size; /* a power of two >= 2 * max_execs */
static size_t max_execs = GRAPH_MAX_EXECS_DEFAULT, nexecs;
static uint64_t untracked;

static inline size_t slot_of(CUgraphExec x)
{
	return (size_t)(((uint64_t)(uintptr_t)x * 0x9e3779b97f4a7c15ull) >> 32) & (tab_size - 1);
}

static long tab_find(CUgraphExec x)
{
	if (!tab)
		return -1;
	for (size_t i = slot_of(x), n = 0; n < tab_size && tab[i]; n++, i = (i + 1) & (tab_size - 1))
		if (tab[i]->exec == x)
			return (long)i;
	return -1;
}

static struct graph_exec *tab_remove(CUgraphExec x)
{
	long at = tab_find(x);
	struct graph_exec *e;
	size_t i, j;

	if (at < 0)
		return NULL;
	i = j = (size_t)at;
	e = tab[i];
	tab[i] = NULL;
	for (;;) {
		size_t k;

		j = (j + 1) & (tab_size - 1);
		if (!tab[j])
			break;
		k = slot_of(tab[j]->exec);
		/* Moves back unless its home slot lies cyclically in (i, j]. */
		if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
			tab[i] = tab[j];
			tab[j] = NULL;
			i = j;
		}
	}
	nexecs--;
	return e;
}

static int tab_alloc(size_t max)
{
	size_t size = 1;

	while (size < 2 * max)
		size *= 2;
	free(tab);
	tab = calloc(size, sizeof(*tab));
	tab_size = tab ? size : 0;
	return tab ? 0 : -ENOMEM;
}

/* Adds e, replacing a stale entry of its handle: -ENOSPC when full. */
static int tab_insert(struct graph_exec *e)
{
	size_t i;

	exec_free(tab_remove(e->exec));
	if (!tab && tab_alloc(max_execs) < 0)
		return -ENOMEM;
	if (nexecs >= max_execs)
		return -ENOSPC;
	i = slot_of(e->exec);
	while (tab[i])
		i = (i + 1) & (tab_size - 1);
	tab[i] = e;
	nexecs++;
	return 0;
}

int graph_configure(size_t max)
{
	int err = 0;

	if (!max)
		max = GRAPH_MAX_EXECS_DEFAULT;
	pthread_mutex_lock(&graph_lock);
	if (nexecs)
		err = -EBUSY;
	else if (!(err = tab_alloc(max)))
		max_execs = max;
	pthread_mutex_unlock(&graph_lock);
	return err;
}

void graph_get_stats(struct graph_stats *ret)
{
	pthread_mutex_lock(&graph_lock);
	ret->execs = nexecs;
	ret->untracked = untracked;
	pthread_mutex_unlock(&graph_lock);
}

long graph_exec_ranges(CUgraphExec exec, bool *ret_unbounded, struct dag_range *ret, size_t max)
{
	long at, n = -ENOENT;

	pthread_mutex_lock(&graph_lock);
	at = tab_find(exec);
	if (at >= 0) {
		const struct graph_exec *e = tab[at];

		if (ret_unbounded)
			*ret_unbounded = exec_unbounded(e);
		if (ret)
			memcpy(ret, e->r, (e->nr < max ? e->nr : max) * sizeof(*ret));
		n = (long)e->nr;
	}
	pthread_mutex_unlock(&graph_lock);
	return n;
}

/* ---- what the wrappers do after the driver ------------------------------------ */

static __attribute__((noinline)) void track(CUgraphExec exec, CUgraph g)
{
	struct graph_exec *e = exec_build(exec, g);

	pthread_mutex_lock(&graph_lock);
	if (!e || tab_insert(e) < 0) {
		exec_free(e);
		exec_free(tab_remove(exec));
		if (!untracked++)
			pr_debug("executable graph %p not tracked (%zu in the table): its launches count as "
				 "unbounded\n", (void *)exec, nexecs);
	}
	pthread_mutex_unlock(&graph_lock);
}

static void forget(CUgraphExec exec)
{
	pthread_mutex_lock(&graph_lock);
	exec_free(tab_remove(exec));
	pthread_mutex_unlock(&graph_lock);
}

static __attribute__((noinline)) void record_launch(CUgraphExec exec, CUstream s)
{
	long at;

	pthread_mutex_lock(&graph_lock);
	at = tab_find(exec);
	if (at < 0) {
		dag_record_ranges(DAG_NODE_GRAPH, s, exec, DAG_NODE_F_UNBOUNDED, NULL, 0);
	} else {
		const struct graph_exec *e = tab[at];

		dag_record_ranges(DAG_NODE_GRAPH, s, exec, exec_unbounded(e) ? DAG_NODE_F_UNBOUNDED : 0, e->r, e->nr);
	}
	pthread_mutex_unlock(&graph_lock);
}

/* The per-chunk gate for a launch of exec (chunkgate.h): its ranges are
 * copied out, so that the wait holds no lock of the table. An exec not in
 * the table, or whose ranges cannot be copied, is unbounded. */
static void gate_launch(CUgraphExec exec)
{
	struct dag_range *r = NULL;
	bool unbounded = true;
	size_t n = 0;
	long at;

	pthread_mutex_lock(&graph_lock);
	at = tab_find(exec);
	if (at >= 0) {
		const struct graph_exec *e = tab[at];

		unbounded = exec_unbounded(e);
		if (!unbounded && e->nr) {
			r = malloc(e->nr * sizeof(*r));
			if (r) {
				memcpy(r, e->r, e->nr * sizeof(*r));
				n = e->nr;
			} else {
				unbounded = true;
			}
		}
	}
	pthread_mutex_unlock(&graph_lock);
	chunk_gate_graph(exec, r, n, unbounded);
	free(r);
}

/* Node node of exec has new parameters, whose ranges are in s (ok: it
 * could be decoded). A node that is not a top-level node of the graph
 * makes the exec unbounded. Frees s. */
static void node_update(CUgraphExec exec, CUgraphNode node, struct access_set *s, bool ok)
{
	long at;

	pthread_mutex_lock(&graph_lock);
	at = tab_find(exec);
	if (at >= 0) {
		struct graph_exec *e = tab[at];
		size_t k;

		for (k = 0; k < e->nseg && e->seg[k].node != node; k++)
			;
		if (k < e->nseg)
			seg_replace(e, k, s, ok);
		else
			e->unbounded = true;
	}
	pthread_mutex_unlock(&graph_lock);
	access_free(s);
}

static __attribute__((noinline)) void update_kernel(CUgraphExec exec, CUgraphNode node, CUfunction func,
						    CUkernel kern, void **params, void **extra)
{
	struct access_set s;
	bool ok;

	access_init(&s);
	ok = kernel_access(&s, func, kern, params, extra);
	node_update(exec, node, &s, ok);
}

static __attribute__((noinline)) void update_memcpy(CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D *c)
{
	struct access_set s;

	access_init(&s);
	access_copy3d(&s, c);
	node_update(exec, node, &s, true);
}

static __attribute__((noinline)) void update_memset(CUgraphExec exec, CUgraphNode node, CUdeviceptr dst,
						    size_t pitch, size_t esize, size_t width, size_t height)
{
	struct access_set s;

	access_init(&s);
	access_memset(&s, dst, pitch, esize, width, height);
	node_update(exec, node, &s, true);
}

static __attribute__((noinline)) void update_child(CUgraphExec exec, CUgraphNode node, CUgraph child)
{
	struct access_set s;
	bool ok;

	access_init(&s);
	ok = graph_access(&s, child, 1);
	node_update(exec, node, &s, ok);
}

static __attribute__((noinline)) void update_generic(CUgraphExec exec, CUgraphNode node, const CUgraphNodeParams *p)
{
	switch (p->type) {
	case CU_GRAPH_NODE_TYPE_KERNEL:
		update_kernel(exec, node, p->kernel.func, p->kernel.kern, p->kernel.kernelParams, p->kernel.extra);
		break;
	case CU_GRAPH_NODE_TYPE_MEMCPY:
		update_memcpy(exec, node, &p->memcpy.copyParams);
		break;
	case CU_GRAPH_NODE_TYPE_MEMSET:
		update_memset(exec, node, p->memset.dst, p->memset.pitch, p->memset.elementSize, p->memset.width,
			      p->memset.height);
		break;
	case CU_GRAPH_NODE_TYPE_GRAPH:
		update_child(exec, node, p->graph.graph);
		break;
	default: {
		/* Nothing new for the node types that reach no buffer; anything
		 * else may now write where the set does not say. */
		struct access_set s;

		access_init(&s);
		node_update(exec, node, &s, node_type_harmless(p->type));
	}
	}
}

/* ---- the wrappers ---------------------------------------------------------------
 * GRAPH_WRAP defines one: `before` runs before the driver is called,
 * `after` after it succeeded, both in terms of the parameters. */

#define GRAPH_WRAP(name, fntype, proto, args, before, after)             \
	SHIM_EXPORT CUresult name proto                                  \
	{                                                                \
		SHIM_KEEP_ERRNO;                                         \
		CUresult r_;                                             \
                                                                         \
		gate_pass();                                             \
		before;                                                  \
		r_ = REAL_WRAPPED_CALL(name, fntype, args);              \
		if (r_ == CUDA_SUCCESS)                                  \
			after;                                           \
		return r_;                                               \
	}

typedef CUresult (*inst_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
typedef CUresult (*inst_flags_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*inst_params_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult (*launch_fn)(CUgraphExec, CUstream);
typedef CUresult (*destroy_fn)(CUgraphExec);
typedef CUresult (*set_kernel_v1_fn)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v1 *);
typedef CUresult (*set_kernel_fn)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v2 *);
typedef CUresult (*set_memcpy_fn)(CUgraphExec, CUgraphNode, const CUDA_MEMCPY3D *, CUcontext);
typedef CUresult (*set_memset_fn)(CUgraphExec, CUgraphNode, const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
typedef CUresult (*set_child_fn)(CUgraphExec, CUgraphNode, CUgraph);
typedef CUresult (*set_node_fn)(CUgraphExec, CUgraphNode, CUgraphNodeParams *);
typedef CUresult (*update_v1_fn)(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *);
typedef CUresult (*update_fn)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);

#define NOTHING ((void)0)
#define TRACK() do { if (ph) track(*ph, g); } while (0)

GRAPH_WRAP(cuGraphInstantiate, inst_fn, (CUgraphExec *ph, CUgraph g, CUgraphNode *err, char *log, size_t size),
	   (ph, g, err, log, size), NOTHING, TRACK())
GRAPH_WRAP(cuGraphInstantiate_v2, inst_fn, (CUgraphExec *ph, CUgraph g, CUgraphNode *err, char *log, size_t size),
	   (ph, g, err, log, size), NOTHING, TRACK())
GRAPH_WRAP(cuGraphInstantiateWithFlags, inst_flags_fn, (CUgraphExec *ph, CUgraph g, unsigned long long flags),
	   (ph, g, flags), NOTHING, TRACK())
GRAPH_WRAP(cuGraphInstantiateWithParams, inst_params_fn,
	   (CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (ph, g, p), NOTHING, TRACK())
GRAPH_WRAP(cuGraphInstantiateWithParams_ptsz, inst_params_fn,
	   (CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (ph, g, p), NOTHING, TRACK())

/* A graph launch tests the decoding flag before the driver sees it, once:
 * while it is on, the slow path passes the per-chunk gate and records. */
#define GRAPH_LAUNCH_WRAP(name, stream)                                         \
	static __attribute__((noinline)) CUresult name##_slow(CUgraphExec exec, CUstream s) \
	{                                                                       \
		CUresult r_;                                                    \
                                                                                \
		if (chunk_gate_on())                                            \
			gate_launch(exec);                                      \
		r_ = REAL_WRAPPED_CALL(name, launch_fn, (exec, s));             \
		if (r_ == CUDA_SUCCESS)                                         \
			record_launch(exec, stream);                            \
		return r_;                                                      \
	}                                                                       \
	SHIM_EXPORT CUresult name(CUgraphExec exec, CUstream s)                 \
	{                                                                       \
		SHIM_KEEP_ERRNO;                                                \
                                                                                \
		gate_pass();                                                    \
		shim_count(SHIM_COUNT_GRAPHS);                                  \
		if (launch_decoding_on())                                       \
			return name##_slow(exec, s);                            \
		return REAL_WRAPPED_CALL(name, launch_fn, (exec, s));           \
	}

GRAPH_LAUNCH_WRAP(cuGraphLaunch, s)
GRAPH_LAUNCH_WRAP(cuGraphLaunch_ptsz, launch_ptsz_stream(s))

GRAPH_WRAP(cuGraphExecDestroy, destroy_fn, (CUgraphExec exec), (exec), forget(exec), NOTHING)

GRAPH_WRAP(cuGraphExecKernelNodeSetParams, set_kernel_v1_fn,
	   (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1 *p), (exec, node, p), NOTHING,
	   update_kernel(exec, node, p->func, NULL, p->kernelParams, p->extra))
GRAPH_WRAP(cuGraphExecKernelNodeSetParams_v2, set_kernel_fn,
	   (CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p), (exec, node, p), NOTHING,
	   update_kernel(exec, node, p->func, p->kern, p->kernelParams, p->extra))
GRAPH_WRAP(cuGraphExecMemcpyNodeSetParams, set_memcpy_fn,
	   (CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D *p, CUcontext ctx), (exec, node, p, ctx), NOTHING,
	   update_memcpy(exec, node, p))
GRAPH_WRAP(cuGraphExecMemsetNodeSetParams, set_memset_fn,
	   (CUgraphExec exec, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx), (exec, node, p, ctx),
	   NOTHING, update_memset(exec, node, p->dst, p->pitch, p->elementSize, p->width, p->height))
GRAPH_WRAP(cuGraphExecChildGraphNodeSetParams, set_child_fn, (CUgraphExec exec, CUgraphNode node, CUgraph child),
	   (exec, node, child), NOTHING, update_child(exec, node, child))
GRAPH_WRAP(cuGraphExecNodeSetParams, set_node_fn, (CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *p),
	   (exec, node, p), NOTHING, update_generic(exec, node, p))

GRAPH_WRAP(cuGraphExecUpdate, update_v1_fn,
	   (CUgraphExec exec, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res), (exec, g, err, res),
	   NOTHING, track(exec, g))
GRAPH_WRAP(cuGraphExecUpdate_v2, update_fn, (CUgraphExec exec, CUgraph g, CUgraphExecUpdateResultInfo *info),
	   (exec, g, info), NOTHING, track(exec, g))
