/* A fake gpucrd for the shim's tests, run step by step on the test's own
 * thread: it listens on a socket in a temporary directory (and points
 * GPUCR_SOCKET there), accepts the shim's control thread, answers its Hello
 * and sends it requests, and keeps the fds of the BufferAdds it gets, as
 * the daemon holds the memory of the processes it serves. Every step has a
 * time limit. Protocol v1 (proto/rpc.proto) through common/msg.h. */
#ifndef GPUCR_FAKEGPUCRD_H
#define GPUCR_FAKEGPUCRD_H

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "msg.h"
#include "sock.h"

#define FDD_MAX_BUFS 256

struct fdd_buf {
	uint64_t va;
	uint64_t size;
	uint32_t device;
	int kind;
	int fd;
	bool has_uuid;
	uint8_t uuid[16];
};

struct fdd {
	char dir[64];
	char path[128];
	int lfd;
	int conn;
	uint64_t next_id;
	/* The last Hello. */
	uint32_t control_tid;
	int restored;
	char comm[64];
	/* Buffers the shim reported, and every address it said were freed. */
	struct fdd_buf bufs[FDD_MAX_BUFS];
	size_t nbufs;
	uint64_t freed[FDD_MAX_BUFS];
	size_t nfreed;
	/* Called by fdd_request for each other message that arrives while it
	 * waits for its reply (requests from the shim: ChunksWanted); NULL:
	 * they are dropped. m is freed after. */
	void (*other)(struct fdd *d, Gpucr__Msg *m);
};

static inline void fdd_init(struct fdd *d)
{
	memset(d, 0, sizeof(*d));
	d->conn = -1;
	snprintf(d->dir, sizeof(d->dir), "/tmp/gpucr-fdd-XXXXXX");
	if (!mkdtemp(d->dir)) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(d->path, sizeof(d->path), "%s/gpucrd.sock", d->dir);
	d->lfd = sock_listen_unix(d->path, 8);
	if (d->lfd < 0) {
		fprintf(stderr, "listen on %s: %s\n", d->path, strerror(-d->lfd));
		exit(1);
	}
	setenv("GPUCR_SOCKET", d->path, 1);
}

static inline void fdd_drop_conn(struct fdd *d)
{
	if (d->conn >= 0)
		close(d->conn);
	d->conn = -1;
}

static inline void fdd_forget_bufs(struct fdd *d)
{
	for (size_t i = 0; i < d->nbufs; i++)
		close(d->bufs[i].fd);
	d->nbufs = 0;
	d->nfreed = 0;
}

/* Stops listening (connect attempts are refused from now on). */
static inline void fdd_unlisten(struct fdd *d)
{
	if (d->lfd >= 0)
		close(d->lfd);
	d->lfd = -1;
	unlink(d->path);
}

static inline void fdd_relisten(struct fdd *d)
{
	d->lfd = sock_listen_unix(d->path, 8);
	if (d->lfd < 0) {
		fprintf(stderr, "listen on %s: %s\n", d->path, strerror(-d->lfd));
		exit(1);
	}
}

static inline void fdd_fini(struct fdd *d)
{
	fdd_drop_conn(d);
	fdd_forget_bufs(d);
	fdd_unlisten(d);
	rmdir(d->dir);
}

/* 1 when fd is readable within ms, else 0. */
static inline int fdd_readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) > 0;
}

/* Accepts the next connection: 0, or -ETIMEDOUT. */
static inline int fdd_accept(struct fdd *d, int ms)
{
	int fd;

	if (!fdd_readable(d->lfd, ms))
		return -ETIMEDOUT;
	fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		return -errno;
	fdd_drop_conn(d);
	d->conn = fd;
	return 0;
}

static inline struct fdd_buf *fdd_find(struct fdd *d, uint64_t va)
{
	for (size_t i = 0; i < d->nbufs; i++)
		if (d->bufs[i].va == va)
			return &d->bufs[i];
	return NULL;
}

