/* gpucrd's dump and restore paths against the test driver, with this
 * program playing an application and its shim (a thread speaking protocol
 * v1): buffers handed over, quiesce, release (afterwards this process holds
 * no device memory), the image written and correct, zero-copy restore from
 * retained memory, restore from the image after a daemon restart, a
 * damaged or truncated image refused with a message naming the problem, a
 * second dump while one runs refused, another uid refused, a full disk
 * giving an error and no image that looks complete; with
 * GPUCR_WRITE_AFTER_DRIVER=1, the image write of a dump nothing waits for
 * held back until the driver's checkpoint (this program plays the CRIU
 * plugin), or a DumpWait, or the timeout when no driver call comes; the
 * bounds on waits for a peer: a shim that stops answering the quiesce, the
 * release or the remap (the requester told within GPUCR_SHIM_TIMEOUT_MS,
 * the process's memory intact and back in place once it runs again), and a
 * driver checkpoint slower than GPUCR_DRIVER_TIMEOUT_MS (answered in time,
 * later calls for the pid refused, the late checkpoint undone). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
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

#define NBUF 3
static const size_t sizes[NBUF] = { 2u << 20, 6u << 20, 4u << 20 };

static CUdeviceptr va[NBUF];
static CUmemGenericAllocationHandle handles[NBUF];
static int mapped;
static uint8_t uuid[16];

static sem_t reconnect_sem, resumed_sem, stalled_sem, unstall_sem;
static volatile int slow_quiesce, shim_quit;
/* A request kind the shim stops at, as if its control thread were stopped,
 * until unstall_sem: once (0: none). */
static volatile int stall_on;

/* ---- the application's memory ------------------------------------------ */

static uint8_t pattern(int b, size_t i)
{
	if (b == 1 && (i < (4u << 20) || i >= (4u << 20) + 100))
		return 0; /* mostly zero: two of three chunks are not stored */
	return (uint8_t)(i * 7 + (size_t)b * 13 + (i >> 12));
}

static void fill(void)
{
	int b;
	size_t i;

	for (b = 0; b < NBUF; b++)
		for (i = 0; i < sizes[b]; i++)
			((uint8_t *)(uintptr_t)va[b])[i] = pattern(b, i);
}

static int check_pattern(void)
{
	int b;
	size_t i;

	for (b = 0; b < NBUF; b++)
		for (i = 0; i < sizes[b]; i++)
			if (((uint8_t *)(uintptr_t)va[b])[i] != pattern(b, i)) {
				fprintf(stderr, "buffer %d byte %zu differs\n", b, i);
				return 0;
			}
	return 1;
}

static void map_one(int b, CUmemGenericAllocationHandle h)
{
	shim_map(va[b], sizes[b], h);
	handles[b] = h;
}

static void alloc_all(void)
{
	int b;

	shim_context(uuid);
	for (b = 0; b < NBUF; b++) {
		CUmemGenericAllocationHandle h;

		shim_alloc(&va[b], sizes[b], &h);
		map_one(b, h);
	}
	mapped = 1;
	fill();
}

/* ---- the shim ---------------------------------------------------------- */

static int shim_connect(int restored)
{
	return shim_connect_as("daemon-dump", restored);
}

static void send_buffers(int fd)
{
	int b;

	for (b = 0; b < NBUF; b++)
		shim_send_buffer(fd, va[b], sizes[b], handles[b], uuid);
}

static void *shim_main(void *arg)
{
	int fd = shim_connect(0), rfds[FRAME_MAX_FDS];

	(void)arg;
	send_buffers(fd);
	while (!shim_quit) {
		Gpucr__Msg *req = NULL;
		unsigned nfds = 0, i;
		int r = msg_recv(fd, &req, rfds, FRAME_MAX_FDS, &nfds);

		if (r < 0) {
			/* daemon gone, or it cut this connection off: wait to be
			 * told to reconnect; as restored while the memory is not
			 * mapped, else as running, reporting the buffers again. */
			close(fd);
			sem_wait(&reconnect_sem);
			if (shim_quit)
				break;
			fd = shim_connect(!mapped);
			if (mapped)
				send_buffers(fd);
			continue;
		}
		if (stall_on && (int)req->body_case == stall_on) {
			stall_on = 0;
			sem_post(&stalled_sem);
			sem_wait(&unstall_sem);
		}
		switch (req->body_case) {
		case GPUCR__MSG__BODY_QUIESCE:
			if (slow_quiesce)
				usleep(300000);
			shim_reply(fd, req->id, 0);
			break;
		case GPUCR__MSG__BODY_RELEASE: {
			int b;

			for (b = 0; b < NBUF; b++)
				shim_unmap(va[b], sizes[b], handles[b]);
			mapped = 0;
			shim_reply(fd, req->id, 0);
			close(fd);
			sem_wait(&reconnect_sem);
			if (shim_quit) {
				msg_free(req);
				goto out;
			}
			fd = shim_connect(1);
			break;
		}
		case GPUCR__MSG__BODY_REMAP:
			REQUIRE(nfds == req->remap->n_buffers);
			for (i = 0; i < nfds; i++) {
				int b;

				for (b = 0; b < NBUF; b++)
					if (va[b] == req->remap->buffers[i]->va)
						break;
				REQUIRE(b < NBUF);
				REQUIRE(req->remap->buffers[i]->phys_size == sizes[b]);
				map_one(b, shim_import(rfds[i]));
			}
			mapped = 1;
			shim_reply(fd, req->id, 0);
			break;
		case GPUCR__MSG__BODY_RESUME:
			shim_reply(fd, req->id, 0);
			sem_post(&resumed_sem);
			break;
		default:
			shim_reply(fd, req->id, -EOPNOTSUPP);
		}
		msg_free(req);
	}
out:
	close(fd);
	return NULL;
}

