/* gpucr inspect: decodes the GPU images in a CRIU image directory, checks
 * them as a restore would, and prints them for people or (--json) machines. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "image.h"
#include "json.h"

void help_inspect(FILE *f)
{
	fprintf(f,
		"Usage: gpucr inspect [--pid PID] [--verify] [--json] DIR\n\n"
		"Decodes the GPU images (gpucr-<pid>.img, gpucr-pages-<pid>.img) in the CRIU\n"
		"image directory DIR and checks them as a restore would: format version,\n"
		"record checksums, completeness, and that the data file matches.\n\n"
		"  --pid PID   only the image of this process\n"
		"  --verify    also read every stored chunk and check its fingerprint\n"
		"  --json      one JSON object on stdout\n\n"
		"Exit status: 0 all images valid, 1 an image is damaged or incomplete (the\n"
		"reason is printed), 2 usage error.\n");
}

static const char *kind_name(int has, Gpucr__BufferKind k)
{
	if (!has)
		return "-";
	switch (k) {
	case GPUCR__BUFFER_KIND__BUF_ALLOC:
		return "alloc";
	case GPUCR__BUFFER_KIND__BUF_ASYNC:
		return "async";
	case GPUCR__BUFFER_KIND__BUF_APP_VMM:
		return "app-vmm";
	case GPUCR__BUFFER_KIND__BUF_SLAB:
		return "slab";
	default:
		return "-";
	}
}

static void uuid_str(char *buf, size_t len, const ProtobufCBinaryData *u)
{
	size_t i, n = 0;

	if (u->len != 16) {
		snprintf(buf, len, "?");
		return;
	}
	n += (size_t)snprintf(buf + n, len - n, "GPU-");
	for (i = 0; i < 16 && n < len; i++) {
		n += (size_t)snprintf(buf + n, len - n, "%02x", u->data[i]);
		if ((i == 3 || i == 5 || i == 7 || i == 9) && n < len)
			n += (size_t)snprintf(buf + n, len - n, "-");
	}
}

struct totals {
	uint64_t bytes, stored, zero, chunks;
};

static void sum(const struct gpucr_image *img, struct totals *t)
{
	size_t b, c;

	memset(t, 0, sizeof(*t));
	for (b = 0; b < img->nbuffers; b++) {
		t->bytes += img->buffers[b]->size;
		for (c = 0; c < img->buffers[b]->n_chunks; c++) {
			const Gpucr__Chunk *ch = img->buffers[b]->chunks[c];

			t->chunks++;
			if (ch->has_zero && ch->zero)
				t->zero += ch->length;
			else
				t->stored += ch->length;
		}
	}
}

/* Reads every chunk back and checks it; returns 0 or the first error. */
static int verify(const struct gpucr_image *img, struct img_errbuf *eb)
{
	uint64_t max = 0;
	size_t b, c;
	void *buf;
	int r = 0;

	for (b = 0; b < img->nbuffers; b++)
		for (c = 0; c < img->buffers[b]->n_chunks; c++)
			if (img->buffers[b]->chunks[c]->length > max)
				max = img->buffers[b]->chunks[c]->length;
	buf = malloc(max ? max : 1);
	if (!buf) {
		snprintf(eb->msg, sizeof(eb->msg), "out of memory");
		return -ENOMEM;
	}
	for (b = 0; b < img->nbuffers && !r; b++)
		for (c = 0; c < img->buffers[b]->n_chunks && !r; c++)
			r = img_read_chunk(img, img->buffers[b], c, buf, eb);
	free(buf);
	return r;
}

static void print_human(const struct gpucr_image *img, const char *dir)
{
	const Gpucr__ImageHeader *h = img->hdr;
	char b1[32], b2[32], b3[32], when[64] = "?";
	struct totals t;
	size_t i;

	sum(img, &t);
	if (h->has_created_unix_ns) {
		time_t s = (time_t)(h->created_unix_ns / 1000000000ull);
		struct tm tm;

		if (gmtime_r(&s, &tm))
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
	}
	printf("%s/gpucr-%" PRIu32 ".img: pid %" PRIu32 " (%s), format %" PRIu32 ", written %s by %s\n",
	       dir, img->pid, img->pid, h->comm ? h->comm : "?", h->format_version, when,
	       h->writer ? h->writer : "?");
	for (i = 0; i < h->n_devices; i++) {
		char u[64];

		uuid_str(u, sizeof(u), &h->devices[i]->uuid);
		printf("  device %" PRIu32 ": %s %s\n", h->devices[i]->ordinal,
		       h->devices[i]->name ? h->devices[i]->name : "?", u);
	}
	printf("  %zu buffers, %s; %s stored, %s zero (not stored); %" PRIu64 " chunks of %s\n",
	       img->nbuffers, cli_bytes(b1, sizeof(b1), t.bytes), cli_bytes(b2, sizeof(b2), t.stored),
	       cli_bytes(b3, sizeof(b3), t.zero), t.chunks,
	       cli_bytes((char[32]){ 0 }, 32, h->has_chunk_size ? h->chunk_size : 0));
	if (h->has_escaped && h->escaped)
		printf("  a GPU write of this process escaped prediction in a concurrent checkpoint: in its later "
		       "ones the functions it launched then wait until its memory is saved\n");
	if (img->nbuffers)
		printf("  %-18s %12s  %-8s %7s\n", "ADDRESS", "SIZE", "KIND", "CHUNKS");
	for (i = 0; i < img->nbuffers; i++) {
		const Gpucr__Buffer *b = img->buffers[i];

		printf("  0x%016" PRIx64 " %12s  %-8s %7zu\n", b->va, cli_bytes(b1, sizeof(b1), b->size),
		       kind_name(b->has_kind, b->kind), b->n_chunks);
	}
}

