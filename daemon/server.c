/* Owns gpucrd's connections: accepting on the unix socket, reading frames
 * without blocking the loop, identifying peers by SO_PEERCRED, dispatching
 * requests, and closing a connection that sends something malformed (after
 * an error reply) without disturbing any other client. */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpucrd.h"
#include "log.h"

struct pending {
	uint64_t id;
	conn_reply_cb cb;
	conn_reply_cb late;         /* after expiry: gets the reply if it comes */
	void *data;
	uint64_t deadline;          /* now_ns() past which cb gets a timeout; 0: none */
	unsigned timeout_ms;
	int expired;                /* cb has run with the timeout */
	const char *what;           /* the request's body name, for the message */
	struct pending *next;
};

struct conn {
	struct daemon *d;
	int fd;
	int refs;
	int open;
	struct pending *pending;
	uv_poll_t poll;
	uv_timer_t timer;           /* the next deadline among pending */
	struct frame_rx rx;
	struct peer_cred cred;
	Gpucr__Role role;
	int hello_done;
	struct proc *proc;          /* ROLE_SHIM: the process it controls */
	uint64_t next_id;
	struct conn *next;
};

static void conn_close(struct conn *c);

uid_t conn_uid(const struct conn *c)
{
	return c->cred.uid;
}

pid_t conn_pid(const struct conn *c)
{
	return c->cred.pid;
}

int conn_is_open(const struct conn *c)
{
	return c->open;
}

struct proc *conn_proc(const struct conn *c)
{
	return c->proc;
}

void conn_hold(struct conn *c)
{
	c->refs++;
}

static void conn_free(struct conn *c)
{
	close(c->fd);
	frame_rx_free(&c->rx);
	free(c);
}

void conn_put(struct conn *c)
{
	if (--c->refs == 0)
		conn_free(c);
}

int conn_send(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds)
{
	int r;

	/* Replies are small; a blocking send with the socket briefly blocking
	 * keeps framing simple. A client that stops reading is cut off by the
	 * send timeout set at accept. */
	if (!c->open)
		return -ENOTCONN;
	sock_set_nonblock(c->fd, 0);
	r = msg_send(c->fd, m, fds, nfds);
	sock_set_nonblock(c->fd, 1);
	return r;
}

/* The id a reply to req answers (0: the request wanted none). */
static uint64_t req_id(const Gpucr__Msg *req)
{
	return req && req->has_id ? req->id : 0;
}

#define reply_err(c, req, err, ...) conn_reply_err((c), req_id(req), (err), __VA_ARGS__)

int conn_reply(struct conn *c, uint64_t id, Gpucr__Msg *m, const int *fds, unsigned nfds)
{
	Gpucr__Msg empty = GPUCR__MSG__INIT;

	if (!m)
		m = &empty;
	m->has_reply_to = id != 0;
	m->reply_to = id;
	m->has_err = 1;
	m->err = 0;
	m->has_id = 0;
	return conn_send(c, m, fds, nfds);
}

int conn_reply_err(struct conn *c, uint64_t id, int err, const char *fmt, ...)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	m.has_reply_to = id != 0;
	m.reply_to = id;
	m.has_err = 1;
	m.err = err;
	m.err_msg = text;
	return conn_send(c, &m, NULL, 0);
}

unsigned shim_timeout_ms(void)
{
	return env_ms("GPUCR_SHIM_TIMEOUT_MS", 30000);
}

static void arm_timer(struct conn *c);

/* The timer: every pending request past its deadline gets a reply made
 * here (no reply_to, err -ETIMEDOUT, a message naming what did not answer)
 * and stays listed as expired, so that its real reply, if it ever comes,
 * goes to its late callback or is dropped instead of being taken for a
 * reply to something else. */
static void on_timer(uv_timer_t *t)
{
	struct conn *c = t->data;
	uint64_t now = now_ns();
	struct pending *p;
	int again;

	conn_hold(c);
	do {
		again = 0;
		for (p = c->pending; p && c->open; p = p->next) {
			Gpucr__Msg m = GPUCR__MSG__INIT;
			char text[256];

			if (p->expired || !p->deadline || p->deadline > now)
				continue;
			p->expired = 1;
			snprintf(text, sizeof(text), "pid %d's control thread did not answer %s within %u ms",
				 (int)c->cred.pid, p->what, p->timeout_ms);
			m.has_err = 1;
			m.err = -ETIMEDOUT;
			m.err_msg = text;
			/* cb may add or close requests: walk again from the start. */
			p->cb(c, &m, NULL, 0, p->data);
			again = 1;
			break;
		}
	} while (again && c->open);
	if (c->open)
		arm_timer(c);
	conn_put(c);
}

