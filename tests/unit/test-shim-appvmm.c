/* The application's own VMM memory with GPUCR_APP_VMM=1 (appvmm.h): virtual
 * handles and their translation, a handle mapped once and whole adopted as
 * a buffer of gpucr's (BUF_APP), released and remapped at the same address
 * with the access the application gave it, after which the old virtual
 * handles still work; what stays with the driver (mapped in part, mapped
 * twice, exported, imported); the extent queries answered by the driver;
 * and with GPUCR_APP_VMM unset, plain forwarding.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * the fake driver is loaded by path as the real one. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "appvmm.h"
#include "buftab.h"
#include "t.h"
#include "shimtest.h"

static size_t gran;

static CUmemAllocationProp dev_prop(unsigned long long types)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 0;
	p.requestedHandleTypes = (CUmemAllocationHandleType)types;
	return p;
}

static void set_access(CUdeviceptr va, size_t size, CUmemAccess_flags f)
{
	CUmemAccessDesc a;

	memset(&a, 0, sizeof(a));
	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = 0;
	a.flags = f;
	REQUIRE(cuMemSetAccess(va, size, &a, 1) == CUDA_SUCCESS);
}

static unsigned long long access_of(CUdeviceptr va)
{
	CUmemLocation loc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
	unsigned long long f = ~0ULL;

	if (cuMemGetAccess(&f, &loc, va) != CUDA_SUCCESS)
		return ~0ULL;
	return f;
}

static int is_app_buf(CUdeviceptr p, size_t size)
{
	struct buf b;

	return buftab_lookup(p, &b) == 0 && b.kind == BUF_APP && b.base == p && b.size == size;
}

static CUmemGenericAllocationHandle real_of(CUmemGenericAllocationHandle vh)
{
	CUmemGenericAllocationHandle r = 0;

	REQUIRE(appvmm_real_handle(vh, &r) == 0);
	return r;
}

/* With GPUCR_APP_VMM unset: the driver's handles, nothing adopted. Runs in
 * a child forked before the first driver call (the setting is read once). */
