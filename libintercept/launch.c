/* Kernel launches: the wrappers of cuLaunchKernel, cuLaunchKernelEx and
 * cuLaunchCooperativeKernel (and _ptsz variants), the parameter-layout cache
 * and the decoder that finds the buffers a launch can reach. See launch.h. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "buftab.h"
#include "chunkgate.h"
#include "counts.h"
#include "dag.h"
#include "gate.h"
#include "launch.h"
#include "real.h"

int launch_decoding;

/* ---- the real driver's entry points ---------------------------------------- */

enum {
	L_KERNEL,
	L_KERNEL_PTSZ,
	L_EX,
	L_EX_PTSZ,
	L_COOP,
	L_COOP_PTSZ,
	L_COUNT
};

static const char *const launch_names[L_COUNT] = {
	"cuLaunchKernel",   "cuLaunchKernel_ptsz",		"cuLaunchKernelEx",
	"cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz",
};

typedef CUresult (*paraminfo_fn)(void *h, size_t i, size_t *off, size_t *size);

static void *launch_real[L_COUNT];
static paraminfo_fn func_paraminfo, kernel_paraminfo;
static int launch_resolved;
static pthread_once_t launch_once = PTHREAD_ONCE_INIT;

static void launch_resolve(void)
{
	real_ensure();
	for (size_t i = 0; i < WRAP_COUNT; i++)
		for (size_t k = 0; k < L_COUNT; k++)
			if (!strcmp(wrap_names[i], launch_names[k]))
				launch_real[k] = real_wrapped[i];
	if (real.handle) {
		func_paraminfo = (paraminfo_fn)dlsym(real.handle, "cuFuncGetParamInfo");
		kernel_paraminfo = (paraminfo_fn)dlsym(real.handle, "cuKernelGetParamInfo");
	}
	__atomic_store_n(&launch_resolved, 1, __ATOMIC_RELEASE);
}

/* The real function for launch entry point k, or NULL. */
static inline void *launch_fn(int k)
{
	if (__builtin_expect(!__atomic_load_n(&launch_resolved, __ATOMIC_ACQUIRE), 0))
		pthread_once(&launch_once, launch_resolve);
	return launch_real[k];
}

/* ---- decoding on/off --------------------------------------------------- */

void launch_decode_hold(void)
{
	__atomic_add_fetch(&launch_decoding, 1, __ATOMIC_SEQ_CST);
}

void launch_decode_release(void)
{
	__atomic_sub_fetch(&launch_decoding, 1, __ATOMIC_SEQ_CST);
}

static launch_observer_fn observer;
static void *observer_arg;

void launch_set_observer(launch_observer_fn fn, void *arg)
{
	__atomic_store_n(&observer_arg, arg, __ATOMIC_RELAXED);
	__atomic_store_n(&observer, fn, __ATOMIC_RELEASE);
}

/* ---- the layout cache ------------------------------------------------------
 * Open addressing keyed by the handle, never deleted from: a reader probes
 * without a lock (acquire loads of the key; the layout is published before
 * its key), writers insert under layout_lock. When the table is full, a
 * layout is computed for the launch and thrown away. */

#define LAYOUT_SLOTS 8192u /* a power of two */
#define LAYOUT_MAX_PARAMS 8192u /* 32 KiB of parameters at 4 bytes each */

struct param_span {
	uint32_t off, size;
};

struct layout {
	uint32_t nparams;
	bool unknown; /* the driver cannot tell */
	struct param_span p[];
};

struct layout_slot {
	void *key;
	struct layout *val;
};

static struct layout_slot layout_tab[LAYOUT_SLOTS];
static size_t layout_count;
static uint64_t paraminfo_calls;
static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct layout layout_unknown = { .nparams = 0, .unknown = true };

static inline size_t layout_hash(const void *key)
{
	uint64_t h = (uint64_t)(uintptr_t)key * 0x9e3779b97f4a7c15ull;

	return (size_t)(h >> 40) & (LAYOUT_SLOTS - 1);
}

static const struct layout *layout_find(CUfunction f)
{
	size_t i = layout_hash(f);

	for (size_t n = 0; n < LAYOUT_SLOTS; n++, i = (i + 1) & (LAYOUT_SLOTS - 1)) {
		void *k = __atomic_load_n(&layout_tab[i].key, __ATOMIC_ACQUIRE);

		if (k == f)
			return __atomic_load_n(&layout_tab[i].val, __ATOMIC_ACQUIRE);
		if (!k)
			return NULL;
	}
	return NULL;
}

