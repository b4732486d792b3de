/* One error space for gpucr: 0 on success, -errno for system errors, and
 * CUDA driver results folded in as -(GPUCR_ECUDA_BASE + CUresult), so a
 * function can return either and the caller still prints the driver's name
 * ("CUDA_ERROR_OUT_OF_MEMORY") and description. No driver call is needed to
 * name an error: the table is generated from cuda.h at build time. */
#ifndef GPUCR_ERR_H
#define GPUCR_ERR_H

#include <cuda.h>

#define GPUCR_ECUDA_BASE 100000

static inline int gpucr_err_from_cu(CUresult r)
{
	return r == CUDA_SUCCESS ? 0 : -(GPUCR_ECUDA_BASE + (int)r);
}

static inline int gpucr_err_is_cu(int err)
{
	return err <= -GPUCR_ECUDA_BASE;
}

/* The CUresult an error stands for; CUDA_ERROR_UNKNOWN for a plain errno. */
static inline CUresult gpucr_err_to_cu(int err)
{
	return gpucr_err_is_cu(err) ? (CUresult)(-err - GPUCR_ECUDA_BASE) : CUDA_ERROR_UNKNOWN;
}

/* "CUDA_ERROR_OUT_OF_MEMORY", or NULL when r is not a known result. */
const char *gpucr_cu_name(CUresult r);
/* The driver's description of r, or "unknown CUDA error". */
const char *gpucr_cu_desc(CUresult r);

/* A message for any gpucr error code: strerror for -errno,
 * "CUDA_ERROR_X (N): description" for driver results. The string is static
 * or in thread-local storage; valid until the thread's next call. */
const char *gpucr_strerror(int err);

#endif
