/* cachalot_memory_stats_json (the keys of torch.cuda.memory_stats()) and the JSON writer under it
 * (src/common/json_writer.c).
 *
 * The stats JSON is parsed here by a small strict parser for its flat form ({"key":integer,...}, nothing
 * else), and checked against torch.cuda.memory_stats()'s 122 key names (built independently of the
 * library from the same three lists as tests/gpu/torch_compare.py), their strcmp order, and the values of
 * cachalot_memory_stats() after a sequence of operations. The writer is checked on exact output. */
#include "helpers.h"

#include "common/json_writer.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>

/* ---- a strict parser for the flat form -------------------------------------------------------- */

enum { MAX_KEYS = 256, KEY_LEN = 96 };

typedef struct {
  int n;
  char key[MAX_KEYS][KEY_LEN];
  int64_t value[MAX_KEYS];
} flat;

/* Parses `s` as {"k":int,"k":int,...} with no whitespace, escapes or other value types (the writer emits
 * none for the stats); fails the test on anything else. */
static void parse_flat_(const char *s, flat *out, const char *file, int line) {
  out->n = 0;
  if (!s) {
    print_error("%s:%d: JSON is NULL\n", file, line);
    _fail(file, line);
  }
  const char *p = s;
#define BAD(why)                                                                                                 \
  do {                                                                                                           \
    print_error("%s:%d: bad stats JSON at offset %td (%s): %.60s\n", file, line, p - s, why, p);                \
    _fail(file, line);                                                                                           \
  } while (0)
  if (*p++ != '{')
    BAD("expected '{'");
  if (*p == '}')
    BAD("empty object");
  for (;;) {
    if (out->n == MAX_KEYS)
      BAD("too many keys");
    if (*p++ != '"')
      BAD("expected '\"'");
    const char *k = p;
    while (*p && *p != '"') {
      if (*p == '\\' || (unsigned char)*p < 0x20)
        BAD("escape or control character in key");
      p++;
    }
    if (*p != '"')
      BAD("unterminated key");
    size_t klen = (size_t)(p - k);
    if (klen == 0 || klen >= KEY_LEN)
      BAD("key length");
    memcpy(out->key[out->n], k, klen);
    out->key[out->n][klen] = '\0';
    p++;
    if (*p++ != ':')
      BAD("expected ':'");
    if (!(*p == '-' || isdigit((unsigned char)*p)))
      BAD("value is not an integer");
    if (*p == '-' ? (p[1] == '0' || !isdigit((unsigned char)p[1])) : (p[0] == '0' && isdigit((unsigned char)p[1])))
      BAD("malformed integer");
    errno = 0;
    char *end = NULL;
    long long v = strtoll(p, &end, 10);
    if (errno || end == p)
      BAD("integer out of range");
    p = end;
    out->value[out->n++] = v;
    if (*p == ',') {
      p++;
      continue;
    }
    if (*p++ != '}')
      BAD("expected ',' or '}'");
    break;
  }
  if (*p != '\0')
    BAD("text after the object");
#undef BAD
}
#define PARSE_FLAT(s, out) parse_flat_((s), (out), __FILE__, __LINE__)

static const flat *find_(const flat *f, const char *key, int64_t *v) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->key[i], key) == 0) {
      *v = f->value[i];
      return f;
    }
  return NULL;
}

static int64_t get_(const flat *f, const char *key, const char *file, int line) {
  int64_t v = 0;
  if (!find_(f, key, &v)) {
    print_error("%s:%d: key '%s' is missing\n", file, line, key);
    _fail(file, line);
  }
  return v;
}
#define GET(f, key) get_((f), (key), __FILE__, __LINE__)

/* ---- the 122 names, as torch_compare.py builds them -------------------------------------------- */

