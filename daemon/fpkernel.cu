// gpucrd's fingerprint kernel (common/fingerprint.h, FP_MIX64_SUM_V1): for
// each chunk of a device range, the sum of mix64(w[i] + (i + 1) * golden)
// over its 64-bit words, and the OR of its words (non-zero means the chunk
// must be stored). Compiled to PTX at build time and embedded in gpucrd.
// out_fp and out_nz must be zeroed; blocks add into them atomically, so the
// result does not depend on the order blocks run in.
#include <stdint.h>

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

extern "C" __global__ void gpucr_fp_chunks(const uint64_t *base, uint64_t len_bytes,
					   uint64_t chunk_bytes, unsigned long long *out_fp,
					   unsigned long long *out_nz)
{
	const uint64_t chunk = blockIdx.y;
	const uint64_t start = chunk * chunk_bytes;
	uint64_t end = start + chunk_bytes;
	if (end > len_bytes)
		end = len_bytes;
	const uint64_t nwords = (end - start + 7) / 8;
	const uint64_t full = (end - start) / 8;
	const uint64_t *p = base + start / 8;
	uint64_t s = 0, o = 0;

	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < nwords;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint64_t w;
		if (i < full) {
			w = p[i];
		} else {
			// zero-padded tail of a chunk whose length is not a multiple of 8
			const unsigned char *b = (const unsigned char *)(p + i);
			w = 0;
			for (uint64_t k = 0; k < (end - start) % 8; k++)
				w |= (uint64_t)b[k] << (8 * k);
		}
		s += mix64(w + (i + 1) * 0x9e3779b97f4a7c15ull);
		o |= w;
	}
	// warp reduction, then one atomic per warp
	for (int d = 16; d > 0; d >>= 1) {
		s += __shfl_down_sync(0xffffffffu, s, d);
		o |= __shfl_down_sync(0xffffffffu, o, d);
	}
	if ((threadIdx.x & 31) == 0) {
		atomicAdd(&out_fp[chunk], (unsigned long long)s);
		if (o)
			atomicOr(&out_nz[chunk], (unsigned long long)1);
	}
}
