/* Pre-copy for migration (PreCopyRequest) against the test driver, with
 * this program playing an application and its shim, as daemon-dump does:
 * its memory is pre-copied while a thread keeps writing two chunks; then,
 * before the dump, a chunk changes that no round saw, a buffer is
 * allocated, and a pre-copied chunk is damaged in the pages file. The dump
 * must write exactly those at T (the figures say so, and the log names the
 * damaged chunk), the image must hold the memory at T chunk by chunk, and
 * a restore from it after a daemon restart must give back that memory word
 * by word. Then the fallbacks: a pre-copy made into another directory than
 * the dump's is dropped (everything written, no files left behind), and a
 * discarded one leaves nothing behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "daemontest.h"
#include "fakecuda.h"
#include "fakeshim.h"
#include "frame.h"
#include "image.h"

#define CHUNK (256u << 10)
#define NMAX 4
static const size_t sizes[NMAX] = { 4u << 20, 4u << 20, 2u << 20, 2u << 20 };
static int nbuf = 3;

static CUdeviceptr va[NMAX];
static CUmemGenericAllocationHandle handles[NMAX];
static uint8_t *expect[NMAX];
static int mapped;
static uint8_t uuid[16];
static sem_t reconnect_sem, resumed_sem;
static volatile int shim_quit, writer_stop;
static int shim_fd = -1;
static pthread_mutex_t send_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- the application's memory ------------------------------------------ */

static uint8_t pattern(int b, size_t i)
{
	if (b == 1 && i >= sizes[1] - 4 * CHUNK)
		return 0; /* its last four chunks are zero: not stored */
	return (uint8_t)(i * 7 + (size_t)b * 13 + (i >> 12) + 1) | 1;
}

static void map_one(int b, CUmemGenericAllocationHandle h)
{
	shim_map(va[b], sizes[b], h);
	handles[b] = h;
}

static void alloc_one(int b)
{
	CUmemGenericAllocationHandle h;
	size_t i;

	shim_alloc(&va[b], sizes[b], &h);
	map_one(b, h);
	for (i = 0; i < sizes[b]; i++)
		((uint8_t *)(uintptr_t)va[b])[i] = pattern(b, i);
}

static uint8_t *mem(int b)
{
	return (uint8_t *)(uintptr_t)va[b];
}

/* Words of chunk c of buffer b set to v. */
static void write_chunk(int b, size_t c, uint64_t v)
{
	uint64_t *w = (uint64_t *)(void *)(mem(b) + c * CHUNK);
	size_t i;

	for (i = 0; i < CHUNK / 8; i++)
		__atomic_store_n(&w[i], v + i, __ATOMIC_RELAXED);
}

/* The application at work: chunks 1 and 3 of buffer 0, again and again. */
static void *writer_main(void *arg)
{
	uint64_t n = 1;

	(void)arg;
	while (!writer_stop) {
		write_chunk(0, 1, n << 32);
		write_chunk(0, 3, (n << 32) | 0x5555);
		n++;
		usleep(200);
	}
	/* Its last writes, after every round: dirty at T for certain. */
	write_chunk(0, 1, 0xabcdef00000000ull);
	write_chunk(0, 3, 0x12345600000000ull);
	return NULL;
}

/* ---- the shim ---------------------------------------------------------- */

static int shim_connect(int restored)
{
	return shim_connect_as("daemon-precopy", restored);
}

/* The main thread reports a buffer too (step 2): one sender at a time. */
static void send_buffer(int fd, int b)
{
	pthread_mutex_lock(&send_lock);
	shim_send_buffer(fd, va[b], sizes[b], handles[b], uuid);
	pthread_mutex_unlock(&send_lock);
}

static void reply(int fd, uint64_t id, int err)
{
	pthread_mutex_lock(&send_lock);
	shim_reply(fd, id, err);
	pthread_mutex_unlock(&send_lock);
}