static const char *const ARRAYS[] = {"allocation",   "segment",      "active",          "inactive_split",
                                     "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                                     "requested_bytes"};
static const char *const KINDS[] = {"all", "small_pool", "large_pool"};
static const char *const FIELDS[] = {"current", "peak", "allocated", "freed"};
static const char *const SINGLES[] = {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                                      "num_device_free",   "max_split_size"};

static int cmp_str(const void *x, const void *y) { return strcmp(*(const char *const *)x, *(const char *const *)y); }

/* The expected names in strcmp order; returns their count. names[i] are malloc'ed. */
static int torch_keys(char *names[MAX_KEYS]) {
  int n = 0;
  char b[KEY_LEN];
  for (size_t a = 0; a < sizeof ARRAYS / sizeof *ARRAYS; a++)
    for (size_t k = 0; k < 3; k++)
      for (size_t f = 0; f < 4; f++) {
        snprintf(b, sizeof b, "%s.%s.%s", ARRAYS[a], KINDS[k], FIELDS[f]);
        names[n++] = strdup(b);
      }
  for (int o = 0; o < 2; o++)
    for (size_t f = 0; f < 4; f++) {
      snprintf(b, sizeof b, "%s.%s", o ? "oversize_segments" : "oversize_allocations", FIELDS[f]);
      names[n++] = strdup(b);
    }
  for (size_t c = 0; c < sizeof SINGLES / sizeof *SINGLES; c++)
    names[n++] = strdup(SINGLES[c]);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  return n;
}

/* ---- comparing the JSON with the struct -------------------------------------------------------- */

typedef struct {
  const flat *f;
  int checked;
} cmp_ctx;

static void cmp_stat(cachalot_stat *s, const char *name, void *vctx) {
  cmp_ctx *c = vctx;
  const int64_t want[4] = {s->current, s->peak, s->allocated, s->freed};
  char key[KEY_LEN];
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "%s.%s", name, FIELDS[i]);
    int64_t v = 0;
    if (!find_(c->f, key, &v))
      fail_msg("key '%s' is missing", key);
    if (v != want[i])
      fail_msg("'%s' is %lld in the JSON, %lld in cachalot_memory_stats", key, (long long)v, (long long)want[i]);
    c->checked++;
  }
}

/* The JSON of `device` has exactly the 122 names in strictly increasing strcmp order, and every value is
 * the struct's. Returns the parsed form in *out. */
static void check_json_(cachalot_allocator *a, int device, flat *out, const char *file, int line) {
  char *json = (char *)(uintptr_t)0x1;
  status_is_(cachalot_memory_stats_json(a, device, &json), CACHALOT_OK, "cachalot_memory_stats_json", file, line);
  cachalot_device_stats st = stats_(a, device, file, line);
  parse_flat_(json, out, file, line);
  free(json);

  eq_i64_(out->n, 122, "number of keys", file, line);
  for (int i = 1; i < out->n; i++)
    if (strcmp(out->key[i - 1], out->key[i]) >= 0) {
      print_error("%s:%d: keys out of order or repeated: '%s' then '%s'\n", file, line, out->key[i - 1],
                  out->key[i]);
      _fail(file, line);
    }
  char *names[MAX_KEYS];
  int n = torch_keys(names);
  eq_i64_(n, 122, "torch key count", file, line);
  for (int i = 0; i < n; i++) {
    if (strcmp(out->key[i], names[i]) != 0) {
      print_error("%s:%d: key %d is '%s', PyTorch's is '%s'\n", file, line, i, out->key[i], names[i]);
      _fail(file, line);
    }
    free(names[i]);
  }

  cmp_ctx c = {out, 0};
  for_each_stat(&st, cmp_stat, &c);
  eq_i64_(c.checked, (9 * 3 + 2) * 4, "stat fields compared", file, line);
  eq_i64_(get_(out, "num_alloc_retries", file, line), st.num_alloc_retries, "num_alloc_retries", file, line);
  eq_i64_(get_(out, "num_ooms", file, line), st.num_ooms, "num_ooms", file, line);
  eq_i64_(get_(out, "num_sync_all_streams", file, line), st.num_sync_all_streams, "num_sync_all_streams", file,
          line);
  eq_i64_(get_(out, "num_device_alloc", file, line), st.num_device_alloc, "num_device_alloc", file, line);
  eq_i64_(get_(out, "num_device_free", file, line), st.num_device_free, "num_device_free", file, line);
  eq_i64_(get_(out, "max_split_size", file, line), st.max_split_size, "max_split_size", file, line);
}
#define CHECK_JSON(a, device, out) check_json_((a), (device), (out), __FILE__, __LINE__)

