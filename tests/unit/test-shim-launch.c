/* Launch decoding (launch.h): with decoding on, each launch's parameters
 * are scanned for values inside known buffers, through kernelParams (a
 * pointer, a size_t, a by-value struct holding two pointers, a pointer into
 * the middle of a buffer, a number inside no buffer, a 4-byte-aligned
 * struct that cannot hold a pointer) and through `extra`'s packed buffer,
 * for cuLaunchKernel (the exported symbol and a cuGetProcAddress pointer),
 * cuLaunchKernelEx and cuLaunchCooperativeKernel; the layout is asked of
 * the driver once per function; with decoding off nothing is decoded.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * GPUCR_DAEMON=0 keeps the control thread out of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buftab.h"
#include "fakecuda.h"
#include "launch.h"
#include "t.h"
#include "shimtest.h"

#define MIB (1UL << 20)

typedef int (*reg_fn)(const char *, fakecuda_kernel_fn, int, const size_t *);
typedef int (*reg_aligned_fn)(const char *, fakecuda_kernel_fn, int, const size_t *, const size_t *);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

struct two_ptrs {
	int a;
	int pad;
	CUdeviceptr p1; /* offset 8 */
	long x;
	CUdeviceptr p2; /* offset 24 */
};

struct four4 {
	int x, y;
};

static void noop(void **params, unsigned grid[3], unsigned block[3])
{
	(void)params;
	(void)grid;
	(void)block;
}

/* What the observer saw last, and how often it was called. */
static struct launch_decoded last;
static int observed;

static void observe(const struct launch_decoded *d, void *arg)
{
	(void)arg;
	memcpy(&last, d, sizeof(last));
	observed++;
}

static struct buf buf_of(CUdeviceptr p)
{
	struct buf b;

	REQUIRE(buftab_lookup(p, &b) == 0);
	return b;
}

/* The last decoded launch named exactly the buffers ids[0..n) (any order). */
static int touched_exactly(const uint64_t *ids, unsigned n)
{
	if (last.flags & LAUNCH_F_UNKNOWN) {
		fprintf(stderr, "decoded as unknown\n");
		return 0;
	}
	if (last.ntouch != n) {
		fprintf(stderr, "%u buffers decoded, expected %u\n", last.ntouch, n);
		return 0;
	}
	for (unsigned i = 0; i < n; i++) {
		unsigned k;

		for (k = 0; k < last.ntouch; k++)
			if (last.touch[k].buf_id == ids[i])
				break;
		if (k == last.ntouch) {
			fprintf(stderr, "buffer %u (id %llx) not decoded\n", i, (unsigned long long)ids[i]);
			return 0;
		}
		struct buf b = { 0 };

		REQUIRE(buftab_lookup(last.touch[k].base, &b) == 0);
		if (b.id != ids[i] || last.touch[k].size != b.size) {
			fprintf(stderr, "buffer %u: range is not the whole buffer\n", i);
			return 0;
		}
	}
	return 1;
}

#define LAUNCH_OK(f, params, extra) \
	CHECK_EQ_INT(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, extra), CUDA_SUCCESS)