/* Asks the driver; NULL means unknown (or out of memory). */
static struct layout *layout_query(CUfunction f)
{
	paraminfo_fn fn = func_paraminfo;
	struct layout *l = NULL, *nl;
	size_t cap = 0, n = 0, off, size;
	CUresult r;

	if (!fn)
		fn = kernel_paraminfo;
	if (!fn)
		return NULL;
	for (;;) {
		__atomic_add_fetch(&paraminfo_calls, 1, __ATOMIC_RELAXED);
		r = fn(f, n, &off, &size);
		/* A CUkernel may be launched as a CUfunction. */
		if (r == CUDA_ERROR_INVALID_HANDLE && n == 0 && fn == func_paraminfo && kernel_paraminfo) {
			fn = kernel_paraminfo;
			continue;
		}
		if (r == CUDA_ERROR_INVALID_VALUE)
			break; /* past the last parameter */
		if (r != CUDA_SUCCESS || n >= LAYOUT_MAX_PARAMS || off > UINT32_MAX || size > UINT32_MAX) {
			free(l);
			return NULL;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 8;
			nl = realloc(l, sizeof(*l) + cap * sizeof(l->p[0]));
			if (!nl) {
				free(l);
				return NULL;
			}
			l = nl;
		}
		l->p[n].off = (uint32_t)off;
		l->p[n].size = (uint32_t)size;
		n++;
	}
	if (!l) {
		l = malloc(sizeof(*l));
		if (!l)
			return NULL;
	}
	l->nparams = (uint32_t)n;
	l->unknown = false;
	return l;
}

/* The layout of f, from the cache or the driver. *ret_tmp is set to memory
 * the caller frees (a layout that did not fit in the cache), else NULL. */
static const struct layout *layout_get(CUfunction f, struct layout **ret_tmp)
{
	const struct layout *l = layout_find(f);
	struct layout *q;
	size_t i;

	*ret_tmp = NULL;
	if (l)
		return l;
	pthread_mutex_lock(&layout_lock);
	l = layout_find(f);
	if (l) {
		pthread_mutex_unlock(&layout_lock);
		return l;
	}
	q = layout_query(f);
	if (layout_count >= LAYOUT_SLOTS - LAYOUT_SLOTS / 4) {
		pthread_mutex_unlock(&layout_lock);
		*ret_tmp = q;
		return q ? q : &layout_unknown;
	}
	i = layout_hash(f);
	while (layout_tab[i].key)
		i = (i + 1) & (LAYOUT_SLOTS - 1);
	__atomic_store_n(&layout_tab[i].val, q ? q : (struct layout *)&layout_unknown, __ATOMIC_RELEASE);
	__atomic_store_n(&layout_tab[i].key, (void *)f, __ATOMIC_RELEASE);
	layout_count++;
	pthread_mutex_unlock(&layout_lock);
	return q ? q : &layout_unknown;
}

uint64_t launch_paraminfo_calls(void)
{
	return __atomic_load_n(&paraminfo_calls, __ATOMIC_RELAXED);
}

size_t launch_layouts_cached(void)
{
	size_t n;

	pthread_mutex_lock(&layout_lock);
	n = layout_count;
	pthread_mutex_unlock(&layout_lock);
	return n;
}

/* ---- the decoder ------------------------------------------------------------ */

/* Values that cannot be a device address: NULL's page and non-canonical ones. */
static inline bool maybe_ptr(uint64_t v)
{
	return v >= 4096 && v < (1ull << 57);
}

static void note_word(struct launch_decoded *d, uint64_t v)
{
	struct buf b;

	if (!maybe_ptr(v) || (d->flags & LAUNCH_F_UNKNOWN))
		return;
	/* A buffer already seen (the usual case for a struct of pointers into
	 * one allocation) needs no lookup. */
	for (unsigned int i = 0; i < d->ntouch; i++)
		if (v - d->touch[i].base < d->touch[i].size)
			return;
	if (buftab_lookup((CUdeviceptr)v, &b) < 0)
		return;
	if (d->ntouch == LAUNCH_MAX_TOUCH) {
		d->flags |= LAUNCH_F_UNKNOWN;
		return;
	}
	d->touch[d->ntouch].buf_id = b.id;
	d->touch[d->ntouch].base = b.base;
	d->touch[d->ntouch].size = b.size;
	d->ntouch++;
}

