/* Runs a command as a child subreaper and reaps every orphan under it until
 * the command exits; exits with the command's status. C/R tests need this:
 * on these hosts PID 1 does not reap orphans, and a dumped process's lingering
 * zombie keeps its pid, so CRIU could not restore it under that pid. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	pid_t child, p;
	int status, ret = 1;

	if (argc < 2) {
		fprintf(stderr, "usage: subreaper CMD [ARGS...]\n");
		return 2;
	}
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
		perror("subreaper: PR_SET_CHILD_SUBREAPER");
		return 1;
	}
	child = fork();
	if (child < 0) {
		perror("subreaper: fork");
		return 1;
	}
	if (child == 0) {
		execvp(argv[1], argv + 1);
		fprintf(stderr, "subreaper: %s: %s\n", argv[1], strerror(errno));
		_exit(127);
	}
	/* Reap until the command is done, then whatever is left. */
	for (;;) {
		p = waitpid(-1, &status, 0);
		if (p < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p == child)
			ret = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	}
	return ret;
}
