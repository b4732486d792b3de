/* testutil.h: checks shared by the fake driver's own tests (test-*.c).
 * A failed check prints where and what, then exits 1; checks are never
 * compiled out.  Exit 0 pass, 1 fail, 77 skip. */
#ifndef FAKECUDA_TESTUTIL_H
#define FAKECUDA_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

#define TEST_SKIP 77

static inline const char *cu_name(CUresult r)
{
	const char *n = NULL;

	return cuGetErrorName(r, &n) == CUDA_SUCCESS && n ? n : "?";
}

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

/* The call must return `want`. */
#define CU_EXPECT(call, want)                                                              \
	do {                                                                               \
		CUresult got_ = (call), want_ = (want);                                     \
		if (got_ != want_) {                                                       \
			fprintf(stderr, "%s:%d: %s returned %d %s, expected %d %s\n", __FILE__, \
				__LINE__, #call, (int)got_, cu_name(got_), (int)want_,     \
				cu_name(want_));                                           \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

#define CU_OK(call) CU_EXPECT(call, CUDA_SUCCESS)

/* Every test kills itself after `seconds`: a hang is a failure, not a stall. */
static inline void test_time_limit(unsigned int seconds)
{
	alarm(seconds);
}

#endif