/* Scans the bytes of one parameter found at `at`, which sit at offset off
 * of the parameter buffer: the 8-byte words at 8-aligned offsets. */
static void scan_bytes(struct launch_decoded *d, const unsigned char *at, size_t off, size_t size)
{
	size_t a = SHIM_ALIGN_UP(off, 8);
	uint64_t v;

	for (; a + 8 <= off + size; a += 8) {
		memcpy(&v, at + (a - off), sizeof(v));
		note_word(d, v);
	}
}

/* The packed buffer of `extra`: 0, or -1 when extra holds an option this
 * decoder does not know. */
static int extra_buffer(void **extra, const unsigned char **ret_buf, size_t *ret_size)
{
	const unsigned char *buf = NULL;
	size_t size = 0;

	for (size_t i = 0; i < 64; i += 2) {
		if (extra[i] == CU_LAUNCH_PARAM_END) {
			if (!buf)
				return -1;
			*ret_buf = buf;
			*ret_size = size;
			return 0;
		}
		if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
			buf = extra[i + 1];
		else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
			memcpy(&size, extra[i + 1], sizeof(size));
		else
			return -1;
	}
	return -1;
}

void launch_decode(CUfunction f, CUstream stream, void **kernelParams, void **extra,
		   struct launch_decoded *d)
{
	const struct layout *l;
	struct layout *tmp;

	d->func = f;
	d->stream = stream;
	d->flags = 0;
	d->ntouch = 0;
	launch_fn(L_KERNEL); /* the layout queries need the driver */
	l = layout_get(f, &tmp);
	if (!kernelParams && extra) {
		const unsigned char *buf;
		size_t size;

		d->flags |= LAUNCH_F_EXTRA;
		if (extra_buffer(extra, &buf, &size) < 0) {
			d->flags |= LAUNCH_F_UNKNOWN;
		} else if (l->unknown) {
			scan_bytes(d, buf, 0, size);
		} else {
			for (uint32_t i = 0; i < l->nparams; i++) {
				size_t o = l->p[i].off, s = l->p[i].size;

				if (o >= size)
					continue;
				scan_bytes(d, buf + o, o, s < size - o ? s : size - o);
			}
		}
	} else if (kernelParams) {
		if (l->unknown) {
			d->flags |= LAUNCH_F_UNKNOWN;
		} else {
			for (uint32_t i = 0; i < l->nparams; i++)
				if (kernelParams[i])
					scan_bytes(d, kernelParams[i], l->p[i].off, l->p[i].size);
		}
	} else if (l->unknown) {
		d->flags |= LAUNCH_F_UNKNOWN;
	}
	/* else no parameters given: nothing reachable (or the launch fails). */
	free(tmp);
}

/* ---- the wrappers ------------------------------------------------------------ */

/* Decodes before the launch (the observer and the per-chunk gate act
 * first: chunkgate.h); the caller hands it to the DAG after. The decoded launch lives on the
 * launching thread's stack (about 6 KiB), only in these out-of-line slow
 * paths: the hot path only tests the flag. */
static __attribute__((noinline)) void launch_before(struct launch_decoded *d, CUfunction f, CUstream s,
						    void **kernelParams, void **extra)
{
	launch_observer_fn fn;

	launch_decode(f, s, kernelParams, extra, d);
	fn = __atomic_load_n(&observer, __ATOMIC_ACQUIRE);
	if (fn)
		fn(d, __atomic_load_n(&observer_arg, __ATOMIC_RELAXED));
	if (chunk_gate_on())
		chunk_gate_launch(d);
}

typedef CUresult (*launch_kernel_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
				     unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*launch_coop_fn)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
				   unsigned int, unsigned int, unsigned int, CUstream, void **);

static CUresult launch_kernel_slow(int k, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
				   unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
				   void **kernelParams, void **extra)
{
	launch_kernel_fn fn = (launch_kernel_fn)launch_fn(k);
	struct launch_decoded dd, *d = &dd;
	CUresult r;

	if (!fn)
		return real_absent(launch_names[k]);
	launch_before(d, f, k == L_KERNEL_PTSZ ? launch_ptsz_stream(s) : s, kernelParams, extra);
	r = fn(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, extra);
	if (r == CUDA_SUCCESS)
		dag_record_launch(d);
	return r;
}