/* ---- the daemon and its clients ---------------------------------------- */

/* Each daemon start alternates the image engine: both get exercised. */
static int starts;

static void start_daemon(void)
{
	starts++;
	daemon_pid = fork();
	REQUIRE(daemon_pid >= 0);
	if (daemon_pid == 0) {
		/* A test that stops early must not leave its daemon behind. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		setenv("GPUCR_DRIVER_LIBCUDA", fake_lib, 1);
		setenv("GPUCR_CHUNK_KB", "2048", 1);
		setenv("GPUCR_STAGE_MB", "4", 1);
		setenv("GPUCR_IO_ENGINE", starts % 2 ? "parallel" : "uring", 1);
		/* several pages files with the parallel engine, one with io_uring */
		setenv("GPUCR_PAGES_FILES", starts % 2 ? "3" : "1", 1);
		/* the second daemon keeps no dumped memory at all */
		if (starts == 2)
			setenv("GPUCR_RETAIN_MAX_MB", "0", 1);
		else
			unsetenv("GPUCR_RETAIN_MAX_MB");
		/* Holds only dumps that say nothing waits for their image (step 9);
		 * the log (debug: timestamps) shows when each write started. */
		setenv("GPUCR_WRITE_AFTER_DRIVER", "1", 1);
		setenv("GPUCR_WRITE_AFTER_DRIVER_TIMEOUT_MS", "1000", 1);
		/* Small bounds, so that step 10 is quick: the quiesce allows
		 * its drain time plus this, the release the same. */
		setenv("GPUCR_SHIM_TIMEOUT_MS", "1000", 1);
		setenv("GPUCR_LOG", "debug", 1);
		execl(daemon_bin, daemon_bin, "--socket", sockpath, "--log", logpath, (char *)NULL);
		_exit(127);
	}
	daemon_wait_up();
}

static pid_t app_pid;

/* A dump whose quiesce gives the shim drain_ms (0: the default). */
static Gpucr__Msg *dump_drain(int fd, int dirfd, unsigned drain_ms)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__DumpRequest d = GPUCR__DUMP_REQUEST__INIT;

	d.pid = (uint32_t)app_pid;
	d.has_timeout_ms = drain_ms != 0;
	d.timeout_ms = drain_ms;
	m.body_case = GPUCR__MSG__BODY_DUMP;
	m.dump = &d;
	return call(fd, &m, dirfd);
}

static Gpucr__Msg *dump(int fd, int dirfd)
{
	return dump_drain(fd, dirfd, 0);
}

/* A dump that nothing waits for (GPUCR_IMAGE_WAIT=0 in the plugin). */
static Gpucr__Msg *dump_background(int fd, int dirfd, int leave_running)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__DumpRequest d = GPUCR__DUMP_REQUEST__INIT;

	d.pid = (uint32_t)app_pid;
	d.has_leave_running = 1;
	d.leave_running = leave_running;
	d.has_image_background = 1;
	d.image_background = 1;
	m.body_case = GPUCR__MSG__BODY_DUMP;
	m.dump = &d;
	return call(fd, &m, dirfd);
}

/* A driver operation on this process through gpucrd, as the plugin asks;
 * its error message into msg (if not NULL). */
