/* fakecuda stream: streams and events.  All work completes inside the call
 * that issues it, so queries report done, synchronizing returns at once and
 * host callbacks run on the calling thread; the handles are still real
 * objects that are validated on every use.  Events record a monotonic
 * timestamp so cuEventElapsedTime measures host time between records. */
#include <time.h>

#include "internal.h"

struct CUstream_st {
	uint32_t magic;
	struct CUctx_st *ctx;
	unsigned int flags;
	int priority;
	unsigned long long id;
};

struct CUevent_st {
	uint32_t magic;
	unsigned int flags;
	int recorded;
	struct timespec when;
};

static int stream_live(const struct CUstream_st *s)
{
	return s && s->magic == FK_STREAM;
}

static int event_live(const struct CUevent_st *e)
{
	return e && e->magic == FK_EVENT;
}

CUresult fk_stream_check(CUstream s)
{
	if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || stream_live(s))
		return CUDA_SUCCESS;
	return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult stream_create(CUstream *ph, unsigned int flags, int priority)
{
	struct CUctx_st *c = fk_ctx_current();
	struct CUstream_st *s;

	if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	s = fk_obj_alloc(sizeof(*s));
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s->magic = FK_STREAM;
	s->ctx = c;
	s->flags = flags;
	/* Clamped to cuCtxGetStreamPriorityRange's [-5, 0], as the driver does. */
	s->priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
	s->id = fk_next_id();
	*ph = s;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	FK_ENTER();
	return stream_create(phStream, Flags, 0);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	FK_ENTER();
	return stream_create(phStream, flags, priority);
}

static CUresult stream_destroy(CUstream s)
{
	if (!stream_live(s))
		return CUDA_ERROR_INVALID_HANDLE;
	s->magic = FK_DEAD;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
	FK_ENTER();
	return stream_destroy(hStream);
}

FK_LEGACY(CUresult, fk_cuStreamDestroy_v1, "cuStreamDestroy", (CUstream hStream))
{
	FK_ENTER_AS("cuStreamDestroy");
	return stream_destroy(hStream);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	FK_ENTER();
	return fk_stream_check(hStream);
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	FK_ENTER();
	return fk_stream_check(hStream);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	CUresult rc;

	FK_ENTER();
	(void)Flags;
	rc = fk_stream_check(hStream);
	if (rc != CUDA_SUCCESS)
		return rc;
	return event_live(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int *priority)
{
	CUresult rc;

	FK_ENTER();
	if (!priority)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc == CUDA_SUCCESS)
		*priority = stream_live(hStream) ? hStream->priority : 0;
	return rc;
}

CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
	CUresult rc;

	FK_ENTER();
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc == CUDA_SUCCESS)
		*flags = stream_live(hStream) ? hStream->flags : 0;
	return rc;
}

CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
	CUresult rc;

	FK_ENTER();
	if (!streamId)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc == CUDA_SUCCESS)
		*streamId = stream_live(hStream) ? hStream->id : (unsigned long long)(uintptr_t)hStream;
	return rc;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
	CUresult rc;

	FK_ENTER();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc != CUDA_SUCCESS)
		return rc;
	*pctx = stream_live(hStream) ? hStream->ctx : fk_ctx_current();
	return *pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuStreamGetDevice(CUstream hStream, CUdevice *device)
{
	struct CUctx_st *c;
	CUresult rc;

	FK_ENTER();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc != CUDA_SUCCESS)
		return rc;
	c = stream_live(hStream) ? hStream->ctx : fk_ctx_current();
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = c->dev;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData,
				     unsigned int flags)
{
	CUresult rc;

	FK_ENTER();
	if (!callback || flags)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc == CUDA_SUCCESS)
		callback(hStream, CUDA_SUCCESS, userData);
	return rc;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	CUresult rc;

	FK_ENTER();
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_stream_check(hStream);
	if (rc == CUDA_SUCCESS)
		fn(userData);
	return rc;
}

/* ---- events ---- */

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	struct CUevent_st *e;

	FK_ENTER();
	if (!phEvent || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)))
		return CUDA_ERROR_INVALID_VALUE;
	if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_VALUE;
	if (!fk_ctx_ok(fk_ctx_current()))
		return CUDA_ERROR_INVALID_CONTEXT;
	e = fk_obj_alloc(sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = FK_EVENT;
	e->flags = Flags;
	*phEvent = e;
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s)
{
	CUresult rc;

	if (!event_live(e))
		return CUDA_ERROR_INVALID_HANDLE;
	rc = fk_stream_check(s);
	if (rc != CUDA_SUCCESS)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &e->when);
	e->recorded = 1;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
	FK_ENTER();
	return event_record(hEvent, hStream);
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	FK_ENTER();
	(void)flags;
	return event_record(hEvent, hStream);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
	FK_ENTER();
	return event_live(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
	FK_ENTER();
	return event_live(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult event_destroy(CUevent e)
{
	if (!event_live(e))
		return CUDA_ERROR_INVALID_HANDLE;
	e->magic = FK_DEAD;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
	FK_ENTER();
	return event_destroy(hEvent);
}

FK_LEGACY(CUresult, fk_cuEventDestroy_v1, "cuEventDestroy", (CUevent hEvent))
{
	FK_ENTER_AS("cuEventDestroy");
	return event_destroy(hEvent);
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	if (!event_live(a) || !event_live(b) || !a->recorded || !b->recorded ||
	    ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_HANDLE;
	*ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
		      (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	FK_ENTER();
	return elapsed(pMilliseconds, hStart, hEnd);
}

FK_LEGACY(CUresult, fk_cuEventElapsedTime_v1, "cuEventElapsedTime", (float *pMilliseconds, CUevent hStart, CUevent hEnd))
{
	FK_ENTER_AS("cuEventElapsedTime");
	return elapsed(pMilliseconds, hStart, hEnd);
}
