/* fakecuda: page-locked host memory. There is no pinning to do without a
 * GPU: page-aligned anonymous memory stands in for it, so callers that stage
 * copies through "pinned" buffers (gpucrd's image pipeline) run unchanged. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

FK_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	void *p;

	(void)Flags;
	FK_ENTER();
	if (!pp || !bytesize)
		return CUDA_ERROR_INVALID_VALUE;
	p = mmap(NULL, bytesize + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* The size lives in the page before the one handed out. */
	memcpy(p, &bytesize, sizeof(bytesize));
	*pp = (char *)p + 4096;
	return CUDA_SUCCESS;
}

FK_EXPORT CUresult CUDAAPI cuMemAllocHost(void **pp, size_t bytesize)
{
	return cuMemHostAlloc(pp, bytesize, 0);
}

FK_EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
	size_t size;
	char *base;

	FK_ENTER();
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	base = (char *)p - 4096;
	memcpy(&size, base, sizeof(size));
	munmap(base, size + 4096);
	return CUDA_SUCCESS;
}
