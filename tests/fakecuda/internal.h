/* fakecuda internals: the global driver state, object layouts, the call gate
 * and the tables that more than one file of the fake touches.  Nothing here
 * leaves the library (built with -fvisibility=hidden; only cu* and
 * fakecuda_* are exported, see fakecuda.map). */
#ifndef FAKECUDA_INTERNAL_H
#define FAKECUDA_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cuda.h>

#include "fakecuda.h"

#define FK_EXPORT __attribute__((visibility("default")))

#define FK_DRIVER_VERSION 13000
#define FK_MAX_DEVICES 16
#define FK_GRANULARITY (2UL << 20)
#define FK_ALIGN_UP(x, a) (((x) + (a) - 1) & ~((uintptr_t)(a) - 1))

/* Object magics: a handle is checked against these before use.  Destroyed
 * objects are kept (marked dead, see fk_obj_alloc) rather than freed, so a
 * stale handle reads FK_DEAD instead of freed memory; they are small and
 * tests are short. */
enum {
	FK_DEAD = 0xdead0000u,
	FK_CTX = 0xfc000001u,
	FK_STREAM = 0xfc000002u,
	FK_EVENT = 0xfc000003u,
	FK_MODULE = 0xfc000004u,
	FK_LIBRARY = 0xfc000005u,
	FK_FUNC = 0xfc000006u,
	FK_GRAPH = 0xfc000007u,
	FK_GRAPH_NODE = 0xfc000008u,
	FK_GRAPH_EXEC = 0xfc000009u,
};

struct fk_device {
	CUuuid uuid;
	size_t total;
	size_t used;  /* bytes of physical memory this process created */
	struct CUctx_st *primary;
};

struct fk_globals {
	int initialized;
	int ndev;
	struct fk_device dev[FK_MAX_DEVICES];
};

extern struct fk_globals fk;
/* One lock around every table of the fake.  Never held while calling back
 * into test code (kernels, stream callbacks). */
extern pthread_mutex_t fk_lock;

static inline void fk_lock_take(void) { pthread_mutex_lock(&fk_lock); }
static inline void fk_lock_drop(void) { pthread_mutex_unlock(&fk_lock); }

static inline int fk_dev_ok(CUdevice d) { return d >= 0 && d < fk.ndev; }

/* ---- contexts (context.c) ---- */
struct CUctx_st {
	uint32_t magic;
	CUdevice dev;
	unsigned int flags;
	int primary;
	int refs;  /* primary: retain count */
	unsigned long long id;
};

struct CUctx_st *fk_ctx_current(void);
int fk_ctx_ok(const struct CUctx_st *c);
/* Creates (not primary) and pushes a context; the version entry points
 * (cuCtxCreate_v2/_v3/_v4) all land here. */
CUresult fk_ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev);

/* ---- streams and events (stream.c) ---- */
/* CUDA_SUCCESS for a live stream, NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD. */
CUresult fk_stream_check(CUstream s);

/* ---- mapped memory table (memtab.c) ---- */
enum fk_kind { FK_VMM = 1, FK_LEGACY, FK_MANAGED };

/* A physical allocation from cuMemCreate or cuMemImportFromShareableHandle. */
struct fk_phys {
	CUmemGenericAllocationHandle handle;
	int fd;  /* memfd "fakecuda-phys" (or a dup of an imported one) */
	size_t size;
	CUmemAllocationProp prop;
	int refs;   /* create/import/retain minus release */
	int nmaps;  /* live cuMemMap mappings of it */
	int imported;
};

/* Memory a kernel or copy may touch: a VMM mapping, a cuMemAlloc* block or
 * managed memory.  Kept sorted by base. */
struct fk_region {
	uintptr_t base;
	size_t size;  /* mapped bytes */
	enum fk_kind kind;
	int prot;     /* PROT_* granted to it */
	struct fk_phys *phys;  /* FK_VMM */
	size_t offset;         /* FK_VMM: offset into phys */
	size_t req;            /* FK_LEGACY/FK_MANAGED: requested bytes */
	CUdevice dev;
	struct CUctx_st *ctx;
	unsigned long long id;
};

/* A cuMemAddressReserve range (PROT_NONE anonymous mapping). */
struct fk_resv {
	uintptr_t base;
	size_t size;
};

/* Sorted array of elements that start with { uintptr_t base; size_t size; }. */
struct fk_tab {
	void *v;
	size_t n, cap, esz;
};

extern struct fk_tab fk_regions;  /* struct fk_region */
extern struct fk_tab fk_resvs;    /* struct fk_resv */

#define FK_TAB_AT(t, i, type) ((type *)(void *)((char *)(t)->v + (size_t)(i) * (t)->esz))

/* All take fk_lock held.  find: index of the element containing p, or -1.
 * lower: index of the first element with base >= p. */
ssize_t fk_tab_find(const struct fk_tab *t, uintptr_t p);
size_t fk_tab_lower(const struct fk_tab *t, uintptr_t p);
int fk_tab_insert(struct fk_tab *t, const void *e);
void fk_tab_remove(struct fk_tab *t, size_t i);
/* Range [p, p+n) lies in device memory granting at least `prot`. */
CUresult fk_check_dev(uintptr_t p, size_t n, int prot);
/* Like fk_check_dev when p is device memory; any other address is taken to
 * be host memory (unified addressing) and passes. */
