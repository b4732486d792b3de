/* Copies and memsets: the wrappers of every memcpy and memset entry point
 * of the driver (1D, 2D, 3D, peer, async, batch; _v2, _ptds and _ptsz
 * names) that can touch device memory by address.
 *
 * Each passes the gate (gate_pass: a copy changes no memory of gpucr's), is
 * counted as a copy or a memset (counts.h) and forwards; while decoding is
 * off (no epoch, launch.h) that is all it costs: the gate's load and branch,
 * the count's atomic add, one more load and branch, and the cached driver
 * pointer. While decoding is on, the call's access set is decoded
 * first (access.h; pitched operands are exact at chunk granularity): the
 * per-chunk gate (chunkgate.h) may make the call wait for its chunks, and
 * a successful call becomes a DAG node (dag_record_ranges) whose read edges
 * cover the source and whose write edges cover the destination. Synchronous calls are on the NULL (legacy)
 * stream, _ptds ones on CU_STREAM_PER_THREAD; an async _ptsz call on NULL is
 * on CU_STREAM_PER_THREAD, as launches are.
 *
 * Not decoded: cuMemcpy3DBatchAsync (operand extents are in elements of a
 * size the call does not give), which is recorded as an unbounded node.
 * Not wrapped: the copies between host and arrays or array and array (they
 * name no device address) and the 32-bit v1 ABIs (cuMemcpyHtoD & co
 * without _v2: a 32-bit device pointer cannot reach gpucr's allocations);
 * they stay gated trampolines. */
#include <stdlib.h>

#include "access.h"
#include "chunkgate.h"
#include "counts.h"
#include "dag.h"
#include "gate.h"
#include "launch.h"
#include "real.h"

/* ---- access sets ------------------------------------------------------------
 * Each acc_* fills a set with what a call reads and writes and returns the
 * kind of node it makes. */

/* A 1D copy (dst or src 0 for a host side). */
static enum dag_node_kind acc_1d(struct access_set *a, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	access_add(a, src, n, DAG_ACCESS_READ, 0);
	access_add(a, dst, n, DAG_ACCESS_WRITE, 0);
	return DAG_NODE_COPY;
}

static enum dag_node_kind acc_2d(struct access_set *a, const CUDA_MEMCPY2D *c)
{
	access_copy2d(a, c);
	return DAG_NODE_COPY;
}

static enum dag_node_kind acc_3d(struct access_set *a, const CUDA_MEMCPY3D *c)
{
	access_copy3d(a, c);
	return DAG_NODE_COPY;
}

static enum dag_node_kind acc_3d_peer(struct access_set *a, const CUDA_MEMCPY3D_PEER *c)
{
	access_copy3d_peer(a, c);
	return DAG_NODE_COPY;
}

static enum dag_node_kind acc_memset(struct access_set *a, CUdeviceptr dst, size_t pitch, size_t esize,
				     size_t width, size_t height)
{
	access_memset(a, dst, pitch, esize, width, height);
	return DAG_NODE_MEMSET;
}

static enum dag_node_kind acc_batch(struct access_set *a, const CUdeviceptr *dsts, const CUdeviceptr *srcs,
				    const size_t *sizes, size_t count)
{
	for (size_t i = 0; i < count && dsts && srcs && sizes; i++)
		acc_1d(a, dsts[i], srcs[i], sizes[i]);
	return DAG_NODE_COPY;
}

static enum dag_node_kind acc_unbounded(struct access_set *a)
{
	a->unbounded = true;
	return DAG_NODE_COPY;
}

/* Before the call: the per-chunk gate (chunkgate.h). */
static void before(const struct access_set *a)
{
	if (chunk_gate_on())
		chunk_gate_ranges(a->r, a->n, a->unbounded);
}

/* After a successful call: the DAG. Frees a either way. */
static void after(CUresult r, enum dag_node_kind kind, CUstream s, struct access_set *a)
{
	if (r == CUDA_SUCCESS)
		dag_record_ranges(kind, s, NULL, a->unbounded ? DAG_NODE_F_UNBOUNDED : 0, a->r, a->n);
	access_free(a);
}

/* ---- the wrappers -------------------------------------------------------------
 * COPY_WRAP defines one, and its slow path (out of line: only while
 * decoding is on); cnt is the counter it adds to (counts.h: COPIES or
 * MEMSETS); acc is an expression of the set `a_` that fills it, in terms of
 * the parameters, and returns the node kind; s the stream. SYNC2 defines a
 * synchronous name and its _ptds twin, ASYNC2 an asynchronous one (stream
 * parameter hStream) and its _ptsz twin. */

