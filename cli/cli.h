/* The gpucr command: subcommands share these helpers and options. */
#ifndef GPUCR_CLI_H
#define GPUCR_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "msg.h"

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
int cmd_run(int argc, char **argv);
void help_run(FILE *f);
int cmd_ps(int argc, char **argv);
void help_ps(FILE *f);
int cmd_drop(int argc, char **argv);
void help_drop(FILE *f);
int cmd_dump(int argc, char **argv);
void help_dump(FILE *f);
int cmd_restore(int argc, char **argv);
void help_restore(FILE *f);
int cmd_checkpoint(int argc, char **argv);
void help_checkpoint(FILE *f);

/* criu.c: one dump with CRIU and gpucr's plugin, waiting for the GPU images. */
struct cli_dump_result {
	double criu_s;          /* CRIU's run: the process is frozen within it */
	double total_s;         /* until every GPU image was complete */
	/* --pre-copy: the processes of the tree pre-copied before CRIU ran */
	unsigned precopied;     /* processes */
	double precopy_s;
	uint64_t precopy_bytes, precopy_dirty;  /* written in all rounds; dirty when they stopped */
	unsigned precopy_rounds;                /* the most rounds of any process */
	unsigned finished;      /* images finished from their pre-copy */
	uint64_t final_bytes, kept_bytes;       /* written at T; kept from the pre-copy */
	double final_s;         /* the longest final pass */
};
/* precopy_rounds < 0: no pre-copy; else at most that many rounds after the
 * first copy (gpucrd's PreCopyRequest). */
int cli_dump(long pid, const char *dir, int leave, const char *criu_given, char **extra, int nextra,
	     int precopy_rounds, struct cli_dump_result *res);

/* client.c */
int cli_connect(const char *socket_path);
int cli_call(Gpucr__Msg *req, int fd, Gpucr__Msg **ret);
/* gpucrd's process list: 0 and the PsReply message in *ret (msg_free it),
 * or an error with why said in why. */
int cli_ps(Gpucr__Msg **ret, char *why, size_t whylen);
int cli_own_path(char *buf, size_t len, const char *rel);

#endif
