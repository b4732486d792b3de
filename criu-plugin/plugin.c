/* gpucr's CRIU plugin: the hooks, and the order of CPU and GPU work.
 *
 * Dump, a process attached to gpucrd (started under `gpucr run`):
 *   PAUSE_DEVICES (still running): gpucrd quiesces it and takes its GPU
 *     memory over; the process releases its mappings; then the driver's
 *     lock + checkpoint save what is left of its GPU state (contexts,
 *     modules, streams) into its host memory, which CRIU dumps.
 *   CHECKPOINT_DEVICES (frozen): wait until gpucrd has written the GPU image
 *     beside CRIU's files, so a dump that succeeds has a complete image.
 * Dump, any other CUDA process: the driver flow of CRIU's own cuda plugin
 *   (lock at PAUSE, checkpoint at CHECKPOINT with the restore thread let
 *   run), through gpucrd or the driver loaded here; its restore, in
 *   RESUME_DEVICES_LATE, lets the restore thread run before anything but
 *   that thread's id is asked of the driver. The driver serves its
 *   checkpoint API through that thread: a call made while CRIU holds it
 *   stopped waits for ever.
 * fini after a failed or --leave-running dump: driver restore + unlock, and
 *   the control thread of an attached process is woken to map its memory.
 * Restore, RESUME_DEVICES_LATE: gpucrd makes the memory ready (retained on
 *   the GPU, or loaded from the image and checked), the driver restores and
 *   unlocks the process, and once CRIU lets the process go its control
 *   thread is woken and maps the memory at the same addresses.
 *
 * Hooks answer -ENOTSUP for processes without CUDA state. */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* CRIU's header has inline stubs with unused parameters. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC visibility push(default)
#include <criu-plugin.h>
#pragma GCC visibility pop
#pragma GCC diagnostic pop

#include "err.h"
#include "image.h"
#include "plugin.h"
#include "sock.h"

/* CRIU's image directory fd; CRIU exports the function to plugins. Looked
 * up at run time so the plugin also loads outside CRIU (tests). */
static int image_dir(void)
{
	static int (*fn)(void);

	if (!fn)
		fn = (int (*)(void))dlsym(RTLD_DEFAULT, "criu_get_image_dir");
	return fn ? fn() : -1;
}

#define MAX_TRACKED 4096

struct tracked {
	int pid;
	int gpucr;                      /* attached to gpucrd */
	Gpucr__DriverState initial;     /* driver state found at pause */
	int locked;                     /* we locked it */
	int checkpointed;               /* the driver checkpointed it */
};

static struct tracked tracked[MAX_TRACKED];
static int ntracked;
static int disabled;
static int stage_;

static unsigned lock_timeout_ms(void)
{
	const char *s = getenv("GPUCR_LOCK_TIMEOUT_MS");

	return s ? (unsigned)atoi(s) : 10000;
}

static struct tracked *track(int pid)
{
	int i;

	for (i = 0; i < ntracked; i++)
		if (tracked[i].pid == pid)
			return &tracked[i];
	if (ntracked == MAX_TRACKED)
		return NULL;
	memset(&tracked[ntracked], 0, sizeof(tracked[0]));
	tracked[ntracked].pid = pid;
	return &tracked[ntracked++];
}

/* Is pid running under gpucr? Asks gpucrd; without a daemon, looks for the
 * shim in the process's mappings (then the dump must fail: its GPU memory
 * would be lost). 1 yes, 0 no, <0 attached but no daemon. */
static int is_attached(int pid)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__PsRequest ps = GPUCR__PS_REQUEST__INIT;
	char path[64], line[512];
	int r, found = 0;
	FILE *f;

	if (client_connect() == 0) {
		ps.has_pid = 1;
		ps.pid = (uint32_t)pid;
		m.body_case = GPUCR__MSG__BODY_PS;
		m.ps = &ps;
		r = client_call(&m, -1, &rep);
		if (r == 0 && !rep->err && rep->body_case == GPUCR__MSG__BODY_PS_REPLY)
			found = rep->ps_reply->n_procs > 0;
		msg_free(rep);
		if (r == 0)
			return found;
	}
	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "/gpucr/libcuda.so")) {
			found = 1;
			break;
		}
	fclose(f);
	return found ? -ENOTCONN : 0;
}