static int driver_op_msg(int fd, Gpucr__DriverOpKind op, char *msg, size_t len)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *r;
	Gpucr__DriverOp o = GPUCR__DRIVER_OP__INIT;
	int err;

	o.pid = (uint32_t)app_pid;
	o.op = op;
	o.has_timeout_ms = 1;
	o.timeout_ms = 2000;
	m.body_case = GPUCR__MSG__BODY_DRIVER_OP;
	m.driver_op = &o;
	r = call(fd, &m, -1);
	err = r->err;
	if (err)
		fprintf(stderr, "driver operation %d: %s\n", (int)op, r->err_msg ? r->err_msg : "");
	if (msg)
		snprintf(msg, len, "%s", r->err_msg ? r->err_msg : "");
	msg_free(r);
	return err;
}

static int driver_op(int fd, Gpucr__DriverOpKind op)
{
	return driver_op_msg(fd, op, NULL, 0);
}

/* The driver's state of this process, asked of the test driver directly. */
static int fake_state(void)
{
	CUprocessState st = CU_PROCESS_STATE_RUNNING;

	REQUIRE(cuCheckpointProcessGetState((int)app_pid, &st) == CUDA_SUCCESS);
	return (int)st;
}

static Gpucr__Msg *dump_wait(int fd)
{
	return dump_wait_for(fd, (uint32_t)getpid());
}

static Gpucr__Msg *restore_req(int fd, int dirfd, int background)
{
	return restore_for(fd, dirfd, (uint32_t)app_pid, background);
}

static Gpucr__Msg *restore(int fd, int dirfd)
{
	return restore_req(fd, dirfd, 0);
}

/* A background load of a damaged image: started fine, and the next request
 * gets the failure, whether it comes while the load runs or after. */
static void restore_bg_damaged(int c, int dirfd, useconds_t gap)
{
	Gpucr__Msg *r = restore_req(c, dirfd, 1);

	REQUIRE(r);
	CHECK_EQ_INT(r->err, 0);
	REQUIRE(r->body_case == GPUCR__MSG__BODY_RESTORE_REPLY);
	CHECK(r->restore_reply->loading);
	CHECK(r->restore_reply->bytes > 0);
	msg_free(r);
	usleep(gap);
	r = restore(c, dirfd);
	CHECK_EQ_INT(r->err, -EBADMSG);
	CHECK_CONTAINS(r->err_msg, "fingerprint mismatch in chunk 0");
	msg_free(r);
}

/* Processes gpucrd knows. */
static size_t ps_count(int fd)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *r;
	Gpucr__PsRequest p = GPUCR__PS_REQUEST__INIT;
	size_t n;

	m.body_case = GPUCR__MSG__BODY_PS;
	m.ps = &p;
	r = call(fd, &m, -1);
	REQUIRE(r && r->body_case == GPUCR__MSG__BODY_PS_REPLY);
	n = r->ps_reply->n_procs;
	msg_free(r);
	return n;
}

/* This process's state in gpucrd (RELEASED while its image is written). */
static int ps_state(int fd)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *r;
	Gpucr__PsRequest p = GPUCR__PS_REQUEST__INIT;
	int st = -1;

	p.pid = (uint32_t)app_pid;
	m.body_case = GPUCR__MSG__BODY_PS;
	m.ps = &p;
	r = call(fd, &m, -1);
	REQUIRE(r && r->body_case == GPUCR__MSG__BODY_PS_REPLY);
	if (r->ps_reply->n_procs == 1)
		st = r->ps_reply->procs[0]->state;
	msg_free(r);
	return st;
}

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Polls until its image is complete (DUMPED); the seconds it took. */
static double wait_dumped(int fd, double limit)
{
	double t0 = mono();

	while (ps_state(fd) != GPUCR__PROC_STATE__PROC_DUMPED && mono() - t0 < limit)
		usleep(10000);
	return mono() - t0;
}

/* ---- the daemon's log ---------------------------------------------------- */

/* The first line of log holding both a and b (the start of that line), or NULL. */
static const char *log_line(const char *log, const char *a, const char *b)
{
	const char *l = log;

	while (l && *l) {
		const char *e = strchr(l, '\n'), *x = strstr(l, a);

		if (x && (!e || x < e)) {
			const char *y = strstr(l, b);

			if (y && (!e || y < e))
				return l;
		}
		l = e ? e + 1 : NULL;
	}
	return NULL;
}

/* "... image write held back N ms, until ...": N, or -1. */
static long held_ms(const char *line)
{
	const char *x = line ? strstr(line, "image write held back ") : NULL;

	return x ? strtol(x + strlen("image write held back "), NULL, 10) : -1;
}

/* A debug line's monotonic time ("gpucrd[PID] SEC.MSEC file:line: ..."). */
static double line_time(const char *line)
{
	const char *x = line ? strchr(line, ']') : NULL;

	return x ? strtod(x + 1, NULL) : -1;
}

