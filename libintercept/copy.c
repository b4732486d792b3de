/* Copies and memsets: the wrappers of every memcpy and memset entry point
 * of the driver (1D, 2D, 3D, peer, async, batch; _v2, _ptds and _ptsz
 * names) that can touch device memory by address.
 *
 * Each passes the gate (gate_pass: a copy changes no memory of gpucr's) and
 * forwards; while decoding is off (no epoch, launch.h) that is all it costs:
 * the gate's load and branch, the cached driver pointer, and one more load
 * and branch after the call. While an epoch is open, a successful call becomes a DAG node
 * (dag_record_ranges) whose read edges cover the source and whose write
 * edges cover the destination (access.h decodes them; pitched operands are
 * exact at chunk granularity). Synchronous calls are on the NULL (legacy)
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
#include "dag.h"
#include "gate.h"
#include "launch.h"
#include "real.h"

/* ---- recording (out of line: only while an epoch is open) ----------------- */

static void record(enum dag_node_kind kind, CUstream s, struct access_set *a)
{
	dag_record_ranges(kind, s, NULL, a->unbounded ? DAG_NODE_F_UNBOUNDED : 0, a->r, a->n);
	access_free(a);
}

/* A 1D copy (dst or src 0 for a host side) or memset (src 0). */
static __attribute__((noinline)) void rec_1d(enum dag_node_kind kind, CUstream s, CUdeviceptr dst,
					     CUdeviceptr src, size_t n)
{
	struct access_set a;

	access_init(&a);
	access_add(&a, src, n, DAG_ACCESS_READ, 0);
	access_add(&a, dst, n, DAG_ACCESS_WRITE, 0);
	record(kind, s, &a);
}

static __attribute__((noinline)) void rec_2d(CUstream s, const CUDA_MEMCPY2D *c)
{
	struct access_set a;

	access_init(&a);
	access_copy2d(&a, c);
	record(DAG_NODE_COPY, s, &a);
}

static __attribute__((noinline)) void rec_3d(CUstream s, const CUDA_MEMCPY3D *c)
{
	struct access_set a;

	access_init(&a);
	access_copy3d(&a, c);
	record(DAG_NODE_COPY, s, &a);
}

static __attribute__((noinline)) void rec_3d_peer(CUstream s, const CUDA_MEMCPY3D_PEER *c)
{
	struct access_set a;

	access_init(&a);
	access_copy3d_peer(&a, c);
	record(DAG_NODE_COPY, s, &a);
}

static __attribute__((noinline)) void rec_memset(CUstream s, CUdeviceptr dst, size_t pitch, size_t esize,
						 size_t width, size_t height)
{
	struct access_set a;

	access_init(&a);
	access_memset(&a, dst, pitch, esize, width, height);
	record(DAG_NODE_MEMSET, s, &a);
}

static __attribute__((noinline)) void rec_batch(CUstream s, const CUdeviceptr *dsts, const CUdeviceptr *srcs,
						const size_t *sizes, size_t count)
{
	struct access_set a;

	access_init(&a);
	for (size_t i = 0; i < count && dsts && srcs && sizes; i++) {
		access_add(&a, srcs[i], sizes[i], DAG_ACCESS_READ, 0);
		access_add(&a, dsts[i], sizes[i], DAG_ACCESS_WRITE, 0);
	}
	record(DAG_NODE_COPY, s, &a);
}

static __attribute__((noinline)) void rec_unbounded(CUstream s)
{
	dag_record_ranges(DAG_NODE_COPY, s, NULL, DAG_NODE_F_UNBOUNDED, NULL, 0);
}

/* ---- the wrappers -------------------------------------------------------------
 * COPY_WRAP defines one; rec is the statement that records a successful
 * call, in terms of the parameters. SYNC2 defines a synchronous name and
 * its _ptds twin, ASYNC2 an asynchronous one (stream parameter hStream)
 * and its _ptsz twin; their rec is a macro of the stream. */

