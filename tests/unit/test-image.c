/* GPU image files: a round trip, and every kind of damage a reader must
 * refuse with a message that names the problem. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fingerprint.h"
#include "image.h"
#include "t.h"

#define PID 4242
#define CHUNK (64u << 10)
#define NBUF 3

static char dir[] = "/tmp/gpucr-test-image-XXXXXX";
static struct img_writer *leftover; /* the writer of a "killed" dump */
static int dirfd_;
static uint8_t *data[NBUF];
static const uint64_t sizes[NBUF] = { 3 * CHUNK + 100, CHUNK, 2 * CHUNK };

static void fill(void)
{
	int b;
	uint64_t i;

	for (b = 0; b < NBUF; b++) {
		data[b] = calloc(1, sizes[b]);
		REQUIRE(data[b]);
		if (b == 1)
			continue; /* all zero: recorded, not stored */
		for (i = 0; i < sizes[b]; i++)
			data[b][i] = (uint8_t)(i * 31 + b);
	}
}

static unsigned nfiles = 1; /* pages files of the next image written */

/* Writes a complete image (or stops before commit when partial). */
static int write_image(int partial)
{
	Gpucr__ImageHeader hdr = GPUCR__IMAGE_HEADER__INIT;
	Gpucr__Device dev = GPUCR__DEVICE__INIT, *devs[1] = { &dev };
	uint8_t uuid[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	struct img_errbuf eb;
	struct img_writer *w;
	int b, r;

	dev.ordinal = 0;
	dev.uuid.data = uuid;
	dev.uuid.len = 16;
	hdr.n_devices = 1;
	hdr.devices = devs;
	hdr.has_chunk_size = 1;
	hdr.chunk_size = CHUNK;
	hdr.has_fp_kind = 1;
	hdr.fp_kind = GPUCR__FINGERPRINT_KIND__FP_MIX64_SUM_V1;
	hdr.comm = "trainer";
	hdr.has_pages_files = nfiles > 1;
	hdr.pages_files = nfiles;
	r = img_writer_open(dirfd_, PID, &hdr, &w, &eb);
	REQUIRE(r == 0);
	for (b = 0; b < NBUF; b++) {
		Gpucr__Buffer buf = GPUCR__BUFFER__INIT;
		Gpucr__Chunk chunks[8], *cp[8];
		uint64_t off;
		size_t n = 0;

		buf.va = 0x7f0000000000ull + (uint64_t)b * (16u << 20);
		buf.size = sizes[b];
		buf.device = 0;
		for (off = 0; off < sizes[b]; off += CHUNK, n++) {
			uint64_t len = sizes[b] - off < CHUNK ? sizes[b] - off : CHUNK;
			Gpucr__Chunk c = GPUCR__CHUNK__INIT;

			c.offset = off;
			c.length = len;
			c.fingerprint = fp_chunk(data[b] + off, len, 0);
			if (fp_is_zero(data[b] + off, len)) {
				c.has_zero = c.zero = 1;
			} else {
				unsigned f = (unsigned)(n % img_writer_files(w));

				c.has_data_offset = 1;
				c.has_file = f != 0;
				c.file = f;
				c.data_offset = img_writer_reserve_in(w, f, len);
				REQUIRE(pwrite(img_writer_pages_fd_n(w, f), data[b] + off, len, (off_t)c.data_offset) ==
					(ssize_t)len);
			}
			chunks[n] = c;
			cp[n] = &chunks[n];
		}
		buf.n_chunks = n;
		buf.chunks = cp;
		REQUIRE(img_writer_add_buffer(w, &buf, &eb) == 0);
	}
	if (partial) {
		/* A dump killed here leaves only the temporary files. */
		leftover = w;
		return 0;
	}
	r = img_writer_commit(w, NULL, &eb);
	if (r)
		fprintf(stderr, "commit: %s\n", eb.msg);
	return r;
}

static void clean(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -f %s/gpucr-* %s/.gpucr-*", dir, dir);
	REQUIRE(system(cmd) == 0);
}

static void path(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

static void test_round_trip(void)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb;
	uint32_t *pids;
	size_t n, b, c;
	uint8_t *out;

	clean();
	REQUIRE(write_image(0) == 0);
	CHECK_EQ_INT(img_list(dirfd_, &pids, &n), 0);
	CHECK_EQ_INT(n, 1);
	if (n == 1)
		CHECK_EQ_INT(pids[0], PID);
	free(pids);
	CHECK_EQ_INT(faccessat(dirfd_, ".gpucr-4242.img.partial", F_OK, 0), -1);
	if (img_read(dirfd_, PID, &img, &eb)) {
		fprintf(stderr, "read: %s\n", eb.msg);
		REQUIRE(0);
	}
	CHECK_EQ_INT(img->nbuffers, NBUF);
	CHECK_EQ_INT(img->hdr->pid, PID);
	CHECK_EQ_INT(img->hdr->format_version, IMG_FORMAT_VERSION);
	CHECK(strcmp(img->hdr->comm, "trainer") == 0);
	CHECK_EQ_INT(img->hdr->n_devices, 1);
	CHECK_EQ_INT(img->trailer->buffer_count, NBUF);
	/* The zero buffer takes no room in the pages file. */
	CHECK_EQ_INT(img->pages_size, IMG_PAGES_HEADER + 3 * CHUNK + IMG_ALIGN + 2 * CHUNK);
	out = malloc(CHUNK);
	for (b = 0; b < img->nbuffers; b++) {
		const Gpucr__Buffer *buf = img->buffers[b];

		CHECK_EQ_INT(buf->size, sizes[b]);
		for (c = 0; c < buf->n_chunks; c++) {
			CHECK_EQ_INT(img_read_chunk(img, buf, c, out, &eb), 0);
			CHECK(memcmp(out, data[b] + buf->chunks[c]->offset, buf->chunks[c]->length) == 0);
			if (buf->chunks[c]->has_data_offset)
				CHECK_EQ_INT(buf->chunks[c]->data_offset % IMG_ALIGN, 0);
		}
	}
	free(out);
	img_free(img);
}

/* Reads the image expecting failure with err and a message containing what. */
static void expect_refused(int err, const char *what)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb = { "" };
	int r = img_read(dirfd_, PID, &img, &eb);

	CHECK_EQ_INT(r, err);
	CHECK(img == NULL);
	CHECK_CONTAINS(eb.msg, what);
	if (r == 0)
		img_free(img);
}