static void arm_timer(struct conn *c)
{
	uint64_t next = 0, now = now_ns();
	struct pending *p;

	for (p = c->pending; p; p = p->next)
		if (!p->expired && p->deadline && (!next || p->deadline < next))
			next = p->deadline;
	if (!next) {
		uv_timer_stop(&c->timer);
		return;
	}
	uv_timer_start(&c->timer, on_timer, next > now ? (next - now + 999999) / 1000000 : 0, 0);
}

int conn_request_timed(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds, unsigned timeout_ms,
		       conn_reply_cb cb, conn_reply_cb late, void *data)
{
	struct pending *p;
	int r;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->id = ++c->next_id;
	p->cb = cb;
	p->late = late;
	p->data = data;
	p->what = msg_body_name(m);
	p->timeout_ms = timeout_ms;
	m->has_id = 1;
	m->id = p->id;
	r = conn_send(c, m, fds, nfds);
	if (r < 0) {
		free(p);
		return r;
	}
	if (timeout_ms)
		p->deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
	p->next = c->pending;
	c->pending = p;
	if (timeout_ms)
		arm_timer(c);
	return 0;
}

int conn_request(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds, conn_reply_cb cb,
		 void *data)
{
	return conn_request_timed(c, m, fds, nfds, 0, cb, NULL, data);
}

int conn_reply_timed_out(const Gpucr__Msg *reply)
{
	return reply && !reply->has_reply_to && reply->err == -ETIMEDOUT;
}

/* A reply to one of the daemon's own requests: hand it to its callback. */
static int on_reply(struct conn *c, Gpucr__Msg *rep, int *fds, unsigned nfds)
{
	struct pending **pp, *p;

	for (pp = &c->pending; (p = *pp); pp = &p->next)
		if (p->id == rep->reply_to) {
			*pp = p->next;
			if (!p->expired)
				p->cb(c, rep, fds, nfds, p->data);
			else if (p->late)
				p->late(c, rep, fds, nfds, NULL);
			else
				pr_info("pid %d: its answer to %s came after its %u ms had passed: ignored",
					(int)c->cred.pid, p->what, p->timeout_ms);
			free(p);
			if (c->open)
				arm_timer(c);
			return 0;
		}
	pr_debug("pid %d: reply to unknown request %llu", (int)c->cred.pid,
		 (unsigned long long)rep->reply_to);
	return 0;
}

static int on_hello(struct conn *c, Gpucr__Msg *req)
{
	Gpucr__HelloReply hr = GPUCR__HELLO_REPLY__INIT;
	const Gpucr__Hello *h = req->hello;
	Gpucr__Msg m;
	int r;

	if (c->hello_done)
		return reply_err(c, req, -EPROTO, "hello sent twice");
	if (h->proto_version != GPUCR_PROTO_VERSION)
		return reply_err(c, req, -EPROTONOSUPPORT,
				 "protocol version %" PRIu32 " is not supported; this gpucrd speaks %d",
				 h->proto_version, GPUCR_PROTO_VERSION);
	c->role = h->role;
	c->hello_done = 1;
	if (c->role == GPUCR__ROLE__ROLE_SHIM) {
		struct proc *old = registry_find(c->d, c->cred.pid);
		int restored = h->has_restored && h->restored;

		if (restored && old && old->state != GPUCR__PROC_STATE__PROC_RESTORING &&
		    (old->cr_conn || (old->dump && !dump_allows_reattach(old)))) {
			/* Its dump still runs: a connection now could be caught
			 * by CRIU's freeze, and the image is not complete. Or
			 * the image is complete but CRIU still works on the
			 * process (the driver's checkpoint of memory gpucr does
			 * not own can take seconds): a connection now would be
			 * one CRIU cannot dump, and the driver holds the
			 * process, so its memory cannot be mapped back. */
			c->hello_done = 0;
			return reply_err(c, req, -EAGAIN, "pid %d: its dump is still running; try again",
					 (int)c->cred.pid);
		}
		/* Without buffers, a kept process is still one to resume: all its
		 * memory may be the application's own (registry_keeps). */
		if (restored && (!old || (!old->nbufs && !registry_keeps(old)) || old->uid != c->cred.uid)) {
			c->hello_done = 0;
			return reply_err(c, req, -ENOENT,
					 "gpucrd holds no GPU memory for pid %d (restart of gpucrd without an image?)",
					 (int)c->cred.pid);
		}

		if (old && !old->shim && !restored && (old->nbufs || registry_keeps(old)) && !old->busy && !old->dump) {
			/* A new process under the pid of a dumped one: the memory
			 * kept for that one is not this one's. */
			if (old->remap_cut)
				pr_info("pid %d (%s): back running after its remap was cut off: it mapped its memory "
					"itself; freeing gpucrd's hold on it",
					(int)c->cred.pid, old->comm);
			else
				pr_warn("pid %d: a new process took the pid of dumped '%s'; freeing the %llu MiB kept "
					"for it (its image, if written, is still there)",
					(int)c->cred.pid, old->comm, (unsigned long long)(old->bytes >> 20));
			registry_drop(c->d, old);
		}
		c->proc = registry_attach(c->d, c->cred.pid, c->cred.uid, h->comm);
		if (!c->proc)
			return reply_err(c, req, -ENOMEM, "out of memory");
		if (c->proc->shim && c->proc->shim != c) {
			/* Only one control connection per process. */
			c->proc = NULL;
			return reply_err(c, req, -EBUSY, "pid %d already has a control connection",
					 (int)c->cred.pid);
		}
		c->proc->shim = c;
		if (h->has_control_tid)
			c->proc->control_tid = (pid_t)h->control_tid;
		pr_info("pid %d (%s, uid %d): %s", (int)c->cred.pid, c->proc->comm, (int)c->cred.uid,
			h->has_restored && h->restored ? "reattached" : "attached");
	}
	gpucr__msg__init(&m);
	hr.proto_version = GPUCR_PROTO_VERSION;
	hr.daemon_version = (char *)GPUCR_VERSION;
	m.body_case = GPUCR__MSG__BODY_HELLO_REPLY;
	m.hello_reply = &hr;
	r = conn_reply(c, req_id(req), &m, NULL, 0);
	if (r == 0 && c->proc && h->has_restored && h->restored)
		restore_shim_reattached(c->d, c->proc, c);
	return r;
}

