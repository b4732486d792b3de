/* The control thread: connection to gpucrd, reports of gpucr's memory, and
 * the quiesce / release / remap / resume requests. See control.h.
 *
 * States of the process, as the daemon drives them:
 *   RUNNING   gate open.
 *   QUIESCED  gate closed, device drained; memory still mapped.
 *   RELEASED  gate closed, every chunk unmapped and its physical memory
 *             released (only the daemon's fds keep it); the connection is
 *             closed, so that CRIU can dump the process, and the thread
 *             waits for the wake signal (or 1 s) to reconnect with
 *             Hello{restored=1} and take the memory back (remap).
 * The connection dropping in QUIESCED reopens the gate (the application
 * goes on; the dump it was for cannot). In RELEASED the memory is only in
 * the daemon: the thread keeps reconnecting until a daemon gives it back,
 * unless one answers Hello{restored=1} with -ENOENT (it has neither the
 * memory nor an image): then the memory is lost, and the gate opens so that
 * the application fails instead of hanging.
 *
 * Draining after the gate closes (quiesce). Wrappers that change gpucr's
 * memory are counted in flight and waited for (gate_wait_idle). Then the
 * primary context of every device where it is active is synchronised, the
 * thread pauses GPUCR_QUIESCE_GRACE_MS (2 ms) and synchronises again. What
 * remains: a thread that passed a trampoline's gate check just before the
 * gate closed is not seen (counting every call would cost an atomic on a
 * shared line per call). Work it submits after the second synchronisation
 * is not drained: a thread preempted for longer than the grace between the
 * check and the driver's enqueue, or a long synchronous call (a pageable
 * cuMemcpyHtoD of gigabytes) that keeps feeding the device. Release
 * synchronises once more before unmapping, and the driver's own lock
 * (cuCheckpointProcessLock, run by the daemon afterwards) waits for calls
 * still inside the driver. Contexts the application created itself
 * (cuCtxCreate) are not synchronised: gpucr does not track them.
 *
 * Threads: the control thread and, per quiesce, a drain helper (the
 * driver's synchronisation cannot be interrupted; the control thread waits
 * for it with the daemon's timeout and, past it, reopens the gate and
 * leaves the helper to finish alone). Both block every signal; the control
 * thread takes the wake signal with sigtimedwait(). */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "buftab.h"
#include "chunkgate.h"
#include "control.h"
#include "counts.h"
#include "epoch.h"
#include "frame.h"
#include "gate.h"
#include "msg.h"
#include "real.h"
#include "sock.h"
#include "suspect.h"
#include "vmm.h"

#define CTL_RETRY_MS 2000          /* connect attempts without a daemon */
#define CTL_RETRY_RELEASED_MS 1000 /* and while the daemon holds our memory */
#define CTL_HELLO_TIMEOUT_MS 5000
#define CTL_QUIESCE_TIMEOUT_MS 10000 /* when the daemon names none */
#define CTL_RELEASE_DRAIN_MS 10000
#define CTL_GRACE_MS 2

enum ctl_state {
	ST_RUNNING,
	ST_QUIESCED,
	ST_RELEASED,
};

static const char *const state_names[] = { "running", "quiesced", "released" };

struct drain {
	pthread_mutex_t lock;
	pthread_cond_t cond; /* CLOCK_MONOTONIC */
	int grace_ms;
	bool done;
	bool abandoned;
	int err;
	char what[160]; /* why it failed */
};

/* Read by application threads: started, connected, kicked, kickfd. The
 * rest belongs to the control thread. */
static struct {
	int started;   /* control_start() ran in this process */
	int connected; /* a daemon hears of changes: kicks matter */
	int kicked;    /* a kick is pending in kickfd */
	int kickfd;    /* eventfd: the doorbell */

	pid_t tid;
	int wake_sig;
	int retry_ms;  /* GPUCR_RECONNECT_MS, or 0 for the defaults */
	int grace_ms;
	int sock;
	uint64_t next_id;
	enum ctl_state state;
	bool told_absent;   /* said once that no daemon answers */
	bool told_released; /* said once that it does not while it holds our memory */
	/* Remap batches gathered until the last one. */
	struct alloc_chunk_fd *remap;
	size_t nremap, remap_cap;
	/* Device UUIDs for BufferAdd. */
	uint8_t uuid[VMM_MAX_DEVICES][16];
	bool have_uuid[VMM_MAX_DEVICES];
} ctl = { .kickfd = -1, .sock = -1 };

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static int drain_busy; /* a drain helper is running (maybe abandoned) */

/* ---- small helpers ------------------------------------------------------ */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int env_int(const char *name, int def, int min, int max)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min || v > max) {
		pr_warn("ignoring %s=%s (expected a number from %d to %d)\n", name, s, min, max);
		return def;
	}
	return (int)v;
}

static bool env_off(const char *name)
{
	const char *s = getenv(name);

	return s && (!strcmp(s, "0") || !strcmp(s, "off") || !strcmp(s, "no") || !strcmp(s, "false"));
}

static void read_comm(char *buf, size_t len)
{
	int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, len - 1) : -1;

	if (fd >= 0)
		close(fd);
	if (n < 0)
		n = 0;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

