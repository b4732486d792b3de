/* gpucrd's internal interfaces: the server (connections, dispatch) and the
 * registry of attached processes and the memory they handed over. */
#ifndef GPUCRD_H
#define GPUCRD_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "frame.h"
#include "msg.h"
#include "sock.h"

struct conn;

/* One physical allocation of an attached process, as the shim exported it.
 * The registry owns fd until the buffer is freed or dropped. */
struct rbuf {
	uint64_t va;
	uint64_t size;
	uint64_t phys_size;
	uint64_t phys_offset;
	uint32_t device;
	int kind;
	int fd;
	struct rbuf *next;
};

struct proc {
	pid_t pid;
	uid_t uid;
	char comm[64];
	Gpucr__ProcState state;
	struct conn *shim;          /* control connection, NULL while detached */
	struct rbuf *bufs;
	uint64_t nbufs;
	uint64_t bytes;
	char image_dir[256];
	struct proc *next;
};

struct daemon {
	uv_loop_t *loop;
	int listen_fd;
	uv_poll_t listen_poll;
	uv_signal_t sigterm, sigint;
	struct conn *conns;
	struct proc *procs;
	unsigned nconns;
	char socket_path[108];
	int owns_socket_path;       /* unlink it at exit (not under socket activation) */
};

/* server.c */
int server_start(struct daemon *d);
void server_stop(struct daemon *d);
int conn_send(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds);

/* registry.c */
struct proc *registry_find(struct daemon *d, pid_t pid);
struct proc *registry_attach(struct daemon *d, pid_t pid, uid_t uid, const char *comm);
int registry_buffer_add(struct proc *p, const Gpucr__BufferAdd *ba, int fd);
int registry_buffer_free(struct proc *p, uint64_t va);
/* The shim's connection went away: keep the process's memory if it is
 * dumped (retention), else forget the process. */
void registry_detach(struct daemon *d, struct proc *p);
void registry_drop(struct daemon *d, struct proc *p);
void registry_free_all(struct daemon *d);
/* May a peer of uid act on p? root on any, others on their own. */
static inline int registry_may_act(uid_t peer_uid, const struct proc *p)
{
	return peer_uid == 0 || peer_uid == p->uid;
}

/* notify.c: systemd readiness (no libsystemd needed). */
void notify_ready(const char *status);
int listen_fds_from_systemd(void);

#endif
