/* The gpucr command: subcommands share these helpers and options. */
#ifndef GPUCR_CLI_H
#define GPUCR_CLI_H

#include <stdint.h>
#include <stdio.h>

struct cli_cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);
	void (*help)(FILE *f);
};

/* Exit codes of every subcommand. */
#define CLI_OK 0
#define CLI_FAIL 1
#define CLI_USAGE 2

/* "12.0 MiB" into buf. */
const char *cli_bytes(char *buf, size_t len, uint64_t bytes);
/* Reports a usage error for cmd and returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int cmd_inspect(int argc, char **argv);
void help_inspect(FILE *f);

#endif