#define LAUNCH_KERNEL_WRAPPER(name, k)                                                               \
	SHIM_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,   \
				  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, \
				  CUstream s, void **kernelParams, void **extra)                     \
	{                                                                                            \
		SHIM_KEEP_ERRNO;                                                                     \
		launch_kernel_fn fn;                                                                 \
                                                                                                     \
		gate_pass();                                                                         \
		shim_count(SHIM_COUNT_KERNELS);                                                      \
		if (launch_decoding_on())                                                                      \
			return launch_kernel_slow(k, f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, \
						  extra);                                            \
		fn = (launch_kernel_fn)launch_fn(k);                                                 \
		if (!fn)                                                                             \
			return real_absent(#name);                                                   \
		return fn(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, extra);                 \
	}

LAUNCH_KERNEL_WRAPPER(cuLaunchKernel, L_KERNEL)
LAUNCH_KERNEL_WRAPPER(cuLaunchKernel_ptsz, L_KERNEL_PTSZ)

static CUresult launch_ex_slow(int k, const CUlaunchConfig *config, CUfunction f, void **kernelParams,
			       void **extra)
{
	launch_ex_fn fn = (launch_ex_fn)launch_fn(k);
	struct launch_decoded dd, *d = &dd;
	CUstream s;
	CUresult r;

	if (!fn)
		return real_absent(launch_names[k]);
	if (!config)
		return fn(config, f, kernelParams, extra); /* the driver says what is wrong */
	s = k == L_EX_PTSZ ? launch_ptsz_stream(config->hStream) : config->hStream;
	launch_before(d, f, s, kernelParams, extra);
	r = fn(config, f, kernelParams, extra);
	if (r == CUDA_SUCCESS)
		dag_record_launch(d);
	return r;
}

#define LAUNCH_EX_WRAPPER(name, k)                                                                \
	SHIM_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **kernelParams,  \
				  void **extra)                                                     \
	{                                                                                           \
		SHIM_KEEP_ERRNO;                                                                    \
		launch_ex_fn fn;                                                                    \
                                                                                                    \
		gate_pass();                                                                        \
		shim_count(SHIM_COUNT_KERNELS);                                                     \
		if (launch_decoding_on())                                                                     \
			return launch_ex_slow(k, config, f, kernelParams, extra);                   \
		fn = (launch_ex_fn)launch_fn(k);                                                    \
		if (!fn)                                                                            \
			return real_absent(#name);                                                  \
		return fn(config, f, kernelParams, extra);                                          \
	}

LAUNCH_EX_WRAPPER(cuLaunchKernelEx, L_EX)
LAUNCH_EX_WRAPPER(cuLaunchKernelEx_ptsz, L_EX_PTSZ)

static CUresult launch_coop_slow(int k, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
				 unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
				 void **kernelParams)
{
	launch_coop_fn fn = (launch_coop_fn)launch_fn(k);
	struct launch_decoded dd, *d = &dd;
	CUresult r;

	if (!fn)
		return real_absent(launch_names[k]);
	launch_before(d, f, k == L_COOP_PTSZ ? launch_ptsz_stream(s) : s, kernelParams, NULL);
	r = fn(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams);
	if (r == CUDA_SUCCESS)
		dag_record_launch(d);
	return r;
}

#define LAUNCH_COOP_WRAPPER(name, k)                                                                 \
	SHIM_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
				  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, \
				  CUstream s, void **kernelParams)                                     \
	{                                                                                              \
		SHIM_KEEP_ERRNO;                                                                       \
		launch_coop_fn fn;                                                                     \
                                                                                                       \
		gate_pass();                                                                           \
		shim_count(SHIM_COUNT_KERNELS);                                                        \
		if (launch_decoding_on())                                                                        \
			return launch_coop_slow(k, f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams); \
		fn = (launch_coop_fn)launch_fn(k);                                                     \
		if (!fn)                                                                               \
			return real_absent(#name);                                                     \
		return fn(f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams);                          \
	}

LAUNCH_COOP_WRAPPER(cuLaunchCooperativeKernel, L_COOP)
LAUNCH_COOP_WRAPPER(cuLaunchCooperativeKernel_ptsz, L_COOP_PTSZ)
