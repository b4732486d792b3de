/* gpucr ps and gpucr drop: what gpucrd holds, and letting go of the GPU
 * memory it keeps for a dumped process. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "err.h"
#include "json.h"
#include "sock.h"

void help_ps(FILE *f)
{
	fprintf(f, "Usage: gpucr ps [--json] [--socket PATH]\n\n"
		   "Lists the processes gpucrd knows (yours; root sees all): pid, state,\n"
		   "GPU memory it holds for them, and whether it is retained for a restore.\n");
}

void help_drop(FILE *f)
{
	fprintf(f, "Usage: gpucr drop --pid PID [--socket PATH]\n\n"
		   "Frees the GPU memory gpucrd keeps for dumped process PID (for a zero-copy\n"
		   "restore). The process can still be restored from its image afterwards.\n");
}

static const char *state_name(Gpucr__ProcState s)
{
	switch (s) {
	case GPUCR__PROC_STATE__PROC_RUNNING:
		return "running";
	case GPUCR__PROC_STATE__PROC_QUIESCED:
		return "quiesced";
	case GPUCR__PROC_STATE__PROC_RELEASED:
		return "released";
	case GPUCR__PROC_STATE__PROC_DUMPED:
		return "dumped";
	case GPUCR__PROC_STATE__PROC_RESTORING:
		return "restoring";
	case GPUCR__PROC_STATE__PROC_GONE:
		return "gone";
	default:
		return "?";
	}
}

static int connect_or_say(const char *cmd, const char *path)
{
	int r = cli_connect(path);

	if (r < 0)
		fprintf(stderr, "gpucr %s: gpucrd does not answer at %s: %s\n", cmd,
			path ? path : sock_default_path(), gpucr_strerror(r));
	return r;
}

int cmd_ps(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "socket", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	Gpucr__Msg *rep = NULL;
	const char *path = NULL;
	char why[512];
	int as_json = 0, c;
	size_t i;

	while ((c = getopt_long(argc, argv, "js:", opts, NULL)) != -1) {
		if (c == 'j')
			as_json = 1;
		else if (c == 's')
			path = optarg;
		else
			return cli_usage_error("ps", "unknown option");
	}
	if (connect_or_say("ps", path) < 0)
		return CLI_FAIL;
	if (cli_ps(&rep, why, sizeof(why)) < 0) {
		fprintf(stderr, "gpucr ps: %s\n", why);
		return CLI_FAIL;
	}
	if (as_json) {
		struct json j;

		json_init(&j, stdout);
		json_obj_begin(&j, NULL);
		json_arr_begin(&j, "processes");
		for (i = 0; i < rep->ps_reply->n_procs; i++) {
			Gpucr__ProcInfo *p = rep->ps_reply->procs[i];

			json_obj_begin(&j, NULL);
			json_u64(&j, "pid", p->pid);
			json_u64(&j, "uid", p->uid);
			json_str(&j, "comm", p->comm);
			json_str(&j, "state", state_name(p->state));
			json_u64(&j, "buffers", p->buffers);
			json_u64(&j, "bytes", p->bytes);
			json_bool(&j, "retained", p->retained);
			json_str(&j, "image_dir", p->image_dir);
			json_obj_end(&j);
		}
		json_arr_end(&j);
		json_obj_end(&j);
		json_end(&j);
	} else {
		printf("%-8s %-6s %-16s %-10s %8s %12s  %s\n", "PID", "UID", "COMMAND", "STATE", "BUFFERS",
		       "GPU MEMORY", "IMAGE");
		for (i = 0; i < rep->ps_reply->n_procs; i++) {
			Gpucr__ProcInfo *p = rep->ps_reply->procs[i];
			char b[32];

			printf("%-8u %-6u %-16s %-10s %8llu %12s  %s%s\n", p->pid, p->uid, p->comm ? p->comm : "?",
			       state_name(p->state), (unsigned long long)p->buffers, cli_bytes(b, sizeof(b), p->bytes),
			       p->image_dir ? p->image_dir : "-", p->retained ? " (memory retained)" : "");
		}
	}
	msg_free(rep);
	return CLI_OK;
}

int cmd_drop(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "pid", required_argument, NULL, 'p' },
		{ "socket", required_argument, NULL, 's' },
		{ NULL, 0, NULL, 0 },
	};
	Gpucr__Msg m = GPUCR__MSG__INIT, *rep = NULL;
	Gpucr__DropRequest dr = GPUCR__DROP_REQUEST__INIT;
	const char *path = NULL;
	long pid = 0;
	int c, r;

	while ((c = getopt_long(argc, argv, "p:s:", opts, NULL)) != -1) {
		if (c == 'p')
			pid = strtol(optarg, NULL, 10);
		else if (c == 's')
			path = optarg;
		else
			return cli_usage_error("drop", "unknown option");
	}
	if (pid <= 0)
		return cli_usage_error("drop", "--pid PID is required");
	if (connect_or_say("drop", path) < 0)
		return CLI_FAIL;
	dr.pid = (uint32_t)pid;
	m.body_case = GPUCR__MSG__BODY_DROP;
	m.drop = &dr;
	r = cli_call(&m, -1, &rep);
	if (r < 0 || rep->err) {
		fprintf(stderr, "gpucr drop: %s\n", r < 0 ? gpucr_strerror(r) : rep->err_msg);
		msg_free(rep);
		return CLI_FAIL;
	}
	printf("pid %ld: retained GPU memory freed\n", pid);
	msg_free(rep);
	return CLI_OK;
}