#define COPY_WRAP(name, cnt, fntype, proto, args, acc, s)                 \
	static __attribute__((noinline)) CUresult name##_slow proto       \
	{                                                                 \
		struct access_set a_;                                     \
		enum dag_node_kind kind_;                                 \
		CUresult r_;                                              \
                                                                          \
		access_init(&a_);                                         \
		kind_ = acc;                                              \
		before(&a_);                                              \
		r_ = REAL_WRAPPED_CALL(name, fntype, args);               \
		after(r_, kind_, s, &a_);                                 \
		return r_;                                                \
	}                                                                 \
	SHIM_EXPORT CUresult name proto                                   \
	{                                                                 \
		SHIM_KEEP_ERRNO;                                          \
                                                                          \
		gate_pass();                                              \
		shim_count(SHIM_COUNT_##cnt);                             \
		if (launch_decoding_on())                                 \
			return name##_slow args;                          \
		return REAL_WRAPPED_CALL(name, fntype, args);             \
	}

#define SYNC2(name, cnt, fntype, proto, args, acc)                 \
	COPY_WRAP(name, cnt, fntype, proto, args, acc, NULL)       \
	COPY_WRAP(name##_ptds, cnt, fntype, proto, args, acc, CU_STREAM_PER_THREAD)

#define ASYNC2(name, cnt, fntype, proto, args, acc)                \
	COPY_WRAP(name, cnt, fntype, proto, args, acc, hStream)    \
	COPY_WRAP(name##_ptsz, cnt, fntype, proto, args, acc, launch_ptsz_stream(hStream))

/* 1D copies */
typedef CUresult (*dd_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*dd_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*hd_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*hd_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*dh_async_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*peer_fn)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
typedef CUresult (*peer_async_fn)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
typedef CUresult (*dtoa_fn)(CUarray, size_t, CUdeviceptr, size_t);
typedef CUresult (*atod_fn)(CUdeviceptr, CUarray, size_t, size_t);

#define R_DD acc_1d(&a_, dst, src, n)
#define R_HD acc_1d(&a_, dst, 0, n)
#define R_DH acc_1d(&a_, 0, src, n)

SYNC2(cuMemcpy, COPIES, dd_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), R_DD)
SYNC2(cuMemcpyDtoD_v2, COPIES, dd_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), R_DD)
SYNC2(cuMemcpyHtoD_v2, COPIES, hd_fn, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n), R_HD)
SYNC2(cuMemcpyDtoH_v2, COPIES, dh_fn, (void *dst, CUdeviceptr src, size_t n), (dst, src, n), R_DH)
SYNC2(cuMemcpyPeer, COPIES, peer_fn, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n),
      (dst, dctx, src, sctx, n), R_DD)
SYNC2(cuMemcpyDtoA_v2, COPIES, dtoa_fn, (CUarray dst, size_t off, CUdeviceptr src, size_t n), (dst, off, src, n), R_DH)
SYNC2(cuMemcpyAtoD_v2, COPIES, atod_fn, (CUdeviceptr dst, CUarray src, size_t off, size_t n), (dst, src, off, n), R_HD)

ASYNC2(cuMemcpyAsync, COPIES, dd_async_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_DD)
ASYNC2(cuMemcpyDtoDAsync_v2, COPIES, dd_async_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_DD)
ASYNC2(cuMemcpyHtoDAsync_v2, COPIES, hd_async_fn, (CUdeviceptr dst, const void *src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_HD)
ASYNC2(cuMemcpyDtoHAsync_v2, COPIES, dh_async_fn, (void *dst, CUdeviceptr src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_DH)
ASYNC2(cuMemcpyPeerAsync, COPIES, peer_async_fn,
       (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream hStream),
       (dst, dctx, src, sctx, n, hStream), R_DD)

/* 2D and 3D copies */
typedef CUresult (*c2d_fn)(const CUDA_MEMCPY2D *);
typedef CUresult (*c2d_async_fn)(const CUDA_MEMCPY2D *, CUstream);
typedef CUresult (*c3d_fn)(const CUDA_MEMCPY3D *);
typedef CUresult (*c3d_async_fn)(const CUDA_MEMCPY3D *, CUstream);
typedef CUresult (*c3dp_fn)(const CUDA_MEMCPY3D_PEER *);
typedef CUresult (*c3dp_async_fn)(const CUDA_MEMCPY3D_PEER *, CUstream);

#define R_2D acc_2d(&a_, c)
#define R_3D acc_3d(&a_, c)
#define R_3DP acc_3d_peer(&a_, c)

SYNC2(cuMemcpy2D_v2, COPIES, c2d_fn, (const CUDA_MEMCPY2D *c), (c), R_2D)
SYNC2(cuMemcpy2DUnaligned_v2, COPIES, c2d_fn, (const CUDA_MEMCPY2D *c), (c), R_2D)
SYNC2(cuMemcpy3D_v2, COPIES, c3d_fn, (const CUDA_MEMCPY3D *c), (c), R_3D)
SYNC2(cuMemcpy3DPeer, COPIES, c3dp_fn, (const CUDA_MEMCPY3D_PEER *c), (c), R_3DP)
ASYNC2(cuMemcpy2DAsync_v2, COPIES, c2d_async_fn, (const CUDA_MEMCPY2D *c, CUstream hStream), (c, hStream), R_2D)
ASYNC2(cuMemcpy3DAsync_v2, COPIES, c3d_async_fn, (const CUDA_MEMCPY3D *c, CUstream hStream), (c, hStream), R_3D)
ASYNC2(cuMemcpy3DPeerAsync, COPIES, c3dp_async_fn, (const CUDA_MEMCPY3D_PEER *c, CUstream hStream), (c, hStream),
       R_3DP)

/* Batches */
typedef CUresult (*batch_v1_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
				size_t, size_t *, CUstream);
typedef CUresult (*batch_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
			     size_t, CUstream);
typedef CUresult (*batch3d_v1_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, size_t *, unsigned long long, CUstream);
typedef CUresult (*batch3d_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, unsigned long long, CUstream);

#define R_BATCH acc_batch(&a_, dsts, srcs, sizes, count)
#define R_UNBOUNDED acc_unbounded(&a_)

ASYNC2(cuMemcpyBatchAsync, COPIES, batch_v1_fn,
       (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
	size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream),
       (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream), R_BATCH)
ASYNC2(cuMemcpyBatchAsync_v2, COPIES, batch_fn,
       (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
	size_t *attrsIdxs, size_t numAttrs, CUstream hStream),
       (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream), R_BATCH)
ASYNC2(cuMemcpy3DBatchAsync, COPIES, batch3d_v1_fn,
       (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags,
	CUstream hStream),
       (numOps, opList, failIdx, flags, hStream), R_UNBOUNDED)
ASYNC2(cuMemcpy3DBatchAsync_v2, COPIES, batch3d_fn,
       (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags, CUstream hStream),
       (numOps, opList, flags, hStream), R_UNBOUNDED)

/* Memsets */
typedef CUresult (*set8_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*set16_fn)(CUdeviceptr, unsigned short, size_t);
typedef CUresult (*set32_fn)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*set8_async_fn)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*set16_async_fn)(CUdeviceptr, unsigned short, size_t, CUstream);
typedef CUresult (*set32_async_fn)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*set2d8_fn)(CUdeviceptr, size_t, unsigned char, size_t, size_t);
typedef CUresult (*set2d16_fn)(CUdeviceptr, size_t, unsigned short, size_t, size_t);
typedef CUresult (*set2d32_fn)(CUdeviceptr, size_t, unsigned int, size_t, size_t);
typedef CUresult (*set2d8_async_fn)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
typedef CUresult (*set2d16_async_fn)(CUdeviceptr, size_t, unsigned short, size_t, size_t, CUstream);
typedef CUresult (*set2d32_async_fn)(CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream);

