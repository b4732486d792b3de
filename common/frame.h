/* Length-framed messages over unix stream sockets, with fd passing.
 *
 * A frame is a 4-byte little-endian payload length, then the payload. File
 * descriptors travel as SCM_RIGHTS ancillary data with the frame's first
 * bytes. Frames longer than FRAME_MAX or carrying more than FRAME_MAX_FDS fds
 * are refused as a protocol error; the connection is not usable afterwards.
 *
 * Errors: -EPIPE when the peer closed the connection between frames,
 * -EPROTO when it closed mid-frame or sent an oversized frame or too many
 * fds, -EAGAIN from frame_rx_read when a non-blocking socket has no more
 * data, other -errno from the socket calls. No function here logs. */
#ifndef GPUCR_FRAME_H
#define GPUCR_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_MAX (16u << 20)
#define FRAME_MAX_FDS 64

/* Sends one frame; blocks until it is written (MSG_NOSIGNAL: no SIGPIPE).
 * The fds stay owned by the caller. */
int frame_send(int sock, const void *buf, size_t len, const int *fds, unsigned nfds);

/* Receive state for one connection. Zero-initialise (or frame_rx_init), feed
 * with frame_rx_read until it returns 1, take the frame, repeat. Fds received
 * are owned by the rx until taken; frame_rx_free closes those not taken. */
struct frame_rx {
	uint8_t hdr[4];
	size_t hdr_have;
	uint8_t *buf;
	size_t len;
	size_t have;
	int fds[FRAME_MAX_FDS];
	unsigned nfds;
	int ready;
};

void frame_rx_init(struct frame_rx *rx);
/* Reads what the socket has. Returns 1 when a whole frame is ready, -EAGAIN
 * when a non-blocking socket ran dry first, or an error above. */
int frame_rx_read(struct frame_rx *rx, int sock);
/* Hands the ready frame over: *ret_buf (free() it; NULL for an empty frame),
 * its length, and its fds, now the caller's. A frame with more than max_fds
 * fds is dropped whole (fds closed) with -EPROTO. Resets rx for the next
 * frame either way. */
int frame_rx_take(struct frame_rx *rx, void **ret_buf, size_t *ret_len, int *fds,
		  unsigned max_fds, unsigned *ret_nfds);
void frame_rx_free(struct frame_rx *rx);

/* Blocking receive of one frame: frame_rx_read + frame_rx_take. */
int frame_recv(int sock, void **ret_buf, size_t *ret_len, int *fds, unsigned max_fds,
	       unsigned *ret_nfds);

#endif
