/* Owns the plugin's connection to gpucrd: connect and hello once per CRIU
 * run, then blocking request/reply (progress messages skipped). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "plugin.h"
#include "sock.h"

static int sock_fd = -1;
static uint64_t next_id;

int client_connected(void)
{
	return sock_fd >= 0;
}

void client_close(void)
{
	if (sock_fd >= 0)
		close(sock_fd);
	sock_fd = -1;
}

static int call_raw(Gpucr__Msg *req, int fd, Gpucr__Msg **ret)
{
	uint64_t id = ++next_id;
	int r;

	req->has_id = 1;
	req->id = id;
	r = msg_send(sock_fd, req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
	if (r < 0)
		return r;
	for (;;) {
		Gpucr__Msg *rep = NULL;

		r = msg_recv(sock_fd, &rep, NULL, 0, NULL);
		if (r < 0)
			return r == -EAGAIN ? -ETIMEDOUT : r;
		if (rep->has_reply_to && rep->reply_to == id) {
			*ret = rep;
			return 0;
		}
		msg_free(rep); /* progress, or a stale reply */
	}
}

int client_connect(void)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__Hello h = GPUCR__HELLO__INIT;
	/* Long operations (writing a large image) are waited for here. */
	struct timeval tv = { .tv_sec = 3600 };
	int fd, r;

	if (sock_fd >= 0)
		return 0;
	fd = sock_connect_unix(sock_default_path());
	if (fd < 0)
		return fd;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	sock_fd = fd;
	h.proto_version = GPUCR_PROTO_VERSION;
	h.role = GPUCR__ROLE__ROLE_PLUGIN;
	h.gpucr_version = (char *)GPUCR_VERSION;
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = &h;
	r = call_raw(&m, -1, &rep);
	if (r == 0 && rep->err)
		r = rep->err;
	msg_free(rep);
	if (r < 0)
		client_close();
	return r;
}

int client_call(Gpucr__Msg *req, int fd, Gpucr__Msg **ret)
{
	int r;

	r = client_connect();
	if (r < 0)
		return r;
	r = call_raw(req, fd, ret);
	if (r < 0)
		client_close();
	return r;
}

int client_send(Gpucr__Msg *req)
{
	int r = client_connect();

	if (r < 0)
		return r;
	req->has_id = 1;
	req->id = ++next_id;
	return msg_send(sock_fd, req, NULL, 0);
}