static void *shim_main(void *arg)
{
	int fd = shim_connect(0), rfds[FRAME_MAX_FDS], b;

	(void)arg;
	for (b = 0; b < nbuf; b++)
		send_buffer(fd, b);
	__atomic_store_n(&shim_fd, fd, __ATOMIC_RELEASE);
	while (!shim_quit) {
		Gpucr__Msg *req = NULL;
		unsigned nfds = 0, i;

		if (msg_recv(fd, &req, rfds, FRAME_MAX_FDS, &nfds) < 0) {
			close(fd);
			sem_wait(&reconnect_sem);
			if (shim_quit)
				return NULL;
			fd = shim_connect(!mapped);
			__atomic_store_n(&shim_fd, fd, __ATOMIC_RELEASE);
			continue;
		}
		switch (req->body_case) {
		case GPUCR__MSG__BODY_QUIESCE:
			reply(fd, req->id, 0);
			break;
		case GPUCR__MSG__BODY_RELEASE:
			for (b = 0; b < nbuf; b++)
				shim_unmap(va[b], sizes[b], handles[b]);
			mapped = 0;
			reply(fd, req->id, 0);
			close(fd);
			sem_wait(&reconnect_sem);
			if (shim_quit) {
				msg_free(req);
				return NULL;
			}
			fd = shim_connect(1);
			__atomic_store_n(&shim_fd, fd, __ATOMIC_RELEASE);
			break;
		case GPUCR__MSG__BODY_REMAP:
			REQUIRE(nfds == req->remap->n_buffers);
			for (i = 0; i < nfds; i++) {
				for (b = 0; b < nbuf; b++)
					if (va[b] == req->remap->buffers[i]->va)
						break;
				REQUIRE(b < nbuf);
				map_one(b, shim_import(rfds[i]));
			}
			mapped = 1;
			reply(fd, req->id, 0);
			break;
		case GPUCR__MSG__BODY_RESUME:
			reply(fd, req->id, 0);
			sem_post(&resumed_sem);
			break;
		default:
			reply(fd, req->id, -EOPNOTSUPP);
		}
		msg_free(req);
	}
	close(fd);
	return NULL;
}

/* ---- the daemon and its clients ---------------------------------------- */

static void start_daemon(const char *engine)
{
	daemon_pid = fork();
	REQUIRE(daemon_pid >= 0);
	if (daemon_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		setenv("GPUCR_DRIVER_LIBCUDA", fake_lib, 1);
		setenv("GPUCR_CHUNK_KB", "256", 1);
		setenv("GPUCR_STAGE_MB", "2", 1);
		setenv("GPUCR_IO_ENGINE", engine, 1);
		setenv("GPUCR_PAGES_FILES", "2", 1);
		/* A slow writer (per 2 MiB slice): the application's thread
		 * surely writes while its memory is being copied. */
		setenv("GPUCR_FI_SLICE_DELAY_MS", "5", 1);
		setenv("GPUCR_SHIM_TIMEOUT_MS", "5000", 1);
		setenv("GPUCR_LOG", "debug", 1);
		execl(daemon_bin, daemon_bin, "--socket", sockpath, "--log", logpath, (char *)NULL);
		_exit(127);
	}
	daemon_wait_up();
}

static Gpucr__Msg *precopy(int c, int dirfd, unsigned rounds, int discard)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__PreCopyRequest pr = GPUCR__PRE_COPY_REQUEST__INIT;

	pr.pid = (uint32_t)getpid();
	pr.has_max_rounds = 1;
	pr.max_rounds = rounds;
	pr.has_discard = discard;
	pr.discard = discard;
	m.body_case = GPUCR__MSG__BODY_PRE_COPY;
	m.pre_copy = &pr;
	return call(c, &m, dirfd);
}

