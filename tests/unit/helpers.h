/* Shared helpers of the allocator unit tests (test_alloc.c, test_misuse.c, test_faults.c).
 *
 * Every helper that changes allocator state runs cachalot_check() afterwards, and every comparison
 * reports the caller's file and line with the values in decimal, so a failure reads as
 * "test_alloc.c:123: large_pool.reserved_bytes.current is 20971520, expected 41943040". */
#ifndef CACHALOT_TESTS_UNIT_HELPERS_H
#define CACHALOT_TESTS_UNIT_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cachalot/cachalot.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define GiB ((size_t)1024 * 1024 * 1024)

/* ---- comparisons that name the caller's line -------------------------------------------------- */

static inline void eq_i64_(int64_t actual, int64_t expected, const char *what, const char *file, int line) {
  if (actual != expected) {
    print_error("%s:%d: %s is %lld, expected %lld\n", file, line, what, (long long)actual, (long long)expected);
    _fail(file, line);
  }
}
#define EQ(actual, expected) eq_i64_((int64_t)(actual), (int64_t)(expected), #actual, __FILE__, __LINE__)

static inline void status_is_(cachalot_status actual, cachalot_status expected, const char *what, const char *file,
                              int line) {
  if (actual != expected) {
    print_error("%s:%d: %s returned %s, expected %s (last error: %s)\n", file, line, what,
                cachalot_status_name(actual), cachalot_status_name(expected), cachalot_last_error());
    _fail(file, line);
  }
}
/* STATUS(call, expected): runs `call` and compares its status. */
#define STATUS(call, expected) status_is_((call), (expected), #call, __FILE__, __LINE__)
#define OK(call) STATUS(call, CACHALOT_OK)

static inline void contains_(const char *hay, const char *needle, const char *file, int line) {
  if (!hay || !strstr(hay, needle)) {
    print_error("%s:%d: '%s' does not contain '%s'\n", file, line, hay ? hay : "(null)", needle);
    _fail(file, line);
  }
}
#define CONTAINS(hay, needle) contains_((hay), (needle), __FILE__, __LINE__)

static inline void str_eq_(const char *actual, const char *expected, const char *file, int line) {
  if (strcmp(actual, expected) != 0) {
    print_error("%s:%d: message differs\n  got:      %s\n  expected: %s\n", file, line, actual, expected);
    _fail(file, line);
  }
}
#define STR_EQ(actual, expected) str_eq_((actual), (expected), __FILE__, __LINE__)

/* assert_int_equal(cachalot_check(a), CACHALOT_OK), printing the violation when there is one. */
static inline void check_(cachalot_allocator *a, const char *file, int line) {
  cachalot_status rc = cachalot_check(a);
  if (rc != CACHALOT_OK)
    print_error("%s:%d: cachalot_check: %s: %s\n", file, line, cachalot_status_name(rc), cachalot_last_error());
  _assert_int_equal(rc, CACHALOT_OK, file, line);
}
#define CHECK(a) check_((a), __FILE__, __LINE__)

/* ---- a simulated backend with one allocator ---------------------------------------------------- */

typedef struct {
  cachalot_backend *b;
  cachalot_allocator *a;
} env;

/* capacity 0 means the simulator's default (80 GiB). complete_immediately is false. */
static inline env env_make_(int devices, size_t capacity, const char *conf, const char *file, int line) {
  env e = {NULL, NULL};
  cachalot_sim_options o = {.device_count = devices,
                            .capacity_bytes = capacity ? capacity : (size_t)80 << 30,
                            .complete_immediately = false};
  status_is_(cachalot_backend_sim(&o, &e.b), CACHALOT_OK, "cachalot_backend_sim", file, line);
  status_is_(cachalot_create(e.b, conf ? conf : "", &e.a), CACHALOT_OK, "cachalot_create", file, line);
  check_(e.a, file, line);
  return e;
}
#define ENV(devices, capacity, conf) env_make_((devices), (capacity), (conf), __FILE__, __LINE__)

static inline void env_free(env *e) {
  cachalot_destroy(e->a);
  cachalot_backend_destroy(e->b);
  e->a = NULL;
  e->b = NULL;
}

static inline cachalot_stream stream_new_(cachalot_backend *b, int device, const char *file, int line) {
  cachalot_stream s = NULL;
  status_is_(cachalot_sim_stream_create(b, device, &s), CACHALOT_OK, "cachalot_sim_stream_create", file, line);
  if (!s)
    _fail(file, line);
  return s;
}
#define STREAM(b, device) stream_new_((b), (device), __FILE__, __LINE__)