/* ---- stats JSON tests -------------------------------------------------------------------------- */

static void test_fresh_allocator(void **state) {
  (void)state;
  env e = ENV(1, 0, NULL);
  flat f;
  CHECK_JSON(e.a, 0, &f);
  STR_EQ(f.key[0], "active.all.allocated");
  STR_EQ(f.key[f.n - 1], "segment.small_pool.peak");
  for (int i = 0; i < f.n; i++)
    if (strcmp(f.key[i], "max_split_size") != 0 && f.value[i] != 0)
      fail_msg("'%s' is %lld on a fresh allocator", f.key[i], (long long)f.value[i]);
  EQ(GET(&f, "max_split_size"), -1);
  env_free(&e);
}

/* "active.*" sorts before "active_bytes.*" ('.' < '_'), "allocated_bytes" before "allocation". */
static void test_order_details(void **state) {
  (void)state;
  env e = ENV(1, 0, NULL);
  flat f;
  CHECK_JSON(e.a, 0, &f);
  int last_active = -1, first_active_bytes = -1, last_allocated_bytes = -1, first_allocation = -1;
  for (int i = 0; i < f.n; i++) {
    if (strncmp(f.key[i], "active.", 7) == 0)
      last_active = i;
    if (first_active_bytes < 0 && strncmp(f.key[i], "active_bytes.", 13) == 0)
      first_active_bytes = i;
    if (strncmp(f.key[i], "allocated_bytes.", 16) == 0)
      last_allocated_bytes = i;
    if (first_allocation < 0 && strncmp(f.key[i], "allocation.", 11) == 0)
      first_allocation = i;
  }
  EQ(last_active, 11);
  EQ(first_active_bytes, 12);
  assert_true(last_allocated_bytes >= 0 && last_allocated_bytes < first_allocation);
  STR_EQ(f.key[0], "active.all.allocated");
  STR_EQ(f.key[1], "active.all.current");
  STR_EQ(f.key[2], "active.all.freed");
  STR_EQ(f.key[3], "active.all.peak");
  STR_EQ(f.key[4], "active.large_pool.allocated");
  env_free(&e);
}

