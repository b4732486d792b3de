/* The shim finds its driver by path and never takes itself for it: pointed
 * at its own file, at a symlink to it, or at the bare name libcuda.so.1
 * (which the loader answers with the shim), it refuses with a message, and
 * cuInit answers CUDA_ERROR_NO_DEVICE; so does a path with no driver. The
 * fake driver, named by GPUCR_REAL_LIBCUDA, loads.
 *
 * Linked against the shim. Each case runs in a child forked before the
 * process's first CUDA call (the shim loads its driver on first use). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "t.h"

/* cuInit's result in a child with GPUCR_REAL_LIBCUDA=path; its stderr in msg. */
static int try_driver(const char *path, char *msg, size_t msglen)
{
	char tmpl[] = "/tmp/gpucr-test-XXXXXX";
	int fd = mkstemp(tmpl), status;
	ssize_t n;
	pid_t pid;

	REQUIRE(fd >= 0);
	unlink(tmpl);
	pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		dup2(fd, 2);
		setenv("GPUCR_REAL_LIBCUDA", path, 1);
		unsetenv("GPUCR_LOG");
		/* A second call must not load anything again or print twice. */
		cuInit(0);
		_exit((int)cuInit(0) & 0xff);
	}
	REQUIRE(waitpid(pid, &status, 0) == pid);
	n = pread(fd, msg, msglen - 1, 0);
	msg[n > 0 ? n : 0] = '\0';
	close(fd);
	REQUIRE(WIFEXITED(status));
	return WEXITSTATUS(status);
}

static int count(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

int main(void)
{
	char msg[4096], link[64];

	alarm(60);

	CHECK_EQ_INT(try_driver(SHIM_LIB, msg, sizeof(msg)), CUDA_ERROR_NO_DEVICE);
	CHECK_CONTAINS(msg, "shim itself");
	CHECK_CONTAINS(msg, "GPUCR_REAL_LIBCUDA");
	CHECK_EQ_INT(count(msg, "shim itself"), 1);

	snprintf(link, sizeof(link), "/tmp/gpucr-test-link-%d.so", (int)getpid());
	REQUIRE(symlink(SHIM_LIB, link) == 0);
	CHECK_EQ_INT(try_driver(link, msg, sizeof(msg)), CUDA_ERROR_NO_DEVICE);
	CHECK_CONTAINS(msg, "shim itself");
	unlink(link);

	CHECK_EQ_INT(try_driver("libcuda.so.1", msg, sizeof(msg)), CUDA_ERROR_NO_DEVICE);
	CHECK_CONTAINS(msg, "shim itself");

	CHECK_EQ_INT(try_driver("/nonexistent/libcuda.so.1", msg, sizeof(msg)), CUDA_ERROR_NO_DEVICE);
	CHECK_CONTAINS(msg, "/nonexistent/libcuda.so.1");

	if (access(FAKECUDA_LIB, R_OK) == 0) {
		CHECK_EQ_INT(try_driver(FAKECUDA_LIB, msg, sizeof(msg)), CUDA_SUCCESS);
		CHECK_EQ_INT(strlen(msg), 0);
	} else {
		fprintf(stderr, "note: %s not built; loading a real driver not checked\n", FAKECUDA_LIB);
	}
	return t_done();
}