static const uint8_t *device_uuid(int device)
{
	CUuuid u;

	if (device < 0 || device >= VMM_MAX_DEVICES)
		return NULL;
	if (!ctl.have_uuid[device]) {
		if (!real.cuDeviceGetUuid_v2 || real.cuDeviceGetUuid_v2(&u, device) != CUDA_SUCCESS)
			return NULL;
		memcpy(ctl.uuid[device], u.bytes, 16);
		ctl.have_uuid[device] = true;
	}
	return ctl.uuid[device];
}

/* The driver calls of gpucr's threads (exports, event queries, context
 * synchronisation) must not fail, nor invalidate a capture that an
 * application thread has open in global mode: the thread's capture mode
 * is relaxed, for good. */
static void capture_relax_self(void)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (real.cuThreadExchangeStreamCaptureMode)
		real.cuThreadExchangeStreamCaptureMode(&m);
}

/* ---- sending ------------------------------------------------------------ */

static int send_msg(Gpucr__Msg *m, const int *fds, unsigned nfds)
{
	int err = msg_send(ctl.sock, m, fds, nfds);

	if (err)
		pr_debug("send %s to gpucrd: %s\n", msg_body_name(m), gpucr_strerror(err));
	return err;
}

/* The answer to request id: err 0, or err and a message saying why. body
 * may be NULL. */
static int reply(uint64_t id, int err, Gpucr__Msg *body, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int reply(uint64_t id, int err, Gpucr__Msg *body, const char *fmt, ...)
{
	Gpucr__Msg init = GPUCR__MSG__INIT;
	Gpucr__Msg *m = body ? body : &init;
	char text[512];

	m->has_reply_to = true;
	m->reply_to = id;
	m->has_err = true;
	m->err = err;
	if (err && fmt) {
		va_list ap;

		va_start(ap, fmt);
		vsnprintf(text, sizeof(text), fmt, ap);
		va_end(ap);
		m->err_msg = text;
		pr_warn("%s\n", text);
	}
	return send_msg(m, NULL, 0);
}

static int send_buffer_add(const struct alloc_chunk_fd *c)
{
	Gpucr__BufferAdd ba = GPUCR__BUFFER_ADD__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	const uint8_t *uuid = device_uuid(c->device);

	ba.va = c->va;
	ba.size = c->size;
	ba.device = (uint32_t)c->device;
	ba.has_kind = true;
	ba.kind = c->app ? GPUCR__BUFFER_KIND__BUF_APP_VMM
		  : c->slab ? GPUCR__BUFFER_KIND__BUF_SLAB : GPUCR__BUFFER_KIND__BUF_ALLOC;
	ba.has_phys_size = true;
	ba.phys_size = c->size;
	ba.has_phys_offset = true;
	ba.phys_offset = 0;
	ba.has_reserve_va = true;
	ba.reserve_va = c->reserve_va;
	ba.has_reserve_size = true;
	ba.reserve_size = c->reserve_size;
	if (uuid) {
		ba.has_device_uuid = true;
		ba.device_uuid.len = 16;
		ba.device_uuid.data = (uint8_t *)uuid;
	}
	m.has_id = true;
	m.id = 0;
	m.body_case = GPUCR__MSG__BODY_BUFFER_ADD;
	m.buffer_add = &ba;
	return send_msg(&m, &c->fd, 1);
}

static int send_buffer_free(CUdeviceptr va)
{
	Gpucr__BufferFree bf = GPUCR__BUFFER_FREE__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	bf.va = va;
	m.has_id = true;
	m.id = 0;
	m.body_case = GPUCR__MSG__BODY_BUFFER_FREE;
	m.buffer_free = &bf;
	return send_msg(&m, NULL, 0);
}

/* Tells the daemon what changed since it last heard: frees first (an
 * address may be reused by a chunk added after). */
static int flush_changes(void)
{
	struct alloc_changes c;
	size_t i;
	int err;

	err = alloc_collect(&c);
	if (err) {
		pr_warn("cannot export gpucr's device memory for gpucrd: %s\n", gpucr_strerror(err));
		return err;
	}
	for (i = 0; i < c.nfreed && !err; i++) {
		pr_debug("buffer_free %#llx\n", (unsigned long long)c.freed[i]);
		err = send_buffer_free(c.freed[i]);
	}
	for (i = 0; i < c.nadded && !err; i++) {
		pr_debug("buffer_add %#llx (%zu bytes, device %d%s)\n", (unsigned long long)c.added[i].va,
			 c.added[i].size, c.added[i].device,
			 c.added[i].app ? ", the application's VMM" : c.added[i].slab ? ", slab" : "");
		err = send_buffer_add(&c.added[i]);
		close(c.added[i].fd);
		c.added[i].fd = -1;
	}
	alloc_changes_free(&c);
	return err;
}

/* Whether a flush_changes() error is gpucr's or the driver's (the chunks
 * are tried again at the next kick) rather than the connection's. */
static bool flush_err_is_local(int err)
{
	return err == -ENOMEM || gpucr_err_is_cu(err);
}

/* ---- draining the device ---------------------------------------------- */

/* Synchronises the primary context of every device where it is active. */
static int sync_contexts(char *what, size_t whatlen)
{
	int n = 0, d;

	if (!real.cuDeviceGetCount || !real.cuDevicePrimaryCtxGetState || !real.cuDevicePrimaryCtxRetain ||
	    !real.cuDevicePrimaryCtxRelease_v2 || !real.cuCtxPushCurrent_v2 || !real.cuCtxPopCurrent_v2 ||
	    !real.cuCtxSynchronize) {
		snprintf(what, whatlen, "the driver lacks the context calls gpucr drains the device with");
		return -ENOSYS;
	}
	if (real.cuDeviceGetCount(&n) != CUDA_SUCCESS)
		return 0; /* no devices, nothing to drain */
	for (d = 0; d < n; d++) {
		unsigned int flags = 0;
		CUcontext c = NULL, old = NULL;
		int active = 0;
		CUresult r;

		if (real.cuDevicePrimaryCtxGetState(d, &flags, &active) != CUDA_SUCCESS || !active)
			continue;
		if (real.cuDevicePrimaryCtxRetain(&c, d) != CUDA_SUCCESS)
			continue;
		r = real.cuCtxPushCurrent_v2(c);
		if (r == CUDA_SUCCESS) {
			r = real.cuCtxSynchronize();
			real.cuCtxPopCurrent_v2(&old);
		}
		real.cuDevicePrimaryCtxRelease_v2(d);
		if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
		    r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
			snprintf(what, whatlen,
				 "device %d: a stream is being captured into a CUDA graph (%s); "
				 "quiesce again once the capture ends",
				 d, gpucr_cu_name(r) ? gpucr_cu_name(r) : "capture");
			return -EBUSY;
		}
		if (r != CUDA_SUCCESS) {
			snprintf(what, whatlen, "device %d: synchronising its context: %s", d,
				 gpucr_strerror(gpucr_err_from_cu(r)));
			return gpucr_err_from_cu(r);
		}
	}
	return 0;
}

