/* Owns the wire framing of gpucr's unix-socket protocol: length prefixes,
 * partial reads and writes, and SCM_RIGHTS fd passing. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "frame.h"

int frame_send(int sock, const void *buf, size_t len, const int *fds, unsigned nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * FRAME_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	uint8_t hdr[4];
	struct iovec iov[2];
	struct msghdr mh;
	size_t total, sent = 0;
	int first = 1;

	if (len > FRAME_MAX || nfds > FRAME_MAX_FDS)
		return -EMSGSIZE;
	hdr[0] = len & 0xff;
	hdr[1] = (len >> 8) & 0xff;
	hdr[2] = (len >> 16) & 0xff;
	hdr[3] = (len >> 24) & 0xff;
	total = sizeof(hdr) + len;

	while (sent < total) {
		size_t off = sent;
		int niov = 0;
		ssize_t n;

		if (off < sizeof(hdr)) {
			iov[niov].iov_base = hdr + off;
			iov[niov++].iov_len = sizeof(hdr) - off;
			off = 0;
		} else {
			off -= sizeof(hdr);
		}
		if (len - off > 0) {
			iov[niov].iov_base = (uint8_t *)buf + off;
			iov[niov++].iov_len = len - off;
		}
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = niov;
		if (first && nfds) {
			struct cmsghdr *c;

			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
		}
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		first = 0;
		sent += (size_t)n;
	}
	return 0;
}

void frame_rx_init(struct frame_rx *rx)
{
	memset(rx, 0, sizeof(*rx));
}

static void close_fds(int *fds, unsigned n)
{
	unsigned i;

	for (i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* Keeps the fds of one cmsg, closing any beyond the limit; returns -EPROTO
 * if some had to be dropped. */
static int rx_collect_fds(struct frame_rx *rx, struct msghdr *mh)
{
	struct cmsghdr *c;
	int ret = 0;

	if (mh->msg_flags & MSG_CTRUNC)
		ret = -EPROTO;
	for (c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		unsigned n, i;
		int *p;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		p = (int *)CMSG_DATA(c);
		for (i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, p + i, sizeof(fd));
			if (rx->nfds < FRAME_MAX_FDS) {
				rx->fds[rx->nfds++] = fd;
			} else {
				close(fd);
				ret = -EPROTO;
			}
		}
	}
	return ret;
}

int frame_rx_read(struct frame_rx *rx, int sock)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * FRAME_MAX_FDS)];
		struct cmsghdr align;
	} ctl;

	while (!rx->ready) {
		struct iovec iov;
		struct msghdr mh;
		ssize_t n;
		int r;

		if (rx->hdr_have < sizeof(rx->hdr)) {
			iov.iov_base = rx->hdr + rx->hdr_have;
			iov.iov_len = sizeof(rx->hdr) - rx->hdr_have;
		} else {
			iov.iov_base = rx->buf + rx->have;
			iov.iov_len = rx->len - rx->have;
		}
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EWOULDBLOCK ? -EAGAIN : -errno;
		}
		r = rx_collect_fds(rx, &mh);
		if (r < 0)
			return r;
		if (n == 0)
			return (rx->hdr_have == 0 && rx->nfds == 0) ? -EPIPE : -EPROTO;

		if (rx->hdr_have < sizeof(rx->hdr)) {
			rx->hdr_have += (size_t)n;
			if (rx->hdr_have < sizeof(rx->hdr))
				continue;
			rx->len = (size_t)rx->hdr[0] | (size_t)rx->hdr[1] << 8 |
				  (size_t)rx->hdr[2] << 16 | (size_t)rx->hdr[3] << 24;
			if (rx->len > FRAME_MAX)
				return -EPROTO;
			rx->have = 0;
			if (rx->len) {
				rx->buf = malloc(rx->len);
				if (!rx->buf)
					return -ENOMEM;
			}
		} else {
			rx->have += (size_t)n;
		}
		if (rx->hdr_have == sizeof(rx->hdr) && rx->have == rx->len)
			rx->ready = 1;
	}
	return 1;
}

int frame_rx_take(struct frame_rx *rx, void **ret_buf, size_t *ret_len, int *fds,
		  unsigned max_fds, unsigned *ret_nfds)
{
	if (!rx->ready)
		return -EAGAIN;
	if (rx->nfds > max_fds) {
		frame_rx_free(rx);
		return -EPROTO;
	}
	if (rx->nfds)
		memcpy(fds, rx->fds, rx->nfds * sizeof(int));
	*ret_buf = rx->buf;
	*ret_len = rx->len;
	if (ret_nfds)
		*ret_nfds = rx->nfds;
	rx->buf = NULL;
	rx->nfds = 0;
	frame_rx_free(rx);
	return 0;
}

void frame_rx_free(struct frame_rx *rx)
{
	if (!rx)
		return;
	close_fds(rx->fds, rx->nfds);
	free(rx->buf);
	frame_rx_init(rx);
}

int frame_recv(int sock, void **ret_buf, size_t *ret_len, int *fds, unsigned max_fds,
	       unsigned *ret_nfds)
{
	struct frame_rx rx;
	int r;

	frame_rx_init(&rx);
	r = frame_rx_read(&rx, sock);
	if (r < 0) {
		frame_rx_free(&rx);
		return r;
	}
	return frame_rx_take(&rx, ret_buf, ret_len, fds, max_fds, ret_nfds);
}
