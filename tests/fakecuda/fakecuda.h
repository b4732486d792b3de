/* fakecuda.h: what test programs may ask of the fake CUDA driver
 * ($(BUILD)/fakecuda/libcuda.so.1) beyond the driver API itself: kernels
 * implemented as host functions, fault injection, the checkpoint-state
 * helpers and a scan of the device memory a process still holds.
 *
 * A program linked straight against the fake (-lcuda) calls these directly.
 * A program whose libcuda.so.1 is gpucr's interceptor, which loads the fake
 * privately (RTLD_LOCAL), reaches them with fakecuda_sym() instead.
 *
 * Environment read by the fake at cuInit:
 *   FAKECUDA_DEVICES=N      number of devices (default 1; 0: cuInit fails
 *                           with CUDA_ERROR_NO_DEVICE)
 *   FAKECUDA_MEM_MB=M       memory per device (default 4096)
 *   FAKECUDA_UUID_SALT=S    mixed into device UUIDs ("another host")
 *   FAKECUDA_STATE_DIR=D    where per-pid checkpoint state lives
 *                           (default /dev/shm; caller and target must agree)
 *   FAKECUDA_FAIL=fn[:nth[:code]][,...]  fail the nth call (default 1st) of
 *                           driver function fn with code (default 999,
 *                           CUDA_ERROR_UNKNOWN); fn is the exported name, a
 *                           versionless name also matches its _vN symbol.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKECUDA_API __attribute__((visibility("default")))

/* memfd names: every byte of fake device memory lives in a memfd of one of
 * these names, so /proc/PID/maps and /proc/PID/fd show what a process holds. */
#define FAKECUDA_PHYS_NAME "fakecuda-phys"
#define FAKECUDA_MANAGED_NAME "fakecuda-managed"
/* Per-process checkpoint state, under FAKECUDA_STATE_DIR (default /dev/shm). */
#define FAKECUDA_STATE_FMT "%s/fakecuda-ckpt-%d"

/* A kernel: params[i] points at the value of parameter i (as kernelParams in
 * cuLaunchKernel); grid and block are the launch dimensions.  It runs
 * synchronously on the launching thread, inside the launch call. */
typedef void (*fakecuda_kernel_fn)(void **params, unsigned grid[3], unsigned block[3]);

/* Registers (or, for a name already known, replaces) kernel `name` so that
 * cuModuleGetFunction / cuLibraryGetKernel on any fake module find it.
 * param_sizes[i] is the size of parameter i; offsets follow C struct layout
 * with each parameter aligned to its natural alignment, taken as the largest
 * power of two dividing its size, at most 8 (use the _aligned form when a
 * parameter is e.g. a struct of 4-byte fields with an 8-byte size).  The
 * fake copies name and sizes.  Returns 0 or -EINVAL / -ENOMEM.  Callable
 * before cuInit; thread-safe.  A CUfunction stays valid for the life of the
 * process. */
FAKECUDA_API int fakecuda_register_kernel(const char *name, fakecuda_kernel_fn fn, int nparams,
					  const size_t *param_sizes);
/* Same with explicit alignments (each a power of two); NULL = natural. */
FAKECUDA_API int fakecuda_register_kernel_aligned(const char *name, fakecuda_kernel_fn fn, int nparams,
						  const size_t *param_sizes, const size_t *param_aligns);

/* Makes the nth next call (1 = the very next) of driver function `fn` in this
 * process fail with `err`; nth == 0 removes the fault.  Same matching as
 * FAKECUDA_FAIL.  Returns 0 or -EINVAL / -ENOSPC (16 faults at most). */
FAKECUDA_API int fakecuda_inject_fault(const char *fn, unsigned nth, CUresult err);

/* What cuCheckpointProcessGetRestoreThreadId reports for this process
 * (default: the pid, i.e. the main thread).  Needs cuInit first.
 * Returns 0 or -EINVAL. */
FAKECUDA_API int fakecuda_set_restore_thread(pid_t tid);

/* Device memory a process holds, as cuCheckpointProcessCheckpoint counts it:
 * mappings of the fake's memfds in /proc/PID/maps plus open fds of
 * "fakecuda-phys" memfds not already counted as mapped (same inode). */
struct fakecuda_held {
	uint64_t mapped_bytes;   /* "fakecuda-phys" mappings */
	uint64_t fd_bytes;       /* "fakecuda-phys" fds, not mapped */
	uint64_t managed_bytes;  /* "fakecuda-managed" mappings */
	unsigned int nmaps;      /* mappings counted */
	unsigned int nfds;       /* fds counted */
};

/* Fills *ret for pid (0: this process).  Returns 0 or -errno from reading
 * /proc/PID.  Needs no cuInit. */
FAKECUDA_API int fakecuda_held_bytes(pid_t pid, struct fakecuda_held *ret);

#ifdef __cplusplus
}
#endif

/* fakecuda_sym: finds an exported symbol of the fake even when it was loaded
 * privately by another libcuda.so.1 (gpucr's interceptor): walks the loaded
 * objects and asks each libcuda.so* for it.  NULL if not found.  Needs
 * _GNU_SOURCE and -ldl (glibc < 2.34). */
#if defined(_GNU_SOURCE) && !defined(FAKECUDA_NO_SYM)
#include <dlfcn.h>
#include <link.h>
#include <string.h>

struct fakecuda_sym_walk {
	const char *name;
	void *found;
};

static inline int fakecuda_sym_one(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct fakecuda_sym_walk *w = (struct fakecuda_sym_walk *)arg;
	const char *base;
	void *h;

	(void)size;
	if (!info->dlpi_name || !info->dlpi_name[0])
		return 0;
	base = strrchr(info->dlpi_name, '/');
	base = base ? base + 1 : info->dlpi_name;
	if (strncmp(base, "libcuda.so", 10) != 0)
		return 0;
	h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
	if (!h)
		return 0;
	w->found = dlsym(h, w->name);
	dlclose(h);
	return w->found != NULL;
}

static inline void *fakecuda_sym(const char *name)
{
	struct fakecuda_sym_walk w = { name, NULL };

	dl_iterate_phdr(fakecuda_sym_one, &w);
	return w.found;
}
#endif

#endif
