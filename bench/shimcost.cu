// shimcost: what gpucr's driver shim (libintercept) adds to the calls an
// application makes most often. Run once without the shim and once with it
// (bench/shimcost.sh runs both and prints them side by side):
//
//   launch  host-side time per call of an empty kernel launched on one stream
//           with 0, 4 and 16 pointer parameters (pointing into a real device
//           buffer, so the shim's decoder has something to look up), through
//           cuLaunchKernel linked directly, cuLaunchKernel as PyTorch and
//           Triton get it (cudaGetDriverEntryPointByVersion) and
//           cudaLaunchKernel. --launches launches per repetition, issued in
//           batches of --batch: only the launch loop of a batch is timed; the
//           stream is synchronised after each batch, outside the timed part, so
//           the launch queue never fills and no launch waits for the GPU.
//           A repetition's figure is the mean over its launches.
//   paired  the added cost itself, in one process: the linked cuLaunchKernel
//           (the shim's wrapper when the shim is in place) against the real
//           driver's (found among the loaded objects), batch by batch
//           alternately, per repetition the difference of the means, ns per
//           launch ("paired.cuLaunchKernel.pN.added"). Without the shim both
//           are the driver's and the figure is the method's noise floor.
//   alloc   cuMemAlloc/cuMemFree and cudaMalloc/cudaFree, 256 B to 1 GiB:
//           n allocations timed together, then their n frees (in allocation
//           order), µs per call; cuMemAllocAsync/cuMemFreeAsync (default pool,
//           one stream) up to 1 MiB. n is at most ALLOC_MAX_N and at most
//           what fits in ALLOC_BUDGET (at least 2): 200 calls up to 2 MiB, 64
//           of 16 MiB, 4 of 256 MiB, 2 of 1 GiB.
//   copy    64 MiB pinned host <-> device (cuMemAlloc'd) copies, GB/s: a
//           check that copies into the shim's memory did not get slower.
//
// Every figure is the median of --reps repetitions; spread is the largest
// less the smallest of them, the run-to-run noise of that figure. The
// repetitions of all figures of a section are interleaved, so a drift in
// clocks hits all alike. The defaults (5 x 50000 launches of 9 kinds, 5
// rounds of allocations) take about 15 s on a host where a launch costs 4 µs
// of host time.
//
//   shimcost [--launches N] [--batch N] [--reps N] [--only launch|alloc|copy]
//            (defaults: --launches 50000 --batch 500 --reps 5)
//
// Prints "SHIMCOST-INFO key=value ..." about the run, one
// "SHIMCOST name=NAME unit=UNIT value=MEDIAN min=MIN max=MAX spread=MAX-MIN
// reps=R n=CALLS" line per figure (R: repetitions measured; n: calls per
// repetition), the same as a table, and last
//
//   SHIMCOST-COUNTS launches=N copies=N memsets=0 shim_kernels=N shim_graphs=N
//                   shim_copies=N shim_memsets=N
//
// (one line): the kernel launches and copies this program issued (all of
// them, warm-up included; the runtime's cudaLaunchKernel counted as a
// launch) and what the shim counted (gpucr_shim_counts, gpucr_shim.h) at the
// same moment, or "shim_counts=unavailable" in place of the shim_* fields
// when no loaded object exports it (no shim). With the shim, shim_kernels
// must equal launches: every launch passed the shim.
// Exit 0; 1 on a CUDA error; 2 on a usage error; 77 when there is no GPU.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpucr_shim.h"

#define MAX_REPS 21
#define MAX_FIGS 64

static void die_cu(const char *what, CUresult r, int line)
{
	const char *name = NULL, *str = NULL;

	cuGetErrorName(r, &name);
	cuGetErrorString(r, &str);
	fprintf(stderr, "shimcost: line %d: %s: %s (%s)\n", line, what, name ? name : "?",
		str ? str : "?");
	exit(1);
}