/* A dump and its DumpWait: the DumpWait's reply. */
static Gpucr__Msg *dump(int c, int dirfd)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *r;
	Gpucr__DumpRequest d = GPUCR__DUMP_REQUEST__INIT;

	d.pid = (uint32_t)getpid();
	m.body_case = GPUCR__MSG__BODY_DUMP;
	m.dump = &d;
	r = call(c, &m, dirfd);
	if (r->err)
		fprintf(stderr, "dump: %s\n", r->err_msg);
	REQUIRE(r->err == 0);
	msg_free(r);
	CHECK(!mapped);
	r = dump_wait_for(c, (uint32_t)getpid());
	if (r->err)
		fprintf(stderr, "dump wait: %s\n", r->err_msg);
	REQUIRE(r->err == 0 && r->body_case == GPUCR__MSG__BODY_DUMP_REPLY);
	return r;
}

static void restore_from(int c, int dirfd, int expect_retained)
{
	Gpucr__Msg *r = restore_for(c, dirfd, (uint32_t)getpid(), 0);

	if (r->err)
		fprintf(stderr, "restore: %s\n", r->err_msg);
	REQUIRE(r->err == 0);
	CHECK_EQ_INT(r->restore_reply->from_retained, expect_retained);
	msg_free(r);
	sem_post(&reconnect_sem);
	REQUIRE(sem_wait(&resumed_sem) == 0);
	REQUIRE(mapped);
}

/* Memory now equals the expected state at T, word by word. */
static int memory_is_expected(void)
{
	int b;

	for (b = 0; b < nbuf; b++)
		if (memcmp(mem(b), expect[b], sizes[b])) {
			fprintf(stderr, "buffer %d differs from its state at T\n", b);
			return 0;
		}
	return 1;
}

/* The image holds every chunk as it was at T, checked against its
 * fingerprint (as gpucr inspect --verify does). */
static uint64_t image_is_expected(int dirfd)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb;
	uint8_t *buf = malloc(CHUNK);
	uint64_t stored = 0;
	size_t b, c;

	if (img_read(dirfd, (uint32_t)getpid(), &img, &eb) != 0) {
		fprintf(stderr, "image: %s\n", eb.msg);
		REQUIRE(0);
	}
	CHECK_EQ_INT(img->nbuffers, nbuf);
	for (b = 0; b < img->nbuffers; b++) {
		const Gpucr__Buffer *ib = img->buffers[b];
		int k;

		for (k = 0; k < nbuf; k++)
			if (va[k] == ib->va)
				break;
		REQUIRE(k < nbuf);
		for (c = 0; c < ib->n_chunks; c++) {
			int r = img_read_chunk(img, ib, c, buf, &eb);

			if (r)
				fprintf(stderr, "%s\n", eb.msg);
			CHECK_EQ_INT(r, 0);
			CHECK(memcmp(buf, expect[k] + ib->chunks[c]->offset, ib->chunks[c]->length) == 0);
			if (!(ib->chunks[c]->has_zero && ib->chunks[c]->zero))
				stored += ib->chunks[c]->length;
		}
	}
	img_free(img);
	free(buf);
	return stored;
}

static void snapshot_expected(void)
{
	int b;

	for (b = 0; b < nbuf; b++) {
		free(expect[b]);
		expect[b] = malloc(sizes[b]);
		REQUIRE(expect[b]);
		memcpy(expect[b], mem(b), sizes[b]);
	}
}

/* Files in dir whose name holds s. */
static int files_with(const char *dir, const char *s)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	REQUIRE(d);
	while ((e = readdir(d)))
		if (strstr(e->d_name, s))
			n++;
	closedir(d);
	return n;
}