static int call_simple(Gpucr__Msg *m, int fd, const char *what, int pid, Gpucr__Msg **ret)
{
	Gpucr__Msg *rep = NULL;
	int r = client_call(m, fd, &rep);

	if (r < 0) {
		pl_err("pid %d: %s: gpucrd did not answer: %s", pid, what, strerror(-r));
		return r;
	}
	if (rep->err) {
		r = rep->err;
		pl_err("pid %d: %s failed: %s", pid, what, rep->err_msg ? rep->err_msg : "?");
		msg_free(rep);
		return r;
	}
	if (ret)
		*ret = rep;
	else
		msg_free(rep);
	return 0;
}

/* Driver restore + unlock of a stopped process whose restore thread has
 * been let run (the driver does both through that thread). */
static int driver_restore_unlock(struct tracked *t)
{
	char msg[600];
	int r = 0;

	if (t->checkpointed) {
		r = drv_op(t->pid, GPUCR__DRIVER_OP_KIND__DRV_RESTORE, 0, NULL, NULL, msg, sizeof(msg));
		if (r < 0)
			pl_err("pid %d: driver restore: %s", t->pid, msg);
		else
			t->checkpointed = 0;
	}
	if (!r && t->locked && t->initial == GPUCR__DRIVER_STATE__DRV_STATE_RUNNING) {
		r = drv_op(t->pid, GPUCR__DRIVER_OP_KIND__DRV_UNLOCK, 0, NULL, NULL, msg, sizeof(msg));
		if (r < 0)
			pl_err("pid %d: driver unlock: %s", t->pid, msg);
		else
			t->locked = 0;
	}
	if (r < 0) {
		Gpucr__DriverState st = GPUCR__DRIVER_STATE__DRV_STATE_UNKNOWN;

		/* Where the failure left it, for the caller: a process the
		 * driver reports running needs nothing more; one it still holds
		 * cannot make a CUDA call. */
		if (drv_op(t->pid, GPUCR__DRIVER_OP_KIND__DRV_GET_STATE, 0, &st, NULL, msg, sizeof(msg)) == 0) {
			t->checkpointed = st == GPUCR__DRIVER_STATE__DRV_STATE_CHECKPOINTED;
			t->locked = t->checkpointed || st == GPUCR__DRIVER_STATE__DRV_STATE_LOCKED;
		}
	}
	return r;
}

/* Driver restore + unlock of a stopped process: its restore thread runs
 * meanwhile. */
static int driver_resume(struct tracked *t)
{
	struct held_thread h;
	char msg[600];
	int tid = -1, r, r2;

	if (!t->checkpointed && !t->locked)
		return 0;
	r = drv_op(t->pid, GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID, 0, NULL, &tid, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: %s", t->pid, msg);
		return r;
	}
	r = thread_resume(tid, &h);
	if (r == -ESRCH) {
		/* CRIU does not hold it stopped: the dump failed before CRIU
		 * seized the process (a driver checkpoint that failed in the
		 * pause hook), or CRIU let it go. Its restore thread runs on
		 * its own; left locked, its next CUDA call would wait for ever. */
		pl_info("pid %d: not stopped by CRIU; driver restore and unlock with it running", t->pid);
		return driver_restore_unlock(t);
	}
	if (r < 0)
		return r;
	r = driver_restore_unlock(t);
	r2 = thread_stop_again(&h);
	return r ? r : r2;
}

static int wake(int pid)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__Wake w = GPUCR__WAKE__INIT;

	w.pid = (uint32_t)pid;
	m.body_case = GPUCR__MSG__BODY_WAKE;
	m.wake = &w;
	/* The daemon waits until CRIU lets the thread go, then signals it;
	 * CRIU lets it go only after this hook returns: do not wait. */
	return client_send(&m);
}