/* The buffer whose range holds addr. */
static inline struct fdd_buf *fdd_holding(struct fdd *d, uint64_t addr)
{
	for (size_t i = 0; i < d->nbufs; i++)
		if (addr >= d->bufs[i].va && addr < d->bufs[i].va + d->bufs[i].size)
			return &d->bufs[i];
	return NULL;
}

static inline void fdd_note(struct fdd *d, Gpucr__Msg *m, int *fds, unsigned nfds)
{
	if (m->body_case == GPUCR__MSG__BODY_BUFFER_ADD && nfds == 1) {
		Gpucr__BufferAdd *b = m->buffer_add;
		struct fdd_buf *e = fdd_find(d, b->va);

		if (e) {
			close(e->fd);
		} else {
			if (d->nbufs == FDD_MAX_BUFS) {
				fprintf(stderr, "fake gpucrd: too many buffers\n");
				exit(1);
			}
			e = &d->bufs[d->nbufs++];
		}
		*e = (struct fdd_buf){ .va = b->va, .size = b->size, .device = b->device,
				       .kind = b->has_kind ? (int)b->kind : 0, .fd = fds[0] };
		if (b->has_device_uuid && b->device_uuid.len == 16) {
			e->has_uuid = true;
			memcpy(e->uuid, b->device_uuid.data, 16);
		}
		return;
	}
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	if (m->body_case == GPUCR__MSG__BODY_BUFFER_FREE) {
		struct fdd_buf *e = fdd_find(d, m->buffer_free->va);

		if (d->nfreed < FDD_MAX_BUFS)
			d->freed[d->nfreed++] = m->buffer_free->va;
		if (e) {
			close(e->fd);
			*e = d->bufs[--d->nbufs];
		}
	}
}

/* Takes one message: BufferAdd/BufferFree go into the table; anything else
 * is handed back in *ret (free with msg_free). 1 when a message came, 0 on
 * timeout, -EPIPE (or another error) when the connection ended. */
static inline int fdd_pump(struct fdd *d, int ms, Gpucr__Msg **ret)
{
	int fds[FRAME_MAX_FDS];
	unsigned nfds = 0;
	Gpucr__Msg *m = NULL;
	int err;

	if (ret)
		*ret = NULL;
	if (d->conn < 0)
		return -ENOTCONN;
	if (!fdd_readable(d->conn, ms))
		return 0;
	err = msg_recv(d->conn, &m, fds, FRAME_MAX_FDS, &nfds);
	if (err)
		return err;
	if (m->body_case == GPUCR__MSG__BODY_BUFFER_ADD || m->body_case == GPUCR__MSG__BODY_BUFFER_FREE) {
		fdd_note(d, m, fds, nfds);
		msg_free(m);
		return 1;
	}
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	if (ret)
		*ret = m;
	else
		msg_free(m);
	return 1;
}

/* Takes everything that arrives within ms of quiet. */
static inline void fdd_drain(struct fdd *d, int ms)
{
	while (fdd_pump(d, ms, NULL) == 1)
		;
}

/* Waits for the shim's Hello and answers it with err (0: hello_reply).
 * 0, or -ETIMEDOUT / -EPROTO. */
static inline int fdd_hello(struct fdd *d, int err, int ms)
{
	Gpucr__HelloReply hr = GPUCR__HELLO_REPLY__INIT;
	Gpucr__Msg r = GPUCR__MSG__INIT, *m = NULL;
	int rc = fdd_pump(d, ms, &m);

	if (rc != 1 || !m)
		return rc == 0 ? -ETIMEDOUT : -EPROTO;
	if (m->body_case != GPUCR__MSG__BODY_HELLO || !m->has_id || !m->id) {
		msg_free(m);
		return -EPROTO;
	}
	d->control_tid = m->hello->has_control_tid ? m->hello->control_tid : 0;
	d->restored = m->hello->has_restored ? (int)m->hello->restored : -1;
	snprintf(d->comm, sizeof(d->comm), "%s", m->hello->comm ? m->hello->comm : "");
	if (m->hello->proto_version != 1 || m->hello->role != GPUCR__ROLE__ROLE_SHIM) {
		msg_free(m);
		return -EPROTO;
	}
	r.has_reply_to = true;
	r.reply_to = m->id;
	r.has_err = true;
	r.err = err;
	if (err) {
		r.err_msg = (char *)"refused by the test";
	} else {
		hr.proto_version = 1;
		r.body_case = GPUCR__MSG__BODY_HELLO_REPLY;
		r.hello_reply = &hr;
	}
	msg_free(m);
	return msg_send(d->conn, &r, NULL, 0);
}