static void test_values_follow_operations(void **state) {
  (void)state;
  env e = ENV(1, GiB, NULL);
  cachalot_stream s = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  flat f;

  void *sm1 = ALLOC(e.a, 0, 1000, s);
  void *sm2 = ALLOC(e.a, 0, 300 * KiB, s);
  void *lg1 = ALLOC(e.a, 0, 3 * MiB, s);
  void *lg2 = ALLOC(e.a, 0, 5 * MiB, s);
  void *lg3 = ALLOC(e.a, 0, 30 * MiB, s2);
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "allocation.all.current"), 5);
  EQ(GET(&f, "allocation.small_pool.current"), 2);
  EQ(GET(&f, "allocation.large_pool.current"), 3);
  EQ(GET(&f, "requested_bytes.all.current"), 1000 + 300 * KiB + 38 * MiB);
  EQ(GET(&f, "segment.small_pool.current"), 1);
  EQ(GET(&f, "reserved_bytes.small_pool.current"), 2 * MiB);

  FREE(e.a, lg1); /* leaves a free block inside a split 20 MiB segment */
  RECORD(e.a, sm2, s2);
  FREE(e.a, sm2); /* pending on s2: still active */
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "allocation.all.current"), 3);
  EQ(GET(&f, "allocation.all.peak"), 5);
  EQ(GET(&f, "allocation.all.freed"), 2);
  EQ(GET(&f, "active.all.current"), 4);
  assert_true(GET(&f, "inactive_split.large_pool.current") >= 1);
  assert_true(GET(&f, "inactive_split_bytes.large_pool.current") >= (int64_t)(3 * MiB));

  COMPLETE(&e, s2);
  FREE(e.a, sm1);
  FREE(e.a, lg2);
  FREE(e.a, lg3);
  OK(cachalot_reset_peak_stats(e.a, 0));
  void *x = ALLOC(e.a, 0, 7 * MiB, s);
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "allocation.all.current"), 1);
  EQ(GET(&f, "allocation.all.peak"), 1);
  EQ(GET(&f, "allocation.all.allocated"), 6);
  EQ(GET(&f, "allocated_bytes.large_pool.current"), 7 * MiB);

  /* On the device of 1 GiB: a 600 MiB block is cached, a 700 MiB request does not fit beside it, so the
   * cache is released and the retry succeeds (a retry, no OOM); then 2 GiB fails twice (each a retry, a
   * sync of all streams and an OOM). The five counters end up pairwise different, so a counter written under
   * another's name shows. */
  FREE(e.a, x);
  void *y = ALLOC(e.a, 0, 600 * MiB, s);
  FREE(e.a, y);
  y = ALLOC(e.a, 0, 700 * MiB, s);
  for (int i = 0; i < 3; i++)
    EMPTY(e.a); /* nothing is cached: only num_sync_all_streams moves */
  void *big = NULL;
  STATUS(cachalot_malloc(e.a, 0, 2 * GiB, s, &big), CACHALOT_ERROR_OUT_OF_MEMORY);
  STATUS(cachalot_malloc(e.a, 0, 2 * GiB, s, &big), CACHALOT_ERROR_OUT_OF_MEMORY);
  CHECK_JSON(e.a, 0, &f);
  const char *counters[] = {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                            "num_device_free"};
  for (int i = 0; i < 5; i++)
    for (int k = i + 1; k < 5; k++)
      if (GET(&f, counters[i]) == GET(&f, counters[k]))
        fail_msg("%s and %s are both %lld", counters[i], counters[k], (long long)GET(&f, counters[i]));
  EQ(GET(&f, "num_ooms"), 2);
  EQ(GET(&f, "num_alloc_retries"), 3);
  EQ(GET(&f, "num_sync_all_streams"), 6);
  EQ(GET(&f, "num_device_alloc"), 5); /* 2 MiB small, 20 MiB, 30 MiB, 600 MiB, 700 MiB */
  EQ(GET(&f, "num_device_free"), 4);  /* all but the 700 MiB one, released by the retry */
  FREE(e.a, y);
  EMPTY(e.a);
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "num_device_free"), GET(&f, "num_device_alloc"));
  EQ(GET(&f, "reserved_bytes.all.current"), 0);
  EQ(GET(&f, "reserved_bytes.all.peak"), 700 * MiB); /* the retry released the other 52 MiB first */
  EQ(GET(&f, "reserved_bytes.all.freed"), GET(&f, "reserved_bytes.all.allocated"));

  OK(cachalot_reset_accumulated_stats(e.a, 0));
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "num_ooms"), 0);
  EQ(GET(&f, "num_device_alloc"), 0);
  EQ(GET(&f, "allocation.all.allocated"), 0);
  env_free(&e);
}

static void test_max_split_size_and_oversize(void **state) {
  (void)state;
  env e = ENV(1, 0, NULL);
  flat f;
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "max_split_size"), -1);
  OK(cachalot_set_settings(e.a, "max_split_size_mb:40"));
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "max_split_size"), 41943040);

  cachalot_stream s = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 50 * MiB, s);
  void *q = ALLOC(e.a, 0, 60 * MiB, s);
  FREE(e.a, q);
  CHECK_JSON(e.a, 0, &f);
  EQ(GET(&f, "oversize_allocations.current"), 1);
  EQ(GET(&f, "oversize_allocations.peak"), 2);
  EQ(GET(&f, "oversize_allocations.allocated"), 2);
  EQ(GET(&f, "oversize_allocations.freed"), 1);
  EQ(GET(&f, "oversize_segments.current"), 2);
  FREE(e.a, p);
  env_free(&e);
}

