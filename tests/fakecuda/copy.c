/* fakecuda copy: memcpy and memset entry points.  Device memory is host
 * memory in this address space, so each is a checked memmove/memset done
 * before the call returns, async or not.  The per-thread-stream names
 * (_ptds, _ptsz) exist too, each a function of its own that does what the
 * legacy one does (every stream is synchronous here).  Explicit device operands must lie
 * in device memory with the needed access (an unmapped or not yet
 * cuMemSetAccess'ed VMM range is CUDA_ERROR_INVALID_VALUE, not a SIGSEGV);
 * unified-address operands may also be host memory. */
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

static CUresult copy(uintptr_t dst, uintptr_t src, size_t n, int dst_dev, int src_dev)
{
	CUresult rc;

	if (n == 0)
		return CUDA_SUCCESS;
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	rc = dst_dev ? fk_check_dev(dst, n, PROT_WRITE) : fk_check_any(dst, n, PROT_WRITE);
	if (rc == CUDA_SUCCESS)
		rc = src_dev ? fk_check_dev(src, n, PROT_READ) : fk_check_any(src, n, PROT_READ);
	if (rc != CUDA_SUCCESS)
		return rc;
	memmove((void *)dst, (const void *)src, n);
	return CUDA_SUCCESS;
}

static CUresult copy_async(uintptr_t dst, uintptr_t src, size_t n, int dst_dev, int src_dev, CUstream s)
{
	CUresult rc = fk_stream_check(s);

	return rc != CUDA_SUCCESS ? rc : copy(dst, src, n, dst_dev, src_dev);
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	FK_ENTER();
	return copy(dst, src, ByteCount, 0, 0);
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	FK_ENTER();
	return copy_async(dst, src, ByteCount, 0, 0, hStream);
}

CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			      CUcontext srcContext, size_t ByteCount)
{
	FK_ENTER();
	if (!fk_ctx_ok(dstContext) || !fk_ctx_ok(srcContext))
		return CUDA_ERROR_INVALID_CONTEXT;
	return copy(dstDevice, srcDevice, ByteCount, 1, 1);
}

CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				   CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	FK_ENTER();
	if (!fk_ctx_ok(dstContext) || !fk_ctx_ok(srcContext))
		return CUDA_ERROR_INVALID_CONTEXT;
	return copy_async(dstDevice, srcDevice, ByteCount, 1, 1, hStream);
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	FK_ENTER();
	return copy(dstDevice, (uintptr_t)srcHost, ByteCount, 1, 0);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	FK_ENTER();
	return copy((uintptr_t)dstHost, srcDevice, ByteCount, 0, 1);
}

CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	FK_ENTER();
	return copy(dstDevice, srcDevice, ByteCount, 1, 1);
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
				   CUstream hStream)
{
	FK_ENTER();
	return copy_async(dstDevice, (uintptr_t)srcHost, ByteCount, 1, 0, hStream);
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	FK_ENTER();
	return copy_async((uintptr_t)dstHost, srcDevice, ByteCount, 0, 1, hStream);
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
				   CUstream hStream)
{
	FK_ENTER();
	return copy_async(dstDevice, srcDevice, ByteCount, 1, 1, hStream);
}

/* One side of a 2D/3D copy: its first byte and whether it is device memory. */
static CUresult side(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t z,
		     size_t pitch, size_t height, uintptr_t *base, int *is_dev)
{
	uintptr_t p;

	switch (type) {
	case CU_MEMORYTYPE_HOST:
		p = (uintptr_t)host;
		*is_dev = 0;
		break;
	case CU_MEMORYTYPE_DEVICE:
		p = (uintptr_t)dev;
		*is_dev = 1;
		break;
	case CU_MEMORYTYPE_UNIFIED:
		p = (uintptr_t)dev;
		*is_dev = 0;
		break;
	case CU_MEMORYTYPE_ARRAY:
		return CUDA_ERROR_NOT_SUPPORTED;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	*base = p + (z * height + y) * pitch + x;
	return CUDA_SUCCESS;
}

/* Copies depth x height rows of width bytes after checking both spans. */
static CUresult copy_3d(uintptr_t dst, size_t dpitch, size_t dheight, int ddev, uintptr_t src, size_t spitch,
			size_t sheight, int sdev, size_t width, size_t height, size_t depth)
{
	size_t dspan, sspan;
	CUresult rc;

	if (width == 0 || height == 0 || depth == 0)
		return CUDA_SUCCESS;
	if ((height > 1 || depth > 1) && (dpitch < width || spitch < width))
		return CUDA_ERROR_INVALID_VALUE;
	if (depth > 1 && (dheight < height || sheight < height))
		return CUDA_ERROR_INVALID_VALUE;
	dspan = ((depth - 1) * dheight + (height - 1)) * dpitch + width;
	sspan = ((depth - 1) * sheight + (height - 1)) * spitch + width;
	rc = ddev ? fk_check_dev(dst, dspan, PROT_WRITE) : fk_check_any(dst, dspan, PROT_WRITE);
	if (rc == CUDA_SUCCESS)
		rc = sdev ? fk_check_dev(src, sspan, PROT_READ) : fk_check_any(src, sspan, PROT_READ);
	if (rc != CUDA_SUCCESS)
		return rc;
	for (size_t z = 0; z < depth; z++)
		for (size_t y = 0; y < height; y++)
			memmove((void *)(dst + (z * dheight + y) * dpitch), (const void *)(src + (z * sheight + y) * spitch),
				width);
	return CUDA_SUCCESS;
}

static CUresult copy2d(const CUDA_MEMCPY2D *c)
{
	uintptr_t s, d;
	int sdev, ddev;
	CUresult rc;

	if (!c)
		return CUDA_ERROR_INVALID_VALUE;
	rc = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, 0, c->srcPitch, 0, &s, &sdev);
	if (rc == CUDA_SUCCESS)
		rc = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, 0, c->dstPitch, 0, &d,
			  &ddev);
	if (rc != CUDA_SUCCESS)
		return rc;
	return copy_3d(d, c->dstPitch, 0, ddev, s, c->srcPitch, 0, sdev, c->WidthInBytes, c->Height, 1);
}

