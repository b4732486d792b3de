/* gpucr checkpoint: checkpoints of a running process tree, once or every
 * INTERVAL, each a complete CRIU + GPU image directory of its own, the
 * newest N kept. A checkpoint is written under a hidden temporary name and
 * gets its final name (ckpt-NNNN) only once CRIU and every GPU image are
 * done, and then `latest` points at it: a directory with a final name is
 * always complete, and a failed or interrupted checkpoint leaves nothing
 * that looks like one. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "json.h"

#define SEQ_MAX 100000

void help_checkpoint(FILE *f)
{
	fprintf(f,
		"Usage: gpucr checkpoint --pid PID -D DIR [--every INTERVAL] [--keep N] [--count N]\n"
		"                        [--json] [--criu PATH] [-- CRIU-ARGS...]\n\n"
		"Checkpoints process PID (and its children) and leaves it running: each\n"
		"checkpoint is a directory DIR/ckpt-NNNN with CRIU's images and the GPU\n"
		"images, written under a temporary name and renamed only when complete;\n"
		"DIR/latest points at the newest. Restore one with\n"
		"`gpucr restore -D DIR/latest` (after the original process is gone).\n"
		"The process is stopped while CRIU dumps it and until its GPU memory is\n"
		"copied (gpucr dump --leave-running; see README for the figures).\n\n"
		"  -t, --pid PID        the process tree to checkpoint\n"
		"  -D, --images-dir DIR where the checkpoints go (created if missing)\n"
		"  --every INTERVAL     repeat every INTERVAL (30, 30s, 5m, 2h) until the process\n"
		"                       exits or this command is interrupted (SIGINT, SIGTERM)\n"
		"  --keep N             keep the newest N checkpoints, delete older ones\n"
		"                       (default 3; 0 keeps all)\n"
		"  --count N            stop after N checkpoints (default 1 without --every)\n"
		"  --json               one JSON object per checkpoint on stdout\n"
		"  --criu PATH          the criu binary (default: criu beside gpucr, else on PATH)\n"
		"Exit status: 0 if every checkpoint succeeded, 1 if one failed (the others\n"
		"are kept), 2 on a usage error.\n");
}

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
	(void)sig;
	stop = 1;
}

/* "90", "90s", "5m", "2h" -> seconds; -1 if malformed. */
static double parse_interval(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || v <= 0)
		return -1;
	if (!*end || !strcmp(end, "s"))
		return v;
	if (!strcmp(end, "m"))
		return v * 60;
	if (!strcmp(end, "h"))
		return v * 3600;
	return -1;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

static int rm_rf(const char *path)
{
	return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT ? -errno : 0;
}

static int cmp_uint(const void *a, const void *b)
{
	unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;

	return x < y ? -1 : x > y;
}

/* The sequence numbers of DIR's complete checkpoints, sorted; count in *n. */
static unsigned *list_ckpts(const char *dir, size_t *n)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	unsigned *v = NULL, seq;
	size_t cap = 0;
	char tail;

	*n = 0;
	if (!d)
		return NULL;
	while ((e = readdir(d))) {
		if (sscanf(e->d_name, "ckpt-%u%c", &seq, &tail) != 1 || seq >= SEQ_MAX)
			continue;
		if (*n == cap) {
			unsigned *nv = realloc(v, (cap = cap ? cap * 2 : 16) * sizeof(*v));

			if (!nv)
				break;
			v = nv;
		}
		v[(*n)++] = seq;
	}
	closedir(d);
	if (v)
		qsort(v, *n, sizeof(*v), cmp_uint);
	return v;
}

