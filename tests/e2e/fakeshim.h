/* The pieces of a shim that daemon-dump and daemon-precopy play themselves,
 * against the test driver: the process's context, its buffers allocated and
 * mapped, the shim's connection to gpucrd, its buffers reported, and its
 * replies. The message loop stays in each test: what a shim does on each
 * request (stall, answer late, take more buffers) is what the test is about.
 *
 * Header-only; needs daemontest.h (sockpath) and tests/fakecuda on the
 * include path. */
#ifndef GPUCR_TESTS_E2E_FAKESHIM_H
#define GPUCR_TESTS_E2E_FAKESHIM_H

#include <errno.h>
#include <sys/syscall.h>

#include <cuda.h>

#include "daemontest.h"

/* Device 0's primary context made current; its uuid into uuid. */
static inline void shim_context(uint8_t uuid[16])
{
	CUdevice dev;
	CUcontext ctx;

	REQUIRE(cuInit(0) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	REQUIRE(cuDeviceGetUuid((CUuuid *)uuid, dev) == CUDA_SUCCESS);
}

/* Maps h at va, readable and writable from device 0. */
static inline void shim_map(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
	CUmemAccessDesc acc = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
				.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };

	REQUIRE(cuMemMap(va, size, 0, h, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemSetAccess(va, size, &acc, 1) == CUDA_SUCCESS);
}

/* Unmaps va and releases h (a shim's Release). */
static inline void shim_unmap(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
	REQUIRE(cuMemUnmap(va, size) == CUDA_SUCCESS);
	REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
}

/* The memory gpucrd hands back in a Remap, as a handle; closes efd. */
static inline CUmemGenericAllocationHandle shim_import(int efd)
{
	CUmemGenericAllocationHandle h;

	REQUIRE(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)efd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
		CUDA_SUCCESS);
	close(efd);
	return h;
}

/* Reserves size bytes of addresses and creates memory that can be exported
 * as a file descriptor (what gpucrd takes); the caller maps it. */
static inline void shim_alloc(CUdeviceptr *ret_va, size_t size, CUmemGenericAllocationHandle *ret_h)
{
	CUmemAllocationProp prop = { 0 };

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	REQUIRE(cuMemAddressReserve(ret_va, size, 2u << 20, 0, 0) == CUDA_SUCCESS);
	REQUIRE(cuMemCreate(ret_h, size, &prop, 0) == CUDA_SUCCESS);
}

/* The shim's connection, said hello to as comm, running or restored. */
static inline int shim_connect_as(const char *comm, int restored)
{
	Gpucr__Hello h = GPUCR__HELLO__INIT;
	Gpucr__Msg *rep;
	int fd = daemon_connect();

	h.proto_version = 1;
	h.role = GPUCR__ROLE__ROLE_SHIM;
	h.comm = (char *)comm;
	h.has_control_tid = 1;
	h.control_tid = (uint32_t)syscall(SYS_gettid);
	h.has_restored = 1;
	h.restored = (uint32_t)restored;
	rep = say_hello(fd, &h);
	if (rep->err == -EBUSY || rep->err == -EAGAIN) {
		/* Its last connection is not closed yet in gpucrd, or CRIU
		 * (here: the dump's requester) is not done: again, as the shim
		 * does. */
		msg_free(rep);
		close(fd);
		usleep(10000);
		return shim_connect_as(comm, restored);
	}
	REQUIRE(rep->err == 0);
	msg_free(rep);
	return fd;
}

/* Reports one buffer to gpucrd, its memory handed over as a descriptor. */
static inline void shim_send_buffer(int fd, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
				    uint8_t uuid[16])
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__BufferAdd ba = GPUCR__BUFFER_ADD__INIT;
	int efd = -1;

	REQUIRE(cuMemExportToShareableHandle(&efd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
	ba.va = va;
	ba.size = size;
	ba.device = 0;
	ba.has_phys_size = 1;
	ba.phys_size = size;
	ba.has_device_uuid = 1;
	ba.device_uuid.data = uuid;
	ba.device_uuid.len = 16;
	m.body_case = GPUCR__MSG__BODY_BUFFER_ADD;
	m.buffer_add = &ba;
	REQUIRE(msg_send(fd, &m, &efd, 1) == 0);
	close(efd);
}

/* A reply that finds the connection closed (gpucrd cut off a shim that
 * answered too late) is lost, as the shim's is. */
static inline void shim_reply(int fd, uint64_t id, int err)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;

	m.has_reply_to = 1;
	m.reply_to = id;
	m.has_err = 1;
	m.err = err;
	msg_send(fd, &m, NULL, 0);
}

#endif
