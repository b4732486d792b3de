/* A minimal test harness for gpucr's unit tests: checks that are never
 * compiled out, the exit-code contract (0 pass, 1 fail, 77 skip) and a
 * message that says where a check failed. */
#ifndef GPUCR_T_H
#define GPUCR_T_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_SKIP 77

static int t_failed;

#define CHECK(cond)                                                                    \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			t_failed++;                                                    \
		}                                                                      \
	} while (0)

/* Fatal: stop the test here. */
#define REQUIRE(cond)                                                                  \
	do {                                                                           \
		if (!(cond)) {                                                         \
			fprintf(stderr, "%s:%d: required: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                             \
	do {                                                                           \
		long long _a = (long long)(a), _b = (long long)(b);                    \
		if (_a != _b) {                                                        \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, \
				__LINE__, #a, _a, #b, _b);                             \
			t_failed++;                                                    \
		}                                                                      \
	} while (0)

#define CHECK_CONTAINS(hay, needle)                                                    \
	do {                                                                           \
		const char *_h = (hay), *_n = (needle);                                \
		if (!_h || !strstr(_h, _n)) {                                          \
			fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, \
				__LINE__, _h ? _h : "(null)", _n);                     \
			t_failed++;                                                    \
		}                                                                      \
	} while (0)

static inline int t_done(void)
{
	if (t_failed)
		fprintf(stderr, "%d check(s) failed\n", t_failed);
	return t_failed ? 1 : 0;
}

#endif