/* ---- dump ---------------------------------------------------------------- */

static int leave_running(void);

/* GPUCR_IMAGE_WAIT=0: CRIU does not wait for the GPU images (gpucr dump
 * waits for them itself, once CRIU is done). */
static int image_wait(void)
{
	const char *env = getenv("GPUCR_IMAGE_WAIT");

	return !(env && !strcmp(env, "0"));
}

static int pause_attached(int pid)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__DumpRequest dr = GPUCR__DUMP_REQUEST__INIT;
	struct tracked *t = track(pid);
	char msg[600];
	int r, dirfd;

	if (!t)
		return -ENOMEM;
	t->gpucr = 1;
	dirfd = image_dir();
	dr.pid = (uint32_t)pid;
	dr.has_timeout_ms = 1;
	dr.timeout_ms = lock_timeout_ms();
	dr.has_leave_running = 1;
	dr.leave_running = leave_running();
	/* Left running: it runs again as soon as CRIU is done, while gpucrd
	 * saves its memory (GPUCR_CONCURRENT=0: it waits for its image). */
	dr.has_concurrent = 1;
	dr.concurrent = dr.leave_running && !(getenv("GPUCR_CONCURRENT") && !strcmp(getenv("GPUCR_CONCURRENT"), "0"));
	/* Nothing waits for the image before the driver is done with the
	 * process: gpucrd may hold its write back until then. */
	dr.has_image_background = 1;
	dr.image_background = !image_wait();
	m.body_case = GPUCR__MSG__BODY_DUMP;
	m.dump = &dr;
	r = call_simple(&m, dirfd, "taking its GPU memory over", pid, &rep);
	if (r < 0)
		return r;
	pl_info("pid %d: GPU memory released to gpucrd (%llu MiB) in %.1f ms", pid,
		(unsigned long long)(rep->dump_reply && rep->dump_reply->has_bytes ? rep->dump_reply->bytes >> 20 : 0),
		rep->dump_reply && rep->dump_reply->has_downtime_ns ? rep->dump_reply->downtime_ns / 1e6 : 0.0);
	msg_free(rep);
	/* The rest of its GPU state: the driver saves it into host memory. */
	t->initial = GPUCR__DRIVER_STATE__DRV_STATE_RUNNING;
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_LOCK, lock_timeout_ms(), NULL, NULL, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: driver lock: %s", pid, msg);
		return r;
	}
	t->locked = 1;
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT, 0, NULL, NULL, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: driver checkpoint: %s", pid, msg);
		return r;
	}
	t->checkpointed = 1;
	return 0;
}

static int pause_plain(int pid)
{
	Gpucr__DriverState st = GPUCR__DRIVER_STATE__DRV_STATE_UNKNOWN;
	struct tracked *t;
	char msg[600];
	int tid = -1, r;

	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID, 0, NULL, &tid, msg, sizeof(msg));
	if (r < 0 || tid <= 0)
		return -ENOTSUP; /* no CUDA state: not ours */
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_GET_STATE, 0, &st, NULL, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: driver state: %s", pid, msg);
		return r;
	}
	t = track(pid);
	if (!t)
		return -ENOMEM;
	t->initial = st;
	if (st == GPUCR__DRIVER_STATE__DRV_STATE_CHECKPOINTED) {
		pl_info("pid %d: already checkpointed by the driver", pid);
		return 0;
	}
	if (st == GPUCR__DRIVER_STATE__DRV_STATE_LOCKED)
		return 0;
	pl_info("pid %d: CUDA process not under gpucr: using the driver's own checkpoint", pid);
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_LOCK, lock_timeout_ms(), NULL, NULL, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: driver lock: %s", pid, msg);
		return r;
	}
	t->locked = 1;
	return 0;
}

