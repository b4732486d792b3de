/* Counts of the calls that pass the launch, graph-launch, copy and memset
 * wrappers (counts.c), read through gpucr_shim_counts() (gpucr_shim.h) and
 * the stats the control thread sends (control.c).
 *
 * Cost on the hot path: one relaxed atomic add (lock add) to a counter on a
 * cache line chosen by the calling thread's thread pointer (%fs:0, no TLS
 * lookup): threads mostly land on lines of their own, so the add seldom
 * contends; two threads sharing a line still count exactly. A read sums the
 * lines. */
#ifndef GPUCR_COUNTS_H
#define GPUCR_COUNTS_H

#include "shim.h"

enum shim_count {
	SHIM_COUNT_KERNELS,
	SHIM_COUNT_GRAPHS,
	SHIM_COUNT_COPIES,
	SHIM_COUNT_MEMSETS,
	SHIM_COUNT_N
};

#define SHIM_COUNT_LINES 64u /* a power of two */

struct shim_count_line {
	uint64_t n[SHIM_COUNT_N];
} __attribute__((aligned(64)));

extern struct shim_count_line shim_count_lines[SHIM_COUNT_LINES] SHIM_HIDDEN;

/* Adds one to counter k of the calling thread's line. */
static inline void shim_count(enum shim_count k)
{
	uint64_t tp = (uint64_t)(uintptr_t)__builtin_thread_pointer();
	/* Thread control blocks sit a stack apart: hash the page number. */
	size_t line = (size_t)(((tp >> 12) * 0x9e3779b97f4a7c15ull) >> (64 - __builtin_ctz(SHIM_COUNT_LINES)));

	__atomic_add_fetch(&shim_count_lines[line].n[k], 1, __ATOMIC_RELAXED);
}

/* The total of counter k over all lines. */
uint64_t shim_count_read(enum shim_count k) SHIM_HIDDEN;

#endif
