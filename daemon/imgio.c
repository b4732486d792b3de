/* Owns moving GPU memory to and from image files: fingerprints on the
 * device, then the stored chunks as "runs" (contiguous in GPU memory and in
 * the pages file) moved through pinned staging buffers — never pageable
 * memory: 1 GB/s measured against 55 GB/s pinned. All-zero chunks are
 * recorded, not stored.
 *
 * Two engines move the runs:
 *   - a file opened O_DIRECT (local disks): one thread, io_uring, several
 *     staging slots in flight, copies overlapped with the I/O;
 *   - tmpfs (the usual target for fast restarts) and files that refuse
 *     O_DIRECT: worker threads, each with its own staging buffer and
 *     stream, pwrite/pread in parallel, each run in its own pages file when
 *     the image has several. Writers of one tmpfs file serialise on it: on
 *     the H200 host 16 threads wrote 16 GiB into one file at 4.4 GB/s, into
 *     16 files at 27.5 GB/s.
 * Runs on a worker thread of the daemon. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "fingerprint.h"
#include "gpucrd.h"
#include "image.h"
#include "log.h"

#define NSLOTS 16
#define MAX_THREADS 32

/* One stretch to move: [dev_off, dev_off + len) of a buffer <-> file_off
 * in pages file `file`. */
struct run {
	struct rbuf *b;
	uint64_t dev_off;
	uint64_t file_off;
	uint64_t len;
	unsigned file;
	const Gpucr__Chunk *chunks; /* a concurrent write: the run's chunk records, to check */
	int taken;
	CUdeviceptr src;            /* a copy of the run made at T (spare GPU memory), or 0 */
	struct pc_chunk *rec;       /* a pre-copy: the run's chunks, to record what was stored */
};

struct xfer {
	int write;              /* GPU -> file */
	pid_t pid;
	const char *what;
	struct run *runs;
	size_t nruns;
	uint64_t total;
	/* progress, shared by workers */
	pthread_mutex_t lock;
	size_t next;
	uint64_t done;
	uint64_t t0, last_report;
	int err;
	char *msg;
	size_t msglen;
	uint64_t *progress;     /* mirror of done for ps, or NULL */
	const struct img_hooks *hooks;  /* a concurrent checkpoint, or NULL */
	uint64_t chunk;         /* chunk size, for checking (hooks) */
	int record;             /* a pre-copy: runs record the fingerprints of what they store */
	useconds_t slice_delay_us;      /* GPUCR_FI_SLICE_DELAY_MS */
	unsigned nfiles;
	int fds[IMG_MAX_PAGES_FILES];   /* buffered, one per pages file */
	int dfds[IMG_MAX_PAGES_FILES];  /* O_DIRECT, or -1 */
	size_t slot_size;
};

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *s = getenv(name);

	return s && *s ? strtoull(s, NULL, 10) : def;
}

static uint64_t chunk_size(void)
{
	uint64_t kb = env_u64("GPUCR_CHUNK_KB", 2048);

	if (kb < 4 || kb % 4)
		kb = 2048;
	return kb << 10;
}

static size_t stage_size(void)
{
	uint64_t mb = env_u64("GPUCR_STAGE_MB", 32);

	return (mb < 2 ? 32 : mb) << 20;
}

static int nthreads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t want = env_u64("GPUCR_IO_THREADS", 0);

	if (want)
		n = (long)want;
	if (n > 16 && !want)
		n = 16;
	return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

/* Pinned staging is kept between transfers (pinning 1 GiB is not free, and
 * a restore from an image should not pay for it); GPUCR_STAGE_KEEP=0 frees
 * it after every transfer instead. */
#define POOL_MAX (MAX_THREADS * 2)
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static void *pool[POOL_MAX];
static size_t npool;

static int stage_keep(void)
{
	return env_u64("GPUCR_STAGE_KEEP", 1) != 0;
}

static int stage_get(size_t size, void **ret)
{
	pthread_mutex_lock(&pool_lock);
	if (npool && size == stage_size()) {
		*ret = pool[--npool];
		pthread_mutex_unlock(&pool_lock);
		return 0;
	}
	pthread_mutex_unlock(&pool_lock);
	return gpu_host_alloc(size, ret);
}

static void stage_put(void *p, size_t size)
{
	if (!p)
		return;
	pthread_mutex_lock(&pool_lock);
	if (stage_keep() && size == stage_size() && npool < POOL_MAX) {
		pool[npool++] = p;
		p = NULL;
	}
	pthread_mutex_unlock(&pool_lock);
	gpu_host_free(p);
}

void imgio_prefill(void)
{
	uint64_t t0 = now_ns();
	size_t want = (size_t)nthreads() * 2, have, n = 0;
	void *p;

	if (!stage_keep())
		return;
	pthread_mutex_lock(&pool_lock);
	have = npool;
	pthread_mutex_unlock(&pool_lock);
	for (; have + n < want && gpu_host_alloc(stage_size(), &p) == 0; n++)
		stage_put(p, stage_size());
	if (n)
		pr_debug("%zu MiB of pinned staging ready in %.1f ms", n * stage_size() >> 20, (now_ns() - t0) / 1e6);
}

/* The longest run one worker moves at a time: a quarter of each worker's
 * share of `total`, between `unit` and 256 MiB, a multiple of `unit`. Long
 * stretches of stored chunks are cut into such pieces so that every worker
 * (and, on tmpfs, every pages file) gets a share. */
static uint64_t run_piece(uint64_t total, uint64_t unit)
{
	uint64_t p = total / ((uint64_t)nthreads() * 4), max = (uint64_t)256 << 20;

	if (p > max)
		p = max;
	p -= p % unit;
	return p < unit ? unit : p;
}

