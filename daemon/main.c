/* gpucrd: the per-host daemon. Parses options, opens (or inherits) the
 * socket, runs the event loop until SIGTERM/SIGINT. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpucrd.h"
#include "log.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: gpucrd [--socket PATH] [--foreground] [--systemd] [--log FILE] [--verbose]\n"
		"              [--retain-max-mb N] [--lazy-gpu]\n\n"
		"The gpucr daemon: attached CUDA processes hand it their GPU memory; it\n"
		"writes and restores GPU images for CRIU dumps and restores.\n\n"
		"  --socket PATH   listen here (default $GPUCR_SOCKET or %s)\n"
		"  --foreground    stay in the foreground (the default; kept for scripts)\n"
		"  --systemd       take the listening socket from systemd and notify readiness\n"
		"  --log FILE      append log lines to FILE instead of stderr\n"
		"  --retain-max-mb N  keep at most N MiB of dumped processes' GPU memory for\n"
		"                  zero-copy restores (oldest freed first, only once its image is\n"
		"                  complete; default: no limit; also $GPUCR_RETAIN_MAX_MB)\n"
		"  --lazy-gpu      start the driver and pin image staging buffers only when a\n"
		"                  request needs them (default: right after startup, in the\n"
		"                  background, so a restore from an image does not wait for it)\n"
		"  --verbose       debug logging (same as GPUCR_LOG=debug)\n"
		"  --version, --help\n",
		GPUCR_DEFAULT_SOCKET);
}

static struct daemon daemon_;

struct work {
	uv_work_t req;
	void (*fn)(void *);
	void (*done)(void *, int);
	void *data;
};

static void work_run(uv_work_t *req)
{
	struct work *w = req->data;

	w->fn(w->data);
}

static void work_after(uv_work_t *req, int status)
{
	struct work *w = req->data;

	w->done(w->data, status);
	free(w);
}

int daemon_queue_work(struct daemon *d, void (*fn)(void *), void (*done)(void *, int), void *data)
{
	struct work *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return -ENOMEM;
	w->fn = fn;
	w->done = done;
	w->data = data;
	w->req.data = w;
	r = uv_queue_work(d->loop, &w->req, work_run, work_after);
	if (r < 0)
		free(w);
	return r;
}

static void on_signal(uv_signal_t *h, int sig)
{
	struct daemon *d = h->data;

	pr_info("signal %d: shutting down", sig);
	dump_release_holds(d);
	server_stop(d);
	uv_signal_stop(&d->sigterm);
	uv_signal_stop(&d->sigint);
	uv_close((uv_handle_t *)&d->sigterm, NULL);
	uv_close((uv_handle_t *)&d->sigint, NULL);
}

/* The GPU side up front, off the event loop: the first restore from an
 * image should not wait for the driver to start or for staging to be
 * pinned. A failure is kept and reported by the request that needs the GPU. */
static void *warm_up(void *arg)
{
	char msg[512];
	uint64_t t0 = now_ns();

	(void)arg;
	if (gpu_init(msg, sizeof(msg)) < 0) {
		pr_debug("no GPU access yet: %s", msg);
		return NULL;
	}
	imgio_prefill();
	pr_info("GPU ready: driver started and staging pinned in %.1f ms", (now_ns() - t0) / 1e6);
	return NULL;
}