static void drain_free(struct drain *d)
{
	pthread_mutex_destroy(&d->lock);
	pthread_cond_destroy(&d->cond);
	free(d);
}

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	bool abandoned;
	int err;

	gate_exempt_self();
	capture_relax_self();
	gate_wait_idle(-1);
	err = sync_contexts(d->what, sizeof(d->what));
	if (!err && d->grace_ms > 0) {
		sleep_ms(d->grace_ms);
		err = sync_contexts(d->what, sizeof(d->what));
	}
	pthread_mutex_lock(&d->lock);
	d->done = true;
	d->err = err;
	abandoned = d->abandoned;
	pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
	if (abandoned) {
		pr_info("the device drained after all (%s)\n", err ? d->what : "no error");
		drain_free(d);
		__atomic_store_n(&drain_busy, 0, __ATOMIC_RELEASE);
	}
	return NULL;
}

/* Waits for counted calls to leave, then drains the device, within
 * timeout_ms. 0, -ETIMEDOUT, -EBUSY (an earlier drain is still stuck), or
 * the driver's error (what says more). */
static int drain(int timeout_ms, int grace_ms, char *what, size_t whatlen)
{
	pthread_condattr_t ca;
	struct drain *d;
	struct timespec ts;
	pthread_t t;
	pthread_attr_t attr;
	int err;

	if (__atomic_load_n(&drain_busy, __ATOMIC_ACQUIRE)) {
		snprintf(what, whatlen, "an earlier drain is still waiting for the device");
		return -EBUSY;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->grace_ms = grace_ms;
	pthread_mutex_init(&d->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cond, &ca);
	pthread_condattr_destroy(&ca);

	__atomic_store_n(&drain_busy, 1, __ATOMIC_RELEASE);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = -pthread_create(&t, &attr, drain_main, d); /* inherits our blocked signals */
	pthread_attr_destroy(&attr);
	if (err) {
		__atomic_store_n(&drain_busy, 0, __ATOMIC_RELEASE);
		drain_free(d);
		snprintf(what, whatlen, "cannot start a thread to drain the device: %s", strerror(-err));
		return err;
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&d->lock);
	while (!d->done && pthread_cond_timedwait(&d->cond, &d->lock, &ts) != ETIMEDOUT)
		;
	if (!d->done) {
		d->abandoned = true; /* the helper frees it when the driver lets go */
		pthread_mutex_unlock(&d->lock);
		snprintf(what, whatlen,
			 "the device did not drain within %d ms (a kernel that does not end, or a call "
			 "that does not return; %u thread(s) wait at the gate)",
			 timeout_ms, gate_waiters());
		return -ETIMEDOUT;
	}
	pthread_mutex_unlock(&d->lock);
	err = d->err;
	if (err)
		snprintf(what, whatlen, "%s", d->what);
	drain_free(d);
	__atomic_store_n(&drain_busy, 0, __ATOMIC_RELEASE);
	return err;
}

/* ---- requests ------------------------------------------------------------- */

struct usage {
	size_t n;
	uint64_t bytes;
	enum buf_kind kind;
};

static int count_kind(const struct buf *b, void *arg)
{
	struct usage *u = arg;

	if (b->kind == u->kind) {
		u->n++;
		u->bytes += b->size;
	}
	return 0;
}

static struct usage usage_of(enum buf_kind kind)
{
	struct usage u = { .kind = kind };

	buftab_for_each(count_kind, &u);
	return u;
}

static void fill_stats(Gpucr__ShimStats *st)
{
	struct usage vmm = usage_of(BUF_VMM), sub = usage_of(BUF_SUB), drv = usage_of(BUF_DRIVER),
		     man = usage_of(BUF_MANAGED), app = usage_of(BUF_APP);
	struct suspect_stats sus;

	st->has_buffers = true;
	st->buffers = vmm.n + sub.n + app.n;
	st->has_bytes = true;
	st->bytes = vmm.bytes + sub.bytes + app.bytes;
	st->has_unowned_bytes = true;
	st->unowned_bytes = drv.bytes;
	st->has_managed_bytes = true;
	st->managed_bytes = man.bytes;
	st->has_launches = true;
	st->launches = shim_count_read(SHIM_COUNT_KERNELS);
	suspect_get_stats(&sus);
	st->has_unpredictable = true;
	st->unpredictable = sus.unpredictable;
	st->has_unpredictable_lost = true;
	st->unpredictable_lost = sus.lost;
}

static void do_quiesce(uint64_t id, const Gpucr__Quiesce *q)
{
	int timeout = q && q->has_timeout_ms && q->timeout_ms ? (int)q->timeout_ms : CTL_QUIESCE_TIMEOUT_MS;
	Gpucr__ShimStats st = GPUCR__SHIM_STATS__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	struct usage man;
	char what[256];
	int64_t t0;
	int err;

	if (timeout < 0) /* from a uint32 beyond INT_MAX */
		timeout = INT32_MAX;
	if (ctl.state != ST_RUNNING) {
		reply(id, 0, NULL, NULL); /* already */
		return;
	}
	/* A new cut: the save epoch of the last one (if gpucrd has not ended
	 * it) must not hold calls that the drain below waits for, nor outlive
	 * the checkpoint it was for. */
	epoch_cut();
	man = usage_of(BUF_MANAGED);
	if (man.n) {
		reply(id, -EBUSY, NULL,
		      "the process holds %llu bytes of managed memory in %zu allocation(s) "
		      "(cuMemAllocManaged): neither gpucr nor the driver can checkpoint it",
		      (unsigned long long)man.bytes, man.n);
		return;
	}
	t0 = now_ms();
	gate_close();
	err = drain(timeout, ctl.grace_ms, what, sizeof(what));
	if (err) {
		gate_open();
		reply(id, err, NULL, "quiesce: %s; gate reopened", what);
		return;
	}
	/* Every allocation has left: the daemon must have every chunk before
	 * it copies or takes over memory. */
	err = flush_changes();
	if (err) {
		gate_open();
		reply(id, err, NULL, "quiesce: reporting device memory: %s; gate reopened",
		      gpucr_strerror(err));
		return;
	}
	ctl.state = ST_QUIESCED;
	fill_stats(&st);
	m.body_case = GPUCR__MSG__BODY_SHIM_STATS;
	m.shim_stats = &st;
	pr_info("quiesced in %lld ms (%llu bytes in %llu buffers)\n", (long long)(now_ms() - t0),
		(unsigned long long)st.bytes, (unsigned long long)st.buffers);
	reply(id, 0, &m, NULL);
}

/* Returns true when the connection is to be closed (memory released). */
/* A wake signal still pending from an earlier dump (it came after this
 * thread had already reconnected on its own) must not end the wait of this
 * one: taken right after the release, before CRIU runs, it would reconnect
 * while CRIU dumps the process (CRIU then finds a socket to gpucrd open).
 * The wake for this dump comes only after CRIU is done. */
static void drain_wake(void)
{
	struct timespec zero = { 0, 0 };
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, ctl.wake_sig);
	while (sigtimedwait(&set, NULL, &zero) == ctl.wake_sig)
		pr_debug("dropped a stale wake signal\n");
}

