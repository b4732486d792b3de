/* Logging: levels filter, the prefix and file:line appear where promised,
 * errno is preserved, pr_perror appends the error's text. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "log.h"
#include "t.h"

static char out[8192];

static const char *drain(int fd)
{
	ssize_t n = read(fd, out, sizeof(out) - 1);

	out[n > 0 ? n : 0] = 0;
	return out;
}

int main(void)
{
	int p[2];

	REQUIRE(pipe2(p, O_NONBLOCK) == 0);
	unsetenv("GPUCR_LOG");
	log_init("gpucr-test");
	log_set_fd(p[1]);

	pr_info("hello %d", 42);
	CHECK(strcmp(drain(p[0]), "gpucr-test: hello 42\n") == 0);
	pr_debug("hidden");
	CHECK_EQ_INT(read(p[0], out, sizeof(out)), -1);
	log_set_level(LOG_DEBUG);
	pr_debug("shown");
	CHECK_CONTAINS(drain(p[0]), "test-log.c:");
	CHECK_CONTAINS(out, "shown");
	log_set_level(LOG_ERR);
	pr_warn("quiet");
	CHECK_EQ_INT(read(p[0], out, sizeof(out)), -1);
	errno = ENOSPC;
	pr_perror("writing %s", "chunk 17");
	CHECK_EQ_INT(errno, ENOSPC);
	CHECK(strcmp(drain(p[0]), "gpucr-test: error: writing chunk 17: No space left on device\n") == 0);
	setenv("GPUCR_LOG", "debug", 1);
	log_init("x");
	CHECK_EQ_INT(log_get_level(), LOG_DEBUG);
	return t_done();
}
