/* The harness shared by the daemon tests that start a private gpucrd next
 * to their own build (daemon-dump, daemon-precopy): where it and the test
 * driver are, its socket and log, waiting for it to serve, killing it, and
 * a CLI connection with its calls. Each test keeps its own start_daemon:
 * the environment it gives gpucrd is what the test is about.
 *
 * Header-only (static functions), included by one test program each: the
 * state below is that program's. */
#ifndef GPUCR_TESTS_E2E_DAEMONTEST_H
#define GPUCR_TESTS_E2E_DAEMONTEST_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "msg.h"
#include "sock.h"
#include "../unit/t.h"

static char sockpath[128], logpath[128], daemon_bin[2048], fake_lib[4096];
static pid_t daemon_pid;

/* gpucrd and the test driver beside this program in the build tree; the
 * socket and log under /tmp, named by tag and this pid. */
static inline void daemon_paths(const char *tag)
{
	ssize_t n = readlink("/proc/self/exe", daemon_bin, sizeof(daemon_bin) - 32);

	REQUIRE(n > 0);
	daemon_bin[n] = 0;
	*strrchr(daemon_bin, '/') = 0;
	snprintf(fake_lib, sizeof(fake_lib), "%s/../fakecuda/libcuda.so.1", daemon_bin);
	strcat(daemon_bin, "/../bin/gpucrd");
	snprintf(sockpath, sizeof(sockpath), "/tmp/gpucrd-%s-%d.sock", tag, (int)getpid());
	snprintf(logpath, sizeof(logpath), "/tmp/gpucrd-%s-%d.log", tag, (int)getpid());
}

/* A connection to the daemon, tried for 3 s at most while it comes up. */
static inline int daemon_connect(void)
{
	int i, fd;

	for (i = 0; i < 300; i++) {
		fd = sock_connect_unix(sockpath);
		if (fd >= 0)
			return fd;
		usleep(10000);
	}
	REQUIRE(!"daemon did not come up");
	return -1;
}

/* Returns once the daemon just forked accepts connections. */
static inline void daemon_wait_up(void)
{
	close(daemon_connect());
}

/* Sends Hello h on fd and returns the reply (caller frees). */
static inline Gpucr__Msg *say_hello(int fd, Gpucr__Hello *h)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;

	m.has_id = 1;
	m.id = 1;
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = h;
	REQUIRE(msg_send(fd, &m, NULL, 0) == 0);
	REQUIRE(msg_recv(fd, &rep, NULL, 0, NULL) == 0);
	return rep;
}

static inline void kill_daemon(void)
{
	int status;

	kill(daemon_pid, SIGKILL);
	waitpid(daemon_pid, &status, 0);
	unlink(sockpath);
}

/* A connection said hello to as the CLI. */
static inline int cli(void)
{
	Gpucr__Hello h = GPUCR__HELLO__INIT;
	int fd = sock_connect_unix(sockpath);

	REQUIRE(fd >= 0);
	h.proto_version = 1;
	h.role = GPUCR__ROLE__ROLE_CLI;
	msg_free(say_hello(fd, &h));
	return fd;
}

/* Sends m (with pass_fd, if not -1) and returns its reply, skipping any
 * other message before it (caller frees). */
static inline Gpucr__Msg *call(int fd, Gpucr__Msg *m, int pass_fd)
{
	static uint64_t id = 100;
	Gpucr__Msg *rep = NULL;

	m->has_id = 1;
	m->id = ++id;
	REQUIRE(msg_send(fd, m, pass_fd >= 0 ? &pass_fd : NULL, pass_fd >= 0 ? 1 : 0) == 0);
	for (;;) {
		REQUIRE(msg_recv(fd, &rep, NULL, 0, NULL) == 0);
		if (rep->reply_to == m->id)
			return rep;
		msg_free(rep);
	}
}

/* DumpWait for pid: its reply (caller frees). */
static inline Gpucr__Msg *dump_wait_for(int fd, uint32_t pid)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__DumpWait w = GPUCR__DUMP_WAIT__INIT;

	w.pid = pid;
	m.body_case = GPUCR__MSG__BODY_DUMP_WAIT;
	m.dump_wait = &w;
	return call(fd, &m, -1);
}

/* A restore of pid from dirfd's image (or the memory kept), in the
 * background or not: its reply (caller frees). */
static inline Gpucr__Msg *restore_for(int fd, int dirfd, uint32_t pid, int background)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__RestoreRequest r = GPUCR__RESTORE_REQUEST__INIT;

	r.pid = pid;
	r.has_background = background;
	r.background = background;
	m.body_case = GPUCR__MSG__BODY_RESTORE;
	m.restore = &r;
	return call(fd, &m, dirfd);
}

/* ---- the daemon's log ---------------------------------------------------- */

static inline off_t log_size(void)
{
	struct stat st;

	return stat(logpath, &st) == 0 ? st.st_size : 0;
}

/* The log from offset off (malloc'd, NUL-terminated). */
static inline char *log_since(off_t off)
{
	off_t end = log_size();
	char *buf = calloc(1, (size_t)(end > off ? end - off : 0) + 1);
	int fd = open(logpath, O_RDONLY | O_CLOEXEC);

	REQUIRE(buf && fd >= 0);
	if (end > off)
		REQUIRE(pread(fd, buf, (size_t)(end - off), off) == end - off);
	close(fd);
	return buf;
}

#endif
