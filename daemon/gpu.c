/* Owns gpucrd's CUDA state: the driver table, one primary context per
 * device, the embedded fingerprint kernel, and the physical allocations the
 * daemon maps. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "fingerprint.h"
#include "gpu.h"
#include "log.h"

extern const char gpucr_fp_ptx[];

static const struct cudrv *drv;
static struct gpu_dev devs[GPU_MAX_DEVICES];
static int ndevs;
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int init_ret = 1;
static char init_msg[512];

#define CU(call) gpucr_err_from_cu(drv->call)

static int open_device(int i)
{
	struct gpu_dev *d = &devs[i];
	CUmemAllocationProp prop;
	int r, s;

	memset(d, 0, sizeof(*d));
	d->ordinal = i;
	r = CU(cuDeviceGet(&d->dev, i));
	if (!r)
		r = CU(cuDevicePrimaryCtxRetain(&d->ctx, d->dev));
	if (!r)
		r = CU(cuCtxSetCurrent(d->ctx));
	if (r)
		return r;
	drv->cuDeviceGetName(d->name, sizeof(d->name), d->dev);
	drv->cuDeviceGetUuid(&d->uuid, d->dev);
	{
		size_t tm = 0;

		drv->cuDeviceTotalMem(&tm, d->dev);
		d->total_mem = tm;
	}
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = i;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	r = CU(cuMemGetAllocationGranularity(&d->granularity, &prop,
					     CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	if (r || !d->granularity)
		d->granularity = 2u << 20;
	for (s = 0; s < GPU_STREAMS; s++) {
		r = CU(cuStreamCreate(&d->streams[s], CU_STREAM_NON_BLOCKING));
		if (r)
			return r;
	}
	/* The fingerprint kernel; without it (a driver that cannot JIT this
	 * PTX, or the test driver) fingerprints are computed on the CPU. */
	if (drv->cuModuleLoadData(&d->fp_mod, gpucr_fp_ptx) == CUDA_SUCCESS &&
	    drv->cuModuleGetFunction(&d->fp_fn, d->fp_mod, "gpucr_fp_chunks") != CUDA_SUCCESS)
		d->fp_fn = NULL;
	pr_debug("device %d: %s, %llu MiB, granularity %zu, fingerprints on %s", i, d->name,
		 (unsigned long long)(d->total_mem >> 20), d->granularity, d->fp_fn ? "GPU" : "CPU");
	return 0;
}

static int do_init(void)
{
	int n = 0, i, r;

	r = cudrv_load(&drv, init_msg, sizeof(init_msg));
	if (r < 0)
		return r;
	r = CU(cuDeviceGetCount(&n));
	if (r < 0) {
		snprintf(init_msg, sizeof(init_msg), "cuDeviceGetCount: %s", gpucr_strerror(r));
		return r;
	}
	if (n > GPU_MAX_DEVICES)
		n = GPU_MAX_DEVICES;
	for (i = 0; i < n; i++) {
		r = open_device(i);
		if (r < 0) {
			snprintf(init_msg, sizeof(init_msg), "device %d: %s", i, gpucr_strerror(r));
			return r;
		}
	}
	ndevs = n;
	return 0;
}

int gpu_init(char *msg, size_t msglen)
{
	int r;

	pthread_mutex_lock(&init_lock);
	if (init_ret == 1)
		init_ret = do_init();
	r = init_ret;
	pthread_mutex_unlock(&init_lock);
	if (r < 0 && msg)
		snprintf(msg, msglen, "%s", init_msg);
	return r;
}

const struct cudrv *gpu_drv(void)
{
	return drv;
}

int gpu_count(void)
{
	return ndevs;
}

struct gpu_dev *gpu_dev_by_uuid(const uint8_t uuid[16])
{
	int i;

	for (i = 0; i < ndevs; i++)
		if (!memcmp(devs[i].uuid.bytes, uuid, 16))
			return &devs[i];
	return NULL;
}

struct gpu_dev *gpu_dev_by_ordinal(int ordinal)
{
	return ordinal >= 0 && ordinal < ndevs ? &devs[ordinal] : NULL;
}

int gpu_use(struct gpu_dev *dev)
{
	return CU(cuCtxSetCurrent(dev->ctx));
}

static int map_rw(struct gpu_dev *dev, struct gpu_mem *m)
{
	CUmemAccessDesc acc;
	int r;

	r = CU(cuMemAddressReserve(&m->va, m->size, dev->granularity, 0, 0));
	if (r)
		return r;
	r = CU(cuMemMap(m->va, m->size, 0, m->handle, 0));
	if (r) {
		drv->cuMemAddressFree(m->va, m->size);
		m->va = 0;
		return r;
	}
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = dev->ordinal;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = CU(cuMemSetAccess(m->va, m->size, &acc, 1));
	if (r) {
		drv->cuMemUnmap(m->va, m->size);
		drv->cuMemAddressFree(m->va, m->size);
		m->va = 0;
	}
	return r;
}

