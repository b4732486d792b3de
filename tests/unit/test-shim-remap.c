/* Export, release and remap of gpucr's device memory (alloc.h): every chunk
 * exports as an fd; releasing unmaps all physical memory while the buffer
 * table and VA reservations stay; remapping the fds puts the same contents
 * back at the same addresses.
 *
 * Linked with the shim's objects (libintercept.a) to reach the internal API;
 * the fake driver is loaded by path as the real one. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"
#include "buftab.h"
#include "t.h"
#include "shimtest.h"

#define MIB (1UL << 20)

static const struct alloc_chunk_fd *chunk_of(const struct alloc_chunk_fd *c, size_t n, CUdeviceptr p)
{
	for (size_t i = 0; i < n; i++)
		if (p >= c[i].va && p < c[i].va + c[i].size)
			return &c[i];
	return NULL;
}

int main(void)
{
	struct { CUdeviceptr p; size_t size; } bufs[] = { { 0, 3 * MIB + 5 }, { 0, 1000 }, { 0, 5000 },
							  { 0, 16 * MIB } };
	const size_t nbufs = sizeof(bufs) / sizeof(bufs[0]);
	struct alloc_chunk_fd *chunks = NULL, *bad;
	size_t n, mapped, count = 0, i;
	unsigned char *img;
	CUcontext ctx;
	CUdevice dev;
	struct buf b;
	unsigned char probe;

	alarm(60);
	use_fake();
	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);

	for (i = 0; i < nbufs; i++) {
		REQUIRE(cuMemAlloc_v2(&bufs[i].p, bufs[i].size) == CUDA_SUCCESS);
		fill(bufs[i].p, bufs[i].size, (unsigned)i);
	}
	REQUIRE(buftab_lookup(bufs[0].p + 10, &b) == 0);
	CHECK_EQ_INT(b.base, bufs[0].p);
	CHECK_EQ_INT(b.kind, BUF_VMM);
	REQUIRE(buftab_lookup(bufs[1].p, &b) == 0);
	CHECK_EQ_INT(b.kind, BUF_SUB);
	CHECK_EQ_INT(buftab_count(BUF_VMM), 2);
	CHECK_EQ_INT(buftab_count(BUF_SUB), 2);

	/* Small buffers share one slab: 3 chunks for 4 buffers. */
	n = alloc_chunk_count(&mapped);
	CHECK_EQ_INT(n, 3);
	CHECK_EQ_INT(mapped, n);

	REQUIRE(alloc_export_all(&chunks, &count) == 0);
	CHECK_EQ_INT(count, n);
	for (i = 0; i < count; i++) {
		CHECK(chunks[i].fd >= 0);
		CHECK(fcntl(chunks[i].fd, F_GETFD) & FD_CLOEXEC);
		CHECK_EQ_INT(chunks[i].device, 0);
		if (i)
			CHECK(chunks[i].va > chunks[i - 1].va);
	}
	for (i = 0; i < nbufs; i++)
		CHECK(chunk_of(chunks, count, bufs[i].p) != NULL);
	/* An exported fd is the memory (the fake's is a memfd): what the daemon
	 * reads while the application runs. */
	{
		const struct alloc_chunk_fd *c = chunk_of(chunks, count, bufs[0].p);

		img = c ? mmap(NULL, c->size, PROT_READ, MAP_SHARED, c->fd, 0) : MAP_FAILED;
		if (img != MAP_FAILED) {
			CHECK(img[bufs[0].p - c->va + 7] == (unsigned char)(0 + 7 * 31));
			munmap(img, c->size);
		}
	}

	/* Release: nothing mapped, nothing readable, the table unchanged. */
	CHECK_EQ_INT(alloc_release_all(), 0);
	alloc_chunk_count(&mapped);
	CHECK_EQ_INT(mapped, 0);
	for (i = 0; i < nbufs; i++) {
		CHECK(!readable(bufs[i].p));
		CHECK(buftab_lookup(bufs[i].p, &b) == 0 && b.base == bufs[i].p);
	}
	CHECK(cuMemcpyDtoH_v2(&probe, bufs[0].p, 1) != CUDA_SUCCESS);

	/* No fds: nothing can come back. A wrong size: refused. */
	CHECK_EQ_INT(alloc_remap_all(NULL, 0), -ENOENT);
	alloc_chunk_count(&mapped);
	CHECK_EQ_INT(mapped, 0);
	bad = malloc(count * sizeof(*bad));
	REQUIRE(bad);
	memcpy(bad, chunks, count * sizeof(*bad));
	for (i = 0; i < count; i++)
		bad[i].size += 4096;
	CHECK_EQ_INT(alloc_remap_all(bad, count), -EINVAL);
	free(bad);

	/* Remap: same addresses, same contents. */
	CHECK_EQ_INT(alloc_remap_all(chunks, count), 0);
	alloc_chunk_count(&mapped);
	CHECK_EQ_INT(mapped, n);
	for (i = 0; i < nbufs; i++) {
		CHECK(readable(bufs[i].p));
		CHECK(same(bufs[i].p, bufs[i].size, (unsigned)i));
	}

	/* Again, after changing the contents: the fds hold the memory itself. */
	fill(bufs[1].p, bufs[1].size, 77);
	CHECK_EQ_INT(alloc_release_all(), 0);
	CHECK_EQ_INT(alloc_remap_all(chunks, count), 0);
	CHECK(same(bufs[1].p, bufs[1].size, 77));
	CHECK(same(bufs[3].p, bufs[3].size, 3));

	for (i = 0; i < count; i++)
		close(chunks[i].fd);
	free(chunks);

	/* Still ordinary memory to the application. */
	for (i = 0; i < nbufs; i++)
		CHECK_EQ_INT(cuMemFree_v2(bufs[i].p), CUDA_SUCCESS);
	CHECK_EQ_INT(buftab_count(BUF_VMM) + buftab_count(BUF_SUB), 0);
	n = alloc_chunk_count(NULL);
	CHECK(n <= 1); /* the one empty slab kept for reuse */
	return t_done();
}
