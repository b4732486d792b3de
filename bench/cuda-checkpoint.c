/*
 * cuda-checkpoint: an open stand-in for NVIDIA's `cuda-checkpoint` utility.
 *
 * The stock baseline gpucr is benchmarked against is CRIU's cuda plugin, which
 * drives the driver's checkpoint API only by exec'ing a binary named
 * `cuda-checkpoint` from $PATH and reading its stdout+stderr (both go to one
 * pipe). This file owns that command-line contract, nothing more: each
 * operation is one call of the public cuCheckpointProcess* driver API.
 *
 *   cuda-checkpoint -h | --help                  help on stdout, exit 0; CRIU greps
 *                                                it for "--action"
 *   cuda-checkpoint --get-restore-tid --pid PID  prints "TID\n" (CRIU atoi()s it)
 *   cuda-checkpoint --get-state --pid PID        prints "running\n", "locked\n",
 *                                                "checkpointed\n" or "failed\n"
 *   cuda-checkpoint --action lock|checkpoint|restore|unlock --pid PID [--timeout MS]
 *   cuda-checkpoint --toggle --pid PID           running -> lock+checkpoint,
 *                                                checkpointed -> restore+unlock
 *
 * Exit status: 0 on success, 1 when the driver (or the target) refused, with
 * one line on stderr naming the pid, the operation and the driver's error
 * name and string; 2 for a usage error. A successful run writes nothing but
 * the value asked for, because CRIU parses the merged output.
 *
 * The six checkpoint entry points are resolved once through cuGetProcAddress
 * after cuInit, so a driver older than r570 (CUDA 12.8), which lacks them,
 * gets a clear message instead of a dynamic-linker error.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

/* The checkpoint API first shipped in CUDA 12.8; ask for that ABI. */
#define CKPT_API_VERSION 12080

enum { EXIT_USAGE = 2 };

enum op {
	OP_NONE,
	OP_GET_STATE,
	OP_GET_RESTORE_TID,
	OP_TOGGLE,
	OP_LOCK,
	OP_CHECKPOINT,
	OP_RESTORE,
	OP_UNLOCK,
};

struct req {
	enum op op;
	int pid;		/* as given on the command line */
	int target;		/* thread-group id of pid: what the driver is given */
	unsigned int timeout_ms;/* lock timeout; 0 = wait forever (driver's rule) */
};

/* Driver entry points, filled once by drv_load(). */
static struct {
	__typeof__(&cuCheckpointProcessGetRestoreThreadId) get_restore_tid;
	__typeof__(&cuCheckpointProcessGetState) get_state;
	__typeof__(&cuCheckpointProcessLock) lock;
	__typeof__(&cuCheckpointProcessCheckpoint) checkpoint;
	__typeof__(&cuCheckpointProcessRestore) restore;
	__typeof__(&cuCheckpointProcessUnlock) unlock;
} drv;

static const char help_text[] =
	"cuda-checkpoint (gpucr, open implementation over the CUDA driver API)\n"
	"Checkpoint and restore the CUDA state of one Linux process.\n"
	"\n"
	"Operations:\n"
	"--get-state --pid <pid>\n"
	"        Print the CUDA state of <pid>: running, locked, checkpointed or failed\n"
	"--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]\n"
	"        Perform one step on <pid>; --timeout bounds the lock step\n"
	"--toggle --pid <pid>\n"
	"        running -> lock + checkpoint; checkpointed -> restore + unlock\n"
	"--get-restore-tid --pid <pid>\n"
	"        Print the thread id of the CUDA restore thread of <pid>\n"
	"\n"
	"Options:\n"
	"--pid|-p <pid>          process to operate on\n"
	"--timeout|-t <ms>       lock timeout in milliseconds (0: none)\n"
	"--help|-h               print this help\n"
	"\n"
	"Exit status: 0 success, 1 operation failed, 2 usage error.\n";

