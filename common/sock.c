/* Owns unix-socket setup: paths, listen, connect, SO_PEERCRED. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "sock.h"

const char *sock_default_path(void)
{
	const char *p = getenv("GPUCR_SOCKET");

	return (p && *p) ? p : GPUCR_DEFAULT_SOCKET;
}

static int fill_addr(struct sockaddr_un *sa, const char *path)
{
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, path, n);
	return 0;
}

int sock_connect_unix(const char *path)
{
	struct sockaddr_un sa;
	int fd, r;

	r = fill_addr(&sa, path);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

int sock_listen_unix(const char *path, int backlog)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, r;

	r = fill_addr(&sa, path);
	if (r < 0)
		return r;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		fd = sock_connect_unix(path);
		if (fd >= 0) {
			close(fd);
			return -EADDRINUSE;
		}
		unlink(path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, backlog) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

int sock_peer_cred(int fd, struct peer_cred *ret_cred)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	ret_cred->pid = uc.pid;
	ret_cred->uid = uc.uid;
	ret_cred->gid = uc.gid;
	return 0;
}

int sock_set_nonblock(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return -errno;
	fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
	if (fcntl(fd, F_SETFL, fl) < 0)
		return -errno;
	return 0;
}

int gpucr_wake_signal(void)
{
	const char *s = getenv("GPUCR_WAKE_SIGNAL");
	int sig = s ? atoi(s) : 0;

	if (sig <= 0 || sig > SIGRTMAX)
		sig = SIGRTMIN + 11;
	return sig;
}
