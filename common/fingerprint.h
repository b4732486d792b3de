/* Chunk fingerprints (image.proto FP_MIX64_SUM_V1), computed on the CPU. The
 * daemon computes the same function on the GPU; both must agree bit for bit.
 * Defined as a sum over 64-bit words so that any reduction order gives the
 * same value: fp = sum_i mix64(w[i] + (i + 1) * 0x9e3779b97f4a7c15) mod 2^64,
 * words little-endian, the last one zero-padded. */
#ifndef GPUCR_FINGERPRINT_H
#define GPUCR_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#define FP_GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t fp_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fingerprint of len bytes; first_word is the index of buf's first word in
 * the chunk (0 for a whole chunk), so a chunk can be hashed in pieces and the
 * pieces' results added. buf must start on a word boundary of the chunk. */
uint64_t fp_chunk(const void *buf, size_t len, uint64_t first_word);

/* True when all len bytes are zero. */
int fp_is_zero(const void *buf, size_t len);

#endif