static int on_buffer_add(struct conn *c, Gpucr__Msg *req, int *fds, unsigned nfds)
{
	Gpucr__Msg m;
	int r;

	if (c->role != GPUCR__ROLE__ROLE_SHIM || !c->proc)
		return reply_err(c, req, -EPERM, "buffer_add is for attached processes only");
	if (nfds != 1)
		return reply_err(c, req, -EINVAL, "buffer_add needs exactly one fd, got %u", nfds);
	if (c->proc->state != GPUCR__PROC_STATE__PROC_RUNNING)
		return reply_err(c, req, -EBUSY, "buffer_add while the process is being dumped or restored");
	r = registry_buffer_add(c->proc, req->buffer_add, fds[0]);
	if (r < 0)
		return reply_err(c, req, r, "buffer 0x%" PRIx64 ": %s", req->buffer_add->va, strerror(-r));
	fds[0] = -1; /* now the registry's */
	/* Buffer messages are one-way for speed unless the shim asked (id > 0). */
	if (!req->has_id || req->id == 0)
		return 0;
	gpucr__msg__init(&m);
	return conn_reply(c, req_id(req), &m, NULL, 0);
}

static int on_buffer_free(struct conn *c, Gpucr__Msg *req)
{
	Gpucr__Msg m;
	int r;

	if (c->role != GPUCR__ROLE__ROLE_SHIM || !c->proc)
		return reply_err(c, req, -EPERM, "buffer_free is for attached processes only");
	r = registry_buffer_free(c->proc, req->buffer_free->va);
	if (!req->has_id || req->id == 0)
		return 0;
	if (r < 0)
		return reply_err(c, req, r, "no buffer at 0x%" PRIx64, req->buffer_free->va);
	gpucr__msg__init(&m);
	return conn_reply(c, req_id(req), &m, NULL, 0);
}