#define CU(x)                                                                            \
	do {                                                                             \
		CUresult r_ = (x);                                                       \
		if (r_ != CUDA_SUCCESS)                                                  \
			die_cu(#x, r_, __LINE__);                                        \
	} while (0)
#define RT(x)                                                                            \
	do {                                                                             \
		cudaError_t e_ = (x);                                                    \
		if (e_ != cudaSuccess) {                                                 \
			fprintf(stderr, "shimcost: line %d: %s: %s (%s)\n", __LINE__, #x, \
				cudaGetErrorName(e_), cudaGetErrorString(e_));           \
			exit(1);                                                         \
		}                                                                        \
	} while (0)

extern "C" __global__ void k0(void) {}
extern "C" __global__ void k4(void *, void *, void *, void *) {}
extern "C" __global__ void k16(void *, void *, void *, void *, void *, void *, void *, void *,
			       void *, void *, void *, void *, void *, void *, void *, void *)
{
}

// Calls this program issued, for the SHIMCOST-COUNTS line.
static uint64_t issued_launches, issued_copies;

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// ---- figures -----------------------------------------------------------------

struct fig {
	char name[64];
	const char *unit;
	double v[MAX_REPS];
	int nv;
	long calls;
};

static struct fig figs[MAX_FIGS];
static int nfigs;

static struct fig *fig_get(const char *name, const char *unit, long calls)
{
	for (int i = 0; i < nfigs; i++)
		if (!strcmp(figs[i].name, name))
			return &figs[i];
	if (nfigs == MAX_FIGS) {
		fprintf(stderr, "shimcost: too many figures\n");
		exit(1);
	}
	struct fig *f = &figs[nfigs++];
	snprintf(f->name, sizeof(f->name), "%s", name);
	f->unit = unit;
	f->calls = calls;
	return f;
}

static void fig_add(const char *name, const char *unit, long calls, double v)
{
	struct fig *f = fig_get(name, unit, calls);

	if (f->nv < MAX_REPS)
		f->v[f->nv++] = v;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void fig_summary(struct fig *f, double *med, double *mn, double *mx)
{
	double s[MAX_REPS];

	memcpy(s, f->v, sizeof(double) * f->nv);
	qsort(s, f->nv, sizeof(double), cmp_double);
	*mn = s[0];
	*mx = s[f->nv - 1];
	*med = f->nv % 2 ? s[f->nv / 2] : (s[f->nv / 2 - 1] + s[f->nv / 2]) / 2;
}

static void print_figs(int reps)
{
	double med, mn, mx;

	for (int i = 0; i < nfigs; i++) {
		fig_summary(&figs[i], &med, &mn, &mx);
		printf("SHIMCOST name=%s unit=%s value=%.3f min=%.3f max=%.3f spread=%.3f reps=%d n=%ld\n",
		       figs[i].name, figs[i].unit, med, mn, mx, mx - mn, figs[i].nv, figs[i].calls);
	}
	printf("\nmedian of %d repetitions (--reps) per figure; spread: max - min over them\n", reps);
	printf("%-40s %-5s %12s %12s %12s %12s %4s %9s\n", "figure", "unit", "median", "min", "max",
	       "spread", "reps", "calls/rep");
	for (int i = 0; i < nfigs; i++) {
		fig_summary(&figs[i], &med, &mn, &mx);
		printf("%-40s %-5s %12.3f %12.3f %12.3f %12.3f %4d %9ld\n", figs[i].name, figs[i].unit,
		       med, mn, mx, mx - mn, figs[i].nv, figs[i].calls);
	}
}

// ---- launches -----------------------------------------------------------------

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
			      unsigned, unsigned, CUstream, void **, void **);

enum api { API_DRIVER, API_ENTRY, API_RUNTIME };

static const char *const api_names[] = { "cuLaunchKernel", "cuLaunchKernel-entrypoint",
					 "cudaLaunchKernel" };

// Host time of `total` launches in batches of `batch`, ns per launch. The
// api test is on a template constant: the loop holds one call and no branch.
template <int A>
static double time_launches(CUfunction f, const void *sym, void **params, launch_fn entry,
			    CUstream s, long total, long batch)
{
	uint64_t busy = 0;
	int bad = 0;

	for (long done = 0; done < total;) {
		long b = total - done < batch ? total - done : batch;
		uint64_t t0 = now_ns();

		for (long i = 0; i < b; i++) {
			if (A == API_DRIVER)
				bad |= cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
			else if (A == API_ENTRY)
				bad |= entry(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
			else
				bad |= cudaLaunchKernel(sym, dim3(1), dim3(1), params, 0,
							(cudaStream_t)s);
		}
		busy += now_ns() - t0;
		done += b;
		issued_launches += (uint64_t)b;
		CU(cuStreamSynchronize(s)); // outside the timed loop
	}
	if (bad) {
		fprintf(stderr, "shimcost: %s failed during the timed loop\n", api_names[A]);
		exit(1);
	}
	return (double)busy / (double)total;
}

// Host time of b launches through fn, ns (the stream is synchronised after,
// untimed). Only launches through the linked cuLaunchKernel go into the
// SHIMCOST-COUNTS total: those through the real driver bypass the shim on
// purpose (without the shim, the two are the same function).
static uint64_t time_batch(launch_fn fn, CUfunction f, void **params, CUstream s, long b)
{
	int bad = 0;
	uint64_t t0 = now_ns(), t;

	for (long i = 0; i < b; i++)
		bad |= fn(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
	t = now_ns() - t0;
	if (fn == (launch_fn)cuLaunchKernel)
		issued_launches += (uint64_t)b;
	if (bad) {
		fprintf(stderr, "shimcost: a launch failed during the paired loop\n");
		exit(1);
	}
	CU(cuStreamSynchronize(s));
	return t;
}

// The paired figure: the cuLaunchKernel this program links (the shim's, when
// it is in place) against the real driver's, in the same process, batch by
// batch alternately (which goes first alternates too), so that what differs
// between two processes (clocks, cores, where the driver's queues landed)
// falls out. A repetition's figure is the difference of the two means, ns
// per launch. Without the shim both are the driver's: the figure is then the
// method's own noise.
static void bench_paired(launch_fn real, const CUfunction *fn, const int *nparams, void **args, CUstream s,
			 int reps, long total, long batch)
{
	launch_fn linked = cuLaunchKernel;
	char name[64];

	printf("SHIMCOST-INFO section=paired real_cuLaunchKernel=%p linked_cuLaunchKernel=%p same=%d\n",
	       (void *)real, (void *)linked, real == linked);
	for (int r = 0; r < reps; r++)
		for (int k = 0; k < 3; k++) {
			void **p = nparams[k] ? args : NULL;
			uint64_t tl = 0, tr = 0;
			long n = 0;

			for (long done = 0, i = 0; done < total; done += batch, i++) {
				long b = total - done < batch ? total - done : batch;

				if (i & 1) {
					tr += time_batch(real, fn[k], p, s, b);
					tl += time_batch(linked, fn[k], p, s, b);
				} else {
					tl += time_batch(linked, fn[k], p, s, b);
					tr += time_batch(real, fn[k], p, s, b);
				}
				n += b;
			}
			snprintf(name, sizeof(name), "paired.cuLaunchKernel.p%d.added", nparams[k]);
			fig_add(name, "ns", n, ((double)tl - (double)tr) / (double)n);
		}
}

static void bench_launch(int reps, long total, long batch, launch_fn real)
{
	const void *syms[3] = { (const void *)k0, (const void *)k4, (const void *)k16 };
	const int nparams[3] = { 0, 4, 16 };
	CUfunction fn[3];
	void *ptr[16], *args[16];
	launch_fn entry = NULL;
	cudaDriverEntryPointQueryResult q;
	CUdeviceptr dbuf;
	CUstream s;
	char name[64];

	for (int k = 0; k < 3; k++)
		RT(cudaGetFuncBySymbol(&fn[k], syms[k]));
	RT(cudaGetDriverEntryPointByVersion("cuLaunchKernel", (void **)&entry, 12000,
					    cudaEnableDefault, &q));
	if (q != cudaDriverEntryPointSuccess || !entry) {
		fprintf(stderr, "shimcost: cuLaunchKernel entry point not found\n");
		exit(1);
	}
	CU(cuMemAlloc(&dbuf, 16 * 4096));
	for (int i = 0; i < 16; i++) {
		ptr[i] = (void *)(uintptr_t)(dbuf + (CUdeviceptr)i * 4096);
		args[i] = &ptr[i];
	}
	CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	printf("SHIMCOST-INFO section=launch launches=%ld batch=%ld reps=%d rep_value=mean-per-launch grid=1 block=1 "
	       "stream=created-nonblocking sync=cuStreamSynchronize-after-each-batch-untimed\n",
	       total, batch, reps);
	fflush(stdout);

	// Warm-up: module loading, the shim's layout cache, the driver's queues.
	for (int k = 0; k < 3; k++) {
		void **p = nparams[k] ? args : NULL;
		time_launches<API_DRIVER>(fn[k], syms[k], p, entry, s, 2 * batch, batch);
		time_launches<API_ENTRY>(fn[k], syms[k], p, entry, s, 2 * batch, batch);
		time_launches<API_RUNTIME>(fn[k], syms[k], p, entry, s, 2 * batch, batch);
	}
	for (int r = 0; r < reps; r++)
		for (int a = API_DRIVER; a <= API_RUNTIME; a++)
			for (int k = 0; k < 3; k++) {
				void **p = nparams[k] ? args : NULL;
				double ns;

				if (a == API_DRIVER)
					ns = time_launches<API_DRIVER>(fn[k], syms[k], p, entry, s, total, batch);
				else if (a == API_ENTRY)
					ns = time_launches<API_ENTRY>(fn[k], syms[k], p, entry, s, total, batch);
				else
					ns = time_launches<API_RUNTIME>(fn[k], syms[k], p, entry, s, total, batch);
				snprintf(name, sizeof(name), "launch.%s.p%d", api_names[a], nparams[k]);
				fig_add(name, "ns", total, ns);
			}
	if (real)
		bench_paired(real, fn, nparams, args, s, reps, total, batch);
	else
		printf("SHIMCOST-INFO section=paired skipped=the-real-driver's-cuLaunchKernel-not-found\n");
	CU(cuStreamDestroy(s));
	CU(cuMemFree(dbuf));
}

// ---- allocation ---------------------------------------------------------------

struct size_row {
	size_t bytes;
	const char *label;
};

static const struct size_row sizes[] = {
	{ 256, "256B" },	   { 4096, "4KiB" },	       { 65536, "64KiB" },
	{ 1 << 20, "1MiB" },	   { 2 << 20, "2MiB" },	       { 16 << 20, "16MiB" },
	{ 256 << 20, "256MiB" },  { 1ull << 30, "1GiB" },
};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define ASYNC_MAX (1u << 20)
#define ALLOC_BUDGET (1ull << 30) // device memory one size may hold at once
#define ALLOC_MAX_N 200	     // calls per size and repetition, at most
#define ALLOC_MIN_N 2	     // ... and at least, whatever the budget

enum alloc_api { AL_CU, AL_CUDA, AL_ASYNC };
static const char *const alloc_names[][2] = {
	{ "cuMemAlloc", "cuMemFree" },
	{ "cudaMalloc", "cudaFree" },
	{ "cuMemAllocAsync", "cuMemFreeAsync" },
};

static long alloc_count(size_t bytes)
{
	unsigned long long n = ALLOC_BUDGET / bytes;

	return n > ALLOC_MAX_N ? ALLOC_MAX_N : n < ALLOC_MIN_N ? ALLOC_MIN_N : (long)n;
}

// n allocations of one size then their frees, each group timed; 0 when the
// device has not the memory (skipped), 1 when done.
static int alloc_round(enum alloc_api a, size_t bytes, long n, CUdeviceptr *p, CUstream s,
		       double *ret_alloc_us, double *ret_free_us)
{
	uint64_t t0, t1, t2;
	long i;

	t0 = now_ns();
	for (i = 0; i < n; i++) {
		CUresult r;

		if (a == AL_CU)
			r = cuMemAlloc(&p[i], bytes);
		else if (a == AL_ASYNC)
			r = cuMemAllocAsync(&p[i], bytes, s);
		else {
			void *q = NULL;
			cudaError_t e = cudaMalloc(&q, bytes);

			p[i] = (CUdeviceptr)(uintptr_t)q;
			if (e != cudaSuccess && e != cudaErrorMemoryAllocation)
				RT(e);
			r = e == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
		}
		if (r == CUDA_ERROR_OUT_OF_MEMORY)
			break;
		if (r != CUDA_SUCCESS)
			die_cu(alloc_names[a][0], r, __LINE__);
	}
	t1 = now_ns();
	if (i < n) { // out of memory: give back what was taken, report nothing
		(void)cudaGetLastError();
		while (i--)
			if (a == AL_CUDA)
				RT(cudaFree((void *)p[i]));
			else if (a == AL_ASYNC)
				CU(cuMemFreeAsync(p[i], s));
			else
				CU(cuMemFree(p[i]));
		CU(cuStreamSynchronize(s));
		return 0;
	}
	for (i = 0; i < n; i++)
		if (a == AL_CU)
			CU(cuMemFree(p[i]));
		else if (a == AL_ASYNC)
			CU(cuMemFreeAsync(p[i], s));
		else
			RT(cudaFree((void *)p[i]));
	t2 = now_ns();
	CU(cuStreamSynchronize(s)); // the pool's work, not timed
	*ret_alloc_us = (double)(t1 - t0) / 1e3 / (double)n;
	*ret_free_us = (double)(t2 - t1) / 1e3 / (double)n;
	return 1;
}

static void bench_alloc(int reps)
{
	CUdeviceptr *p = (CUdeviceptr *)calloc(ALLOC_MAX_N, sizeof(*p));
	int skipped[3][NSIZES] = { { 0 } };
	char name[64];
	CUstream s;

	if (!p)
		exit(1);
	CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	printf("SHIMCOST-INFO section=alloc reps=%d order=alloc-n-then-free-n-in-allocation-order "
	       "budget_per_size=%llu max_calls_per_size=%d min_calls_per_size=%d "
	       "async_pool=default async_stream=created-nonblocking\n",
	       reps, (unsigned long long)ALLOC_BUDGET, ALLOC_MAX_N, ALLOC_MIN_N);
	fflush(stdout);
	for (int r = 0; r < reps; r++)
		for (size_t z = 0; z < NSIZES; z++)
			for (int a = AL_CU; a <= AL_ASYNC; a++) {
				double au, fu;
				long n = alloc_count(sizes[z].bytes);

				if (a == AL_ASYNC && sizes[z].bytes > ASYNC_MAX)
					continue;
				if (!alloc_round((enum alloc_api)a, sizes[z].bytes, n, p, s, &au, &fu)) {
					if (!skipped[a][z]++)
						printf("SHIMCOST-INFO skipped=%s.%s reason=out-of-memory n=%ld\n",
						       alloc_names[a][0], sizes[z].label, n);
					continue;
				}
				snprintf(name, sizeof(name), "alloc.%s.%s", alloc_names[a][0], sizes[z].label);
				fig_add(name, "us", n, au);
				snprintf(name, sizeof(name), "free.%s.%s", alloc_names[a][1], sizes[z].label);
				fig_add(name, "us", n, fu);
			}
	CU(cuStreamDestroy(s));
	free(p);
}

// ---- copies -------------------------------------------------------------------

#define COPY_BYTES (64ull << 20)
#define COPY_N 16

static void bench_copy(int reps)
{
	CUdeviceptr d;
	void *h;
	CUstream s;

	CU(cuMemAlloc(&d, COPY_BYTES));
	CU(cuMemHostAlloc(&h, COPY_BYTES, 0));
	memset(h, 0x5a, COPY_BYTES);
	CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	printf("SHIMCOST-INFO section=copy bytes=%llu copies_per_rep=%d reps=%d host=cuMemHostAlloc "
	       "device=cuMemAlloc api=cuMemcpyHtoDAsync/cuMemcpyDtoHAsync+cuStreamSynchronize\n",
	       (unsigned long long)COPY_BYTES, COPY_N, reps);
	fflush(stdout);
	CU(cuMemcpyHtoDAsync(d, h, COPY_BYTES, s)); // warm-up
	CU(cuMemcpyDtoHAsync(h, d, COPY_BYTES, s));
	issued_copies += 2;
	CU(cuStreamSynchronize(s));
	for (int r = 0; r < reps; r++)
		for (int dir = 0; dir < 2; dir++) {
			uint64_t t0 = now_ns();

			for (int i = 0; i < COPY_N; i++)
				if (dir == 0)
					CU(cuMemcpyHtoDAsync(d, h, COPY_BYTES, s));
				else
					CU(cuMemcpyDtoHAsync(h, d, COPY_BYTES, s));
			CU(cuStreamSynchronize(s));
			double sec = (double)(now_ns() - t0) / 1e9;

			issued_copies += COPY_N;
			fig_add(dir == 0 ? "copy.HtoD.64MiB" : "copy.DtoH.64MiB", "GB/s", COPY_N,
				(double)COPY_BYTES * COPY_N / sec / 1e9);
		}
	CU(cuStreamDestroy(s));
	CU(cuMemFreeHost(h));
	CU(cuMemFree(d));
}

// ---- setup --------------------------------------------------------------------

// Every loaded object named libcuda*: two of them (gpucr's and the real one)
// mean the shim is in place.
#define MAX_LIBS 4

struct libs {
	char list[2048];
	const char *path[MAX_LIBS]; // dlpi_name: valid while the object stays loaded
	int n;
};

static int note_lib(struct dl_phdr_info *info, size_t, void *arg)
{
	struct libs *l = (struct libs *)arg;
	const char *base = strrchr(info->dlpi_name, '/');

	base = base ? base + 1 : info->dlpi_name;
	if (strncmp(base, "libcuda.so", 10))
		return 0;
	size_t len = strlen(l->list);
	snprintf(l->list + len, sizeof(l->list) - len, "%s%s", l->n ? "," : "", info->dlpi_name);
	if (l->n < MAX_LIBS)
		l->path[l->n] = info->dlpi_name;
	l->n++;
	return 0;
}

typedef int (*shim_counts_fn)(struct gpucr_shim_counts *, size_t);

// gpucr_shim_counts from whichever loaded object exports it, or NULL (no
// shim). The shim is the libcuda.so.1 this program links, so the global
// scope should have it; the loaded libcuda objects are asked by path as well
// (RTLD_NOLOAD: nothing new is loaded), in case it sits in a local scope.
// dlopen runs after dl_iterate_phdr, never inside its callback.
static shim_counts_fn find_shim_counts(const struct libs *l)
{
	void *f = dlsym(RTLD_DEFAULT, "gpucr_shim_counts");

	for (int i = 0; !f && i < l->n && i < MAX_LIBS; i++) {
		void *h = dlopen(l->path[i], RTLD_NOLOAD | RTLD_LAZY);

		if (!h)
			continue;
		f = dlsym(h, "gpucr_shim_counts");
		dlclose(h); // drops the reference NOLOAD took; the object stays loaded
	}
	return (shim_counts_fn)f;
}

// The real driver's cuLaunchKernel: from the loaded libcuda object that does
// not export gpucr_shim_counts (without the shim, the only one), or NULL.
static launch_fn find_real_launch(const struct libs *l)
{
	void *f = NULL;

	for (int i = 0; !f && i < l->n && i < MAX_LIBS; i++) {
		void *h = dlopen(l->path[i], RTLD_NOLOAD | RTLD_LAZY);

		if (!h)
			continue;
		if (!dlsym(h, "gpucr_shim_counts"))
			f = dlsym(h, "cuLaunchKernel");
		dlclose(h);
	}
	return (launch_fn)f;
}

// The SHIMCOST-COUNTS line: what this program issued against what the shim
// counted, read after everything issued has been synchronised.
static void print_counts(const struct libs *l)
{
	shim_counts_fn fn = find_shim_counts(l);
	struct gpucr_shim_counts c;

	printf("\nSHIMCOST-COUNTS launches=%llu copies=%llu memsets=0", (unsigned long long)issued_launches,
	       (unsigned long long)issued_copies);
	memset(&c, 0, sizeof(c));
	if (fn && fn(&c, sizeof(c)) == (int)sizeof(c))
		printf(" shim_kernels=%llu shim_graphs=%llu shim_copies=%llu shim_memsets=%llu\n",
		       (unsigned long long)c.kernels, (unsigned long long)c.graphs,
		       (unsigned long long)c.copies, (unsigned long long)c.memsets);
	else
		printf(" shim_counts=unavailable\n");
}

static void usage(FILE *to, int code)
{
	fprintf(to, "usage: shimcost [--launches N] [--batch N] [--reps N] [--only launch|alloc|copy]\n"
		    "defaults: --launches 50000 --batch 500 --reps 5 (reps at most %d); "
		    "see bench/shimcost.cu for what is measured\n",
		MAX_REPS);
	exit(code);
}

int main(int argc, char **argv)
{
	long launches = 50000, batch = 500;
	int reps = 5, drv = 0, rtv = 0;
	const char *only = NULL;
	struct libs libs = {};
	char devname[256];
	CUresult r;
	CUdevice dev;
	CUcontext ctx;
	int ndev = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--launches") && i + 1 < argc)
			launches = atol(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			batch = atol(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			usage(stdout, 0);
		else
			usage(stderr, 2);
	}
	if (launches < 1 || batch < 1 || reps < 1 || reps > MAX_REPS ||
	    (only && strcmp(only, "launch") && strcmp(only, "alloc") && strcmp(only, "copy")))
		usage(stderr, 2);

	r = cuInit(0);
	if (r == CUDA_SUCCESS)
		r = cuDeviceGetCount(&ndev);
	if (r != CUDA_SUCCESS || ndev < 1) {
		const char *name = NULL;

		if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
			name = "?";
		fprintf(stderr, "shimcost: no CUDA device here (cuInit/cuDeviceGetCount: %s (%d), %d devices)\n",
			name, (int)r, ndev);
		return 77;
	}
	RT(cudaSetDevice(0));
	RT(cudaFree(0)); // the primary context, current for the driver calls too
	CU(cuCtxGetCurrent(&ctx));
	CU(cuCtxGetDevice(&dev));
	CU(cuDeviceGetName(devname, sizeof(devname), dev));
	CU(cuDriverGetVersion(&drv));
	RT(cudaRuntimeGetVersion(&rtv));
	dl_iterate_phdr(note_lib, &libs);
	for (char *c = devname; *c; c++)
		if (*c == ' ')
			*c = '-';
	printf("SHIMCOST-INFO device=%s driver=%d runtime=%d shim=%d libcuda=%s gpucr_daemon=%s\n",
	       devname, drv, rtv, libs.n > 1, libs.list[0] ? libs.list : "?",
	       getenv("GPUCR_DAEMON") ? getenv("GPUCR_DAEMON") : "unset");
	fflush(stdout);

	if (!only || !strcmp(only, "launch"))
		bench_launch(reps, launches, batch, find_real_launch(&libs));
	if (!only || !strcmp(only, "alloc"))
		bench_alloc(reps);
	if (!only || !strcmp(only, "copy"))
		bench_copy(reps);
	CU(cuCtxSynchronize());
	print_figs(reps);
	print_counts(&libs);
	return 0;
}