static bool do_release(uint64_t id)
{
	size_t total, mapped;
	char what[256];
	int err;

	if (ctl.state != ST_QUIESCED) {
		reply(id, -EINVAL, NULL, "release: the process is %s, not quiesced", state_names[ctl.state]);
		return false;
	}
	err = flush_changes();
	if (!err)
		err = drain(CTL_RELEASE_DRAIN_MS, 0, what, sizeof(what));
	else
		snprintf(what, sizeof(what), "reporting device memory: %s", gpucr_strerror(err));
	if (err) {
		reply(id, err, NULL, "release: %s; nothing released", what);
		return false;
	}
	total = alloc_chunk_count(NULL);
	err = alloc_release_all();
	alloc_chunk_count(&mapped);
	if (err) {
		if (mapped < total)
			ctl.state = ST_RELEASED; /* remap puts the rest back */
		reply(id, err, NULL, "release: %s (%zu of %zu chunks released; remap them)",
		      gpucr_strerror(err), total - mapped, total);
		return false;
	}
	ctl.state = ST_RELEASED;
	drain_wake();
	pr_info("released %zu chunk(s) of device memory; waiting for signal %d to thread %d, "
		"or reconnecting in %d ms\n",
		total, ctl.wake_sig, (int)ctl.tid, ctl.retry_ms ? ctl.retry_ms : CTL_RETRY_RELEASED_MS);
	reply(id, 0, NULL, NULL);
	return true;
}