/* The 3D copy c describes: the same members in a CUDA_MEMCPY3D and a
 * CUDA_MEMCPY3D_PEER (the peer one's contexts are checked by the caller). */
#define COPY3D_OF(c)                                                                                     \
	({                                                                                               \
		uintptr_t s_, d_;                                                                        \
		int sdev_, ddev_;                                                                        \
		CUresult rc_;                                                                            \
                                                                                                         \
		rc_ = side((c)->srcMemoryType, (c)->srcHost, (c)->srcDevice, (c)->srcXInBytes, (c)->srcY, \
			   (c)->srcZ, (c)->srcPitch, (c)->srcHeight, &s_, &sdev_);                       \
		if (rc_ == CUDA_SUCCESS)                                                                 \
			rc_ = side((c)->dstMemoryType, (c)->dstHost, (c)->dstDevice, (c)->dstXInBytes,    \
				   (c)->dstY, (c)->dstZ, (c)->dstPitch, (c)->dstHeight, &d_, &ddev_);     \
		if (rc_ == CUDA_SUCCESS)                                                                 \
			rc_ = copy_3d(d_, (c)->dstPitch, (c)->dstHeight, ddev_, s_, (c)->srcPitch,         \
				      (c)->srcHeight, sdev_, (c)->WidthInBytes, (c)->Height, (c)->Depth);  \
		rc_;                                                                                     \
	})

CUresult fk_copy3d(const CUDA_MEMCPY3D *c)
{
	if (!c || c->srcLOD || c->dstLOD || c->reserved0 || c->reserved1)
		return CUDA_ERROR_INVALID_VALUE;
	return COPY3D_OF(c);
}

CUresult CUDAAPI cuMemcpy2D(const CUDA_MEMCPY2D *pCopy)
{
	FK_ENTER();
	return copy2d(pCopy);
}

CUresult CUDAAPI cuMemcpy2DUnaligned(const CUDA_MEMCPY2D *pCopy)
{
	FK_ENTER();
	return copy2d(pCopy);
}

CUresult CUDAAPI cuMemcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	CUresult rc;

	FK_ENTER();
	rc = fk_stream_check(hStream);
	return rc != CUDA_SUCCESS ? rc : copy2d(pCopy);
}

CUresult CUDAAPI cuMemcpy3D(const CUDA_MEMCPY3D *pCopy)
{
	FK_ENTER();
	return fk_copy3d(pCopy);
}

CUresult CUDAAPI cuMemcpy3DAsync(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
	CUresult rc;

	FK_ENTER();
	rc = fk_stream_check(hStream);
	return rc != CUDA_SUCCESS ? rc : fk_copy3d(pCopy);
}

/* ---- memset ---- */

/* Fills height rows of width elements of esize bytes, pitch apart. */
CUresult fk_fill(uintptr_t dst, size_t pitch, uint32_t v, size_t esize, size_t width, size_t height)
{
	size_t row = width * esize;
	CUresult rc;

	if (width == 0 || height == 0)
		return CUDA_SUCCESS;
	if (dst % esize || (height > 1 && (pitch < row || pitch % esize)))
		return CUDA_ERROR_INVALID_VALUE;
	rc = fk_check_dev(dst, (height - 1) * pitch + row, PROT_WRITE);
	if (rc != CUDA_SUCCESS)
		return rc;
	for (size_t y = 0; y < height; y++) {
		char *p = (char *)(dst + y * pitch);

		if (esize == 1) {
			memset(p, (int)v, width);
		} else if (esize == 2) {
			uint16_t *q = (uint16_t *)(void *)p;

			for (size_t i = 0; i < width; i++)
				q[i] = (uint16_t)v;
		} else {
			uint32_t *q = (uint32_t *)(void *)p;

			for (size_t i = 0; i < width; i++)
				q[i] = v;
		}
	}
	return CUDA_SUCCESS;
}