#define R_SET8 acc_memset(&a_, dst, 0, 1, n, 1)
#define R_SET16 acc_memset(&a_, dst, 0, 2, n, 1)
#define R_SET32 acc_memset(&a_, dst, 0, 4, n, 1)
#define R_SET2D8 acc_memset(&a_, dst, pitch, 1, w, h)
#define R_SET2D16 acc_memset(&a_, dst, pitch, 2, w, h)
#define R_SET2D32 acc_memset(&a_, dst, pitch, 4, w, h)

SYNC2(cuMemsetD8_v2, MEMSETS, set8_fn, (CUdeviceptr dst, unsigned char v, size_t n), (dst, v, n), R_SET8)
SYNC2(cuMemsetD16_v2, MEMSETS, set16_fn, (CUdeviceptr dst, unsigned short v, size_t n), (dst, v, n), R_SET16)
SYNC2(cuMemsetD32_v2, MEMSETS, set32_fn, (CUdeviceptr dst, unsigned int v, size_t n), (dst, v, n), R_SET32)
ASYNC2(cuMemsetD8Async, MEMSETS, set8_async_fn, (CUdeviceptr dst, unsigned char v, size_t n, CUstream hStream),
       (dst, v, n, hStream), R_SET8)
ASYNC2(cuMemsetD16Async, MEMSETS, set16_async_fn, (CUdeviceptr dst, unsigned short v, size_t n, CUstream hStream),
       (dst, v, n, hStream), R_SET16)
ASYNC2(cuMemsetD32Async, MEMSETS, set32_async_fn, (CUdeviceptr dst, unsigned int v, size_t n, CUstream hStream),
       (dst, v, n, hStream), R_SET32)
SYNC2(cuMemsetD2D8_v2, MEMSETS, set2d8_fn, (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h),
      (dst, pitch, v, w, h), R_SET2D8)
SYNC2(cuMemsetD2D16_v2, MEMSETS, set2d16_fn, (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h),
      (dst, pitch, v, w, h), R_SET2D16)
SYNC2(cuMemsetD2D32_v2, MEMSETS, set2d32_fn, (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h),
      (dst, pitch, v, w, h), R_SET2D32)
ASYNC2(cuMemsetD2D8Async, MEMSETS, set2d8_async_fn,
       (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream hStream),
       (dst, pitch, v, w, h, hStream), R_SET2D8)
ASYNC2(cuMemsetD2D16Async, MEMSETS, set2d16_async_fn,
       (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream hStream),
       (dst, pitch, v, w, h, hStream), R_SET2D16)
ASYNC2(cuMemsetD2D32Async, MEMSETS, set2d32_async_fn,
       (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream hStream),
       (dst, pitch, v, w, h, hStream), R_SET2D32)