/* DIR/latest -> ckpt-NNNN, replaced atomically. */
static int point_latest(const char *dir, const char *name)
{
	char tmp[PATH_MAX], dst[PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s/.latest.tmp", dir);
	snprintf(dst, sizeof(dst), "%s/latest", dir);
	unlink(tmp);
	if (symlink(name, tmp) < 0 || rename(tmp, dst) < 0)
		return -errno;
	return 0;
}

static void prune(const char *dir, unsigned keep)
{
	size_t n = 0, i;
	unsigned *v = list_ckpts(dir, &n);
	char p[PATH_MAX];

	for (i = 0; keep && i + keep < n; i++) {
		snprintf(p, sizeof(p), "%s/ckpt-%04u", dir, v[i]);
		if (rm_rf(p) < 0)
			fprintf(stderr, "gpucr checkpoint: cannot delete the old checkpoint %s: %s\n", p,
				strerror(errno));
	}
	free(v);
}

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A process under gpucr that a previous checkpoint left running maps its
 * GPU memory back right after it; the next checkpoint waits for that (at
 * most limit seconds). Processes gpucrd does not know are not waited for. */
static void wait_running(long pid, double limit)
{
	double t0 = mono();

	while (!stop && mono() - t0 < limit) {
		Gpucr__Msg *rep = NULL;
		int busy = 0;
		char why[256];
		size_t i;

		if (cli_ps(&rep, why, sizeof(why)) < 0)
			return;
		for (i = 0; i < rep->ps_reply->n_procs; i++) {
			Gpucr__ProcInfo *p = rep->ps_reply->procs[i];

			if (p->pid == (uint32_t)pid && p->has_state && p->state != GPUCR__PROC_STATE__PROC_RUNNING &&
			    p->state != GPUCR__PROC_STATE__PROC_GONE)
				busy = 1;
		}
		msg_free(rep);
		if (!busy)
			return;
		usleep(20000);
	}
}

/* Sleeps until t (monotonic) unless stopped or pid is gone. */
static void sleep_until(double t, long pid)
{
	while (!stop && mono() < t && kill((pid_t)pid, 0) == 0) {
		double left = t - mono();

		usleep(left > 0.2 ? 200000 : (useconds_t)(left > 0 ? left * 1e6 : 0));
	}
}

int cmd_checkpoint(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "pid", required_argument, NULL, 't' },
		{ "images-dir", required_argument, NULL, 'D' },
		{ "every", required_argument, NULL, 'e' },
		{ "keep", required_argument, NULL, 'k' },
		{ "count", required_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "criu", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dir = NULL, *criu_given = NULL;
	double every = 0, next;
	long pid = 0, count = -1, keep = 3, made = 0, failed = 0;
	int c, json = 0;
	unsigned seq;
	size_t n;
	unsigned *v;
	struct sigaction sa;

	while ((c = getopt_long(argc, argv, "+t:D:c:h", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			pid = strtol(optarg, NULL, 10);
			break;
		case 'D':
			dir = optarg;
			break;
		case 'e':
			every = parse_interval(optarg);
			if (every <= 0)
				return cli_usage_error("checkpoint", "--every: '%s' is not an interval (30, 30s, 5m, 2h)",
						       optarg);
			break;
		case 'k':
			keep = strtol(optarg, NULL, 10);
			if (keep < 0)
				return cli_usage_error("checkpoint", "--keep: a count, 0 for all");
			break;
		case 'n':
			count = strtol(optarg, NULL, 10);
			if (count < 1)
				return cli_usage_error("checkpoint", "--count: at least 1");
			break;
		case 'j':
			json = 1;
			break;
		case 'c':
			criu_given = optarg;
			break;
		case 'h':
			help_checkpoint(stdout);
			return CLI_OK;
		default:
			return cli_usage_error("checkpoint", "unknown option");
		}
	}
	if (pid <= 0 || !dir)
		return cli_usage_error("checkpoint", "--pid PID and -D DIR are required");
	if (count < 0)
		count = every > 0 ? 0 : 1; /* 0: no limit */
	if (kill((pid_t)pid, 0) < 0) {
		fprintf(stderr, "gpucr checkpoint: pid %ld: %s\n", pid, strerror(errno));
		return CLI_FAIL;
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "gpucr checkpoint: %s: %s\n", dir, strerror(errno));
		return CLI_FAIL;
	}
	v = list_ckpts(dir, &n);
	seq = n ? v[n - 1] + 1 : 1;
	free(v);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	for (next = mono(); !stop && (count == 0 || made + failed < count); next += every) {
		struct cli_dump_result res;
		char part[PATH_MAX], final[PATH_MAX], name[32];
		int r;

		if (made + failed > 0) {
			sleep_until(next, pid);
			if (stop)
				break;
		}
		if (kill((pid_t)pid, 0) < 0) {
			printf("gpucr checkpoint: pid %ld is gone\n", pid);
			break;
		}
		if (made + failed > 0 && cli_connect(NULL) == 0)
			wait_running(pid, 30);
		if (seq >= SEQ_MAX) {
			fprintf(stderr, "gpucr checkpoint: %s: checkpoint numbers used up (ckpt-%04u)\n", dir,
				SEQ_MAX - 1);
			failed++;
			break;
		}
		snprintf(name, sizeof(name), "ckpt-%04u", seq);
		snprintf(part, sizeof(part), "%s/.%s.partial", dir, name);
		snprintf(final, sizeof(final), "%s/%s", dir, name);
		rm_rf(part);
		fflush(stdout);
		r = cli_dump(pid, part, 1, criu_given, argv + optind, argc - optind, -1, &res);
		if (r == CLI_OK && rename(part, final) < 0) {
			fprintf(stderr, "gpucr checkpoint: %s: %s\n", final, strerror(errno));
			r = CLI_FAIL;
		}
		if (r != CLI_OK) {
			char log[PATH_MAX + 16], keep_log[PATH_MAX];

			/* CRIU's log is kept for a look; nothing else of it. */
			snprintf(log, sizeof(log), "%s/dump.log", part);
			snprintf(keep_log, sizeof(keep_log), "%s/%s.failed.log", dir, name);
			if (rename(log, keep_log) < 0)
				keep_log[0] = 0;
			rm_rf(part);
			failed++;
			fprintf(stderr, "gpucr checkpoint: checkpoint %u of pid %ld failed; no image of it was kept%s%s\n",
				seq, pid, keep_log[0] ? "; CRIU's log: " : "", keep_log);
		} else {
			made++;
			if (point_latest(dir, name) < 0)
				fprintf(stderr, "gpucr checkpoint: %s/latest: %s\n", dir, strerror(errno));
			prune(dir, (unsigned)keep);
			printf("gpucr checkpoint: %s complete: CRIU %.2f s (the process is stopped within it), "
			       "GPU images complete after %.2f s\n",
			       final, res.criu_s, res.total_s);
		}
		if (json) {
			struct json j;

			json_init(&j, stdout);
			json_obj_begin(&j, NULL);
			json_u64(&j, "seq", seq);
			json_str(&j, "dir", r == CLI_OK ? final : "");
			json_str(&j, "result", r == CLI_OK ? "ok" : "failed");
			json_u64(&j, "criu_ms", (uint64_t)(res.criu_s * 1000));
			json_u64(&j, "total_ms", (uint64_t)(res.total_s * 1000));
			json_obj_end(&j);
			json_end(&j);
		}
		fflush(stdout);
		seq++;
		if (every <= 0 && count == 1)
			break;
	}
	if (stop)
		printf("gpucr checkpoint: interrupted; %ld checkpoint(s) made\n", made);
	return failed ? CLI_FAIL : CLI_OK;
}
