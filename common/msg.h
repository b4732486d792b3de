/* Protocol v1 messages (proto/rpc.proto) over frames (frame.h).
 *
 * msg_send packs and sends one Msg with its fds; msg_recv receives and
 * unpacks one, checking that the fds that arrived match Msg.nfds. A decoded
 * Msg is freed with msg_free; fds received are the caller's. Malformed bytes
 * give -EBADMSG, never a crash. Nothing here logs. */
#ifndef GPUCR_MSG_H
#define GPUCR_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "proto/rpc.pb-c.h"

#define GPUCR_PROTO_VERSION 1

int msg_send(int sock, Gpucr__Msg *m, const int *fds, unsigned nfds);
/* Decodes a received frame: on success *ret is the message and the fds are
 * checked against m->nfds (a mismatch is -EBADMSG; the fds stay the
 * caller's either way). */
int msg_decode(const void *buf, size_t len, unsigned nfds_received, Gpucr__Msg **ret);
int msg_recv(int sock, Gpucr__Msg **ret, int *fds, unsigned max_fds, unsigned *ret_nfds);
void msg_free(Gpucr__Msg *m);

/* A client's blocking call to gpucrd: sends req (with fd attached if >= 0)
 * under the id ++*next_id and waits for its reply, which *ret gets (msg_free
 * it), whatever its err. Other messages (progress, stale replies) are
 * dropped. The wait is bounded by silence, not by total time: a call may
 * rightly last minutes (an image being written), but gpucrd's event loop
 * answers at once whatever it does, so with ping set, every idle_ms / 4
 * without a message a Ps for no process is sent (only after the hello:
 * gpucrd closes a connection whose first message is not one), and
 * -ETIMEDOUT comes once nothing at all arrived for idle_ms: gpucrd stopped
 * (SIGSTOP, a debugger) or its loop is stuck. idle_ms 0: no bound. Returns
 * 0 or -errno (transport). Nothing here logs. */
int msg_call(int sock, Gpucr__Msg *req, int fd, uint64_t *next_id, unsigned idle_ms, int ping, Gpucr__Msg **ret);
/* GPUCR_DAEMON_TIMEOUT_MS, the idle_ms of clients' calls (default 30000). */
unsigned msg_daemon_timeout_ms(void);
/* Bounds the receive of a frame the peer stops sending halfway by idle_ms
 * (0: no bound): msg_call's poll sees only that a frame began. For a
 * client's socket, once after connecting. */
void msg_bound_frames(int sock, unsigned idle_ms);

/* The driver's process state as the protocol reports it. */
Gpucr__DriverState msg_driver_state(int cu_process_state);

/* A short name for the body, for messages: "dump", "buffer_add", ... */
const char *msg_body_name(const Gpucr__Msg *m);

#endif
