/* Stream-ordered allocation: cuMemAllocAsync, cuMemAllocFromPoolAsync and
 * cuMemFreeAsync, each with its per-thread-default-stream (_ptsz) variant.
 *
 * Allocation from the device's default pool becomes gpucr's memory at once;
 * a free records an event on the stream and the memory goes back when the
 * event completes (alloc.h says why). Left to the driver: pools the
 * application configured (another pool made current, or passed explicitly),
 * whose properties gpucr does not reproduce, and anything on a capturing
 * stream, where the driver puts allocation and free nodes into the graph. A
 * free of gpucr's memory during capture cannot become a graph node: the
 * memory is then kept until the process ends (the application no longer
 * uses it, and a graph may be replayed any number of times). */
#include "alloc.h"
#include "buftab.h"
#include "gate.h"
#include "real.h"

/* 1 capturing, 0 not, -1 the stream cannot be asked (the driver will say
 * why when it gets the call). A driver without stream capture cannot be
 * capturing. */
static int capture_state(CUstream s, bool ptsz)
{
	__typeof__(real.cuStreamIsCapturing) fn = ptsz && real.cuStreamIsCapturing_ptsz
							  ? real.cuStreamIsCapturing_ptsz
							  : real.cuStreamIsCapturing;
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	CUresult r;

	if (!fn)
		return 0;
	r = fn(s, &st);
	if (r == CUDA_ERROR_NOT_SUPPORTED)
		return 0;
	if (r != CUDA_SUCCESS)
		return -1;
	return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static CUresult stream_device(CUstream s, bool ptsz, CUdevice *ret)
{
	__typeof__(real.cuStreamGetDevice) fn = ptsz && real.cuStreamGetDevice_ptsz
							? real.cuStreamGetDevice_ptsz
							: real.cuStreamGetDevice;

	if (fn && fn(s, ret) == CUDA_SUCCESS)
		return CUDA_SUCCESS;
	return real.cuCtxGetDevice(ret);
}

/* Whether pool (NULL: the device's current pool) is the device's default. */
static bool is_default_pool(CUdevice dev, CUmemoryPool pool)
{
	CUmemoryPool def = NULL, cur = NULL;

	if (!real.cuDeviceGetDefaultMemPool || real.cuDeviceGetDefaultMemPool(&def, dev) != CUDA_SUCCESS)
		return !pool; /* cannot tell: only the implicit pool counts */
	if (!pool) {
		if (!real.cuDeviceGetMemPool || real.cuDeviceGetMemPool(&cur, dev) != CUDA_SUCCESS)
			return true;
		pool = cur;
	}
	return pool == def;
}

/* gpucr's memory for a stream-ordered allocation, or 1 when the driver
 * should serve it. */
static int alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s, bool ptsz,
		       CUresult *ret)
{
	CUdeviceptr p = 0;
	CUdevice dev;
	int err;

	if (!dptr || !bytesize || capture_state(s, ptsz) != 0 || !real.cuCtxGetDevice ||
	    stream_device(s, ptsz, &dev) != CUDA_SUCCESS || !is_default_pool(dev, pool))
		return 1;
	err = alloc_owned(dev, bytesize, BUF_F_ASYNC, &p);
	if (err == -EOPNOTSUPP)
		return 1;
	if (!err)
		*dptr = p;
	*ret = alloc_err_to_cu(err);
	return 0;
}

/* After the driver served a stream-ordered allocation outside capture. */
static void record_driver_async(CUresult r, CUdeviceptr *dptr, size_t bytesize, CUstream s, bool ptsz)
{
	CUdevice dev;
	struct buf b;

	if (r != CUDA_SUCCESS || !dptr || !bytesize || capture_state(s, ptsz) != 0 ||
	    !real.cuCtxGetDevice || stream_device(s, ptsz, &dev) != CUDA_SUCCESS)
		return;
	b = (struct buf){ .base = *dptr, .size = bytesize, .id = buftab_new_id(), .device = dev,
			  .kind = BUF_DRIVER, .flags = BUF_F_ASYNC };
	if (buftab_insert(&b) < 0)
		pr_debug("buffer table: driver memory %#llx (%zu bytes) not recorded\n",
			 (unsigned long long)*dptr, bytesize);
}

SHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	CUresult r;

	real_ensure();
	if (!real.cuMemAllocAsync)
		return real_absent("cuMemAllocAsync");
	if (alloc_async(dptr, bytesize, NULL, hStream, false, &r) == 0)
		return r;
	r = real.cuMemAllocAsync(dptr, bytesize, hStream);
	record_driver_async(r, dptr, bytesize, hStream, false);
	return r;
}

SHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	CUresult r;

	real_ensure();
	if (!real.cuMemAllocAsync_ptsz)
		return real_absent("cuMemAllocAsync_ptsz");
	if (alloc_async(dptr, bytesize, NULL, hStream, true, &r) == 0)
		return r;
	r = real.cuMemAllocAsync_ptsz(dptr, bytesize, hStream);
	record_driver_async(r, dptr, bytesize, hStream, true);
	return r;
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					     CUstream hStream)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	CUresult r;

	real_ensure();
	if (!real.cuMemAllocFromPoolAsync)
		return real_absent("cuMemAllocFromPoolAsync");
	if (pool && alloc_async(dptr, bytesize, pool, hStream, false, &r) == 0)
		return r;
	r = real.cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
	record_driver_async(r, dptr, bytesize, hStream, false);
	return r;
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
						  CUmemoryPool pool, CUstream hStream)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	CUresult r;

	real_ensure();
	if (!real.cuMemAllocFromPoolAsync_ptsz)
		return real_absent("cuMemAllocFromPoolAsync_ptsz");
	if (pool && alloc_async(dptr, bytesize, pool, hStream, true, &r) == 0)
		return r;
	r = real.cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, hStream);
	record_driver_async(r, dptr, bytesize, hStream, true);
	return r;
}

/* CUDA_SUCCESS or an error when gpucr freed (or will free) dptr itself; 1
 * in *forward when the driver should free it. */
static CUresult free_async(CUdeviceptr dptr, CUstream s, bool ptsz, bool *forward)
{
	__typeof__(real.cuEventRecord) record = ptsz && real.cuEventRecord_ptsz ? real.cuEventRecord_ptsz
										 : real.cuEventRecord;
	CUevent ev = NULL;
	struct buf b;
	CUresult r;
	int cap;

	*forward = false;
	alloc_reap(false);
	if (!dptr || buftab_lookup(dptr, &b) < 0 || !buf_owned(&b)) {
		*forward = true;
		return CUDA_SUCCESS;
	}
	if (b.base != dptr)
		return CUDA_ERROR_INVALID_VALUE;
	cap = capture_state(s, ptsz);
	if (cap < 0) {
		*forward = true; /* the driver reports the bad stream */
		return CUDA_SUCCESS;
	}
	if (cap) {
		if (buftab_remove(dptr, NULL) < 0)
			return CUDA_ERROR_INVALID_VALUE;
		pr_debug("cuMemFreeAsync(%#llx) during stream capture: %zu bytes kept\n",
			 (unsigned long long)dptr, b.size);
		return CUDA_SUCCESS;
	}
	if (!real.cuEventCreate || !record || !real.cuEventQuery || !real.cuEventSynchronize ||
	    !real.cuEventDestroy_v2)
		return real_absent("cuEventRecord");
	r = real.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
	if (r != CUDA_SUCCESS)
		return r;
	r = record(ev, s);
	if (r != CUDA_SUCCESS) {
		real.cuEventDestroy_v2(ev);
		return r;
	}
	if (buftab_remove(dptr, &b) < 0) {
		real.cuEventDestroy_v2(ev);
		return CUDA_ERROR_INVALID_VALUE; /* another thread freed it meanwhile */
	}
	alloc_defer_free(&b, ev);
	return CUDA_SUCCESS;
}

/* The driver freed what it had allocated: forget its record. */
static void forget_driver(CUresult r, CUdeviceptr dptr)
{
	struct buf b;

	if (r == CUDA_SUCCESS && dptr && buftab_lookup(dptr, &b) == 0 && b.base == dptr &&
	    !buf_held(&b))
		buftab_remove(dptr, NULL);
}

SHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	bool forward;
	CUresult r;

	real_ensure();
	if (!real.cuMemFreeAsync)
		return real_absent("cuMemFreeAsync");
	r = free_async(dptr, hStream, false, &forward);
	if (!forward)
		return r;
	r = real.cuMemFreeAsync(dptr, hStream);
	forget_driver(r, dptr);
	return r;
}

SHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	SHIM_KEEP_ERRNO;
	GATE_COUNTED;
	bool forward;
	CUresult r;

	real_ensure();
	if (!real.cuMemFreeAsync_ptsz)
		return real_absent("cuMemFreeAsync_ptsz");
	r = free_async(dptr, hStream, true, &forward);
	if (!forward)
		return r;
	r = real.cuMemFreeAsync_ptsz(dptr, hStream);
	forget_driver(r, dptr);
	return r;
}
