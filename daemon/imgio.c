/* Owns moving GPU memory to and from image files: fingerprints on the
 * device, pinned staging buffers (never pageable memory: 1 GB/s measured
 * against 55 GB/s pinned), device<->host copies on several streams
 * overlapped with io_uring reads and writes (O_DIRECT where the file system
 * takes it; tmpfs does not), all-zero chunks recorded but not stored.
 * Runs on a worker thread. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "fingerprint.h"
#include "gpucrd.h"
#include "image.h"
#include "log.h"

#define NSLOTS 4

struct slot {
	void *buf;
	int busy;
	uint64_t len;       /* bytes of data in it */
	uint64_t dev_off;   /* restore: where it goes in the buffer */
	struct rbuf *b;     /* restore: which buffer */
};

struct pipe {
	struct io_uring ring;
	int ring_ok;
	struct slot slots[NSLOTS];
	size_t slot_size;
	int inflight;
	int err;
	char *msg;
	size_t msglen;
	uint64_t done_bytes, total_bytes;
	uint64_t t0, last_report;
	pid_t pid;
	const char *what;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t chunk_size(void)
{
	const char *s = getenv("GPUCR_CHUNK_KB");
	uint64_t kb = s ? strtoull(s, NULL, 10) : 2048;

	if (kb < 4 || kb % 4)
		kb = 2048;
	return kb << 10;
}

static size_t stage_size(void)
{
	const char *s = getenv("GPUCR_STAGE_MB");
	size_t mb = s ? strtoul(s, NULL, 10) : 64;

	if (mb < 2)
		mb = 64;
	return mb << 20;
}

static int pipe_init(struct pipe *pp, pid_t pid, const char *what, char *msg, size_t msglen)
{
	int i, r;

	memset(pp, 0, sizeof(*pp));
	pp->msg = msg;
	pp->msglen = msglen;
	pp->pid = pid;
	pp->what = what;
	pp->slot_size = stage_size();
	pp->t0 = pp->last_report = now_ns();
	r = io_uring_queue_init(NSLOTS * 2, &pp->ring, 0);
	if (r < 0) {
		snprintf(msg, msglen, "io_uring setup failed: %s", strerror(-r));
		return r;
	}
	pp->ring_ok = 1;
	for (i = 0; i < NSLOTS; i++) {
		r = gpu_host_alloc(pp->slot_size, &pp->slots[i].buf);
		if (r < 0) {
			snprintf(msg, msglen, "cannot pin %zu MiB of host memory for staging: %s",
				 pp->slot_size >> 20, gpucr_strerror(r));
			return r;
		}
	}
	return 0;
}

static void pipe_fini(struct pipe *pp)
{
	int i;

	for (i = 0; i < NSLOTS; i++)
		gpu_host_free(pp->slots[i].buf);
	if (pp->ring_ok)
		io_uring_queue_exit(&pp->ring);
}

static void progress(struct pipe *pp)
{
	uint64_t t = now_ns();
	double secs = (t - pp->t0) / 1e9, rate;

	if (t - pp->last_report < 2000000000ull || !pp->total_bytes)
		return;
	pp->last_report = t;
	rate = secs > 0 ? pp->done_bytes / secs : 0;
	pr_info("pid %d: %s: %.1f of %.1f GiB, %.1f GB/s, %.0f s left", (int)pp->pid, pp->what,
		pp->done_bytes / 1073741824.0, pp->total_bytes / 1073741824.0, rate / 1e9,
		rate > 0 ? (pp->total_bytes - pp->done_bytes) / rate : 0.0);
}

/* Reaps one completion (waiting for it). Returns the slot index. */
static int reap_one(struct pipe *pp)
{
	struct io_uring_cqe *cqe;
	struct slot *s;
	int r, idx;

	r = io_uring_wait_cqe(&pp->ring, &cqe);
	if (r < 0) {
		if (!pp->err) {
			pp->err = r;
			snprintf(pp->msg, pp->msglen, "io_uring wait: %s", strerror(-r));
		}
		return -1;
	}
	idx = (int)io_uring_cqe_get_data64(cqe);
	s = &pp->slots[idx];
	if (cqe->res < 0 && !pp->err) {
		pp->err = cqe->res;
		snprintf(pp->msg, pp->msglen, "%s: %s%s", pp->what, strerror(-cqe->res),
			 cqe->res == -ENOSPC ? " (the image's file system is full; no image was left behind)" : "");
	} else if (cqe->res >= 0 && (uint64_t)cqe->res < ((s->len + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1)) &&
		   !pp->err) {
		pp->err = -EIO;
		snprintf(pp->msg, pp->msglen, "%s: short transfer (%d of %llu bytes)%s", pp->what, cqe->res,
			 (unsigned long long)s->len,
			 cqe->res == 0 ? ": the file ends early" : "");
	}
	io_uring_cqe_seen(&pp->ring, cqe);
	pp->inflight--;
	return idx;
}

static int free_slot(struct pipe *pp, int *ret_idx)
{
	int i;

	for (i = 0; i < NSLOTS; i++)
		if (!pp->slots[i].busy) {
			*ret_idx = i;
			return 0;
		}
	i = reap_one(pp);
	if (i < 0)
		return pp->err;
	pp->slots[i].busy = 0;
	if (pp->err)
		return pp->err;
	*ret_idx = i;
	return 0;
}

static int submit(struct pipe *pp, int write, int fd, int idx, uint64_t file_off, uint64_t len)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&pp->ring);
	uint64_t alen = (len + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
	int r;

	if (!sqe)
		return -EBUSY;
	if (write)
		io_uring_prep_write(sqe, fd, pp->slots[idx].buf, (unsigned)alen, file_off);
	else
		io_uring_prep_read(sqe, fd, pp->slots[idx].buf, (unsigned)alen, file_off);
	io_uring_sqe_set_data64(sqe, (uint64_t)idx);
	r = io_uring_submit(&pp->ring);
	if (r < 0)
		return r;
	pp->slots[idx].busy = 1;
	pp->slots[idx].len = len;
	pp->inflight++;
	return 0;
}

