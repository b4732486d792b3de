/* Logging for every part of gpucr: levels, a per-part prefix, file:line at debug.
 *
 * The level comes from GPUCR_LOG (error, warn, info, debug; default info) and
 * can be changed with log_set_level(). Messages go to stderr, or to the fd
 * given to log_set_fd(). Library-like code (image I/O, framing, the shim's
 * core) logs at debug level only; the code that decides logs once. Logging
 * preserves errno, so pr_perror can follow a failed call directly. */
#ifndef GPUCR_LOG_H
#define GPUCR_LOG_H

#include <stdarg.h>

enum log_level {
	LOG_ERR = 0,
	LOG_WARN = 1,
	LOG_INFO = 2,
	LOG_DEBUG = 3,
};

/* prefix is kept by pointer: pass a string literal or one that outlives the
 * process's logging ("gpucrd", "gpucr", "gpucr-shim", "gpucr-plugin"). */
void log_init(const char *prefix);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Messages go to fd from now on (not closed by the log). -1: back to stderr. */
void log_set_fd(int fd);

void log_msg(enum log_level level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* As log_msg, then ": strerror(errno)" appended. */
void log_perror(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define pr_err(fmt, ...)   log_msg(LOG_ERR, __FILE__, __LINE__, fmt, ##__VA_ARGS__)
#define pr_warn(fmt, ...)  log_msg(LOG_WARN, __FILE__, __LINE__, fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...)  log_msg(LOG_INFO, __FILE__, __LINE__, fmt, ##__VA_ARGS__)
#define pr_debug(fmt, ...)                                                        \
	do {                                                                      \
		if (log_get_level() >= LOG_DEBUG)                                  \
			log_msg(LOG_DEBUG, __FILE__, __LINE__, fmt, ##__VA_ARGS__); \
	} while (0)
#define pr_perror(fmt, ...) log_perror(__FILE__, __LINE__, fmt, ##__VA_ARGS__)

/* Milliseconds from environment variable name: def when it is unset or
 * empty, and, with a warning in the log, when it is not a number. */
unsigned env_ms(const char *name, unsigned def);

#endif