#define COPY_WRAP(name, fntype, proto, args, rec)                        \
	SHIM_EXPORT CUresult name proto                                  \
	{                                                                \
		SHIM_KEEP_ERRNO;                                         \
		CUresult r_;                                             \
                                                                         \
		gate_pass();                                             \
		r_ = REAL_WRAPPED_CALL(name, fntype, args);              \
		if (launch_decoding_on() && r_ == CUDA_SUCCESS)          \
			rec;                                             \
		return r_;                                               \
	}

#define SYNC2(name, fntype, proto, args, rec)                     \
	COPY_WRAP(name, fntype, proto, args, rec(NULL))           \
	COPY_WRAP(name##_ptds, fntype, proto, args, rec(CU_STREAM_PER_THREAD))

#define ASYNC2(name, fntype, proto, args, rec)                    \
	COPY_WRAP(name, fntype, proto, args, rec(hStream))        \
	COPY_WRAP(name##_ptsz, fntype, proto, args, rec(launch_ptsz_stream(hStream)))

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

#define R_DD(s) rec_1d(DAG_NODE_COPY, s, dst, src, n)
#define R_HD(s) rec_1d(DAG_NODE_COPY, s, dst, 0, n)
#define R_DH(s) rec_1d(DAG_NODE_COPY, s, 0, src, n)

SYNC2(cuMemcpy, dd_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), R_DD)
SYNC2(cuMemcpyDtoD_v2, dd_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), R_DD)
SYNC2(cuMemcpyHtoD_v2, hd_fn, (CUdeviceptr dst, const void *src, size_t n), (dst, src, n), R_HD)
SYNC2(cuMemcpyDtoH_v2, dh_fn, (void *dst, CUdeviceptr src, size_t n), (dst, src, n), R_DH)
SYNC2(cuMemcpyPeer, peer_fn, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n),
      (dst, dctx, src, sctx, n), R_DD)
SYNC2(cuMemcpyDtoA_v2, dtoa_fn, (CUarray dst, size_t off, CUdeviceptr src, size_t n), (dst, off, src, n), R_DH)
SYNC2(cuMemcpyAtoD_v2, atod_fn, (CUdeviceptr dst, CUarray src, size_t off, size_t n), (dst, src, off, n), R_HD)