static int gpucr_pause_devices(int pid)
{
	int a;

	if (disabled)
		return -ENOTSUP;
	a = is_attached(pid);
	if (a == -ENOTCONN) {
		pl_err("pid %d runs under gpucr, but gpucrd does not answer at %s: its GPU memory cannot be "
		       "saved. Start the daemon (systemctl start gpucrd, or gpucrd --socket PATH) and dump again",
		       pid, sock_default_path());
		return -ENOTCONN;
	}
	if (a > 0)
		return pause_attached(pid);
	return pause_plain(pid);
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__PAUSE_DEVICES, gpucr_pause_devices)

static int gpucr_checkpoint_devices(int pid)
{
	struct held_thread h;
	struct tracked *t = NULL;
	char msg[600];
	int i, tid = -1, r, r2;

	if (disabled)
		return -ENOTSUP;
	for (i = 0; i < ntracked; i++)
		if (tracked[i].pid == pid)
			t = &tracked[i];
	if (!t)
		return -ENOTSUP;
	if (t->gpucr) {
		Gpucr__Msg m = GPUCR__MSG__INIT;
		Gpucr__DumpWait w = GPUCR__DUMP_WAIT__INIT;

		/* The memory is held by gpucrd now; the image can be written
		 * while CRIU finishes (and the process is restored from the
		 * memory meanwhile, if asked). By default the dump waits, so that
		 * a dump that succeeds has its image complete; gpucr dump lets
		 * CRIU go on and waits for the image itself. */
		if (!image_wait()) {
			pl_info("pid %d: the GPU image is written in the background", pid);
			return 0;
		}
		w.pid = (uint32_t)pid;
		m.body_case = GPUCR__MSG__BODY_DUMP_WAIT;
		m.dump_wait = &w;
		return call_simple(&m, -1, "writing the GPU image", pid, NULL);
	}
	if (t->initial == GPUCR__DRIVER_STATE__DRV_STATE_CHECKPOINTED)
		return 0;
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID, 0, NULL, &tid, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: %s", pid, msg);
		return r;
	}
	r = thread_resume(tid, &h);
	if (r < 0)
		return r;
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_CHECKPOINT, 0, NULL, NULL, msg, sizeof(msg));
	if (r < 0)
		pl_err("pid %d: driver checkpoint: %s", pid, msg);
	else
		t->checkpointed = 1;
	r2 = thread_stop_again(&h);
	return r ? r : r2;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__CHECKPOINT_DEVICES, gpucr_checkpoint_devices)

/* ---- restore ------------------------------------------------------------- */

/* The image of pid, complete or still being written by gpucrd (a dump
 * whose image is written in the background, restored from the memory
 * gpucrd kept before the image is done). */
static int has_gpucr_image(int pid)
{
	char name[64], partial[80];

	img_name(name, sizeof(name), (uint32_t)pid);
	snprintf(partial, sizeof(partial), ".%s.partial", name);
	return faccessat(image_dir(), name, F_OK, 0) == 0 || faccessat(image_dir(), partial, F_OK, 0) == 0;
}


/* Makes the GPU memory of one dumped process ready in gpucrd; with
 * background, gpucrd checks the image's records and sizes, answers, and
 * loads the data while CRIU restores the CPU side (the next call waits). */
static int prepare_restore(int pid, int background, Gpucr__Msg **ret)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__RestoreRequest rq = GPUCR__RESTORE_REQUEST__INIT;

	if (client_connect() < 0) {
		pl_err("pid %d has a GPU image, but gpucrd does not answer at %s: start the daemon and "
		       "restore again", pid, sock_default_path());
		return -ENOTCONN;
	}
	rq.pid = (uint32_t)pid;
	rq.has_background = background;
	rq.background = background;
	m.body_case = GPUCR__MSG__BODY_RESTORE;
	m.restore = &rq;
	return call_simple(&m, image_dir(), "restoring its GPU memory", pid, ret);
}

/* At the start of a restore, before any process exists: every GPU image in
 * the directory is made ready (loaded and checked, or found retained), so
 * a damaged image fails the restore instead of a process resuming without
 * its memory (CRIU ignores failures of the late hook). */