static void remap_discard(void)
{
	size_t i;

	for (i = 0; i < ctl.nremap; i++)
		close(ctl.remap[i].fd);
	free(ctl.remap);
	ctl.remap = NULL;
	ctl.nremap = ctl.remap_cap = 0;
}

/* fds are consumed (kept for the batch or closed). */
static void do_remap(uint64_t id, const Gpucr__Remap *rm, int *fds, unsigned nfds)
{
	size_t i, n = rm ? rm->n_buffers : 0, total, mapped;
	int64_t t0;
	int err;

	if (ctl.state != ST_RELEASED) {
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		reply(id, -EINVAL, NULL, "remap: the process is %s, its memory was not released",
		      state_names[ctl.state]);
		return;
	}
	if (n != nfds) {
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		remap_discard();
		reply(id, -EBADMSG, NULL, "remap: %zu buffers listed with %u fds; batch dropped", n, nfds);
		return;
	}
	if (ctl.nremap + n > ctl.remap_cap) {
		size_t cap = ctl.remap_cap ? ctl.remap_cap : 64;
		struct alloc_chunk_fd *v;

		while (cap < ctl.nremap + n)
			cap *= 2;
		v = realloc(ctl.remap, cap * sizeof(*v));
		if (!v) {
			for (i = 0; i < nfds; i++)
				close(fds[i]);
			remap_discard();
			reply(id, -ENOMEM, NULL, "remap: no memory for %zu buffers", ctl.nremap + n);
			return;
		}
		ctl.remap = v;
		ctl.remap_cap = cap;
	}
	for (i = 0; i < n; i++) {
		const Gpucr__BufferAdd *b = rm->buffers[i];

		ctl.remap[ctl.nremap++] = (struct alloc_chunk_fd){
			.va = b->va,
			.size = b->has_phys_size && b->phys_size ? b->phys_size : b->size,
			.device = (int)b->device,
			.fd = fds[i],
		};
	}
	if (!rm->has_last || !rm->last) {
		reply(id, 0, NULL, NULL);
		return;
	}
	t0 = now_ms();
	err = alloc_remap_all(ctl.remap, ctl.nremap);
	n = ctl.nremap;
	remap_discard(); /* imported handles hold the memory now */
	total = alloc_chunk_count(&mapped);
	if (err) {
		reply(id, err, NULL, "remap: %s (%zu of %zu chunks mapped, from %zu fds)",
		      err == -ENOENT ? "some chunks got no fd" : gpucr_strerror(err), mapped, total, n);
		return;
	}
	ctl.state = ST_QUIESCED;
	pr_info("device memory mapped back at its addresses (%zu chunks) in %lld ms\n", total,
		(long long)(now_ms() - t0));
	reply(id, 0, NULL, NULL);
}

/* Resume{save_epoch}: the epoch begins before the gate opens, so that no
 * call passes between them unchecked (chunkgate.h). When it cannot begin
 * the gate stays closed: gpucrd finishes its image and sends a plain
 * Resume. */
static void do_resume(uint64_t id, const Gpucr__Resume *rs)
{
	bool save = rs && rs->has_save_epoch && rs->save_epoch;
	size_t total, mapped;
	char what[256];
	int err;

	if (ctl.state == ST_RELEASED) {
		total = alloc_chunk_count(&mapped);
		if (mapped < total) {
			reply(id, -EINVAL, NULL,
			      "resume: %zu of %zu chunks of device memory are still released; remap them first",
			      total - mapped, total);
			return;
		}
	}
	if (save && ctl.state == ST_RUNNING) {
		reply(id, -EINVAL, NULL,
		      "resume: a save epoch starts from a quiesced process; this one runs%s",
		      epoch_is_open() ? " (in a save epoch already)" : "");
		return;
	}
	if (save && epoch_all_saved()) {
		pr_debug("resume: gpucrd saved everything already; no save epoch\n");
		save = false;
	}
	if (save) {
		err = epoch_begin(what, sizeof(what));
		if (err) {
			reply(id, err, NULL, "resume: cannot begin the save epoch: %s; the gate stays closed",
			      what);
			return;
		}
	}
	if (ctl.state != ST_RUNNING) {
		gate_open();
		pr_info("resumed%s\n", save ? " in a save epoch" : "");
	}
	ctl.state = ST_RUNNING;
	reply(id, 0, NULL, NULL);
}

/* ChunksSaved{all, escaped}: the epoch failed; the launches it let go are
 * the suspects, held in every later epoch, and named in the answer. */
