/* Helpers of the tests of the shim's per-chunk gate (chunkgate.h): how
 * many calls wait at it, and waiting for calls made on threads of their own
 * (shimtest.h's shim_job). Include after t.h, shimtest.h and chunkgate.h. */
#ifndef GPUCR_GATETEST_H
#define GPUCR_GATETEST_H

#include <unistd.h>

static inline unsigned int gate_waiting(void)
{
	struct chunk_gate_stats st;

	chunk_gate_get_stats(&st);
	return st.waiting;
}

/* Waits (up to 5 s) until n threads wait at the chunk gate, then a little
 * more, so that a thread that should not be waiting had time to finish. */
static inline void until_waiting(unsigned int n)
{
	for (int i = 0; i < 5000 && gate_waiting() != n; i++)
		usleep(1000);
	CHECK_EQ_INT(gate_waiting(), n);
	usleep(20 * 1000);
}

/* Waits (up to 5 s) for j to finish. */
static inline void until_job_done(struct shim_job *j)
{
	for (int i = 0; i < 5000 && !shim_job_done(j); i++)
		usleep(1000);
	CHECK(shim_job_done(j));
}

#endif