static void corrupt_byte(const char *name, off_t off)
{
	char p[256];
	uint8_t c;
	int fd;

	path(p, sizeof(p), name);
	fd = open(p, O_RDWR);
	REQUIRE(fd >= 0);
	REQUIRE(pread(fd, &c, 1, off) == 1);
	c ^= 0x40;
	REQUIRE(pwrite(fd, &c, 1, off) == 1);
	close(fd);
}

static off_t file_size(const char *name)
{
	char p[256];
	struct stat st;

	path(p, sizeof(p), name);
	REQUIRE(stat(p, &st) == 0);
	return st.st_size;
}

static void truncate_to(const char *name, off_t len)
{
	char p[256];

	path(p, sizeof(p), name);
	REQUIRE(truncate(p, len) == 0);
}

static void test_damaged_record(void)
{
	clean();
	REQUIRE(write_image(0) == 0);
	corrupt_byte("gpucr-4242.img", 16 + 12 + 3); /* inside the header record */
	expect_refused(-EBADMSG, "damaged (checksum mismatch)");
}

static void test_truncated_image(void)
{
	clean();
	REQUIRE(write_image(0) == 0);
	truncate_to("gpucr-4242.img", file_size("gpucr-4242.img") - 5);
	expect_refused(-EBADMSG, "truncated");
}

static void test_missing_trailer(void)
{
	Gpucr__ImageTrailer dummy = GPUCR__IMAGE_TRAILER__INIT;
	size_t tlen;
	uint8_t buf[64];

	/* Cut exactly the trailer record off: what a crash between the last
	 * buffer and the trailer would leave if it were ever renamed. */
	clean();
	REQUIRE(write_image(0) == 0);
	dummy.buffer_count = NBUF;
	dummy.pages_size = (uint64_t)file_size("gpucr-pages-4242.img");
	dummy.n_pages_sizes = 1;
	dummy.pages_sizes = &dummy.pages_size;
	tlen = gpucr__image_trailer__pack(&dummy, buf);
	truncate_to("gpucr-4242.img", file_size("gpucr-4242.img") - 12 - (off_t)tlen);
	expect_refused(-ENODATA, "partial image: no trailer");
}

static void test_partial_left_by_killed_dump(void)
{
	clean();
	REQUIRE(write_image(1) == 0);
	expect_refused(-ENODATA, "did not finish");
	img_writer_abort(leftover);
	leftover = NULL;
}

static void test_pages_truncated(void)
{
	clean();
	REQUIRE(write_image(0) == 0);
	truncate_to("gpucr-pages-4242.img", file_size("gpucr-pages-4242.img") - 4096);
	expect_refused(-EBADMSG, "truncated");
}

static void test_pages_missing(void)
{
	clean();
	REQUIRE(write_image(0) == 0);
	REQUIRE(unlinkat(dirfd_, "gpucr-pages-4242.img", 0) == 0);
	expect_refused(-ENOENT, "gpucr-pages-4242.img");
}

static void test_pages_from_other_dump(void)
{
	clean();
	REQUIRE(write_image(0) == 0);
	REQUIRE(renameat(dirfd_, "gpucr-pages-4242.img", dirfd_, "keep") == 0);
	REQUIRE(write_image(0) == 0);
	REQUIRE(renameat(dirfd_, "keep", dirfd_, "gpucr-pages-4242.img") == 0);
	expect_refused(-EBADMSG, "another dump");
}