int main(void)
{
	static const size_t ptr_sizes[] = { 4, 8 };          /* (int n, float *p) */
	static const size_t size_sizes[] = { 8 };            /* (size_t n) */
	static const size_t struct_sizes[] = { 1, 32, 4 };   /* (char, struct two_ptrs, int) */
	static const size_t four_sizes[] = { 4, 8 };         /* (int, struct four4) */
	static const size_t four_aligns[] = { 4, 4 };
	CUfunction fptr, fsize, fstruct, ffour;
	CUdeviceptr A, B, C, notptr;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUstream s;
	struct buf bA, bB, bC, tmp;
	reg_fn reg;
	reg_aligned_fn reg_aligned;
	int n = 3;

	use_fake();
	setenv("GPUCR_DAEMON", "0", 1);
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	reg = (reg_fn)fakecuda_sym("fakecuda_register_kernel");
	reg_aligned = (reg_aligned_fn)fakecuda_sym("fakecuda_register_kernel_aligned");
	REQUIRE(reg && reg_aligned);
	REQUIRE(reg("kptr", noop, 2, ptr_sizes) == 0);
	REQUIRE(reg("ksize", noop, 1, size_sizes) == 0);
	REQUIRE(reg("kstruct", noop, 3, struct_sizes) == 0);
	REQUIRE(reg_aligned("kfour", noop, 2, four_sizes, four_aligns) == 0);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuModuleLoadData(&mod, "fake") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fptr, mod, "kptr") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fsize, mod, "ksize") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&fstruct, mod, "kstruct") == CUDA_SUCCESS);
	REQUIRE(cuModuleGetFunction(&ffour, mod, "kfour") == CUDA_SUCCESS);
	REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&A, 5 * MIB) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&B, 64 * 1024) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&C, 3 * MIB) == CUDA_SUCCESS);
	bA = buf_of(A);
	bB = buf_of(B);
	bC = buf_of(C);
	/* A number that looks like an address but lies in no buffer. */
	notptr = A + 64 * 1024 * MIB + 0x1234;
	REQUIRE(buftab_lookup(notptr, &tmp) == -ENOENT);

	launch_set_observer(observe, NULL);

	/* Decoding off: the launch goes through, nothing is decoded, and the
	 * layout is not even asked for. */
	{
		void *params[] = { &n, &A };

		CHECK_EQ_INT(launch_decoding, 0);
		LAUNCH_OK(fptr, params, NULL);
		CHECK_EQ_INT(observed, 0);
		CHECK_EQ_INT(launch_paraminfo_calls(), 0);
		CHECK_EQ_INT(launch_layouts_cached(), 0);
	}

	launch_decode_hold();

	/* A plain pointer after an int: the layout costs nparams + 1 queries
	 * (the last answers CUDA_ERROR_INVALID_VALUE), once. */
	{
		void *params[] = { &n, &A };
		uint64_t want[] = { bA.id };

		LAUNCH_OK(fptr, params, NULL);
		CHECK_EQ_INT(observed, 1);
		CHECK(touched_exactly(want, 1));
		CHECK(last.func == fptr);
		CHECK(last.stream == NULL);
		CHECK_EQ_INT(launch_paraminfo_calls(), 3);
		CHECK_EQ_INT(launch_layouts_cached(), 1);
		LAUNCH_OK(fptr, params, NULL);
		CHECK_EQ_INT(observed, 2);
		CHECK(touched_exactly(want, 1));
		CHECK_EQ_INT(launch_paraminfo_calls(), 3);
	}

	/* A pointer into the middle of a buffer names the whole buffer. */
	{
		CUdeviceptr mid = A + 4 * MIB + 12;
		void *params[] = { &n, &mid };
		uint64_t want[] = { bA.id };

		LAUNCH_OK(fptr, params, NULL);
		CHECK(touched_exactly(want, 1));
		CHECK(last.touch[0].base == A && last.touch[0].size == 5 * MIB);
		CHECK_EQ_INT(launch_paraminfo_calls(), 3);
	}

	/* A size_t, and a number inside no buffer: nothing. */
	{
		size_t len = 4096 * 10;
		void *params[] = { &len };

		LAUNCH_OK(fsize, params, NULL);
		CHECK(touched_exactly(NULL, 0));
		params[0] = &notptr;
		LAUNCH_OK(fsize, params, NULL);
		CHECK(touched_exactly(NULL, 0));
		CHECK_EQ_INT(launch_paraminfo_calls(), 3 + 2);
	}

	/* A by-value struct with pointers at offsets 8 and 24 (into B and into
	 * the middle of C), its other words numbers. */
	{
		char c = 'x';
		int tail = 5;
		struct two_ptrs v = { .a = 1, .p1 = B + 100, .x = (long)notptr, .p2 = C + MIB };
		void *params[] = { &c, &v, &tail };
		uint64_t want[] = { bB.id, bC.id };

		CHECK_EQ_INT(cuLaunchKernel(fstruct, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
		CHECK(touched_exactly(want, 2));
		CHECK(last.stream == s);
		CHECK_EQ_INT(launch_paraminfo_calls(), 5 + 4);

		/* The same through `extra`: the packed buffer, at the driver's
		 * offsets (0, 8, 40). A pointer past the last parameter is none. */
		unsigned char packed[56];
		size_t packed_size = sizeof(packed);
		CUdeviceptr stray = A;
		void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
				  &packed_size, CU_LAUNCH_PARAM_END };

		memset(packed, 0, sizeof(packed));
		memcpy(packed, &c, 1);
		memcpy(packed + 8, &v, sizeof(v));
		memcpy(packed + 40, &tail, sizeof(tail));
		memcpy(packed + 48, &stray, sizeof(stray));
		LAUNCH_OK(fstruct, NULL, extra);
		CHECK(touched_exactly(want, 2));
		CHECK(last.flags & LAUNCH_F_EXTRA);
		CHECK_EQ_INT(launch_paraminfo_calls(), 9);

		/* Different values in the struct: only A now. */
		v.p1 = A;
		v.p2 = A + 5 * MIB - 8;
		memcpy(packed + 8, &v, sizeof(v));
		{
			uint64_t wantA[] = { bA.id };

			LAUNCH_OK(fstruct, NULL, extra);
			CHECK(touched_exactly(wantA, 1));
		}
	}

	/* A struct of two ints at offset 4 holds no 8-aligned word: nothing,
	 * even when its bytes spell an address. */
	{
		int i = 0;
		struct four4 f4;
		void *params[] = { &i, &f4 };

		memcpy(&f4, &B, sizeof(f4));
		LAUNCH_OK(ffour, params, NULL);
		CHECK(touched_exactly(NULL, 0));
	}

	/* Through a pointer from cuGetProcAddress: gpucr's wrapper, decoded. */
	{
		gpa_v2_fn gpa = NULL;
		CUresult (*lk)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
			       unsigned int, unsigned int, CUstream, void **, void **) = NULL;
		CUdriverProcAddressQueryResult st;
		void *params[] = { &n, &C };
		uint64_t want[] = { bC.id };
		int before = observed;

		REQUIRE(cuGetProcAddress_v2("cuGetProcAddress", (void **)&gpa, CUDA_VERSION, 0, &st) ==
			CUDA_SUCCESS);
		REQUIRE(gpa("cuLaunchKernel", (void **)&lk, CUDA_VERSION, 0, &st) == CUDA_SUCCESS);
		CHECK((void *)lk == (void *)cuLaunchKernel);
		CHECK_EQ_INT(lk(fptr, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
		CHECK_EQ_INT(observed, before + 1);
		CHECK(touched_exactly(want, 1));
	}

	/* cuLaunchKernelEx: the stream comes from the config. */
	{
		CUlaunchConfig cfg;
		void *params[] = { &n, &B };
		uint64_t want[] = { bB.id };

		memset(&cfg, 0, sizeof(cfg));
		cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
		cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
		cfg.hStream = s;
		CHECK_EQ_INT(cuLaunchKernelEx(&cfg, fptr, params, NULL), CUDA_SUCCESS);
		CHECK(touched_exactly(want, 1));
		CHECK(last.stream == s);
		CHECK(last.func == fptr);
	}

	/* cuLaunchCooperativeKernel. */
	{
		void *params[] = { &n, &C };
		uint64_t want[] = { bC.id };

		CHECK_EQ_INT(cuLaunchCooperativeKernel(fptr, 1, 1, 1, 1, 1, 1, 0, s, params), CUDA_SUCCESS);
		CHECK(touched_exactly(want, 1));
	}

	/* An `extra` option the decoder does not know: unknown. */
	{
		struct launch_decoded d;
		void *extra[] = { (void *)0x77, NULL, CU_LAUNCH_PARAM_END };

		launch_decode(fptr, NULL, NULL, extra, &d);
		CHECK(d.flags & LAUNCH_F_UNKNOWN);
	}

	/* The same pointer twice names the buffer once. */
	{
		struct two_ptrs v = { .p1 = C, .p2 = C + 8 };
		char c = 0;
		int tail = 0;
		void *params[] = { &c, &v, &tail };
		uint64_t want[] = { bC.id };

		LAUNCH_OK(fstruct, params, NULL);
		CHECK(touched_exactly(want, 1));
	}
	CHECK_EQ_INT(launch_paraminfo_calls(), 9 + 3);
	CHECK_EQ_INT(launch_layouts_cached(), 4);

	/* Off again: nothing more is observed. */
	launch_decode_release();
	{
		void *params[] = { &n, &A };
		int before = observed;

		LAUNCH_OK(fptr, params, NULL);
		CHECK_EQ_INT(observed, before);
	}
	launch_set_observer(NULL, NULL);

	CHECK_EQ_INT(cuMemFree_v2(A), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(B), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemFree_v2(C), CUDA_SUCCESS);
	return t_done();
}