static void do_escaped(uint64_t id)
{
	static struct suspect_report rep; /* the control thread's only */
	Gpucr__Suspects su = GPUCR__SUSPECTS__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT;
	char *names[SUSPECT_REPORT_MAX];
	size_t n = epoch_escaped(&rep);

	for (size_t i = 0; i < rep.n; i++)
		names[i] = rep.name[i];
	su.n_names = rep.n;
	su.names = names;
	su.has_more = rep.more != 0;
	su.more = rep.more;
	su.has_incomplete = rep.incomplete;
	su.incomplete = rep.incomplete;
	if (n)
		pr_info("a GPU write escaped prediction in the save epoch: %zu function(s) launched in it "
			"(%s%s%s%s) wait for the whole of every later one\n",
			n, rep.name[0], n > 1 ? ", " : "", n > 1 ? rep.name[1] : "", n > 2 ? ", ..." : "");
	else
		pr_info("a GPU write escaped prediction in the save epoch, which let no launch go early\n");
	m.body_case = GPUCR__MSG__BODY_SUSPECTS;
	m.suspects = &su;
	reply(id, 0, &m, NULL);
}

/* Always answered OK: ranges saved outside an epoch are kept for the next
 * one (epoch.h), or are stale (the process runs; the epoch ended). */
static void do_chunks_saved(uint64_t id, const Gpucr__ChunksSaved *cs)
{
	if (cs && cs->has_escaped && cs->escaped) {
		do_escaped(id);
		return;
	}
	if (cs && (epoch_is_open() || ctl.state != ST_RUNNING))
		epoch_saved(cs);
	reply(id, 0, NULL, NULL);
}

/* Asks gpucrd for the chunks the gate's waiting calls need, in one
 * ChunksWanted; the reply is not waited for (handle() drops replies). */
static int send_chunks_wanted(void)
{
	Gpucr__ChunksWanted cw;
	Gpucr__Msg m = GPUCR__MSG__INIT;

	if (!epoch_wanted(&cw))
		return 0;
	pr_debug("chunks_wanted: %zu range(s)%s\n", cw.n_ranges, cw.has_all && cw.all ? ", all" : "");
	m.has_id = true;
	m.id = ++ctl.next_id;
	m.body_case = GPUCR__MSG__BODY_CHUNKS_WANTED;
	m.chunks_wanted = &cw;
	return send_msg(&m, NULL, 0);
}

/* ---- the connection ----------------------------------------------------- */

static void disconnect(void)
{
	/* No daemon saves for us any more: nobody may wait for it. */
	epoch_end("the connection to gpucrd closed");
	__atomic_store_n(&ctl.connected, 0, __ATOMIC_RELEASE);
	if (ctl.sock >= 0)
		close(ctl.sock);
	ctl.sock = -1;
	remap_discard();
}

static void connection_lost(int err)
{
	static bool warned;

	disconnect();
	switch (ctl.state) {
	case ST_QUIESCED:
		epoch_cut(); /* the cut is abandoned: what was saved of it means nothing */
		/* Said before the gate opens: once the application runs on, a
		 * reader of the log (unit-shim-control-drop) must find it. */
		if (!warned) {
			warned = true;
			pr_warn("the connection to gpucrd was lost (%s) while the process was quiesced; "
				"the application runs on\n",
				gpucr_strerror(err));
		} else {
			pr_debug("connection to gpucrd lost while quiesced; gate reopened\n");
		}
		gate_open();
		ctl.state = ST_RUNNING;
		break;
	case ST_RELEASED:
		pr_err("the connection to gpucrd was lost (%s) while it holds this process's GPU memory; "
		       "the process waits for gpucrd to give it back\n",
		       gpucr_strerror(err));
		break;
	default:
		pr_info("the connection to gpucrd was lost (%s); retrying\n", gpucr_strerror(err));
		break;
	}
}

/* One message from the daemon. Returns false when the connection is to be
 * closed. fds are consumed. */
static bool handle(Gpucr__Msg *m, int *fds, unsigned nfds)
{
	uint64_t id = m->has_id ? m->id : 0;
	bool keep = true;
	unsigned i;

	pr_debug("gpucrd: %s (id %llu, %u fds)\n", msg_body_name(m), (unsigned long long)id, nfds);
	if (!id || (m->has_reply_to && m->reply_to)) {
		/* A reply (to ChunksWanted: nothing waits for it) or a notice. */
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		return true;
	}
	if (m->body_case == GPUCR__MSG__BODY_REMAP) {
		do_remap(id, m->remap, fds, nfds);
		return true;
	}
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	switch (m->body_case) {
	case GPUCR__MSG__BODY_QUIESCE:
		do_quiesce(id, m->quiesce);
		break;
	case GPUCR__MSG__BODY_RELEASE:
		keep = !do_release(id);
		break;
	case GPUCR__MSG__BODY_RESUME:
		do_resume(id, m->resume);
		break;
	case GPUCR__MSG__BODY_CHUNKS_SAVED:
		do_chunks_saved(id, m->chunks_saved);
		break;
	default:
		reply(id, -EOPNOTSUPP, NULL, "gpucr's shim does not handle %s requests", msg_body_name(m));
		break;
	}
	return keep;
}

