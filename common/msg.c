/* Owns packing and unpacking of protocol v1 messages. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

#include "frame.h"
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
