/* fakecuda context: primary and created contexts, the per-thread context
 * stack, and the context queries (device, flags, id, limits, priorities).
 * Nothing runs asynchronously, so synchronizing is a no-op. */
#include "internal.h"

#define FK_CTX_STACK 64

static __thread struct CUctx_st *ctx_stack[FK_CTX_STACK];
static __thread int ctx_depth;

static size_t limits[CU_LIMIT_MAX] = {
	[CU_LIMIT_STACK_SIZE] = 1024,
	[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20,
	[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20,
	[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2,
	[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048,
	[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64,
};

struct CUctx_st *fk_ctx_current(void)
{
	return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

int fk_ctx_ok(const struct CUctx_st *c)
{
	return c && c->magic == FK_CTX;
}

static struct CUctx_st *ctx_new(CUdevice dev, unsigned int flags, int primary)
{
	struct CUctx_st *c = fk_obj_alloc(sizeof(*c));

	if (!c)
		return NULL;
	c->magic = FK_CTX;
	c->dev = dev;
	c->flags = flags;
	c->primary = primary;
	c->id = fk_next_id();
	return c;
}

CUresult fk_ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct CUctx_st *c;

	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (ctx_depth == FK_CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c = ctx_new(dev, flags, 0);
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = c;
	*pctx = c;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
			     CUdevice dev)
{
	FK_ENTER();
	if (ctxCreateParams && ctxCreateParams->cigParams)
		return CUDA_ERROR_NOT_SUPPORTED;
	return fk_ctx_create(pctx, flags, dev);
}

FK_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
					  unsigned int flags, CUdevice dev);
FK_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
					  unsigned int flags, CUdevice dev)
{
	FK_ENTER();
	(void)paramsArray;
	(void)numParams;
	return fk_ctx_create(pctx, flags, dev);
}

FK_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
FK_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FK_ENTER();
	return fk_ctx_create(pctx, flags, dev);
}

FK_LEGACY(CUresult, fk_cuCtxCreate_v1, "cuCtxCreate", (CUcontext *pctx, unsigned int flags, CUdevice dev))
{
	FK_ENTER_AS("cuCtxCreate");
	return fk_ctx_create(pctx, flags, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
	if (!fk_ctx_ok(ctx) || ctx->primary)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* Unbind it from this thread; other threads' stacks are theirs. */
	for (int i = 0; i < ctx_depth; i++) {
		if (ctx_stack[i] != ctx)
			continue;
		for (int j = i; j + 1 < ctx_depth; j++)
			ctx_stack[j] = ctx_stack[j + 1];
		ctx_depth--;
		i--;
	}
	ctx->magic = FK_DEAD;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
	FK_ENTER();
	return ctx_destroy(ctx);
}

FK_LEGACY(CUresult, fk_cuCtxDestroy_v1, "cuCtxDestroy", (CUcontext ctx))
{
	FK_ENTER_AS("cuCtxDestroy");
	return ctx_destroy(ctx);
}

static CUresult ctx_push(CUcontext ctx)
{
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == FK_CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

static CUresult ctx_pop(CUcontext *pctx)
{
	if (!ctx_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx_depth--;
	if (pctx)
		*pctx = ctx_stack[ctx_depth];
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	FK_ENTER();
	return ctx_push(ctx);
}

FK_LEGACY(CUresult, fk_cuCtxPushCurrent_v1, "cuCtxPushCurrent", (CUcontext ctx))
{
	FK_ENTER_AS("cuCtxPushCurrent");
	return ctx_push(ctx);
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
	FK_ENTER();
	return ctx_pop(pctx);
}

FK_LEGACY(CUresult, fk_cuCtxPopCurrent_v1, "cuCtxPopCurrent", (CUcontext *pctx))
{
	FK_ENTER_AS("cuCtxPopCurrent");
	return ctx_pop(pctx);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	FK_ENTER();
	if (!ctx) {
		if (ctx_depth)
			ctx_depth--;
		return CUDA_SUCCESS;
	}
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth)
		ctx_stack[ctx_depth - 1] = ctx;
	else
		ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	FK_ENTER();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = fk_ctx_current();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
	struct CUctx_st *c = fk_ctx_current();

	FK_ENTER();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = c->dev;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
	FK_ENTER();
	if (!ctx)
		ctx = fk_ctx_current();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = ctx->dev;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags)
{
	struct CUctx_st *c = fk_ctx_current();

	FK_ENTER();
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	*flags = c->flags;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetFlags(unsigned int flags)
{
	struct CUctx_st *c = fk_ctx_current();

	FK_ENTER();
	if (!fk_ctx_ok(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	c->flags = flags;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
	FK_ENTER();
	if (!ctx)
		ctx = fk_ctx_current();
	if (!ctxId)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	*ctxId = ctx->id;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	FK_ENTER();
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
	FK_ENTER();
	if (!ctx)
		ctx = fk_ctx_current();
	if (!fk_ctx_ok(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
	FK_ENTER();
	if (!pvalue || (unsigned)limit >= CU_LIMIT_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	fk_lock_take();
	*pvalue = limits[limit];
	fk_lock_drop();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value)
{
	FK_ENTER();
	if ((unsigned)limit >= CU_LIMIT_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	fk_lock_take();
	limits[limit] = value;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
	FK_ENTER();
	if (leastPriority)
		*leastPriority = 0;
	if (greatestPriority)
		*greatestPriority = -5;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	FK_ENTER();
	if (!fk_ctx_ok(peerContext) || Flags)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
	FK_ENTER();
	if (!fk_ctx_ok(peerContext))
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

/* ---- primary contexts ---- */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	FK_ENTER();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fk_lock_take();
	if (!fk.dev[dev].primary)
		fk.dev[dev].primary = ctx_new(dev, 0, 1);
	if (fk.dev[dev].primary) {
		fk.dev[dev].primary->refs++;
		*pctx = fk.dev[dev].primary;
	} else {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	}
	fk_lock_drop();
	return rc;
}

static CUresult primary_release(CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fk_lock_take();
	if (!fk.dev[dev].primary || fk.dev[dev].primary->refs == 0)
		rc = CUDA_ERROR_INVALID_CONTEXT;
	else
		fk.dev[dev].primary->refs--;
	fk_lock_drop();
	return rc;
}

/* Reset drops every retain.  Unlike the driver it does not free the memory
 * allocated in the context: tests own their allocations. */
static CUresult primary_reset(CUdevice dev)
{
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fk_lock_take();
	if (fk.dev[dev].primary)
		fk.dev[dev].primary->refs = 0;
	fk_lock_drop();
	return CUDA_SUCCESS;
}

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fk_lock_take();
	if (!fk.dev[dev].primary)
		fk.dev[dev].primary = ctx_new(dev, 0, 1);
	if (fk.dev[dev].primary)
		fk.dev[dev].primary->flags = flags;
	fk_lock_drop();
	return fk.dev[dev].primary ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	FK_ENTER();
	return primary_release(dev);
}

FK_LEGACY(CUresult, fk_cuDevicePrimaryCtxRelease_v1, "cuDevicePrimaryCtxRelease", (CUdevice dev))
{
	FK_ENTER_AS("cuDevicePrimaryCtxRelease");
	return primary_release(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
	FK_ENTER();
	return primary_reset(dev);
}

FK_LEGACY(CUresult, fk_cuDevicePrimaryCtxReset_v1, "cuDevicePrimaryCtxReset", (CUdevice dev))
{
	FK_ENTER_AS("cuDevicePrimaryCtxReset");
	return primary_reset(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
	FK_ENTER();
	return primary_set_flags(dev, flags);
}

FK_LEGACY(CUresult, fk_cuDevicePrimaryCtxSetFlags_v1, "cuDevicePrimaryCtxSetFlags",
	  (CUdevice dev, unsigned int flags))
{
	FK_ENTER_AS("cuDevicePrimaryCtxSetFlags");
	return primary_set_flags(dev, flags);
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	FK_ENTER();
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fk_lock_take();
	*flags = fk.dev[dev].primary ? fk.dev[dev].primary->flags : 0;
	*active = fk.dev[dev].primary && fk.dev[dev].primary->refs > 0;
	fk_lock_drop();
	return CUDA_SUCCESS;
}
