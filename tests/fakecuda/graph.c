/* fakecuda graph: CUDA graphs of kernel, memcpy, memset, empty and
 * child-graph nodes; instantiation copies them into an executable graph
 * that cuGraphLaunch runs in the calling thread, node after node in the
 * order they were added (dependencies must name earlier nodes, so that
 * order is a topological one; edges are kept only as that promise).
 * Executable graphs take new node parameters (cuGraphExec*SetParams) and
 * whole updates (cuGraphExecUpdate, when the graph has the same number and
 * types of top-level nodes).  Kernel node parameters are copied at add time
 * by the kernel's registered layout, as the driver copies them.  Objects
 * come from fk_obj_alloc and are never freed (destroyed ones are marked
 * dead). */
#include <string.h>

#include "internal.h"

struct fk_kernel_node {
	CUfunction func;
	unsigned int grid[3], block[3], shmem;
	void **params;  /* pointers into buf, one per parameter */
	char *buf;
};

struct CUgraphNode_st {
	uint32_t magic;
	CUgraphNodeType type;
	union {
		struct fk_kernel_node k;
		CUDA_MEMCPY3D cp;
		CUDA_MEMSET_NODE_PARAMS ms;
		struct CUgraph_st *child;
	} u;
	struct CUgraphNode_st *orig;  /* in an executable graph: the node it came from */
};

struct CUgraph_st {
	uint32_t magic;
	size_t n, cap;
	struct CUgraphNode_st **nodes;
};

struct CUgraphExec_st {
	uint32_t magic;
	struct CUgraph_st *g;  /* a private copy */
};

static int graph_ok(const struct CUgraph_st *g)
{
	return g && g->magic == FK_GRAPH;
}

static int node_ok(const struct CUgraphNode_st *n)
{
	return n && n->magic == FK_GRAPH_NODE;
}

static int exec_ok(const struct CUgraphExec_st *e)
{
	return e && e->magic == FK_GRAPH_EXEC;
}

static struct CUgraph_st *graph_new(void)
{
	struct CUgraph_st *g = fk_obj_alloc(sizeof(*g));

	if (g)
		g->magic = FK_GRAPH;
	return g;
}

static CUresult graph_append(struct CUgraph_st *g, struct CUgraphNode_st *n)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 8;
		struct CUgraphNode_st **v = fk_obj_alloc(cap * sizeof(*v));

		if (!v)
			return CUDA_ERROR_OUT_OF_MEMORY;
		if (g->n)
			memcpy(v, g->nodes, g->n * sizeof(*v));
		g->nodes = v;  /* the old array stays allocated, unused */
		g->cap = cap;
	}
	g->nodes[g->n++] = n;
	return CUDA_SUCCESS;
}

/* Kernel parameters as the driver keeps them: values copied by the layout. */
static CUresult kernel_set(struct fk_kernel_node *k, const CUDA_KERNEL_NODE_PARAMS *p)
{
	const size_t *off, *size;
	size_t argbytes;
	int nparams;
	CUresult rc;

	if (!p || p->extra || (!p->func && !p->kern))
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_func_layout(p->func ? p->func : (CUfunction)(void *)p->kern, &nparams, &off, &size, &argbytes);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (nparams && !p->kernelParams)
		return CUDA_ERROR_INVALID_VALUE;
	k->func = p->func ? p->func : (CUfunction)(void *)p->kern;
	k->grid[0] = p->gridDimX;
	k->grid[1] = p->gridDimY;
	k->grid[2] = p->gridDimZ;
	k->block[0] = p->blockDimX;
	k->block[1] = p->blockDimY;
	k->block[2] = p->blockDimZ;
	k->shmem = p->sharedMemBytes;
	k->params = NULL;
	k->buf = NULL;
	if (!nparams)
		return CUDA_SUCCESS;
	k->params = fk_obj_alloc((size_t)nparams * sizeof(*k->params));
	k->buf = fk_obj_alloc(argbytes);
	if (!k->params || !k->buf)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (int i = 0; i < nparams; i++) {
		memcpy(k->buf + off[i], p->kernelParams[i], size[i]);
		k->params[i] = k->buf + off[i];
	}
	return CUDA_SUCCESS;
}

static CUresult memset_check(const CUDA_MEMSET_NODE_PARAMS *p)
{
	if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) || !p->width || !p->height)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

static CUresult node_add(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraphNodeType type,
			 struct CUgraphNode_st **ret)
{
	struct CUgraphNode_st *n;

	if (!ph || !graph_ok(g) || (ndeps && !deps))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < ndeps; i++) {
		size_t k;

		for (k = 0; k < g->n && g->nodes[k] != deps[i]; k++)
			;
		if (k == g->n)
			return CUDA_ERROR_INVALID_VALUE;
	}
	n = fk_obj_alloc(sizeof(*n));
	if (!n)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n->magic = FK_GRAPH_NODE;
	n->type = type;
	*ret = n;
	return CUDA_SUCCESS;
}

