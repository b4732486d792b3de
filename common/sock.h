/* Unix-socket plumbing shared by the daemon, the CLI, the shim and the plugin:
 * where the daemon's socket is, listening, connecting, peer credentials.
 * Every fd is opened O_CLOEXEC. Returns fds or -errno; nothing here logs. */
#ifndef GPUCR_SOCK_H
#define GPUCR_SOCK_H

#include <stddef.h>
#include <sys/types.h>

#define GPUCR_DEFAULT_SOCKET "/run/gpucr/gpucrd.sock"

/* $GPUCR_SOCKET if set, else GPUCR_DEFAULT_SOCKET. */
const char *sock_default_path(void);

/* Binds and listens on path. A stale socket file that nobody answers on is
 * replaced; one that a live daemon answers on gives -EADDRINUSE. */
int sock_listen_unix(const char *path, int backlog);
int sock_connect_unix(const char *path);

struct peer_cred {
	pid_t pid;
	uid_t uid;
	gid_t gid;
};
int sock_peer_cred(int fd, struct peer_cred *ret_cred);

int sock_set_nonblock(int fd, int on);

/* The signal that wakes a shim's control thread after a restore:
 * $GPUCR_WAKE_SIGNAL if set (a number), else SIGRTMIN + 11. The daemon, the
 * plugin and the shim must agree; all read the same variable. */
int gpucr_wake_signal(void);

#endif
