/* Owns the plugin's logging: lines go to CRIU's own log (print_on_level,
 * resolved at run time), prefixed "gpucr:", or to stderr without CRIU. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>

#include "plugin.h"

typedef void (*print_fn)(unsigned int level, const char *fmt, ...);
static print_fn criu_print;

void plog_init(void)
{
	criu_print = (print_fn)dlsym(RTLD_DEFAULT, "print_on_level");
}

void plog(int level, const char *fmt, ...)
{
	char buf[1200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (criu_print)
		criu_print((unsigned)level, "gpucr: %s\n", buf);
	else if (level <= PL_WARN)
		fprintf(stderr, "gpucr: %s\n", buf);
}
