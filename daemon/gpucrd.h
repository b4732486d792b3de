/* gpucrd's internal interfaces: the server (connections, dispatch) and the
 * registry of attached processes and the memory they handed over. */
#ifndef GPUCRD_H
#define GPUCRD_H

#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <uv.h>

#include "frame.h"
#include "gpu.h"
#include "msg.h"
#include "sock.h"

struct conn;
struct dump_op;
struct precopy;
struct img_writer;

/* Monotonic time in nanoseconds, for durations. */
static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
	uint8_t uuid[16];           /* device, as the application sees it */
	struct gpu_mem mem;         /* the daemon's own mapping, once taken over */
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
	pid_t control_tid;          /* the shim's control thread */
	struct dump_op *dump;       /* dump in progress, or NULL */
	int image_done;             /* an image of the last dump is complete */
	int busy;                   /* a worker job holds the proc (restore, remap) */
	struct conn *remap_waiting; /* reattached shim waiting for the image write */
	uint64_t t_restore;         /* when the restore request came */
	int remaps_left;
	/* progress of the image being written, updated by the worker */
	uint64_t io_done, io_total;
	uint64_t t_dumped;          /* when its last image was completed */
	int save_epoch;             /* 1: Resume{save_epoch} sent, 2: the shim runs in it */
	struct conn *cr_conn;       /* whose dump request released its memory: CRIU works on the
	                             * process until that connection's Wake or close */
	int dump_err;               /* how its last dump's image failed (0: it did not) */
	int escaped;                /* a write escaped prediction in one of its save epochs */
	int remap_cut;              /* its shim did not answer a Remap/Resume in time: cut off */
	int release_late;           /* a Release its shim did not answer in time may still be
	                             * carried out: no new dump until it answers or goes */
	char dump_msg[1024];
	struct precopy *precopy;    /* a pre-copy running or held for its dump (precopy.c), or NULL */
	struct dump_figures {       /* its last dump's image, for a DumpWait after it ended */
		uint64_t stored, elapsed_ns, final_bytes, reused_bytes, precopy_bytes;
		uint32_t precopy_rounds;
		int pre_copied;
	} last;
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
	uint64_t retain_max;        /* bytes of dumped processes' memory kept at most */
	struct early_load *early;   /* images loading in the background (restore.c) */
};

