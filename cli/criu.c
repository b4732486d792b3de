/* gpucr dump and gpucr restore: drive CRIU with gpucr's plugin, time it,
 * and say what happened (CRIU's own log has the details). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "image.h"
#include "json.h"
#include "log.h"

void help_dump(FILE *f)
{
	fprintf(f,
		"Usage: gpucr dump --pid PID -D DIR [--leave-running] [--pre-copy [--pre-copy-rounds N]] [--json]\n"
		"                  [--criu PATH] [-- CRIU-ARGS...]\n\n"
		"Checkpoints process PID (and its children) with CRIU and gpucr's plugin into\n"
		"DIR: CRIU's images plus gpucr-<pid>.img and gpucr-pages-<pid>.img for each\n"
		"process started under `gpucr run`. CUDA processes not started under gpucr are\n"
		"checkpointed through the driver's own checkpoint. The process is killed\n"
		"afterwards unless --leave-running is given. CRIU's log: DIR/dump.log.\n"
		"The process is frozen only while CRIU runs: gpucrd holds its GPU memory and\n"
		"writes the GPU images meanwhile; this command returns when they are complete\n"
		"(GPUCR_IMAGE_WAIT=1 makes CRIU itself wait for them).\n\n"
		"  -t, --pid PID        the process tree to dump\n"
		"  -D, --images-dir DIR where the images go (created if missing)\n"
		"  -R, --leave-running  keep the process running after the dump\n"
		"  --pre-copy           for a migration: before CRIU runs, gpucrd writes the GPU memory of\n"
		"                       every gpucr process of the tree into DIR while it keeps running, then\n"
		"                       rewrites what changed, in rounds, while that shrinks; the dump then\n"
		"                       writes only the chunks that changed since (fingerprints decide; the\n"
		"                       rest is read back and checked), so the image is complete sooner\n"
		"  --pre-copy-rounds N  at most N rounds after the first copy (default 4)\n"
		"  --criu PATH          the criu binary (default: criu beside gpucr, else on PATH)\n"
		"  --json               one JSON object on stdout at the end (the rest goes to stderr)\n"
		"Arguments after -- go to criu as they are.\n");
}

void help_restore(FILE *f)
{
	fprintf(f,
		"Usage: gpucr restore -D DIR [--json] [--criu PATH] [-- CRIU-ARGS...]\n\n"
		"Restores the processes dumped into DIR, with their GPU memory: kept on the\n"
		"GPU by gpucrd since the dump (nothing copied), or loaded from the image and\n"
		"checked against its fingerprints. The restored processes run detached from\n"
		"this command. CRIU's log: DIR/restore.log.\n\n"
		"  -D, --images-dir DIR the dump to restore\n"
		"  --json               one JSON object on stdout at the end (the rest goes to stderr)\n"
		"  --criu PATH          the criu binary (default: criu beside gpucr, else on PATH)\n");
}

/* --json: what people read goes to stderr from here on, and the returned
 * stream (the original stdout) gets one JSON object at the end. */