static void set_err(struct xfer *x, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void set_err(struct xfer *x, int err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&x->lock);
	if (!x->err) {
		x->err = err;
		va_start(ap, fmt);
		vsnprintf(x->msg, x->msglen, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&x->lock);
}

static void account(struct xfer *x, uint64_t bytes)
{
	uint64_t t;

	pthread_mutex_lock(&x->lock);
	x->done += bytes;
	if (x->progress)
		__atomic_store_n(x->progress, x->done, __ATOMIC_RELAXED);
	t = now_ns();
	if (t - x->last_report >= 2000000000ull && x->total) {
		double secs = (t - x->t0) / 1e9, rate = secs > 0 ? x->done / secs : 0;

		x->last_report = t;
		pr_info("pid %d: %s: %.1f of %.1f GiB, %.1f GB/s, %.0f s left", (int)x->pid, x->what,
			x->done / 1073741824.0, x->total / 1073741824.0, rate / 1e9,
			rate > 0 ? (x->total - x->done) / rate : 0.0);
	}
	pthread_mutex_unlock(&x->lock);
}

/* GPU <-> pinned staging, on stream st (0: stream s of the run's device);
 * waits for the copy unless async. */
static int dev_copy_on(struct xfer *x, const struct run *rn, void *host, uint64_t off, uint64_t len, CUstream st,
		       int async)
{
	const struct cudrv *drv = gpu_drv();
	int r;

	r = gpu_use(rn->b->mem.dev);
	if (!r)
		r = gpucr_err_from_cu(x->write ? drv->cuMemcpyDtoHAsync(host, (rn->src ? rn->src : rn->b->mem.va + rn->dev_off) + off,
								       len, st) :
						 drv->cuMemcpyHtoDAsync(rn->b->mem.va + rn->dev_off + off, host, len, st));
	if (!r && !async)
		r = gpucr_err_from_cu(drv->cuStreamSynchronize(st));
	if (r < 0)
		set_err(x, r, "buffer 0x%" PRIx64 ": copy %s the GPU: %s", rn->b->va, x->write ? "from" : "to",
			gpucr_strerror(r));
	return r;
}

static int dev_copy(struct xfer *x, const struct run *rn, void *host, uint64_t off, uint64_t len, int s)
{
	return dev_copy_on(x, rn, host, off, len, rn->b->mem.dev->streams[s % GPU_STREAMS], 0);
}

/* ---- engine 1: parallel workers, pwrite/pread ---------------------------- */

/* Each worker owns two staging buffers and a stream per device, so the
 * GPU copy of one slice overlaps the file I/O of the one before. */
struct worker {
	struct xfer *x;
	int idx;
	void *stage[2];
	CUstream st[GPU_MAX_DEVICES];
	pthread_t th;
};

/* One slot-sized piece of a run. */
struct slice {
	const struct run *rn;
	uint64_t off, len;
	CUstream st;
};

static int io_full(struct xfer *x, int write, int fd, void *buf, uint64_t len, uint64_t off)
{
	char *p = buf;

	while (len) {
		ssize_t n = write ? pwrite(fd, p, len, (off_t)off) : pread(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int err = n < 0 ? -errno : -EIO;

			set_err(x, err, "%s: %s%s", x->what, n < 0 ? strerror(errno) : "the file ends early",
				err == -ENOSPC ? " (the image's file system is full; no image was left behind)" : "");
			return err;
		}
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static CUstream worker_stream(struct worker *w, struct gpu_dev *dev)
{
	int o = dev->ordinal;

	if (o < 0 || o >= GPU_MAX_DEVICES)
		return dev->streams[w->idx % GPU_STREAMS];
	if (!w->st[o] && (gpu_use(dev) < 0 || gpu_drv()->cuStreamCreate(&w->st[o], CU_STREAM_NON_BLOCKING)))
		w->st[o] = NULL;
	return w->st[o] ? w->st[o] : dev->streams[w->idx % GPU_STREAMS];
}

/* The application's address of a run's byte off. */
static uint64_t run_va(const struct run *rn, uint64_t off)
{
	return rn->b->va + rn->b->phys_offset + rn->dev_off + off;
}

/* A run the process waits for, not yet taken (x->lock held). */
static struct run *wanted_run(struct xfer *x)
{
	uint64_t va, len;
	size_t i;

	while (x->hooks && x->hooks->wanted && x->hooks->wanted(x->hooks->data, &va, &len)) {
		for (i = x->next; i < x->nruns; i++) {
			struct run *r = &x->runs[i];

			if (!r->taken && run_va(r, 0) < va + len && va < run_va(r, r->len))
				return r;
		}
	}
	return NULL;
}

/* What a concurrent write says when a chunk is not what it was at T. */
static int escape_msg(char *msg, size_t msglen, const struct run *rn, uint64_t chunk_off)
{
	snprintf(msg, msglen,
		 "buffer 0x%" PRIx64 ": chunk at offset %" PRIu64
		 " changed while it was being saved: a GPU write escaped prediction (through a "
		 "pointer held in device memory?); this checkpoint is not valid",
		 rn->b->va, chunk_off);
	return -ESTALE;
}

/* A concurrent write: the slice's chunks, now in staging, must be what they
 * were at T; anything else is a write that escaped prediction. */
static int slice_check(struct xfer *x, const struct slice *sl, const void *buf)
{
	const struct run *rn = sl->rn;
	uint64_t off, first = rn->chunks ? rn->chunks[0].offset : 0;

	if (!rn->chunks || !x->chunk)
		return 0;
	for (off = 0; off < sl->len; off += x->chunk) {
		uint64_t at = rn->dev_off + sl->off + off, n = sl->len - off < x->chunk ? sl->len - off : x->chunk;
		const Gpucr__Chunk *ch = &rn->chunks[(at - first) / x->chunk];

		if (fp_chunk((const char *)buf + off, n, 0) != ch->fingerprint) {
			char why[300];

			set_err(x, escape_msg(why, sizeof(why), rn, ch->offset), "%s", why);
			return -ESTALE;
		}
	}
	return 0;
}

/* A pre-copy: the fingerprint of each chunk of len bytes at the run's byte
 * off, as it lies in staging, is what the pages file gets: recorded, it
 * tells at T whether the stored chunk is still the memory's (a copy torn
 * by the running process records bytes that match nothing later). */
static void run_record(struct xfer *x, const struct run *rn, uint64_t off, uint64_t len, const void *buf)
{
	uint64_t o;

	if (!rn->rec || !x->chunk)
		return;
	for (o = 0; o < len; o += x->chunk) {
		uint64_t n = len - o < x->chunk ? len - o : x->chunk;
		struct pc_chunk *pc = &rn->rec[(off + o) / x->chunk];

		pc->fp = fp_chunk((const char *)buf + o, n, 0);
		pc->stored = 1;
	}
}

/* The worker's next slice: the rest of its run, or a new run. */
static int next_slice(struct worker *w, const struct run **rn, uint64_t *roff, struct slice *sl)
{
	struct xfer *x = w->x;

	if (!*rn || *roff == (*rn)->len) {
		struct run *r = NULL;

		pthread_mutex_lock(&x->lock);
		if (x->err) {
			pthread_mutex_unlock(&x->lock);
			return 0;
		}
		r = wanted_run(x);
		while (!r && x->next < x->nruns) {
			r = &x->runs[x->next++];
			if (r->taken)
				r = NULL;
		}
		if (r)
			r->taken = 1;
		pthread_mutex_unlock(&x->lock);
		if (!r)
			return 0;
		*rn = r;
		*roff = 0;
	}
	sl->rn = *rn;
	sl->off = *roff;
	sl->len = (*rn)->len - *roff < x->slot_size ? (*rn)->len - *roff : x->slot_size;
	sl->st = worker_stream(w, (*rn)->b->mem.dev);
	*roff += sl->len;
	return 1;
}

static int slice_io(struct xfer *x, const struct slice *sl, void *buf)
{
	return io_full(x, x->write, x->fds[sl->rn->file], buf, sl->len, sl->rn->file_off + sl->off);
}

static int slice_wait(struct xfer *x, const struct slice *sl)
{
	int r = gpucr_err_from_cu(gpu_drv()->cuStreamSynchronize(sl->st));

	if (r < 0)
		set_err(x, r, "buffer 0x%" PRIx64 ": copy %s the GPU: %s", sl->rn->b->va, x->write ? "from" : "to",
			gpucr_strerror(r));
	return r;
}

/* Writing: copy slice k from the GPU while slice k-1 goes to its file.
 * Reading: read slice k from its file while slice k-1 goes to the GPU. */
static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct xfer *x = w->x;
	const struct run *rn = NULL;
	uint64_t roff = 0;
	struct slice cur, prev;
	int have_prev = 0, k = 0;

	while (!x->err && next_slice(w, &rn, &roff, &cur)) {
		if (x->write) {
			if (dev_copy_on(x, cur.rn, w->stage[k], cur.off, cur.len, cur.st, 1) < 0)
				break;
			if (have_prev && slice_io(x, &prev, w->stage[!k]) < 0)
				break;
			if (have_prev)
				account(x, prev.len);
			if (slice_wait(x, &cur) < 0 || slice_check(x, &cur, w->stage[k]) < 0)
				break;
			run_record(x, cur.rn, cur.off, cur.len, w->stage[k]);
			if (x->slice_delay_us) /* fault injection for tests: a slow writer */
				usleep(x->slice_delay_us);
			if (x->hooks && x->hooks->saved)
				x->hooks->saved(x->hooks->data, run_va(cur.rn, cur.off), cur.len);
		} else {
			if (slice_io(x, &cur, w->stage[k]) < 0)
				break;
			if (have_prev && slice_wait(x, &prev) < 0)
				break;
			if (have_prev)
				account(x, prev.len);
			if (dev_copy_on(x, cur.rn, w->stage[k], cur.off, cur.len, cur.st, 1) < 0)
				break;
			if (x->slice_delay_us) /* fault injection for tests: a slow reader */
				usleep(x->slice_delay_us);
		}
		prev = cur;
		have_prev = 1;
		k = !k;
	}
	if (have_prev && !x->err && (x->write ? slice_io(x, &prev, w->stage[!k]) : slice_wait(x, &prev)) == 0)
		account(x, prev.len);
	return NULL;
}

static void worker_free(struct worker *w)
{
	int o;

	for (o = 0; o < GPU_MAX_DEVICES; o++)
		if (w->st[o]) {
			gpu_drv()->cuStreamSynchronize(w->st[o]); /* after an error, a copy may be in flight */
			gpu_drv()->cuStreamDestroy(w->st[o]);
		}
	stage_put(w->stage[0], w->x->slot_size);
	stage_put(w->stage[1], w->x->slot_size);
}

static int xfer_parallel(struct xfer *x)
{
	struct worker *ws;
	int n = nthreads(), i, started = 0, r = 0;
	uint64_t t0 = now_ns();

	if (x->nruns == 0)
		return 0;
	if ((size_t)n > x->nruns)
		n = (int)x->nruns;
	ws = calloc((size_t)n, sizeof(*ws));
	if (!ws) {
		set_err(x, -ENOMEM, "out of memory");
		return x->err;
	}
	for (i = 0; i < n && !r; i++) {
		ws[i].x = x;
		ws[i].idx = i;
		r = stage_get(x->slot_size, &ws[i].stage[0]);
		if (!r)
			r = stage_get(x->slot_size, &ws[i].stage[1]);
		if (r < 0)
			set_err(x, r, "cannot pin %zu MiB of host memory for staging: %s", 2 * x->slot_size >> 20,
				gpucr_strerror(r));
	}
	pr_debug("pid %d: %s: %d workers, %zu MiB of pinned staging in %.1f ms", (int)x->pid, x->what, n,
		 (size_t)n * 2 * x->slot_size >> 20, (now_ns() - t0) / 1e6);
	for (i = 0; i < n && !x->err; i++) {
		if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
			break;
		started++;
	}
	if (!started && !x->err)
		set_err(x, -EAGAIN, "cannot start copy threads");
	for (i = 0; i < started; i++)
		pthread_join(ws[i].th, NULL);
	for (i = 0; i < n; i++)
		if (ws[i].x)
			worker_free(&ws[i]);
	free(ws);
	return x->err;
}

/* ---- engine 2: O_DIRECT file, io_uring ---------------------------------- */

struct slot {
	void *buf;
	int busy;
	const struct run *rn;
	uint64_t off;   /* within the run */
	uint64_t len;
};

static int uring_reap(struct xfer *x, struct io_uring *ring, struct slot *slots, int *inflight)
{
	struct io_uring_cqe *cqe;
	struct slot *s;
	uint64_t alen;
	int r, idx;

	r = io_uring_wait_cqe(ring, &cqe);
	if (r < 0) {
		set_err(x, r, "io_uring: %s", strerror(-r));
		return -1;
	}
	idx = (int)io_uring_cqe_get_data64(cqe);
	s = &slots[idx];
	alen = (s->len + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
	if (cqe->res < 0)
		set_err(x, cqe->res, "%s: %s%s", x->what, strerror(-cqe->res),
			cqe->res == -ENOSPC ? " (the file system is full; no image was left behind)" : "");
	else if ((uint64_t)cqe->res < alen)
		set_err(x, -EIO, "%s: short transfer (%d of %" PRIu64 " bytes)%s", x->what, cqe->res, alen,
			cqe->res == 0 ? ": the file ends early" : "");
	io_uring_cqe_seen(ring, cqe);
	(*inflight)--;
	return idx;
}

static int xfer_uring(struct xfer *x)
{
	struct slot slots[NSLOTS];
	struct io_uring ring;
	size_t ri = 0;
	uint64_t roff = 0;
	int inflight = 0, i, r;

	memset(slots, 0, sizeof(slots));
	r = io_uring_queue_init(NSLOTS * 2, &ring, 0);
	if (r < 0) {
		set_err(x, r, "io_uring setup failed: %s", strerror(-r));
		return r;
	}
	for (i = 0; i < NSLOTS; i++) {
		r = stage_get(x->slot_size, &slots[i].buf);
		if (r < 0) {
			set_err(x, r, "cannot pin %zu MiB of host memory for staging: %s", x->slot_size >> 20,
				gpucr_strerror(r));
			goto out;
		}
	}
	while (!x->err && (ri < x->nruns || inflight)) {
		struct io_uring_sqe *sqe;
		struct slot *s;
		uint64_t alen;

		/* A free slot, or wait for one (landing reads on the GPU). */
		for (i = 0; i < NSLOTS && slots[i].busy; i++)
			;
		if (i == NSLOTS || ri == x->nruns) {
			i = uring_reap(x, &ring, slots, &inflight);
			if (i < 0 || x->err)
				break;
			s = &slots[i];
			if (!x->write && dev_copy(x, s->rn, s->buf, s->off, s->len, i) < 0)
				break;
			if (x->slice_delay_us) /* fault injection for tests: a slow disk */
				usleep(x->slice_delay_us);
			account(x, s->len);
			s->busy = 0;
			continue;
		}
		s = &slots[i];
		s->rn = &x->runs[ri];
		s->off = roff;
		s->len = s->rn->len - roff < x->slot_size ? s->rn->len - roff : x->slot_size;
		roff += s->len;
		if (roff == s->rn->len) {
			ri++;
			roff = 0;
		}
		alen = (s->len + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
		if (x->write) {
			if (dev_copy(x, s->rn, s->buf, s->off, s->len, i) < 0)
				break;
			run_record(x, s->rn, s->off, s->len, s->buf);
			if (alen > s->len)
				memset((char *)s->buf + s->len, 0, alen - s->len);
		}
		sqe = io_uring_get_sqe(&ring);
		if (!sqe) {
			set_err(x, -EBUSY, "io_uring queue full");
			break;
		}
		if (x->write)
			io_uring_prep_write(sqe, x->dfds[s->rn->file], s->buf, (unsigned)alen, s->rn->file_off + s->off);
		else
			io_uring_prep_read(sqe, x->dfds[s->rn->file], s->buf, (unsigned)alen, s->rn->file_off + s->off);
		io_uring_sqe_set_data64(sqe, (uint64_t)i);
		r = io_uring_submit(&ring);
		if (r < 0) {
			set_err(x, r, "io_uring submit: %s", strerror(-r));
			break;
		}
		s->busy = 1;
		inflight++;
	}
	while (inflight > 0 && uring_reap(x, &ring, slots, &inflight) >= 0)
		;
out:
	for (i = 0; i < NSLOTS; i++)
		stage_put(slots[i].buf, x->slot_size);
	io_uring_queue_exit(&ring);
	return x->err;
}

static int is_tmpfs(int fd)
{
	struct statfs sf;

	return fstatfs(fd, &sf) == 0 && sf.f_type == 0x01021994; /* TMPFS_MAGIC */
}

/* io_uring with O_DIRECT for files that bypass the page cache; parallel
 * workers otherwise. tmpfs accepts O_DIRECT opens on current kernels but
 * still copies through the page cache under the inode lock, so it gets the
 * workers (and several pages files). GPUCR_IO_ENGINE=uring|parallel
 * overrides. */
static int use_uring(const struct xfer *x)
{
	const char *e = getenv("GPUCR_IO_ENGINE");
	unsigned k;

	for (k = 0; k < x->nfiles; k++)
		if (x->dfds[k] < 0)
			return 0;
	if (e && !strcmp(e, "uring"))
		return 1;
	if (e && !strcmp(e, "parallel"))
		return 0;
	return !is_tmpfs(x->fds[0]);
}

/* Moves every run. x->fds/dfds/nfiles are set by the caller. */
static int transfer(struct xfer *x)
{
	size_t i;

	pthread_mutex_init(&x->lock, NULL);
	x->slot_size = stage_size();
	x->slice_delay_us = (useconds_t)(env_u64("GPUCR_FI_SLICE_DELAY_MS", 0) * 1000);
	x->t0 = x->last_report = now_ns();
	for (i = 0; i < x->nruns; i++)
		x->total += x->runs[i].len;
	if ((x->hooks || x->record) && x->chunk) {
		/* Slices of whole chunks, each checked (or recorded) once in staging. */
		x->slot_size -= x->slot_size % x->chunk;
		if (x->slot_size < x->chunk)
			x->slot_size = x->chunk;
	}
	if (!x->hooks && use_uring(x))
		xfer_uring(x);
	else
		xfer_parallel(x);
	pthread_mutex_destroy(&x->lock);
	return x->err;
}

static int add_run(struct run **runs, size_t *n, size_t *cap, struct rbuf *b, uint64_t dev_off,
		   unsigned file, uint64_t file_off, uint64_t len)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct run *nr = realloc(*runs, nc * sizeof(*nr));

		if (!nr)
			return -ENOMEM;
		*runs = nr;
		*cap = nc;
	}
	(*runs)[(*n)++] = (struct run){ b, dev_off, file_off, len, file, NULL, 0, 0, NULL };
	return 0;
}

/* Whether [dev_off, dev_off + len) of b, at file_off in file, continues the
 * last of runs, which is still shorter than max bytes: it is then added to
 * that run. */
static bool run_extend(struct run *runs, size_t nruns, const struct rbuf *b, uint64_t dev_off, unsigned file,
		       uint64_t file_off, uint64_t len, uint64_t max)
{
	struct run *last = nruns ? &runs[nruns - 1] : NULL;

	if (!last || last->b != b || last->file != file || last->dev_off + last->len != dev_off ||
	    last->file_off + last->len != file_off || last->len >= max)
		return false;
	last->len += len;
	return true;
}

static int cmp_rbuf(const void *a, const void *b)
{
	const struct rbuf *x = *(struct rbuf *const *)a, *y = *(struct rbuf *const *)b;
	uint64_t vx = x->va + x->phys_offset, vy = y->va + y->phys_offset;

	return vx < vy ? -1 : vx > vy;
}

/* x writes w's pages files: their descriptors, and O_DIRECT ones where the
 * filesystem takes them (close_direct() closes those). */
static void open_pages(struct xfer *x, struct img_writer *w)
{
	unsigned i;

	x->nfiles = img_writer_files(w);
	for (i = 0; i < x->nfiles; i++) {
		x->fds[i] = img_writer_pages_fd_n(w, i);
		x->dfds[i] = img_writer_open_pages_direct_n(w, i);
	}
}

static void close_direct(struct xfer *x)
{
	unsigned k;

	for (k = 0; k < x->nfiles; k++)
		if (x->dfds[k] >= 0) {
			close(x->dfds[k]);
			x->dfds[k] = -1;
		}
}

/* ---- write -------------------------------------------------------------- */

/* A concurrent write: the stored runs copied device -> device into spare
 * GPU memory right after T (2 TB/s on an H200, against ~14 GB/s to tmpfs),
 * checked against the fingerprints at T on the GPU, and every run marked
 * saved, so the running process waits for nothing; the image is then
 * written from the copies. Only where the GPUs have the room (their free
 * memory less GPUCR_SPARE_MARGIN_MB, default 4096, must hold the copy);
 * otherwise the chunks are saved straight to the image, the process's
 * calls waiting for those they write. spare[] gets one allocation per run
 * (released by the caller); returns 1 if made, 0 if not, < 0 on a mismatch. */
static int spare_snapshot(struct xfer *x, struct run *runs, size_t nruns, struct gpu_mem *spare, char *msg,
			  size_t msglen)
{
	const struct cudrv *drv = gpu_drv();
	uint64_t margin = env_u64("GPUCR_SPARE_MARGIN_MB", 4096) << 20, need = 0, t0 = now_ns();
	size_t i, made = 0;
	int r = 0;

	if (!env_u64("GPUCR_SPARE", 1) || !nruns)
		return 0;
	for (i = 0; i < nruns; i++)
		need += runs[i].len;
	for (i = 0; i < nruns; i++) {
		size_t fr = 0, tot = 0;

		/* Room on this run's device (the devices of all runs, crudely: each
		 * must hold everything). */
		if (i && runs[i].b->mem.dev == runs[i - 1].b->mem.dev)
			continue;
		if (gpu_use(runs[i].b->mem.dev) < 0 || drv->cuMemGetInfo(&fr, &tot) != CUDA_SUCCESS ||
		    fr < need + margin)
			return 0;
	}
	for (i = 0; i < nruns && !r; i++) {
		struct run *rn = &runs[i];
		CUstream st = rn->b->mem.dev->streams[i % GPU_STREAMS];

		r = gpu_mem_create(rn->b->mem.dev, rn->len, &spare[i]);
		if (r < 0)
			break;
		made++;
		r = gpucr_err_from_cu(drv->cuMemcpyDtoDAsync(spare[i].va, rn->b->mem.va + rn->dev_off, rn->len, st));
	}
	for (i = 0; i < made && !r; i++)
		if (!i || runs[i].b->mem.dev != runs[i - 1].b->mem.dev) {
			r = gpu_use(runs[i].b->mem.dev);
			if (!r)
				r = gpucr_err_from_cu(drv->cuCtxSynchronize());
		}
	if (r < 0) {
		/* No room after all (or a failed copy): straight to the image. */
		pr_debug("pid %d: no spare GPU memory for a copy at T: %s", (int)x->pid, gpucr_strerror(r));
		for (i = 0; i < made; i++)
			gpu_mem_release(&spare[i]);
		memset(spare, 0, nruns * sizeof(*spare));
		return 0;
	}
	/* The copies must be the memory at T: a write between T and the copy
	 * that no call announced shows here. */
	for (i = 0; i < nruns; i++) {
		struct run *rn = &runs[i];
		uint64_t n = (rn->len + x->chunk - 1) / x->chunk, c, *fp = calloc(n, sizeof(*fp));
		uint8_t *nz = calloc(n, 1);

		if (!fp || !nz) {
			free(fp);
			free(nz);
			snprintf(msg, msglen, "out of memory");
			return -ENOMEM;
		}
		r = gpu_fingerprint(rn->b->mem.dev, spare[i].va, rn->len, x->chunk, fp, nz);
		for (c = 0; c < n && !r; c++)
			if (fp[c] != rn->chunks[c].fingerprint)
				r = escape_msg(msg, msglen, rn, rn->chunks[c].offset);
		free(fp);
		free(nz);
		if (r < 0)
			return r;
		rn->src = spare[i].va;
		rn->chunks = NULL; /* checked: the copy does not change */
		if (x->hooks->saved)
			x->hooks->saved(x->hooks->data, run_va(rn, 0), rn->len);
	}
	pr_debug("pid %d: spare copy done: %.1f GiB copied on the GPU and checked in %.1f ms", (int)x->pid,
		 need / 1073741824.0, (now_ns() - t0) / 1e6);
	pr_info("pid %d: %.1f GiB copied to spare GPU memory at T; the process waits for nothing", (int)x->pid,
		need / 1073741824.0);
	return 1;
}

/* ---- pre-copy ------------------------------------------------------------ */

/* How many pages files an image in dirfd gets. On tmpfs, one per writer
 * thread: writers of one file serialise on it (16 GiB from 16 threads on
 * the H200 host: 4.4 GB/s into one file, 27.5 GB/s into 16). */
static uint32_t pages_files_for(int dirfd)
{
	uint64_t n = env_u64("GPUCR_PAGES_FILES", is_tmpfs(dirfd) ? (uint64_t)nthreads() : 1);

	return n < 1 ? 1 : n > IMG_MAX_PAGES_FILES ? IMG_MAX_PAGES_FILES : (uint32_t)n;
}

/* Sizes the pages files to their reservations; on a disk the blocks are
 * taken up front, so that a full disk says so before a byte is copied and
 * O_DIRECT writes do not allocate. */
static int size_pages(struct img_writer *w, char *msg, size_t msglen)
{
	unsigned i;

	for (i = 0; i < img_writer_files(w); i++) {
		uint64_t size = img_writer_reserve_in(w, i, 0);
		int fd = img_writer_pages_fd_n(w, i);

		if (ftruncate(fd, (off_t)size) < 0) {
			snprintf(msg, msglen, "sizing the image's data file (%" PRIu64 " bytes): %s", size,
				 strerror(errno));
			return -errno;
		}
		if (size && !is_tmpfs(fd) && fallocate(fd, 0, 0, (off_t)size) < 0 && errno != EOPNOTSUPP) {
			int err = -errno;

			snprintf(msg, msglen, "the image needs %" PRIu64 " MiB for its GPU data: %s%s", size >> 20,
				 strerror(errno),
				 errno == ENOSPC ? " (the image's file system is full; no image was left behind)" : "");
			return err;
		}
	}
	return 0;
}

int imgio_precopy_open(struct pc_image *pc, pid_t pid, char *msg, size_t msglen)
{
	Gpucr__ImageHeader hdr = GPUCR__IMAGE_HEADER__INIT;
	struct img_errbuf eb;
	uint64_t total = 0, piece, k = 0;
	size_t i;
	int r;

	pc->chunk = chunk_size();
	/* A placeholder: the header is written again at T (img_writer_reheader). */
	hdr.has_pages_files = 1;
	hdr.pages_files = pages_files_for(pc->dirfd);
	r = img_writer_open(pc->dirfd, (uint32_t)pid, &hdr, &pc->w, &eb);
	if (r < 0) {
		snprintf(msg, msglen, "%s", eb.msg);
		return r;
	}
	for (i = 0; i < pc->nbufs; i++)
		total += pc->bufs[i].rb.phys_size;
	piece = run_piece(total, pc->chunk);
	pc->piece = piece;
	/* Pieces of every buffer, the pages files taking them in turn. */
	for (i = 0; i < pc->nbufs; i++) {
		struct pc_buf *pb = &pc->bufs[i];
		uint64_t c, size = pb->rb.phys_size;

		pb->nchunks = (size + pc->chunk - 1) / pc->chunk;
		pb->ch = calloc(pb->nchunks ? pb->nchunks : 1, sizeof(*pb->ch));
		if (!pb->ch) {
			snprintf(msg, msglen, "out of memory");
			return -ENOMEM;
		}
		for (c = 0; c < pb->nchunks;) {
			uint64_t at = c * pc->chunk, len = size - at < piece ? size - at : piece, off, e;
			unsigned file = (unsigned)(k++ % img_writer_files(pc->w));

			off = img_writer_reserve_in(pc->w, file, len);
			for (e = c + (len + pc->chunk - 1) / pc->chunk; c < e; c++) {
				pb->ch[c].file = file;
				pb->ch[c].file_off = off + (c * pc->chunk - at);
			}
		}
	}
	return size_pages(pc->w, msg, msglen);
}

int imgio_precopy_round(struct pc_image *pc, pid_t pid, int store, uint64_t *ret_dirty, uint64_t *ret_written,
			char *msg, size_t msglen)
{
	struct run *runs = NULL;
	size_t nruns = 0, caprun = 0, i;
	uint64_t dirty = 0, *fp = NULL, maxn = 0;
	uint8_t *nz = NULL;
	struct xfer x = { .nfiles = 0 };
	int r = 0;

	for (i = 0; i < pc->nbufs; i++)
		if (pc->bufs[i].nchunks > maxn)
			maxn = pc->bufs[i].nchunks;
	fp = calloc(maxn + 1, sizeof(*fp));
	nz = calloc(maxn + 1, 1);
	if (!fp || !nz) {
		snprintf(msg, msglen, "out of memory");
		r = -ENOMEM;
		goto out;
	}
	for (i = 0; i < pc->nbufs && !r; i++) {
		struct pc_buf *pb = &pc->bufs[i];
		uint64_t c;

		if (!pb->rb.mem.va)
			continue; /* not imported: written in full at T */
		r = gpu_fingerprint(pb->rb.mem.dev, pb->rb.mem.va, pb->rb.phys_size, pc->chunk, fp, nz);
		if (r < 0) {
			snprintf(msg, msglen, "buffer 0x%" PRIx64 ": fingerprints: %s", pb->rb.va, gpucr_strerror(r));
			break;
		}
		for (c = 0; c < pb->nchunks && !r; c++) {
			struct pc_chunk *ch = &pb->ch[c];
			uint64_t len = pb->rb.phys_size - c * pc->chunk < pc->chunk ? pb->rb.phys_size - c * pc->chunk :
										      pc->chunk;

			/* All zero: recorded as zero at T, whatever was stored. */
			if (!nz[c] || (ch->stored && ch->fp == fp[c]))
				continue;
			dirty += len;
			if (!store || run_extend(runs, nruns, &pb->rb, c * pc->chunk, ch->file, ch->file_off, len, pc->piece))
				continue;
			r = add_run(&runs, &nruns, &caprun, &pb->rb, c * pc->chunk, ch->file, ch->file_off, len);
			if (!r)
				runs[nruns - 1].rec = ch;
		}
	}
	if (r < 0 || !store || !nruns)
		goto out;
	memset(&x, 0, sizeof(x));
	open_pages(&x, pc->w);
	x.write = 1;
	x.record = 1;
	x.pid = pid;
	x.chunk = pc->chunk;
	x.what = "pre-copy";
	x.runs = runs;
	x.nruns = nruns;
	x.msg = msg;
	x.msglen = msglen;
	r = transfer(&x);
	if (!r && ret_written)
		*ret_written = x.total;
out:
	close_direct(&x);
	free(runs);
	free(fp);
	free(nz);
	if (!r && ret_dirty)
		*ret_dirty = dirty;
	return r;
}

void imgio_precopy_free(struct pc_image *pc)
{
	size_t i;

	if (!pc)
		return;
	img_writer_abort(pc->w);
	pc->w = NULL;
	for (i = 0; i < pc->nbufs; i++) {
		rbuf_release(&pc->bufs[i].rb);
		free(pc->bufs[i].ch);
	}
	free(pc->bufs);
	pc->bufs = NULL;
	pc->nbufs = 0;
	if (pc->dirfd >= 0)
		close(pc->dirfd);
	pc->dirfd = -1;
}

/* A chunk the pre-copy stored whose fingerprint at T is that of the bytes
 * it recorded: read back from the pages file and checked before it is
 * kept, since the file is what the image will hold (a damaged or
 * overwritten file must not make a complete-looking image). */
struct keep {
	struct rbuf *b;
	Gpucr__Chunk *ch;
	int fd;
	int bad;
};

struct keep_check {
	struct keep *v;
	size_t n, next;
	uint64_t chunk;
	pthread_mutex_t lock;
};

static void *keep_main(void *arg)
{
	struct keep_check *kc = arg;
	void *buf = malloc(kc->chunk);

	for (;;) {
		struct keep *k;

		pthread_mutex_lock(&kc->lock);
		k = kc->next < kc->n ? &kc->v[kc->next++] : NULL;
		pthread_mutex_unlock(&kc->lock);
		if (!k)
			break;
		/* Unreadable counts as damaged: the chunk is written again. */
		k->bad = !buf || img_read_full(k->fd, k->ch->data_offset, buf, k->ch->length) < 0 ||
			 fp_chunk(buf, k->ch->length, 0) != k->ch->fingerprint;
	}
	free(buf);
	return NULL;
}

static void keep_check(struct keep *v, size_t n, uint64_t chunk)
{
	struct keep_check kc = { .v = v, .n = n, .chunk = chunk };
	pthread_t th[MAX_THREADS];
	int nt = nthreads(), i, started = 0;

	if (!n)
		return;
	pthread_mutex_init(&kc.lock, NULL);
	if ((size_t)nt > n)
		nt = (int)n;
	for (i = 0; i < nt; i++)
		if (pthread_create(&th[i], NULL, keep_main, &kc) == 0)
			started++;
	if (!started)
		keep_main(&kc);
	for (i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&kc.lock);
}

static int keep_push(struct keep **v, size_t *n, size_t *cap, struct rbuf *b, Gpucr__Chunk *ch, int fd)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		struct keep *nv = realloc(*v, nc * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		*v = nv;
		*cap = nc;
	}
	(*v)[(*n)++] = (struct keep){ b, ch, fd, 0 };
	return 0;
}

/* The pre-copied buffer at the same address and size as b, or NULL. */
static struct pc_buf *pc_find(struct pc_image *pc, const struct rbuf *b)
{
	uint64_t va = b->va + b->phys_offset;
	size_t lo = 0, hi = pc ? pc->nbufs : 0, mid;
	struct pc_buf *pb;

	while (lo < hi) { /* pc->bufs is sorted by va */
		mid = lo + (hi - lo) / 2;
		if (pc->bufs[mid].rb.va < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!pc || lo == pc->nbufs)
		return NULL;
	pb = &pc->bufs[lo];
	return pb->rb.va == va && pb->rb.phys_size == b->phys_size && pb->rb.device == b->device && pb->ch ? pb : NULL;
}

struct bufrec {
	Gpucr__Buffer rec;
	Gpucr__Chunk *chunks;
	Gpucr__Chunk **cp;
};

int imgio_write(struct proc *p, int dirfd, struct img_stats *st, char *msg, size_t msglen)
{
	const struct cudrv *drv = gpu_drv();
	Gpucr__ImageHeader hdr = GPUCR__IMAGE_HEADER__INIT;
	Gpucr__Device devrec[GPU_MAX_DEVICES], *devp[GPU_MAX_DEVICES];
	Gpucr__ImageTrailer tr = GPUCR__IMAGE_TRAILER__INIT;
	uint64_t chunk = chunk_size(), t0 = now_ns(), piece = 0, t_data;
	struct gpu_mem *spare = NULL;
	struct pc_image *pc;
	struct pc_buf *pb;
	struct keep *keeps = NULL;
	size_t nkeeps = 0, capkeeps = 0;
	struct img_writer *w = NULL;
	struct rbuf **bufs = NULL, *b;
	struct bufrec *recs = NULL;
	struct run *runs = NULL;
	size_t nb = 0, i, ndev = 0, nruns = 0, caprun = 0;
	struct img_errbuf eb;
	struct xfer x = { .nfiles = 0 };
	int r = 0, made = 0;
	char writer[64];
	struct timespec rt;

	{
		uint64_t *pd = st->progress_done, *pt = st->progress_total;
		const struct img_hooks *hk = st->hooks;
		void (*bd)(void *, int) = st->before_data;
		void *bda = st->before_data_arg;
		struct pc_image *pcs = st->precopy;

		memset(st, 0, sizeof(*st));
		st->progress_done = pd;
		st->progress_total = pt;
		st->hooks = hk;
		st->before_data = bd;
		st->before_data_arg = bda;
		st->precopy = pcs;
	}
	pc = st->precopy;
	if (pc && (!pc->w || pc->chunk != chunk)) {
		pr_info("pid %d: its pre-copy was made with %" PRIu64 " KiB chunks, the dump uses %" PRIu64
			" KiB: writing everything",
			(int)p->pid, pc->chunk >> 10, chunk >> 10);
		pc = NULL;
	}
	bufs = calloc(p->nbufs ? p->nbufs : 1, sizeof(*bufs));
	recs = calloc(p->nbufs ? p->nbufs : 1, sizeof(*recs));
	if (!bufs || !recs) {
		snprintf(msg, msglen, "out of memory");
		r = -ENOMEM;
		goto out;
	}
	for (b = p->bufs; b; b = b->next)
		bufs[nb++] = b;
	qsort(bufs, nb, sizeof(*bufs), cmp_rbuf);

	/* Devices the buffers are on, by the application's ordinals. */
	for (i = 0; i < nb; i++) {
		size_t k;

		for (k = 0; k < ndev; k++)
			if (devrec[k].ordinal == bufs[i]->device)
				break;
		if (k < ndev || ndev == GPU_MAX_DEVICES)
			continue;
		gpucr__device__init(&devrec[ndev]);
		devrec[ndev].ordinal = bufs[i]->device;
		devrec[ndev].uuid.data = bufs[i]->uuid;
		devrec[ndev].uuid.len = 16;
		if (bufs[i]->mem.dev) {
			devrec[ndev].name = bufs[i]->mem.dev->name;
			devrec[ndev].has_total_mem = 1;
			devrec[ndev].total_mem = bufs[i]->mem.dev->total_mem;
		}
		devp[ndev] = &devrec[ndev];
		ndev++;
	}
	clock_gettime(CLOCK_REALTIME, &rt);
	snprintf(writer, sizeof(writer), "gpucr %s", GPUCR_VERSION);
	hdr.comm = p->comm;
	hdr.has_chunk_size = 1;
	hdr.chunk_size = chunk;
	hdr.has_fp_kind = 1;
	hdr.fp_kind = GPUCR__FINGERPRINT_KIND__FP_MIX64_SUM_V1;
	hdr.has_created_unix_ns = 1;
	hdr.created_unix_ns = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
	hdr.n_devices = ndev;
	hdr.devices = devp;
	hdr.writer = writer;
	hdr.has_driver_version = drv != NULL;
	hdr.driver_version = drv ? (uint32_t)drv->version : 0;
	hdr.has_uid = 1;
	hdr.uid = p->uid;
	hdr.has_escaped = p->escaped != 0;
	hdr.escaped = p->escaped != 0;
	hdr.has_control_tid = p->control_tid != 0;
	hdr.control_tid = (uint32_t)p->control_tid;
	hdr.has_pages_files = 1;
	hdr.pages_files = pages_files_for(dirfd);

	if (pc) {
		/* The pre-copy's pages files become the image's. */
		w = pc->w;
		pc->w = NULL;
		r = img_writer_reheader(w, &hdr, &eb);
	} else {
		r = img_writer_open(dirfd, (uint32_t)p->pid, &hdr, &w, &eb);
	}
	if (r < 0) {
		snprintf(msg, msglen, "%s", eb.msg);
		goto out;
	}

	/* Fingerprints first (at HBM speed), then where every stored run goes. */
	for (i = 0; i < nb; i++)
		piece += bufs[i]->phys_size;
	piece = run_piece(piece, chunk);
	for (i = 0; i < nb && !r; i++) {
		struct bufrec *br = &recs[i];
		uint64_t n, c, *fp = NULL;
		uint8_t *nz = NULL;

		b = bufs[i];
		if (!b->mem.dev || !b->mem.va) {
			r = -EINVAL;
			snprintf(msg, msglen, "buffer 0x%" PRIx64 " was never taken over", b->va);
			break;
		}
		n = (b->phys_size + chunk - 1) / chunk;
		fp = calloc(n, sizeof(*fp));
		nz = calloc(n, 1);
		br->chunks = calloc(n, sizeof(*br->chunks));
		br->cp = calloc(n, sizeof(*br->cp));
		if (!fp || !nz || !br->chunks || !br->cp) {
			free(fp);
			free(nz);
			r = -ENOMEM;
			snprintf(msg, msglen, "out of memory");
			break;
		}
		r = gpu_fingerprint(b->mem.dev, b->mem.va, b->phys_size, chunk, fp, nz);
		if (r < 0)
			snprintf(msg, msglen, "buffer 0x%" PRIx64 ": fingerprints: %s", b->va, gpucr_strerror(r));
		for (c = 0; c < n && !r; c++) {
			Gpucr__Chunk *ch = &br->chunks[c];

			gpucr__chunk__init(ch);
			ch->offset = c * chunk;
			ch->length = b->phys_size - ch->offset < chunk ? b->phys_size - ch->offset : chunk;
			ch->fingerprint = fp[c];
			if (!nz[c])
				ch->has_zero = ch->zero = 1;
			br->cp[c] = ch;
		}
		pb = pc_find(pc, b);
		if (pc && !pb)
			pr_info("pid %d: buffer 0x%" PRIx64 " (%" PRIu64 " MiB) was not pre-copied (allocated since, "
				"or its layout changed): written in full",
				(int)p->pid, b->va + b->phys_offset, b->phys_size >> 20);
		/* All zero at T: nothing to save. */
		for (c = 0; !r && c < n && st->hooks && st->hooks->saved; c++)
			if (!nz[c])
				st->hooks->saved(st->hooks->data, b->va + b->phys_offset + br->chunks[c].offset,
						 br->chunks[c].length);
		/* Pre-copied: each chunk has its place; what the pre-copy stored
		 * there may be kept (checked below), the rest is written there. */
		for (c = 0; pb && c < n && !r; c++) {
			const struct pc_chunk *pcc = &pb->ch[c];

			if (!nz[c])
				continue;
			br->chunks[c].has_data_offset = 1;
			br->chunks[c].data_offset = pcc->file_off;
			br->chunks[c].has_file = pcc->file != 0;
			br->chunks[c].file = pcc->file;
			st->stored += br->chunks[c].length;
			if (pcc->stored && pcc->fp == fp[c]) {
				r = keep_push(&keeps, &nkeeps, &capkeeps, b, &br->chunks[c], img_writer_pages_fd_n(w, pcc->file));
				continue;
			}
			if (run_extend(runs, nruns, b, br->chunks[c].offset, pcc->file, pcc->file_off,
				       br->chunks[c].length, piece))
				continue;
			r = add_run(&runs, &nruns, &caprun, b, br->chunks[c].offset, pcc->file, pcc->file_off,
				    br->chunks[c].length);
			if (!r && st->hooks)
				runs[nruns - 1].chunks = &br->chunks[c];
		}
		/* Runs of stored chunks, at most a piece long, one reservation
		 * each, the pages files taking them in turn. */
		for (c = 0; !pb && c < n && !r;) {
			uint64_t first = c, len = 0, off, k;

			if (!nz[c]) {
				c++;
				continue;
			}
			while (c < n && nz[c] && len < piece) {
				len += br->chunks[c].length;
				c++;
			}
			unsigned file = (unsigned)(nruns % img_writer_files(w));

			off = img_writer_reserve_in(w, file, len);
			for (k = first; k < c; k++) {
				br->chunks[k].has_data_offset = 1;
				br->chunks[k].data_offset = off + (br->chunks[k].offset - br->chunks[first].offset);
			}
			for (k = first; k < c; k++) {
				br->chunks[k].has_file = file != 0;
				br->chunks[k].file = file;
			}
			r = add_run(&runs, &nruns, &caprun, b, br->chunks[first].offset, file, off, len);
			if (!r && st->hooks)
				runs[nruns - 1].chunks = &br->chunks[first];
			st->stored += len;
		}
		gpucr__buffer__init(&br->rec);
		br->rec.va = b->va + b->phys_offset;
		br->rec.size = b->phys_size;
		br->rec.device = b->device;
		br->rec.has_kind = b->kind != 0;
		br->rec.kind = (Gpucr__BufferKind)b->kind;
		br->rec.has_phys_size = 1;
		br->rec.phys_size = b->phys_size;
		br->rec.n_chunks = n;
		br->rec.chunks = br->cp;
		st->bytes += b->phys_size;
		free(fp);
		free(nz);
	}
	if (r < 0)
		goto out;
	if (pc) {
		/* What the pre-copy stored and still matches is read back and
		 * checked; a chunk that does not match the file is written. */
		uint64_t tk = now_ns();
		size_t bad = 0;

		if (env_u64("GPUCR_PRECOPY_VERIFY", 1))
			keep_check(keeps, nkeeps, chunk);
		for (i = 0; i < nkeeps && !r; i++) {
			struct keep *k = &keeps[i];

			if (!k->bad) {
				st->reused_bytes += k->ch->length;
				if (st->hooks && st->hooks->saved)
					st->hooks->saved(st->hooks->data, k->b->va + k->b->phys_offset + k->ch->offset,
							 k->ch->length);
				continue;
			}
			if (bad++ < 8)
				pr_warn("pid %d: buffer 0x%" PRIx64 ": the pre-copied chunk at offset %" PRIu64
					" does not read back as stored (the pages file was damaged?): written again",
					(int)p->pid, k->b->va + k->b->phys_offset, k->ch->offset);
			r = add_run(&runs, &nruns, &caprun, k->b, k->ch->offset, k->ch->has_file ? k->ch->file : 0,
				    k->ch->data_offset, k->ch->length);
			if (!r && st->hooks)
				runs[nruns - 1].chunks = k->ch;
		}
		if (r < 0) {
			snprintf(msg, msglen, "out of memory");
			goto out;
		}
		for (i = 0; i < nruns; i++)
			st->final_bytes += runs[i].len;
		st->pre_copied = 1;
		pr_info("pid %d: from its pre-copy: %" PRIu64 " MiB kept (read back and checked in %.1f ms), %" PRIu64
			" MiB to write (%zu chunk(s) damaged in the file)",
			(int)p->pid, st->reused_bytes >> 20, (now_ns() - tk) / 1e6, st->final_bytes >> 20, bad);
	}

	pr_debug("pid %d: fingerprints at T done: %zu buffers, %" PRIu64 " MiB, %" PRIu64 " MiB to store, in %.1f ms",
		 (int)p->pid, nb, st->bytes >> 20, st->stored >> 20, (now_ns() - t0) / 1e6);
	if (st->hooks && st->hooks->fingerprinted)
		st->hooks->fingerprinted(st->hooks->data);
	if (st->progress_total)
		__atomic_store_n(st->progress_total, pc ? st->final_bytes : st->stored, __ATOMIC_RELAXED);

	/* The data. */
	memset(&x, 0, sizeof(x));
	r = size_pages(w, msg, msglen);
	if (r < 0)
		goto out;
	open_pages(&x, w);
	x.write = 1;
	x.pid = p->pid;
	x.hooks = st->hooks;
	x.chunk = chunk;
	x.what = "writing the GPU image";
	x.progress = st->progress_done;
	x.runs = runs;
	x.nruns = nruns;
	x.msg = msg;
	x.msglen = msglen;
	if (x.hooks) {
		spare = calloc(nruns ? nruns : 1, sizeof(*spare));
		if (spare) {
			r = spare_snapshot(&x, runs, nruns, spare, msg, msglen);
			if (r < 0)
				goto out;
			made = r;
			r = 0;
		}
		if (x.hooks->copied)
			x.hooks->copied(x.hooks->data, made);
	}
	if (st->before_data) {
		/* Not counted in elapsed_ns: its rate is the write's alone. */
		uint64_t th = now_ns();

		st->before_data(st->before_data_arg, made);
		st->held_ns = now_ns() - th;
	}
	/* Fault injection for tests: a slow image write (after the state at T
	 * is taken: fingerprints, and a copy on the GPU where one is made). */
	if (env_u64("GPUCR_FI_IMAGE_DELAY_MS", 0))
		usleep((useconds_t)(env_u64("GPUCR_FI_IMAGE_DELAY_MS", 0) * 1000));
	t_data = now_ns();
	pr_debug("pid %d: D2H write started: %" PRIu64 " MiB in %zu runs%s, %s engine", (int)p->pid, st->stored >> 20,
		 nruns, made ? " from the spare copy" : "", !x.hooks && use_uring(&x) ? "io_uring" : "parallel");
	r = transfer(&x);
	if (r < 0)
		goto out;

	for (i = 0; i < nb && !r; i++) {
		r = img_writer_add_buffer(w, &recs[i].rec, &eb);
		if (r < 0)
			snprintf(msg, msglen, "%s", eb.msg);
	}
	if (r < 0)
		goto out;
	st->elapsed_ns = now_ns() - t0 - st->held_ns;
	tr.has_stored_bytes = 1;
	tr.stored_bytes = st->stored;
	tr.has_total_bytes = 1;
	tr.total_bytes = st->bytes;
	tr.has_elapsed_ns = 1;
	tr.elapsed_ns = st->elapsed_ns;
	close_direct(&x);
	r = img_writer_commit(w, &tr, &eb);
	w = NULL;
	if (r < 0)
		snprintf(msg, msglen, "%s", eb.msg);
	st->elapsed_ns = now_ns() - t0 - st->held_ns;
	if (!r)
		pr_debug("pid %d: write finished: %" PRIu64 " MiB in %.1f ms (%.1f GB/s), image committed", (int)p->pid,
			 st->stored >> 20, (now_ns() - t_data) / 1e6,
			 now_ns() > t_data ? st->stored / ((now_ns() - t_data) / 1e9) / 1e9 : 0.0);
out:
	for (i = 0; spare && i < nruns; i++)
		if (spare[i].va)
			gpu_mem_release(&spare[i]);
	free(spare);
	close_direct(&x);
	img_writer_abort(w);
	for (i = 0; recs && i < nb; i++) {
		free(recs[i].chunks);
		free(recs[i].cp);
	}
	free(recs);
	free(runs);
	free(keeps);
	free(bufs);
	return r;
}

/* ---- read --------------------------------------------------------------- */

static struct gpu_dev *pick_device(const Gpucr__ImageHeader *h, uint32_t ordinal, char *msg, size_t msglen)
{
	struct gpu_dev *dev = NULL;
	size_t i;

	for (i = 0; i < h->n_devices; i++)
		if (h->devices[i]->ordinal == ordinal && h->devices[i]->uuid.len == 16)
			dev = gpu_dev_by_uuid(h->devices[i]->uuid.data);
	if (dev)
		return dev;
	/* Another host (or another GPU): same ordinal, if there is one. */
	dev = gpu_dev_by_ordinal((int)ordinal);
	if (!dev)
		snprintf(msg, msglen, "the image needs device %u, and this host has %d GPU(s)", ordinal, gpu_count());
	return dev;
}

int imgio_read(pid_t pid, int dirfd, struct rbuf **ret_bufs, struct img_stats *st, char *msg,
	       size_t msglen)
{
	const struct cudrv *drv;
	struct gpucr_image *img = NULL;
	struct rbuf *head = NULL, *b, **bv = NULL;
	struct run *runs = NULL;
	size_t nruns = 0, caprun = 0, i;
	struct img_errbuf eb;
	uint64_t t0 = now_ns(), piece = 0;
	struct xfer x = { .nfiles = 0 };
	int r;
	char gmsg[512], pname[64];

	memset(st, 0, sizeof(*st));
	r = gpu_init(gmsg, sizeof(gmsg));
	if (r < 0) {
		snprintf(msg, msglen, "no GPU access in gpucrd: %.400s", gmsg);
		return r;
	}
	drv = gpu_drv();
	r = img_read(dirfd, (uint32_t)pid, &img, &eb);
	if (r < 0) {
		snprintf(msg, msglen, "%s", eb.msg);
		return r;
	}
	st->control_tid = img->hdr->has_control_tid ? img->hdr->control_tid : 0;
	st->escaped = img->hdr->has_escaped && img->hdr->escaped;
	st->uid = img->hdr->has_uid ? img->hdr->uid : 0;
	snprintf(st->comm, sizeof(st->comm), "%s", img->hdr->comm ? img->hdr->comm : "");
	bv = calloc(img->nbuffers + 1, sizeof(*bv));
	if (!bv) {
		r = -ENOMEM;
		snprintf(msg, msglen, "out of memory");
		goto out;
	}

	for (i = 0; i < img->nbuffers; i++)
		piece += img->buffers[i]->size;
	piece = run_piece(piece, img->hdr->has_chunk_size && img->hdr->chunk_size ? img->hdr->chunk_size : IMG_ALIGN);

	/* New GPU memory for every buffer first: a restore that cannot fit
	 * fails before reading anything. */
	for (i = 0; i < img->nbuffers; i++) {
		const Gpucr__Buffer *ib = img->buffers[i];
		struct gpu_dev *dev = pick_device(img->hdr, ib->device, msg, msglen);
		size_t k, c;

		if (!dev) {
			r = -ENODEV;
			goto out;
		}
		b = calloc(1, sizeof(*b));
		if (!b) {
			r = -ENOMEM;
			snprintf(msg, msglen, "out of memory");
			goto out;
		}
		b->fd = -1;
		b->mem.fd = -1;
		b->next = head;
		head = b;
		bv[i] = b;
		b->va = ib->va;
		b->size = ib->size;
		b->phys_size = ib->size;
		b->device = ib->device;
		b->kind = ib->has_kind ? (int)ib->kind : 0;
		for (k = 0; k < img->hdr->n_devices; k++)
			if (img->hdr->devices[k]->ordinal == ib->device && img->hdr->devices[k]->uuid.len == 16)
				memcpy(b->uuid, img->hdr->devices[k]->uuid.data, 16);
		r = gpu_mem_create(dev, ib->size, &b->mem);
		if (r < 0) {
			snprintf(msg, msglen, "buffer 0x%" PRIx64 " (%" PRIu64 " MiB): cannot allocate GPU memory: %s",
				 ib->va, ib->size >> 20, gpucr_strerror(r));
			goto out;
		}
		if (b->mem.size != ib->size) {
			r = -EINVAL;
			snprintf(msg, msglen,
				 "buffer 0x%" PRIx64 ": %" PRIu64 " bytes is not a multiple of this GPU's granularity",
				 ib->va, ib->size);
			goto out;
		}
		b->fd = b->mem.fd; /* handed to the process at remap */
		b->mem.fd = -1;
		/* Zero chunks are set on the GPU; stored runs are read. */
		for (c = 0; c < ib->n_chunks && !r;) {
			const Gpucr__Chunk *ch = ib->chunks[c];
			uint64_t len = 0, first = c;

			if (ch->has_zero && ch->zero) {
				r = gpu_use(dev);
				if (!r)
					r = gpucr_err_from_cu(drv->cuMemsetD8(b->mem.va + ch->offset, 0, ch->length));
				c++;
				continue;
			}
			while (c < ib->n_chunks && len < piece && !(ib->chunks[c]->has_zero && ib->chunks[c]->zero) &&
			       ib->chunks[c]->file == ib->chunks[first]->file &&
			       ib->chunks[c]->data_offset == ib->chunks[first]->data_offset + len &&
			       ib->chunks[c]->offset == ib->chunks[first]->offset + len) {
				len += ib->chunks[c]->length;
				c++;
			}
			r = add_run(&runs, &nruns, &caprun, b, ib->chunks[first]->offset, ib->chunks[first]->file,
				    ib->chunks[first]->data_offset, len);
			st->stored += len;
		}
		if (r < 0) {
			snprintf(msg, msglen, "buffer 0x%" PRIx64 ": %s", ib->va, gpucr_strerror(r));
			goto out;
		}
	}

	memset(&x, 0, sizeof(x));
	x.nfiles = img->npages;
	for (i = 0; i < img->npages; i++) {
		img_pages_name_n(pname, sizeof(pname), (uint32_t)pid, (unsigned)i);
		x.fds[i] = img->pages_fds[i];
		x.dfds[i] = openat(dirfd, pname, O_RDONLY | O_DIRECT | O_CLOEXEC);
	}
	x.write = 0;
	x.pid = pid;
	x.what = "loading the GPU image";
	x.runs = runs;
	x.nruns = nruns;
	x.msg = msg;
	x.msglen = msglen;
	r = transfer(&x);
	if (r < 0)
		goto out;

	/* Check what landed on the GPU against the image's fingerprints. */
	for (i = 0; i < img->nbuffers && !r; i++) {
		const Gpucr__Buffer *ib = img->buffers[i];
		uint64_t chunk = img->hdr->has_chunk_size ? img->hdr->chunk_size : 0, *fp;
		uint8_t *nz;
		size_t c;

		b = bv[i];
		if (!chunk || ib->n_chunks == 0)
			continue;
		fp = calloc(ib->n_chunks + 1, sizeof(*fp));
		nz = calloc(ib->n_chunks + 1, 1);
		if (!fp || !nz) {
			free(fp);
			free(nz);
			r = -ENOMEM;
			snprintf(msg, msglen, "out of memory");
			break;
		}
		r = gpu_fingerprint(b->mem.dev, b->mem.va, ib->size, chunk, fp, nz);
		if (r < 0)
			snprintf(msg, msglen, "fingerprints after loading: %s", gpucr_strerror(r));
		for (c = 0; c < ib->n_chunks && !r; c++)
			if (fp[c] != ib->chunks[c]->fingerprint) {
				r = -EBADMSG;
				snprintf(msg, msglen,
					 "pid %d: buffer 0x%" PRIx64 " (%" PRIu64
					 " bytes): fingerprint mismatch in chunk %zu (offset %" PRIu64
					 "): the image is damaged; restore refused",
					 (int)pid, ib->va, ib->size, c, ib->chunks[c]->offset);
			}
		free(fp);
		free(nz);
	}
	if (r < 0)
		goto out;
	for (b = head; b; b = b->next)
		st->bytes += b->phys_size;
	st->elapsed_ns = now_ns() - t0;
	*ret_bufs = head;
	head = NULL;
out:
	while ((b = head)) {
		head = b->next;
		rbuf_free(b);
	}
	close_direct(&x);
	free(runs);
	free(bv);
	img_free(img);
	return r;
}