CUresult fk_check_any(uintptr_t p, size_t n, int prot);
unsigned long long fk_next_id(void);
/* Zeroed memory for a handle object (context, stream, event, module,
 * library, function, kernel layout).  Never freed.  Takes only a lock of
 * its own, so it may be called with fk_lock held. */
void *fk_obj_alloc(size_t size);

/* ---- kernels (module.c) ---- */
struct CUfunc_st;
CUresult fk_launch(CUfunction f, const unsigned int grid[3], const unsigned int block[3],
		   unsigned int shmem, CUstream s, void **params, void **extra);
/* The parameter layout of a registered kernel (fk_lock not held): count,
 * offsets, sizes (valid for the life of the process) and total bytes.
 * CUDA_ERROR_INVALID_HANDLE when f is none. */
CUresult fk_func_layout(CUfunction f, int *nparams, const size_t **off, const size_t **size, size_t *argbytes);

/* ---- copies (copy.c), for graph nodes (graph.c) ---- */
CUresult fk_copy3d(const CUDA_MEMCPY3D *c);
/* height rows of width elements of esize bytes, pitch apart, set to v. */
CUresult fk_fill(uintptr_t dst, size_t pitch, uint32_t v, size_t esize, size_t width, size_t height);

/* ---- entry points (procaddr.c, gen-stubs.c) ---- */
/* What every unimplemented cuda.h function is a weak alias of. */
int fk_not_supported(void);
CUresult fk_get_proc_address(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status);

/* ---- checkpoint state (gate.c, ckpt.c) ---- */
/* One page per CUDA process at FAKECUDA_STATE_FMT, mapped shared by the
 * process itself and, for the length of one call, by whoever drives
 * cuCheckpointProcess* on it.  Fields are accessed with __atomic builtins. */
#define FK_PAGE_MAGIC 0x70636b66u  /* "fkcp" */
#define FK_PAGE_VERSION 2u
#define FK_PAGE_SIZE 4096

struct fk_page {
	uint32_t magic;
	uint32_t version;
	int32_t pid;
	uint32_t state;        /* CUprocessState */
	int32_t active;        /* threads inside a gated driver call */
	int32_t restore_tid;
	uint64_t transitions;  /* state changes, for debugging */
	/* Version 2: the target's opt-ins (FAKECUDA_CKPT_KEEPS_MEMORY,
	 * FAKECUDA_RESTORE_THREAD, read at cuInit), and the restore thread's
	 * mailbox: a caller raises `calls` and waits until the thread has
	 * copied it into `served`. */
	uint32_t flags;        /* FK_PAGE_KEEPS_MEMORY | FK_PAGE_RESTORE_THREAD */
	uint32_t calls;
	uint32_t served;
};

#define FK_PAGE_KEEPS_MEMORY 1u    /* a checkpoint keeps device memory, as the driver's does */
#define FK_PAGE_RESTORE_THREAD 2u  /* a thread of the target serves the checkpoint API */

/* "<dir>/fakecuda-ckpt-<pid>" into buf. */
void fk_state_path(char *buf, size_t len, pid_t pid);

/* ---- the gate (gate.c) ---- */
/* Every driver call that does work passes the gate: it fails with
 * CUDA_ERROR_NOT_INITIALIZED before cuInit, applies injected faults, and
 * blocks while another process holds this one LOCKED or CHECKPOINTED through
 * the cuCheckpointProcess* API.  It also keeps errno as the caller had it. */
struct fk_gate {
	int entered;          /* counted in this thread's nesting depth */
	int saved_errno;
	struct fk_page *page; /* the page whose `active` this call raised */
};

CUresult fk_gate_enter(const char *fn, struct fk_gate *g);
void fk_gate_leave(struct fk_gate *g);
/* The fault injected for fn's next call (FAKECUDA_FAIL,
 * fakecuda_inject_fault), or CUDA_SUCCESS: fk_gate_enter asks it, and so
 * do the checkpoint API's calls, which do not pass the gate. */
CUresult fk_fault_check(const char *fn);
/* Called from cuInit, fk_lock held: the first time reads FAKECUDA_FAIL
 * and creates this process's state page; in a forked child, creates its. */
CUresult fk_gate_init(void);

/* FK_ENTER_AS names the exported symbol when the C name differs from it. */
#define FK_ENTER_AS(name)                                                      \
	__attribute__((cleanup(fk_gate_leave))) struct fk_gate fk_gate_ = {0};    \
	do {                                                                   \
		CUresult fk_rc_ = fk_gate_enter((name), &fk_gate_);            \
		if (fk_rc_ != CUDA_SUCCESS)                                    \
			return fk_rc_;                                         \
	} while (0)
#define FK_ENTER() FK_ENTER_AS(__func__)

/* Declares an entry point exported under a name that cuda.h turns into a
 * macro for another version (cuDeviceGetUuid -> cuDeviceGetUuid_v2). */
#define FK_LEGACY(ret, cname, sym, args) \
	FK_EXPORT ret CUDAAPI cname args __asm__(sym); \
	FK_EXPORT ret CUDAAPI cname args

#endif