static int on_ps(struct conn *c, Gpucr__Msg *req)
{
	Gpucr__PsReply pr = GPUCR__PS_REPLY__INIT;
	uint32_t want = req->ps->has_pid ? req->ps->pid : 0;
	Gpucr__ProcInfo *infos = NULL, **ptrs = NULL;
	struct proc *p;
	size_t n = 0, i = 0;
	Gpucr__Msg m;
	int r;

	for (p = c->d->procs; p; p = p->next)
		n++;
	if (n) {
		infos = calloc(n, sizeof(*infos));
		ptrs = calloc(n, sizeof(*ptrs));
		if (!infos || !ptrs) {
			free(infos);
			free(ptrs);
			return reply_err(c, req, -ENOMEM, "out of memory");
		}
	}
	for (p = c->d->procs; p; p = p->next) {
		Gpucr__ProcInfo *pi = &infos[i];

		if (!registry_may_act(c->cred.uid, p) || (want && (uint32_t)p->pid != want))
			continue;
		gpucr__proc_info__init(pi);
		pi->pid = (uint32_t)p->pid;
		pi->has_uid = 1;
		pi->uid = p->uid;
		pi->comm = p->comm;
		pi->has_state = 1;
		pi->state = p->state;
		pi->has_buffers = 1;
		pi->buffers = p->nbufs;
		pi->has_bytes = 1;
		pi->bytes = p->bytes;
		pi->has_retained = 1;
		pi->retained = p->shim == NULL && p->nbufs > 0;
		if (p->image_dir[0])
			pi->image_dir = p->image_dir;
		if (p->dump) {
			pi->has_image_done_bytes = pi->has_image_total_bytes = 1;
			pi->image_done_bytes = __atomic_load_n(&p->io_done, __ATOMIC_RELAXED);
			pi->image_total_bytes = __atomic_load_n(&p->io_total, __ATOMIC_RELAXED);
		}
		ptrs[i++] = pi;
	}
	pr.n_procs = i;
	pr.procs = ptrs;
	gpucr__msg__init(&m);
	m.body_case = GPUCR__MSG__BODY_PS_REPLY;
	m.ps_reply = &pr;
	r = conn_reply(c, req_id(req), &m, NULL, 0);
	free(infos);
	free(ptrs);
	return r;
}

static int on_drop(struct conn *c, Gpucr__Msg *req)
{
	struct proc *p = registry_find(c->d, (pid_t)req->drop->pid);
	Gpucr__Msg m;

	if (!p || !registry_may_act(c->cred.uid, p))
		return reply_err(c, req, -ESRCH, "pid %" PRIu32 ": not known to gpucrd%s", req->drop->pid,
				 p ? " (or not yours)" : "");
	if (p->busy || p->dump)
		return reply_err(c, req, -EBUSY, "pid %" PRIu32 ": a dump or restore is using its memory; try again when it is done",
				 req->drop->pid);
	if (p->shim)
		return reply_err(c, req, -EBUSY,
				 "pid %" PRIu32 " is running and attached; only a dumped process's memory can be dropped",
				 req->drop->pid);
	pr_info("pid %d (%s): dropping %llu bytes of retained GPU memory", (int)p->pid, p->comm,
		(unsigned long long)p->bytes);
	registry_drop(c->d, p);
	gpucr__msg__init(&m);
	return conn_reply(c, req_id(req), &m, NULL, 0);
}

/* Handles one message; a negative return closes the connection. */
static int dispatch(struct conn *c, Gpucr__Msg *req, int *fds, unsigned nfds)
{
	if (req->has_reply_to && req->reply_to)
		return on_reply(c, req, fds, nfds);
	if (!c->hello_done && req->body_case != GPUCR__MSG__BODY_HELLO) {
		reply_err(c, req, -EPROTO, "the first message must be hello, not %s", msg_body_name(req));
		return -EPROTO;
	}
	switch (req->body_case) {
	case GPUCR__MSG__BODY_HELLO:
		return on_hello(c, req);
	case GPUCR__MSG__BODY_BUFFER_ADD:
		return on_buffer_add(c, req, fds, nfds);
	case GPUCR__MSG__BODY_BUFFER_FREE:
		return on_buffer_free(c, req);
	case GPUCR__MSG__BODY_PS:
		return on_ps(c, req);
	case GPUCR__MSG__BODY_DROP:
		return on_drop(c, req);
	case GPUCR__MSG__BODY_DUMP:
		if (nfds != 1)
			return reply_err(c, req, -EINVAL, "dump needs the image directory's fd");
		if (dump_start(c->d, c, req, fds[0]) == 0)
			fds[0] = -1;
		return 0;
	case GPUCR__MSG__BODY_DUMP_WAIT:
		return dump_wait(c->d, c, req);
	case GPUCR__MSG__BODY_RESTORE:
		if (nfds != 1)
			return reply_err(c, req, -EINVAL, "restore needs the image directory's fd");
		if (restore_start(c->d, c, req, fds[0]) == 0)
			fds[0] = -1;
		return 0;
	case GPUCR__MSG__BODY_DRIVER_OP:
		return driver_op(c->d, c, req);
	case GPUCR__MSG__BODY_WAKE:
		return wake_proc(c->d, c, req);
	case GPUCR__MSG__BODY_PRE_COPY: {
		int dfd = nfds == 1 ? fds[0] : -1;
		int r = precopy_request(c->d, c, req, &dfd);

		if (nfds == 1 && dfd < 0)
			fds[0] = -1;
		return r;
	}
	case GPUCR__MSG__BODY_CHUNKS_WANTED:
		return dump_chunks_wanted(c->role == GPUCR__ROLE__ROLE_SHIM ? c->proc : NULL, c, req);
	default:
		return reply_err(c, req, -EOPNOTSUPP, "gpucrd %s does not handle '%s' requests",
				 GPUCR_VERSION, msg_body_name(req));
	}
}

