/* gpucr's CRIU plugin, internal interfaces: logging into CRIU's log, the
 * client side of the daemon protocol, the driver checkpoint calls (through
 * gpucrd, or the driver loaded here when there is no daemon), and the
 * ptrace steps around the driver's restore thread. */
#ifndef GPUCR_PLUGIN_H
#define GPUCR_PLUGIN_H

#include <stdint.h>
#include <sys/types.h>

#include "msg.h"

/* CRIU's levels (criu/include/log.h). */
enum { PL_ERR = 1, PL_WARN = 2, PL_INFO = 3, PL_DEBUG = 4 };
void plog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define pl_err(...) plog(PL_ERR, __VA_ARGS__)
#define pl_warn(...) plog(PL_WARN, __VA_ARGS__)
#define pl_info(...) plog(PL_INFO, __VA_ARGS__)
#define pl_debug(...) plog(PL_DEBUG, __VA_ARGS__)
void plog_init(void);

/* client.c: one connection to gpucrd per CRIU run. */
int client_connect(void);          /* 0, or -errno when gpucrd is not there */
int client_connected(void);
void client_close(void);
/* Sends req (fd attached if >= 0) and waits for its reply; *ret is the reply
 * (msg_free it) when the daemon answered, even with an error. Returns 0 or
 * -errno (transport). */
int client_call(Gpucr__Msg *req, int fd, Gpucr__Msg **ret);
/* Sends req without waiting for its reply. */
int client_send(Gpucr__Msg *req);

/* driver.c: the driver checkpoint API on pid. */
int drv_op(int pid, Gpucr__DriverOpKind op, unsigned timeout_ms, Gpucr__DriverState *ret_state,
	   int *ret_tid, char *msg, size_t msglen);

/* ptrace.c: let the driver's restore thread run while CRIU holds the
 * process stopped, and stop it again. */
struct held_thread {
	int tid;
	uint64_t sigmask;
};
/* -ESRCH, with nothing logged: tid is not a thread CRIU holds stopped (it
 * runs, or is gone). */
int thread_resume(int tid, struct held_thread *ret);
int thread_stop_again(struct held_thread *h);

#endif
