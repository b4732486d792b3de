/* Writes a sample GPU image (as a dump would) into a directory, for tests of
 * the tools that read images: mkimage DIR PID. Three buffers, one of them
 * all zero, 64 KiB chunks, a fake H200 device. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fingerprint.h"
#include "image.h"

int main(int argc, char **argv)
{
	static const uint64_t sizes[] = { (3u << 16) + 100, 1u << 16, 2u << 16 };
	uint8_t uuid[16] = { 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
	Gpucr__ImageHeader hdr = GPUCR__IMAGE_HEADER__INIT;
	Gpucr__Device dev = GPUCR__DEVICE__INIT, *devs[1] = { &dev };
	const uint64_t chunk = 1u << 16;
	struct img_errbuf eb;
	struct img_writer *w;
	int dirfd, b;

	if (argc != 3)
		return 2;
	dirfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return 1;
	dev.uuid.data = uuid;
	dev.uuid.len = 16;
	dev.name = "NVIDIA H200";
	hdr.n_devices = 1;
	hdr.devices = devs;
	hdr.comm = "sample";
	hdr.writer = "gpucr mkimage";
	hdr.has_chunk_size = 1;
	hdr.chunk_size = chunk;
	hdr.has_fp_kind = 1;
	hdr.fp_kind = GPUCR__FINGERPRINT_KIND__FP_MIX64_SUM_V1;
	if (img_writer_open(dirfd, (uint32_t)atoi(argv[2]), &hdr, &w, &eb)) {
		fprintf(stderr, "%s\n", eb.msg);
		return 1;
	}
	for (b = 0; b < 3; b++) {
		Gpucr__Buffer buf = GPUCR__BUFFER__INIT;
		Gpucr__Chunk ch[4], *cp[4];
		uint8_t *data = calloc(1, sizes[b]);
		uint64_t off, i;
		size_t n = 0;

		for (i = 0; b != 1 && i < sizes[b]; i++)
			data[i] = (uint8_t)(i * 13 + b);
		buf.va = 0x7f2a00000000ull + ((uint64_t)b << 21);
		buf.size = sizes[b];
		buf.has_kind = 1;
		buf.kind = GPUCR__BUFFER_KIND__BUF_ALLOC;
		for (off = 0; off < sizes[b]; off += chunk, n++) {
			uint64_t len = sizes[b] - off < chunk ? sizes[b] - off : chunk;

			gpucr__chunk__init(&ch[n]);
			ch[n].offset = off;
			ch[n].length = len;
			ch[n].fingerprint = fp_chunk(data + off, len, 0);
			if (fp_is_zero(data + off, len)) {
				ch[n].has_zero = ch[n].zero = 1;
			} else {
				ch[n].has_data_offset = 1;
				ch[n].data_offset = img_writer_reserve(w, len);
				if (img_writer_write_pages(w, ch[n].data_offset, data + off, len))
					return 1;
			}
			cp[n] = &ch[n];
		}
		buf.n_chunks = n;
		buf.chunks = cp;
		if (img_writer_add_buffer(w, &buf, &eb))
			return 1;
		free(data);
	}
	if (img_writer_commit(w, NULL, &eb)) {
		fprintf(stderr, "%s\n", eb.msg);
		return 1;
	}
	return 0;
}
