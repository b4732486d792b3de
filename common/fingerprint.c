/* Owns the CPU implementation of chunk fingerprints. */
#include <string.h>

#include "fingerprint.h"

uint64_t fp_chunk(const void *buf, size_t len, uint64_t first_word)
{
	const unsigned char *p = buf;
	uint64_t sum = 0, i = first_word;
	size_t n = len / 8, k;

	for (k = 0; k < n; k++, i++) {
		uint64_t w;

		memcpy(&w, p + k * 8, 8);
		sum += fp_mix64(w + (i + 1) * FP_GOLDEN);
	}
	if (len % 8) {
		uint64_t w = 0;

		memcpy(&w, p + n * 8, len % 8);
		sum += fp_mix64(w + (i + 1) * FP_GOLDEN);
	}
	return sum;
}

int fp_is_zero(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	size_t i;

	for (i = 0; i < len && ((uintptr_t)(p + i) & 7); i++)
		if (p[i])
			return 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t w;

		memcpy(&w, p + i, 8);
		if (w)
			return 0;
	}
	for (; i < len; i++)
		if (p[i])
			return 0;
	return 1;
}