/* Sends request m (its id set here) with fds and waits for the reply,
 * noting buffer messages meanwhile. Returns the reply's err (and the reply
 * in *ret when ret is not NULL), or -ETIMEDOUT / -EPIPE (no reply came). */
static inline int fdd_request(struct fdd *d, Gpucr__Msg *m, const int *fds, unsigned nfds, int ms,
			      Gpucr__Msg **ret)
{
	uint64_t id = ++d->next_id;
	int err;

	if (ret)
		*ret = NULL;
	m->has_id = true;
	m->id = id;
	err = msg_send(d->conn, m, fds, nfds);
	if (err)
		return err;
	for (;;) {
		Gpucr__Msg *r = NULL;
		int rc = fdd_pump(d, ms, &r);

		if (rc == 0)
			return -ETIMEDOUT;
		if (rc < 0)
			return rc;
		if (!r)
			continue;
		if (r->has_reply_to && r->reply_to == id) {
			err = r->has_err ? r->err : 0;
			if (ret)
				*ret = r;
			else
				msg_free(r);
			return err;
		}
		if (d->other)
			d->other(d, r);
		msg_free(r);
	}
}

static inline int fdd_quiesce(struct fdd *d, uint32_t timeout_ms, Gpucr__Msg **ret)
{
	Gpucr__Quiesce q = GPUCR__QUIESCE__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	q.has_timeout_ms = true;
	q.timeout_ms = timeout_ms;
	m.body_case = GPUCR__MSG__BODY_QUIESCE;
	m.quiesce = &q;
	return fdd_request(d, &m, NULL, 0, 10000, ret);
}

static inline int fdd_release(struct fdd *d)
{
	Gpucr__Release rel = GPUCR__RELEASE__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	m.body_case = GPUCR__MSG__BODY_RELEASE;
	m.release = &rel;
	return fdd_request(d, &m, NULL, 0, 10000, NULL);
}

/* Resume, in a save epoch when save_epoch is set. */
static inline int fdd_resume_epoch(struct fdd *d, bool save_epoch, Gpucr__Msg **ret)
{
	Gpucr__Resume res = GPUCR__RESUME__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	res.has_save_epoch = save_epoch;
	res.save_epoch = save_epoch;
	m.body_case = GPUCR__MSG__BODY_RESUME;
	m.resume = &res;
	return fdd_request(d, &m, NULL, 0, 10000, ret);
}

static inline int fdd_resume(struct fdd *d)
{
	return fdd_resume_epoch(d, false, NULL);
}

/* Remap of bufs[first .. first+n) with these fds (one per buffer). */
static inline int fdd_remap(struct fdd *d, const struct fdd_buf *bufs, size_t n, const int *fds,
			    bool last)
{
	Gpucr__BufferAdd ba[FRAME_MAX_FDS], *pba[FRAME_MAX_FDS];
	Gpucr__Remap rm = GPUCR__REMAP__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	if (n > FRAME_MAX_FDS)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		gpucr__buffer_add__init(&ba[i]);
		ba[i].va = bufs[i].va;
		ba[i].size = bufs[i].size;
		ba[i].device = bufs[i].device;
		ba[i].has_phys_size = true;
		ba[i].phys_size = bufs[i].size;
		pba[i] = &ba[i];
	}
	rm.n_buffers = n;
	rm.buffers = pba;
	rm.has_last = true;
	rm.last = last;
	m.body_case = GPUCR__MSG__BODY_REMAP;
	m.remap = &rm;
	return fdd_request(d, &m, fds, (unsigned)n, 10000, NULL);
}

#endif
