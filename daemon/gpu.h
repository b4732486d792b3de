/* gpucrd's use of the GPU: devices and their contexts, physical memory it
 * holds (imported from applications' exported fds, or created for a restore),
 * fingerprints of device memory, and the copy engine's streams. Everything
 * here runs on worker threads, never on the event loop; functions return 0
 * or a gpucr error code (err.h) and log nothing except at debug level. */
#ifndef GPUCRD_GPU_H
#define GPUCRD_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cudrv.h"

#define GPU_MAX_DEVICES 64
#define GPU_STREAMS 4

struct gpu_dev {
	int ordinal;
	CUdevice dev;
	CUcontext ctx;
	CUuuid uuid;
	char name[96];
	uint64_t total_mem;
	size_t granularity;
	CUstream streams[GPU_STREAMS];
	CUmodule fp_mod;
	CUfunction fp_fn;           /* NULL: fingerprints on the CPU */
};

/* Physical memory the daemon holds, mapped into its own address space. */
struct gpu_mem {
	struct gpu_dev *dev;
	CUmemGenericAllocationHandle handle;
	CUdeviceptr va;
	size_t size;
	int fd;                     /* exported POSIX fd (owned), or -1 */
};

/* Loads the driver and opens every device (once). msg says why on failure. */
int gpu_init(char *msg, size_t msglen);
const struct cudrv *gpu_drv(void);
int gpu_count(void);
struct gpu_dev *gpu_dev_by_uuid(const uint8_t uuid[16]);
struct gpu_dev *gpu_dev_by_ordinal(int ordinal);
/* Makes dev's context current on the calling thread. */
int gpu_use(struct gpu_dev *dev);

/* Imports an application's exported fd (the fd stays the caller's) and maps
 * it read-write into the daemon's address space. */
int gpu_mem_import(struct gpu_dev *dev, int fd, size_t size, struct gpu_mem *ret);
/* Creates new exportable physical memory of size bytes (rounded up to the
 * granularity) and maps it; ret->fd is its exported fd. */
int gpu_mem_create(struct gpu_dev *dev, size_t size, struct gpu_mem *ret);
/* Unmaps and releases; closes ret->fd. Accepts a zeroed gpu_mem. */
void gpu_mem_release(struct gpu_mem *m);

/* Fingerprints (FP_MIX64_SUM_V1) and non-zero flags of each chunk of
 * [va, va + len): fp[i] and nonzero[i] for chunk i, n = ceil(len / chunk). */
int gpu_fingerprint(struct gpu_dev *dev, CUdeviceptr va, uint64_t len, uint64_t chunk, uint64_t *fp,
		    uint8_t *nonzero);

/* Pinned host memory for staging (never pageable: 1 GB/s measured). */
int gpu_host_alloc(size_t size, void **ret);
void gpu_host_free(void *p);

#endif