static void show_log(const char *log, const char *pidstr)
{
	const char *l = log;

	while (l && *l) {
		const char *e = strchr(l, '\n');

		if (strstr(l, pidstr) && (!e || strstr(l, pidstr) < e))
			fprintf(stderr, "    gpucrd| %.*s\n", (int)(e ? e - l : (long)strlen(l)), l);
		l = e ? e + 1 : NULL;
	}
}

static uint64_t held_bytes(void)
{
	struct fakecuda_held h;

	REQUIRE(fakecuda_held_bytes(0, &h) == 0);
	return h.mapped_bytes + h.fd_bytes;
}

static int sem_wait_s(sem_t *s, int secs)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += secs;
	while (sem_timedwait(s, &ts) < 0)
		if (errno != EINTR)
			return -errno;
	return 0;
}

/* Waits (at most limit s) until gpucrd's log since off holds text. */
static int log_waits_for(off_t off, const char *text, double limit)
{
	double t0 = mono();
	int found;

	do {
		char *log = log_since(off);

		found = strstr(log, text) != NULL;
		free(log);
		if (!found)
			usleep(20000);
	} while (!found && mono() - t0 < limit);
	return found;
}

/* A full dump: returns 0 with the image complete, or the DumpWait error. */
static int full_dump(int c, int dirfd, char *errmsg, size_t len)
{
	Gpucr__Msg *r = dump(c, dirfd);
	int err;

	REQUIRE(r);
	if (r->err) {
		snprintf(errmsg, len, "%s", r->err_msg ? r->err_msg : "");
		err = r->err;
		msg_free(r);
		return err;
	}
	CHECK(r->body_case == GPUCR__MSG__BODY_DUMP_REPLY);
	msg_free(r);
	/* Released: this process holds no device memory now. */
	CHECK_EQ_INT(held_bytes(), 0);
	CHECK(!mapped);
	r = dump_wait(c);
	err = r->err;
	if (err)
		snprintf(errmsg, len, "%s", r->err_msg ? r->err_msg : "");
	msg_free(r);
	return err;
}

static void restore_and_check(int c, int dirfd, int expect_retained)
{
	Gpucr__Msg *r = restore(c, dirfd);

	REQUIRE(r);
	if (r->err)
		fprintf(stderr, "restore: %s\n", r->err_msg);
	REQUIRE(r->err == 0);
	REQUIRE(r->body_case == GPUCR__MSG__BODY_RESTORE_REPLY);
	CHECK_EQ_INT(r->restore_reply->from_retained, expect_retained);
	msg_free(r);
	sem_post(&reconnect_sem);
	REQUIRE(sem_wait(&resumed_sem) == 0);
	CHECK(mapped);
	CHECK(check_pattern());
}

static void image_matches(int dirfd)
{
	struct gpucr_image *img = NULL;
	struct img_errbuf eb;
	uint8_t *buf = malloc(2u << 20);
	size_t b, c;
	uint64_t stored = 0;

	if (img_read(dirfd, (uint32_t)getpid(), &img, &eb) != 0) {
		fprintf(stderr, "image: %s\n", eb.msg);
		REQUIRE(0);
	}
	CHECK_EQ_INT(img->nbuffers, NBUF);
	for (b = 0; b < img->nbuffers; b++) {
		const Gpucr__Buffer *ib = img->buffers[b];
		int k;

		for (k = 0; k < NBUF; k++)
			if (va[k] == ib->va)
				break;
		REQUIRE(k < NBUF);
		for (c = 0; c < ib->n_chunks; c++) {
			size_t i;

			REQUIRE(img_read_chunk(img, ib, c, buf, &eb) == 0);
			for (i = 0; i < ib->chunks[c]->length; i++)
				if (buf[i] != pattern(k, ib->chunks[c]->offset + i))
					break;
			CHECK(i == ib->chunks[c]->length);
			if (!(ib->chunks[c]->has_zero && ib->chunks[c]->zero))
				stored += ib->chunks[c]->length;
		}
	}
	/* Buffer 1 has two zero chunks of three: 8 MiB stored of 12. */
	CHECK_EQ_INT(stored, 8u << 20);
	CHECK(strcmp(img->hdr->comm, "daemon-dump") == 0);
	img_free(img);
	free(buf);
}

static void corrupt(const char *dir, const char *name, off_t off)
{
	char p[512];
	uint8_t x;
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	fd = open(p, O_RDWR);
	REQUIRE(fd >= 0 && pread(fd, &x, 1, off) == 1);
	x ^= 0x10;
	REQUIRE(pwrite(fd, &x, 1, off) == 1);
	close(fd);
}

