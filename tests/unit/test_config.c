/* CACHALOT_ALLOC_CONF parsing (PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar): exact values per key, PyTorch's
 * roundup list fill rules, layering on a base config, and a table of malformed strings whose messages must
 * name the culprit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "allocator/core/config.h"

#include <cachalot/cachalot.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1024 * 1024)
#define PREFIX "CACHALOT_ALLOC_CONF: "

static cl_config parse_ok(const char *s, const cl_config *base) {
  cl_config out;
  memset(&out, 0xA5, sizeof out);
  cachalot_status st = cl_config_parse(s, base, &out);
  if (st != CACHALOT_OK)
    fail_msg("'%s' failed: %s", s ? s : "(null)", cachalot_last_error());
  return out;
}

static cl_config parse_defaults(const char *s) {
  cl_config base;
  cl_config_defaults(&base);
  return parse_ok(s, &base);
}

static void test_defaults(void **state) {
  (void)state;
  cl_config c;
  memset(&c, 0xA5, sizeof c);
  cl_config_defaults(&c);
  assert_true(c.max_split_size == SIZE_MAX);
  assert_true(c.max_non_split_rounding == 20 * MIB);
  assert_true(c.gc_threshold == 0.0);
  assert_false(c.expandable_segments);
  assert_true(c.release_lock_on_cudamalloc);
  assert_true(c.memory_fraction == -1.0);
  assert_true(c.expandable_page == 20 * MIB);
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
    assert_int_equal(c.roundup_divisions[i], 0);
  assert_int_equal(c.keys_set, 0);
}

static void test_max_split_size(void **state) {
  (void)state;
  cl_config c = parse_defaults("max_split_size_mb:20");
  assert_true(c.max_split_size == 20 * MIB);
  assert_int_equal(c.keys_set, CL_KEY_MAX_SPLIT);

  c = parse_defaults("max_split_size_mb:1024");
  assert_true(c.max_split_size == 1024 * MIB);

  /* Leading zeros are still decimal, not octal. */
  c = parse_defaults("max_split_size_mb:0100");
  assert_true(c.max_split_size == 100 * MIB);

  /* The largest limit is the largest byte count the stats (int64, as PyTorch's) can show; past it, no
   * limit, which they show as -1 (a limit of 2^64 - 1 MiB read -1,048,576 bytes). */
  char buf[64];
  snprintf(buf, sizeof buf, "max_split_size_mb:%zu", (size_t)INT64_MAX / MIB);
  c = parse_defaults(buf);
  assert_true(c.max_split_size == ((size_t)INT64_MAX / MIB) * MIB);
  c = parse_defaults("max_split_size_mb:17592186044415"); /* SIZE_MAX / MIB */
  assert_true(c.max_split_size == SIZE_MAX);

  snprintf(buf, sizeof buf, "max_split_size_mb:%zu", (size_t)INT64_MAX / MIB + 1);
  cl_config base;
  cl_config_defaults(&base);
  base.max_split_size = 64 * MIB;
  c = parse_ok(buf, &base);
  assert_true(c.max_split_size == SIZE_MAX);

  c = parse_ok("max_split_size_mb:18446744073709551615", &base); /* UINT64_MAX MiB */
  assert_true(c.max_split_size == SIZE_MAX);
}

static void test_max_non_split_rounding(void **state) {
  (void)state;
  cl_config c = parse_defaults("max_non_split_rounding_mb:64");
  assert_true(c.max_non_split_rounding == 64 * MIB);
  assert_int_equal(c.keys_set, CL_KEY_MAX_NON_SPLIT_ROUNDING);
  assert_true(c.max_split_size == SIZE_MAX);

  c = parse_defaults("max_non_split_rounding_mb:20");
  assert_true(c.max_non_split_rounding == 20 * MIB);
}

static void test_gc_threshold(void **state) {
  (void)state;
  cl_config c = parse_defaults("garbage_collection_threshold:0.5");
  assert_true(c.gc_threshold == 0.5);
  assert_int_equal(c.keys_set, CL_KEY_GC_THRESHOLD);
  c = parse_defaults("garbage_collection_threshold:0.8");
  assert_true(c.gc_threshold == 0.8);
  c = parse_defaults("garbage_collection_threshold:.25");
  assert_true(c.gc_threshold == 0.25);
  c = parse_defaults("garbage_collection_threshold:5e-1");
  assert_true(c.gc_threshold == 0.5);
  c = parse_defaults("garbage_collection_threshold:0.999999");
  assert_true(c.gc_threshold == 0.999999);
}

