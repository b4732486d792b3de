/* gpucrd's protocol front: a private daemon is started on a temporary socket,
 * then: hello and version checks; a shim registering a buffer (memfd handed
 * over) shows up in ps with its bytes; ps and drop respect uids (a peer of
 * another uid sees and touches nothing); garbage and requests before hello
 * get an error and a closed connection while the daemon keeps serving;
 * a detached, undumped process is forgotten. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "msg.h"
#include "sock.h"
#include "../unit/t.h"

static char sockpath[128];
static pid_t daemon_pid;
static uint64_t next_id = 1;

static void start_daemon(const char *bin)
{
	int i, fd;

	snprintf(sockpath, sizeof(sockpath), "/tmp/gpucrd-test-%d.sock", (int)getpid());
	daemon_pid = fork();
	REQUIRE(daemon_pid >= 0);
	if (daemon_pid == 0) {
		/* A test that stops early must not leave its daemon behind. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl(bin, bin, "--socket", sockpath, (char *)NULL);
		_exit(127);
	}
	for (i = 0; i < 200; i++) {
		fd = sock_connect_unix(sockpath);
		if (fd >= 0) {
			close(fd);
			return;
		}
		usleep(10000);
	}
	REQUIRE(!"daemon did not come up");
}

static int connect_(void)
{
	int fd = sock_connect_unix(sockpath);

	REQUIRE(fd >= 0);
	return fd;
}

/* Sends m and returns the reply (caller frees). */
static Gpucr__Msg *call(int fd, Gpucr__Msg *m, const int *fds, unsigned nfds)
{
	Gpucr__Msg *rep = NULL;

	m->has_id = 1;
	m->id = next_id++;
	if (msg_send(fd, m, fds, nfds) < 0)
		return NULL;
	if (msg_recv(fd, &rep, NULL, 0, NULL) < 0)
		return NULL;
	return rep;
}

static Gpucr__Msg *hello(int fd, Gpucr__Role role, uint32_t version)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__Hello h = GPUCR__HELLO__INIT;

	h.proto_version = version;
	h.role = role;
	h.comm = "trainer";
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = &h;
	return call(fd, &m, NULL, 0);
}

static Gpucr__Msg *ps(int fd)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__PsRequest p = GPUCR__PS_REQUEST__INIT;

	m.body_case = GPUCR__MSG__BODY_PS;
	m.ps = &p;
	return call(fd, &m, NULL, 0);
}

static Gpucr__Msg *drop(int fd, uint32_t pid)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__DropRequest d = GPUCR__DROP_REQUEST__INIT;

	d.pid = pid;
	m.body_case = GPUCR__MSG__BODY_DROP;
	m.drop = &d;
	return call(fd, &m, NULL, 0);
}

static int closed_by_peer(int fd)
{
	char c;
	ssize_t n;

	for (;;) {
		n = recv(fd, &c, 1, 0);
		if (n <= 0)
			return n == 0 || errno == ECONNRESET;
	}
}

/* A peer of another uid: runs in a child that dropped to nobody. */
static int other_uid_checks(pid_t shim_pid)
{
	Gpucr__Msg *r;
	int fd, ok = 1;

	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 77;
	fd = connect_();
	r = hello(fd, GPUCR__ROLE__ROLE_CLI, 1);
	ok &= r && r->err == 0;
	msg_free(r);
	r = ps(fd);
	ok &= r && r->err == 0 && r->body_case == GPUCR__MSG__BODY_PS_REPLY && r->ps_reply->n_procs == 0;
	msg_free(r);
	r = drop(fd, (uint32_t)shim_pid);
	ok &= r && r->err == -ESRCH;
	msg_free(r);
	close(fd);
	return ok ? 0 : 1;
}

/* Under systemd: the listening socket comes as fd 3 (LISTEN_FDS), and
 * readiness is announced on $NOTIFY_SOCKET. */
