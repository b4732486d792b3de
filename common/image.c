/* Owns the on-disk layout of GPU images: record framing, checksums,
 * temporary names and the rename that makes an image complete, and every
 * check a reader makes before it trusts an image. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "fingerprint.h"
#include "image.h"

struct pages_header {
	char magic[8];
	uint32_t version;
	uint32_t pid;
	uint8_t image_id[16];
	uint32_t index;         /* which pages file this is */
	uint32_t count;         /* of how many */
};

struct img_writer {
	int dirfd;
	uint32_t pid;
	int img_fd;
	unsigned npages;
	int pages_fds[IMG_MAX_PAGES_FILES];
	uint64_t pages_ends[IMG_MAX_PAGES_FILES];
	char pages_tmps[IMG_MAX_PAGES_FILES][80];
	uint64_t img_off;
	uint32_t nbuffers;
	uint8_t image_id[16];
	pthread_mutex_t lock;
	char img_tmp[64];
};

static int set_err(struct img_errbuf *eb, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int set_err(struct img_errbuf *eb, int err, const char *fmt, ...)
{
	va_list ap;

	if (eb) {
		va_start(ap, fmt);
		vsnprintf(eb->msg, sizeof(eb->msg), fmt, ap);
		va_end(ap);
	}
	return err;
}

void img_name(char *buf, size_t len, uint32_t pid)
{
	snprintf(buf, len, "gpucr-%" PRIu32 ".img", pid);
}

void img_pages_name(char *buf, size_t len, uint32_t pid)
{
	snprintf(buf, len, "gpucr-pages-%" PRIu32 ".img", pid);
}

void img_pages_name_n(char *buf, size_t len, uint32_t pid, unsigned k)
{
	if (k == 0)
		img_pages_name(buf, len, pid);
	else
		snprintf(buf, len, "gpucr-pages-%" PRIu32 ".%u.img", pid, k);
}

static int write_full(int fd, uint64_t off, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

int img_read_full(int fd, uint64_t off, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ENODATA;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
	p[0] = v & 0xff;
	p[1] = (v >> 8) & 0xff;
	p[2] = (v >> 16) & 0xff;
	p[3] = (v >> 24) & 0xff;
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Packs msg and appends it as one record. The caller holds w->lock. */
static int write_record(struct img_writer *w, uint32_t type, const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf;
	int r;

	if (len > IMG_RECORD_MAX)
		return -EMSGSIZE;
	buf = malloc(12 + len);
	if (!buf)
		return -ENOMEM;
	protobuf_c_message_pack(msg, buf + 12);
	put_u32(buf, type);
	put_u32(buf + 4, (uint32_t)len);
	put_u32(buf + 8, crc32c(0, buf + 12, len));
	r = write_full(w->img_fd, w->img_off, buf, 12 + len);
	free(buf);
	if (r == 0)
		w->img_off += 12 + len;
	return r;
}

/* What the writer puts in every header record it writes: the format
 * version, pid, pages files and image id. */
static void header_fill(struct img_writer *w, Gpucr__ImageHeader *h)
{
	h->format_version = IMG_FORMAT_VERSION;
	h->pid = w->pid;
	h->has_pages_files = w->npages > 1;
	h->pages_files = w->npages;
	h->has_image_id = 1;
	h->image_id.data = w->image_id;
	h->image_id.len = sizeof(w->image_id);
}

int img_writer_open(int dirfd, uint32_t pid, Gpucr__ImageHeader *hdr, struct img_writer **ret,
		    struct img_errbuf *eb)
{
	Gpucr__ImageHeader hcopy;
	struct pages_header ph;
	uint8_t filehdr[16];
	uint8_t *block = NULL;
	struct img_writer *w;
	unsigned k;
	int r;

	w = calloc(1, sizeof(*w));
	if (!w)
		return set_err(eb, -ENOMEM, "out of memory");
	w->dirfd = dirfd;
	w->pid = pid;
	w->img_fd = -1;
	w->npages = hdr->has_pages_files && hdr->pages_files > 1 ? hdr->pages_files : 1;
	if (w->npages > IMG_MAX_PAGES_FILES)
		w->npages = IMG_MAX_PAGES_FILES;
	for (k = 0; k < IMG_MAX_PAGES_FILES; k++)
		w->pages_fds[k] = -1;
	pthread_mutex_init(&w->lock, NULL);
	snprintf(w->img_tmp, sizeof(w->img_tmp), ".gpucr-%" PRIu32 ".img.partial", pid);

	w->img_fd = openat(dirfd, w->img_tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (w->img_fd < 0) {
		r = set_err(eb, -errno, "cannot create %s: %s", w->img_tmp, strerror(errno));
		goto fail;
	}
	for (k = 0; k < w->npages; k++) {
		char name[48];

		img_pages_name_n(name, sizeof(name), pid, k);
		snprintf(w->pages_tmps[k], sizeof(w->pages_tmps[k]), ".%s.partial", name);
		w->pages_fds[k] = openat(dirfd, w->pages_tmps[k], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (w->pages_fds[k] < 0) {
			r = set_err(eb, -errno, "cannot create %s: %s", w->pages_tmps[k], strerror(errno));
			goto fail;
		}
	}

	/* The record gets the format version, pid and a fresh image id; the
	 * caller's header is left as it was. */
	hcopy = *hdr;
	if (!hcopy.has_image_id || hcopy.image_id.len != sizeof(w->image_id)) {
		if (getrandom(w->image_id, sizeof(w->image_id), 0) != sizeof(w->image_id)) {
			r = set_err(eb, -EIO, "getrandom failed for the image id");
			goto fail;
		}
	} else {
		memcpy(w->image_id, hcopy.image_id.data, sizeof(w->image_id));
	}
	header_fill(w, &hcopy);

	memcpy(filehdr, IMG_MAGIC, 8);
	put_u32(filehdr + 8, IMG_FORMAT_VERSION);
	put_u32(filehdr + 12, 0);
	r = write_full(w->img_fd, 0, filehdr, sizeof(filehdr));
	if (r < 0) {
		set_err(eb, r, "%s: write: %s", w->img_tmp, strerror(-r));
		goto fail;
	}
	w->img_off = sizeof(filehdr);
	r = write_record(w, IMG_REC_HEADER, &hcopy.base);
	if (r < 0) {
		set_err(eb, r, "%s: header record: %s", w->img_tmp, strerror(-r));
		goto fail;
	}

	block = calloc(1, IMG_PAGES_HEADER);
	if (!block) {
		r = set_err(eb, -ENOMEM, "out of memory");
		goto fail;
	}
	for (k = 0; k < w->npages; k++) {
		memset(&ph, 0, sizeof(ph));
		memcpy(ph.magic, IMG_PAGES_MAGIC, 8);
		ph.version = IMG_FORMAT_VERSION;
		ph.pid = pid;
		memcpy(ph.image_id, w->image_id, sizeof(ph.image_id));
		ph.index = k;
		ph.count = w->npages;
		memcpy(block, &ph, sizeof(ph));
		r = write_full(w->pages_fds[k], 0, block, IMG_PAGES_HEADER);
		if (r < 0) {
			set_err(eb, r, "%s: write: %s", w->pages_tmps[k], strerror(-r));
			goto fail;
		}
		w->pages_ends[k] = IMG_PAGES_HEADER;
	}
	free(block);
	*ret = w;
	return 0;
fail:
	free(block);
	img_writer_abort(w);
	return r;
}

int img_writer_reheader(struct img_writer *w, const Gpucr__ImageHeader *hdr, struct img_errbuf *eb)
{
	Gpucr__ImageHeader hcopy = *hdr;
	int r;

	if (w->nbuffers)
		return set_err(eb, -EBUSY, "%s: the header cannot change after buffer records", w->img_tmp);
	header_fill(w, &hcopy);
	pthread_mutex_lock(&w->lock);
	w->img_off = 16; /* right after the file header */
	r = ftruncate(w->img_fd, (off_t)w->img_off) < 0 ? -errno : 0;
	if (r == 0)
		r = write_record(w, IMG_REC_HEADER, &hcopy.base);
	pthread_mutex_unlock(&w->lock);
	if (r < 0)
		return set_err(eb, r, "%s: header record: %s", w->img_tmp, strerror(-r));
	return 0;
}

unsigned img_writer_files(const struct img_writer *w)
{
	return w->npages;
}

uint64_t img_writer_reserve_in(struct img_writer *w, unsigned file, uint64_t len)
{
	uint64_t off;

	if (file >= w->npages)
		file = 0;
	pthread_mutex_lock(&w->lock);
	off = w->pages_ends[file];
	w->pages_ends[file] += (len + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
	pthread_mutex_unlock(&w->lock);
	return off;
}

uint64_t img_writer_reserve(struct img_writer *w, uint64_t len)
{
	return img_writer_reserve_in(w, 0, len);
}

int img_writer_pages_fd_n(struct img_writer *w, unsigned file)
{
	return file < w->npages ? w->pages_fds[file] : -1;
}

int img_writer_pages_fd(struct img_writer *w)
{
	return w->pages_fds[0];
}

int img_writer_open_pages_direct_n(struct img_writer *w, unsigned file)
{
	int fd;

	if (file >= w->npages)
		return -EINVAL;
	fd = openat(w->dirfd, w->pages_tmps[file], O_WRONLY | O_DIRECT | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int img_writer_open_pages_direct(struct img_writer *w)
{
	return img_writer_open_pages_direct_n(w, 0);
}

int img_writer_write_pages(struct img_writer *w, uint64_t off, const void *buf, size_t len)
{
	return write_full(w->pages_fds[0], off, buf, len);
}

int img_writer_add_buffer(struct img_writer *w, const Gpucr__Buffer *b, struct img_errbuf *eb)
{
	int r;

	pthread_mutex_lock(&w->lock);
	r = write_record(w, IMG_REC_BUFFER, &b->base);
	if (r == 0)
		w->nbuffers++;
	pthread_mutex_unlock(&w->lock);
	if (r < 0)
		return set_err(eb, r, "%s: buffer 0x%" PRIx64 ": %s", w->img_tmp, b->va, strerror(-r));
	return 0;
}

static int fsync_err(int fd)
{
	return fsync(fd) < 0 ? -errno : 0;
}

int img_writer_commit(struct img_writer *w, const Gpucr__ImageTrailer *stats, struct img_errbuf *eb)
{
	Gpucr__ImageTrailer t = GPUCR__IMAGE_TRAILER__INIT;
	char img_final[64], pages_final[IMG_MAX_PAGES_FILES][64];
	unsigned k, renamed = 0;
	int r = 0;

	if (stats)
		t = *stats;
	t.buffer_count = w->nbuffers;
	t.pages_size = w->pages_ends[0];
	t.n_pages_sizes = w->npages;
	t.pages_sizes = w->pages_ends;
	/* A pages file may end in a reserved but sparse region: give it its
	 * full length so readers can check every chunk lies inside it. */
	for (k = 0; k < w->npages; k++)
		if (ftruncate(w->pages_fds[k], (off_t)w->pages_ends[k]) < 0) {
			r = set_err(eb, -errno, "%s: truncate: %s", w->pages_tmps[k], strerror(errno));
			goto fail;
		}
	pthread_mutex_lock(&w->lock);
	r = write_record(w, IMG_REC_TRAILER, &t.base);
	pthread_mutex_unlock(&w->lock);
	if (r < 0) {
		set_err(eb, r, "%s: trailer: %s", w->img_tmp, strerror(-r));
		goto fail;
	}
	for (k = 0; k < w->npages && !r; k++)
		r = fsync_err(w->pages_fds[k]);
	if (r == 0)
		r = fsync_err(w->img_fd);
	if (r < 0) {
		set_err(eb, r, "fsync of the image for pid %" PRIu32 ": %s", w->pid, strerror(-r));
		goto fail;
	}
	img_name(img_final, sizeof(img_final), w->pid);
	/* Pages first: an image file is only ever seen beside its data. */
	for (k = 0; k < w->npages; k++) {
		img_pages_name_n(pages_final[k], sizeof(pages_final[k]), w->pid, k);
		if (renameat(w->dirfd, w->pages_tmps[k], w->dirfd, pages_final[k]) < 0) {
			r = set_err(eb, -errno, "rename %s: %s", w->pages_tmps[k], strerror(errno));
			goto unrename;
		}
		renamed++;
	}
	if (renameat(w->dirfd, w->img_tmp, w->dirfd, img_final) < 0) {
		r = set_err(eb, -errno, "rename %s: %s", w->img_tmp, strerror(errno));
		goto unrename;
	}
	r = fsync_err(w->dirfd);
	if (r < 0 && r != -EINVAL && r != -EROFS) {
		set_err(eb, r, "fsync of the image directory: %s", strerror(-r));
		unlinkat(w->dirfd, img_final, 0);
		goto unrename;
	}
	close(w->img_fd);
	for (k = 0; k < w->npages; k++)
		close(w->pages_fds[k]);
	pthread_mutex_destroy(&w->lock);
	free(w);
	return 0;
unrename:
	for (k = 0; k < renamed; k++)
		unlinkat(w->dirfd, pages_final[k], 0);
fail:
	img_writer_abort(w);
	return r;
}

void img_writer_abort(struct img_writer *w)
{
	unsigned k;

	if (!w)
		return;
	if (w->img_fd >= 0) {
		close(w->img_fd);
		unlinkat(w->dirfd, w->img_tmp, 0);
	}
	for (k = 0; k < IMG_MAX_PAGES_FILES; k++)
		if (w->pages_fds[k] >= 0) {
			close(w->pages_fds[k]);
			unlinkat(w->dirfd, w->pages_tmps[k], 0);
		}
	pthread_mutex_destroy(&w->lock);
	free(w);
}

/* ---- reading ---------------------------------------------------------- */

static const char *rec_name(uint32_t type)
{
	switch (type) {
	case IMG_REC_HEADER:
		return "header";
	case IMG_REC_BUFFER:
		return "buffer";
	case IMG_REC_TRAILER:
		return "trailer";
	}
	return "unknown";
}

void img_free(struct gpucr_image *img)
{
	size_t i;

	if (!img)
		return;
	if (img->hdr)
		gpucr__image_header__free_unpacked(img->hdr, NULL);
	for (i = 0; i < img->nbuffers; i++)
		gpucr__buffer__free_unpacked(img->buffers[i], NULL);
	free(img->buffers);
	if (img->trailer)
		gpucr__image_trailer__free_unpacked(img->trailer, NULL);
	for (i = 0; i < img->npages; i++)
		if (img->pages_fds[i] >= 0)
			close(img->pages_fds[i]);
	free(img);
}

static int add_buffer(struct gpucr_image *img, Gpucr__Buffer *b)
{
	if ((img->nbuffers & (img->nbuffers + 1)) == 0 || img->nbuffers == 0) {
		size_t cap = img->nbuffers ? (img->nbuffers + 1) * 2 : 8;
		Gpucr__Buffer **nb = realloc(img->buffers, cap * sizeof(*nb));

		if (!nb)
			return -ENOMEM;
		img->buffers = nb;
	}
	img->buffers[img->nbuffers++] = b;
	return 0;
}

/* Checks every pages file against the header and trailer, and every chunk
 * of every buffer against its pages file. */
static int check_pages(struct gpucr_image *img, struct img_errbuf *eb)
{
	struct pages_header ph;
	char pname[64];
	struct stat st;
	unsigned k;
	size_t i, j;
	int r;

	img->pages_size = 0;
	for (k = 0; k < img->npages; k++) {
		uint64_t want = img->trailer->n_pages_sizes > k ? img->trailer->pages_sizes[k] :
				k == 0 ? img->trailer->pages_size : 0;

		img_pages_name_n(pname, sizeof(pname), img->pid, k);
		if (fstat(img->pages_fds[k], &st) < 0)
			return set_err(eb, -errno, "%s: %s", pname, strerror(errno));
		img->pages_sizes[k] = (uint64_t)st.st_size;
		img->pages_size += img->pages_sizes[k];
		memset(&ph, 0, sizeof(ph));
		r = img_read_full(img->pages_fds[k], 0, &ph, sizeof(ph));
		if (r < 0 || memcmp(ph.magic, IMG_PAGES_MAGIC, 8))
			return set_err(eb, -EBADMSG, "%s: not a gpucr pages file (bad magic)", pname);
		if (ph.pid != img->pid)
			return set_err(eb, -EBADMSG, "%s: belongs to pid %" PRIu32 ", not %" PRIu32, pname,
				       ph.pid, img->pid);
		if (img->hdr->has_image_id && img->hdr->image_id.len == 16 &&
		    memcmp(ph.image_id, img->hdr->image_id.data, 16))
			return set_err(eb, -EBADMSG,
				       "%s: belongs to another dump of pid %" PRIu32 " (image id differs)",
				       pname, img->pid);
		if (ph.index != k || (ph.count ? ph.count : 1) != img->npages)
			return set_err(eb, -EBADMSG, "%s: is pages file %u of %u, expected %u of %u", pname,
				       ph.index, ph.count, k, img->npages);
		if (img->pages_sizes[k] != want)
			return set_err(eb, -EBADMSG,
				       "%s: truncated or extended: %" PRIu64 " bytes, the image says %" PRIu64,
				       pname, img->pages_sizes[k], want);
	}
	for (i = 0; i < img->nbuffers; i++) {
		const Gpucr__Buffer *b = img->buffers[i];

		for (j = 0; j < b->n_chunks; j++) {
			const Gpucr__Chunk *c = b->chunks[j];
			unsigned f = c->has_file ? c->file : 0;

			if (c->offset + c->length > b->size || c->offset + c->length < c->offset)
				return set_err(eb, -EBADMSG,
					       "buffer 0x%" PRIx64 ": chunk %zu lies outside the buffer",
					       b->va, j);
			if (c->has_zero && c->zero)
				continue;
			if (f >= img->npages)
				return set_err(eb, -EBADMSG,
					       "buffer 0x%" PRIx64 ": chunk %zu is in pages file %u of %u", b->va,
					       j, f, img->npages);
			if (!c->has_data_offset || c->data_offset % IMG_ALIGN ||
			    c->data_offset < IMG_PAGES_HEADER ||
			    c->data_offset + c->length > img->pages_sizes[f]) {
				img_pages_name_n(pname, sizeof(pname), img->pid, f);
				return set_err(eb, -EBADMSG,
					       "buffer 0x%" PRIx64 ": chunk %zu points outside %s", b->va,
					       j, pname);
			}
		}
	}
	return 0;
}

int img_read(int dirfd, uint32_t pid, struct gpucr_image **ret, struct img_errbuf *eb)
{
	char name[64], pname[64];
	struct gpucr_image *img;
	uint8_t filehdr[16];
	uint64_t off, size;
	struct stat st;
	uint32_t nrec = 0;
	uint8_t *buf = NULL;
	int fd, r;

	img_name(name, sizeof(name), pid);
	img_pages_name(pname, sizeof(pname), pid);
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		char tmp[80];

		r = -errno;
		snprintf(tmp, sizeof(tmp), ".%s.partial", name);
		if (r == -ENOENT && faccessat(dirfd, tmp, F_OK, 0) == 0)
			return set_err(eb, -ENODATA,
				       "%s: only a partial image is there (%s): the dump did not finish",
				       name, tmp);
		return set_err(eb, r, "%s: %s", name, strerror(-r));
	}
	img = calloc(1, sizeof(*img));
	if (!img) {
		close(fd);
		return set_err(eb, -ENOMEM, "out of memory");
	}
	img->pid = pid;
	img->pages_fd = -1;
	for (r = 0; r < IMG_MAX_PAGES_FILES; r++)
		img->pages_fds[r] = -1;

	if (fstat(fd, &st) < 0) {
		r = set_err(eb, -errno, "%s: %s", name, strerror(errno));
		goto fail;
	}
	size = (uint64_t)st.st_size;
	r = img_read_full(fd, 0, filehdr, sizeof(filehdr));
	if (r < 0 || memcmp(filehdr, IMG_MAGIC, 8)) {
		r = set_err(eb, -EBADMSG, "%s: not a gpucr image (bad magic)", name);
		goto fail;
	}
	if (get_u32(filehdr + 8) > IMG_FORMAT_VERSION) {
		r = set_err(eb, -EPROTONOSUPPORT,
			    "%s: written in image format %" PRIu32 " by a newer gpucr; this one reads up to format %d",
			    name, get_u32(filehdr + 8), IMG_FORMAT_VERSION);
		goto fail;
	}

	for (off = sizeof(filehdr); off < size;) {
		uint8_t rh[12];
		uint32_t type, len, crc;

		if (img->trailer) {
			r = set_err(eb, -EBADMSG, "%s: data after the trailer at offset %" PRIu64, name, off);
			goto fail;
		}
		if (size - off < sizeof(rh)) {
			r = set_err(eb, -EBADMSG, "%s: truncated record header at offset %" PRIu64, name, off);
			goto fail;
		}
		r = img_read_full(fd, off, rh, sizeof(rh));
		if (r < 0) {
			set_err(eb, r, "%s: read: %s", name, strerror(-r));
			goto fail;
		}
		type = get_u32(rh);
		len = get_u32(rh + 4);
		crc = get_u32(rh + 8);
		if (len > IMG_RECORD_MAX || len > size - off - sizeof(rh)) {
			r = set_err(eb, -EBADMSG,
				    "%s: record %" PRIu32 " (%s) at offset %" PRIu64 " is truncated: %" PRIu32
				    " bytes announced, %" PRIu64 " left",
				    name, nrec, rec_name(type), off, len, size - off - sizeof(rh));
			goto fail;
		}
		buf = malloc(len ? len : 1);
		if (!buf) {
			r = set_err(eb, -ENOMEM, "out of memory");
			goto fail;
		}
		r = img_read_full(fd, off + sizeof(rh), buf, len);
		if (r < 0) {
			set_err(eb, r, "%s: read: %s", name, strerror(-r));
			goto fail;
		}
		if (crc32c(0, buf, len) != crc) {
			r = set_err(eb, -EBADMSG,
				    "%s: record %" PRIu32 " (%s) at offset %" PRIu64 " is damaged (checksum mismatch)",
				    name, nrec, rec_name(type), off);
			goto fail;
		}
		if (nrec == 0 && type != IMG_REC_HEADER) {
			r = set_err(eb, -EBADMSG, "%s: first record is %s, not the header", name,
				    rec_name(type));
			goto fail;
		}
		switch (type) {
		case IMG_REC_HEADER:
			if (img->hdr) {
				r = set_err(eb, -EBADMSG, "%s: second header record at offset %" PRIu64, name, off);
				goto fail;
			}
			img->hdr = gpucr__image_header__unpack(NULL, len, buf);
			if (!img->hdr) {
				r = set_err(eb, -EBADMSG, "%s: header record does not decode", name);
				goto fail;
			}
			break;
		case IMG_REC_BUFFER: {
			Gpucr__Buffer *b = gpucr__buffer__unpack(NULL, len, buf);

			if (!b) {
				r = set_err(eb, -EBADMSG, "%s: record %" PRIu32 " (buffer) does not decode",
					    name, nrec);
				goto fail;
			}
			r = add_buffer(img, b);
			if (r < 0) {
				gpucr__buffer__free_unpacked(b, NULL);
				set_err(eb, r, "out of memory");
				goto fail;
			}
			break;
		}
		case IMG_REC_TRAILER:
			img->trailer = gpucr__image_trailer__unpack(NULL, len, buf);
			if (!img->trailer) {
				r = set_err(eb, -EBADMSG, "%s: trailer record does not decode", name);
				goto fail;
			}
			break;
		default:
			/* Unknown record types from a newer writer of the same format
			 * version are skipped: the format only grows. */
			break;
		}
		free(buf);
		buf = NULL;
		off += sizeof(rh) + len;
		nrec++;
	}
	if (!img->hdr) {
		r = set_err(eb, -EBADMSG, "%s: no header record", name);
		goto fail;
	}
	if (img->hdr->pid != pid) {
		r = set_err(eb, -EBADMSG, "%s: header names pid %" PRIu32, name, img->hdr->pid);
		goto fail;
	}
	if (!img->trailer) {
		r = set_err(eb, -ENODATA, "%s: partial image: no trailer after %zu buffer records (the dump did not finish)",
			    name, img->nbuffers);
		goto fail;
	}
	if (img->trailer->buffer_count != img->nbuffers) {
		r = set_err(eb, -EBADMSG, "%s: %zu buffer records, the trailer says %" PRIu32, name,
			    img->nbuffers, img->trailer->buffer_count);
		goto fail;
	}
	img->npages = img->hdr->has_pages_files && img->hdr->pages_files > 1 ? img->hdr->pages_files : 1;
	if (img->npages > IMG_MAX_PAGES_FILES) {
		r = set_err(eb, -EBADMSG, "%s: %u pages files; at most %d are read", name, img->npages,
			    IMG_MAX_PAGES_FILES);
		img->npages = 0;
		goto fail;
	}
	for (unsigned k = 0; k < img->npages; k++) {
		img_pages_name_n(pname, sizeof(pname), pid, k);
		img->pages_fds[k] = openat(dirfd, pname, O_RDONLY | O_CLOEXEC);
		if (img->pages_fds[k] < 0) {
			r = set_err(eb, -errno, "%s: %s (the image's data file)", pname, strerror(errno));
			goto fail;
		}
	}
	img->pages_fd = img->pages_fds[0];
	r = check_pages(img, eb);
	if (r < 0)
		goto fail;
	close(fd);
	*ret = img;
	return 0;
fail:
	free(buf);
	close(fd);
	img_free(img);
	return r;
}

int img_read_chunk(const struct gpucr_image *img, const Gpucr__Buffer *b, size_t chunk_idx,
		   void *buf, struct img_errbuf *eb)
{
	const Gpucr__Chunk *c;
	uint64_t fp;
	int r;

	if (chunk_idx >= b->n_chunks)
		return set_err(eb, -EINVAL, "buffer 0x%" PRIx64 ": no chunk %zu", b->va, chunk_idx);
	c = b->chunks[chunk_idx];
	if (c->has_zero && c->zero) {
		memset(buf, 0, c->length);
	} else {
		r = img_read_full(img->pages_fds[c->has_file && c->file < img->npages ? c->file : 0], c->data_offset,
				  buf, c->length);
		if (r < 0)
			return set_err(eb, r, "buffer 0x%" PRIx64 ": chunk %zu: read: %s", b->va,
				       chunk_idx, strerror(-r));
	}
	if (img->hdr->has_fp_kind && img->hdr->fp_kind == GPUCR__FINGERPRINT_KIND__FP_MIX64_SUM_V1) {
		fp = fp_chunk(buf, c->length, 0);
		if (fp != c->fingerprint)
			return set_err(eb, -EBADMSG,
				       "pid %" PRIu32 ": buffer 0x%" PRIx64 " (%" PRIu64
				       " bytes): fingerprint mismatch in chunk %zu (offset %" PRIu64
				       "): the image is damaged",
				       img->pid, b->va, b->size, chunk_idx, c->offset);
	}
	return 0;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int img_list(int dirfd, uint32_t **ret, size_t *ret_n)
{
	return img_list_all(dirfd, 0, ret, ret_n);
}

int img_list_all(int dirfd, int with_partial, uint32_t **ret, size_t *ret_n)
{
	uint32_t *pids = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int fd;

	fd = dup(dirfd);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		const char *nm = de->d_name;
		unsigned long pid;
		char *end;
		int partial = 0;

		if (with_partial && nm[0] == '.') {
			nm++;
			partial = 1;
		}
		if (strncmp(nm, "gpucr-", 6) || !strncmp(nm, "gpucr-pages-", 12))
			continue;
		pid = strtoul(nm + 6, &end, 10);
		if (end == nm + 6 || strcmp(end, partial ? ".img.partial" : ".img") || pid > UINT32_MAX)
			continue;
		if (n == cap) {
			uint32_t *np;

			cap = cap ? cap * 2 : 8;
			np = realloc(pids, cap * sizeof(*np));
			if (!np) {
				free(pids);
				closedir(d);
				return -ENOMEM;
			}
			pids = np;
		}
		pids[n++] = (uint32_t)pid;
	}
	closedir(d);
	if (n)
		qsort(pids, n, sizeof(*pids), cmp_u32);
	*ret = pids;
	*ret_n = n;
	return 0;
}
