/* cuInit: the driver's initialisation, and the start of gpucr's control
 * thread (control.h), so that every CUDA process under gpucr registers with
 * gpucrd whether or not it allocates device memory. */
#include "control.h"
#include "gate.h"
#include "real.h"

SHIM_EXPORT CUresult cuInit(unsigned int Flags)
{
	SHIM_KEEP_ERRNO;
	CUresult r;

	gate_pass();
	real_ensure();
	if (!real.cuInit)
		return real_absent("cuInit");
	r = real.cuInit(Flags);
	if (r == CUDA_SUCCESS)
		control_start();
	return r;
}