/* malloc that must succeed with a non-NULL pointer; runs cachalot_check afterwards. */
static inline void *alloc_ok_(cachalot_allocator *a, int device, size_t size, cachalot_stream s, const char *file,
                              int line) {
  void *p = (void *)(uintptr_t)0xdeadbeef;
  cachalot_status rc = cachalot_malloc(a, device, size, s, &p);
  if (rc != CACHALOT_OK) {
    print_error("%s:%d: cachalot_malloc(device %d, %zu bytes) failed: %s: %s\n", file, line, device, size,
                cachalot_status_name(rc), cachalot_last_error());
    _fail(file, line);
  }
  if (!p) {
    print_error("%s:%d: cachalot_malloc(%zu) returned NULL\n", file, line, size);
    _fail(file, line);
  }
  check_(a, file, line);
  return p;
}
#define ALLOC(a, device, size, s) alloc_ok_((a), (device), (size), (s), __FILE__, __LINE__)

static inline void free_ok_(cachalot_allocator *a, void *p, const char *file, int line) {
  status_is_(cachalot_free(a, p), CACHALOT_OK, "cachalot_free", file, line);
  check_(a, file, line);
}
#define FREE(a, p) free_ok_((a), (p), __FILE__, __LINE__)

static inline void record_ok_(cachalot_allocator *a, void *p, cachalot_stream s, const char *file, int line) {
  status_is_(cachalot_record_stream(a, p, s), CACHALOT_OK, "cachalot_record_stream", file, line);
  check_(a, file, line);
}
#define RECORD(a, p, s) record_ok_((a), (p), (s), __FILE__, __LINE__)

static inline void complete_ok_(env *e, cachalot_stream s, const char *file, int line) {
  status_is_(cachalot_sim_stream_complete(e->b, s), CACHALOT_OK, "cachalot_sim_stream_complete", file, line);
  check_(e->a, file, line);
}
#define COMPLETE(e, s) complete_ok_((e), (s), __FILE__, __LINE__)

static inline void empty_ok_(cachalot_allocator *a, const char *file, int line) {
  status_is_(cachalot_empty_cache(a), CACHALOT_OK, "cachalot_empty_cache", file, line);
  check_(a, file, line);
}
#define EMPTY(a) empty_ok_((a), __FILE__, __LINE__)

/* ---- stats ----------------------------------------------------------------------------------- */

static inline cachalot_device_stats stats_(cachalot_allocator *a, int device, const char *file, int line) {
  cachalot_device_stats st;
  status_is_(cachalot_memory_stats(a, device, &st), CACHALOT_OK, "cachalot_memory_stats", file, line);
  return st;
}
#define STATS(a, device) stats_((a), (device), __FILE__, __LINE__)

static inline size_t used_(cachalot_backend *b, int device, const char *file, int line) {
  size_t used = 0;
  status_is_(cachalot_sim_device_used(b, device, &used), CACHALOT_OK, "cachalot_sim_device_used", file, line);
  return used;
}
#define USED(b, device) used_((b), (device), __FILE__, __LINE__)

/* The expected current values of one pool kind. Fields left out of a designated initializer are 0, so
 * every expectation is complete: allocation, allocated_bytes, active, active_bytes, requested_bytes,
 * segment, reserved_bytes, inactive_split, inactive_split_bytes. */
typedef struct {
  int64_t alloc, alloc_b, active, active_b, req_b, seg, res_b, split, split_b;
} pool_x;

#define PX(...) ((pool_x){__VA_ARGS__})
#define PX0 ((pool_x){0})

static inline void expect_array_(const cachalot_stat *arr, int64_t small, int64_t large, const char *name,
                                 const char *file, int line) {
  char what[96];
  snprintf(what, sizeof what, "small_pool.%s.current", name);
  eq_i64_(arr[CACHALOT_STAT_SMALL_POOL].current, small, what, file, line);
  snprintf(what, sizeof what, "large_pool.%s.current", name);
  eq_i64_(arr[CACHALOT_STAT_LARGE_POOL].current, large, what, file, line);
  snprintf(what, sizeof what, "all.%s.current", name);
  eq_i64_(arr[CACHALOT_STAT_ALL].current, small + large, what, file, line);
}