ASYNC2(cuMemcpyAsync, dd_async_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_DD)
ASYNC2(cuMemcpyDtoDAsync_v2, dd_async_fn, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_DD)
ASYNC2(cuMemcpyHtoDAsync_v2, hd_async_fn, (CUdeviceptr dst, const void *src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_HD)
ASYNC2(cuMemcpyDtoHAsync_v2, dh_async_fn, (void *dst, CUdeviceptr src, size_t n, CUstream hStream),
       (dst, src, n, hStream), R_DH)
ASYNC2(cuMemcpyPeerAsync, peer_async_fn,
       (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream hStream),
       (dst, dctx, src, sctx, n, hStream), R_DD)

/* 2D and 3D copies */
typedef CUresult (*c2d_fn)(const CUDA_MEMCPY2D *);
typedef CUresult (*c2d_async_fn)(const CUDA_MEMCPY2D *, CUstream);
typedef CUresult (*c3d_fn)(const CUDA_MEMCPY3D *);
typedef CUresult (*c3d_async_fn)(const CUDA_MEMCPY3D *, CUstream);
typedef CUresult (*c3dp_fn)(const CUDA_MEMCPY3D_PEER *);
typedef CUresult (*c3dp_async_fn)(const CUDA_MEMCPY3D_PEER *, CUstream);

#define R_2D(s) rec_2d(s, c)
#define R_3D(s) rec_3d(s, c)
#define R_3DP(s) rec_3d_peer(s, c)

SYNC2(cuMemcpy2D_v2, c2d_fn, (const CUDA_MEMCPY2D *c), (c), R_2D)
SYNC2(cuMemcpy2DUnaligned_v2, c2d_fn, (const CUDA_MEMCPY2D *c), (c), R_2D)
SYNC2(cuMemcpy3D_v2, c3d_fn, (const CUDA_MEMCPY3D *c), (c), R_3D)
SYNC2(cuMemcpy3DPeer, c3dp_fn, (const CUDA_MEMCPY3D_PEER *c), (c), R_3DP)
ASYNC2(cuMemcpy2DAsync_v2, c2d_async_fn, (const CUDA_MEMCPY2D *c, CUstream hStream), (c, hStream), R_2D)
ASYNC2(cuMemcpy3DAsync_v2, c3d_async_fn, (const CUDA_MEMCPY3D *c, CUstream hStream), (c, hStream), R_3D)
ASYNC2(cuMemcpy3DPeerAsync, c3dp_async_fn, (const CUDA_MEMCPY3D_PEER *c, CUstream hStream), (c, hStream),
       R_3DP)

/* Batches */
typedef CUresult (*batch_v1_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
				size_t, size_t *, CUstream);
typedef CUresult (*batch_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
			     size_t, CUstream);
typedef CUresult (*batch3d_v1_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, size_t *, unsigned long long, CUstream);
typedef CUresult (*batch3d_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, unsigned long long, CUstream);

#define R_BATCH(s) rec_batch(s, dsts, srcs, sizes, count)
#define R_UNBOUNDED(s) rec_unbounded(s)

ASYNC2(cuMemcpyBatchAsync, batch_v1_fn,
       (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
	size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, CUstream hStream),
       (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream), R_BATCH)
ASYNC2(cuMemcpyBatchAsync_v2, batch_fn,
       (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs,
	size_t *attrsIdxs, size_t numAttrs, CUstream hStream),
       (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream), R_BATCH)
ASYNC2(cuMemcpy3DBatchAsync, batch3d_v1_fn,
       (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags,
	CUstream hStream),
       (numOps, opList, failIdx, flags, hStream), R_UNBOUNDED)
ASYNC2(cuMemcpy3DBatchAsync_v2, batch3d_fn,
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

#define R_SET8(s) rec_memset(s, dst, 0, 1, n, 1)
#define R_SET16(s) rec_memset(s, dst, 0, 2, n, 1)
#define R_SET32(s) rec_memset(s, dst, 0, 4, n, 1)
#define R_SET2D8(s) rec_memset(s, dst, pitch, 1, w, h)
#define R_SET2D16(s) rec_memset(s, dst, pitch, 2, w, h)
#define R_SET2D32(s) rec_memset(s, dst, pitch, 4, w, h)

SYNC2(cuMemsetD8_v2, set8_fn, (CUdeviceptr dst, unsigned char v, size_t n), (dst, v, n), R_SET8)
SYNC2(cuMemsetD16_v2, set16_fn, (CUdeviceptr dst, unsigned short v, size_t n), (dst, v, n), R_SET16)
SYNC2(cuMemsetD32_v2, set32_fn, (CUdeviceptr dst, unsigned int v, size_t n), (dst, v, n), R_SET32)
ASYNC2(cuMemsetD8Async, set8_async_fn, (CUdeviceptr dst, unsigned char v, size_t n, CUstream hStream),
       (dst, v, n, hStream), R_SET8)
ASYNC2(cuMemsetD16Async, set16_async_fn, (CUdeviceptr dst, unsigned short v, size_t n, CUstream hStream),
       (dst, v, n, hStream), R_SET16)
ASYNC2(cuMemsetD32Async, set32_async_fn, (CUdeviceptr dst, unsigned int v, size_t n, CUstream hStream),
       (dst, v, n, hStream), R_SET32)
SYNC2(cuMemsetD2D8_v2, set2d8_fn, (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h),
      (dst, pitch, v, w, h), R_SET2D8)
SYNC2(cuMemsetD2D16_v2, set2d16_fn, (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h),
      (dst, pitch, v, w, h), R_SET2D16)
SYNC2(cuMemsetD2D32_v2, set2d32_fn, (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h),
      (dst, pitch, v, w, h), R_SET2D32)
ASYNC2(cuMemsetD2D8Async, set2d8_async_fn,
       (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream hStream),
       (dst, pitch, v, w, h, hStream), R_SET2D8)
ASYNC2(cuMemsetD2D16Async, set2d16_async_fn,
       (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream hStream),
       (dst, pitch, v, w, h, hStream), R_SET2D16)
ASYNC2(cuMemsetD2D32Async, set2d32_async_fn,
       (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream hStream),
       (dst, pitch, v, w, h, hStream), R_SET2D32)
