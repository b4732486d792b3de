/* Owns the CLI's talk with gpucrd (connect, hello, request/reply) and where
 * gpucr's own files are relative to the gpucr binary. */
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
	h.proto_version = GPUCR_PROTO_VERSION;
	h.role = GPUCR__ROLE__ROLE_CLI;
	h.gpucr_version = (char *)GPUCR_VERSION;
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = &h;
	r = cli_call(&m, -1, &rep);
	if (r == 0 && rep->err)
		r = rep->err;
	msg_free(rep);
	return r;
}

int cli_call(Gpucr__Msg *req, int fd, Gpucr__Msg **ret)
{
	uint64_t id = ++next_id;
	int r;

	req->has_id = 1;
	req->id = id;
	r = msg_send(fd_, req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
	if (r < 0)
		return r;
	for (;;) {
		Gpucr__Msg *rep = NULL;

		r = msg_recv(fd_, &rep, NULL, 0, NULL);
		if (r < 0)
			return r;
		if (rep->has_reply_to && rep->reply_to == id) {
			*ret = rep;
			return 0;
		}
		msg_free(rep);
	}
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
