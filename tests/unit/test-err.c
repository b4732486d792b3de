/* The error space: errno and CUDA results round-trip and print with names. */
#include <errno.h>

#include "err.h"
#include "t.h"

int main(void)
{
	int e = gpucr_err_from_cu(CUDA_ERROR_OUT_OF_MEMORY);

	CHECK_EQ_INT(gpucr_err_from_cu(CUDA_SUCCESS), 0);
	CHECK(e < 0);
	CHECK(gpucr_err_is_cu(e));
	CHECK(!gpucr_err_is_cu(-ENOMEM));
	CHECK_EQ_INT(gpucr_err_to_cu(e), CUDA_ERROR_OUT_OF_MEMORY);
	CHECK_EQ_INT(gpucr_err_to_cu(-EIO), CUDA_ERROR_UNKNOWN);
	CHECK_CONTAINS(gpucr_strerror(e), "CUDA_ERROR_OUT_OF_MEMORY (2)");
	CHECK_CONTAINS(gpucr_strerror(e), "unable to allocate enough memory");
	CHECK_CONTAINS(gpucr_strerror(-ENOENT), "No such file");
	CHECK_CONTAINS(gpucr_strerror(gpucr_err_from_cu(CUDA_ERROR_NOT_SUPPORTED)),
		       "CUDA_ERROR_NOT_SUPPORTED");
	CHECK(gpucr_cu_name(CUDA_ERROR_ILLEGAL_STATE) &&
	      !strcmp(gpucr_cu_name(CUDA_ERROR_ILLEGAL_STATE), "CUDA_ERROR_ILLEGAL_STATE"));
	CHECK(gpucr_cu_name((CUresult)987654) == NULL);
	CHECK_CONTAINS(gpucr_strerror(gpucr_err_from_cu((CUresult)9999)), "unknown CUDA error");
	return t_done();
}