static void test_chunk_corrupted(void)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb = { "" };
	uint8_t *out = malloc(CHUNK);

	clean();
	REQUIRE(write_image(0) == 0);
	/* Buffer 0, chunk 2 lives at header + 2 chunks. */
	corrupt_byte("gpucr-pages-4242.img", IMG_PAGES_HEADER + 2 * CHUNK + 77);
	REQUIRE(img_read(dirfd_, PID, &img, &eb) == 0);
	CHECK_EQ_INT(img_read_chunk(img, img->buffers[0], 1, out, &eb), 0);
	CHECK_EQ_INT(img_read_chunk(img, img->buffers[0], 2, out, &eb), -EBADMSG);
	CHECK_CONTAINS(eb.msg, "fingerprint mismatch in chunk 2");
	CHECK_CONTAINS(eb.msg, "buffer 0x7f0000000000");
	img_free(img);
	free(out);
}

static void test_newer_version(void)
{
	uint8_t v = IMG_FORMAT_VERSION + 1;
	char p[256];
	int fd;

	clean();
	REQUIRE(write_image(0) == 0);
	path(p, sizeof(p), "gpucr-4242.img");
	fd = open(p, O_RDWR);
	REQUIRE(fd >= 0 && pwrite(fd, &v, 1, 8) == 1);
	close(fd);
	expect_refused(-EPROTONOSUPPORT, "newer gpucr");
}

static void test_not_an_image(void)
{
	char p[256];
	int fd;

	clean();
	path(p, sizeof(p), "gpucr-4242.img");
	fd = open(p, O_CREAT | O_WRONLY, 0600);
	REQUIRE(fd >= 0 && write(fd, "hello world, not an image", 25) == 25);
	close(fd);
	expect_refused(-EBADMSG, "bad magic");
}

static void test_abort_leaves_nothing(void)
{
	Gpucr__ImageHeader hdr = GPUCR__IMAGE_HEADER__INIT;
	struct img_writer *w;
	struct img_errbuf eb;
	uint32_t *pids;
	size_t n;

	clean();
	REQUIRE(img_writer_open(dirfd_, PID, &hdr, &w, &eb) == 0);
	img_writer_abort(w);
	CHECK_EQ_INT(faccessat(dirfd_, ".gpucr-4242.img.partial", F_OK, 0), -1);
	CHECK_EQ_INT(faccessat(dirfd_, ".gpucr-pages-4242.img.partial", F_OK, 0), -1);
	CHECK_EQ_INT(img_list(dirfd_, &pids, &n), 0);
	CHECK_EQ_INT(n, 0);
	free(pids);
}

/* Several pages files: a round trip, and each file checked on its own. */
static void test_several_files(void)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb;
	uint8_t *out = malloc(CHUNK);
	size_t b, c;

	nfiles = 3;
	clean();
	REQUIRE(write_image(0) == 0);
	CHECK_EQ_INT(faccessat(dirfd_, "gpucr-pages-4242.1.img", F_OK, 0), 0);
	CHECK_EQ_INT(faccessat(dirfd_, "gpucr-pages-4242.2.img", F_OK, 0), 0);
	REQUIRE(img_read(dirfd_, PID, &img, &eb) == 0);
	CHECK_EQ_INT(img->npages, 3);
	for (b = 0; b < img->nbuffers; b++)
		for (c = 0; c < img->buffers[b]->n_chunks; c++) {
			const Gpucr__Chunk *ch = img->buffers[b]->chunks[c];

			CHECK_EQ_INT(img_read_chunk(img, img->buffers[b], c, out, &eb), 0);
			CHECK(memcmp(out, data[b] + ch->offset, ch->length) == 0);
		}
	img_free(img);

	/* One of them missing, truncated, or swapped with another. */
	REQUIRE(renameat(dirfd_, "gpucr-pages-4242.2.img", dirfd_, "keep") == 0);
	expect_refused(-ENOENT, "gpucr-pages-4242.2.img");
	REQUIRE(renameat(dirfd_, "keep", dirfd_, "gpucr-pages-4242.2.img") == 0);
	REQUIRE(renameat(dirfd_, "gpucr-pages-4242.1.img", dirfd_, "keep") == 0);
	REQUIRE(renameat(dirfd_, "gpucr-pages-4242.2.img", dirfd_, "gpucr-pages-4242.1.img") == 0);
	REQUIRE(renameat(dirfd_, "keep", dirfd_, "gpucr-pages-4242.2.img") == 0);
	expect_refused(-EBADMSG, "is pages file 2 of 3, expected 1 of 3");
	clean();
	REQUIRE(write_image(0) == 0);
	truncate_to("gpucr-pages-4242.2.img", file_size("gpucr-pages-4242.2.img") - 4096);
	expect_refused(-EBADMSG, "gpucr-pages-4242.2.img: truncated");
	nfiles = 1;
	free(out);
}

int main(void)
{
	int b;

	REQUIRE(mkdtemp(dir));
	dirfd_ = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	REQUIRE(dirfd_ >= 0);
	fill();
	test_round_trip();
	test_damaged_record();
	test_truncated_image();
	test_missing_trailer();
	test_partial_left_by_killed_dump();
	test_pages_truncated();
	test_pages_missing();
	test_pages_from_other_dump();
	test_chunk_corrupted();
	test_newer_version();
	test_not_an_image();
	test_abort_leaves_nothing();
	test_several_files();
	clean();
	rmdir(dir);
	for (b = 0; b < NBUF; b++)
		free(data[b]);
	return t_done();
}