static int prepare_all(void)
{
	const char *env = getenv("GPUCR_RESTORE_EARLY");
	int early = !(env && !strcmp(env, "0"));
	uint32_t *pids = NULL;
	size_t n = 0, i;
	int r = 0;

	if (image_dir() < 0 || img_list_all(image_dir(), 1, &pids, &n) < 0)
		return 0;
	for (i = 0; i < n && !r; i++) {
		if (i > 0 && pids[i] == pids[i - 1])
			continue; /* complete and partial both there */
		Gpucr__Msg *rep = NULL;

		r = prepare_restore((int)pids[i], early, &rep);
		if (r == 0 && rep->restore_reply && rep->restore_reply->loading)
			pl_info("pid %u: image checked; loading its %llu MiB of GPU memory while CRIU restores the rest",
				pids[i], (unsigned long long)(rep->restore_reply->bytes >> 20));
		else if (r == 0 && rep->restore_reply)
			pl_info("pid %u: GPU memory ready (%llu MiB, %s) in %.1f ms", pids[i],
				(unsigned long long)(rep->restore_reply->bytes >> 20),
				rep->restore_reply->from_retained ? "kept on the GPU, nothing copied" :
								    "loaded from the image and checked",
				rep->restore_reply->elapsed_ns / 1e6);
		msg_free(rep);
	}
	free(pids);
	return r;
}

/* The driver's restore or unlock of a restored process failed (err): if
 * the driver still holds it (checkpointed or locked), its first CUDA call
 * would wait for ever (the shim's remap of its memory is one). CRIU goes on
 * after a failure of the late hook, so kill it here: the restore fails,
 * with the reason in CRIU's log, instead of leaving a process that hangs.
 * Returns err. */
static int kill_driver_held(struct tracked *t, int err)
{
	if (!t->checkpointed && !t->locked)
		return err;
	pl_err("pid %d: the driver did not give its CUDA state back (%s: %s); killing it, as every CUDA call "
	       "it made would wait for ever (the restore fails)",
	       t->pid, t->checkpointed ? "still checkpointed" : "still locked", gpucr_strerror(err));
	kill(t->pid, SIGKILL);
	t->gpucr = 0;
	t->checkpointed = t->locked = 0;
	return err;
}

static int gpucr_resume_devices_late(int pid)
{
	Gpucr__DriverState st = GPUCR__DRIVER_STATE__DRV_STATE_UNKNOWN;
	struct held_thread h;
	struct tracked *t = NULL;
	char msg[600];
	int tid = -1, r, r2;

	if (disabled)
		return -ENOTSUP;
	if (has_gpucr_image(pid)) {
		Gpucr__Msg *rep = NULL;

		/* The driver's restore first: it brings back only the context
		 * (the process's device memory was released before the driver
		 * checkpoint), and it runs while gpucrd still loads the image
		 * (made ready, or being loaded, since init). The shim's control
		 * thread maps the memory only when woken at the end of the
		 * restore, after the load. */
		t = track(pid);
		if (!t)
			return -ENOMEM;
		t->gpucr = 1;
		t->checkpointed = t->locked = 1;
		t->initial = GPUCR__DRIVER_STATE__DRV_STATE_RUNNING;
		r = driver_resume(t);
		/* This waits for the load and binds the memory to the recreated
		 * process. CRIU goes on after a failure of this hook, so a
		 * process whose memory cannot be loaded is killed here: it never
		 * runs without it, and CRIU, finding it gone, fails the restore. */
		r2 = prepare_restore(pid, 0, &rep);
		if (r2 == 0 && rep->restore_reply && !rep->restore_reply->from_retained)
			pl_info("pid %d: GPU memory loaded from the image and checked", pid);
		msg_free(rep);
		if (r2 < 0) {
			pl_err("pid %d: its GPU memory could not be restored; killing it so that it does not run "
			       "without it (the restore fails)", pid);
			kill(pid, SIGKILL);
			t->gpucr = 0;
			return r2;
		}
		return r < 0 ? kill_driver_held(t, r) : r;
	}
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_GET_RESTORE_TID, 0, NULL, &tid, msg, sizeof(msg));
	if (r < 0 || tid <= 0)
		return -ENOTSUP;
	/* Every process is stopped here. The driver serves the checkpoint API,
	 * a state query included, through the process's restore thread: ask
	 * nothing but its id until that thread runs, or the query waits for a
	 * thread that never runs (CRIU's cuda plugin asks only the id too). */
	r = thread_resume(tid, &h);
	if (r < 0)
		return r;
	r = drv_op(pid, GPUCR__DRIVER_OP_KIND__DRV_GET_STATE, 0, &st, NULL, msg, sizeof(msg));
	if (r < 0) {
		pl_err("pid %d: driver state: %s", pid, msg);
	} else if (st != GPUCR__DRIVER_STATE__DRV_STATE_CHECKPOINTED) {
		r = -ENOTSUP;
	} else if (!(t = track(pid))) {
		r = -ENOMEM;
	} else {
		t->checkpointed = t->locked = 1;
		t->initial = GPUCR__DRIVER_STATE__DRV_STATE_RUNNING;
		pl_info("pid %d: restoring a CUDA process not under gpucr with the driver's own restore", pid);
		r = driver_restore_unlock(t);
	}
	r2 = thread_stop_again(&h);
	if (r < 0 && t)
		return kill_driver_held(t, r);
	return r ? r : r2;
}
CR_PLUGIN_REGISTER_HOOK(CR_PLUGIN_HOOK__RESUME_DEVICES_LATE, gpucr_resume_devices_late)

