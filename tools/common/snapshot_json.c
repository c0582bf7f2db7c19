/* The strict JSON text a snapshot must be (RFC 8259, nothing after the value): cJSON parses it, and a
 * pass over the text refuses what cJSON alone lets through. Its messages name the line and column. */
#include "snapshot_pickle.h"
#include "snapshot_reader.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int as_read_fail(const char *name, char *err, const char *fmt, ...) {
  int n = snprintf(err, AS_ERR_LEN, "%s: ", name);
  if (n < 0 || n >= AS_ERR_LEN)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + n, AS_ERR_LEN - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

/* Line and column (from 1) of byte `off` of data, for parse-error messages. */
static void line_col(const char *data, size_t off, size_t *line, size_t *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off; i++) {
    if (data[i] == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

/* The bracket depth at byte `off` (strings skipped), to tell cJSON's nesting limit from other errors. */
static size_t depth_at(const char *data, size_t off) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < off; i++) {
    char ch = data[i];
    if (in_string) {
      if (ch == '\\')
        i++;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      depth++;
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      depth--;
    }
  }
  return depth;
}

/* A number as RFC 8259 writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool json_number(const char *p, size_t n) {
  size_t i = 0;
  if (i < n && p[i] == '-')
    i++;
  if (i < n && p[i] == '0')
    i++;
  else if (i < n && p[i] >= '1' && p[i] <= '9')
    while (i < n && p[i] >= '0' && p[i] <= '9')
      i++;
  else
    return false;
  if (i < n && p[i] == '.') {
    size_t digits = ++i;
    while (i < n && p[i] >= '0' && p[i] <= '9')
      i++;
    if (i == digits)
      return false;
  }
  if (i < n && (p[i] == 'e' || p[i] == 'E')) {
    i++;
    if (i < n && (p[i] == '+' || p[i] == '-'))
      i++;
    size_t digits = i;
    while (i < n && p[i] >= '0' && p[i] <= '9')
      i++;
    if (i == digits)
      return false;
  }
  return i == n;
}

/* cJSON takes every byte up to 0x20 for white space, keeps control bytes inside strings, reads numbers
 * with strtod ("01", "1.") and cuts a string at an escaped NUL: it read `{"segments": [\0]}` as a
 * snapshot. This finds the first such byte of a text cJSON has parsed (so its strings are closed), or
 * returns SIZE_MAX; *why says what is wrong there. */
static size_t not_strict_json(const char *data, size_t len, const char **why) {
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)data[i];
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r')
      continue;
    if (ch < 0x20) {
      *why = "a control byte between tokens (only space, tab, newline and carriage return may be there)";
      return i;
    }
    if (ch == '"') {
      for (i++; i < len && data[i] != '"'; i++) {
        ch = (unsigned char)data[i];
        if (ch < 0x20) {
          *why = "a control byte inside a string (JSON wants it escaped)";
          return i;
        }
        if (ch == '\\' && i + 1 < len) {
          if (data[i + 1] == 'u' && i + 6 <= len && memcmp(data + i + 2, "0000", 4) == 0) {
            *why = "\\u0000 in a string (its NUL would cut the string short)";
            return i;
          }
          i++;
        }
      }
    } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
      size_t n = 0;
      while (i + n < len && data[i + n] != '\0' && strchr("0123456789+-.eE", data[i + n]) != NULL)
        n++;
      if (!json_number(data + i, n)) {
        *why = "a number JSON does not allow (a leading zero, or a point or exponent without digits)";
        return i;
      }
      i += n - 1;
    }
  }
  return SIZE_MAX;
}

/* An upper bound of the values cJSON would make of the text (each container, and one more value per
 * comma), counted outside strings, stopping once past `most`. */
static size_t count_values(const char *data, size_t len, size_t most) {
  size_t n = 1;
  for (size_t i = 0; i < len && n <= most; i++) {
    const char ch = data[i];
    if (ch == '"') {
      for (i++; i < len && data[i] != '"'; i++)
        i += data[i] == '\\';
    } else {
      n += ch == ',' || ch == '[' || ch == '{';
    }
  }
  return n;
}

/* cJSON's allocations, watched: a parse that fails because the host had no memory says so. */
static bool json_oom;
static void *watched_malloc(size_t n) {
  void *p = malloc(n);
  json_oom |= p == NULL;
  return p;
}