static int off_child(void)
{
	CUmemAllocationProp p = dev_prop(0);
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr va = 0;
	size_t g = 0;

	unsetenv("GPUCR_APP_VMM");
	shim_test_start(30);
	CHECK(!appvmm_enabled());
	REQUIRE(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
	REQUIRE(cuMemCreate(&h, g, &p, 0) == CUDA_SUCCESS);
	CHECK(!appvmm_is_virtual(h));
	/* As asked: not exportable, so nothing was added. */
	CHECK(cuMemGetAllocationPropertiesFromHandle(&p, h) == CUDA_SUCCESS && p.requestedHandleTypes == 0);
	REQUIRE(cuMemAddressReserve(&va, g, 0, 0, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va, g, 0, h, 0) == CUDA_SUCCESS);
	CHECK(buftab_count(BUF_APP) == 0);
	CHECK_EQ_INT(appvmm_count(NULL), 0);
	CHECK_EQ_INT(alloc_chunk_count(NULL), 0);
	CHECK(cuMemUnmap(va, g) == CUDA_SUCCESS);
	CHECK(cuMemRelease(h) == CUDA_SUCCESS);
	CHECK(cuMemAddressFree(va, g) == CUDA_SUCCESS);
	return t_done();
}

int main(void)
{
	CUresult (*drv_ptrattr)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*drv_range)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUmemGenericAllocationHandle h1, h2, h3, h4, h5, h6, h7, h8, himp, hr, r2;
	CUmemAllocationProp p1 = dev_prop(0), p2 = dev_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), q;
	struct alloc_chunk_fd *chunks = NULL;
	struct alloc_changes ch;
	size_t count = 0, n, mapped, adopted, i, rsize, dsize;
	CUdeviceptr va = 0, own = 0, rbase, dbase;
	unsigned long long id_drv, id_shim;
	int status, fd = -1, found;
	pid_t pid;
	void *drv;

	pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0)
		_exit(off_child());
	REQUIRE(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	setenv("GPUCR_APP_VMM", "1", 1);
	shim_test_start(60);
	REQUIRE(appvmm_enabled());
	REQUIRE(cuMemGetAllocationGranularity(&gran, &p1, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS);
	REQUIRE(cuMemAddressReserve(&va, 16 * gran, 0, 0, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemAlloc_v2(&own, 3 * gran) == CUDA_SUCCESS); /* gpucr's own, beside */
	fill(own, 3 * gran, 9);

	/* ---- virtual handles ---- */
	REQUIRE(cuMemCreate(&h1, 2 * gran, &p1, 0) == CUDA_SUCCESS);
	CHECK(appvmm_is_virtual(h1));
	CHECK(!appvmm_is_virtual(real_of(h1)));
	/* The application sees the types it asked for; the driver's handle is
	 * exportable as an fd all the same, and export refuses what it did not
	 * ask for, as the driver would. */
	CHECK(cuMemGetAllocationPropertiesFromHandle(&q, h1) == CUDA_SUCCESS);
	CHECK_EQ_INT(q.requestedHandleTypes, 0);
	CHECK_EQ_INT(q.location.id, 0);
	CHECK(cuMemGetAllocationPropertiesFromHandle(&q, real_of(h1)) == CUDA_SUCCESS);
	CHECK(q.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CHECK_EQ_INT(cuMemExportToShareableHandle(&fd, h1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		     CUDA_ERROR_INVALID_VALUE);
	/* Values that are not live virtual handles go to the driver. */
	CHECK(cuMemRelease(APPVMM_TAG | 0xfffffffULL) != CUDA_SUCCESS);
	CHECK(cuMemMap(va, gran, 0, APPVMM_TAG | 0xfffffffULL, 0) != CUDA_SUCCESS);
	CHECK(cuMemRelease(0x1234) != CUDA_SUCCESS);
	CHECK_EQ_INT(appvmm_count(NULL), 1);

	/* ---- adopted: mapped once, whole ---- */
	REQUIRE(cuMemMap(va, 2 * gran, 0, h1, 0) == CUDA_SUCCESS);
	set_access(va, 2 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	fill(va, 2 * gran, 1);
	CHECK(is_app_buf(va, 2 * gran));
	/* The mapping keeps the memory; the handle is the application's to drop,
	 * and only once. */
	CHECK_EQ_INT(cuMemRelease(h1), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(h1), CUDA_ERROR_INVALID_VALUE);
	CHECK(same(va, 2 * gran, 1));

	REQUIRE(cuMemCreate(&h2, gran, &p2, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va + 2 * gran, gran, 0, h2, 0) == CUDA_SUCCESS);
	set_access(va + 2 * gran, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	fill(va + 2 * gran, gran, 2);
	set_access(va + 2 * gran, gran, CU_MEM_ACCESS_FLAGS_PROT_READ); /* kept as it is at the remap */
	CHECK(is_app_buf(va + 2 * gran, gran));

	/* ---- left to the driver ---- */
	/* In part. */
	REQUIRE(cuMemCreate(&h3, 2 * gran, &p1, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va + 4 * gran, gran, gran, h3, 0) == CUDA_SUCCESS);
	set_access(va + 4 * gran, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	fill(va + 4 * gran, gran, 3);
	/* Twice: adopted at the first, given back at the second. */
	REQUIRE(cuMemCreate(&h4, gran, &p1, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va + 6 * gran, gran, 0, h4, 0) == CUDA_SUCCESS);
	CHECK(is_app_buf(va + 6 * gran, gran));
	REQUIRE(cuMemMap(va + 7 * gran, gran, 0, h4, 0) == CUDA_SUCCESS);
	set_access(va + 6 * gran, 2 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	fill(va + 6 * gran, gran, 4);
	/* Exported (it asked for fds): shared with whoever gets the fd. */
	REQUIRE(cuMemCreate(&h5, gran, &p2, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemExportToShareableHandle(&fd, h5, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va + 8 * gran, gran, 0, h5, 0) == CUDA_SUCCESS);
	set_access(va + 8 * gran, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	fill(va + 8 * gran, gran, 5);
	/* Imported: the driver's handle, untouched. */
	REQUIRE(cuMemImportFromShareableHandle(&himp, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
		CUDA_SUCCESS);
	close(fd);
	CHECK(!appvmm_is_virtual(himp));
	REQUIRE(cuMemMap(va + 9 * gran, gran, 0, himp, 0) == CUDA_SUCCESS);
	set_access(va + 9 * gran, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(same(va + 9 * gran, gran, 5));

	for (i = 4; i <= 9; i++)
		CHECK(buftab_lookup(va + i * gran, &(struct buf){ 0 }) < 0);
	CHECK_EQ_INT(buftab_count(BUF_APP), 2);
	n = appvmm_count(&adopted);
	CHECK_EQ_INT(n, 5); /* h1 (released, still mapped) to h5 */
	CHECK_EQ_INT(adopted, 2);

	/* ---- the extent queries stay the driver's ---- */
	drv = dlopen(FAKECUDA_LIB, RTLD_NOW | RTLD_NOLOAD);
	REQUIRE(drv);
	drv_ptrattr = (CUresult (*)(void *, CUpointer_attribute, CUdeviceptr))dlsym(drv, "cuPointerGetAttribute");
	drv_range = (CUresult (*)(CUdeviceptr *, size_t *, CUdeviceptr))dlsym(drv, "cuMemGetAddressRange_v2");
	REQUIRE(drv_ptrattr && drv_range);
	REQUIRE(cuMemGetAddressRange_v2(&rbase, &rsize, va + 2 * gran + 100) == CUDA_SUCCESS);
	REQUIRE(drv_range(&dbase, &dsize, va + 2 * gran + 100) == CUDA_SUCCESS);
	CHECK_EQ_INT(rbase, dbase);
	CHECK_EQ_INT(rsize, dsize);
	REQUIRE(cuPointerGetAttribute(&id_shim, CU_POINTER_ATTRIBUTE_BUFFER_ID, va + 5) == CUDA_SUCCESS);
	REQUIRE(drv_ptrattr(&id_drv, CU_POINTER_ATTRIBUTE_BUFFER_ID, va + 5) == CUDA_SUCCESS);
	CHECK_EQ_INT(id_shim, id_drv);
	REQUIRE(cuPointerGetAttribute(&rbase, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 5) == CUDA_SUCCESS);
	REQUIRE(drv_ptrattr(&dbase, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 5) == CUDA_SUCCESS);
	CHECK_EQ_INT(rbase, dbase);
	/* cuMemFree of it is the driver's business; the buffer stays. */
	CHECK(cuMemFree_v2(va) != CUDA_SUCCESS);
	CHECK(is_app_buf(va, 2 * gran));

	/* ---- the daemon hears of the adopted ones ---- */
	REQUIRE(alloc_collect(&ch) == 0);
	found = 0;
	for (i = 0; i < ch.nadded; i++)
		if (ch.added[i].app)
			found += (ch.added[i].va == va && ch.added[i].size == 2 * gran) ||
				 (ch.added[i].va == va + 2 * gran && ch.added[i].size == gran);
		else
			CHECK(ch.added[i].va == own);
	CHECK_EQ_INT(found, 2);
	alloc_changes_free(&ch);

	/* ---- release: the adopted memory goes, the driver's stays ---- */
	REQUIRE(alloc_export_all(&chunks, &count) == 0);
	CHECK_EQ_INT(count, 3);
	CHECK_EQ_INT(alloc_release_all(), 0);
	alloc_chunk_count(&mapped);
	CHECK_EQ_INT(mapped, 0);
	CHECK(!readable(va));
	CHECK(!readable(va + 2 * gran));
	CHECK(!readable(own));
	CHECK(readable(va + 4 * gran) && readable(va + 6 * gran) && readable(va + 7 * gran) &&
	      readable(va + 8 * gran) && readable(va + 9 * gran));
	CHECK_EQ_INT(appvmm_real_handle(h2, &r2), 0);
	CHECK_EQ_INT(r2, 0); /* no driver handle while released */

	/* ---- remap: same addresses, contents and access ---- */
	r2 = real_of(h3);
	CHECK_EQ_INT(alloc_remap_all(chunks, count), 0);
	for (i = 0; i < count; i++)
		close(chunks[i].fd);
	free(chunks);
	CHECK(same(va, 2 * gran, 1));
	CHECK(same(va + 2 * gran, gran, 2));
	CHECK(same(own, 3 * gran, 9));
	CHECK_EQ_INT(access_of(va), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK_EQ_INT(access_of(va + 2 * gran), CU_MEM_ACCESS_FLAGS_PROT_READ);
	CHECK(same(va + 4 * gran, gran, 3));
	CHECK_EQ_INT(real_of(h3), r2); /* the driver's, untouched */

	/* ---- the old virtual handles still work ---- */
	CHECK(real_of(h2) != 0 && !appvmm_is_virtual(real_of(h2)));
	CHECK(cuMemGetAllocationPropertiesFromHandle(&q, h2) == CUDA_SUCCESS &&
	      q.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	/* A retained handle of the adopted mapping is its virtual one. */
	REQUIRE(cuMemRetainAllocationHandle(&hr, (void *)(uintptr_t)(va + 100)) == CUDA_SUCCESS);
	CHECK_EQ_INT(hr, h1);
	CHECK_EQ_INT(cuMemRelease(hr), CUDA_SUCCESS);
	/* Unmapped and mapped again with the same value: same memory, adopted
	 * again. */
	CHECK_EQ_INT(cuMemUnmap(va + 2 * gran, gran), CUDA_SUCCESS);
	CHECK(buftab_lookup(va + 2 * gran, &(struct buf){ 0 }) < 0);
	CHECK(!readable(va + 2 * gran));
	REQUIRE(cuMemMap(va + 2 * gran, gran, 0, h2, 0) == CUDA_SUCCESS);
	set_access(va + 2 * gran, gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(is_app_buf(va + 2 * gran, gran));
	CHECK(same(va + 2 * gran, gran, 2));
	/* The daemon hears that the first went (reported, then unmapped). */
	REQUIRE(alloc_collect(&ch) == 0);
	alloc_changes_free(&ch);
	CHECK_EQ_INT(cuMemUnmap(va + 2 * gran, gran), CUDA_SUCCESS);
	REQUIRE(alloc_collect(&ch) == 0);
	found = 0;
	for (i = 0; i < ch.nfreed; i++)
		found += ch.freed[i] == va + 2 * gran;
	CHECK_EQ_INT(found, 1);
	alloc_changes_free(&ch);
	/* Exportable as it asked, now from the memory imported at the remap. */
	REQUIRE(cuMemExportToShareableHandle(&fd, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
	close(fd);
	CHECK_EQ_INT(cuMemRelease(h2), CUDA_SUCCESS);
	CHECK(appvmm_real_handle(h2, &r2) == -ENOENT);

	/* ---- the address range reused ---- */
	n = appvmm_count(NULL);
	CHECK_EQ_INT(cuMemUnmap(va, 2 * gran), CUDA_SUCCESS); /* h1 released: it goes */
	CHECK_EQ_INT(appvmm_count(NULL), n - 1);
	CHECK(appvmm_real_handle(h1, &r2) == -ENOENT);
	CHECK(!readable(va));
	REQUIRE(cuMemCreate(&h6, 2 * gran, &p1, 0) == CUDA_SUCCESS);
	CHECK(h6 != h1); /* never reused */
	REQUIRE(cuMemMap(va, 2 * gran, 0, h6, 0) == CUDA_SUCCESS);
	set_access(va, 2 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(is_app_buf(va, 2 * gran));
	fill(va, 2 * gran, 6);
	REQUIRE(alloc_export_all(&chunks, &count) == 0);
	CHECK_EQ_INT(alloc_release_all(), 0);
	CHECK(!readable(va));
	CHECK_EQ_INT(alloc_remap_all(chunks, count), 0);
	for (i = 0; i < count; i++)
		close(chunks[i].fd);
	free(chunks);
	CHECK(same(va, 2 * gran, 6));
	CHECK_EQ_INT(cuMemRelease(h6), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemUnmap(va, 2 * gran), CUDA_SUCCESS);

	/* ---- bound to a multicast object: left to the driver ---- */
	/* A range that starts inside one adopted mapping and runs into the
	 * next pins both. */
	REQUIRE(cuMemCreate(&h7, gran, &p1, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemCreate(&h8, gran, &p1, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va + 10 * gran, gran, 0, h7, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemMap(va + 11 * gran, gran, 0, h8, 0) == CUDA_SUCCESS);
	set_access(va + 10 * gran, 2 * gran, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(is_app_buf(va + 10 * gran, gran));
	CHECK(is_app_buf(va + 11 * gran, gran));
	CHECK_EQ_INT(cuMulticastBindAddr(0x99, 0, va + 10 * gran + gran / 2, gran, 0), CUDA_SUCCESS);
	CHECK(buftab_lookup(va + 10 * gran, &(struct buf){ 0 }) < 0);
	CHECK(buftab_lookup(va + 11 * gran, &(struct buf){ 0 }) < 0);
	CHECK_EQ_INT(cuMemUnmap(va + 10 * gran, 2 * gran), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(h7), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(h8), CUDA_SUCCESS);

	/* ---- the rest let go ---- */
	CHECK_EQ_INT(cuMemUnmap(va + 4 * gran, gran), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemUnmap(va + 6 * gran, 2 * gran), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemUnmap(va + 8 * gran, 2 * gran), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(h3), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(h4), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(h5), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemRelease(himp), CUDA_SUCCESS);
	CHECK_EQ_INT(buftab_count(BUF_APP), 0);
	CHECK_EQ_INT(appvmm_count(NULL), 0);
	CHECK_EQ_INT(cuMemFree_v2(own), CUDA_SUCCESS);
	CHECK_EQ_INT(cuMemAddressFree(va, 16 * gran), CUDA_SUCCESS);
	return t_done();
}
