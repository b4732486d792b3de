/* A small streaming JSON writer for the CLI's --json output: objects,
 * arrays, strings escaped per RFC 8259, integers. Writes to a FILE *. */
#ifndef GPUCR_CLI_JSON_H
#define GPUCR_CLI_JSON_H

#include <stdint.h>
#include <stdio.h>

struct json {
	FILE *f;
	int depth;
	int need_comma[32];
};

void json_init(struct json *j, FILE *f);
void json_obj_begin(struct json *j, const char *key);   /* key NULL inside arrays / top level */
void json_obj_end(struct json *j);
void json_arr_begin(struct json *j, const char *key);
void json_arr_end(struct json *j);
void json_str(struct json *j, const char *key, const char *val);
void json_u64(struct json *j, const char *key, uint64_t val);
void json_i64(struct json *j, const char *key, int64_t val);
void json_bool(struct json *j, const char *key, int val);
void json_hex(struct json *j, const char *key, uint64_t val);   /* "0x..." string */
void json_end(struct json *j);                                  /* newline */

#endif