cJSON *as_json_parse(const char *name, const char *data, size_t len, char err[AS_ERR_LEN]) {
  err[0] = '\0';
  /* A pickle is read here, so that every reader of snapshots (as_snapshot_parse and what calls it)
   * takes PyTorch's .pickle files too and checks them with the same schema. */
  if (as_is_pickle(data, len))
    return as_pickle_parse(name, data, len, err);
  size_t first = 0;
  while (first < len && (data[first] == ' ' || data[first] == '\t' || data[first] == '\n' || data[first] == '\r'))
    first++;
  if (first == len) {
    as_read_fail(name, err, len == 0 ? "empty file" : "no JSON in the file (only white space)");
    return NULL;
  }
  size_t most = len / AS_JSON_BYTES_PER_VALUE;
  most = most < AS_JSON_MIN_VALUES ? AS_JSON_MIN_VALUES : most > AS_JSON_MAX_VALUES ? AS_JSON_MAX_VALUES : most;
  if (count_values(data, len, most) > most) {
    as_read_fail(name, err,
                 "holds more than %zu values, over one per %zu bytes of its %zu bytes of text: refused; the "
                 "reader bounds its memory so (at least %zu values, at most %zu)",
                 most, AS_JSON_BYTES_PER_VALUE, len, AS_JSON_MIN_VALUES, AS_JSON_MAX_VALUES);
    return NULL;
  }
  static cJSON_Hooks hooks = {watched_malloc, free};
  cJSON_InitHooks(&hooks);
  json_oom = false;
  const char *end = NULL;
  /* With a length, cJSON never reads past data + len, so data needs no NUL at its end. The nesting
   * limit (CJSON_NESTING_LIMIT, 1000) bounds its recursion. */
  cJSON *root = cJSON_ParseWithLengthOpts(data, len, &end, false);
  if (root == NULL && json_oom) {
    as_read_fail(name, err, "out of host memory while reading %zu bytes of JSON", len);
    return NULL;
  }
  size_t line, col;
  /* Wrong from its first byte: perhaps not meant as JSON at all. */
  static const char neither[] = ": neither snapshot JSON nor a pickle (snapshots are read as JSON or as "
                                "PyTorch's pickles of protocol 2 to 5, either gzip'ed or not)";
  if (root == NULL) {
    size_t off = end != NULL && end >= data && end <= data + len ? (size_t)(end - data) : 0;
    line_col(data, off, &line, &col);
    unsigned char ch = off < len ? (unsigned char)data[off] : 0;
    /* cJSON reports an error at the end as the last byte. */
    if (off + 1 >= len)
      as_read_fail(name, err, "not valid JSON: the text ends early (truncated file?) at line %zu, column %zu",
                   line, col);
    else if (depth_at(data, off) >= CJSON_NESTING_LIMIT)
      as_read_fail(name, err, "not valid JSON: nested deeper than %d levels at line %zu, column %zu",
                   CJSON_NESTING_LIMIT, line, col);
    else if (ch >= 0x20 && ch < 0x7f)
      as_read_fail(name, err, "not valid JSON at line %zu, column %zu (byte %zu, '%c')%s", line, col, off, ch,
                   off == first ? neither : "");
    else
      as_read_fail(name, err, "not valid JSON at line %zu, column %zu (byte %zu, 0x%02x)%s", line, col, off, ch,
                   off == first ? neither : "");
    return NULL;
  }
  /* Anything after the value other than white space means this is not one JSON document. */
  size_t rest = end != NULL && end >= data && end <= data + len ? (size_t)(end - data) : len;
  while (rest < len && (data[rest] == ' ' || data[rest] == '\t' || data[rest] == '\n' || data[rest] == '\r'))
    rest++;
  const char *why = "text after the end of the document";
  size_t bad = rest < len ? rest : not_strict_json(data, len, &why);
  if (bad == SIZE_MAX)
    return root;
  line_col(data, bad, &line, &col);
  unsigned char ch = (unsigned char)data[bad];
  if (ch >= 0x20 && ch < 0x7f)
    as_read_fail(name, err, "not valid JSON at line %zu, column %zu (byte %zu, '%c'): %s", line, col, bad, ch, why);
  else
    as_read_fail(name, err, "not valid JSON at line %zu, column %zu (byte %zu, 0x%02x): %s", line, col, bad, ch, why);
  cJSON_Delete(root);
  return NULL;
}
