/* GPU image files (proto/image.proto): writer and reader.
 *
 * gpucr-<pid>.img holds an 16-byte file header (magic "GPUCRIMG", u32 format
 * version, u32 zero) and framed records: u32 type, u32 length, u32 crc32c of
 * the payload, then the protobuf payload. Records: one ImageHeader, any
 * number of Buffer, one ImageTrailer last. gpucr-pages-<pid>.img starts with
 * a 4 KiB header block (magic "GPUCRPGS", version, pid, image id) and holds
 * chunk data at 4 KiB-aligned offsets, so it can be written with O_DIRECT.
 *
 * Both files are written as ".gpucr-<pid>.img.partial" and
 * ".gpucr-pages-<pid>.img.partial", fsync'd, and renamed (pages first, then
 * the image) when complete; an image whose trailer is missing, whose records
 * fail their checksums, or whose pages file does not match is refused with a
 * message saying which. Nothing here logs; errors come back as -errno with
 * the message in the caller's img_errbuf. */
#ifndef GPUCR_IMAGE_H
#define GPUCR_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/image.pb-c.h"

#define IMG_MAGIC "GPUCRIMG"
#define IMG_PAGES_MAGIC "GPUCRPGS"
#define IMG_FORMAT_VERSION 1
#define IMG_ALIGN 4096u
#define IMG_PAGES_HEADER IMG_ALIGN
/* Largest record payload a reader accepts (a Buffer with many chunks). */
#define IMG_RECORD_MAX (64u << 20)
/* Most pages files one image may have. */
#define IMG_MAX_PAGES_FILES 64

enum img_record_type {
	IMG_REC_HEADER = 1,
	IMG_REC_BUFFER = 2,
	IMG_REC_TRAILER = 3,
};

struct img_errbuf {
	char msg[512];
};

/* len bytes at off of fd (EINTR retried): 0, -ENODATA at the end of the
 * file, or -errno. */
int img_read_full(int fd, uint64_t off, void *buf, size_t len);

/* ---- writing ---------------------------------------------------------- */

struct img_writer;

/* Starts an image for pid in the directory dirfd (not taken over): creates
 * both files under their temporary names (replacing leftovers of an earlier
 * failed dump), writes the header record and the pages header block. The
 * record gets format_version, pid and (unless hdr has a 16-byte one) a fresh
 * random image_id; hdr itself is not changed. */
int img_writer_open(int dirfd, uint32_t pid, Gpucr__ImageHeader *hdr, struct img_writer **ret,
		    struct img_errbuf *eb);

/* Writes the header record again, from hdr (format version, pid, the image
 * id and the number of pages files stay those of the open), dropping the
 * one written before: for an image whose pages were written ahead of its
 * records (a pre-copy), whose header is only known at T. Only before the
 * first img_writer_add_buffer (-EBUSY after). */
int img_writer_reheader(struct img_writer *w, const Gpucr__ImageHeader *hdr, struct img_errbuf *eb);

/* Reserves len bytes of chunk data, rounded up to IMG_ALIGN, and returns the
 * file offset where they go (IMG_ALIGN aligned), in the first pages file or
 * in pages file `file`. Thread-safe. */
uint64_t img_writer_reserve(struct img_writer *w, uint64_t len);
uint64_t img_writer_reserve_in(struct img_writer *w, unsigned file, uint64_t len);
/* How many pages files (hdr->pages_files at open, default 1). */
unsigned img_writer_files(const struct img_writer *w);

/* A pages file opened O_RDWR (owned by the writer), for pwrite; and a new
 * fd of it opened O_DIRECT, owned by the caller, for io_uring. Without _n:
 * the first file. */
int img_writer_pages_fd(struct img_writer *w);
int img_writer_pages_fd_n(struct img_writer *w, unsigned file);
int img_writer_open_pages_direct(struct img_writer *w);
int img_writer_open_pages_direct_n(struct img_writer *w, unsigned file);

/* pwrite of chunk data at an offset from img_writer_reserve. */
int img_writer_write_pages(struct img_writer *w, uint64_t off, const void *buf, size_t len);

/* Appends a Buffer record; its chunks' data must be (or be about to be)
 * written at their data_offset. */
int img_writer_add_buffer(struct img_writer *w, const Gpucr__Buffer *b, struct img_errbuf *eb);

/* Writes the trailer (filling buffer_count and pages_size), fsyncs both files,
 * renames them into place and fsyncs the directory. Frees w whatever the
 * outcome; on failure the temporary files are removed and no image that looks
 * complete is left behind. stats may be NULL. */
int img_writer_commit(struct img_writer *w, const Gpucr__ImageTrailer *stats, struct img_errbuf *eb);

/* Removes the temporary files and frees w. Accepts NULL. */
void img_writer_abort(struct img_writer *w);

/* ---- reading ---------------------------------------------------------- */

struct gpucr_image {
	uint32_t pid;
	Gpucr__ImageHeader *hdr;
	Gpucr__Buffer **buffers;
	size_t nbuffers;
	Gpucr__ImageTrailer *trailer;
	int pages_fd;                 /* the first pages file, O_RDONLY, owned by the image */
	uint64_t pages_size;          /* all pages files together */
	unsigned npages;              /* pages files */
	int pages_fds[IMG_MAX_PAGES_FILES];
	uint64_t pages_sizes[IMG_MAX_PAGES_FILES];
};

/* Reads and checks gpucr-<pid>.img and its pages file in dirfd: magic,
 * version, every record's checksum, the trailer, buffer count, the pages
 * file's header, size and image id, and that every chunk lies inside it. */
int img_read(int dirfd, uint32_t pid, struct gpucr_image **ret, struct img_errbuf *eb);
void img_free(struct gpucr_image *img);

/* Reads one chunk's bytes into buf (chunk->length bytes; zero chunks are
 * zero-filled) and checks its fingerprint: a mismatch is -EBADMSG with the
 * buffer's address and the chunk's index in the message. */
int img_read_chunk(const struct gpucr_image *img, const Gpucr__Buffer *b, size_t chunk_idx,
		   void *buf, struct img_errbuf *eb);

/* Pids of the images in dirfd (gpucr-<pid>.img), sorted. *ret is malloc'd. */
int img_list(int dirfd, uint32_t **ret, size_t *ret_n);
/* The same, with with_partial also the images still being written
 * (.gpucr-<pid>.img.partial); a pid may then appear twice. */
int img_list_all(int dirfd, int with_partial, uint32_t **ret, size_t *ret_n);

/* File names, for messages and tools. */
void img_name(char *buf, size_t len, uint32_t pid);
void img_pages_name(char *buf, size_t len, uint32_t pid);
void img_pages_name_n(char *buf, size_t len, uint32_t pid, unsigned k);

#endif
