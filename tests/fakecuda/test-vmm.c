/* test-vmm: the fake's VMM path as gpucr uses it.  Reserve, create two
 * exportable 2 MiB chunks, map them back to back, grant access, fill them;
 * export the fds, pass them to a forked child with SCM_RIGHTS, which
 * imports and maps them at its own addresses and sees (and changes) the
 * same bytes; then release while mapped, unmap, and check that no device
 * memory is held any more.  Also the VMM error cases. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "fakecuda.h"
#include "testutil.h"

#define MIB (1UL << 20)

static CUmemAllocationProp fd_prop(void)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 0;
	return p;
}

static void set_rw(CUdeviceptr va, size_t size)
{
	CUmemAccessDesc a;

	memset(&a, 0, sizeof(a));
	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = 0;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU_OK(cuMemSetAccess(va, size, &a, 1));
}

static void send_fds(int sock, const int *fds, int n)
{
	char cbuf[CMSG_SPACE(2 * sizeof(int))];
	char byte = 'F';
	struct iovec iov = { &byte, 1 };
	struct msghdr msg;
	struct cmsghdr *c;

	memset(&msg, 0, sizeof(msg));
	memset(cbuf, 0, sizeof(cbuf));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf;
	msg.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
	memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
	CHECK(sendmsg(sock, &msg, 0) == 1);
}

static void recv_fds(int sock, int *fds, int n)
{
	char cbuf[CMSG_SPACE(2 * sizeof(int))];
	char byte;
	struct iovec iov = { &byte, 1 };
	struct msghdr msg;
	struct cmsghdr *c;

	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cbuf;
	msg.msg_controllen = sizeof(cbuf);
	CHECK(recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) == 1);
	c = CMSG_FIRSTHDR(&msg);
	CHECK(c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN((size_t)n * sizeof(int)));
	memcpy(fds, CMSG_DATA(c), (size_t)n * sizeof(int));
}

static void fill_pattern(unsigned char *buf, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = (unsigned char)(i * 31 + seed + (i >> 12));
}

/* The importer: maps both chunks at addresses of its own and checks them. */
static int child(int sock, size_t gran)
{
	unsigned char *want = malloc(2 * gran), *got = malloc(2 * gran);
	CUmemGenericAllocationHandle h[2];
	CUmemAllocationProp prop;
	CUdeviceptr va;
	int fds[2];

	CHECK(want && got);
	recv_fds(sock, fds, 2);
	CU_OK(cuMemImportFromShareableHandle(&h[0], (void *)(intptr_t)fds[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	CU_OK(cuMemImportFromShareableHandle(&h[1], (void *)(intptr_t)fds[1], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	close(fds[0]);
	close(fds[1]);
	CU_OK(cuMemGetAllocationPropertiesFromHandle(&prop, h[0]));
	CHECK(prop.type == CU_MEM_ALLOCATION_TYPE_PINNED);
	CHECK(prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);

	CU_OK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
	/* Swapped order: the bytes follow the memory, not the address. */
	CU_OK(cuMemMap(va, gran, 0, h[1], 0));
	CU_OK(cuMemMap(va + gran, gran, 0, h[0], 0));
	set_rw(va, 2 * gran);
	fill_pattern(want, 2 * gran, 7);
	CU_OK(cuMemcpyDtoH(got, va + gran, gran));
	CHECK(memcmp(got, want, gran) == 0);
	CU_OK(cuMemcpyDtoH(got, va, gran));
	CHECK(memcmp(got, want + gran, gran) == 0);

	/* Write back through our mapping; the parent must see it. */
	CU_OK(cuMemsetD32(va, 0xabcd1234u, gran / 4));
	CU_OK(cuMemUnmap(va, 2 * gran));
	CU_OK(cuMemRelease(h[0]));
	CU_OK(cuMemRelease(h[1]));
	CU_OK(cuMemAddressFree(va, 2 * gran));
	free(want);
	free(got);
	return 0;
}

int main(void)
{
	CUmemAllocationProp prop = fd_prop(), prop_nofd = fd_prop();
	/* static: a forked child exits with them, and must not leak them */
	static unsigned char want[4 << 20], got[4 << 20];
	CUmemGenericAllocationHandle h[2], hr, hx;
	struct fakecuda_held held;
	CUdeviceptr va, va2, base;
	CUcontext ctx;
	CUdevice dev;
	size_t gran, size;
	int fds[2], sv[2], status, pipefd[2];
	unsigned long long u64;
	unsigned int u32;
	pid_t pid;

	test_time_limit(60);
	CU_OK(cuInit(0));
	CU_OK(cuDeviceGet(&dev, 0));
	CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU_OK(cuCtxSetCurrent(ctx));

	CU_OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	CHECK(gran == 2 * MIB && sizeof(want) >= 2 * gran);

	CU_OK(cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
	CHECK(va % gran == 0);
	CU_EXPECT(cuMemCreate(&hx, gran + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuMemCreate(&h[0], gran, &prop, 0));
	CU_OK(cuMemCreate(&h[1], gran, &prop, 0));
	CHECK(h[0] != h[1]);

	CU_OK(cuMemMap(va, gran, 0, h[0], 0));
	CU_OK(cuMemMap(va + gran, gran, 0, h[1], 0));
	CU_EXPECT(cuMemMap(va, gran, 0, h[1], 0), CUDA_ERROR_INVALID_VALUE);         /* overlaps */
	CU_EXPECT(cuMemMap(va + 3 * gran, 2 * gran, 0, h[1], 0), CUDA_ERROR_INVALID_VALUE); /* past the reservation */
	CU_EXPECT(cuMemMap(va + 2 * gran, gran, gran, h[1], 0), CUDA_ERROR_INVALID_VALUE);  /* past the allocation */
	CU_EXPECT(cuMemMap(va + 2 * gran + 4096, gran, 0, h[1], 0), CUDA_ERROR_INVALID_VALUE);
	/* Mapped but no access granted yet, as on a GPU. */
	CU_EXPECT(cuMemsetD8(va, 1, 16), CUDA_ERROR_INVALID_VALUE);
	set_rw(va, 2 * gran);

	/* One copy across both chunks. */
	fill_pattern(want, 2 * gran, 7);
	CU_OK(cuMemcpyHtoD(va, want, 2 * gran));
	CU_OK(cuMemcpyDtoH(got, va, 2 * gran));
	CHECK(memcmp(got, want, 2 * gran) == 0);
	/* ...but not into the unmapped rest of the reservation. */
	CU_EXPECT(cuMemcpyHtoD(va + gran, want, 2 * gran), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemcpy(va + 3 * gran, (CUdeviceptr)want, 16), CUDA_ERROR_INVALID_VALUE);

	/* Queries. */
	CU_OK(cuMemGetAddressRange(&base, &size, va + gran + 5));
	CHECK(base == va + gran && size == gran);
	CU_OK(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 100));
	CHECK(u32 == CU_MEMORYTYPE_DEVICE);
	CU_OK(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, va + 100));
	CHECK(u32 == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
	CU_OK(cuPointerGetAttribute(&u64, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, va + 100));
	CHECK(u64 == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CU_OK(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va + 100));
	CHECK(u32 == 0);
	CU_OK(cuMemRetainAllocationHandle(&hr, (void *)(uintptr_t)(va + gran + 100)));
	CHECK(hr == h[1]);
	CU_OK(cuMemRelease(hr));
	CU_OK(cuMemGetAllocationPropertiesFromHandle(&prop_nofd, h[0]));
	CHECK(prop_nofd.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CHECK(prop_nofd.location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop_nofd.location.id == 0);

	/* Export; the exported fds are the same memory as the mappings. */
	CU_OK(cuMemExportToShareableHandle(&fds[0], h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CU_OK(cuMemExportToShareableHandle(&fds[1], h[1], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	CHECK(fakecuda_held_bytes(0, &held) == 0);
	CHECK(held.mapped_bytes == 2 * gran && held.fd_bytes == 0 && held.managed_bytes == 0);

	/* Import in a child that gets the fds over a socket. */
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		exit(child(sv[1], gran)); /* exit: the fake removes its state file */
	}
	close(sv[1]);
	send_fds(sv[0], fds, 2);
	close(fds[0]);
	close(fds[1]);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(sv[0]);
	/* The child overwrote chunk 1 (its first mapping) with a pattern. */
	CU_OK(cuMemcpyDtoH(got, va + gran, gran));
	for (size_t i = 0; i < gran / 4; i++)
		CHECK(((uint32_t *)(void *)got)[i] == 0xabcd1234u);
	CU_OK(cuMemcpyDtoH(got, va, gran));
	CHECK(memcmp(got, want, gran) == 0);

	/* Released but still mapped: the memory stays, as with the driver. */
	CU_OK(cuMemRelease(h[0]));
	CU_OK(cuMemRelease(h[1]));
	CU_EXPECT(cuMemRelease(h[1]), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemExportToShareableHandle(&fds[0], h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		  CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuMemcpyDtoH(got, va, gran));
	CHECK(memcmp(got, want, gran) == 0);
	CHECK(fakecuda_held_bytes(0, &held) == 0 && held.mapped_bytes == 2 * gran);
	CU_EXPECT(cuMemAddressFree(va, 4 * gran), CUDA_ERROR_INVALID_VALUE); /* still mapped */
	CU_EXPECT(cuMemUnmap(va, gran / 2), CUDA_ERROR_INVALID_VALUE);       /* part of a mapping */
	CU_EXPECT(cuMemUnmap(va + 2 * gran, gran), CUDA_ERROR_INVALID_VALUE); /* nothing there */

	/* Unmapping drops the last reference: nothing is held any more. */
	CU_OK(cuMemUnmap(va, 2 * gran));
	CU_EXPECT(cuMemsetD8(va, 1, 16), CUDA_ERROR_INVALID_VALUE);
	CHECK(fakecuda_held_bytes(0, &held) == 0);
	CHECK(held.mapped_bytes == 0 && held.fd_bytes == 0 && held.nmaps == 0 && held.nfds == 0);
	CU_EXPECT(cuMemMap(va, gran, 0, h[0], 0), CUDA_ERROR_INVALID_VALUE);

	/* The reservation outlives its mappings; freeing it and asking for the
	 * same address back gets it. */
	CU_EXPECT(cuMemAddressFree(va, 2 * gran), CUDA_ERROR_INVALID_VALUE); /* wrong size */
	CU_OK(cuMemAddressFree(va, 4 * gran));
	CU_OK(cuMemAddressReserve(&va2, 4 * gran, 0, va, 0));
	CHECK(va2 == va);
	CU_OK(cuMemAddressFree(va2, 4 * gran));
	CU_OK(cuMemAddressReserve(&va2, 2 * gran, 16 * gran, 0, 0));
	CHECK(va2 % (16 * gran) == 0);
	CU_OK(cuMemAddressFree(va2, 2 * gran));
	CU_EXPECT(cuMemAddressReserve(&va2, gran + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);

	/* An fd that is not fake device memory does not import; memory created
	 * without a POSIX handle type does not export. */
	CHECK(pipe(pipefd) == 0);
	CU_EXPECT(cuMemImportFromShareableHandle(&hx, (void *)(intptr_t)pipefd[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		  CUDA_ERROR_INVALID_VALUE);
	close(pipefd[0]);
	close(pipefd[1]);
	prop_nofd = fd_prop();
	prop_nofd.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	CU_OK(cuMemCreate(&hx, gran, &prop_nofd, 0));
	CU_EXPECT(cuMemExportToShareableHandle(&fds[0], hx, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		  CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuMemRelease(hx));
	prop_nofd.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
	CU_EXPECT(cuMemCreate(&hx, gran, &prop_nofd, 0), CUDA_ERROR_NOT_SUPPORTED);

	CHECK(fakecuda_held_bytes(0, &held) == 0 && held.mapped_bytes == 0 && held.fd_bytes == 0);
	CU_OK(cuDevicePrimaryCtxRelease(dev));
	printf("test-vmm: ok\n");
	return 0;
}