static void test_bools(void **state) {
  (void)state;
  cl_config c = parse_defaults("expandable_segments:True");
  assert_true(c.expandable_segments);
  assert_true(c.release_lock_on_cudamalloc);
  assert_int_equal(c.keys_set, CL_KEY_EXPANDABLE);

  cl_config base = c;
  c = parse_ok("expandable_segments:False", &base);
  assert_false(c.expandable_segments);

  c = parse_defaults("release_lock_on_cudamalloc:False");
  assert_false(c.release_lock_on_cudamalloc);
  assert_false(c.expandable_segments);
  assert_int_equal(c.keys_set, CL_KEY_RELEASE_LOCK);
  base = c;
  c = parse_ok("release_lock_on_cudamalloc:True", &base);
  assert_true(c.release_lock_on_cudamalloc);
}

/* preset:low_fragmentation names the keys it sets, in place: a key after it overrides, one before it is
 * overridden. */
static void test_preset(void **state) {
  (void)state;
  cl_config c = parse_defaults("preset:low_fragmentation");
  assert_true(c.expandable_segments);
  assert_true(c.expandable_compact);
  assert_true(c.expandable_plan);
  assert_true(c.release_lock_on_cudamalloc);
  assert_true(c.max_split_size == SIZE_MAX);
  assert_true(c.expandable_page == 2 * MIB);
  assert_int_equal(c.keys_set, CL_KEY_PRESET | CL_KEY_EXPANDABLE | CL_KEY_EXPANDABLE_COMPACT |
                                   CL_KEY_EXPANDABLE_PLAN | CL_KEY_EXPANDABLE_PAGE);
  c = parse_defaults("preset:low_fragmentation,expandable_compact:False");
  assert_true(c.expandable_segments);
  assert_false(c.expandable_compact);
  assert_true(c.expandable_plan);
  assert_true(c.expandable_page == 2 * MIB);
  c = parse_defaults("preset:low_fragmentation,expandable_plan:False");
  assert_true(c.expandable_compact);
  assert_false(c.expandable_plan);
  c = parse_defaults("expandable_plan:True");
  assert_true(c.expandable_plan);
  assert_false(c.expandable_segments);
  assert_int_equal(c.keys_set, CL_KEY_EXPANDABLE_PLAN);
  c = parse_defaults("preset:low_fragmentation,expandable_page_mb:20");
  assert_true(c.expandable_compact);
  assert_true(c.expandable_page == 20 * MIB);
  c = parse_defaults("expandable_page_mb:8,preset:low_fragmentation");
  assert_true(c.expandable_page == 2 * MIB);
  c = parse_defaults("expandable_segments:False, preset : low_fragmentation");
  assert_true(c.expandable_segments);
  assert_true(c.expandable_compact);
  /* on top of a base: the keys it names change, the others keep the base's values */
  cl_config base = parse_defaults("max_split_size_mb:40");
  c = parse_ok("preset:low_fragmentation", &base);
  assert_true(c.max_split_size == 40 * MIB);
  assert_true(c.expandable_compact);
}

/* expandable_page_mb: the large kind's page in MiB, even, 2 to 1024, only that key set. */
/* The host cache's keys: pinned_use_cuda_host_register a bool, pinned_num_register_threads a power of two
 * from 1 to 128 (PyTorch's limits); defaults off and 1; set_settings keeps what a string does not name. */
static void test_pinned_keys(void **state) {
  (void)state;
  cl_config c = parse_defaults("");
  assert_false(c.pinned_use_host_register);
  assert_int_equal(c.pinned_num_register_threads, 1);
  c = parse_defaults("pinned_use_cuda_host_register:True,pinned_num_register_threads:128");
  assert_true(c.pinned_use_host_register);
  assert_int_equal(c.pinned_num_register_threads, 128);
  assert_int_equal(c.keys_set, CL_KEY_PINNED_REGISTER | CL_KEY_PINNED_THREADS);
  cl_config base = c;
  c = parse_ok("pinned_num_register_threads:1", &base);
  assert_true(c.pinned_use_host_register);
  assert_int_equal(c.pinned_num_register_threads, 1);
  c = parse_ok("pinned_use_cuda_host_register:False", &base);
  assert_false(c.pinned_use_host_register);
  assert_int_equal(c.pinned_num_register_threads, 128);
  for (unsigned n = 1; n <= 128; n *= 2) {
    char s[64];
    snprintf(s, sizeof s, "pinned_num_register_threads:%u", n);
    assert_int_equal(parse_defaults(s).pinned_num_register_threads, n);
  }
}

static void test_expandable_page(void **state) {
  (void)state;
  cl_config c = parse_defaults("expandable_page_mb:2");
  assert_true(c.expandable_page == 2 * MIB);
  assert_int_equal(c.keys_set, CL_KEY_EXPANDABLE_PAGE);
  assert_false(c.expandable_segments);
  c = parse_defaults("expandable_page_mb:1024");
  assert_true(c.expandable_page == 1024 * MIB);
  c = parse_defaults("expandable_page_mb:008");
  assert_true(c.expandable_page == 8 * MIB);
  cl_config base = c;
  c = parse_ok("max_split_size_mb:40", &base);
  assert_true(c.expandable_page == 8 * MIB);
}