/* Connects and says Hello. 0, or -errno (no daemon, or it refused). */
static int try_connect(void)
{
	Gpucr__Hello h = GPUCR__HELLO__INIT;
	Gpucr__Msg m = GPUCR__MSG__INIT, *r = NULL;
	const char *path = sock_default_path();
	struct pollfd pfd;
	int fds[FRAME_MAX_FDS];
	unsigned nfds = 0, i;
	char comm[64];
	int fd, err;

	fd = sock_connect_unix(path);
	if (fd < 0) {
		if (ctl.state == ST_RELEASED && !ctl.told_released) {
			ctl.told_released = true;
			pr_err("cannot reach gpucrd at %s (%s); it holds this process's GPU memory: "
			       "waiting for it to give it back\n",
			       path, gpucr_strerror(fd));
		} else if (!ctl.told_absent) {
			ctl.told_absent = true;
			pr_debug("no gpucrd at %s (%s); trying every %d ms\n", path, gpucr_strerror(fd),
				 ctl.retry_ms ? ctl.retry_ms : CTL_RETRY_MS);
		}
		return fd;
	}
	ctl.sock = fd;
	read_comm(comm, sizeof(comm));
	h.proto_version = GPUCR_PROTO_VERSION;
	h.role = GPUCR__ROLE__ROLE_SHIM;
	h.gpucr_version = (char *)GPUCR_VERSION;
	h.comm = comm;
	h.has_restored = true;
	h.restored = ctl.state == ST_RELEASED;
	h.has_control_tid = true;
	h.control_tid = (uint32_t)ctl.tid;
	m.has_id = true;
	m.id = ++ctl.next_id;
	m.body_case = GPUCR__MSG__BODY_HELLO;
	m.hello = &h;
	err = send_msg(&m, NULL, 0);
	if (err)
		goto fail;
	pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
	if (poll(&pfd, 1, CTL_HELLO_TIMEOUT_MS) <= 0) {
		err = -ETIMEDOUT;
		goto fail;
	}
	err = msg_recv(fd, &r, fds, FRAME_MAX_FDS, &nfds);
	if (err)
		goto fail;
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	if (!r->has_reply_to || r->reply_to != m.id) {
		err = -EPROTO;
		goto fail;
	}
	if (r->has_err && r->err) {
		err = r->err;
		if (ctl.state == ST_RELEASED && err == -ENOENT) {
			/* gpucrd says it holds no memory for this process and has
			 * no image of it (a failed restore that CRIU let run on):
			 * waiting cannot bring it back. Failing calls beat a process
			 * that hangs for ever. */
			pr_err("gpucrd has no GPU memory for this process (%s); its device memory is lost: "
			       "the gate opens and CUDA work touching that memory fails\n",
			       r->err_msg ? r->err_msg : gpucr_strerror(err));
			ctl.state = ST_RUNNING;
			epoch_cut();
			gate_open();
		} else {
			pr_debug("gpucrd refused hello: %s\n", r->err_msg ? r->err_msg : gpucr_strerror(err));
		}
		goto fail;
	}
	if (r->body_case != GPUCR__MSG__BODY_HELLO_REPLY) {
		err = -EPROTO;
		goto fail;
	}
	msg_free(r);
	ctl.told_absent = false;
	ctl.told_released = false;
	pr_info("connected to gpucrd at %s (control thread %d%s)\n", path, (int)ctl.tid,
		ctl.state == ST_RELEASED ? ", memory released: asking for it back" : "");
	/* A new connection starts from nothing: report every chunk there is
	 * (none while released; remap brings them back). */
	alloc_forget_reports();
	__atomic_store_n(&ctl.connected, 1, __ATOMIC_RELEASE);
	err = flush_changes();
	if (err && !flush_err_is_local(err)) {
		connection_lost(err);
		return err;
	}
	return 0;

fail:
	msg_free(r);
	pr_debug("hello to gpucrd at %s: %s\n", path, gpucr_strerror(err));
	close(fd);
	ctl.sock = -1;
	return err;
}

/* Serves the connection until it ends. */
static void serve(void)
{
	int fds[FRAME_MAX_FDS];

	while (ctl.sock >= 0) {
		struct pollfd pfd[3] = {
			{ .fd = ctl.sock, .events = POLLIN },
			{ .fd = ctl.kickfd, .events = POLLIN },
			{ .fd = epoch_request_fd(), .events = POLLIN }, /* -1: ignored */
		};
		Gpucr__Msg *m = NULL;
		unsigned nfds = 0;
		uint64_t v;
		int err;

		if (poll(pfd, 3, -1) < 0) {
			if (errno != EINTR) {
				connection_lost(-errno);
				return;
			}
			continue;
		}
		if (pfd[1].revents & POLLIN) {
			while (read(ctl.kickfd, &v, sizeof(v)) > 0)
				;
			/* Cleared before collecting: a change after the collect rings again. */
			__atomic_store_n(&ctl.kicked, 0, __ATOMIC_SEQ_CST);
			err = flush_changes();
			if (err && !flush_err_is_local(err)) {
				connection_lost(err);
				return;
			}
		}
		if (pfd[2].revents & POLLIN) {
			err = send_chunks_wanted();
			if (err) {
				connection_lost(err);
				return;
			}
		}
		if (!pfd[0].revents)
			continue;
		err = msg_recv(ctl.sock, &m, fds, FRAME_MAX_FDS, &nfds);
		if (err) {
			connection_lost(err);
			return;
		}
		if (!handle(m, fds, nfds)) {
			const char *fi = getenv("GPUCR_FI_RELEASE_CLOSE_MS"); /* tests: a slow close */

			msg_free(m);
			if (fi && atoi(fi) > 0)
				usleep((useconds_t)atoi(fi) * 1000);
			disconnect(); /* released: CRIU cannot dump a connected socket */
			return;
		}
		msg_free(m);
	}
}