static int cmp_rbuf(const void *a, const void *b)
{
	const struct rbuf *x = *(struct rbuf *const *)a, *y = *(struct rbuf *const *)b;
	uint64_t vx = x->va + x->phys_offset, vy = y->va + y->phys_offset;

	return vx < vy ? -1 : vx > vy;
}

/* ---- write -------------------------------------------------------------- */

int imgio_write(struct proc *p, int dirfd, struct img_stats *st, char *msg, size_t msglen)
{
	const struct cudrv *drv = gpu_drv();
	Gpucr__ImageHeader hdr = GPUCR__IMAGE_HEADER__INIT;
	Gpucr__Device devrec[GPU_MAX_DEVICES], *devp[GPU_MAX_DEVICES];
	Gpucr__ImageTrailer tr = GPUCR__IMAGE_TRAILER__INIT;
	uint64_t chunk = chunk_size(), t0 = now_ns();
	struct img_writer *w = NULL;
	struct rbuf **bufs = NULL, *b;
	struct img_errbuf eb;
	struct pipe pp;
	size_t nb = 0, i, ndev = 0;
	int dfd = -1, wfd, r;
	char writer[64];
	struct timespec rt;

	memset(st, 0, sizeof(*st));
	bufs = calloc(p->nbufs ? p->nbufs : 1, sizeof(*bufs));
	if (!bufs) {
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
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
	hdr.has_control_tid = p->control_tid != 0;
	hdr.control_tid = (uint32_t)p->control_tid;

	r = pipe_init(&pp, p->pid, "writing the GPU image", msg, msglen);
	if (r < 0)
		goto out;
	r = img_writer_open(dirfd, (uint32_t)p->pid, &hdr, &w, &eb);
	if (r < 0) {
		snprintf(msg, msglen, "%s", eb.msg);
		goto out;
	}
	dfd = img_writer_open_pages_direct(w);
	wfd = dfd >= 0 ? dfd : img_writer_pages_fd(w);
	for (i = 0; i < nb; i++)
		pp.total_bytes += bufs[i]->phys_size;

	for (i = 0; i < nb && !r; i++) {
		uint64_t n, c, *fp;
		uint8_t *nz;
		Gpucr__Chunk *chunks, **cp;
		Gpucr__Buffer rec = GPUCR__BUFFER__INIT;
		struct gpu_dev *dev;

		b = bufs[i];
		dev = b->mem.dev;
		if (!dev || !b->mem.va) {
			r = -EINVAL;
			snprintf(msg, msglen, "buffer 0x%" PRIx64 " was never taken over", b->va);
			break;
		}
		n = (b->phys_size + chunk - 1) / chunk;
		fp = calloc(n, sizeof(*fp));
		nz = calloc(n, 1);
		chunks = calloc(n, sizeof(*chunks));
		cp = calloc(n, sizeof(*cp));
		if (!fp || !nz || !chunks || !cp) {
			r = -ENOMEM;
			snprintf(msg, msglen, "out of memory");
			goto next;
		}
		r = gpu_fingerprint(dev, b->mem.va, b->phys_size, chunk, fp, nz);
		if (r < 0) {
			snprintf(msg, msglen, "buffer 0x%" PRIx64 ": fingerprints: %s", b->va, gpucr_strerror(r));
			goto next;
		}
		for (c = 0; c < n; c++) {
			gpucr__chunk__init(&chunks[c]);
			chunks[c].offset = c * chunk;
			chunks[c].length = b->phys_size - c * chunk < chunk ? b->phys_size - c * chunk : chunk;
			chunks[c].fingerprint = fp[c];
			if (!nz[c])
				chunks[c].has_zero = chunks[c].zero = 1;
			cp[c] = &chunks[c];
		}
		/* Runs of stored chunks, each run at most one staging slot. */
		for (c = 0; c < n && !r;) {
			uint64_t first = c, len = 0, off, k;
			int idx = 0;

			if (!nz[c]) {
				pp.done_bytes += chunks[c].length;
				c++;
				continue;
			}
			while (c < n && nz[c] && len + chunks[c].length <= pp.slot_size) {
				len += chunks[c].length;
				c++;
			}
			if (len == 0) { /* a chunk larger than a slot: GPUCR_STAGE_MB too small */
				r = -EINVAL;
				snprintf(msg, msglen, "chunk of %" PRIu64 " bytes does not fit a %zu-byte staging buffer",
					 chunks[c].length, pp.slot_size);
				break;
			}
			off = img_writer_reserve(w, len);
			for (k = first; k < c; k++) {
				chunks[k].has_data_offset = 1;
				chunks[k].data_offset = off + (chunks[k].offset - chunks[first].offset);
			}
			r = free_slot(&pp, &idx);
			if (r < 0)
				break;
			r = gpu_use(dev);
			if (!r)
				r = gpucr_err_from_cu(drv->cuMemcpyDtoHAsync(pp.slots[idx].buf,
									     b->mem.va + chunks[first].offset, len,
									     dev->streams[idx % GPU_STREAMS]));
			if (!r)
				r = gpucr_err_from_cu(drv->cuStreamSynchronize(dev->streams[idx % GPU_STREAMS]));
			if (r < 0) {
				snprintf(msg, msglen, "buffer 0x%" PRIx64 ": copy to host: %s", b->va,
					 gpucr_strerror(r));
				break;
			}
			if (len % IMG_ALIGN)
				memset((char *)pp.slots[idx].buf + len, 0, IMG_ALIGN - len % IMG_ALIGN);
			r = submit(&pp, 1, wfd, idx, off, len);
			if (r < 0) {
				snprintf(msg, msglen, "io_uring submit: %s", strerror(-r));
				break;
			}
			st->stored += len;
			pp.done_bytes += len;
			progress(&pp);
		}
		if (!r) {
			rec.va = b->va + b->phys_offset;
			rec.size = b->phys_size;
			rec.device = b->device;
			rec.has_kind = b->kind != 0;
			rec.kind = (Gpucr__BufferKind)b->kind;
			rec.has_phys_size = 1;
			rec.phys_size = b->phys_size;
			rec.n_chunks = n;
			rec.chunks = cp;
			r = img_writer_add_buffer(w, &rec, &eb);
			if (r < 0)
				snprintf(msg, msglen, "%s", eb.msg);
		}
		st->bytes += b->phys_size;
next:
		free(fp);
		free(nz);
		free(chunks);
		free(cp);
	}
	while (pp.inflight > 0) {
		int idx = reap_one(&pp);

		if (idx >= 0)
			pp.slots[idx].busy = 0;
		else
			break;
	}
	if (!r && pp.err)
		r = pp.err;
	if (r < 0)
		goto out;
	st->elapsed_ns = now_ns() - t0;
	tr.has_stored_bytes = 1;
	tr.stored_bytes = st->stored;
	tr.has_total_bytes = 1;
	tr.total_bytes = st->bytes;
	tr.has_elapsed_ns = 1;
	tr.elapsed_ns = st->elapsed_ns;
	if (dfd >= 0) {
		close(dfd);
		dfd = -1;
	}
	r = img_writer_commit(w, &tr, &eb);
	w = NULL;
	if (r < 0)
		snprintf(msg, msglen, "%s", eb.msg);
out:
	if (dfd >= 0)
		close(dfd);
	img_writer_abort(w);
	pipe_fini(&pp);
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

/* H2D of a completed read slot into its buffer. */
static int land(struct pipe *pp, int idx)
{
	const struct cudrv *drv = gpu_drv();
	struct slot *s = &pp->slots[idx];
	struct gpu_dev *dev = s->b->mem.dev;
	int r;

	r = gpu_use(dev);
	if (!r)
		r = gpucr_err_from_cu(drv->cuMemcpyHtoDAsync(s->b->mem.va + s->dev_off, s->buf, s->len,
							     dev->streams[idx % GPU_STREAMS]));
	if (!r)
		r = gpucr_err_from_cu(drv->cuStreamSynchronize(dev->streams[idx % GPU_STREAMS]));
	if (r < 0)
		snprintf(pp->msg, pp->msglen, "buffer 0x%" PRIx64 ": copy to the GPU: %s", s->b->va,
			 gpucr_strerror(r));
	s->busy = 0;
	pp->done_bytes += s->len;
	progress(pp);
	return r;
}

int imgio_read(pid_t pid, int dirfd, struct rbuf **ret_bufs, struct img_stats *st, char *msg,
	       size_t msglen)
{
	const struct cudrv *drv;
	struct gpucr_image *img = NULL;
	struct rbuf *head = NULL, *b, **bv = NULL;
	struct img_errbuf eb;
	uint64_t t0 = now_ns();
	struct pipe pp;
	int pipe_ok = 0, dfd = -1, rfd, r;
	char gmsg[512], pname[64];
	size_t i;

	memset(st, 0, sizeof(*st));
	memset(&pp, 0, sizeof(pp));
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
	bv = calloc(img->nbuffers + 1, sizeof(*bv));
	if (!bv) {
		img_free(img);
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	st->control_tid = img->hdr->has_control_tid ? img->hdr->control_tid : 0;
	st->uid = img->hdr->has_uid ? img->hdr->uid : 0;
	r = pipe_init(&pp, pid, "loading the GPU image", msg, msglen);
	if (r < 0)
		goto out;
	pipe_ok = 1;
	img_pages_name(pname, sizeof(pname), (uint32_t)pid);
	dfd = openat(dirfd, pname, O_RDONLY | O_DIRECT | O_CLOEXEC);
	rfd = dfd >= 0 ? dfd : img->pages_fd;
	for (i = 0; i < img->nbuffers; i++)
		pp.total_bytes += img->buffers[i]->size;

	/* New GPU memory for every buffer first: a restore that cannot fit
	 * fails before reading anything. */
	for (i = 0; i < img->nbuffers; i++) {
		const Gpucr__Buffer *ib = img->buffers[i];
		struct gpu_dev *dev = pick_device(img->hdr, ib->device, msg, msglen);
		size_t k;

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
	}

	/* Data: runs of stored chunks that are contiguous in the file. */
	for (i = 0; i < img->nbuffers; i++) {
		const Gpucr__Buffer *ib = img->buffers[i];
		size_t c;

		b = bv[i];
		for (c = 0; c < ib->n_chunks && !r;) {
			const Gpucr__Chunk *ch = ib->chunks[c];
			uint64_t len = 0, first = c;
			int idx = 0;

			if (ch->has_zero && ch->zero) {
				r = gpu_use(b->mem.dev);
				if (!r)
					r = gpucr_err_from_cu(drv->cuMemsetD8(b->mem.va + ch->offset, 0, ch->length));
				pp.done_bytes += ch->length;
				c++;
				continue;
			}
			while (c < ib->n_chunks && !(ib->chunks[c]->has_zero && ib->chunks[c]->zero) &&
			       ib->chunks[c]->data_offset == ib->chunks[first]->data_offset + len &&
			       ib->chunks[c]->offset == ib->chunks[first]->offset + len &&
			       len + ib->chunks[c]->length <= pp.slot_size) {
				len += ib->chunks[c]->length;
				c++;
			}
			if (!len) {
				r = -EINVAL;
				snprintf(msg, msglen, "chunk larger than the staging buffer");
				break;
			}
			/* Need a free slot: land completed reads first. */
			while (!r) {
				for (idx = 0; idx < NSLOTS && pp.slots[idx].busy; idx++)
					;
				if (idx < NSLOTS)
					break;
				idx = reap_one(&pp);
				if (idx < 0 || pp.err) {
					r = pp.err ? pp.err : -EIO;
					break;
				}
				r = land(&pp, idx);
			}
			if (r)
				break;
			pp.slots[idx].b = b;
			pp.slots[idx].dev_off = ib->chunks[first]->offset;
			r = submit(&pp, 0, rfd, idx, ib->chunks[first]->data_offset, len);
			if (r < 0)
				snprintf(msg, msglen, "io_uring submit: %s", strerror(-r));
			st->stored += len;
		}
		if (r)
			break;
	}
	while (pp.inflight > 0) {
		int idx = reap_one(&pp);

		if (idx < 0)
			break;
		if (!r && !pp.err)
			r = land(&pp, idx);
		else
			pp.slots[idx].busy = 0;
	}
	if (!r && pp.err)
		r = pp.err;
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
			break;
		}
		r = gpu_fingerprint(b->mem.dev, b->mem.va, ib->size, chunk, fp, nz);
		for (c = 0; c < ib->n_chunks && !r; c++)
			if (fp[c] != ib->chunks[c]->fingerprint) {
				r = -EBADMSG;
				snprintf(msg, msglen,
					 "pid %d: buffer 0x%" PRIx64 " (%" PRIu64
					 " bytes): fingerprint mismatch in chunk %zu (offset %" PRIu64
					 "): the image is damaged; restore refused",
					 (int)pid, ib->va, ib->size, c, ib->chunks[c]->offset);
			}
		if (r < 0 && r != -EBADMSG)
			snprintf(msg, msglen, "fingerprints after loading: %s", gpucr_strerror(r));
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
	if (dfd >= 0)
		close(dfd);
	(void)pipe_ok;
	pipe_fini(&pp);
	free(bv);
	img_free(img);
	return r;
}
