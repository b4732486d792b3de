/* Owns packing and unpacking of protocol v1 messages. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "frame.h"
#include "log.h"
#include "msg.h"

int msg_send(int sock, Gpucr__Msg *m, const int *fds, unsigned nfds)
{
	uint8_t stackbuf[512];
	uint8_t *buf = stackbuf;
	size_t len;
	int r;

	m->has_nfds = nfds > 0;
	m->nfds = nfds;
	len = gpucr__msg__get_packed_size(m);
	if (len > FRAME_MAX)
		return -EMSGSIZE;
	if (len > sizeof(stackbuf)) {
		buf = malloc(len);
		if (!buf)
			return -ENOMEM;
	}
	gpucr__msg__pack(m, buf);
	r = frame_send(sock, buf, len, fds, nfds);
	if (buf != stackbuf)
		free(buf);
	return r;
}

int msg_decode(const void *buf, size_t len, unsigned nfds_received, Gpucr__Msg **ret)
{
	Gpucr__Msg *m;

	m = gpucr__msg__unpack(NULL, len, buf);
	if (!m)
		return -EBADMSG;
	if ((m->has_nfds ? m->nfds : 0) != nfds_received) {
		gpucr__msg__free_unpacked(m, NULL);
		return -EBADMSG;
	}
	*ret = m;
	return 0;
}

int msg_recv(int sock, Gpucr__Msg **ret, int *fds, unsigned max_fds, unsigned *ret_nfds)
{
	unsigned nfds = 0, i;
	void *buf = NULL;
	size_t len = 0;
	int r;

	r = frame_recv(sock, &buf, &len, fds, max_fds, &nfds);
	if (r < 0)
		return r;
	r = msg_decode(buf, len, nfds, ret);
	free(buf);
	if (r < 0) {
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		return r;
	}
	if (ret_nfds)
		*ret_nfds = nfds;
	return 0;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

unsigned msg_daemon_timeout_ms(void)
{
	return env_ms("GPUCR_DAEMON_TIMEOUT_MS", 30000);
}

void msg_bound_frames(int sock, unsigned idle_ms)
{
	struct timeval tv = { .tv_sec = idle_ms / 1000, .tv_usec = (idle_ms % 1000) * 1000 };

	if (idle_ms)
		setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static int send_ping(int sock, uint64_t *next_id)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__PsRequest ps = GPUCR__PS_REQUEST__INIT;

	ps.has_pid = 1;
	ps.pid = 0xffffffffu; /* no process has it: the answer is short */
	m.has_id = 1;
	m.id = ++*next_id;
	m.body_case = GPUCR__MSG__BODY_PS;
	m.ps = &ps;
	return msg_send(sock, &m, NULL, 0);
}

int msg_call(int sock, Gpucr__Msg *req, int fd, uint64_t *next_id, unsigned idle_ms, int ping, Gpucr__Msg **ret)
{
	uint64_t id = ++*next_id, heard = mono_ms(), pinged = heard;
	unsigned every = idle_ms / 4 ? idle_ms / 4 : 1;
	int r;

	req->has_id = 1;
	req->id = id;
	r = msg_send(sock, req, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
	if (r < 0)
		return r;
	for (;;) {
		struct pollfd pfd = { .fd = sock, .events = POLLIN };
		Gpucr__Msg *rep = NULL;
		uint64_t now = mono_ms();
		int wait = -1;

		if (idle_ms) {
			uint64_t next = heard + idle_ms, last;

			if (now >= next)
				return -ETIMEDOUT;
			if (ping) {
				last = pinged > heard ? pinged : heard;
				if (now - last >= every) {
					r = send_ping(sock, next_id);
					if (r < 0)
						return r;
					pinged = last = now;
				}
				if (last + every < next)
					next = last + every;
			}
			wait = (int)(next - now);
		}
		r = poll(&pfd, 1, wait);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		r = msg_recv(sock, &rep, NULL, 0, NULL);
		if (r < 0)
			return r == -EAGAIN ? -ETIMEDOUT : r;
		heard = mono_ms();
		if (rep->has_reply_to && rep->reply_to == id) {
			*ret = rep;
			return 0;
		}
		msg_free(rep); /* progress, a ping's answer, or a stale reply */
	}
}

void msg_free(Gpucr__Msg *m)
{
	if (m)
		gpucr__msg__free_unpacked(m, NULL);
}

const char *msg_body_name(const Gpucr__Msg *m)
{
	const ProtobufCFieldDescriptor *f;

	if (m->body_case == GPUCR__MSG__BODY__NOT_SET)
		return "empty";
	f = protobuf_c_message_descriptor_get_field(&gpucr__msg__descriptor, m->body_case);
	return f ? f->name : "unknown";
}

Gpucr__DriverState msg_driver_state(int st)
{
	switch (st) {
	case CU_PROCESS_STATE_RUNNING:
		return GPUCR__DRIVER_STATE__DRV_STATE_RUNNING;
	case CU_PROCESS_STATE_LOCKED:
		return GPUCR__DRIVER_STATE__DRV_STATE_LOCKED;
	case CU_PROCESS_STATE_CHECKPOINTED:
		return GPUCR__DRIVER_STATE__DRV_STATE_CHECKPOINTED;
	default:
		return GPUCR__DRIVER_STATE__DRV_STATE_FAILED;
	}
}