static void on_readable(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;
	int fds[FRAME_MAX_FDS];
	unsigned nfds, i;
	Gpucr__Msg *req;
	size_t len;
	void *buf;
	int r;

	(void)events;
	/* An error on the socket (libuv stops the handle): a peer that closed
	 * with messages of ours unread leaves ECONNRESET, e.g. a shim that
	 * carried out a Release late and closed with the Resume sent after it
	 * unread. What it sent before that (the release's answer) is still
	 * there: read it, then close. */
	for (;;) {
		r = frame_rx_read(&c->rx, c->fd);
		if (r == -EAGAIN && status < 0)
			r = -EPIPE;
		if (r == -EAGAIN)
			return;
		if (r < 0) {
			if (r != -EPIPE && r != -ECONNRESET)
				pr_warn("client pid %d: %s; closing its connection", (int)c->cred.pid,
					r == -EPROTO ? "malformed frame" : strerror(-r));
			conn_close(c);
			return;
		}
		r = frame_rx_take(&c->rx, &buf, &len, fds, FRAME_MAX_FDS, &nfds);
		if (r < 0) {
			conn_close(c);
			return;
		}
		r = msg_decode(buf, len, nfds, &req);
		free(buf);
		if (r < 0) {
			pr_warn("client pid %d: malformed message (%zu bytes, %u fds); closing its connection",
				(int)c->cred.pid, len, nfds);
			reply_err(c, NULL, -EBADMSG, "malformed message");
			for (i = 0; i < nfds; i++)
				close(fds[i]);
			conn_close(c);
			return;
		}
		conn_hold(c);
		r = dispatch(c, req, fds, nfds);
		msg_free(req);
		for (i = 0; i < nfds; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		if (r < 0)
			conn_close(c);
		if (!c->open) {
			conn_put(c);
			return;
		}
		conn_put(c);
	}
}

static void on_closed(uv_handle_t *h)
{
	conn_put(h->data);
}

static void conn_close(struct conn *c)
{
	struct pending *p;
	struct conn **pp;

	if (!c->open)
		return;
	c->open = 0;
	/* Requests the peer will never answer now. */
	while ((p = c->pending)) {
		c->pending = p->next;
		if (!p->expired) /* an expired one has had its answer */
			p->cb(c, NULL, NULL, 0, p->data);
		free(p);
	}

	for (pp = &c->d->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			c->d->nconns--;
			break;
		}
	if (c->proc) {
		registry_detach(c->d, c->proc);
		c->proc = NULL;
	}
	registry_forget_conn(c->d, c);
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, on_closed);
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *)&c->timer, on_closed);
}

void conn_shutdown(struct conn *c)
{
	conn_close(c);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
	struct daemon *d = h->data;
	struct timeval tv = { .tv_sec = 5 };
	struct conn *c;
	int fd;

	(void)events;
	if (status < 0)
		return;
	fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR)
			pr_perror("accept");
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->d = d;
	c->fd = fd;
	c->refs = 2; /* the poll handle's and the timer's, each put when closed */
	c->open = 1;
	frame_rx_init(&c->rx);
	if (sock_peer_cred(fd, &c->cred) < 0) {
		pr_perror("SO_PEERCRED");
		close(fd);
		free(c);
		return;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	uv_poll_init(d->loop, &c->poll, fd);
	c->poll.data = c;
	uv_timer_init(d->loop, &c->timer);
	c->timer.data = c;
	uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, on_readable);
	c->next = d->conns;
	d->conns = c;
	d->nconns++;
	pr_debug("connection from pid %d uid %d", (int)c->cred.pid, (int)c->cred.uid);
}

int server_start(struct daemon *d)
{
	int r;

	r = sock_set_nonblock(d->listen_fd, 1);
	if (r < 0)
		return r;
	r = uv_poll_init(d->loop, &d->listen_poll, d->listen_fd);
	if (r < 0)
		return r;
	d->listen_poll.data = d;
	return uv_poll_start(&d->listen_poll, UV_READABLE, on_accept);
}

void server_stop(struct daemon *d)
{
	while (d->conns)
		conn_close(d->conns);
	uv_poll_stop(&d->listen_poll);
	uv_close((uv_handle_t *)&d->listen_poll, NULL);
}