int main(void)
{
	char dir[] = "/tmp/gpucr-daemon-dump-XXXXXX", name[64], msg[1024], p[600];
	pthread_t shim;
	Gpucr__Msg *r;
	int dirfd, c, c2, err;

	app_pid = getpid();
	daemon_paths("dump");
	REQUIRE(mkdtemp(dir));
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	sem_init(&reconnect_sem, 0, 0);
	sem_init(&resumed_sem, 0, 0);
	sem_init(&stalled_sem, 0, 0);
	sem_init(&unstall_sem, 0, 0);

	alloc_all();
	CHECK(held_bytes() >= (12u << 20));
	start_daemon();
	REQUIRE(pthread_create(&shim, NULL, shim_main, NULL) == 0);
	c = cli();
	usleep(100000); /* let the shim register its buffers */

	/* 1. dump; the image holds exactly the application's bytes. */
	err = full_dump(c, dirfd, msg, sizeof(msg));
	if (err)
		fprintf(stderr, "dump: %s\n", msg);
	REQUIRE(err == 0);
	image_matches(dirfd);

	/* 2. zero-copy restore from the memory gpucrd kept. */
	restore_and_check(c, dirfd, 1);

	/* 3. a second dump while one runs is refused. */
	slow_quiesce = 1;
	c2 = cli();
	{
		Gpucr__Msg m = GPUCR__MSG__INIT;
		Gpucr__DumpRequest d = GPUCR__DUMP_REQUEST__INIT;

		d.pid = (uint32_t)getpid();
		m.has_id = 1;
		m.id = 7;
		m.body_case = GPUCR__MSG__BODY_DUMP;
		m.dump = &d;
		REQUIRE(msg_send(c2, &m, &dirfd, 1) == 0);
		usleep(50000);
		r = dump(c, dirfd);
		CHECK_EQ_INT(r->err, -EBUSY);
		CHECK_CONTAINS(r->err_msg, "already running");
		msg_free(r);
		REQUIRE(msg_recv(c2, &r, NULL, 0, NULL) == 0);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
		r = dump_wait(c2);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
	}
	slow_quiesce = 0;
	close(c2);

	/* 4. the daemon restarts: its memory is gone; restore from the image. */
	kill_daemon();
	start_daemon();
	close(c);
	c = cli();
	restore_and_check(c, dirfd, 0);

	/* 5. another uid can neither dump nor restore this process. */
	{
		pid_t child = fork();
		int status;

		REQUIRE(child >= 0);
		if (child == 0) {
			int cc;

			if (setgid(65534) || setuid(65534))
				_exit(77);
			cc = cli();
			r = dump(cc, dirfd);
			if (r->err != -ESRCH)
				_exit(1);
			msg_free(r);
			r = restore(cc, dirfd);
			_exit(r->err == -EPERM ? 0 : 2);
		}
		waitpid(child, &status, 0);
		CHECK(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77));
	}

	/* 6. a full file system (a 4 MiB tmpfs; needs root): the dump says so,
	 * leaves no image that looks complete and no partial files, and the
	 * memory stays with gpucrd for a restore. The process is dumped and
	 * the daemon restarted first, so this runs with the parallel engine
	 * (tmpfs) of the next daemon. */
	{
		char small[] = "/tmp/gpucr-full-XXXXXX";
		uint32_t *pids = NULL;
		size_t np = 9;
		int sfd;

		/* The daemon of step 4 keeps no dumped memory (a cap of 0):
		 * once the image is complete, the memory is freed. */
		REQUIRE(full_dump(c, dirfd, msg, sizeof(msg)) == 0);
		CHECK_EQ_INT(ps_count(c), 0);
		kill_daemon();
		start_daemon();
		close(c);
		c = cli();
		restore_and_check(c, dirfd, 0);
		REQUIRE(mkdtemp(small));
		if (mount("tmpfs", small, "tmpfs", 0, "size=4m") == 0) {
			sfd = open(small, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			err = full_dump(c, sfd, msg, sizeof(msg));
			CHECK(err != 0);
			CHECK_CONTAINS(msg, "full");
			CHECK_EQ_INT(img_list(sfd, &pids, &np), 0);
			CHECK_EQ_INT(np, 0);
			free(pids);
			{
				char cmd[200];

				snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A %s)\"", small);
				CHECK(system(cmd) == 0);
			}
			restore_and_check(c, dirfd, 1);
			close(sfd);
			umount(small);
		} else {
			fprintf(stderr, "skipping the full-disk case: cannot mount a tmpfs here\n");
		}
		rmdir(small);
	}

	/* 9. GPUCR_WRITE_AFTER_DRIVER=1 (every daemon here has it): a dump that
	 * nothing waits for writes its image only once the driver's checkpoint
	 * of the process is done. This program plays the CRIU plugin: dump,
	 * then the driver's lock and checkpoint (which the test driver grants
	 * only to a process holding no device memory), restore and unlock. */
	{
		char pidstr[32], *log;
		const char *held, *ck, *wr, *fp, *fin;
		off_t off = log_size();
		double t;

		snprintf(pidstr, sizeof(pidstr), "pid %d:", (int)app_pid);
		r = dump_background(c, dirfd, 0);
		REQUIRE(r->err == 0);
		msg_free(r);
		CHECK_EQ_INT(held_bytes(), 0);
		usleep(300000);
		/* 8 MiB take milliseconds: only the hold keeps it unwritten. */
		CHECK_EQ_INT(ps_state(c), GPUCR__PROC_STATE__PROC_RELEASED);
		CHECK_EQ_INT(driver_op(c, GPUCR__DRIVER_OP_KIND__DRV_LOCK), 0);
		CHECK_EQ_INT(driver_op(c, GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT), 0);
		t = wait_dumped(c, 5);
		CHECK(t < 0.6); /* well before the 1 s timeout */
		CHECK_EQ_INT(driver_op(c, GPUCR__DRIVER_OP_KIND__DRV_RESTORE), 0);
		CHECK_EQ_INT(driver_op(c, GPUCR__DRIVER_OP_KIND__DRV_UNLOCK), 0);
		r = dump_wait(c);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
		image_matches(dirfd);
		log = log_since(off);
		held = log_line(log, pidstr, "until the driver's checkpoint was done");
		ck = log_line(log, pidstr, "driver checkpoint in");
		wr = log_line(log, pidstr, "D2H write started");
		CHECK(held != NULL);
		CHECK(held_ms(held) >= 250);
		/* The write started after the checkpoint: in the log's order, and
		 * by the lines' monotonic times. */
		CHECK(ck && wr && ck < wr && line_time(ck) <= line_time(wr));
		fp = log_line(log, pidstr, "fingerprints at T done");
		fin = log_line(log, pidstr, "write finished");
		CHECK(fp && wr && fp < wr);
		CHECK(fin && wr && fin > wr);
		if (t_failed)
			show_log(log, pidstr);
		free(log);
		restore_and_check(c, dirfd, 1);

		/* 9b. no driver call comes (a dump not made by CRIU's plugin): the
		 * write starts after the timeout (1 s here), and the image is
		 * complete and restores. */
		off = log_size();
		r = dump_background(c, dirfd, 0);
		REQUIRE(r->err == 0);
		msg_free(r);
		t = wait_dumped(c, 5);
		CHECK(t >= 0.9 && t < 4);
		r = dump_wait(c);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
		image_matches(dirfd);
		log = log_since(off);
		held = log_line(log, pidstr, "until the timeout: no driver checkpoint of the process came within 1000 ms");
		CHECK(held != NULL);
		CHECK(held_ms(held) >= 900);
		if (t_failed)
			show_log(log, pidstr);
		free(log);
		restore_and_check(c, dirfd, 1);

		/* 9c. a DumpWait for it ends the hold: someone waits for the image. */
		off = log_size();
		r = dump_background(c, dirfd, 0);
		REQUIRE(r->err == 0);
		msg_free(r);
		t = mono();
		r = dump_wait(c);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
		CHECK(mono() - t < 0.6);
		image_matches(dirfd);
		log = log_since(off);
		CHECK(log_line(log, pidstr, "a DumpWait came") != NULL);
		if (t_failed)
			show_log(log, pidstr);
		free(log);
		restore_and_check(c, dirfd, 1);

		/* 9d. left running but not concurrent: the process waits for its
		 * image, so the write is not held. */
		off = log_size();
		r = dump_background(c, dirfd, 1);
		REQUIRE(r->err == 0);
		msg_free(r);
		CHECK(wait_dumped(c, 5) < 0.6);
		image_matches(dirfd);
		log = log_since(off);
		CHECK(log_line(log, pidstr, "image write not held back: the process waits for it") != NULL);
		CHECK(log_line(log, pidstr, "image write held back") == NULL);
		if (t_failed)
			show_log(log, pidstr);
		free(log);
		restore_and_check(c, dirfd, 1);
	}

	/* 10. a shim that stops answering (its control thread stopped, or
	 * stuck in a driver call) does not hold a dump or a restore for ever:
	 * with GPUCR_SHIM_TIMEOUT_MS=1000 and a drain time of 200 ms, the
	 * requester is answered within 1.2 s; the process goes on with its
	 * memory once it runs again, whatever it was stopped in. */
	{
		char pidstr[32];
		off_t off;
		double t;

		snprintf(pidstr, sizeof(pidstr), "pid %d", (int)app_pid);
		/* 10a. the quiesce: the dump fails, the process resumes. */
		off = log_size();
		stall_on = GPUCR__MSG__BODY_QUIESCE;
		t = mono();
		r = dump_drain(c, dirfd, 200);
		t = mono() - t;
		CHECK_EQ_INT(r->err, -ETIMEDOUT);
		CHECK_CONTAINS(r->err_msg, "did not answer quiesce within 1200 ms");
		CHECK_CONTAINS(r->err_msg, "GPUCR_SHIM_TIMEOUT_MS");
		CHECK(t >= 1.1 && t < 3);
		msg_free(r);
		REQUIRE(sem_wait_s(&stalled_sem, 1) == 0);
		sem_post(&unstall_sem);
		/* It quiesces late (dropped), then takes the Resume. */
		CHECK_EQ_INT(sem_wait_s(&resumed_sem, 5), 0);
		CHECK(mapped);
		CHECK(check_pattern());
		CHECK_EQ_INT(ps_state(c), GPUCR__PROC_STATE__PROC_RUNNING);
		CHECK(log_waits_for(off, "its answer to quiesce came after its 1200 ms had passed: ignored", 3));

		/* 10b. the release: the dump fails; a new one is refused while
		 * the Release may still be carried out; the shim releases late
		 * and gets its memory back from gpucrd. */
		off = log_size();
		stall_on = GPUCR__MSG__BODY_RELEASE;
		t = mono();
		r = dump_drain(c, dirfd, 200);
		t = mono() - t;
		CHECK_EQ_INT(r->err, -ETIMEDOUT);
		CHECK_CONTAINS(r->err_msg, "did not answer release within 1200 ms");
		CHECK(t >= 1.1 && t < 3);
		msg_free(r);
		REQUIRE(sem_wait_s(&stalled_sem, 1) == 0);
		r = dump_drain(c, dirfd, 200);
		CHECK_EQ_INT(r->err, -EBUSY);
		CHECK_CONTAINS(r->err_msg, "has not answered the release");
		msg_free(r);
		CHECK(mapped);
		sem_post(&unstall_sem);
		CHECK(log_waits_for(off, "released its GPU memory after its dump had given up on it", 3));
		CHECK(!mapped);
		sem_post(&reconnect_sem);
		CHECK_EQ_INT(sem_wait_s(&resumed_sem, 5), 0);
		CHECK(mapped);
		CHECK(check_pattern());
		CHECK_EQ_INT(ps_state(c), GPUCR__PROC_STATE__PROC_RUNNING);
		/* The Resume sent when the dump failed came after the Release,
		 * on the connection the shim closed: none is pending now. */
		while (sem_trywait(&resumed_sem) == 0)
			;

		/* 10c. the remap after a restore: the connection is cut off;
		 * the shim, once it runs again, has its memory mapped and comes
		 * back as a running process. */
		err = full_dump(c, dirfd, msg, sizeof(msg));
		REQUIRE(err == 0);
		off = log_size();
		r = restore(c, dirfd);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
		stall_on = GPUCR__MSG__BODY_REMAP;
		t = mono();
		sem_post(&reconnect_sem);
		REQUIRE(sem_wait_s(&stalled_sem, 2) == 0);
		CHECK(log_waits_for(off, "did not answer remap within 1000 ms", 4));
		t = mono() - t;
		CHECK(t >= 0.9 && t < 3);
		CHECK(log_waits_for(off, "Its connection is closed; gpucrd keeps its GPU memory", 1));
		sem_post(&unstall_sem);
		sem_post(&reconnect_sem);
		CHECK(log_waits_for(off, "back running after its remap was cut off", 4));
		CHECK(mapped);
		CHECK(check_pattern());
		usleep(100000); /* its buffers reported again */
		CHECK_EQ_INT(ps_state(c), GPUCR__PROC_STATE__PROC_RUNNING);
		/* And it dumps and restores as ever. */
		err = full_dump(c, dirfd, msg, sizeof(msg));
		if (err)
			fprintf(stderr, "dump after 10c: %s\n", msg);
		CHECK_EQ_INT(err, 0);
		restore_and_check(c, dirfd, 1);
		if (t_failed) {
			char *log = log_since(0);

			show_log(log, pidstr);
			free(log);
		}
	}

	/* 11. a driver checkpoint slower (2 s, FAKECUDA_CKPT_DELAY_MS in
	 * gpucrd) than its bound (GPUCR_DRIVER_TIMEOUT_MS=500): its requester
	 * is told within the bound, other driver calls for the pid are refused
	 * while it runs, and once it returns gpucrd restores and unlocks the
	 * process, which gets its memory back. */
	{
		char pidstr[32];
		off_t off;
		double t;
		int st = -1, i;

		snprintf(pidstr, sizeof(pidstr), "pid %d", (int)app_pid);
		kill_daemon();
		setenv("FAKECUDA_CKPT_DELAY_MS", "2000", 1);
		setenv("GPUCR_DRIVER_TIMEOUT_MS", "500", 1);
		start_daemon();
		unsetenv("FAKECUDA_CKPT_DELAY_MS");
		unsetenv("GPUCR_DRIVER_TIMEOUT_MS");
		close(c);
		c = cli();
		sem_post(&reconnect_sem); /* the shim comes back, reporting its buffers */
		for (i = 0; i < 200 && ps_state(c) != GPUCR__PROC_STATE__PROC_RUNNING; i++)
			usleep(10000);
		usleep(100000);
		off = log_size();
		r = dump_background(c, dirfd, 0);
		REQUIRE(r->err == 0);
		msg_free(r);
		CHECK_EQ_INT(driver_op(c, GPUCR__DRIVER_OP_KIND__DRV_LOCK), 0);
		t = mono();
		err = driver_op_msg(c, GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT, msg, sizeof(msg));
		t = mono() - t;
		CHECK_EQ_INT(err, -ETIMEDOUT);
		CHECK_CONTAINS(msg, "checkpoint did not return within 500 ms");
		CHECK(t >= 0.4 && t < 1.5);
		err = driver_op_msg(c, GPUCR__DRIVER_OP_KIND__DRV_RESTORE, msg, sizeof(msg));
		CHECK_EQ_INT(err, -EBUSY);
		CHECK_CONTAINS(msg, "timed out and has not returned yet");
		/* The late checkpoint is undone: restore (2 s), then unlock. */
		CHECK(log_waits_for(off, "driver unlock done", 8));
		st = fake_state();
		CHECK_EQ_INT(st, CU_PROCESS_STATE_RUNNING);
		CHECK(log_waits_for(off, "returned after 2.", 1));
		r = dump_wait(c);
		CHECK_EQ_INT(r->err, 0);
		msg_free(r);
		restore_and_check(c, dirfd, 1);
		if (t_failed) {
			char *log = log_since(off);

			show_log(log, pidstr);
			free(log);
		}
	}

	/* 7. a damaged chunk: the restore is refused and says where. */
	err = full_dump(c, dirfd, msg, sizeof(msg));
	REQUIRE(err == 0);
	kill_daemon();
	start_daemon();
	close(c);
	c = cli();
	img_pages_name(name, sizeof(name), (uint32_t)getpid());
	/* Buffers are stored in address order; corrupt inside the first. */
	corrupt(dir, name, IMG_PAGES_HEADER + 12345);
	r = restore(c, dirfd);
	CHECK_EQ_INT(r->err, -EBADMSG);
	CHECK_CONTAINS(r->err_msg, "fingerprint mismatch in chunk 0");
	msg_free(r);
	/* 7b. the same loaded in the background (the CRIU plugin's way): the
	 * next request gets the failure, asked right away or after the load. */
	restore_bg_damaged(c, dirfd, 0);
	restore_bg_damaged(c, dirfd, 300000);
	/* 8. a truncated data file is refused before anything is loaded, in
	 * the background too. */
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	REQUIRE(truncate(p, 8192) == 0);
	r = restore(c, dirfd);
	CHECK_EQ_INT(r->err, -EBADMSG);
	CHECK_CONTAINS(r->err_msg, "truncated");
	msg_free(r);
	r = restore_req(c, dirfd, 1);
	CHECK_EQ_INT(r->err, -EBADMSG);
	CHECK_CONTAINS(r->err_msg, "truncated");
	msg_free(r);

	/* The memory is lost for good now (daemon restarted, image bad):
	 * end the shim thread. */
	shim_quit = 1;
	sem_post(&reconnect_sem);
	pthread_join(shim, NULL);
	close(c);
	kill_daemon();
	{
		char cmd[700];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		REQUIRE(system(cmd) == 0);
	}
	if (!t_failed && !getenv("GPUCR_TEST_KEEP"))
		unlink(logpath);
	else
		fprintf(stderr, "gpucrd's log: %s\n", logpath);
	return t_done();
}