static void test_memory_fraction(void **state) {
  (void)state;
  cl_config c = parse_defaults("per_process_memory_fraction:0.25");
  assert_true(c.memory_fraction == 0.25);
  assert_int_equal(c.keys_set, CL_KEY_FRACTION);
  c = parse_defaults("per_process_memory_fraction:1");
  assert_true(c.memory_fraction == 1.0);
  c = parse_defaults("per_process_memory_fraction:0");
  assert_true(c.memory_fraction == 0.0);
  /* -0 is in [0, 1] but must not look "unset" (< 0) or negative to a sign test. */
  c = parse_defaults("per_process_memory_fraction:-0");
  assert_true(c.memory_fraction == 0.0);
  assert_false(c.memory_fraction < 0);
  assert_int_equal(memcmp(&c.memory_fraction, &(double){0.0}, sizeof(double)), 0);
}

static void assert_divisions(const cl_config *c, const unsigned want[CL_ROUNDUP_INTERVALS]) {
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
    if (c->roundup_divisions[i] != want[i])
      fail_msg("interval %d: got %u, want %u", i, c->roundup_divisions[i], want[i]);
}

static void test_roundup_list_spec_example(void **state) {
  (void)state;
  cl_config c = parse_defaults("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]");
  const unsigned want[CL_ROUNDUP_INTERVALS] = {8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 1, 1, 1, 1, 1, 1};
  assert_divisions(&c, want);
  assert_int_equal(c.keys_set, CL_KEY_ROUNDUP);
}

