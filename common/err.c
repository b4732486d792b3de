/* Owns the mapping of gpucr error codes to names and messages. */
#include <stdio.h>
#include <string.h>

#include "err.h"

struct cu_error {
	CUresult code;
	const char *name;
	const char *desc;
};

static const struct cu_error cu_errors[] = {
#include "cuda-errors.inc"
};

static const struct cu_error *cu_error_find(CUresult r)
{
	size_t i;

	for (i = 0; i < sizeof(cu_errors) / sizeof(cu_errors[0]); i++)
		if (cu_errors[i].code == r)
			return &cu_errors[i];
	return NULL;
}

const char *gpucr_cu_name(CUresult r)
{
	const struct cu_error *e = cu_error_find(r);

	return e ? e->name : NULL;
}

const char *gpucr_cu_desc(CUresult r)
{
	const struct cu_error *e = cu_error_find(r);

	return e ? e->desc : "unknown CUDA error";
}

const char *gpucr_strerror(int err)
{
	static __thread char buf[320];
	CUresult r;

	if (err == 0)
		return "success";
	if (!gpucr_err_is_cu(err)) {
		const char *s = strerrordesc_np(-err);

		if (s)
			return s;
		snprintf(buf, sizeof(buf), "error %d", err);
		return buf;
	}
	r = gpucr_err_to_cu(err);
	snprintf(buf, sizeof(buf), "%s (%d): %s", gpucr_cu_name(r) ?: "CUDA_ERROR_?", (int)r,
		 gpucr_cu_desc(r));
	return buf;
}