static CUresult fill_async(uintptr_t dst, size_t pitch, uint32_t v, size_t esize, size_t width, size_t height,
			   CUstream s)
{
	CUresult rc = fk_stream_check(s);

	return rc != CUDA_SUCCESS ? rc : fk_fill(dst, pitch, v, esize, width, height);
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	FK_ENTER();
	return fk_fill(dstDevice, 0, uc, 1, N, 1);
}

CUresult CUDAAPI cuMemsetD16(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
	FK_ENTER();
	return fk_fill(dstDevice, 0, us, 2, N, 1);
}

CUresult CUDAAPI cuMemsetD32(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
	FK_ENTER();
	return fk_fill(dstDevice, 0, ui, 4, N, 1);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	FK_ENTER();
	return fill_async(dstDevice, 0, uc, 1, N, 1, hStream);
}

CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
	FK_ENTER();
	return fill_async(dstDevice, 0, us, 2, N, 1, hStream);
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
	FK_ENTER();
	return fill_async(dstDevice, 0, ui, 4, N, 1, hStream);
}

CUresult CUDAAPI cuMemsetD2D8(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height)
{
	FK_ENTER();
	return fk_fill(dstDevice, dstPitch, uc, 1, Width, Height);
}

CUresult CUDAAPI cuMemsetD2D16(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
			       size_t Height)
{
	FK_ENTER();
	return fk_fill(dstDevice, dstPitch, us, 2, Width, Height);
}

CUresult CUDAAPI cuMemsetD2D32(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height)
{
	FK_ENTER();
	return fk_fill(dstDevice, dstPitch, ui, 4, Width, Height);
}

CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
				   size_t Height, CUstream hStream)
{
	FK_ENTER();
	return fill_async(dstDevice, dstPitch, uc, 1, Width, Height, hStream);
}

CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
				    size_t Height, CUstream hStream)
{
	FK_ENTER();
	return fill_async(dstDevice, dstPitch, us, 2, Width, Height, hStream);
}

CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
				    size_t Height, CUstream hStream)
{
	FK_ENTER();
	return fill_async(dstDevice, dstPitch, ui, 4, Width, Height, hStream);
}

/* ---- 3D peer copies and batches ---- */

/* A peer copy: its contexts checked, then as any 3D copy. */
static CUresult peer3d(const CUDA_MEMCPY3D_PEER *p)
{
	if (!p || p->srcLOD || p->dstLOD)
		return CUDA_ERROR_INVALID_VALUE;
	if ((p->srcMemoryType != CU_MEMORYTYPE_ARRAY && p->srcContext && !fk_ctx_ok(p->srcContext)) ||
	    (p->dstMemoryType != CU_MEMORYTYPE_ARRAY && p->dstContext && !fk_ctx_ok(p->dstContext)))
		return CUDA_ERROR_INVALID_CONTEXT;
	return COPY3D_OF(p);
}

CUresult CUDAAPI cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *pCopy)
{
	FK_ENTER();
	return peer3d(pCopy);
}

CUresult CUDAAPI cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream)
{
	CUresult rc;

	FK_ENTER();
	rc = fk_stream_check(hStream);
	return rc != CUDA_SUCCESS ? rc : peer3d(pCopy);
}

/* Copies one after the other; the attributes are hints here. */
static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, size_t numAttrs,
		      CUstream s)
{
	CUresult rc = fk_stream_check(s);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!count || !dsts || !srcs || !sizes || !numAttrs)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++)
		rc = copy(dsts[i], srcs[i], sizes[i], 0, 0);
	return rc;
}

CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
				    CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream)
{
	FK_ENTER();
	(void)attrs;
	(void)attrsIdxs;
	return batch(dsts, srcs, sizes, count, numAttrs, hStream);
}

/* ---- per-thread-stream names ---- */

