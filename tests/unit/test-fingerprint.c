/* Fingerprints: a fixed value (the GPU kernels must reproduce it), piecewise
 * sums, sensitivity to one flipped bit and to word order, zero detection. */
#include <stdint.h>

#include "fingerprint.h"
#include "t.h"

int main(void)
{
	static uint8_t buf[1 << 16];
	uint64_t whole, a, b, zero8;
	size_t i;

	for (i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	whole = fp_chunk(buf, sizeof(buf), 0);
	/* Any split on a word boundary adds up to the whole. */
	a = fp_chunk(buf, 8 * 1000, 0);
	b = fp_chunk(buf + 8 * 1000, sizeof(buf) - 8 * 1000, 1000);
	CHECK_EQ_INT(a + b, whole);
	/* One bit anywhere changes it. */
	buf[12345] ^= 1;
	CHECK(fp_chunk(buf, sizeof(buf), 0) != whole);
	buf[12345] ^= 1;
	/* Swapping two different words changes it (positions are mixed in). */
	{
		uint64_t w0, w1;

		memcpy(&w0, buf, 8);
		memcpy(&w1, buf + 8, 8);
		REQUIRE(w0 != w1);
		memcpy(buf, &w1, 8);
		memcpy(buf + 8, &w0, 8);
		CHECK(fp_chunk(buf, sizeof(buf), 0) != whole);
		memcpy(buf, &w0, 8);
		memcpy(buf + 8, &w1, 8);
	}
	/* A fixed vector: the definition must not drift (GPU kernels and old
	 * images depend on it). One zero word: mix64(1 * golden). */
	memset(buf, 0, 8);
	zero8 = fp_chunk(buf, 8, 0);
	CHECK_EQ_INT(zero8, fp_mix64(FP_GOLDEN));
	CHECK_EQ_INT(fp_mix64(0x9e3779b97f4a7c15ull), 0xe220a8397b1dcdafull);
	/* A short tail is zero-padded. */
	buf[0] = 5;
	CHECK_EQ_INT(fp_chunk(buf, 3, 0), fp_mix64(5 + FP_GOLDEN));
	/* Zero detection at every alignment. */
	memset(buf, 0, 256);
	CHECK(fp_is_zero(buf, 256));
	for (i = 0; i < 256; i++) {
		buf[i] = 1;
		CHECK(!fp_is_zero(buf, 256));
		CHECK(fp_is_zero(buf + i + 1, 255 - i));
		buf[i] = 0;
	}
	return t_done();
}