static FILE *json_take_stdout(void)
{
	int fd;

	fflush(stdout);
	fd = dup(STDOUT_FILENO);
	if (fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
		return NULL;
	return fdopen(fd, "w");
}

static void json_precopy(struct json *j, const struct cli_dump_result *res)
{
	if (!res || !res->precopied)
		return;
	json_obj_begin(j, "pre_copy");
	json_u64(j, "processes", res->precopied);
	json_u64(j, "bytes", res->precopy_bytes);
	json_u64(j, "rounds", res->precopy_rounds);
	json_u64(j, "dirty_bytes", res->precopy_dirty);
	json_u64(j, "ms", (uint64_t)(res->precopy_s * 1000));
	json_u64(j, "finished_from", res->finished);
	json_u64(j, "final_bytes", res->final_bytes);
	json_u64(j, "kept_bytes", res->kept_bytes);
	json_u64(j, "final_pass_ms", (uint64_t)(res->final_s * 1000));
	json_obj_end(j);
}

/* The result as JSON on f (closed); res: a dump's pre-copy figures, or NULL. */
static void json_result(FILE *f, const char *cmd, long pid, const char *dir, int ok, double criu_s, double total_s,
			const struct cli_dump_result *res)
{
	struct json j;

	if (!f)
		return;
	json_init(&j, f);
	json_obj_begin(&j, NULL);
	json_str(&j, "command", cmd);
	if (pid > 0)
		json_i64(&j, "pid", pid);
	json_str(&j, "dir", dir);
	json_str(&j, "result", ok ? "ok" : "failed");
	json_u64(&j, "criu_ms", (uint64_t)(criu_s * 1000));
	if (total_s > 0)
		json_u64(&j, "total_ms", (uint64_t)(total_s * 1000));
	json_precopy(&j, res);
	json_obj_end(&j);
	json_end(&j);
	fclose(f);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void find_criu(char *buf, size_t len, const char *given)
{
	if (given)
		snprintf(buf, len, "%s", given);
	else if (cli_own_path(buf, len, "bin/criu") < 0)
		snprintf(buf, len, "criu");
}

static void plugin_dir(void)
{
	char p[PATH_MAX];

	if (getenv("CRIU_LIBS_DIR"))
		return;
	if (cli_own_path(p, sizeof(p), "lib/criu/gpucr_plugin.so") == 0) {
		*strrchr(p, '/') = 0;
		setenv("CRIU_LIBS_DIR", p, 1);
	}
}

/* Runs argv, returns its exit status (or -errno). */
static int run_wait(char **argv)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execvp(argv[0], argv);
		fprintf(stderr, "gpucr: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void show_errors(const char *dir, const char *log)
{
	char cmd[PATH_MAX + 128];

	fprintf(stderr, "last errors in %s/%s:\n", dir, log);
	snprintf(cmd, sizeof(cmd), "grep -E 'Error|error|gpucr' '%s/%s' | tail -8 >&2", dir, log);
	if (system(cmd) != 0) {
		/* nothing matched */
	}
}

/* Fields 4 (ppid) and 6 (session) of /proc/PID/stat; 0 when it cannot be read. */
static int proc_stat_ids(long pid, long *ret_ppid, long *ret_sid)
{
	char path[64], buf[1024], *p;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	p = strrchr(buf, ')');
	return p && sscanf(p + 2, "%*c %ld %*d %ld", ret_ppid, ret_sid) == 2;
}

/* CRIU wants --shell-job for a process that is not its session's leader. */
static int is_shell_job(long pid)
{
	long ppid, sid;

	return proc_stat_ids(pid, &ppid, &sid) && sid != pid;
}

static void image_summary(const char *dir)
{
	uint32_t *pids = NULL;
	size_t n = 0, i;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (dfd < 0 || img_list(dfd, &pids, &n) < 0) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	for (i = 0; i < n; i++) {
		struct gpucr_image *img = NULL;
		struct img_errbuf eb;
		char b1[32], b2[32];

		if (img_read(dfd, pids[i], &img, &eb) < 0) {
			fprintf(stderr, "gpucr: %s\n", eb.msg);
			continue;
		}
		printf("  GPU image of pid %u: %zu buffers, %s, %s stored, written in %.2f s\n", pids[i],
		       img->nbuffers, cli_bytes(b1, sizeof(b1), img->trailer->total_bytes),
		       cli_bytes(b2, sizeof(b2), img->trailer->stored_bytes), img->trailer->elapsed_ns / 1e9);
		img_free(img);
	}
	free(pids);
	close(dfd);
}

/* The processes gpucrd dumps into dir (real path); returns how many of them
 * are still writing their image, and the bytes done and to do. */
static int images_in_progress(const char *real, uint32_t *pids, size_t max, size_t *n, uint64_t *done,
			      uint64_t *total)
{
	Gpucr__Msg *rep = NULL;
	int writing = 0;
	char why[256];
	size_t i;

	*n = 0;
	*done = *total = 0;
	if (cli_ps(&rep, why, sizeof(why)) < 0)
		return -EIO;
	for (i = 0; i < rep->ps_reply->n_procs; i++) {
		Gpucr__ProcInfo *p = rep->ps_reply->procs[i];

		if (!p->image_dir || strcmp(p->image_dir, real))
			continue;
		if (*n < max)
			pids[(*n)++] = p->pid;
		if (p->has_image_total_bytes) {
			writing++;
			*done += p->image_done_bytes;
			*total += p->image_total_bytes;
		}
	}
	msg_free(rep);
	return writing;
}

/* Waits until gpucrd has written every GPU image of a dump into dir,
 * showing progress (bytes, GB/s, time left) while it lasts. Writing 140 GB
 * takes minutes, so the wait is bounded by progress: no byte written for
 * GPUCR_IMAGE_STALL_MS (default 120000; 0: no bound) ends it with an error
 * (gpucrd goes on writing; `gpucr ps` shows how far it got). */
static int wait_images(const char *dir, double t0, struct cli_dump_result *res)
{
	uint32_t pids[256];
	uint64_t done, total, seen = 0;
	int bad = 0, stale = 0, tty = isatty(STDERR_FILENO), shown = 0, writing;
	double stall = env_ms("GPUCR_IMAGE_STALL_MS", 120000) / 1e3;
	double start = now(), last = 0, moved = start;
	char real[PATH_MAX];
	size_t n, i;

	if (!realpath(dir, real) || cli_connect(NULL) < 0)
		return 0; /* no daemon: no GPU images of gpucr's */
	while ((writing = images_in_progress(real, pids, 256, &n, &done, &total)) > 0) {
		double t = now(), rate = (t - start) > 0 ? done / (t - start) : 0;

		if (done != seen) {
			seen = done;
			moved = t;
		} else if (stall > 0 && t - moved >= stall) {
			if (shown && tty)
				fputc('\n', stderr);
			fprintf(stderr,
				"gpucr dump: the GPU image(s) in %s made no progress for %.0f s (GPUCR_IMAGE_STALL_MS): "
				"%.1f of %.1f MiB written. Is the disk stuck, or gpucrd? gpucrd keeps the memory and "
				"goes on; 'gpucr ps' shows the progress\n",
				dir, stall, done / 1048576.0, total / 1048576.0);
			return -ETIMEDOUT;
		}

		if (total && (tty || t - last >= 2.0)) {
			double unit = total < (1ull << 30) ? 1048576.0 : 1073741824.0;

			fprintf(stderr, "%sgpucr dump: writing %d GPU image(s): %.1f of %.1f %s, %.1f GB/s, %.0f s left%s",
				tty ? "\r" : "", writing, done / unit, total / unit, unit < 1e9 ? "MiB" : "GiB",
				rate / 1e9, rate > 0 ? (total - done) / rate : 0.0, tty ? "   " : "\n");
			last = t;
			shown = 1;
		}
		usleep(200000);
	}
	if (shown && tty)
		fputc('\n', stderr);
	for (i = 0; i < n; i++) {
		Gpucr__Msg wm = GPUCR__MSG__INIT, *wr = NULL;
		Gpucr__DumpWait w = GPUCR__DUMP_WAIT__INIT;

		w.pid = pids[i];
		wm.body_case = GPUCR__MSG__BODY_DUMP_WAIT;
		wm.dump_wait = &w;
		if (cli_call(&wm, -1, &wr) < 0 || wr->err) {
			fprintf(stderr, "gpucr dump: pid %u: the GPU image was not written: %s\n", pids[i],
				wr && wr->err_msg ? wr->err_msg : "gpucrd did not answer");
			bad++;
			if (wr && wr->err == -ESTALE)
				stale++;
		} else {
			const Gpucr__DumpReply *dr = wr->body_case == GPUCR__MSG__BODY_DUMP_REPLY ? wr->dump_reply : NULL;

			printf("gpucr dump: GPU image of pid %u complete %.2f s after the dump started\n", pids[i],
			       now() - t0);
			if (dr && dr->pre_copied) {
				char b1[32], b2[32], b3[32];

				printf("gpucr dump: pid %u: finished from its pre-copy (%s in %u round(s)): %s written at T, "
				       "%s kept; final pass %.3f s\n",
				       pids[i], cli_bytes(b1, sizeof(b1), dr->precopy_bytes), dr->precopy_rounds,
				       cli_bytes(b2, sizeof(b2), dr->final_bytes), cli_bytes(b3, sizeof(b3), dr->reused_bytes),
				       dr->final_ns / 1e9);
				res->finished++;
				res->final_bytes += dr->final_bytes;
				res->kept_bytes += dr->reused_bytes;
				if (dr->final_ns / 1e9 > res->final_s)
					res->final_s = dr->final_ns / 1e9;
			} else if (res->precopied) {
				printf("gpucr dump: pid %u: not finished from a pre-copy (everything written; gpucrd's log "
				       "says why)\n",
				       pids[i]);
			}
		}
		msg_free(wr);
	}
	return stale ? -ESTALE : bad ? -EIO : 0;
}

/* One dump of pid's tree into dir (created if missing) with CRIU and
 * gpucr's plugin; waits for the GPU images. extra: more criu arguments. */
/* Is p pid root or one of its descendants? */
static int in_tree(long p, long root)
{
	int hops;

	for (hops = 0; p > 1 && hops < 4096; hops++) {
		long ppid, sid;

		if (p == root)
			return 1;
		if (!proc_stat_ids(p, &ppid, &sid))
			return 0;
		p = ppid;
	}
	return p == root;
}

/* PreCopyRequest for pid (discard: drop its pre-copy). */
static int precopy_one(uint32_t pid, int dirfd, int rounds, int discard, Gpucr__Msg **ret)
{
	Gpucr__Msg m = GPUCR__MSG__INIT;
	Gpucr__PreCopyRequest pr = GPUCR__PRE_COPY_REQUEST__INIT;

	pr.pid = pid;
	pr.has_max_rounds = rounds >= 0;
	pr.max_rounds = rounds >= 0 ? (uint32_t)rounds : 0;
	pr.has_discard = pr.discard = discard != 0;
	m.body_case = GPUCR__MSG__BODY_PRE_COPY;
	m.pre_copy = &pr;
	return cli_call(&m, dirfd, ret);
}

/* Pre-copies every running gpucr process of pid's tree into dir; their
 * pids into pids (at most max). A failure is reported and leaves the
 * process to a full dump. */
static void precopy_tree(long pid, const char *dir, int rounds, struct cli_dump_result *res, uint32_t *pids,
			 size_t max, size_t *n)
{
	Gpucr__Msg *ps = NULL;
	char why[256];
	double t0 = now();
	size_t i;
	int dirfd;

	*n = 0;
	if (cli_connect(NULL) < 0 || cli_ps(&ps, why, sizeof(why)) < 0) {
		fprintf(stderr, "gpucr dump: no pre-copy: gpucrd cannot be asked\n");
		return;
	}
	dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	for (i = 0; dirfd >= 0 && i < ps->ps_reply->n_procs && *n < max; i++) {
		const Gpucr__ProcInfo *pi = ps->ps_reply->procs[i];
		Gpucr__Msg *rep = NULL;
		char b1[32], b2[32];
		int r;

		if (pi->state != GPUCR__PROC_STATE__PROC_RUNNING || !in_tree(pi->pid, pid))
			continue;
		r = precopy_one(pi->pid, dirfd, rounds, 0, &rep);
		if (r < 0 || rep->err || rep->body_case != GPUCR__MSG__BODY_PRE_COPY_REPLY) {
			fprintf(stderr, "gpucr dump: pid %u: no pre-copy (its dump writes everything): %s\n", pi->pid,
				r < 0 ? "gpucrd did not answer" : rep->err_msg ? rep->err_msg : "bad reply");
			msg_free(rep);
			continue;
		}
		printf("gpucr dump: pid %u pre-copied: %s written in %u round(s) after the first copy, %.2f s; %s dirty "
		       "left for the dump\n",
		       pi->pid, cli_bytes(b1, sizeof(b1), rep->pre_copy_reply->copied_bytes), rep->pre_copy_reply->rounds,
		       rep->pre_copy_reply->elapsed_ns / 1e9, cli_bytes(b2, sizeof(b2), rep->pre_copy_reply->dirty_bytes));
		res->precopied++;
		res->precopy_bytes += rep->pre_copy_reply->copied_bytes;
		res->precopy_dirty += rep->pre_copy_reply->dirty_bytes;
		if (rep->pre_copy_reply->rounds > res->precopy_rounds)
			res->precopy_rounds = rep->pre_copy_reply->rounds;
		pids[(*n)++] = pi->pid;
		msg_free(rep);
	}
	if (dirfd < 0)
		fprintf(stderr, "gpucr dump: no pre-copy: %s: %s\n", dir, strerror(errno));
	else
		close(dirfd);
	msg_free(ps);
	res->precopy_s = now() - t0;
}

int cli_dump(long pid, const char *dir, int leave, const char *criu_given, char **extra, int nextra,
	     int precopy_rounds, struct cli_dump_result *res)
{
	uint32_t pcpids[256];
	size_t npc = 0, k;
	char criu[PATH_MAX], pidbuf[32], *av[64];
	int n = 0, r, i, marker;
	double t0, t1;

	memset(res, 0, sizeof(*res));
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "gpucr dump: %s: %s\n", dir, strerror(errno));
		return CLI_FAIL;
	}
	if (precopy_rounds >= 0)
		precopy_tree(pid, dir, precopy_rounds, res, pcpids, 256, &npc);
	find_criu(criu, sizeof(criu), criu_given);
	plugin_dir();
	snprintf(pidbuf, sizeof(pidbuf), "%ld", pid);
	av[n++] = criu;
	av[n++] = "dump";
	av[n++] = "-t";
	av[n++] = pidbuf;
	av[n++] = "-D";
	av[n++] = (char *)dir;
	av[n++] = "-o";
	av[n++] = "dump.log";
	av[n++] = "-v4";
	if (leave)
		av[n++] = "-R";
	marker = is_shell_job(pid);
	if (marker)
		av[n++] = "--shell-job";
	for (i = 0; i < nextra && n < 62; i++)
		av[n++] = extra[i];
	av[n] = NULL;
	/* CRIU need not wait for the GPU images: gpucrd holds the memory, and
	 * the images are waited for below, once CRIU is done. */
	setenv("GPUCR_IMAGE_WAIT", getenv("GPUCR_IMAGE_WAIT") ? getenv("GPUCR_IMAGE_WAIT") : "0", 1);
	t0 = now();
	r = run_wait(av);
	t1 = now();
	res->criu_s = t1 - t0;
	if (r != 0) {
		fprintf(stderr, "gpucr dump: criu dump of pid %ld failed (exit %d) after %.2f s\n", pid, r, t1 - t0);
		show_errors(dir, "dump.log");
		for (k = 0; k < npc; k++) {
			/* Its dump did not come: its pages go. */
			Gpucr__Msg *rep = NULL;

			precopy_one(pcpids[k], -1, -1, 1, &rep);
			msg_free(rep);
		}
		return CLI_FAIL;
	}
	if (marker) {
		/* restore must be told the same */
		char p[PATH_MAX];
		int fd;

		snprintf(p, sizeof(p), "%s/gpucr-shell-job", dir);
		fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
		if (fd >= 0)
			close(fd);
	}
	printf("gpucr dump: pid %ld dumped into %s in %.2f s%s\n", pid, dir, t1 - t0,
	       leave ? " (left running)" : "");
	r = wait_images(dir, t0, res);
	if (r == -ESTALE && leave && !(getenv("GPUCR_CONCURRENT") && !strcmp(getenv("GPUCR_CONCURRENT"), "0"))) {
		/* The process ran while its memory was saved, and a write
		 * escaped prediction: again, with it stopped until saved. */
		fprintf(stderr, "gpucr dump: retrying with the process stopped until its GPU memory is saved\n");
		setenv("GPUCR_CONCURRENT", "0", 1);
		r = cli_dump(pid, dir, leave, criu_given, extra, nextra, -1, res);
		unsetenv("GPUCR_CONCURRENT");
		return r;
	}
	if (r < 0)
		return CLI_FAIL;
	res->total_s = now() - t0;
	image_summary(dir);
	return CLI_OK;
}

int cmd_dump(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "pid", required_argument, NULL, 't' },
		{ "images-dir", required_argument, NULL, 'D' },
		{ "leave-running", no_argument, NULL, 'R' },
		{ "criu", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "pre-copy", no_argument, NULL, 'P' },
		{ "pre-copy-rounds", required_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dir = NULL, *criu_given = NULL;
	struct cli_dump_result res;
	int leave = 0, c, json = 0, r, precopy = 0, rounds = 4;
	char *end;
	FILE *jf = NULL;
	long pid = 0;

	while ((c = getopt_long(argc, argv, "+t:D:Rc:h", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			pid = strtol(optarg, NULL, 10);
			break;
		case 'D':
			dir = optarg;
			break;
		case 'R':
			leave = 1;
			break;
		case 'c':
			criu_given = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'P':
			precopy = 1;
			break;
		case 'N':
			rounds = (int)strtol(optarg, &end, 10);
			if (*end || rounds < 0 || rounds > 64)
				return cli_usage_error("dump", "--pre-copy-rounds wants a number from 0 to 64");
			precopy = 1;
			break;
		case 'h':
			help_dump(stdout);
			return CLI_OK;
		default:
			return cli_usage_error("dump", "unknown option");
		}
	}
	if (pid <= 0 || !dir)
		return cli_usage_error("dump", "--pid PID and -D DIR are required");
	if (json)
		jf = json_take_stdout();
	r = cli_dump(pid, dir, leave, criu_given, argv + optind, argc - optind, precopy ? rounds : -1, &res);
	json_result(jf, "dump", pid, dir, r == CLI_OK, res.criu_s, res.total_s, &res);
	return r;
}

int cmd_restore(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "images-dir", required_argument, NULL, 'D' },
		{ "criu", required_argument, NULL, 'c' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dir = NULL, *criu_given = NULL;
	char criu[PATH_MAX], marker[PATH_MAX], *av[64];
	int c, n = 0, r, i, json = 0;
	FILE *jf = NULL;
	double t0, t1;

	while ((c = getopt_long(argc, argv, "+D:c:h", opts, NULL)) != -1) {
		switch (c) {
		case 'D':
			dir = optarg;
			break;
		case 'c':
			criu_given = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			help_restore(stdout);
			return CLI_OK;
		default:
			return cli_usage_error("restore", "unknown option");
		}
	}
	if (!dir)
		return cli_usage_error("restore", "-D DIR is required");
	if (json)
		jf = json_take_stdout();
	find_criu(criu, sizeof(criu), criu_given);
	plugin_dir();
	av[n++] = criu;
	av[n++] = "restore";
	av[n++] = "-D";
	av[n++] = (char *)dir;
	av[n++] = "-o";
	av[n++] = "restore.log";
	av[n++] = "-v4";
	av[n++] = "-d";
	snprintf(marker, sizeof(marker), "%s/gpucr-shell-job", dir);
	if (access(marker, F_OK) == 0)
		av[n++] = "--shell-job";
	for (i = optind; i < argc && n < 62; i++)
		av[n++] = argv[i];
	av[n] = NULL;
	t0 = now();
	r = run_wait(av);
	t1 = now();
	if (r != 0) {
		fprintf(stderr, "gpucr restore: criu restore from %s failed (exit %d) after %.2f s\n", dir, r, t1 - t0);
		show_errors(dir, "restore.log");
		json_result(jf, "restore", 0, dir, 0, t1 - t0, 0, NULL);
		return CLI_FAIL;
	}
	printf("gpucr restore: restored from %s in %.2f s\n", dir, t1 - t0);
	json_result(jf, "restore", 0, dir, 1, t1 - t0, 0, NULL);
	return CLI_OK;
}
