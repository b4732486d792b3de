/* test-legacy: classic allocation, copies, memsets, pointer queries,
 * streams and events on the fake.  Runs with FAKECUDA_MEM_MB=64 so that
 * memory accounting and out-of-memory can be checked. */
#include <string.h>
#include <time.h>

#include "fakecuda.h"
#include "testutil.h"

#define MIB (1UL << 20)

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static int callback_runs;

static void CUDA_CB host_fn(void *arg)
{
	*(int *)arg += 1;
}

int main(void)
{
	CUdeviceptr a, b, p, m, big, x, base;
	CUcontext ctx, ctx2, c;
	CUstream s, s2;
	CUevent e0, e1, e2;
	struct fakecuda_held held;
	size_t freeb, total, pitch, size;
	unsigned char host[4096], back[4096];
	uint32_t mat[10][40], mat2[10][40], vol[3][4][8], vol2[3][4][8];
	unsigned int u32;
	int i32, prio;
	float ms;
	CUdevice dev;

	test_time_limit(60);
	setenv("FAKECUDA_MEM_MB", "64", 1);
	CU_EXPECT(cuMemAlloc(&a, 16), CUDA_ERROR_NOT_INITIALIZED);
	CU_OK(cuInit(0));
	CU_OK(cuDeviceGet(&dev, 0));
	CU_EXPECT(cuMemAlloc(&a, 16), CUDA_ERROR_INVALID_CONTEXT); /* no context yet */
	CU_OK(cuCtxCreate(&ctx, NULL, 0, dev));

	CU_OK(cuMemGetInfo(&freeb, &total));
	CHECK(total == 64 * MIB && freeb == total);
	CU_OK(cuMemAlloc(&a, 1000));
	CU_OK(cuMemAlloc(&b, 1000));
	CHECK(a && b && a != b && a % 256 == 0);
	CU_OK(cuMemGetInfo(&freeb, &total));
	CHECK(freeb == total - 2 * 4096);
	CU_EXPECT(cuMemAlloc(&x, 0), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemAlloc(&x, 65 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cuMemAlloc(&big, 32 * MIB));
	CU_EXPECT(cuMemAlloc(&x, 32 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
	CU_OK(cuMemFree(big));

	/* It is device memory: memfd "fakecuda-phys" mappings. */
	CHECK(fakecuda_held_bytes(0, &held) == 0);
	CHECK(held.mapped_bytes == 2 * 4096 && held.nmaps == 2 && held.fd_bytes == 0);

	/* Copies. */
	for (int i = 0; i < 1000; i++)
		host[i] = (unsigned char)(i * 7);
	CU_OK(cuMemcpyHtoD(a, host, 1000));
	CU_OK(cuMemcpyDtoD(b, a, 1000));
	memset(back, 0, sizeof(back));
	CU_OK(cuMemcpyDtoH(back, b, 1000));
	CHECK(memcmp(host, back, 1000) == 0);
	CU_OK(cuMemcpy(a + 10, (CUdeviceptr)(uintptr_t)host, 100)); /* unified addressing */
	CU_OK(cuMemcpy((CUdeviceptr)(uintptr_t)back, a + 10, 100));
	CHECK(memcmp(host, back, 100) == 0);
	CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(cuMemcpyHtoDAsync(a, host + 1, 500, s));
	CU_OK(cuMemcpyDtoDAsync(b, a, 500, s));
	CU_OK(cuMemcpyDtoHAsync(back, b, 500, s));
	CU_OK(cuMemcpyAsync(b + 500, a, 1, s));
	CU_OK(cuStreamSynchronize(s));
	CHECK(memcmp(host + 1, back, 500) == 0);
	CU_OK(cuCtxCreate(&ctx2, NULL, 0, dev));
	CU_OK(cuMemcpyPeer(b, ctx2, a, ctx, 64));
	CU_OK(cuMemcpyPeerAsync(b, ctx2, a, ctx, 64, NULL));
	CU_OK(cuCtxPopCurrent(&c));
	CHECK(c == ctx2);
	/* A host address is not device memory. */
	CU_EXPECT(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)host, 16), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)back, host, 16), CUDA_ERROR_INVALID_VALUE);
	/* Past the end of the block (its page). */
	CU_EXPECT(cuMemcpyHtoD(a + 4000, host, 200), CUDA_ERROR_INVALID_VALUE);

	/* Memsets. */
	CU_OK(cuMemsetD8(a, 0x5a, 1000));
	CU_OK(cuMemcpyDtoH(back, a, 1000));
	for (int i = 0; i < 1000; i++)
		CHECK(back[i] == 0x5a);
	CU_OK(cuMemsetD16(a, 0x1234, 300));
	CU_OK(cuMemsetD32Async(a + 600, 0xdeadbeefu, 100, s));
	CU_OK(cuMemcpyDtoH(back, a, 1000));
	CHECK(((uint16_t *)(void *)back)[0] == 0x1234 && ((uint16_t *)(void *)back)[299] == 0x1234);
	CHECK(((uint32_t *)(void *)back)[150] == 0xdeadbeefu && ((uint32_t *)(void *)back)[249] == 0xdeadbeefu);
	CU_EXPECT(cuMemsetD16(a + 1, 0, 4), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemsetD32(a + 2, 0, 4), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemsetD8((CUdeviceptr)(uintptr_t)back, 0, 4), CUDA_ERROR_INVALID_VALUE);

	/* Pitched memory, 2D and 3D copies. */
	CU_OK(cuMemAllocPitch(&p, &pitch, 40 * 4, 10, 4));
	CHECK(pitch == 512);
	CU_EXPECT(cuMemAllocPitch(&x, &pitch, 40, 10, 3), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuMemsetD2D32(p, pitch, 0x11223344u, 40, 10));
	for (int y = 0; y < 10; y++)
		for (int xx = 0; xx < 40; xx++)
			mat[y][xx] = (uint32_t)(y * 100 + xx);
	CUDA_MEMCPY2D c2;
	memset(&c2, 0, sizeof(c2));
	c2.srcMemoryType = CU_MEMORYTYPE_HOST;
	c2.srcHost = mat;
	c2.srcPitch = sizeof(mat[0]);
	c2.srcXInBytes = 4 * 4;
	c2.srcY = 2;
	c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c2.dstDevice = p;
	c2.dstPitch = pitch;
	c2.WidthInBytes = 10 * 4;
	c2.Height = 5;
	CU_OK(cuMemcpy2D(&c2));
	memset(&c2, 0, sizeof(c2));
	c2.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c2.srcDevice = p;
	c2.srcPitch = pitch;
	c2.dstMemoryType = CU_MEMORYTYPE_HOST;
	c2.dstHost = mat2;
	c2.dstPitch = sizeof(mat2[0]);
	c2.WidthInBytes = sizeof(mat2[0]);
	c2.Height = 10;
	CU_OK(cuMemcpy2DAsync(&c2, s));
	for (int y = 0; y < 10; y++)
		for (int xx = 0; xx < 40; xx++)
			CHECK(mat2[y][xx] == (y < 5 && xx < 10 ? mat[y + 2][xx + 4] : 0x11223344u));
	c2.srcPitch = 4096; /* rows this far apart run past the allocation */
	CU_EXPECT(cuMemcpy2D(&c2), CUDA_ERROR_INVALID_VALUE);

	for (int z = 0; z < 3; z++)
		for (int y = 0; y < 4; y++)
			for (int xx = 0; xx < 8; xx++)
				vol[z][y][xx] = (uint32_t)(z * 1000 + y * 10 + xx);
	CUDA_MEMCPY3D c3;
	memset(&c3, 0, sizeof(c3));
	c3.srcMemoryType = CU_MEMORYTYPE_HOST;
	c3.srcHost = vol;
	c3.srcPitch = sizeof(vol[0][0]);
	c3.srcHeight = 4;
	c3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c3.dstDevice = p;
	c3.dstPitch = 64;
	c3.dstHeight = 4;
	c3.WidthInBytes = sizeof(vol[0][0]);
	c3.Height = 4;
	c3.Depth = 3;
	CU_OK(cuMemcpy3D(&c3));
	memset(vol2, 0, sizeof(vol2));
	memset(&c3, 0, sizeof(c3));
	c3.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
	c3.srcDevice = p;
	c3.srcPitch = 64;
	c3.srcHeight = 4;
	c3.srcZ = 1;
	c3.dstMemoryType = CU_MEMORYTYPE_HOST;
	c3.dstHost = vol2;
	c3.dstPitch = sizeof(vol2[0][0]);
	c3.dstHeight = 4;
	c3.WidthInBytes = sizeof(vol2[0][0]);
	c3.Height = 4;
	c3.Depth = 2;
	CU_OK(cuMemcpy3DAsync(&c3, s));
	CHECK(memcmp(vol2[0], vol[1], sizeof(vol[1])) == 0 && memcmp(vol2[1], vol[2], sizeof(vol[2])) == 0);

	/* Pointer queries. */
	CU_OK(cuMemGetAddressRange(&base, &size, a + 999));
	CHECK(base == a && size == 1000);
	CU_EXPECT(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)host), CUDA_ERROR_NOT_FOUND);
	CU_OK(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 5));
	CHECK(u32 == CU_MEMORYTYPE_DEVICE);
	CU_OK(cuPointerGetAttribute(&i32, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a + 5));
	CHECK(i32 == 0);
	CU_OK(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 5));
	CHECK(base == a);
	CU_OK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 5));
	CHECK(size == 1000);
	CU_OK(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, a + 5));
	CHECK(c == ctx);
	CU_OK(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a));
	CHECK(u32 == 1);
	CU_EXPECT(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)host),
		  CUDA_ERROR_INVALID_VALUE);
	{
		CUpointer_attribute attrs[4] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
						 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_IS_MANAGED };
		unsigned int mt = 99, managed = 99;
		CUcontext pc = ctx;
		size_t rs = 99;
		void *data[4] = { &mt, &pc, &rs, &managed };

		CU_OK(cuPointerGetAttributes(4, attrs, data, b + 1));
		CHECK(mt == CU_MEMORYTYPE_DEVICE && pc == ctx && rs == 1000 && managed == 0);
		CU_OK(cuPointerGetAttributes(4, attrs, data, (CUdeviceptr)(uintptr_t)host));
		CHECK(mt == 0 && pc == NULL && rs == 0 && managed == 0);
	}

	/* Stream-ordered and managed allocation. */
	CU_OK(cuMemAllocAsync(&x, 5000, s));
	CU_OK(cuMemsetD8Async(x, 3, 5000, s));
	CU_OK(cuMemFreeAsync(x, s));
	CU_OK(cuMemAllocManaged(&m, 8192, CU_MEM_ATTACH_GLOBAL));
	((volatile char *)(uintptr_t)m)[100] = 42; /* host-accessible */
	CU_OK(cuMemcpyDtoH(back, m + 100, 1));
	CHECK(back[0] == 42);
	CU_OK(cuPointerGetAttribute(&u32, CU_POINTER_ATTRIBUTE_IS_MANAGED, m));
	CHECK(u32 == 1);
	CHECK(fakecuda_held_bytes(0, &held) == 0 && held.managed_bytes == 8192);

	/* Streams and events. */
	CU_OK(cuStreamCreateWithPriority(&s2, 0, -100));
	CU_OK(cuStreamGetPriority(s2, &prio));
	CHECK(prio == -5);
	CU_OK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
	CU_OK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
	CU_OK(cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
	CU_EXPECT(cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_INVALID_HANDLE); /* not recorded */
	CU_OK(cuEventRecord(e0, s));
	sleep_ms(30);
	CU_OK(cuEventRecord(e1, s2));
	CU_OK(cuEventRecord(e2, NULL));
	CU_OK(cuEventSynchronize(e1));
	CU_OK(cuEventQuery(e1));
	CU_OK(cuEventElapsedTime(&ms, e0, e1));
	CHECK(ms >= 25.0f && ms < 5000.0f);
	CU_EXPECT(cuEventElapsedTime(&ms, e0, e2), CUDA_ERROR_INVALID_HANDLE);
	CU_OK(cuStreamWaitEvent(s2, e0, 0));
	CU_OK(cuStreamQuery(s2));
	CU_OK(cuStreamQuery(CU_STREAM_PER_THREAD));
	CU_OK(cuLaunchHostFunc(s, host_fn, &callback_runs));
	CHECK(callback_runs == 1);
	CU_OK(cuStreamGetCtx(s2, &c));
	CHECK(c == ctx);
	CU_OK(cuEventDestroy(e0));
	CU_EXPECT(cuEventRecord(e0, s), CUDA_ERROR_INVALID_HANDLE);
	CU_OK(cuStreamDestroy(s2));
	CU_EXPECT(cuStreamSynchronize(s2), CUDA_ERROR_INVALID_HANDLE);
	CU_EXPECT(cuMemcpyHtoDAsync(a, host, 4, s2), CUDA_ERROR_INVALID_HANDLE);
	CU_OK(cuEventDestroy(e1));
	CU_OK(cuEventDestroy(e2));
	CU_OK(cuStreamDestroy(s));
	CU_OK(cuCtxSynchronize());

	/* Freeing gives everything back. */
	CU_OK(cuMemFree(a));
	CU_EXPECT(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
	CU_EXPECT(cuMemFree(b + 8), CUDA_ERROR_INVALID_VALUE);
	CU_OK(cuMemFree(b));
	CU_OK(cuMemFree(p));
	CU_OK(cuMemFree(m));
	CHECK(fakecuda_held_bytes(0, &held) == 0);
	CHECK(held.mapped_bytes == 0 && held.managed_bytes == 0 && held.nmaps == 0);
	CU_OK(cuMemGetInfo(&freeb, &total));
	CHECK(freeb == total);
	CU_OK(cuCtxDestroy(ctx2));
	CU_OK(cuCtxDestroy(ctx));
	CU_EXPECT(cuCtxDestroy(ctx), CUDA_ERROR_INVALID_CONTEXT);
	printf("test-legacy: ok\n");
	return 0;
}