static void print_json(struct json *j, const struct gpucr_image *img)
{
	const Gpucr__ImageHeader *h = img->hdr;
	struct totals t;
	size_t i;

	sum(img, &t);
	json_obj_begin(j, NULL);
	json_u64(j, "pid", img->pid);
	json_str(j, "comm", h->comm);
	json_u64(j, "format_version", h->format_version);
	json_str(j, "writer", h->writer);
	json_bool(j, "escaped", h->has_escaped && h->escaped);
	json_u64(j, "created_unix_ns", h->has_created_unix_ns ? h->created_unix_ns : 0);
	json_u64(j, "chunk_size", h->has_chunk_size ? h->chunk_size : 0);
	json_u64(j, "bytes", t.bytes);
	json_u64(j, "stored_bytes", t.stored);
	json_u64(j, "zero_bytes", t.zero);
	json_u64(j, "pages_size", img->pages_size);
	json_arr_begin(j, "devices");
	for (i = 0; i < h->n_devices; i++) {
		char u[64];

		uuid_str(u, sizeof(u), &h->devices[i]->uuid);
		json_obj_begin(j, NULL);
		json_u64(j, "ordinal", h->devices[i]->ordinal);
		json_str(j, "name", h->devices[i]->name);
		json_str(j, "uuid", u);
		json_obj_end(j);
	}
	json_arr_end(j);
	json_arr_begin(j, "buffers");
	for (i = 0; i < img->nbuffers; i++) {
		const Gpucr__Buffer *b = img->buffers[i];

		json_obj_begin(j, NULL);
		json_hex(j, "va", b->va);
		json_u64(j, "size", b->size);
		json_u64(j, "device", b->device);
		json_str(j, "kind", kind_name(b->has_kind, b->kind));
		json_u64(j, "chunks", b->n_chunks);
		json_obj_end(j);
	}
	json_arr_end(j);
	json_obj_end(j);
}

int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "pid", required_argument, NULL, 'p' },
		{ "verify", no_argument, NULL, 'v' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int do_verify = 0, as_json = 0, bad = 0, c, dirfd;
	uint32_t *pids = NULL, one;
	long want = -1;
	struct json j;
	size_t n, i;
	char *end;

	while ((c = getopt_long(argc, argv, "p:vjh", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			want = strtol(optarg, &end, 10);
			if (*end || want <= 0)
				return cli_usage_error("inspect", "--pid takes a process id, not '%s'", optarg);
			break;
		case 'v':
			do_verify = 1;
			break;
		case 'j':
			as_json = 1;
			break;
		case 'h':
			help_inspect(stdout);
			return CLI_OK;
		default:
			return cli_usage_error("inspect", "unknown option");
		}
	}
	if (optind != argc - 1)
		return cli_usage_error("inspect", "expected one image directory");
	dirfd = open(argv[optind], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		fprintf(stderr, "gpucr inspect: %s: %s\n", argv[optind], strerror(errno));
		return CLI_FAIL;
	}
	if (want > 0) {
		one = (uint32_t)want;
		pids = &one;
		n = 1;
	} else if (img_list(dirfd, &pids, &n) < 0) {
		fprintf(stderr, "gpucr inspect: %s: cannot list: %s\n", argv[optind], strerror(errno));
		close(dirfd);
		return CLI_FAIL;
	}
	if (n == 0 && !as_json)
		printf("%s: no GPU images (gpucr-<pid>.img) in this directory\n", argv[optind]);
	if (as_json) {
		json_init(&j, stdout);
		json_obj_begin(&j, NULL);
		json_str(&j, "dir", argv[optind]);
		json_arr_begin(&j, "images");
	}
	for (i = 0; i < n; i++) {
		struct gpucr_image *img = NULL;
		struct img_errbuf eb = { "" };
		int r = img_read(dirfd, pids[i], &img, &eb);

		if (r == 0 && do_verify)
			r = verify(img, &eb);
		if (r < 0) {
			bad++;
			fprintf(stderr, "gpucr inspect: %s: %s\n", argv[optind], eb.msg);
			if (as_json) {
				json_obj_begin(&j, NULL);
				json_u64(&j, "pid", pids[i]);
				json_str(&j, "error", eb.msg);
				json_obj_end(&j);
			}
		} else if (as_json) {
			print_json(&j, img);
		} else {
			print_human(img, argv[optind]);
			if (do_verify)
				printf("  verified: every stored chunk matches its fingerprint\n");
		}
		img_free(img);
	}
	if (as_json) {
		json_arr_end(&j);
		json_obj_end(&j);
		json_end(&j);
	}
	if (pids != &one)
		free(pids);
	close(dirfd);
	return bad ? CLI_FAIL : CLI_OK;
}
