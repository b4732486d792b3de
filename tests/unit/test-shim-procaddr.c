/* cuGetProcAddress hands out gpucr's wrappers: asking for "cuGetProcAddress"
 * yields the shim's own lookup (as cudart does before anything else), and
 * lookups through that pointer give the shim's cuMemAlloc_v2, cuMemFree_v2,
 * cuGetExportTable ... for the variant the driver picks, while names gpucr
 * does not wrap give gpucr's trampoline of the driver's symbol (which tests
 * the gate), never the driver's function. Memory allocated through a
 * looked-up pointer is gpucr's (VMM, so it has an allocation handle).
 *
 * Linked against the shim; sets GPUCR_REAL_LIBCUDA to the fake. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include "t.h"
#include "shimtest.h"

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static void *shim(const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static void *lookup(gpa_v2_fn gpa, const char *name, cuuint64_t flags)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *p = NULL;
	CUresult r = gpa(name, &p, CUDA_VERSION, flags, &st);

	if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS) {
		fprintf(stderr, "lookup of %s (flags %#llx): result %d, status %d\n", name,
			(unsigned long long)flags, (int)r, (int)st);
		return NULL;
	}
	return p;
}

int main(void)
{
	static const struct {
		const char *name;
		const char *wrapper;
	} wrapped[] = {
		{ "cuMemAlloc", "cuMemAlloc_v2" },
		{ "cuMemFree", "cuMemFree_v2" },
		{ "cuMemAllocPitch", "cuMemAllocPitch_v2" },
		{ "cuMemGetAddressRange", "cuMemGetAddressRange_v2" },
		{ "cuPointerGetAttribute", "cuPointerGetAttribute" },
		{ "cuGetExportTable", "cuGetExportTable" },
	};
	gpa_v2_fn gpa;
	gpa_v1_fn gpa1;
	void *p, *fake;
	alloc_fn alloc;
	free_fn mfree;
	CUcontext ctx;
	CUdevice dev;
	CUdeviceptr d;
	CUmemGenericAllocationHandle h;
	size_t i;

	alarm(60);
	use_fake();
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	fake = dlopen(getenv("GPUCR_REAL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(fake);

	/* cudart's first step: the lookup function itself, which must be ours. */
	gpa = (gpa_v2_fn)lookup((gpa_v2_fn)shim("cuGetProcAddress_v2"), "cuGetProcAddress", 0);
	REQUIRE(gpa);
	CHECK(gpa == (gpa_v2_fn)shim("cuGetProcAddress_v2"));
	CHECK((void *)gpa != dlsym(fake, "cuGetProcAddress_v2"));

	/* Through it: gpucr's wrapper for the exact variant. */
	for (i = 0; i < sizeof(wrapped) / sizeof(wrapped[0]); i++) {
		p = lookup(gpa, wrapped[i].name, CU_GET_PROC_ADDRESS_DEFAULT);
		CHECK(p != NULL);
		if (p && p != shim(wrapped[i].wrapper))
			fprintf(stderr, "%s: got %p, the shim's %s is %p\n", wrapped[i].name, p,
				wrapped[i].wrapper, shim(wrapped[i].wrapper));
		CHECK(p == shim(wrapped[i].wrapper));
	}

	/* Per-thread default stream: the _ptsz wrapper when the driver has that
	 * variant, the plain one when it does not; never the driver's. */
	p = lookup(gpa, "cuMemAllocAsync", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	CHECK(p != NULL);
	if (dlsym(fake, "cuMemAllocAsync_ptsz"))
		CHECK(p == shim("cuMemAllocAsync_ptsz"));
	else
		CHECK(p == shim("cuMemAllocAsync"));
	p = lookup(gpa, "cuMemFreeAsync", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
	CHECK(p == shim("cuMemFreeAsync"));

	/* Not wrapped: gpucr's trampoline of the driver's symbol (it tests the
	 * gate), never the driver's function itself. */
	p = lookup(gpa, "cuCtxGetCurrent", CU_GET_PROC_ADDRESS_DEFAULT);
	CHECK(p != NULL);
	CHECK(p == shim("cuCtxGetCurrent"));
	CHECK(p != dlsym(fake, "cuCtxGetCurrent"));
	p = lookup(gpa, "cuLaunchKernel", CU_GET_PROC_ADDRESS_DEFAULT);
	CHECK(p == shim("cuLaunchKernel"));
	/* By the driver's symbol name: the fake has no _ptsz variants and
	 * answers with cuLaunchKernel; a real driver gives cuLaunchKernel_ptsz. */
	p = lookup(gpa, "cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	CHECK(p == shim("cuLaunchKernel") || p == shim("cuLaunchKernel_ptsz"));
	p = lookup(gpa, "cuMemcpyHtoD", CU_GET_PROC_ADDRESS_DEFAULT);
	CHECK(p == shim("cuMemcpyHtoD_v2"));
	p = lookup(gpa, "cuCtxGetCurrent", CU_GET_PROC_ADDRESS_DEFAULT);
	if (p) {
		CUcontext cur = NULL;

		CHECK_EQ_INT(((CUresult(*)(CUcontext *))p)(&cur), CUDA_SUCCESS);
		CHECK(cur == ctx);
	}

	/* Names gpucr does not wrap never get a wrapper, even where the driver
	 * exports one stub under many names (the fake does, for what it lacks). */
	{
		static const char *const others[] = { "cuArrayCreate", "cuTexRefCreate",
						      "cuGraphicsUnregisterResource", "cuMemAllocHost",
						      "cuLaunchKernel" };
		static const char *const wrappers[] = {
			"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable", "cuMemAlloc_v2",
			"cuMemFree_v2", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync",
			"cuPointerGetAttribute", "cuPointerGetAttributes", "cuMemAllocManaged",
		};
		size_t k;

		for (i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
			CUdriverProcAddressQueryResult st;

			p = NULL;
			if (gpa(others[i], &p, CUDA_VERSION, 0, &st) != CUDA_SUCCESS || !p)
				continue;
			for (k = 0; k < sizeof(wrappers) / sizeof(wrappers[0]); k++)
				if (p == shim(wrappers[k])) {
					fprintf(stderr, "%s resolved to the shim's %s\n", others[i], wrappers[k]);
					t_failed++;
				}
		}
	}

	/* An unknown name stays unknown. */
	{
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
		void *q = NULL;

		CHECK(gpa("cuNoSuchFunction", &q, CUDA_VERSION, 0, &st) != CUDA_SUCCESS ||
		      st != CU_GET_PROC_ADDRESS_SUCCESS);
	}

	/* Memory allocated through looked-up pointers is gpucr's VMM memory. */
	alloc = (alloc_fn)lookup(gpa, "cuMemAlloc", 0);
	mfree = (free_fn)lookup(gpa, "cuMemFree", 0);
	REQUIRE(alloc && mfree);
	REQUIRE(alloc(&d, 3 << 20) == CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)d), CUDA_SUCCESS);
	cuMemRelease(h);
	CHECK_EQ_INT(mfree(d), CUDA_SUCCESS);

	/* The 4-argument cuGetProcAddress (CUDA 11.3-11.8 callers), where the
	 * driver has it: asking it for "cuGetProcAddress" also gives a wrapper. */
	if (dlsym(fake, "cuGetProcAddress")) {
		gpa1 = (gpa_v1_fn)shim("cuGetProcAddress");
		REQUIRE(gpa1);
		p = NULL;
		CHECK_EQ_INT(gpa1("cuMemAlloc", &p, CUDA_VERSION, 0), CUDA_SUCCESS);
		CHECK(p == shim("cuMemAlloc_v2"));
		p = NULL;
		CHECK_EQ_INT(gpa1("cuGetProcAddress", &p, 11080, 0), CUDA_SUCCESS);
		CHECK(p == shim("cuGetProcAddress") || p == shim("cuGetProcAddress_v2"));
	}
	return t_done();
}
