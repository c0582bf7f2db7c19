/* The pickle writer of snapshot_pickle.h: a snapshot's tree as a protocol 4 pickle that Python's
 * pickle.load (and so torch.cuda._memory_viz) reads as the dicts, lists, strings and numbers that
 * json.load makes of the same snapshot's JSON. */
#include "snapshot_pickle.h"

#include "bytes.h"
#include "snapshot_pickle_ops.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  as_bytes b;
  size_t not_utf8; /* bytes written as U+FFFD */
} wbuf;

static void put(wbuf *w, const void *bytes, size_t n) { as_bytes_put(&w->b, bytes, n); }

static void put1(wbuf *w, unsigned char b) { put(w, &b, 1); }

/* n as `width` little-endian bytes. */
static void put_le(wbuf *w, uint64_t n, int width) {
  unsigned char b[8];
  for (int i = 0; i < width; i++)
    b[i] = (unsigned char)(n >> (8 * i));
  put(w, b, (size_t)width);
}

/* Python reads pickled text as strict UTF-8, while JSON text (a file name cachalot wrote, say) may hold
 * other bytes: each byte that does not start a valid character is written as U+FFFD, as Python's
 * decode(errors="replace") would show it, and counted. */
static const unsigned char replacement[3] = {0xef, 0xbf, 0xbd};

static size_t text_len(const unsigned char *s, size_t n, size_t *bad) {
  size_t len = 0;
  for (size_t i = 0; i < n;) {
    size_t ok = as_utf8_bad(s + i, n - i);
    if (ok == SIZE_MAX)
      return len + (n - i);
    len += ok + sizeof replacement;
    i += ok + 1;
    (*bad)++;
  }
  return len;
}

static void put_string(wbuf *w, const char *str) {
  const unsigned char *s = (const unsigned char *)str;
  size_t n = strlen(str), bad_here = 0, len = text_len(s, n, &bad_here);
  if (len < 256) {
    put1(w, 0x8c); /* SHORT_BINUNICODE */
    put1(w, (unsigned char)len);
  } else if (len <= UINT32_MAX) {
    put1(w, 'X'); /* BINUNICODE */
    put_le(w, len, 4);
  } else {
    put1(w, 0x8d); /* BINUNICODE8 */
    put_le(w, len, 8);
  }
  if (bad_here == 0) {
    put(w, s, n);
    return;
  }
  w->not_utf8 += bad_here;
  for (size_t i = 0; i < n;) {
    size_t ok = as_utf8_bad(s + i, n - i);
    put(w, s + i, ok == SIZE_MAX ? n - i : ok);
    if (ok == SIZE_MAX)
      break;
    put(w, replacement, sizeof replacement);
    i += ok + 1;
  }
}

/* Whole numbers in [-2^63, 2^64) as integers, in the fewest bytes Python's pickler would use; others
 * (and only finite ones reach here) as BINFLOAT, big-endian. */
static void put_number(wbuf *w, double d) {
  bool whole = d >= -9223372036854775808.0 && d < 18446744073709551616.0 &&
               (d < 0 ? (double)(int64_t)d == d : (double)(uint64_t)d == d);
  if (!whole) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
      b[i] = (unsigned char)(bits >> (8 * (7 - i)));
    put1(w, 'G'); /* BINFLOAT */
    put(w, b, 8);
  } else if (d >= 0 && d < 256) {
    put1(w, 'K'); /* BININT1 */
    put1(w, (unsigned char)d);
  } else if (d >= 0 && d < 65536) {
    put1(w, 'M'); /* BININT2 */
    put_le(w, (uint64_t)d, 2);
  } else if (d >= -2147483648.0 && d < 2147483648.0) {
    put1(w, 'J'); /* BININT */
    put_le(w, (uint32_t)(int32_t)d, 4);
  } else {
    /* LONG1: little-endian two's complement, as few bytes as keep the sign. */
    uint64_t v = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
    unsigned char b[9];
    for (int i = 0; i < 8; i++)
      b[i] = (unsigned char)(v >> (8 * i));
    b[8] = d < 0 ? 0xff : 0;
    size_t n = 9;
    while (n > 1 && ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
      n--;
    put1(w, 0x8a);
    put1(w, (unsigned char)n);
    put(w, b, n);
  }
}

/* Python's pickler adds items in batches of 1000 between a MARK and SETITEMS or APPENDS. */
enum { BATCH = 1000 };

static void put_value(wbuf *w, const cJSON *v) {
  if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
    bool obj = cJSON_IsObject(v);
    put1(w, obj ? '}' : ']'); /* EMPTY_DICT, EMPTY_LIST */
    size_t in_batch = 0;
    for (const cJSON *e = v->child; e != NULL && !w->b.oom; e = e->next) {
      if (in_batch == 0)
        put1(w, '('); /* MARK */
      if (obj)
        put_string(w, e->string ? e->string : "");
      put_value(w, e);
      if (++in_batch == BATCH || e->next == NULL) {
        put1(w, obj ? 'u' : 'e'); /* SETITEMS, APPENDS */
        in_batch = 0;
      }
    }
  } else if (cJSON_IsString(v)) {
    put_string(w, v->valuestring ? v->valuestring : "");
  } else if (cJSON_IsNumber(v)) {
    put_number(w, v->valuedouble);
  } else if (cJSON_IsBool(v)) {
    put1(w, cJSON_IsTrue(v) ? 0x88 : 0x89); /* NEWTRUE, NEWFALSE */
  } else {
    put1(w, 'N'); /* NONE (and anything else cJSON might hold, which no reader here makes) */
  }
}

int as_pickle_write(const cJSON *root, unsigned char **out, size_t *out_len, size_t *not_utf8) {
  wbuf w = {0};
  put1(&w, 0x80); /* PROTO 4 */
  put1(&w, 4);
  put_value(&w, root);
  put1(&w, '.'); /* STOP */
  if (w.b.oom) {
    free(w.b.buf);
    return -1;
  }
  *out = w.b.buf;
  *out_len = w.b.len;
  *not_utf8 = w.not_utf8;
  return 0;
}