static void test_socket_activation(const char *bin)
{
	char lpath[128], npath[128], buf[256];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = 5 };
	Gpucr__Msg *r;
	int lfd, nfd, fd, status;
	ssize_t n;
	pid_t child;

	snprintf(lpath, sizeof(lpath), "/tmp/gpucrd-act-%d.sock", (int)getpid());
	snprintf(npath, sizeof(npath), "/tmp/gpucrd-notify-%d.sock", (int)getpid());
	unlink(npath);
	lfd = sock_listen_unix(lpath, 8);
	REQUIRE(lfd >= 0);
	nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	strcpy(sa.sun_path, npath);
	REQUIRE(nfd >= 0 && bind(nfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	setsockopt(nfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	child = fork();
	REQUIRE(child >= 0);
	if (child == 0) {
		char pidbuf[32];

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (lfd == 3)
			fcntl(3, F_SETFD, 0); /* dup2 onto itself would keep CLOEXEC */
		else if (dup2(lfd, 3) < 0)
			_exit(127);
		snprintf(pidbuf, sizeof(pidbuf), "%d", (int)getpid());
		setenv("LISTEN_PID", pidbuf, 1);
		setenv("LISTEN_FDS", "1", 1);
		setenv("NOTIFY_SOCKET", npath, 1);
		execl(bin, bin, "--systemd", (char *)NULL);
		_exit(127);
	}
	close(lfd);
	n = recv(nfd, buf, sizeof(buf) - 1, 0);
	CHECK(n > 0);
	buf[n > 0 ? n : 0] = 0;
	CHECK_CONTAINS(buf, "READY=1");
	fd = sock_connect_unix(lpath);
	REQUIRE(fd >= 0);
	r = hello(fd, GPUCR__ROLE__ROLE_CLI, 1);
	CHECK(r && r->err == 0);
	msg_free(r);
	close(fd);
	kill(child, SIGTERM);
	REQUIRE(waitpid(child, &status, 0) == child);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(nfd);
	unlink(npath);
	unlink(lpath);
}

int main(int argc, char **argv)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *r;
	Gpucr__BufferAdd ba = GPUCR__BUFFER_ADD__INIT;
	int shim, cli, bad, memfd, status;
	uint8_t junk[] = { 5, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb };
	pid_t child;

	char bin[4096];

	/* gpucrd sits in the build's bin/, beside this test's tests/. */
	if (argc > 1) {
		snprintf(bin, sizeof(bin), "%s", argv[1]);
	} else {
		ssize_t n = readlink("/proc/self/exe", bin, sizeof(bin) - 32);

		REQUIRE(n > 0);
		bin[n] = 0;
		strcpy(strrchr(bin, '/'), "/../bin/gpucrd");
	}
	test_socket_activation(bin);
	start_daemon(bin);

	/* Wrong protocol version: refused with a message. */
	bad = connect_();
	r = hello(bad, GPUCR__ROLE__ROLE_CLI, 99);
	REQUIRE(r);
	CHECK_EQ_INT(r->err, -EPROTONOSUPPORT);
	CHECK_CONTAINS(r->err_msg, "protocol version 99");
	msg_free(r);
	close(bad);

	/* A request before hello: error reply, connection closed. */
	bad = connect_();
	r = ps(bad);
	REQUIRE(r);
	CHECK_EQ_INT(r->err, -EPROTO);
	CHECK_CONTAINS(r->err_msg, "first message must be hello");
	msg_free(r);
	CHECK(closed_by_peer(bad));
	close(bad);

	/* Garbage: closed; the daemon keeps serving others. */
	bad = connect_();
	REQUIRE(write(bad, junk, sizeof(junk)) == (ssize_t)sizeof(junk));
	CHECK(closed_by_peer(bad));
	close(bad);

	/* A shim attaches and hands over a buffer. */
	shim = connect_();
	r = hello(shim, GPUCR__ROLE__ROLE_SHIM, 1);
	REQUIRE(r);
	CHECK_EQ_INT(r->err, 0);
	CHECK_EQ_INT(r->body_case, GPUCR__MSG__BODY_HELLO_REPLY);
	msg_free(r);
	memfd = memfd_create("gpucr-test-buf", MFD_CLOEXEC);
	REQUIRE(memfd >= 0 && ftruncate(memfd, 2 << 20) == 0);
	ba.va = 0x7f0000000000ull;
	ba.size = 2 << 20;
	ba.device = 0;
	m.body_case = GPUCR__MSG__BODY_BUFFER_ADD;
	m.buffer_add = &ba;
	r = call(shim, &m, &memfd, 1);
	REQUIRE(r);
	CHECK_EQ_INT(r->err, 0);
	msg_free(r);
	/* The same buffer twice is refused. */
	r = call(shim, &m, &memfd, 1);
	REQUIRE(r);
	CHECK_EQ_INT(r->err, -EEXIST);
	msg_free(r);
	/* buffer_add without its fd is refused. */
	r = call(shim, &m, NULL, 0);
	REQUIRE(r);
	CHECK_EQ_INT(r->err, -EINVAL);
	msg_free(r);

	cli = connect_();
	r = hello(cli, GPUCR__ROLE__ROLE_CLI, 1);
	msg_free(r);
	r = ps(cli);
	REQUIRE(r && r->body_case == GPUCR__MSG__BODY_PS_REPLY);
	CHECK_EQ_INT(r->ps_reply->n_procs, 1);
	if (r->ps_reply->n_procs == 1) {
		Gpucr__ProcInfo *pi = r->ps_reply->procs[0];

		CHECK_EQ_INT(pi->pid, getpid());
		CHECK_EQ_INT(pi->uid, getuid());
		CHECK_EQ_INT(pi->bytes, 2 << 20);
		CHECK_EQ_INT(pi->buffers, 1);
		CHECK(strcmp(pi->comm, "trainer") == 0);
		CHECK_EQ_INT(pi->state, GPUCR__PROC_STATE__PROC_RUNNING);
	}
	msg_free(r);

	/* A running, attached process's memory cannot be dropped. */
	r = drop(cli, (uint32_t)getpid());
	REQUIRE(r);
	CHECK_EQ_INT(r->err, -EBUSY);
	msg_free(r);

	/* Another uid sees nothing and cannot drop (needs root to switch). */
	if (getuid() == 0) {
		child = fork();
		REQUIRE(child >= 0);
		if (child == 0)
			_exit(other_uid_checks(getppid()));
		REQUIRE(waitpid(child, &status, 0) == child);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}

	/* The shim goes away undumped: the process is forgotten. */
	close(shim);
	usleep(100000);
	r = ps(cli);
	REQUIRE(r && r->body_case == GPUCR__MSG__BODY_PS_REPLY);
	CHECK_EQ_INT(r->ps_reply->n_procs, 0);
	msg_free(r);
	close(cli);
	close(memfd);

	kill(daemon_pid, SIGTERM);
	REQUIRE(waitpid(daemon_pid, &status, 0) == daemon_pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(access(sockpath, F_OK) != 0);
	return t_done();
}
