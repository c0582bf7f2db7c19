/* A JSON writer into a growing heap buffer: the stats JSON and the snapshot are written with it.
 * Commas are placed by the writer (a stack of "first item at this depth" flags); a host allocation
 * failure makes the writer inert and finish() return NULL. Strings are escaped per RFC 8259. */
#ifndef CACHALOT_COMMON_JSON_WRITER_H
#define CACHALOT_COMMON_JSON_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { CL_JSON_MAX_DEPTH = 32 };

typedef struct {
  char *buf;
  size_t len, cap;
  bool oom;
  int depth;
  bool first[CL_JSON_MAX_DEPTH]; /* no item written yet at this depth */
  bool after_key;                /* the next value follows a key: no comma */
} cl_json;

void cl_json_init(cl_json *j);
void cl_json_begin_object(cl_json *j);
void cl_json_end_object(cl_json *j);
void cl_json_begin_array(cl_json *j);
void cl_json_end_array(cl_json *j);
void cl_json_key(cl_json *j, const char *key);
void cl_json_string(cl_json *j, const char *s);
void cl_json_int(cl_json *j, int64_t v);
void cl_json_uint(cl_json *j, uint64_t v);
void cl_json_double(cl_json *j, double v);
void cl_json_bool(cl_json *j, bool v);
void cl_json_null(cl_json *j);
/* The finished text (caller frees), or NULL after a host allocation failure. The writer is reset. */
char *cl_json_finish(cl_json *j);
void cl_json_discard(cl_json *j);

/* The escaper cl_json_string uses, for writers of their own (the tools compile this file in). */
typedef void cl_json_sink(void *ctx, const char *bytes, size_t n);
/* The contents of s (NULL: "") as a JSON string's, without its quotes: '"', '\\' and the control
 * characters below 0x20 escaped (\n, \r, \t by name, the others as \u00xx); a byte that starts no valid
 * UTF-8 character (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, a sequence cut
 * short) as \ufffd, so the text is UTF-8 whatever s holds; every other character, DEL included, as it is.
 * sink gets one call per character of s (the character or its escape), so a sink with a bound can stop
 * between characters and never cut an escape or a UTF-8 sequence in half. */
void cl_json_escape(const char *s, cl_json_sink *sink, void *ctx);
/* The length of the valid UTF-8 character at p (at most n bytes there; it reads no byte past a NUL or a
 * byte that ends it early), or 0 where none starts. */
size_t cl_utf8_len(const unsigned char *p, size_t n);
/* s as a quoted JSON string on f. */
void cl_json_fput_string(FILE *f, const char *s);

#endif