/* server.c */
int server_start(struct daemon *d);
void server_stop(struct daemon *d);
int conn_send(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds);
/* Replies to request id on c: err 0 with body, or an error with a message. */
int conn_reply(struct conn *c, uint64_t id, Gpucr__Msg *body_or_null, const int *fds, unsigned nfds);
int conn_reply_err(struct conn *c, uint64_t id, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* A request from the daemon to a peer; cb runs with the reply, or with
 * reply NULL if the connection closed first. */
typedef void (*conn_reply_cb)(struct conn *c, Gpucr__Msg *reply, int *fds, unsigned nfds, void *data);
int conn_request(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds, conn_reply_cb cb,
		 void *data);
/* The same with a bound: past timeout_ms (0: none) cb runs with a reply
 * made by gpucrd, which conn_reply_timed_out() tells apart (err -ETIMEDOUT,
 * err_msg naming the request, the pid and the time). cb runs once either
 * way. The peer's real reply, if it comes later, goes to late (with data
 * NULL: whatever data pointed to may be gone by then; conn_proc() says
 * whose it is), or is logged and dropped when late is NULL. */
int conn_request_timed(struct conn *c, Gpucr__Msg *m, const int *fds, unsigned nfds, unsigned timeout_ms,
		       conn_reply_cb cb, conn_reply_cb late, void *data);
int conn_reply_timed_out(const Gpucr__Msg *reply);
/* Closes c now (its pending requests' callbacks run with reply NULL). */
void conn_shutdown(struct conn *c);
/* ROLE_SHIM: the process c controls, or NULL. */
struct proc *conn_proc(const struct conn *c);
/* How long gpucrd waits for a shim's answer to a request, beyond any drain
 * time the request itself gives it: GPUCR_SHIM_TIMEOUT_MS (default 30000). */
unsigned shim_timeout_ms(void);
uid_t conn_uid(const struct conn *c);
pid_t conn_pid(const struct conn *c);
/* Reference counting: a connection stays allocated (not open) while held. */
void conn_hold(struct conn *c);
void conn_put(struct conn *c);
int conn_is_open(const struct conn *c);
/* A duration from the environment in ms: def when unset or not a number. */
/* Runs fn on a worker thread, then done on the loop. */
int daemon_queue_work(struct daemon *d, void (*fn)(void *), void (*done)(void *, int), void *data);

/* dump.c */
int dump_start(struct daemon *d, struct conn *c, const Gpucr__Msg *req, int dirfd);
int dump_wait(struct daemon *d, struct conn *c, const Gpucr__Msg *req);
void dump_proc_gone(struct daemon *d, struct proc *p);
/* A released process's shim closed its connection: the dump's requester
 * may go on (dump.c). */
void dump_shim_detached(struct proc *p);
/* Concurrent checkpoints: may the process map its memory back now (its
 * dump is concurrent and the fingerprints at T are taken)? */
int dump_remap_now(struct proc *p);
/* May p's shim reconnect although its dump is still writing its image? */
int dump_allows_reattach(struct proc *p);
/* The Resume to send p starts a save epoch (marks it). */
int dump_resume_save_epoch(struct proc *p);
/* The shim answered a save-epoch Resume (ok or not). */
void dump_save_epoch_answered(struct proc *p, int ok);
/* ChunksWanted from p's shim. */
int dump_chunks_wanted(struct proc *p, struct conn *c, const Gpucr__Msg *req);
/* A driver operation on p (driverop.c) ended, err 0 or how it failed: the
 * image write its dump holds back may start (GPUCR_WRITE_AFTER_DRIVER). */
void dump_driver_op_done(struct proc *p, Gpucr__DriverOpKind op, int err);
/* gpucrd stops: no image write waits any longer for a driver operation. */
void dump_release_holds(struct daemon *d);

/* precopy.c */
/* PreCopyRequest: starts (or discards) a pre-copy of a running process.
 * *dirfd (or -1) is set to -1 when the pre-copy took it. */
int precopy_request(struct daemon *d, struct conn *c, const Gpucr__Msg *req, int *dirfd);
/* May p be dumped now (no pre-copy of it running)? */
int precopy_running(const struct proc *p);
/* The dump of p into dirfd starts: the pre-copy held for it if it was made
 * into the same directory (the caller owns it then; precopy_free), else
 * NULL (one made elsewhere is dropped, with a log line). */
struct precopy *precopy_take(struct proc *p, int dirfd);
struct pc_image *precopy_image(struct precopy *pc);
/* What pc wrote (all rounds) and its rounds after the first copy; 0 for NULL. */
void precopy_figures(const struct precopy *pc, uint64_t *ret_bytes, uint32_t *ret_rounds);
/* Frees a pre-copy that is not running, removing its files. Accepts NULL. */
void precopy_free(struct precopy *pc);

/* restore.c */
int restore_start(struct daemon *d, struct conn *c, const Gpucr__Msg *req, int dirfd);
/* A shim reconnected after a restore (or a leave-running dump): give it its
 * memory back. */
void restore_shim_reattached(struct daemon *d, struct proc *p, struct conn *c);

/* driverop.c */
int driver_op(struct daemon *d, struct conn *c, const Gpucr__Msg *req);
int wake_proc(struct daemon *d, struct conn *c, const Gpucr__Msg *req);

/* imgio.c: runs on worker threads. */
/* Callers zero it (or point progress_* at counters to be updated as the
 * data moves); imgio fills in the rest. */
/* A concurrent checkpoint's view of an image write (imgio_write, from its
 * worker threads): the process runs meanwhile, so the writer says when the
 * fingerprints at T are taken and which ranges (the application's
 * addresses) are saved, serves the ranges the process waits for first, and
 * checks every chunk it saves against its fingerprint at T. */
struct img_hooks {
	void *data;
	void (*fingerprinted)(void *data);
	void (*saved)(void *data, uint64_t va, uint64_t len);
	/* the next range the process waits for; 0 when none */
	int (*wanted)(void *data, uint64_t *va, uint64_t *len);
	/* whether the memory was copied on the GPU at T (after fingerprinted) */
	void (*copied)(void *data, int made);
};

/* A pre-copy's pages (imgio.c writes them, precopy.c drives the rounds):
 * every chunk of the process's buffers has its place in the pages files
 * from the start; a round stores the chunks that are dirty and records the
 * fingerprint of the bytes it stored. */
struct pc_chunk {
	uint64_t fp;                /* of the bytes stored, when stored */
	uint64_t file_off;
	uint32_t file;
	uint8_t stored;
};
struct pc_buf {
	struct rbuf rb;             /* va: the application's address of the piece (phys_offset 0),
	                             * phys_size, device, uuid; fd: a dup (owned); mem: imported
	                             * while a round runs */
	uint64_t nchunks;
	struct pc_chunk *ch;
};
struct pc_image {
	struct img_writer *w;       /* pages files under their temporary names, or NULL */
	int dirfd;                  /* owned */
	uint64_t chunk;
	uint64_t piece;             /* longest run a write takes (run_piece) */
	size_t nbufs;
	struct pc_buf *bufs;        /* sorted by va */
};

struct img_stats {
	uint64_t *progress_done, *progress_total;
	const struct img_hooks *hooks;  /* imgio_write: a concurrent checkpoint, or NULL */
	/* imgio_write: called once the fingerprints at T are taken (and, in a
	 * concurrent checkpoint, the copy on the GPU made: spare 1, or not: 0),
	 * right before the data moves device -> host; it may block (the dump
	 * holding the write back). NULL: none. */
	void (*before_data)(void *data, int spare);
	void *before_data_arg;
	uint64_t bytes, stored, elapsed_ns;
	uint64_t held_ns;               /* imgio_write: time before_data held the write (not in elapsed_ns) */
	uint32_t control_tid, uid;      /* imgio_read: from the image header */
	/* imgio_write: a pre-copy of the process into the same directory, or
	 * NULL. Its pages files become the image's (its writer is taken); the
	 * chunks whose fingerprint at T is that of the bytes it stored, read
	 * back and checked, are kept; the rest is written. */
	struct pc_image *precopy;
	int pre_copied;                 /* imgio_write: the image was finished from it */
	uint64_t final_bytes, reused_bytes;
	int escaped;
	char comm[64];
};
/* Pre-copy: lays out and creates pc's pages files in pc->dirfd (every
 * chunk of pc->bufs gets its place); then rounds: fingerprints on the
 * device, and with store the chunks that are dirty (non-zero and not what
 * was stored) are written. ret_dirty: dirty bytes found; ret_written: bytes
 * written. */
int imgio_precopy_open(struct pc_image *pc, pid_t pid, char *msg, size_t msglen);
int imgio_precopy_round(struct pc_image *pc, pid_t pid, int store, uint64_t *ret_dirty, uint64_t *ret_written,
			char *msg, size_t msglen);
/* Removes pc's files (unless imgio_write took them), frees what pc holds. */
void imgio_precopy_free(struct pc_image *pc);

/* Pins the staging buffers image transfers use ahead of the first one. */
void imgio_prefill(void);
int imgio_write(struct proc *p, int dirfd, struct img_stats *st, char *msg, size_t msglen);
/* Loads the image of pid into new GPU memory, as rbufs (caller frees them
 * on failure with registry code). */
int imgio_read(pid_t pid, int dirfd, struct rbuf **ret_bufs, struct img_stats *st, char *msg,
	       size_t msglen);

/* registry.c */
struct proc *registry_find(struct daemon *d, pid_t pid);
struct proc *registry_attach(struct daemon *d, pid_t pid, uid_t uid, const char *comm);
int registry_buffer_add(struct proc *p, const Gpucr__BufferAdd *ba, int fd);
int registry_buffer_free(struct proc *p, uint64_t va);
/* The shim's connection went away: keep the process's memory if it is
 * dumped (retention), else forget the process. */
void registry_detach(struct daemon *d, struct proc *p);
/* Connection c closed: CRIU is no longer working on the processes whose
 * dump it requested (proc.cr_conn). */
void registry_forget_conn(struct daemon *d, struct conn *c);
/* p holds a dumped process's GPU memory for its restore: released,
 * dumped or restoring. Its buffers may be none at all: an application that
 * allocates all its memory itself through the driver's VMM calls (PyTorch's
 * expandable segments), which the shim passes through and the driver's own
 * checkpoint carries. */
static inline int registry_keeps(const struct proc *p)
{
	return p->state == GPUCR__PROC_STATE__PROC_DUMPED || p->state == GPUCR__PROC_STATE__PROC_RELEASED ||
	       p->state == GPUCR__PROC_STATE__PROC_RESTORING;
}
void registry_drop(struct daemon *d, struct proc *p);
void registry_free_all(struct daemon *d);
/* Imports every buffer's fd into the daemon (worker thread). */
int registry_take_over(struct proc *p, char *msg, size_t msglen);
/* Maps b's memory into gpucrd from its fd, on the device b names (by
 * UUID, else by ordinal); msg says what failed, without the pid. Expects
 * gpu_init() done. */
int rbuf_import(struct rbuf *b, char *msg, size_t msglen);
/* Lets go of b's mapping and fd (fd -1 after), keeping b itself. */
void rbuf_release(struct rbuf *b);
void rbuf_free(struct rbuf *b);
/* Frees the memory kept for dumped processes, oldest first, while more than
 * d->retain_max bytes are kept. Only memory whose image is complete goes. */
void registry_enforce_cap(struct daemon *d);
/* May a peer of uid act on p? root on any, others on their own. */
static inline int registry_may_act(uid_t peer_uid, const struct proc *p)
{
	return peer_uid == 0 || peer_uid == p->uid;
}

/* notify.c: systemd readiness (no libsystemd needed). */
void notify_ready(const char *status);
int listen_fds_from_systemd(void);

#endif
