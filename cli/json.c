/* Owns the CLI's JSON formatting. */
#include <inttypes.h>

#include "json.h"

void json_init(struct json *j, FILE *f)
{
	j->f = f;
	j->depth = 0;
	j->need_comma[0] = 0;
}

static void put_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static void key(struct json *j, const char *k)
{
	if (j->need_comma[j->depth])
		fputc(',', j->f);
	j->need_comma[j->depth] = 1;
	if (k) {
		put_string(j->f, k);
		fputc(':', j->f);
	}
}

static void open_(struct json *j, const char *k, char c)
{
	key(j, k);
	fputc(c, j->f);
	if (j->depth < 31)
		j->depth++;
	j->need_comma[j->depth] = 0;
}

void json_obj_begin(struct json *j, const char *k)
{
	open_(j, k, '{');
}

void json_obj_end(struct json *j)
{
	fputc('}', j->f);
	if (j->depth > 0)
		j->depth--;
}

void json_arr_begin(struct json *j, const char *k)
{
	open_(j, k, '[');
}

void json_arr_end(struct json *j)
{
	fputc(']', j->f);
	if (j->depth > 0)
		j->depth--;
}

void json_str(struct json *j, const char *k, const char *val)
{
	key(j, k);
	if (val)
		put_string(j->f, val);
	else
		fputs("null", j->f);
}

void json_u64(struct json *j, const char *k, uint64_t val)
{
	key(j, k);
	fprintf(j->f, "%" PRIu64, val);
}

void json_i64(struct json *j, const char *k, int64_t val)
{
	key(j, k);
	fprintf(j->f, "%" PRId64, val);
}

void json_bool(struct json *j, const char *k, int val)
{
	key(j, k);
	fputs(val ? "true" : "false", j->f);
}

void json_hex(struct json *j, const char *k, uint64_t val)
{
	key(j, k);
	fprintf(j->f, "\"0x%" PRIx64 "\"", val);
}

void json_end(struct json *j)
{
	fputc('\n', j->f);
	fflush(j->f);
}
