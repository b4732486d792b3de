/* Owns the process-wide log settings and the formatting of log lines. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static const char *log_prefix = "gpucr";
static int log_level = -1;
static int log_fd = -1;

static int level_from_env(void)
{
	const char *s = getenv("GPUCR_LOG");

	if (!s || !*s)
		return LOG_INFO;
	if (!strcasecmp(s, "error") || !strcmp(s, "0"))
		return LOG_ERR;
	if (!strcasecmp(s, "warn") || !strcmp(s, "1"))
		return LOG_WARN;
	if (!strcasecmp(s, "debug") || !strcmp(s, "3"))
		return LOG_DEBUG;
	return LOG_INFO;
}

void log_init(const char *prefix)
{
	if (prefix)
		log_prefix = prefix;
	log_level = level_from_env();
}

void log_set_level(enum log_level level)
{
	log_level = level;
}

enum log_level log_get_level(void)
{
	if (log_level < 0)
		log_level = level_from_env();
	return log_level;
}

void log_set_fd(int fd)
{
	log_fd = fd;
}

/* Appends to buf (capacity cap, used *n), truncating; keeps room for '\n'. */
static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void vappend(char *buf, size_t cap, size_t *n, const char *fmt, va_list ap)
{
	int r;

	if (*n + 2 >= cap)
		return;
	r = vsnprintf(buf + *n, cap - 1 - *n, fmt, ap);
	if (r > 0)
		*n += (size_t)r < cap - 2 - *n ? (size_t)r : cap - 2 - *n;
}

static void append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vappend(buf, cap, n, fmt, ap);
	va_end(ap);
}

static void log_vmsg(enum log_level level, const char *file, int line, const char *fmt,
		     va_list ap, int err)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	char buf[2048];
	size_t n = 0;

	if ((int)level > (int)log_get_level())
		return;
	if (level == LOG_INFO)
		append(buf, sizeof(buf), &n, "%s: ", log_prefix);
	else if (level == LOG_DEBUG) {
		struct timespec ts;

		/* Monotonic seconds: lines of the daemon, the shim and the plugin
		 * (all on one host) can be put side by side. */
		clock_gettime(CLOCK_MONOTONIC, &ts);
		append(buf, sizeof(buf), &n, "%s[%d] %ld.%03ld %s:%d: ", log_prefix, (int)getpid(), (long)ts.tv_sec,
		       ts.tv_nsec / 1000000, file, line);
	}
	else
		append(buf, sizeof(buf), &n, "%s: %s: ", log_prefix, names[level]);
	vappend(buf, sizeof(buf), &n, fmt, ap);
	if (err >= 0)
		append(buf, sizeof(buf), &n, ": %s", strerror(err));
	if (n == 0 || buf[n - 1] != '\n')
		buf[n++] = '\n';
	/* One write per line so lines from several processes do not interleave. */
	if (write(log_fd >= 0 ? log_fd : STDERR_FILENO, buf, n) < 0) {
		/* nowhere left to report it */
	}
}

void log_msg(enum log_level level, const char *file, int line, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;

	va_start(ap, fmt);
	log_vmsg(level, file, line, fmt, ap, -1);
	va_end(ap);
	errno = saved;
}

void log_perror(const char *file, int line, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;

	va_start(ap, fmt);
	log_vmsg(LOG_ERR, file, line, fmt, ap, saved);
	va_end(ap);
	errno = saved;
}

unsigned env_ms(const char *name, unsigned def)
{
	const char *s = getenv(name);
	unsigned long v;
	char *end;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v > UINT32_MAX) {
		pr_warn("%s=%s is not a number of milliseconds; using %u", name, s, def);
		return def;
	}
	return (unsigned)v;
}