/* Until the next connect attempt: the retry period, cut short by the wake
 * signal. */
static void wait_retry(void)
{
	int ms = ctl.retry_ms ? ctl.retry_ms : ctl.state == ST_RELEASED ? CTL_RETRY_RELEASED_MS : CTL_RETRY_MS;
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };
	sigset_t set;
	int sig;

	sigemptyset(&set);
	sigaddset(&set, ctl.wake_sig);
	sig = sigtimedwait(&set, NULL, &ts);
	if (sig == ctl.wake_sig)
		pr_debug("woken by signal %d\n", sig);
}

static void *control_main(void *arg)
{
	(void)arg;
	gate_exempt_self();
	capture_relax_self();
	ctl.tid = gettid();
	pr_debug("control thread %d started (wake signal %d)\n", (int)ctl.tid, ctl.wake_sig);
	for (;;) {
		if (ctl.sock < 0 && try_connect() < 0) {
			wait_retry();
			continue;
		}
		serve();
		/* Released: stay away while CRIU dumps; the wake signal (or
		 * the retry period) says when to come back. */
		if (ctl.state == ST_RELEASED && ctl.sock < 0)
			wait_retry();
	}
	return NULL;
}

/* ---- starting, forking ---------------------------------------------------- */

static void control_atfork_child(void)
{
	/* Only the forking thread lives on: no control thread, no drain, and
	 * the parent's connection is not ours to use. */
	gate_reset_after_fork();
	chunk_gate_reset_after_fork();
	epoch_reset_after_fork();
	suspect_reset_after_fork();
	if (ctl.sock >= 0)
		close(ctl.sock);
	if (ctl.kickfd >= 0)
		close(ctl.kickfd);
	for (size_t i = 0; i < ctl.nremap; i++)
		close(ctl.remap[i].fd);
	free(ctl.remap);
	memset(&ctl, 0, sizeof(ctl));
	ctl.sock = -1;
	ctl.kickfd = -1;
	drain_busy = 0;
	pthread_mutex_init(&start_lock, NULL);
}

static void start_locked(void)
{
	static bool atfork_done;
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t t;
	int err;

	if (!atfork_done) {
		/* Registered once: a forked child inherits the registration. */
		pthread_atfork(NULL, NULL, control_atfork_child);
		atfork_done = true;
	}
	if (env_off("GPUCR_DAEMON")) {
		pr_debug("GPUCR_DAEMON=0: no connection to gpucrd\n");
		return;
	}
	real_ensure();
	if (!real.handle)
		return;
	ctl.wake_sig = gpucr_wake_signal(); /* as the daemon and the plugin read it */
	ctl.retry_ms = env_int("GPUCR_RECONNECT_MS", 0, 1, 3600 * 1000);
	ctl.grace_ms = env_int("GPUCR_QUIESCE_GRACE_MS", CTL_GRACE_MS, 0, 10000);
	ctl.kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ctl.kickfd < 0) {
		pr_perror("gpucr's control thread: eventfd; not connecting to gpucrd");
		return;
	}
	/* The thread blocks every signal: the application's handlers do not
	 * run on it, and the wake signal waits for sigtimedwait(). */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 << 10);
	err = pthread_create(&t, &attr, control_main, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!err)
		pthread_setname_np(t, "gpucr-control"); /* named from the start, for ps and tests */
	if (err) {
		pr_warn("cannot start gpucr's control thread: %s; not connecting to gpucrd\n", strerror(err));
		close(ctl.kickfd);
		ctl.kickfd = -1;
	}
}

void control_start(void)
{
	int saved;

	if (__builtin_expect(__atomic_load_n(&ctl.started, __ATOMIC_ACQUIRE), 1))
		return;
	saved = errno;
	pthread_mutex_lock(&start_lock);
	if (!ctl.started) {
		start_locked();
		__atomic_store_n(&ctl.started, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&start_lock);
	errno = saved;
}

void control_kick(void)
{
	uint64_t one = 1;
	int saved;

	control_start();
	if (!__atomic_load_n(&ctl.connected, __ATOMIC_ACQUIRE) ||
	    __atomic_exchange_n(&ctl.kicked, 1, __ATOMIC_SEQ_CST))
		return;
	saved = errno;
	if (write(ctl.kickfd, &one, sizeof(one)) < 0)
		pr_debug("kick: %s\n", strerror(errno));
	errno = saved;
}
