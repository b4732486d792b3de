/* Owns gpucrd's side of systemd: readiness notification (sd_notify's
 * protocol, a datagram to $NOTIFY_SOCKET) and socket activation ($LISTEN_FDS). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpucrd.h"
#include "log.h"

void notify_ready(const char *status)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	char msg[256];
	socklen_t salen;
	size_t n;
	int fd;

	if (!path || !*path || strlen(path) >= sizeof(sa.sun_path))
		return;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	strcpy(sa.sun_path, path);
	if (sa.sun_path[0] == '@')
		sa.sun_path[0] = 0; /* abstract namespace */
	salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	n = (size_t)snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s\nMAINPID=%d", status, (int)getpid());
	if (sendto(fd, msg, n, 0, (struct sockaddr *)&sa, salen) < 0)
		pr_warn("systemd notification failed: %s", strerror(errno));
	close(fd);
}

int listen_fds_from_systemd(void)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");

	if (!pid || !fds || atoi(pid) != (int)getpid() || atoi(fds) < 1)
		return -ENOENT;
	/* The first passed fd is 3 (SD_LISTEN_FDS_START). */
	if (fcntl(3, F_SETFD, FD_CLOEXEC) < 0)
		return -errno;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return 3;
}