#define FK_VARIANT(sym, params, call)                                          \
	FK_EXPORT CUresult CUDAAPI fk_##sym params __asm__(#sym);               \
	FK_EXPORT CUresult CUDAAPI fk_##sym params                              \
	{                                                                      \
		FK_ENTER_AS(#sym);                                             \
		return call;                                                   \
	}

static CUresult peer_ok(CUcontext a, CUcontext b)
{
	return fk_ctx_ok(a) && fk_ctx_ok(b) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

FK_VARIANT(cuMemcpy_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n), copy(d, s, n, 0, 0))
FK_VARIANT(cuMemcpyHtoD_v2_ptds, (CUdeviceptr d, const void *s, size_t n), copy(d, (uintptr_t)s, n, 1, 0))
FK_VARIANT(cuMemcpyDtoH_v2_ptds, (void *d, CUdeviceptr s, size_t n), copy((uintptr_t)d, s, n, 0, 1))
FK_VARIANT(cuMemcpyDtoD_v2_ptds, (CUdeviceptr d, CUdeviceptr s, size_t n), copy(d, s, n, 1, 1))
FK_VARIANT(cuMemcpyPeer_ptds, (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n),
	   peer_ok(dc, sc) ?: copy(d, s, n, 1, 1))
FK_VARIANT(cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D *c), copy2d(c))
FK_VARIANT(cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D *c), copy2d(c))
FK_VARIANT(cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D *c), fk_copy3d(c))
FK_VARIANT(cuMemcpy3DPeer_ptds, (const CUDA_MEMCPY3D_PEER *c), peer3d(c))
FK_VARIANT(cuMemsetD8_v2_ptds, (CUdeviceptr d, unsigned char v, size_t n), fk_fill(d, 0, v, 1, n, 1))
FK_VARIANT(cuMemsetD16_v2_ptds, (CUdeviceptr d, unsigned short v, size_t n), fk_fill(d, 0, v, 2, n, 1))
FK_VARIANT(cuMemsetD32_v2_ptds, (CUdeviceptr d, unsigned int v, size_t n), fk_fill(d, 0, v, 4, n, 1))
FK_VARIANT(cuMemsetD2D8_v2_ptds, (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h),
	   fk_fill(d, p, v, 1, w, h))
FK_VARIANT(cuMemsetD2D16_v2_ptds, (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h),
	   fk_fill(d, p, v, 2, w, h))
FK_VARIANT(cuMemsetD2D32_v2_ptds, (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h),
	   fk_fill(d, p, v, 4, w, h))

FK_VARIANT(cuMemcpyAsync_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),
	   copy_async(d, s, n, 0, 0, st))
FK_VARIANT(cuMemcpyHtoDAsync_v2_ptsz, (CUdeviceptr d, const void *s, size_t n, CUstream st),
	   copy_async(d, (uintptr_t)s, n, 1, 0, st))
FK_VARIANT(cuMemcpyDtoHAsync_v2_ptsz, (void *d, CUdeviceptr s, size_t n, CUstream st),
	   copy_async((uintptr_t)d, s, n, 0, 1, st))
FK_VARIANT(cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),
	   copy_async(d, s, n, 1, 1, st))
FK_VARIANT(cuMemcpyPeerAsync_ptsz,
	   (CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st),
	   peer_ok(dc, sc) ?: copy_async(d, s, n, 1, 1, st))
FK_VARIANT(cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D *c, CUstream st), fk_stream_check(st) ?: copy2d(c))
FK_VARIANT(cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D *c, CUstream st), fk_stream_check(st) ?: fk_copy3d(c))
FK_VARIANT(cuMemcpy3DPeerAsync_ptsz, (const CUDA_MEMCPY3D_PEER *c, CUstream st), fk_stream_check(st) ?: peer3d(c))
FK_VARIANT(cuMemcpyBatchAsync_v2_ptsz,
	   (CUdeviceptr *d, CUdeviceptr *s, size_t *sz, size_t n, CUmemcpyAttributes *a, size_t *ai, size_t na,
	    CUstream st),
	   ((void)a, (void)ai, batch(d, s, sz, n, na, st)))
FK_VARIANT(cuMemsetD8Async_ptsz, (CUdeviceptr d, unsigned char v, size_t n, CUstream st),
	   fill_async(d, 0, v, 1, n, 1, st))
FK_VARIANT(cuMemsetD16Async_ptsz, (CUdeviceptr d, unsigned short v, size_t n, CUstream st),
	   fill_async(d, 0, v, 2, n, 1, st))
FK_VARIANT(cuMemsetD32Async_ptsz, (CUdeviceptr d, unsigned int v, size_t n, CUstream st),
	   fill_async(d, 0, v, 4, n, 1, st))
FK_VARIANT(cuMemsetD2D8Async_ptsz, (CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream st),
	   fill_async(d, p, v, 1, w, h, st))
FK_VARIANT(cuMemsetD2D16Async_ptsz,
	   (CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream st),
	   fill_async(d, p, v, 2, w, h, st))
FK_VARIANT(cuMemsetD2D32Async_ptsz, (CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream st),
	   fill_async(d, p, v, 4, w, h, st))
