/* The JSON writer of json_writer.h, and the one JSON string escaper of cachalot and its tools. */
#include "json_writer.h"

#include "c_locale.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cl_json_init(cl_json *j) {
  memset(j, 0, sizeof *j);
  j->first[0] = true;
}

static void put(cl_json *j, const char *s, size_t n) {
  if (j->oom)
    return;
  if (j->len + n + 1 > j->cap) {
    size_t cap = j->cap ? j->cap : 1024;
    while (cap < j->len + n + 1)
      cap *= 2;
    char *b = realloc(j->buf, cap);
    if (!b) {
      j->oom = true;
      return;
    }
    j->buf = b;
    j->cap = cap;
  }
  memcpy(j->buf + j->len, s, n);
  j->len += n;
  j->buf[j->len] = '\0';
}

static void puts_(cl_json *j, const char *s) { put(j, s, strlen(s)); }

/* Before any value or key: a comma unless it is the first item here, or a value right after its key. */
static void separate(cl_json *j) {
  if (j->after_key) {
    j->after_key = false;
    return;
  }
  if (!j->first[j->depth])
    put(j, ",", 1);
  j->first[j->depth] = false;
}

static void open_(cl_json *j, char c) {
  separate(j);
  put(j, &c, 1);
  if (j->depth + 1 < CL_JSON_MAX_DEPTH)
    j->depth++;
  else
    j->oom = true; /* deeper than any document cachalot writes: refuse rather than mis-nest */
  j->first[j->depth] = true;
}

static void close_(cl_json *j, char c) {
  if (j->depth > 0)
    j->depth--;
  put(j, &c, 1);
}

void cl_json_begin_object(cl_json *j) { open_(j, '{'); }
void cl_json_end_object(cl_json *j) { close_(j, '}'); }
void cl_json_begin_array(cl_json *j) { open_(j, '['); }
void cl_json_end_array(cl_json *j) { close_(j, ']'); }

size_t cl_utf8_len(const unsigned char *p, size_t n) {
  if (n == 0)
    return 0;
  const unsigned c = p[0];
  if (c < 0x80)
    return 1;
  size_t len;
  uint32_t cp, min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0; /* a continuation byte first, an overlong lead (C0, C1) or past U+10FFFF (F5..FF) */
  }
  for (size_t i = 1; i < len; i++) { /* a NUL or the end stops it here, before any byte past it */
    if (i >= n || (p[i] & 0xC0) != 0x80)
      return 0;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  return cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : len;
}

void cl_json_escape(const char *s, cl_json_sink *sink, void *ctx) {
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    char esc[8];
    if (*p >= 0x80) { /* a whole UTF-8 character, or U+FFFD for each byte that starts none */
      const size_t len = cl_utf8_len(p, 4);
      if (len)
        sink(ctx, (const char *)p, len), p += len - 1;
      else
        sink(ctx, "\\ufffd", 6);
      continue;
    }
    switch (*p) {
    case '"': sink(ctx, "\\\"", 2); break;
    case '\\': sink(ctx, "\\\\", 2); break;
    case '\n': sink(ctx, "\\n", 2); break;
    case '\r': sink(ctx, "\\r", 2); break;
    case '\t': sink(ctx, "\\t", 2); break;
    default:
      if (*p < 0x20) {
        snprintf(esc, sizeof esc, "\\u%04x", *p);
        sink(ctx, esc, 6);
      } else {
        sink(ctx, (const char *)p, 1);
      }
    }
  }
}

static void put_file(void *f, const char *s, size_t n) { fwrite(s, 1, n, f); }

void cl_json_fput_string(FILE *f, const char *s) {
  fputc('"', f);
  cl_json_escape(s, put_file, f);
  fputc('"', f);
}

static void put_json(void *j, const char *s, size_t n) { put(j, s, n); }

static void quoted(cl_json *j, const char *s) {
  put(j, "\"", 1);
  cl_json_escape(s, put_json, j);
  put(j, "\"", 1);
}

void cl_json_key(cl_json *j, const char *key) {
  separate(j);
  quoted(j, key);
  put(j, ":", 1);
  j->after_key = true;
}

void cl_json_string(cl_json *j, const char *s) {
  separate(j);
  quoted(j, s);
}

void cl_json_int(cl_json *j, int64_t v) {
  char b[32];
  separate(j);
  snprintf(b, sizeof b, "%lld", (long long)v);
  puts_(j, b);
}

void cl_json_uint(cl_json *j, uint64_t v) {
  char b[32];
  separate(j);
  snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  puts_(j, b);
}

void cl_json_double(cl_json *j, double v) {
  char b[40];
  separate(j);
  if (!isfinite(v)) {
    puts_(j, "null"); /* JSON has no NaN or infinity */
    return;
  }
  cl_snprintf_c(b, sizeof b, "%.17g", v);
  puts_(j, b);
}

void cl_json_bool(cl_json *j, bool v) {
  separate(j);
  puts_(j, v ? "true" : "false");
}

void cl_json_null(cl_json *j) {
  separate(j);
  puts_(j, "null");
}

char *cl_json_finish(cl_json *j) {
  char *out = NULL;
  if (!j->oom)
    out = j->buf ? j->buf : calloc(1, 1); /* nothing written: an empty string, still the caller's */
  else
    free(j->buf);
  cl_json_init(j);
  return out;
}

void cl_json_discard(cl_json *j) {
  free(j->buf);
  cl_json_init(j);
}
