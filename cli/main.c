/* gpucr: the command-line front end. Dispatches subcommands; each lives in
 * a file of its own. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "log.h"

static const struct cli_cmd cmds[] = {
	{ "run", "run a program under gpucr (starts gpucrd if needed)", cmd_run, help_run },
	{ "ps", "list the processes gpucrd holds GPU memory for", cmd_ps, help_ps },
	{ "dump", "checkpoint a process tree with CRIU and gpucr's plugin", cmd_dump, help_dump },
	{ "restore", "restore a dumped process tree with its GPU memory", cmd_restore, help_restore },
	{ "checkpoint", "checkpoint a running process tree, once or periodically, keeping the last N",
	  cmd_checkpoint, help_checkpoint },
	{ "drop", "free GPU memory kept for a dumped process", cmd_drop, help_drop },
	{ "inspect", "decode and check a GPU image in a CRIU image directory", cmd_inspect, help_inspect },
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static void usage(FILE *f)
{
	size_t i;

	fprintf(f, "Usage: gpucr [--version] [--help] COMMAND [ARGS]\n\n"
		   "gpucr checkpoints and restores CUDA processes with CRIU.\n\nCommands:\n");
	for (i = 0; i < NCMDS; i++)
		fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\n'gpucr COMMAND --help' describes a command.\n"
		   "Environment: GPUCR_LOG=error|warn|info|debug, GPUCR_SOCKET=PATH (daemon socket).\n");
}

const char *cli_bytes(char *buf, size_t len, uint64_t b)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)b);
	else
		snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "gpucr %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'gpucr %s --help'.\n", cmd);
	return CLI_USAGE;
}

int main(int argc, char **argv)
{
	size_t i;

	log_init("gpucr");
	if (argc < 2) {
		usage(stderr);
		return CLI_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		if (argc > 2 && strcmp(argv[1], "help") == 0) {
			for (i = 0; i < NCMDS; i++)
				if (!strcmp(argv[2], cmds[i].name)) {
					cmds[i].help(stdout);
					return CLI_OK;
				}
		}
		usage(stdout);
		return CLI_OK;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("gpucr %s\n", GPUCR_VERSION);
		return CLI_OK;
	}
	for (i = 0; i < NCMDS; i++) {
		if (strcmp(argv[1], cmds[i].name))
			continue;
		if (argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
			cmds[i].help(stdout);
			return CLI_OK;
		}
		return cmds[i].run(argc - 1, argv + 1);
	}
	fprintf(stderr, "gpucr: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return CLI_USAGE;
}