/* Each device has its own numbers. */
static void test_per_device(void **state) {
  (void)state;
  env e = ENV(2, 0, NULL);
  cachalot_stream s1 = STREAM(e.b, 1);
  void *p = ALLOC(e.a, 1, 4 * MiB, s1);
  flat f0, f1;
  CHECK_JSON(e.a, 0, &f0);
  CHECK_JSON(e.a, 1, &f1);
  EQ(GET(&f0, "allocated_bytes.all.current"), 0);
  EQ(GET(&f1, "allocated_bytes.all.current"), 4 * MiB);
  EQ(GET(&f1, "allocated_bytes.large_pool.current"), 4 * MiB);
  FREE(e.a, p);
  env_free(&e);
}

static void test_errors(void **state) {
  (void)state;
  env e = ENV(2, 0, NULL);
  STATUS(cachalot_memory_stats_json(e.a, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "cachalot_memory_stats_json");

  char *json = (char *)(uintptr_t)0x1;
  STATUS(cachalot_memory_stats_json(e.a, 2, &json), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(json);
  CONTAINS(cachalot_last_error(), "cachalot_memory_stats_json: device 2 is out of range");

  json = (char *)(uintptr_t)0x1;
  STATUS(cachalot_memory_stats_json(e.a, -1, &json), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(json);
  CONTAINS(cachalot_last_error(), "device -1");

  json = (char *)(uintptr_t)0x1;
  STATUS(cachalot_memory_stats_json(NULL, 0, &json), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(json);
  CONTAINS(cachalot_last_error(), "allocator is NULL");

  OK(cachalot_memory_stats_json(e.a, 1, &json));
  assert_non_null(json);
  assert_true(json[0] == '{');
  free(json);
  env_free(&e);
}

/* ---- the writer -------------------------------------------------------------------------------- */

static char *finish_ok(cl_json *j) {
  char *s = cl_json_finish(j);
  assert_non_null(s);
  return s;
}

#define WRITER_EQ(j, expected)                                                                                   \
  do {                                                                                                           \
    char *got_ = finish_ok(j);                                                                                   \
    STR_EQ(got_, expected);                                                                                      \
    free(got_);                                                                                                  \
  } while (0)

static void test_writer_escaping(void **state) {
  (void)state;
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_array(&j);
  cl_json_string(&j, "plain");
  cl_json_string(&j, "q\"b\\s/");
  cl_json_string(&j, "\n\r\t\b\f");
  cl_json_string(&j, "\x01\x1f\x7f");
  cl_json_string(&j, "");
  cl_json_string(&j, NULL);
  cl_json_string(&j, "caf\xc3\xa9"); /* UTF-8 bytes pass through */
  cl_json_end_array(&j);
  WRITER_EQ(&j, "[\"plain\",\"q\\\"b\\\\s/\",\"\\n\\r\\t\\u0008\\u000c\",\"\\u0001\\u001f\x7f\",\"\",\"\","
                "\"caf\xc3\xa9\"]");

  cl_json_begin_object(&j);
  cl_json_key(&j, "k\"\\\n");
  cl_json_int(&j, 1);
  cl_json_end_object(&j);
  WRITER_EQ(&j, "{\"k\\\"\\\\\\n\":1}");
}

static void test_writer_nesting(void **state) {
  (void)state;
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_object(&j);
  cl_json_key(&j, "a");
  cl_json_begin_array(&j);
  cl_json_int(&j, 1);
  cl_json_int(&j, -2);
  cl_json_begin_object(&j);
  cl_json_key(&j, "b");
  cl_json_null(&j);
  cl_json_key(&j, "c");
  cl_json_begin_array(&j);
  cl_json_end_array(&j);
  cl_json_end_object(&j);
  cl_json_begin_array(&j);
  cl_json_begin_array(&j);
  cl_json_end_array(&j);
  cl_json_begin_object(&j);
  cl_json_end_object(&j);
  cl_json_end_array(&j);
  cl_json_end_array(&j);
  cl_json_key(&j, "d");
  cl_json_begin_object(&j);
  cl_json_end_object(&j);
  cl_json_key(&j, "e");
  cl_json_bool(&j, true);
  cl_json_key(&j, "f");
  cl_json_bool(&j, false);
  cl_json_key(&j, "g");
  cl_json_string(&j, "x");
  cl_json_end_object(&j);
  WRITER_EQ(&j, "{\"a\":[1,-2,{\"b\":null,\"c\":[]},[[],{}]],\"d\":{},\"e\":true,\"f\":false,\"g\":\"x\"}");
}

static void test_writer_empty_containers(void **state) {
  (void)state;
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_object(&j);
  cl_json_end_object(&j);
  WRITER_EQ(&j, "{}");
  /* finish resets the writer: it is reusable, with fresh comma state */
  cl_json_begin_array(&j);
  cl_json_end_array(&j);
  WRITER_EQ(&j, "[]");
  cl_json_int(&j, 5);
  WRITER_EQ(&j, "5");
}

static void test_writer_integers(void **state) {
  (void)state;
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_array(&j);
  cl_json_int(&j, 0);
  cl_json_int(&j, INT64_MAX);
  cl_json_int(&j, INT64_MIN);
  cl_json_uint(&j, UINT64_MAX);
  cl_json_uint(&j, 0);
  cl_json_end_array(&j);
  WRITER_EQ(&j, "[0,9223372036854775807,-9223372036854775808,18446744073709551615,0]");
}

static void test_writer_doubles(void **state) {
  (void)state;
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_array(&j);
  cl_json_double(&j, 0.5);
  cl_json_double(&j, -2.25);
  cl_json_double(&j, 0.0);
  cl_json_double(&j, 1e300);
  cl_json_double(&j, NAN);
  cl_json_double(&j, INFINITY);
  cl_json_double(&j, -INFINITY);
  cl_json_double(&j, 3.0);
  cl_json_end_array(&j);
  WRITER_EQ(&j, "[0.5,-2.25,0,1.0000000000000001e+300,null,null,null,3]");

  /* values that are not exact in binary round-trip */
  const double vals[] = {0.1, 1.0 / 3.0, 123456.789e-12, -5e-324, 1.7976931348623157e308};
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
    cl_json_double(&j, vals[i]);
    char *s = finish_ok(&j);
    char *end = NULL;
    double back = strtod(s, &end);
    if (*end != '\0' || back != vals[i])
      fail_msg("%.17g written as '%s'", vals[i], s);
    free(s);
  }
}

/* Deeper than CL_JSON_MAX_DEPTH is refused (finish gives NULL) rather than mis-nested; just under it works.
 * */
static void test_writer_depth(void **state) {
  (void)state;
  cl_json j;
  cl_json_init(&j);
  const int ok_depth = CL_JSON_MAX_DEPTH - 1;
  for (int i = 0; i < ok_depth; i++)
    cl_json_begin_array(&j);
  for (int i = 0; i < ok_depth; i++)
    cl_json_end_array(&j);
  char *s = finish_ok(&j);
  EQ(strlen(s), 2 * ok_depth);
  assert_true(s[ok_depth - 1] == '[' && s[ok_depth] == ']');
  free(s);

  for (int i = 0; i < CL_JSON_MAX_DEPTH; i++)
    cl_json_begin_array(&j);
  for (int i = 0; i < CL_JSON_MAX_DEPTH; i++)
    cl_json_end_array(&j);
  assert_null(cl_json_finish(&j));

  /* the writer is usable again after the refused document */
  cl_json_begin_array(&j);
  cl_json_end_array(&j);
  WRITER_EQ(&j, "[]");

  cl_json_begin_object(&j);
  cl_json_key(&j, "x");
  cl_json_discard(&j);
  cl_json_int(&j, 7);
  WRITER_EQ(&j, "7");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fresh_allocator),
      cmocka_unit_test(test_order_details),
      cmocka_unit_test(test_values_follow_operations),
      cmocka_unit_test(test_max_split_size_and_oversize),
      cmocka_unit_test(test_per_device),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_writer_escaping),
      cmocka_unit_test(test_writer_nesting),
      cmocka_unit_test(test_writer_empty_containers),
      cmocka_unit_test(test_writer_integers),
      cmocka_unit_test(test_writer_doubles),
      cmocka_unit_test(test_writer_depth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