/* ---- init / fini --------------------------------------------------------- */

/* CRIU's leave-running option, from its command line: plugins are not told. */
static int leave_running(void)
{
	char buf[8192];
	ssize_t n;
	int fd, i, start = 0;

	fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	for (i = 0; i <= n; i++) {
		if (buf[i])
			continue;
		if (!strcmp(buf + start, "-R") || !strcmp(buf + start, "--leave-running"))
			return 1;
		start = i + 1;
	}
	return 0;
}

static int gpucr_init(int stage)
{
	void (*interrupt_only)(void);

	plog_init();
	stage_ = stage;
	ntracked = 0;
	if (stage == CR_PLUGIN_STAGE__PRE_DUMP) {
		disabled = 1;
		return 0;
	}
	disabled = 0;
	/* Like CRIU's cuda plugin: stop tasks with PTRACE_INTERRUPT only, so
	 * the driver's restore thread can be let run alone. */
	interrupt_only = (void (*)(void))dlsym(RTLD_DEFAULT, "set_compel_interrupt_only_mode");
	if (interrupt_only)
		interrupt_only();
	pl_info("gpucr plugin %s: stage %d, gpucrd %s", GPUCR_VERSION, stage,
		client_connect() == 0 ? "connected" : "not running (plain CUDA processes only)");
	if (stage == CR_PLUGIN_STAGE__RESTORE && prepare_all() < 0) {
		pl_err("the GPU memory of the dumped processes cannot be restored; restore refused");
		return -1;
	}
	return 0;
}

static void gpucr_fini(int stage, int ret)
{
	int i;

	if (disabled)
		return;
	if (stage == CR_PLUGIN_STAGE__DUMP && (ret != 0 || leave_running())) {
		for (i = 0; i < ntracked; i++) {
			struct tracked *t = &tracked[i];

			pl_info("pid %d: %s: putting its GPU state back", t->pid,
				ret ? "dump failed" : "left running");
			driver_resume(t);
			if (t->gpucr)
				wake(t->pid);
		}
	}
	if (stage == CR_PLUGIN_STAGE__RESTORE && ret == 0) {
		for (i = 0; i < ntracked; i++)
			if (tracked[i].gpucr)
				wake(tracked[i].pid);
	}
	client_close();
	ntracked = 0;
}

#pragma GCC visibility push(default)
CR_PLUGIN_REGISTER("gpucr", gpucr_init, gpucr_fini)
#pragma GCC visibility pop