static CUresult node_commit(CUgraphNode *ph, CUgraph g, struct CUgraphNode_st *n)
{
	CUresult rc = graph_append(g, n);

	if (rc == CUDA_SUCCESS)
		*ph = n;
	else
		n->magic = FK_DEAD;
	return rc;
}

/* A deep copy of g, nodes remembering where they came from. */
static struct CUgraph_st *graph_clone(const struct CUgraph_st *g);

static CUresult node_copy(struct CUgraphNode_st *dst, const struct CUgraphNode_st *src)
{
	*dst = *src;
	dst->orig = (struct CUgraphNode_st *)src;
	if (src->type == CU_GRAPH_NODE_TYPE_GRAPH) {
		dst->u.child = graph_clone(src->u.child);
		if (!dst->u.child)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	/* Kernel parameter buffers are never changed in place, so sharing is safe. */
	return CUDA_SUCCESS;
}

static struct CUgraph_st *graph_clone(const struct CUgraph_st *g)
{
	struct CUgraph_st *c = graph_new();

	if (!c)
		return NULL;
	for (size_t i = 0; i < g->n; i++) {
		struct CUgraphNode_st *n = fk_obj_alloc(sizeof(*n));

		if (!n || node_copy(n, g->nodes[i]) != CUDA_SUCCESS || graph_append(c, n) != CUDA_SUCCESS)
			return NULL;
	}
	return c;
}

/* ---- building graphs ---- */

CUresult CUDAAPI cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
	FK_ENTER();
	if (!phGraph || flags)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	*phGraph = graph_new();
	fk_lock_drop();
	return *phGraph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
	FK_ENTER();
	fk_lock_take();
	if (!graph_ok(hGraph)) {
		fk_lock_drop();
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (size_t i = 0; i < hGraph->n; i++)
		hGraph->nodes[i]->magic = FK_DEAD;
	hGraph->magic = FK_DEAD;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
				      size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
	struct CUgraphNode_st *n;
	CUresult rc;

	FK_ENTER();
	fk_lock_take();
	rc = node_add(phGraphNode, hGraph, dependencies, numDependencies, CU_GRAPH_NODE_TYPE_KERNEL, &n);
	fk_lock_drop();
	if (rc == CUDA_SUCCESS)
		rc = kernel_set(&n->u.k, nodeParams);  /* takes fk_lock itself */
	if (rc != CUDA_SUCCESS)
		return rc;
	fk_lock_take();
	rc = node_commit(phGraphNode, hGraph, n);
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
				      size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx)
{
	struct CUgraphNode_st *n;
	CUresult rc;

	FK_ENTER();
	if (!copyParams || !fk_ctx_ok(ctx))
		return !copyParams ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT;
	fk_lock_take();
	rc = node_add(phGraphNode, hGraph, dependencies, numDependencies, CU_GRAPH_NODE_TYPE_MEMCPY, &n);
	if (rc == CUDA_SUCCESS) {
		n->u.cp = *copyParams;
		rc = node_commit(phGraphNode, hGraph, n);
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
				      size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams,
				      CUcontext ctx)
{
	struct CUgraphNode_st *n;
	CUresult rc;

	FK_ENTER();
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	rc = memset_check(memsetParams);
	if (rc != CUDA_SUCCESS)
		return rc;
	fk_lock_take();
	rc = node_add(phGraphNode, hGraph, dependencies, numDependencies, CU_GRAPH_NODE_TYPE_MEMSET, &n);
	if (rc == CUDA_SUCCESS) {
		n->u.ms = *memsetParams;
		rc = node_commit(phGraphNode, hGraph, n);
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
					  size_t numDependencies, CUgraph childGraph)
{
	struct CUgraphNode_st *n;
	CUresult rc;

	FK_ENTER();
	fk_lock_take();
	if (!graph_ok(childGraph) || childGraph == hGraph) {
		fk_lock_drop();
		return CUDA_ERROR_INVALID_VALUE;
	}
	rc = node_add(phGraphNode, hGraph, dependencies, numDependencies, CU_GRAPH_NODE_TYPE_GRAPH, &n);
	if (rc == CUDA_SUCCESS) {
		/* The driver clones the child into the node. */
		n->u.child = graph_clone(childGraph);
		rc = n->u.child ? node_commit(phGraphNode, hGraph, n) : CUDA_ERROR_OUT_OF_MEMORY;
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
				     size_t numDependencies)
{
	struct CUgraphNode_st *n;
	CUresult rc;

	FK_ENTER();
	fk_lock_take();
	rc = node_add(phGraphNode, hGraph, dependencies, numDependencies, CU_GRAPH_NODE_TYPE_EMPTY, &n);
	if (rc == CUDA_SUCCESS)
		rc = node_commit(phGraphNode, hGraph, n);
	fk_lock_drop();
	return rc;
}

/* ---- queries ---- */

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
	FK_ENTER();
	if (!numNodes)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	if (!graph_ok(hGraph)) {
		fk_lock_drop();
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (nodes) {
		size_t n = *numNodes < hGraph->n ? *numNodes : hGraph->n;

		memcpy(nodes, hGraph->nodes, n * sizeof(*nodes));
		for (size_t i = n; i < *numNodes; i++)
			nodes[i] = NULL;
		*numNodes = n;
	} else {
		*numNodes = hGraph->n;
	}
	fk_lock_drop();
	return CUDA_SUCCESS;
}

/* Node h of the wanted type (any when type < 0), or NULL. */
static struct CUgraphNode_st *node_of(CUgraphNode h, int type)
{
	return node_ok(h) && (type < 0 || h->type == (CUgraphNodeType)type) ? h : NULL;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
	FK_ENTER();
	if (!type || !node_of(hNode, -1))
		return CUDA_ERROR_INVALID_VALUE;
	*type = hNode->type;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeGetParams(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
	struct CUgraphNode_st *n = node_of(hNode, CU_GRAPH_NODE_TYPE_KERNEL);

	FK_ENTER();
	if (!n || !nodeParams)
		return CUDA_ERROR_INVALID_VALUE;
	memset(nodeParams, 0, sizeof(*nodeParams));
	nodeParams->func = n->u.k.func;
	nodeParams->gridDimX = n->u.k.grid[0];
	nodeParams->gridDimY = n->u.k.grid[1];
	nodeParams->gridDimZ = n->u.k.grid[2];
	nodeParams->blockDimX = n->u.k.block[0];
	nodeParams->blockDimY = n->u.k.block[1];
	nodeParams->blockDimZ = n->u.k.block[2];
	nodeParams->sharedMemBytes = n->u.k.shmem;
	nodeParams->kernelParams = n->u.k.params;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode hNode, CUDA_MEMCPY3D *nodeParams)
{
	struct CUgraphNode_st *n = node_of(hNode, CU_GRAPH_NODE_TYPE_MEMCPY);

	FK_ENTER();
	if (!n || !nodeParams)
		return CUDA_ERROR_INVALID_VALUE;
	*nodeParams = n->u.cp;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode hNode, CUDA_MEMSET_NODE_PARAMS *nodeParams)
{
	struct CUgraphNode_st *n = node_of(hNode, CU_GRAPH_NODE_TYPE_MEMSET);

	FK_ENTER();
	if (!n || !nodeParams)
		return CUDA_ERROR_INVALID_VALUE;
	*nodeParams = n->u.ms;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
	struct CUgraphNode_st *n = node_of(hNode, CU_GRAPH_NODE_TYPE_GRAPH);

	FK_ENTER();
	if (!n || !phGraph)
		return CUDA_ERROR_INVALID_VALUE;
	*phGraph = n->u.child;
	return CUDA_SUCCESS;
}

/* ---- executable graphs ---- */

static CUresult instantiate(CUgraphExec *ph, CUgraph g)
{
	struct CUgraphExec_st *e;

	if (!ph)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	if (!graph_ok(g)) {
		fk_lock_drop();
		return CUDA_ERROR_INVALID_VALUE;
	}
	e = fk_obj_alloc(sizeof(*e));
	if (e)
		e->g = graph_clone(g);
	if (e && e->g) {
		e->magic = FK_GRAPH_EXEC;
		*ph = e;
	}
	fk_lock_drop();
	return e && e->g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	FK_ENTER();
	(void)flags;
	return instantiate(phGraphExec, hGraph);
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
					      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	CUresult rc;

	FK_ENTER();
	if (!instantiateParams)
		return CUDA_ERROR_INVALID_VALUE;
	rc = instantiate(phGraphExec, hGraph);
	instantiateParams->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
	instantiateParams->hErrNode_out = NULL;
	return rc;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	FK_ENTER();
	fk_lock_take();
	if (!exec_ok(hGraphExec)) {
		fk_lock_drop();
		return CUDA_ERROR_INVALID_VALUE;
	}
	hGraphExec->magic = FK_DEAD;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

/* Runs g's nodes in order in the calling thread (fk_lock not held: kernels
 * are test code). */
static CUresult run(const struct CUgraph_st *g, CUstream s)
{
	CUresult rc = CUDA_SUCCESS;

	for (size_t i = 0; i < g->n && rc == CUDA_SUCCESS; i++) {
		const struct CUgraphNode_st *n = g->nodes[i];

		switch (n->type) {
		case CU_GRAPH_NODE_TYPE_KERNEL:
			rc = fk_launch(n->u.k.func, n->u.k.grid, n->u.k.block, n->u.k.shmem, s, n->u.k.params, NULL);
			break;
		case CU_GRAPH_NODE_TYPE_MEMCPY:
			rc = fk_copy3d(&n->u.cp);
			break;
		case CU_GRAPH_NODE_TYPE_MEMSET:
			rc = fk_fill(n->u.ms.dst, n->u.ms.pitch, n->u.ms.value, n->u.ms.elementSize, n->u.ms.width,
				     n->u.ms.height);
			break;
		case CU_GRAPH_NODE_TYPE_GRAPH:
			rc = run(n->u.child, s);
			break;
		default:
			break;
		}
	}
	return rc;
}

static CUresult launch(CUgraphExec e, CUstream s)
{
	if (!exec_ok(e))
		return CUDA_ERROR_INVALID_VALUE;
	return fk_stream_check(s) ?: run(e->g, s);
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	FK_ENTER();
	return launch(hGraphExec, hStream);
}

FK_LEGACY(CUresult, fk_cuGraphLaunch_ptsz, "cuGraphLaunch_ptsz", (CUgraphExec hGraphExec, CUstream hStream))
{
	FK_ENTER_AS("cuGraphLaunch_ptsz");
	return launch(hGraphExec, hStream);
}

/* The node of e that was instantiated from hNode (top level only), of
 * that type, or NULL. */
static struct CUgraphNode_st *exec_node(CUgraphExec e, CUgraphNode hNode, CUgraphNodeType type)
{
	if (!exec_ok(e))
		return NULL;
	for (size_t i = 0; i < e->g->n; i++)
		if (e->g->nodes[i]->orig == hNode)
			return e->g->nodes[i]->type == type ? e->g->nodes[i] : NULL;
	return NULL;
}

CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
						const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
	struct CUgraphNode_st *n;
	struct fk_kernel_node k;
	CUresult rc;

	FK_ENTER();
	fk_lock_take();
	n = exec_node(hGraphExec, hNode, CU_GRAPH_NODE_TYPE_KERNEL);
	fk_lock_drop();
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	rc = kernel_set(&k, nodeParams);
	if (rc == CUDA_SUCCESS) {
		fk_lock_take();
		n->u.k = k;
		fk_lock_drop();
	}
	return rc;
}

CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
						const CUDA_MEMCPY3D *copyParams, CUcontext ctx)
{
	struct CUgraphNode_st *n;

	FK_ENTER();
	if (!copyParams || !fk_ctx_ok(ctx))
		return !copyParams ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_CONTEXT;
	fk_lock_take();
	n = exec_node(hGraphExec, hNode, CU_GRAPH_NODE_TYPE_MEMCPY);
	if (n)
		n->u.cp = *copyParams;
	fk_lock_drop();
	return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
						const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)
{
	struct CUgraphNode_st *n;

	FK_ENTER();
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (memset_check(memsetParams) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	n = exec_node(hGraphExec, hNode, CU_GRAPH_NODE_TYPE_MEMSET);
	if (n)
		n->u.ms = *memsetParams;
	fk_lock_drop();
	return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode, CUgraph childGraph)
{
	struct CUgraphNode_st *n;
	struct CUgraph_st *c = NULL;

	FK_ENTER();
	fk_lock_take();
	n = exec_node(hGraphExec, hNode, CU_GRAPH_NODE_TYPE_GRAPH);
	if (n && graph_ok(childGraph))
		c = graph_clone(childGraph);
	if (c)
		n->u.child = c;
	fk_lock_drop();
	return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The update succeeds when hGraph has as many top-level nodes of the same
 * types, in order; the executable graph then runs hGraph's nodes. */
static CUresult update(CUgraphExec e, CUgraph g)
{
	struct CUgraph_st *c;
	CUresult rc = CUDA_SUCCESS;

	fk_lock_take();
	if (!exec_ok(e) || !graph_ok(g)) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (g->n != e->g->n) {
		rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
	} else {
		for (size_t i = 0; i < g->n && rc == CUDA_SUCCESS; i++)
			if (g->nodes[i]->type != e->g->nodes[i]->type)
				rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
		if (rc == CUDA_SUCCESS) {
			c = graph_clone(g);
			if (c)
				e->g = c;
			else
				rc = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	fk_lock_drop();
	return rc;
}

CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
	CUresult rc;

	FK_ENTER();
	rc = update(hGraphExec, hGraph);
	if (resultInfo) {
		memset(resultInfo, 0, sizeof(*resultInfo));
		resultInfo->result = rc == CUDA_SUCCESS ? CU_GRAPH_EXEC_UPDATE_SUCCESS : CU_GRAPH_EXEC_UPDATE_ERROR;
	}
	return rc;
}
