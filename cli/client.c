/* Owns the CLI's talk with gpucrd (connect, hello, request/reply, each
 * wait bounded by gpucrd's silence: GPUCR_DAEMON_TIMEOUT_MS, msg_call) and
 * where gpucr's own files are relative to the gpucr binary. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "err.h"
#include "sock.h"

static int fd_ = -1;
static uint64_t next_id;

static int call(Gpucr__Msg *req, int fd, int ping, Gpucr__Msg **ret)
{
	int r = msg_call(fd_, req, fd, &next_id, msg_daemon_timeout_ms(), ping, ret);

	if (r == -ETIMEDOUT)
		fprintf(stderr,
			"gpucr: gpucrd at %s sent nothing for %u ms (GPUCR_DAEMON_TIMEOUT_MS) while asked for %s: is it "
			"stopped (SIGSTOP, a debugger) or stuck? See its log\n",
			sock_default_path(), msg_daemon_timeout_ms(), msg_body_name(req));
	return r;
}

int cli_connect(const char *path)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__Hello h = GPUCR__HELLO__INIT;
	int r;

	if (fd_ >= 0)
		return 0;
	fd_ = sock_connect_unix(path ? path : sock_default_path());
	if (fd_ < 0) {
		r = fd_;
		fd_ = -1;
		return r;
	}
	/* A frame gpucrd stops sending halfway is waited for no longer than
	 * its silence (msg_call bounds the rest). */
	msg_bound_frames(fd_, msg_daemon_timeout_ms());
	h.proto_version = GPUCR_PROTO_VERSION;
	h.role = GPUCR__ROLE__ROLE_CLI;
	h.gpucr_version = (char *)GPUCR_VERSION;
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = &h;
	r = call(&m, -1, 0, &rep);
	if (r == 0 && rep->err)
		r = rep->err;
	msg_free(rep);
	if (r < 0) {
		close(fd_);
		fd_ = -1;
	}
	return r;
}

int cli_call(Gpucr__Msg *req, int fd, Gpucr__Msg **ret)
{
	return call(req, fd, 1, ret);
}

int cli_ps(Gpucr__Msg **ret, char *why, size_t whylen)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__PsRequest ps = GPUCR__PS_REQUEST__INIT;
	int r;

	m.body_case = GPUCR__MSG__BODY_PS;
	m.ps = &ps;
	r = cli_call(&m, -1, &rep);
	if (r == 0 && !rep->err && rep->body_case == GPUCR__MSG__BODY_PS_REPLY) {
		*ret = rep;
		return 0;
	}
	snprintf(why, whylen, "%s", r < 0 ? gpucr_strerror(r) : rep->err_msg ? rep->err_msg : "bad reply");
	if (r == 0)
		r = rep->err ? rep->err : -EPROTO;
	msg_free(rep);
	return r;
}

/* <dir of the gpucr binary>/../REL, if it exists. */
int cli_own_path(char *buf, size_t len, const char *rel)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash;

	if (n <= 0)
		return -errno;
	exe[n] = 0;
	slash = strrchr(exe, '/');
	if (!slash)
		return -ENOENT;
	*slash = 0;
	if ((size_t)snprintf(buf, len, "%s/../%s", exe, rel) >= len)
		return -ENAMETOOLONG;
	return access(buf, F_OK) == 0 ? 0 : -ENOENT;
}