static int mkdir_parent(const char *path)
{
	char *tmp = strdup(path), *dir;
	int r = 0;

	if (!tmp)
		return -ENOMEM;
	dir = dirname(tmp);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		r = -errno;
	free(tmp);
	return r;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "systemd", no_argument, NULL, 'S' },
		{ "log", required_argument, NULL, 'l' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "retain-max-mb", required_argument, NULL, 'r' },
		{ "lazy-gpu", no_argument, NULL, 'L' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct daemon *d = &daemon_;
	const char *path = NULL;
	int use_systemd = 0, lazy_gpu = 0, c, r;

	log_init("gpucrd");
	d->retain_max = UINT64_MAX;
	if (getenv("GPUCR_RETAIN_MAX_MB"))
		d->retain_max = strtoull(getenv("GPUCR_RETAIN_MAX_MB"), NULL, 10) << 20;
	while ((c = getopt_long(argc, argv, "s:fSl:vVhr:L", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			path = optarg;
			break;
		case 'f':
			break;
		case 'S':
			use_systemd = 1;
			break;
		case 'l': {
			int fd = open(optarg, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);

			if (fd < 0) {
				fprintf(stderr, "gpucrd: %s: %s\n", optarg, strerror(errno));
				return 1;
			}
			log_set_fd(fd);
			break;
		}
		case 'v':
			log_set_level(LOG_DEBUG);
			break;
		case 'r':
			d->retain_max = strtoull(optarg, NULL, 10) << 20;
			break;
		case 'L':
			lazy_gpu = 1;
			break;
		case 'V':
			printf("gpucrd %s\n", GPUCR_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 2;
	}
	if (!path)
		path = sock_default_path();
	if (strlen(path) >= sizeof(d->socket_path)) {
		pr_err("socket path too long (%zu bytes; at most %zu): %s", strlen(path),
		       sizeof(d->socket_path) - 1, path);
		return 2;
	}
	snprintf(d->socket_path, sizeof(d->socket_path), "%s", path);
	d->listen_fd = -1;
	if (use_systemd) {
		d->listen_fd = listen_fds_from_systemd();
		if (d->listen_fd >= 0) {
			struct sockaddr_un sa;
			socklen_t len = sizeof(sa);

			memset(&sa, 0, sizeof(sa));
			if (getsockname(d->listen_fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_path[0])
				snprintf(d->socket_path, sizeof(d->socket_path), "%.*s", (int)sizeof(sa.sun_path),
					 sa.sun_path);
		}
		if (d->listen_fd < 0)
			pr_warn("--systemd: no socket passed by systemd (LISTEN_FDS); listening on %s myself",
				d->socket_path);
	}
	if (d->listen_fd < 0) {
		mkdir_parent(d->socket_path);
		d->listen_fd = sock_listen_unix(d->socket_path, 64);
		if (d->listen_fd == -EADDRINUSE) {
			pr_err("another gpucrd is already answering on %s", d->socket_path);
			return 1;
		}
		if (d->listen_fd < 0) {
			pr_err("cannot listen on %s: %s", d->socket_path, strerror(-d->listen_fd));
			return 1;
		}
		/* Any user may attach; the daemon checks each request's uid. */
		chmod(d->socket_path, 0666);
		d->owns_socket_path = 1;
	}
	/* libuv's pool has 4 threads by default. A driver call stuck in the
	 * driver keeps its worker (driverop.c answers its requester, but cannot
	 * take the thread back): more threads keep image writes and restores
	 * from queueing behind a few such calls. Read at the first work queued. */
	setenv("UV_THREADPOOL_SIZE", "16", 0);
	d->loop = uv_default_loop();
	r = server_start(d);
	if (r < 0) {
		pr_err("cannot start serving: %s", uv_strerror(r));
		return 1;
	}
	uv_signal_init(d->loop, &d->sigterm);
	uv_signal_init(d->loop, &d->sigint);
	d->sigterm.data = d->sigint.data = d;
	uv_signal_start(&d->sigterm, on_signal, SIGTERM);
	uv_signal_start(&d->sigint, on_signal, SIGINT);
	signal(SIGPIPE, SIG_IGN);

	pr_info("gpucrd %s listening on %s (pid %d)", GPUCR_VERSION, d->socket_path, (int)getpid());
	notify_ready("listening");
	pthread_t warm_th;
	int warming = !lazy_gpu && pthread_create(&warm_th, NULL, warm_up, NULL) == 0;

	uv_run(d->loop, UV_RUN_DEFAULT);
	/* A daemon stopped right after its start waits for the warm-up to end
	 * (under a second), rather than exit under the driver's feet. */
	if (warming)
		pthread_join(warm_th, NULL);

	registry_free_all(d);
	close(d->listen_fd);
	if (d->owns_socket_path)
		unlink(d->socket_path);
	uv_loop_close(d->loop);
	return 0;
}
