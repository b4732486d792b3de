/* Forwarding of the driver symbols gpucr does not wrap.
 *
 * Each forwarded symbol is a generated trampoline, `jmp *fwd_table[i]`, so any
 * signature (varargs included) passes through untouched. fwd_table[i] starts
 * at a lazy stub (see lazy.S) that calls fwd_resolve(i) on the first call of
 * that symbol from any thread: it loads the driver if needed, looks the name
 * up in it, and stores the answer so later calls jump straight there. A name
 * the driver lacks resolves to a stub that fails loudly, once. */
#include <dlfcn.h>
#include <stdlib.h>

#include "real.h"

void *fwd_resolve(unsigned long idx) SHIM_HIDDEN;

/* Not every driver function returns CUresult, but every one this can stand
 * in for does: a driver that lacks a symbol its headers declare. */
static CUresult fwd_no_driver(void)
{
	return CUDA_ERROR_NO_DEVICE;
}

static CUresult fwd_missing(void)
{
	return CUDA_ERROR_NOT_FOUND;
}

void *fwd_resolve(unsigned long idx)
{
	int saved = errno;
	void *target;

	real_ensure();
	if (idx >= FWD_COUNT) /* cannot happen: the stubs are generated with the table */
		abort();
	if (!real.handle) {
		target = (void *)fwd_no_driver;
	} else {
		target = dlsym(real.handle, fwd_names[idx]);
		if (!target) {
			real_absent(fwd_names[idx]);
			target = (void *)fwd_missing;
		}
	}
	/* Two threads may race here; both store the same answer. */
	__atomic_store_n(&fwd_table[idx], target, __ATOMIC_RELEASE);
	errno = saved;
	return target;
}