static void pr_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void pr_err(const char *fmt, ...)
{
	va_list ap;

	fputs("cuda-checkpoint: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static const char *op_name(enum op op)
{
	switch (op) {
	case OP_GET_STATE:	  return "get-state";
	case OP_GET_RESTORE_TID:  return "get-restore-tid";
	case OP_TOGGLE:		  return "toggle";
	case OP_LOCK:		  return "lock";
	case OP_CHECKPOINT:	  return "checkpoint";
	case OP_RESTORE:	  return "restore";
	case OP_UNLOCK:		  return "unlock";
	case OP_NONE:		  break;
	}
	return "?";
}

static const char *state_name(CUprocessState st)
{
	/* 4 and 5 are the transient states newer drivers report (CUDA 13.x). */
	switch ((int)st) {
	case CU_PROCESS_STATE_RUNNING:	    return "running";
	case CU_PROCESS_STATE_LOCKED:	    return "locked";
	case CU_PROCESS_STATE_CHECKPOINTED: return "checkpointed";
	case CU_PROCESS_STATE_FAILED:	    return "failed";
	case 4:				    return "checkpointing";
	case 5:				    return "restoring";
	}
	return NULL;
}

/* "pid 4242" or, when a thread id was given, "pid 4242 (thread 4243)". */
static const char *who(const struct req *rq)
{
	static char buf[64];

	if (rq->target == rq->pid)
		snprintf(buf, sizeof(buf), "pid %d", rq->pid);
	else
		snprintf(buf, sizeof(buf), "pid %d (thread %d)", rq->target, rq->pid);
	return buf;
}

/* Logs one failed driver call; returns the exit status to use. */
static int report_cu(const struct req *rq, const char *step, CUresult r)
{
	const char *name = NULL, *str = NULL;

	if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
		name = "unnamed CUresult";
	if (cuGetErrorString(r, &str) != CUDA_SUCCESS || !str)
		str = "no description from the driver";
	/* The stub cannot name its own error; say what it means. */
	if (r == CUDA_ERROR_STUB_LIBRARY) {
		name = "CUDA_ERROR_STUB_LIBRARY";
		str = "the CUDA driver stub was loaded instead of the real libcuda.so.1";
	}
	pr_err("%s: %s failed: %s (%d): %s", who(rq), step, name, (int)r, str);
	return EXIT_FAILURE;
}

/* As report_cu, for a lock step: says which timeout was in force. */
static int report_lock(const struct req *rq, const char *prefix, CUresult r)
{
	char step[64];

	if (!rq->timeout_ms)
		snprintf(step, sizeof(step), "%slock", prefix);
	else
		snprintf(step, sizeof(step), "%slock (timeout %u ms)", prefix, rq->timeout_ms);
	return report_cu(rq, step, r);
}

/* Parses a decimal in [min, max]; returns 0 or -EINVAL / -ERANGE. */
static int parse_ulong(const char *s, unsigned long min, unsigned long max,
		       unsigned long *ret_val)
{
	unsigned long v;
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (*end != '\0')
		return -EINVAL;
	if (errno == ERANGE || v < min || v > max)
		return -ERANGE;
	*ret_val = v;
	return 0;
}

/*
 * The thread-group id of @tid, from /proc. CRIU's plugin asks --get-state of
 * the restore *thread* id, while the driver documents a process id; handing
 * the driver the tgid is right either way. Returns 0 and sets *ret_tgid,
 * -ESRCH when no such task exists, other -errno when /proc cannot tell.
 */
static int tgid_of(int tid, int *ret_tgid)
{
	char path[64], line[256];
	int tgid = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", tid);
	f = fopen(path, "re");
	if (!f)
		return errno == ENOENT ? -ESRCH : -errno;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Tgid: %d", &tgid) == 1)
			break;
	}
	fclose(f);
	if (tgid <= 0)
		return -ENODATA;
	*ret_tgid = tgid;
	return 0;
}

/* cuInit, then resolve the checkpoint entry points. Logs; returns exit status. */
static int drv_load(const struct req *rq)
{
	static const struct {
		const char *name;
		void **slot;
	} syms[] = {
		{ "cuCheckpointProcessGetRestoreThreadId", (void **)&drv.get_restore_tid },
		{ "cuCheckpointProcessGetState", (void **)&drv.get_state },
		{ "cuCheckpointProcessLock", (void **)&drv.lock },
		{ "cuCheckpointProcessCheckpoint", (void **)&drv.checkpoint },
		{ "cuCheckpointProcessRestore", (void **)&drv.restore },
		{ "cuCheckpointProcessUnlock", (void **)&drv.unlock },
	};
	CUresult r;
	size_t i;

	r = cuInit(0);
	if (r != CUDA_SUCCESS) {
		char step[48];

		snprintf(step, sizeof(step), "%s: cuInit", op_name(rq->op));
		return report_cu(rq, step, r);
	}

	for (i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		void *fn = NULL;
		int ver = 0;

		r = cuGetProcAddress(syms[i].name, &fn, CKPT_API_VERSION,
				     CU_GET_PROC_ADDRESS_DEFAULT, &q);
		if (r == CUDA_SUCCESS && q == CU_GET_PROC_ADDRESS_SUCCESS && fn) {
			*syms[i].slot = fn;
			continue;
		}
		cuDriverGetVersion(&ver);
		pr_err("%s: %s: the driver (CUDA %d.%d) does not provide %s; "
		       "driver r570 (CUDA 12.8) or newer is required",
		       who(rq), op_name(rq->op), ver / 1000, ver % 1000 / 10,
		       syms[i].name);
		return EXIT_FAILURE;
	}
	return EXIT_SUCCESS;
}

static CUresult do_lock(const struct req *rq)
{
	CUcheckpointLockArgs args;

	memset(&args, 0, sizeof(args));
	args.timeoutMs = rq->timeout_ms;
	return drv.lock(rq->target, &args);
}

static CUresult do_checkpoint(const struct req *rq)
{
	CUcheckpointCheckpointArgs args;

	memset(&args, 0, sizeof(args));
	return drv.checkpoint(rq->target, &args);
}

static CUresult do_restore(const struct req *rq)
{
	CUcheckpointRestoreArgs args;

	memset(&args, 0, sizeof(args));
	return drv.restore(rq->target, &args);
}

static CUresult do_unlock(const struct req *rq)
{
	CUcheckpointUnlockArgs args;

	memset(&args, 0, sizeof(args));
	return drv.unlock(rq->target, &args);
}

/* Prints one line on stdout and makes sure it left; returns exit status. */
static int print_value(const struct req *rq, const char *value)
{
	if (printf("%s\n", value) < 0 || fflush(stdout) != 0) {
		pr_err("%s: %s: writing the result: %s", who(rq), op_name(rq->op),
		       strerror(errno));
		return EXIT_FAILURE;
	}
	return EXIT_SUCCESS;
}

static int run_get_state(const struct req *rq)
{
	CUprocessState st;
	const char *name;
	char num[32];
	CUresult r;

	r = drv.get_state(rq->target, &st);
	if (r != CUDA_SUCCESS)
		return report_cu(rq, "get-state", r);
	name = state_name(st);
	if (!name) {
		snprintf(num, sizeof(num), "unknown(%d)", (int)st);
		name = num;
	}
	return print_value(rq, name);
}

static int run_get_restore_tid(const struct req *rq)
{
	char num[32];
	CUresult r;
	int tid;

	r = drv.get_restore_tid(rq->target, &tid);
	if (r != CUDA_SUCCESS)
		return report_cu(rq, "get-restore-tid", r);
	snprintf(num, sizeof(num), "%d", tid);
	return print_value(rq, num);
}

/*
 * NVIDIA's --toggle moves between the two resting states. A locked process
 * is half-way in one direction or the other and only the caller knows which,
 * so it is refused rather than guessed at.
 */
static int run_toggle(const struct req *rq)
{
	CUprocessState st;
	CUresult r;

	r = drv.get_state(rq->target, &st);
	if (r != CUDA_SUCCESS)
		return report_cu(rq, "toggle: get-state", r);

	switch ((int)st) {
	case CU_PROCESS_STATE_RUNNING:
		r = do_lock(rq);
		if (r != CUDA_SUCCESS)
			return report_lock(rq, "toggle: ", r);
		r = do_checkpoint(rq);
		if (r != CUDA_SUCCESS) {
			int ret = report_cu(rq, "toggle: checkpoint", r);
			CUprocessState now;

			/* Leave it running if the driver left it merely locked. */
			if (drv.get_state(rq->target, &now) == CUDA_SUCCESS &&
			    now == CU_PROCESS_STATE_LOCKED) {
				r = do_unlock(rq);
				if (r != CUDA_SUCCESS)
					report_cu(rq, "toggle: unlock after failed checkpoint", r);
			}
			return ret;
		}
		return EXIT_SUCCESS;
	case CU_PROCESS_STATE_CHECKPOINTED:
		r = do_restore(rq);
		if (r != CUDA_SUCCESS)
			return report_cu(rq, "toggle: restore", r);
		r = do_unlock(rq);
		if (r != CUDA_SUCCESS)
			return report_cu(rq, "toggle: unlock", r);
		return EXIT_SUCCESS;
	case CU_PROCESS_STATE_LOCKED:
		pr_err("%s: toggle: the process is locked (between lock and checkpoint, "
		       "or between restore and unlock); finish with --action checkpoint or "
		       "--action unlock", who(rq));
		return EXIT_FAILURE;
	default:
		pr_err("%s: toggle: the process is in state %s, not running or checkpointed",
		       who(rq), state_name(st) ? state_name(st) : "unknown");
		return EXIT_FAILURE;
	}
}

static int run(const struct req *rq)
{
	CUresult r;

	switch (rq->op) {
	case OP_GET_STATE:
		return run_get_state(rq);
	case OP_GET_RESTORE_TID:
		return run_get_restore_tid(rq);
	case OP_TOGGLE:
		return run_toggle(rq);
	case OP_LOCK:
		r = do_lock(rq);
		break;
	case OP_CHECKPOINT:
		r = do_checkpoint(rq);
		break;
	case OP_RESTORE:
		r = do_restore(rq);
		break;
	case OP_UNLOCK:
		r = do_unlock(rq);
		break;
	default:
		return EXIT_USAGE;
	}
	if (r == CUDA_SUCCESS)
		return EXIT_SUCCESS;
	if (rq->op == OP_LOCK)
		return report_lock(rq, "", r);
	return report_cu(rq, op_name(rq->op), r);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("cuda-checkpoint: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'cuda-checkpoint --help'.\n", stderr);
	return EXIT_USAGE;
}

static int set_op(struct req *rq, enum op op)
{
	if (rq->op != OP_NONE && rq->op != op)
		return -EINVAL;
	rq->op = op;
	return 0;
}

int main(int argc, char **argv)
{
	enum { OPT_GET_STATE = 256, OPT_GET_RESTORE_TID, OPT_TOGGLE, OPT_ACTION };
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "pid", required_argument, NULL, 'p' },
		{ "timeout", required_argument, NULL, 't' },
		{ "get-state", no_argument, NULL, OPT_GET_STATE },
		{ "get-restore-tid", no_argument, NULL, OPT_GET_RESTORE_TID },
		{ "toggle", no_argument, NULL, OPT_TOGGLE },
		{ "action", required_argument, NULL, OPT_ACTION },
		{ NULL, 0, NULL, 0 },
	};
	static const struct { const char *name; enum op op; } actions[] = {
		{ "lock", OP_LOCK },
		{ "checkpoint", OP_CHECKPOINT },
		{ "restore", OP_RESTORE },
		{ "unlock", OP_UNLOCK },
	};
	struct req rq = { .op = OP_NONE, .pid = -1, .target = -1 };
	bool help = false;
	unsigned long v;
	enum op op;
	size_t i;
	int c, err;

	while ((c = getopt_long(argc, argv, "hp:t:", longopts, NULL)) != -1) {
		switch (c) {
		case 'h':
			help = true;
			break;
		case 'p':
			if (parse_ulong(optarg, 1, INT_MAX, &v))
				return usage_error("--pid: '%s' is not a process id", optarg);
			rq.pid = (int)v;
			break;
		case 't':
			if (parse_ulong(optarg, 0, UINT_MAX, &v))
				return usage_error("--timeout: '%s' is not a number of milliseconds",
						   optarg);
			rq.timeout_ms = (unsigned int)v;
			break;
		case OPT_GET_STATE:
		case OPT_GET_RESTORE_TID:
		case OPT_TOGGLE:
		case OPT_ACTION:
			op = c == OPT_GET_STATE ? OP_GET_STATE :
			     c == OPT_GET_RESTORE_TID ? OP_GET_RESTORE_TID :
			     c == OPT_TOGGLE ? OP_TOGGLE : OP_NONE;
			if (c == OPT_ACTION) {
				for (i = 0; i < sizeof(actions) / sizeof(actions[0]); i++)
					if (strcmp(optarg, actions[i].name) == 0)
						op = actions[i].op;
				if (op == OP_NONE)
					return usage_error("--action: unknown action '%s' "
							   "(lock, checkpoint, restore, unlock)",
							   optarg);
			}
			if (set_op(&rq, op))
				return usage_error("only one operation may be given (%s and %s)",
						   op_name(rq.op), op_name(op));
			break;
		default:
			/* getopt_long has already said what was wrong. */
			fputs("Try 'cuda-checkpoint --help'.\n", stderr);
			return EXIT_USAGE;
		}
	}

	if (help) {
		fputs(help_text, stdout);
		return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if (rq.op == OP_NONE)
		return usage_error("no operation given");
	if (rq.pid < 0)
		return usage_error("%s needs --pid <pid>", op_name(rq.op));

	err = tgid_of(rq.pid, &rq.target);
	if (err == -ESRCH) {
		pr_err("pid %d: %s: no such process", rq.pid, op_name(rq.op));
		return EXIT_FAILURE;
	}
	if (err)
		rq.target = rq.pid;	/* /proc cannot tell; let the driver judge */

	c = drv_load(&rq);
	if (c != EXIT_SUCCESS)
		return c;
	return run(&rq);
}