int main(void)
{
	char dir[] = "/tmp/gpucr-precopy-XXXXXX", dir2[] = "/tmp/gpucr-precopy2-XXXXXX", p[700], *log;
	pthread_t shim, writer;
	Gpucr__Msg *r;
	uint64_t nonzero, expect_final, stored;
	int dirfd, dirfd2, c, lowest = 0, b, fd;

	daemon_paths("precopy");
	REQUIRE(mkdtemp(dir) && mkdtemp(dir2));
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dirfd2 = open(dir2, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	sem_init(&reconnect_sem, 0, 0);
	sem_init(&resumed_sem, 0, 0);

	shim_context(uuid);
	for (b = 0; b < nbuf; b++)
		alloc_one(b);
	mapped = 1;
	/* Buffer 1's last four chunks are zero: 36 chunks stored of 40. */
	nonzero = (sizes[0] + sizes[1] + sizes[2]) - 4 * CHUNK;
	/* The pre-copy lays buffers out by address: the lowest one's chunk 0
	 * is the first data block of the first pages file. The application
	 * never writes it (its thread writes chunks 1 and 3 of buffer 0). */
	for (b = 1; b < nbuf; b++)
		if (va[b] < va[lowest])
			lowest = b;

	start_daemon("parallel");
	REQUIRE(pthread_create(&shim, NULL, shim_main, NULL) == 0);
	while (__atomic_load_n(&shim_fd, __ATOMIC_ACQUIRE) < 0)
		usleep(1000);
	usleep(100000); /* let gpucrd take the buffers */
	c = cli();

	/* 1. pre-copy while the application writes chunks 1 and 3 of buffer 0. */
	REQUIRE(pthread_create(&writer, NULL, writer_main, NULL) == 0);
	r = precopy(c, dirfd, 3, 0);
	if (r->err)
		fprintf(stderr, "pre-copy: %s\n", r->err_msg);
	REQUIRE(r->err == 0 && r->body_case == GPUCR__MSG__BODY_PRE_COPY_REPLY);
	fprintf(stderr, "pre-copy: %llu bytes written, %u rounds, %llu dirty, %zu round figures\n",
		(unsigned long long)r->pre_copy_reply->copied_bytes, r->pre_copy_reply->rounds,
		(unsigned long long)r->pre_copy_reply->dirty_bytes, r->pre_copy_reply->n_round_dirty);
	CHECK_EQ_INT(r->pre_copy_reply->bytes, sizes[0] + sizes[1] + sizes[2]);
	/* Every non-zero chunk once, then the dirty ones again. */
	CHECK(r->pre_copy_reply->copied_bytes >= nonzero + 2 * CHUNK);
	CHECK(r->pre_copy_reply->rounds >= 1);
	/* What the rounds found dirty: the two chunks being written. */
	REQUIRE(r->pre_copy_reply->n_round_dirty >= 1);
	CHECK_EQ_INT(r->pre_copy_reply->round_dirty[0], 2 * CHUNK);
	CHECK(r->pre_copy_reply->dirty_bytes <= 2 * CHUNK);
	CHECK_EQ_INT(r->pre_copy_reply->copied_bytes, nonzero + (uint64_t)r->pre_copy_reply->rounds * 2 * CHUNK);
	msg_free(r);
	/* Its pages wait under their temporary names; no image yet. */
	CHECK(files_with(dir, ".gpucr-pages-") == 2);
	CHECK(files_with(dir, "gpucr-") == 3);
	writer_stop = 1;
	pthread_join(writer, NULL);

	/* 2. a write no round saw (no call announced it: only fingerprints
	 * can tell), and a buffer allocated after the pre-copy. */
	write_chunk(2, 5, 0x77770000ull);
	alloc_one(3);
	nbuf = 4;
	send_buffer(__atomic_load_n(&shim_fd, __ATOMIC_ACQUIRE), 3);
	usleep(100000);

	/* 3. a pre-copied chunk damaged in the pages file: not to be trusted. */
	snprintf(p, sizeof(p), "%s/.gpucr-pages-%d.img.partial", dir, (int)getpid());
	fd = open(p, O_RDWR);
	REQUIRE(fd >= 0);
	{
		uint8_t x;

		REQUIRE(pread(fd, &x, 1, 4096 + 100) == 1);
		CHECK_EQ_INT(x, pattern(lowest, 100));
		x ^= 0xff;
		REQUIRE(pwrite(fd, &x, 1, 4096 + 100) == 1);
	}
	close(fd);

	/* 4. the dump: only what changed since, what was damaged, and the new
	 * buffer are written at T. */
	snapshot_expected();
	r = dump(c, dirfd);
	fprintf(stderr, "dump: pre_copied %d, %llu written at T, %llu kept, final pass %.1f ms\n",
		r->dump_reply->pre_copied, (unsigned long long)r->dump_reply->final_bytes,
		(unsigned long long)r->dump_reply->reused_bytes, r->dump_reply->final_ns / 1e6);
	CHECK(r->dump_reply->pre_copied);
	expect_final = 2 * CHUNK /* the application's last writes */ + CHUNK /* the unseen write */ +
		       CHUNK /* the damaged chunk */ + sizes[3] /* the new buffer */;
	CHECK_EQ_INT(r->dump_reply->final_bytes, expect_final);
	CHECK_EQ_INT(r->dump_reply->reused_bytes, nonzero - 4 * CHUNK);
	CHECK_EQ_INT(r->dump_reply->stored_bytes, nonzero + sizes[3]);
	CHECK(r->dump_reply->precopy_rounds >= 1);
	CHECK(r->dump_reply->precopy_bytes >= nonzero);
	CHECK(r->dump_reply->final_ns > 0);
	msg_free(r);
	log = log_since(0);
	CHECK_CONTAINS(log, "does not read back as stored");
	CHECK_CONTAINS(log, "was not pre-copied (allocated since");
	free(log);
	CHECK(files_with(dir, ".partial") == 0);
	stored = image_is_expected(dirfd);
	CHECK_EQ_INT(stored, nonzero + sizes[3]);

	/* 5. restored from the image by a new gpucrd: the memory at T, word
	 * for word. */
	kill_daemon();
	start_daemon("uring");
	close(c);
	c = cli();
	restore_from(c, dirfd, 0);
	CHECK(memory_is_expected());

	/* 6. a pre-copy into another directory than the dump's: dropped, its
	 * files removed; the dump writes everything. */
	r = precopy(c, dirfd2, 2, 0);
	REQUIRE(r->err == 0);
	msg_free(r);
	CHECK(files_with(dir2, ".partial") == 3);
	write_chunk(0, 7, 0x4242000000ull);
	snapshot_expected();
	r = dump(c, dirfd);
	CHECK(!r->dump_reply->pre_copied);
	CHECK_EQ_INT(r->dump_reply->stored_bytes, nonzero + sizes[3]);
	msg_free(r);
	CHECK(files_with(dir2, "gpucr") == 0);
	log = log_since(0);
	CHECK_CONTAINS(log, "another directory than its dump's");
	free(log);
	CHECK_EQ_INT(image_is_expected(dirfd), nonzero + sizes[3]);
	restore_from(c, dirfd, 1);
	CHECK(memory_is_expected());

	/* 7. a discarded pre-copy leaves nothing behind. */
	r = precopy(c, dirfd2, 1, 0);
	REQUIRE(r->err == 0);
	msg_free(r);
	CHECK(files_with(dir2, ".partial") == 3);
	r = precopy(c, -1, 0, 1);
	CHECK_EQ_INT(r->err, 0);
	msg_free(r);
	CHECK(files_with(dir2, "gpucr") == 0);

	shim_quit = 1;
	sem_post(&reconnect_sem);
	kill_daemon();
	pthread_join(shim, NULL);
	close(c);
	snprintf(p, sizeof(p), "rm -rf %s %s", dir, dir2);
	REQUIRE(system(p) == 0);
	if (!t_failed && !getenv("GPUCR_TEST_KEEP"))
		unlink(logpath);
	else
		fprintf(stderr, "gpucrd's log: %s\n", logpath);
	return t_done();
}