int gpu_mem_import(struct gpu_dev *dev, int fd, size_t size, struct gpu_mem *ret)
{
	struct gpu_mem m = { .dev = dev, .size = size, .fd = -1 };
	int r;

	r = gpu_use(dev);
	if (r)
		return r;
	r = CU(cuMemImportFromShareableHandle(&m.handle, (void *)(uintptr_t)fd,
					      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	if (r)
		return r;
	r = map_rw(dev, &m);
	if (r) {
		drv->cuMemRelease(m.handle);
		return r;
	}
	*ret = m;
	return 0;
}

int gpu_mem_create(struct gpu_dev *dev, size_t size, struct gpu_mem *ret)
{
	struct gpu_mem m = { .dev = dev, .fd = -1 };
	CUmemAllocationProp prop;
	int r, fd = -1;

	m.size = (size + dev->granularity - 1) / dev->granularity * dev->granularity;
	r = gpu_use(dev);
	if (r)
		return r;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev->ordinal;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	r = CU(cuMemCreate(&m.handle, m.size, &prop, 0));
	if (r)
		return r;
	r = CU(cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	if (r) {
		drv->cuMemRelease(m.handle);
		return r;
	}
	m.fd = fd;
	r = map_rw(dev, &m);
	if (r) {
		close(fd);
		drv->cuMemRelease(m.handle);
		return r;
	}
	*ret = m;
	return 0;
}

void gpu_mem_release(struct gpu_mem *m)
{
	if (!m || !m->dev)
		return;
	gpu_use(m->dev);
	if (m->va) {
		drv->cuMemUnmap(m->va, m->size);
		drv->cuMemAddressFree(m->va, m->size);
	}
	if (m->handle)
		drv->cuMemRelease(m->handle);
	if (m->fd >= 0)
		close(m->fd);
	memset(m, 0, sizeof(*m));
	m->fd = -1;
}

static int fingerprint_cpu(struct gpu_dev *dev, CUdeviceptr va, uint64_t len, uint64_t chunk,
			   uint64_t *fp, uint8_t *nonzero)
{
	uint64_t off, i = 0;
	void *buf;
	int r = 0;

	buf = malloc(chunk);
	if (!buf)
		return -ENOMEM;
	(void)dev;
	for (off = 0; off < len; off += chunk, i++) {
		uint64_t n = len - off < chunk ? len - off : chunk;

		r = CU(cuMemcpyDtoH(buf, va + off, n));
		if (r)
			break;
		fp[i] = fp_chunk(buf, n, 0);
		nonzero[i] = !fp_is_zero(buf, n);
	}
	free(buf);
	return r;
}

int gpu_fingerprint(struct gpu_dev *dev, CUdeviceptr va, uint64_t len, uint64_t chunk, uint64_t *fp,
		    uint8_t *nonzero)
{
	uint64_t nchunks = (len + chunk - 1) / chunk, i, c0;
	CUdeviceptr dfp = 0, dnz = 0;
	uint64_t *hfp = NULL, *hnz = NULL;
	void *args[5];
	int r;

	if (!len)
		return 0;
	r = gpu_use(dev);
	if (r)
		return r;
	if (!dev->fp_fn || chunk % 8) {
		if (!fp || !nonzero)
			return 0;
		return fingerprint_cpu(dev, va, len, chunk, fp, nonzero);
	}
	r = CU(cuMemAlloc(&dfp, nchunks * 8 * 2));
	if (r)
		return r;
	dnz = dfp + nchunks * 8;
	hfp = malloc(nchunks * 8);
	hnz = malloc(nchunks * 8);
	if (!hfp || !hnz) {
		free(hfp);
		free(hnz);
		drv->cuMemFree(dfp);
		return -ENOMEM;
	}
	r = CU(cuMemsetD8Async(dfp, 0, nchunks * 8 * 2, dev->streams[0]));
	/* One launch per 65535 chunks (the grid's y limit). */
	for (c0 = 0; c0 < nchunks && !r; c0 += 65535) {
		uint64_t n = nchunks - c0 < 65535 ? nchunks - c0 : 65535;
		CUdeviceptr base = va + c0 * chunk, ofp = dfp + c0 * 8, onz = dnz + c0 * 8;
		uint64_t blen = len - c0 * chunk < n * chunk ? len - c0 * chunk : n * chunk;
		/* Enough blocks per chunk to fill the GPU for few chunks. */
		unsigned gx = n >= 1024 ? 4 : (unsigned)(4096 / n + 1);

		args[0] = &base;
		args[1] = &blen;
		args[2] = &chunk;
		args[3] = &ofp;
		args[4] = &onz;
		r = CU(cuLaunchKernel(dev->fp_fn, gx, (unsigned)n, 1, 256, 1, 1, 0, dev->streams[0], args, NULL));
	}
	if (!r)
		r = CU(cuStreamSynchronize(dev->streams[0]));
	if (!r)
		r = CU(cuMemcpyDtoH(hfp, dfp, nchunks * 8));
	if (!r)
		r = CU(cuMemcpyDtoH(hnz, dnz, nchunks * 8));
	if (!r && fp && nonzero)
		for (i = 0; i < nchunks; i++) {
			fp[i] = hfp[i];
			nonzero[i] = hnz[i] != 0;
		}
	free(hfp);
	free(hnz);
	drv->cuMemFree(dfp);
	return r;
}

int gpu_host_alloc(size_t size, void **ret)
{
	return CU(cuMemHostAlloc(ret, size, CU_MEMHOSTALLOC_PORTABLE));
}

void gpu_host_free(void *p)
{
	if (p)
		drv->cuMemFreeHost(p);
}
