/* fakecuda copy: memcpy and memset entry points.  Device memory is host
 * memory in this address space, so each is a checked memmove/memset done
 * before the call returns, async or not.  Explicit device operands must lie
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

static CUresult copy3d(const CUDA_MEMCPY3D *c)
{
	uintptr_t s, d;
	int sdev, ddev;
	CUresult rc;

	if (!c || c->srcLOD || c->dstLOD || c->reserved0 || c->reserved1)
		return CUDA_ERROR_INVALID_VALUE;
	rc = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch,
		  c->srcHeight, &s, &sdev);
	if (rc == CUDA_SUCCESS)
		rc = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch,
			  c->dstHeight, &d, &ddev);
	if (rc != CUDA_SUCCESS)
		return rc;
	return copy_3d(d, c->dstPitch, c->dstHeight, ddev, s, c->srcPitch, c->srcHeight, sdev, c->WidthInBytes,
		       c->Height, c->Depth);
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
	return copy3d(pCopy);
}

CUresult CUDAAPI cuMemcpy3DAsync(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
	CUresult rc;

	FK_ENTER();
	rc = fk_stream_check(hStream);
	return rc != CUDA_SUCCESS ? rc : copy3d(pCopy);
}

/* ---- memset ---- */

/* Fills height rows of width elements of esize bytes, pitch apart. */
static CUresult fill(uintptr_t dst, size_t pitch, uint32_t v, size_t esize, size_t width, size_t height)
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

	return rc != CUDA_SUCCESS ? rc : fill(dst, pitch, v, esize, width, height);
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	FK_ENTER();
	return fill(dstDevice, 0, uc, 1, N, 1);
}

CUresult CUDAAPI cuMemsetD16(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
	FK_ENTER();
	return fill(dstDevice, 0, us, 2, N, 1);
}

CUresult CUDAAPI cuMemsetD32(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
	FK_ENTER();
	return fill(dstDevice, 0, ui, 4, N, 1);
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
	return fill(dstDevice, dstPitch, uc, 1, Width, Height);
}

CUresult CUDAAPI cuMemsetD2D16(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
			       size_t Height)
{
	FK_ENTER();
	return fill(dstDevice, dstPitch, us, 2, Width, Height);
}

CUresult CUDAAPI cuMemsetD2D32(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height)
{
	FK_ENTER();
	return fill(dstDevice, dstPitch, ui, 4, Width, Height);
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
