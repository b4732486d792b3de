/* Owns the plugin's connection to gpucrd: connect and hello once per CRIU
 * run, then blocking request/reply (progress messages skipped), each wait
 * bounded by gpucrd's silence (GPUCR_DAEMON_TIMEOUT_MS, msg_call), as
 * gpucrd bounds what it waits for itself (shims, the driver). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
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

/* gpucrd answered nothing for GPUCR_DAEMON_TIMEOUT_MS once in this CRIU
 * run: it is not asked again (each call would wait as long), and the
 * driver calls are made here (driver.c). */
static int daemon_stuck;

static int call_raw(Gpucr__Msg *req, int fd, int ping, Gpucr__Msg **ret)
{
	int r = msg_call(sock_fd, req, fd, &next_id, msg_daemon_timeout_ms(), ping, ret);

	if (r == -ETIMEDOUT) {
		daemon_stuck = 1;
		pl_err("gpucrd at %s sent nothing for %u ms (GPUCR_DAEMON_TIMEOUT_MS) while asked for %s: is it "
		       "stopped (SIGSTOP, a debugger) or stuck? See its log; it is not asked again in this CRIU run",
		       sock_default_path(), msg_daemon_timeout_ms(), msg_body_name(req));
	}
	return r;
}

int client_connect(void)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__Hello h = GPUCR__HELLO__INIT;
	int fd, r;

	if (sock_fd >= 0)
		return 0;
	if (daemon_stuck)
		return -ETIMEDOUT;
	fd = sock_connect_unix(sock_default_path());
	if (fd < 0)
		return fd;
	/* A frame gpucrd stops sending halfway is waited for no longer than
	 * its silence (msg_call bounds the rest). */
	msg_bound_frames(fd, msg_daemon_timeout_ms());
	sock_fd = fd;
	h.proto_version = GPUCR_PROTO_VERSION;
	h.role = GPUCR__ROLE__ROLE_PLUGIN;
	h.gpucr_version = (char *)GPUCR_VERSION;
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = &h;
	r = call_raw(&m, -1, 0, &rep);
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
	r = call_raw(req, fd, 1, ret);
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
