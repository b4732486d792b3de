/* gpucr run: starts a program under gpucr. The driver shim is put first on
 * LD_LIBRARY_PATH, so the program's CUDA calls reach gpucr before the real
 * driver; a daemon is started for the user when none answers. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "sock.h"

void help_run(FILE *f)
{
	fprintf(f,
		"Usage: gpucr run [--socket PATH] [--no-daemon] [--] COMMAND [ARGS...]\n\n"
		"Runs COMMAND under gpucr: its CUDA calls go through gpucr's driver shim\n"
		"(lib/gpucr/libcuda.so.1, put first on LD_LIBRARY_PATH), which hands its GPU\n"
		"memory to gpucrd so that `criu dump` / `gpucr dump` can checkpoint it.\n"
		"If no gpucrd answers on the socket, one is started for you (its socket and\n"
		"log are printed). COMMAND replaces gpucr (same pid).\n\n"
		"  --socket PATH   the daemon's socket (default $GPUCR_SOCKET or %s)\n"
		"  --no-daemon     do not start a daemon; the program runs normally until one appears\n\n"
		"Environment passed on: GPUCR_SOCKET, GPUCR_LOG, GPUCR_REAL_LIBCUDA (the real\n"
		"driver, when it is not in a standard place).\n",
		GPUCR_DEFAULT_SOCKET);
}

/* Starts gpucrd on path in the background, detached; waits until it answers. */
static int start_daemon(const char *path, char *log, size_t loglen)
{
	char bin[PATH_MAX];
	pid_t pid;
	int i, fd;

	if (cli_own_path(bin, sizeof(bin), "bin/gpucrd") < 0) {
		fprintf(stderr, "gpucr run: gpucrd not found beside gpucr\n");
		return -ENOENT;
	}
	snprintf(log, loglen, "%s.log", path);
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		setsid();
		if (fork() != 0)
			_exit(0);
		fd = open("/dev/null", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(bin, "gpucrd", "--socket", path, "--log", log, (char *)NULL);
		_exit(127);
	}
	waitpid(pid, NULL, 0);
	for (i = 0; i < 200; i++) {
		fd = sock_connect_unix(path);
		if (fd >= 0) {
			close(fd);
			return 0;
		}
		usleep(10000);
	}
	return -ETIMEDOUT;
}

int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "no-daemon", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char libdir[PATH_MAX], real[PATH_MAX], ldpath[2 * PATH_MAX], log[PATH_MAX];
	const char *path = NULL, *old;
	int no_daemon = 0, c, fd;

	while ((c = getopt_long(argc, argv, "+s:nh", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			path = optarg;
			break;
		case 'n':
			no_daemon = 1;
			break;
		case 'h':
			help_run(stdout);
			return CLI_OK;
		default:
			return cli_usage_error("run", "unknown option");
		}
	}
	if (optind >= argc)
		return cli_usage_error("run", "no command given");
	if (!path)
		path = sock_default_path();
	if (cli_own_path(libdir, sizeof(libdir), "lib/gpucr/libcuda.so.1") < 0) {
		fprintf(stderr, "gpucr run: the driver shim lib/gpucr/libcuda.so.1 is not beside gpucr; "
				"reinstall gpucr (make install or the bundle)\n");
		return CLI_FAIL;
	}
	if (!realpath(libdir, real)) {
		perror("gpucr run: realpath");
		return CLI_FAIL;
	}
	*strrchr(real, '/') = 0;
	old = getenv("LD_LIBRARY_PATH");
	snprintf(ldpath, sizeof(ldpath), "%s%s%s", real, old && *old ? ":" : "", old ? old : "");
	setenv("LD_LIBRARY_PATH", ldpath, 1);
	setenv("GPUCR_SOCKET", path, 1);

	fd = sock_connect_unix(path);
	if (fd >= 0) {
		close(fd);
	} else if (!no_daemon) {
		int r = start_daemon(path, log, sizeof(log));

		if (r < 0)
			fprintf(stderr, "gpucr run: could not start gpucrd on %s (%s); running without checkpoint support\n",
				path, strerror(-r));
		else
			fprintf(stderr, "gpucr run: started gpucrd for you: socket %s, log %s\n", path, log);
	}
	execvp(argv[optind], argv + optind);
	fprintf(stderr, "gpucr run: %s: %s\n", argv[optind], strerror(errno));
	return 127;
}