static void test_roundup_list_rules(void **state) {
  (void)state;
  /* `>` first: every interval above interval 0 (torch 2.11's snapshot on an H100: [0, 8, 8, ...] for
   * [>:8]). */
  cl_config c = parse_defaults("roundup_power2_divisions:[>:4]");
  const unsigned all4[CL_ROUNDUP_INTERVALS] = {0, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  assert_divisions(&c, all4);

  /* `>` starts above the previous entry's interval (torch 2.11: [256:4,>:8] keeps 4 at 256 MiB). */
  c = parse_defaults("roundup_power2_divisions:[4:8,>:2]");
  const unsigned w1[CL_ROUNDUP_INTERVALS] = {8, 8, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  assert_divisions(&c, w1);
  c = parse_defaults("roundup_power2_divisions:[256:4,>:8]");
  const unsigned w1b[CL_ROUNDUP_INTERVALS] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8};
  assert_divisions(&c, w1b);
  c = parse_defaults("roundup_power2_divisions:[>:8,256:4]"); /* the first explicit entry fills below itself */
  assert_divisions(&c, w1b);
  c = parse_defaults("roundup_power2_divisions:[256:4,128:2,>:8]");
  const unsigned w1c[CL_ROUNDUP_INTERVALS] = {4, 4, 4, 4, 4, 4, 4, 2, 8, 8, 8, 8, 8, 8, 8, 8};
  assert_divisions(&c, w1c);
  c = parse_defaults("roundup_power2_divisions:[32768:4,>:2]"); /* nothing above the last interval */
  const unsigned w1d[CL_ROUNDUP_INTERVALS] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  assert_divisions(&c, w1d);

  /* Only the FIRST explicit interval fills below itself; a later one touches only its own index,
   * and intervals nobody reaches keep the base's values. */
  cl_config base;
  cl_config_defaults(&base);
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
    base.roundup_divisions[i] = 16;
  c = parse_ok("roundup_power2_divisions:[8:4,64:2]", &base);
  const unsigned w2[CL_ROUNDUP_INTERVALS] = {4, 4, 4, 4, 16, 16, 2, 16, 16, 16, 16, 16, 16, 16, 16, 16};
  assert_divisions(&c, w2);

  /* 1 MiB is interval 0; anything from 32 GiB up is interval 15; 0 disables. */
  c = parse_ok("roundup_power2_divisions:[1:2, 32768:0, 1048576:8]", &base);
  const unsigned w3[CL_ROUNDUP_INTERVALS] = {2, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 8};
  assert_divisions(&c, w3);

  /* A trailing comma inside the list and an empty list are accepted, as in PyTorch. */
  c = parse_ok("roundup_power2_divisions:[2:4,]", &base);
  const unsigned w4[CL_ROUNDUP_INTERVALS] = {4, 4, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16};
  assert_divisions(&c, w4);
  c = parse_ok("roundup_power2_divisions:[]", &base);
  assert_divisions(&c, base.roundup_divisions);
  assert_int_equal(c.keys_set, CL_KEY_ROUNDUP);

  /* `>` after a later entry starts above that entry. */
  c = parse_defaults("roundup_power2_divisions:[2:8,16:4,>:0]");
  const unsigned w5[CL_ROUNDUP_INTERVALS] = {8, 8, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  assert_divisions(&c, w5);
}

static void test_roundup_single(void **state) {
  (void)state;
  cl_config base;
  cl_config_defaults(&base);
  base.roundup_divisions[3] = 2;
  cl_config c = parse_ok("roundup_power2_divisions:4", &base);
  const unsigned all4[CL_ROUNDUP_INTERVALS] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
  assert_divisions(&c, all4);
  assert_int_equal(c.keys_set, CL_KEY_ROUNDUP);

  c = parse_defaults("roundup_power2_divisions:1");
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
    assert_int_equal(c.roundup_divisions[i], 1);

  char buf[64];
  snprintf(buf, sizeof buf, "roundup_power2_divisions:%u", UINT_MAX / 2u + 1u);
  c = parse_defaults(buf);
  assert_int_equal(c.roundup_divisions[0], UINT_MAX / 2u + 1u);
  assert_int_equal(c.roundup_divisions[15], UINT_MAX / 2u + 1u);

  /* The next power of 2 no longer fits the unsigned field: refused, not truncated to 0. */
  unsigned long long too_big = 2ull * (UINT_MAX / 2u + 1u);
  snprintf(buf, sizeof buf, "roundup_power2_divisions:%llu", too_big);
  assert_int_equal(cl_config_parse(buf, NULL, &c), CACHALOT_ERROR_CONFIG);
  assert_non_null(strstr(cachalot_last_error(), "roundup_power2_divisions must be a power of 2 (at most"));
  snprintf(buf, sizeof buf, "roundup_power2_divisions:[64:%llu]", too_big);
  assert_int_equal(cl_config_parse(buf, NULL, &c), CACHALOT_ERROR_CONFIG);
  assert_non_null(strstr(cachalot_last_error(), "divisions for interval '64'"));
}

static void test_whitespace_and_all_keys(void **state) {
  (void)state;
  cl_config c = parse_defaults("  max_split_size_mb : 100 ,\tmax_non_split_rounding_mb:\n32,"
                               "garbage_collection_threshold :0.6 , roundup_power2_divisions : [ 64 : 8 , > : 2 ] ,"
                               "expandable_segments:True,release_lock_on_cudamalloc:False,"
                               "per_process_memory_fraction : 0.75 \r\n");
  assert_true(c.max_split_size == 100 * MIB);
  assert_true(c.max_non_split_rounding == 32 * MIB);
  assert_true(c.gc_threshold == 0.6);
  assert_true(c.expandable_segments);
  assert_false(c.release_lock_on_cudamalloc);
  assert_true(c.memory_fraction == 0.75);
  const unsigned want[CL_ROUNDUP_INTERVALS] = {8, 8, 8, 8, 8, 8, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  assert_divisions(&c, want);
  assert_int_equal(c.keys_set, CL_KEY_MAX_SPLIT | CL_KEY_MAX_NON_SPLIT_ROUNDING | CL_KEY_GC_THRESHOLD |
                                   CL_KEY_ROUNDUP | CL_KEY_EXPANDABLE | CL_KEY_RELEASE_LOCK | CL_KEY_FRACTION);
}

static void test_trailing_comma(void **state) {
  (void)state;
  cl_config c = parse_defaults("max_split_size_mb:40,");
  assert_true(c.max_split_size == 40 * MIB);
  c = parse_defaults("expandable_segments:True , ");
  assert_true(c.expandable_segments);
  c = parse_defaults("roundup_power2_divisions:[>:2],");
  assert_int_equal(c.roundup_divisions[7], 2);
}

static void test_base_kept_and_keys_set(void **state) {
  (void)state;
  cl_config base;
  cl_config_defaults(&base);
  base.max_split_size = 300 * MIB;
  base.max_non_split_rounding = 40 * MIB;
  base.gc_threshold = 0.3;
  base.expandable_segments = true;
  base.release_lock_on_cudamalloc = false;
  base.memory_fraction = 0.5;
  base.roundup_divisions[5] = 4;
  base.plain_rounding = false; /* as a parse of the above would have set it */
  base.keys_set = CL_KEY_MAX_SPLIT | CL_KEY_FRACTION;

  cl_config c = parse_ok("garbage_collection_threshold:0.9", &base);
  assert_true(c.gc_threshold == 0.9);
  assert_true(c.max_split_size == 300 * MIB);
  assert_true(c.max_non_split_rounding == 40 * MIB);
  assert_true(c.expandable_segments);
  assert_false(c.release_lock_on_cudamalloc);
  assert_true(c.memory_fraction == 0.5);
  assert_int_equal(c.roundup_divisions[5], 4);
  assert_int_equal(c.roundup_divisions[4], 0);
  assert_false(c.plain_rounding);
  assert_true(parse_ok("roundup_power2_divisions:1", &base).plain_rounding); /* one number sets every entry */
  assert_false(parse_ok("roundup_power2_divisions:2", &base).plain_rounding);
  assert_int_equal(c.keys_set, CL_KEY_GC_THRESHOLD); /* this string's keys only, not base's */

  const char *empties[] = {NULL, "", "   ", "\t\n"};
  for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
    c = parse_ok(empties[i], &base);
    cl_config want = base;
    want.keys_set = 0;
    assert_int_equal(memcmp(&c, &want, sizeof c), 0);
  }

  /* NULL base means the defaults. */
  cl_config d;
  cl_config_defaults(&d);
  c = parse_ok("expandable_segments:True", NULL);
  assert_true(c.expandable_segments);
  assert_true(c.max_split_size == d.max_split_size);
  assert_true(c.memory_fraction == -1.0);
}

static void test_last_wins_and_aliasing(void **state) {
  (void)state;
  cl_config c = parse_defaults("max_split_size_mb:30,max_split_size_mb:50,expandable_segments:True,"
                               "expandable_segments:False");
  assert_true(c.max_split_size == 50 * MIB);
  assert_false(c.expandable_segments);
  assert_int_equal(c.keys_set, CL_KEY_MAX_SPLIT | CL_KEY_EXPANDABLE);

  /* out may be base; a failed parse must not leave it half-applied. */
  cl_config_defaults(&c);
  assert_int_equal(cl_config_parse("max_split_size_mb:64", &c, &c), CACHALOT_OK);
  assert_true(c.max_split_size == 64 * MIB);
  cl_config before = c;
  assert_int_equal(cl_config_parse("max_split_size_mb:128,expandable_segments:maybe", &c, &c),
                   CACHALOT_ERROR_CONFIG);
  assert_int_equal(memcmp(&c, &before, sizeof c), 0);
}

static void test_null_out(void **state) {
  (void)state;
  cl_config base;
  cl_config_defaults(&base);
  assert_int_equal(cl_config_parse("max_split_size_mb:64", &base, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
}

typedef struct {
  const char *s;
  const char *needle;  /* must appear in the message */
  const char *needle2; /* and this too, when not NULL */
} bad_case;

static const bad_case bad[] = {
    {"preset:fast", "preset must be low_fragmentation, got 'fast'", NULL},
    {"preset:", "missing value for preset", NULL},
    {"preset:low_fragmentation:True", "expected ',' or the end after the value of preset", NULL},
    {"expandable_page_mb:1", "expandable_page_mb must be an even integer from 2 to 1024 (MiB), got '1'", NULL},
    {"expandable_page_mb:0", "expandable_page_mb must be an even integer from 2 to 1024", "got '0'"},
    {"expandable_page_mb:7", "expandable_page_mb must be an even integer", "got '7'"},
    {"expandable_page_mb:1025", "expandable_page_mb", "got '1025'"},
    {"expandable_page_mb:2.5", "expandable_page_mb", "got '2.5'"},
    {"expandable_page_mb:-2", "expandable_page_mb", "got '-2'"},
    {"expandable_page_mb:True", "expandable_page_mb", "got 'True'"},
    {"expandable_page_mb:99999999999999999999", "expandable_page_mb", "(out of range)"},
    {"pinned_use_cuda_host_register:1", "pinned_use_cuda_host_register must be True or False, got '1'", NULL},
    {"pinned_use_cuda_host_register:", "missing value for pinned_use_cuda_host_register", NULL},
    {"pinned_num_register_threads:3", "pinned_num_register_threads must be a power of two from 1 to 128, got '3'", NULL},
    {"pinned_num_register_threads:0", "pinned_num_register_threads must be a power of two", "got '0'"},
    {"pinned_num_register_threads:256", "pinned_num_register_threads must be a power of two", "got '256'"},
    {"pinned_num_register_threads:-4", "pinned_num_register_threads", "got '-4'"},
    {"pinned_num_register_threads:99999999999999999999", "pinned_num_register_threads", "(out of range)"},
    {"pinned_max_register_threads:64", "unknown key 'pinned_max_register_threads'", NULL},
    {"foo:1", "unknown key 'foo' (expected one of max_split_size_mb, ", "per_process_memory_fraction"},
    {"backend:native", "unknown key 'backend'", NULL},
    {"Max_Split_Size_MB:30", "unknown key 'Max_Split_Size_MB'", NULL},
    {"max_split_size_mb:30,foo:1", "unknown key 'foo'", NULL},
    {"max_split _size_mb:30", "unknown key 'max_split'", NULL},
    {"max_split_size_mb", "expected ':' after 'max_split_size_mb', got end of string", NULL},
    {"max_split_size_mb 30", "expected ':' after 'max_split_size_mb', got '30'", NULL},
    {"garbage_collection_threshold,", "expected ':' after 'garbage_collection_threshold', got ','", NULL},
    {"max_split_size_mb:", "missing value for max_split_size_mb", NULL},
    {"expandable_segments :  ", "missing value for expandable_segments", NULL},
    {"max_split_size_mb:10", "max_split_size_mb must be an integer >= 20 (MiB), got '10'", NULL},
    {"max_split_size_mb:19", "max_split_size_mb must be an integer >= 20 (MiB), got '19'", NULL},
    {"max_split_size_mb:0", "max_split_size_mb", "got '0'"},
    {"max_split_size_mb:-20", "max_split_size_mb", "got '-20'"},
    {"max_split_size_mb:+20", "max_split_size_mb", "got '+20'"},
    {"max_split_size_mb:0x20", "max_split_size_mb", "got '0x20'"},
    {"max_split_size_mb:20MB", "max_split_size_mb", "got '20MB'"},
    {"max_split_size_mb:20.0", "max_split_size_mb", "got '20.0'"},
    {"max_split_size_mb:18446744073709551616", "max_split_size_mb", "(out of range)"},
    {"max_split_size_mb:,expandable_segments:True", "max_split_size_mb", "got ','"},
    {"max_split_size_mb::30", "max_split_size_mb", "got ':'"},
    {"max_split_size_mb:30 40", "after the value of max_split_size_mb, got '40'", NULL},
    {"max_split_size_mb:30\nexpandable_segments:True", "after the value of max_split_size_mb",
     "got 'expandable_segments'"},
    {"max_split_size_mb:30]", "max_split_size_mb", "unbalanced ']'"},
    {"max_split_size_mb:30:", "after the value of max_split_size_mb, got ':'", NULL},
    {"max_non_split_rounding_mb:5", "max_non_split_rounding_mb must be an integer >= 20 (MiB), got '5'", NULL},
    {"max_non_split_rounding_mb:abc", "max_non_split_rounding_mb", "got 'abc'"},
    {"garbage_collection_threshold:0", "garbage_collection_threshold must be", "got '0'"},
    {"garbage_collection_threshold:1", "garbage_collection_threshold", "got '1'"},
    {"garbage_collection_threshold:1.0", "garbage_collection_threshold", "got '1.0'"},
    {"garbage_collection_threshold:-0.5", "garbage_collection_threshold", "got '-0.5'"},
    {"garbage_collection_threshold:nan", "garbage_collection_threshold", "got 'nan'"},
    {"garbage_collection_threshold:inf", "garbage_collection_threshold", "got 'inf'"},
    {"garbage_collection_threshold:0x0.8p0", "garbage_collection_threshold", "got '0x0.8p0'"},
    {"garbage_collection_threshold:0.5x", "garbage_collection_threshold", "got '0.5x'"},
    {"garbage_collection_threshold:0.5.5", "garbage_collection_threshold", "got '0.5.5'"},
    {"garbage_collection_threshold:.", "garbage_collection_threshold", "got '.'"},
    {"garbage_collection_threshold:1e999", "garbage_collection_threshold", "got '1e999'"},
    {"garbage_collection_threshold:5e", "garbage_collection_threshold", "got '5e'"},
    {"per_process_memory_fraction:1.5", "per_process_memory_fraction must be a number in [0, 1], got '1.5'",
     NULL},
    {"per_process_memory_fraction:-0.1", "per_process_memory_fraction", "got '-0.1'"},
    {"per_process_memory_fraction:[0.5]", "per_process_memory_fraction", "got '['"},
    {"expandable_segments:true", "expandable_segments must be True or False, got 'true'", NULL},
    {"expandable_segments:TRUE", "expandable_segments", "got 'TRUE'"},
    {"expandable_segments:1", "expandable_segments", "got '1'"},
    {"expandable_segments:True1", "expandable_segments", "got 'True1'"},
    {"release_lock_on_cudamalloc:yes", "release_lock_on_cudamalloc must be True or False, got 'yes'", NULL},
    {"roundup_power2_divisions:3", "roundup_power2_divisions must be a power of 2", "got '3'"},
    {"roundup_power2_divisions:0", "roundup_power2_divisions must be a power of 2", "got '0'"},
    {"roundup_power2_divisions:-4", "roundup_power2_divisions", "got '-4'"},
    {"roundup_power2_divisions:99999999999999999999", "roundup_power2_divisions", "(out of range)"},
    {"roundup_power2_divisions:]", "roundup_power2_divisions", "got ']'"},
    {"roundup_power2_divisions:[3:4]", "roundup_power2_divisions interval '3' is not a power of 2", NULL},
    {"roundup_power2_divisions:[0:4]", "roundup_power2_divisions interval '0' is not a power of 2", NULL},
    {"roundup_power2_divisions:[-64:4]", "roundup_power2_divisions interval '-64'", NULL},
    {"roundup_power2_divisions:[>4]", "roundup_power2_divisions interval '>4'", NULL},
    {"roundup_power2_divisions:[99999999999999999999:4]", "roundup_power2_divisions interval", "(out of range)"},
    {"roundup_power2_divisions:[64:3]", "divisions for interval '64' must be 0 or a power of 2", "got '3'"},
    {"roundup_power2_divisions:[>:6]", "divisions for interval '>'", "got '6'"},
    {"roundup_power2_divisions:[64:99999999999999999999]", "divisions for interval '64'", "(out of range)"},
    {"roundup_power2_divisions:[64:]", "divisions for interval '64'", "got ']'"},
    {"roundup_power2_divisions:[64:8", "roundup_power2_divisions", "unbalanced '['"},
    {"roundup_power2_divisions:[64:8,", "roundup_power2_divisions", "unbalanced '['"},
    {"roundup_power2_divisions:[", "roundup_power2_divisions", "unbalanced '['"},
    {"roundup_power2_divisions:[64", "roundup_power2_divisions: expected ':' after interval '64'",
     "got end of string"},
    {"roundup_power2_divisions:[64]", "expected ':' after interval '64', got ']'", NULL},
    {"roundup_power2_divisions:[64:8 128:2]", "expected ',' or ']' after '64:8', got '128'", NULL},
    {"roundup_power2_divisions:[[64:8]]", "roundup_power2_divisions: expected an interval", "got '['"},
    {"roundup_power2_divisions:[,]", "roundup_power2_divisions: expected an interval", "got ','"},
    {"roundup_power2_divisions:[64:8,,128:2]", "roundup_power2_divisions: expected an interval", "got ','"},
    {"roundup_power2_divisions:[64:8]]", "after the value of roundup_power2_divisions", "unbalanced ']'"},
    {"roundup_power2_divisions:[64:8],]", "expected a key", "unbalanced ']'"},
    {",", "expected a key (one of max_split_size_mb", "got ','"},
    {"max_split_size_mb:30,,", "expected a key", "got ','"},
    {":30", "expected a key", "got ':'"},
    {"[", "expected a key", "got '['"},
    {"]", "expected a key", "unbalanced ']'"},
    {"max_split_size_mb:30,,expandable_segments:True", "expected a key", "got ','"},
    {"max_split_size_mb:30,[]", "expected a key", "got '['"},
};

static void test_malformed_table(void **state) {
  (void)state;
  assert_true(sizeof bad / sizeof bad[0] >= 40);
  cl_config base;
  cl_config_defaults(&base);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cl_config out;
    cachalot_status st = cl_config_parse(bad[i].s, &base, &out);
    const char *msg = cachalot_last_error();
    if (st != CACHALOT_ERROR_CONFIG)
      fail_msg("'%s': status %s, want CACHALOT_ERROR_CONFIG", bad[i].s, cachalot_status_name(st));
    if (strncmp(msg, PREFIX, strlen(PREFIX)) != 0)
      fail_msg("'%s': message lacks the prefix: %s", bad[i].s, msg);
    if (!strstr(msg, bad[i].needle))
      fail_msg("'%s': message lacks \"%s\": %s", bad[i].s, bad[i].needle, msg);
    if (bad[i].needle2 && !strstr(msg, bad[i].needle2))
      fail_msg("'%s': message lacks \"%s\": %s", bad[i].s, bad[i].needle2, msg);
  }
}

static void test_long_words(void **state) {
  (void)state;
  char s[256];
  /* 64 characters is still a word (here an unknown key). */
  memset(s, 'k', 64);
  strcpy(s + 64, ":1");
  assert_int_equal(cl_config_parse(s, NULL, &(cl_config){0}), CACHALOT_ERROR_CONFIG);
  assert_non_null(strstr(cachalot_last_error(), "unknown key 'kkkk"));

  /* 65 is too long and the message shows it truncated. */
  memset(s, 'k', 65);
  strcpy(s + 65, ":1");
  assert_int_equal(cl_config_parse(s, NULL, &(cl_config){0}), CACHALOT_ERROR_CONFIG);
  const char *msg = cachalot_last_error();
  assert_non_null(strstr(msg, PREFIX));
  assert_non_null(strstr(msg, "(truncated)"));
  assert_null(strstr(msg, "unknown key"));

  /* Also as a value: a long number must not be silently cut to something valid. */
  strcpy(s, "max_split_size_mb:");
  memset(s + 18, '9', 100);
  s[118] = '\0';
  assert_int_equal(cl_config_parse(s, NULL, &(cl_config){0}), CACHALOT_ERROR_CONFIG);
  assert_non_null(strstr(cachalot_last_error(), "(truncated)"));

  /* A 64-char float goes through the bounded strtod copy intact. */
  strcpy(s, "garbage_collection_threshold:0.");
  memset(s + 31, '0', 61);
  s[31 + 61] = '5'; /* 0.000...05 : 64 characters in all */
  s[31 + 62] = '\0';
  assert_int_equal(strlen(s + 29), 64);
  cl_config c = parse_ok(s, NULL);
  assert_true(c.gc_threshold > 0 && c.gc_threshold < 1e-60);
}

/* Deterministic garbage from the grammar's own pieces: every result must be OK or CONFIG, never a
 * crash (the sanitizer builds catch out-of-bounds reads), and an accepted string must hold in-range values.
 * */
static void test_random_strings(void **state) {
  (void)state;
  static const char *pieces[] = {
      "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
      "roundup_power2_divisions", "expandable_segments", "release_lock_on_cudamalloc",
      "per_process_memory_fraction", ":", ",", "[", "]", ">", " ", "\t", "64", "8", "3", "0", "20",
      "0.5", "1e999", "True", "False", "-", "x", "\xff", "99999999999999999999",
  };
  uint64_t x = 0x9E3779B97F4A7C15u;
  char s[512];
  int accepted = 0;
  for (int iter = 0; iter < 200000; iter++) {
    size_t len = 0;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int n = (int)(x % 12);
    for (int j = 0; j < n; j++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const char *p = pieces[x % (sizeof pieces / sizeof pieces[0])];
      size_t pl = strlen(p);
      if (len + pl >= sizeof s)
        break;
      memcpy(s + len, p, pl);
      len += pl;
    }
    s[len] = '\0';
    cl_config c;
    cachalot_status st = cl_config_parse(s, NULL, &c);
    if (st == CACHALOT_OK) {
      accepted++;
      assert_true(c.max_split_size >= 20 * MIB);
      assert_true(c.max_non_split_rounding >= 20 * MIB);
      assert_true(c.gc_threshold >= 0 && c.gc_threshold < 1);
      assert_true(c.memory_fraction == -1.0 || (c.memory_fraction >= 0 && c.memory_fraction <= 1));
      for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
        assert_true((c.roundup_divisions[i] & (c.roundup_divisions[i] - 1)) == 0);
    } else {
      if (st != CACHALOT_ERROR_CONFIG)
        fail_msg("'%s': %s", s, cachalot_status_name(st));
      assert_int_equal(strncmp(cachalot_last_error(), PREFIX, strlen(PREFIX)), 0);
    }
  }
  assert_true(accepted > 0); /* the generator does reach valid strings */
}

/* The public face of the parser: cachalot_check_config validates without creating anything, and
 * cachalot_config_keys names every key the parser takes, each of which the parser then recognizes. */
static void test_public_check_and_keys(void **state) {
  (void)state;
  const char *const *k = cachalot_config_keys();
  size_t n = 0;
  char conf[128], unknown[128];
  for (; k[n]; n++) {
    /* a known key with a bad value fails on its value, never as an unknown key */
    snprintf(conf, sizeof conf, "%s:<bad>", k[n]);
    assert_int_equal(cachalot_check_config(conf), CACHALOT_ERROR_CONFIG);
    snprintf(unknown, sizeof unknown, "unknown key '%s'", k[n]);
    assert_null(strstr(cachalot_last_error(), unknown));
    assert_non_null(strstr(cachalot_last_error(), k[n]));
  }
  assert_int_equal(n, 15);
  assert_string_equal(k[0], "max_split_size_mb");
  assert_string_equal(k[12], "preset");
  assert_string_equal(k[13], "graph_capture_record_stream_reuse");
  assert_string_equal(k[14], "expandable_plan");
  assert_int_equal(cachalot_check_config("max_split_size_mb:40,preset:low_fragmentation"), CACHALOT_OK);
  assert_int_equal(cachalot_check_config(""), CACHALOT_OK);
  assert_int_equal(cachalot_check_config("backend:native"), CACHALOT_ERROR_CONFIG);
  assert_non_null(strstr(cachalot_last_error(), "unknown key 'backend'"));
  assert_int_equal(setenv("CACHALOT_ALLOC_CONF", "garbage_collection_threshold:2", 1), 0);
  assert_int_equal(cachalot_check_config(NULL), CACHALOT_ERROR_CONFIG);
  assert_non_null(strstr(cachalot_last_error(), "garbage_collection_threshold"));
  assert_int_equal(unsetenv("CACHALOT_ALLOC_CONF"), 0);
  assert_int_equal(cachalot_check_config(NULL), CACHALOT_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_max_split_size),
      cmocka_unit_test(test_max_non_split_rounding),
      cmocka_unit_test(test_gc_threshold),
      cmocka_unit_test(test_bools),
      cmocka_unit_test(test_preset),
      cmocka_unit_test(test_pinned_keys),
      cmocka_unit_test(test_expandable_page),
      cmocka_unit_test(test_memory_fraction),
      cmocka_unit_test(test_roundup_list_spec_example),
      cmocka_unit_test(test_roundup_list_rules),
      cmocka_unit_test(test_roundup_single),
      cmocka_unit_test(test_whitespace_and_all_keys),
      cmocka_unit_test(test_trailing_comma),
      cmocka_unit_test(test_base_kept_and_keys_set),
      cmocka_unit_test(test_last_wins_and_aliasing),
      cmocka_unit_test(test_null_out),
      cmocka_unit_test(test_malformed_table),
      cmocka_unit_test(test_long_words),
      cmocka_unit_test(test_random_strings),
      cmocka_unit_test(test_public_check_and_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