static inline void expect_pools_(cachalot_allocator *a, int device, pool_x sm, pool_x lg, const char *file,
                                 int line) {
  cachalot_device_stats st = stats_(a, device, file, line);
  expect_array_(st.allocation, sm.alloc, lg.alloc, "allocation", file, line);
  expect_array_(st.allocated_bytes, sm.alloc_b, lg.alloc_b, "allocated_bytes", file, line);
  expect_array_(st.active, sm.active, lg.active, "active", file, line);
  expect_array_(st.active_bytes, sm.active_b, lg.active_b, "active_bytes", file, line);
  expect_array_(st.requested_bytes, sm.req_b, lg.req_b, "requested_bytes", file, line);
  expect_array_(st.segment, sm.seg, lg.seg, "segment", file, line);
  expect_array_(st.reserved_bytes, sm.res_b, lg.res_b, "reserved_bytes", file, line);
  expect_array_(st.inactive_split, sm.split, lg.split, "inactive_split", file, line);
  expect_array_(st.inactive_split_bytes, sm.split_b, lg.split_b, "inactive_split_bytes", file, line);
}
/* EXPECT_POOLS(a, device, small, large): every current value of every stat array. */
#define EXPECT_POOLS(a, device, sm, lg) expect_pools_((a), (device), (sm), (lg), __FILE__, __LINE__)

/* The five counters, exactly. */
static inline void expect_counters_(cachalot_allocator *a, int device, int64_t dev_alloc, int64_t dev_free,
                                    int64_t retries, int64_t ooms, int64_t syncs, const char *file, int line) {
  cachalot_device_stats st = stats_(a, device, file, line);
  eq_i64_(st.num_device_alloc, dev_alloc, "num_device_alloc", file, line);
  eq_i64_(st.num_device_free, dev_free, "num_device_free", file, line);
  eq_i64_(st.num_alloc_retries, retries, "num_alloc_retries", file, line);
  eq_i64_(st.num_ooms, ooms, "num_ooms", file, line);
  eq_i64_(st.num_sync_all_streams, syncs, "num_sync_all_streams", file, line);
}
#define EXPECT_COUNTERS(a, device, dev_alloc, dev_free, retries, ooms, syncs)                                   \
  expect_counters_((a), (device), (dev_alloc), (dev_free), (retries), (ooms), (syncs), __FILE__, __LINE__)

static inline void expect_oversize_(cachalot_allocator *a, int device, int64_t allocs, int64_t segs,
                                    const char *file, int line) {
  cachalot_device_stats st = stats_(a, device, file, line);
  eq_i64_(st.oversize_allocations.current, allocs, "oversize_allocations.current", file, line);
  eq_i64_(st.oversize_segments.current, segs, "oversize_segments.current", file, line);
}
#define EXPECT_OVERSIZE(a, device, allocs, segs) expect_oversize_((a), (device), (allocs), (segs), __FILE__, __LINE__)

/* Nothing is lost between cachalot and the device: reserved bytes equal the device's own count. */
static inline void expect_reserved_is_used_(env *e, int device, const char *file, int line) {
  cachalot_device_stats st = stats_(e->a, device, file, line);
  eq_i64_(st.reserved_bytes[CACHALOT_STAT_ALL].current, (int64_t)used_(e->b, device, file, line),
          "reserved_bytes.all.current vs cachalot_sim_device_used", file, line);
}
#define EXPECT_RESERVED_IS_USED(e, device) expect_reserved_is_used_((e), (device), __FILE__, __LINE__)

/* Applies fn to every cachalot_stat of a stats struct, with its name. */
static inline void for_each_stat(cachalot_device_stats *st, void (*fn)(cachalot_stat *, const char *, void *),
                                 void *ctx) {
  static const char *kinds[3] = {"all", "small_pool", "large_pool"};
  struct {
    cachalot_stat *arr;
    const char *name;
  } arrays[] = {{st->allocation, "allocation"},
                {st->segment, "segment"},
                {st->active, "active"},
                {st->inactive_split, "inactive_split"},
                {st->allocated_bytes, "allocated_bytes"},
                {st->reserved_bytes, "reserved_bytes"},
                {st->active_bytes, "active_bytes"},
                {st->inactive_split_bytes, "inactive_split_bytes"},
                {st->requested_bytes, "requested_bytes"}};
  char name[96];
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
    for (int k = 0; k < 3; k++) {
      snprintf(name, sizeof name, "%s.%s", arrays[i].name, kinds[k]);
      fn(&arrays[i].arr[k], name, ctx);
    }
  fn(&st->oversize_allocations, "oversize_allocations", ctx);
  fn(&st->oversize_segments, "oversize_segments", ctx);
}

#endif
