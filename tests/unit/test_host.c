/* The caching pinned-host allocator (include/cachalot/host.h) on the simulated backend: rounding, reuse,
 * stream marks and events, empty_cache, both ways of pinning, OOM, misuse and stats, with exact bytes.
 * Every step is followed by cachalot_check, which covers the host cache's blocks, free lists, pending
 * events and stats. */
#include "helpers.h"

/* The pinned bytes the simulated backend holds, by kind. */
#define PINNED(b, alloc_b, reg_b)                                                                                  \
  do {                                                                                                            \
    size_t pa_ = 0, pr_ = 0;                                                                                      \
    OK(cachalot_sim_host_pinned((b), &pa_, &pr_));                                                                \
    EQ(pa_, (alloc_b));                                                                                           \
    EQ(pr_, (reg_b));                                                                                             \
  } while (0)

/* The host stats' current values and counters. */
typedef struct {
  int64_t blocks, bytes, active, active_b, pins, unpins;
} host_x;

static void expect_host_(cachalot_allocator *a, host_x x, const char *file, int line) {
  cachalot_host_stats s;
  status_is_(cachalot_host_memory_stats(a, &s), CACHALOT_OK, "cachalot_host_memory_stats", file, line);
  eq_i64_(s.allocations.current, x.blocks, "allocations.current", file, line);
  eq_i64_(s.allocated_bytes.current, x.bytes, "allocated_bytes.current", file, line);
  eq_i64_(s.active_requests.current, x.active, "active_requests.current", file, line);
  eq_i64_(s.active_bytes.current, x.active_b, "active_bytes.current", file, line);
  eq_i64_(s.num_host_alloc, x.pins, "num_host_alloc", file, line);
  eq_i64_(s.num_host_free, x.unpins, "num_host_free", file, line);
  eq_i64_(s.host_alloc_time.count, x.pins, "host_alloc_time.count", file, line);
  eq_i64_(s.host_free_time.count, x.unpins, "host_free_time.count", file, line);
  check_(a, file, line);
}
#define EXPECT_HOST(a, ...) expect_host_((a), (host_x){__VA_ARGS__}, __FILE__, __LINE__)

static void *host_alloc_(cachalot_allocator *a, size_t size, const char *file, int line) {
  void *p = (void *)(uintptr_t)0x1;
  status_is_(cachalot_host_malloc(a, size, &p), CACHALOT_OK, "cachalot_host_malloc", file, line);
  if (!p)
    _fail(file, line);
  memset(p, 0xa5, size); /* the whole request is host memory this process may write */
  check_(a, file, line);
  return p;
}
#define HALLOC(a, size) host_alloc_((a), (size), __FILE__, __LINE__)

static void host_free_(cachalot_allocator *a, void *p, const char *file, int line) {
  status_is_(cachalot_host_free(a, p), CACHALOT_OK, "cachalot_host_free", file, line);
  check_(a, file, line);
}
#define HFREE(a, p) host_free_((a), (p), __FILE__, __LINE__)

/* Sizes round up to powers of two, a free block serves only its own size, most recently freed first. */
static void test_rounding_and_reuse(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  void *z = (void *)(uintptr_t)0x1;
  OK(cachalot_host_malloc(e.a, 0, &z)); /* size 0: NULL, nothing pinned */
  assert_null(z);
  EXPECT_HOST(e.a, 0);
  char *one = HALLOC(e.a, 1);
  char *a4 = HALLOC(e.a, 3000);
  char *b4 = HALLOC(e.a, 4096);
  char *c8 = HALLOC(e.a, 4097);
  PINNED(e.b, 1 + 4096 + 4096 + 8192, 0);
  EXPECT_HOST(e.a, .blocks = 4, .bytes = 16385, .active = 4, .active_b = 16385, .pins = 4);
  HFREE(e.a, a4);
  HFREE(e.a, b4);
  HFREE(e.a, c8);
  EXPECT_HOST(e.a, .blocks = 4, .bytes = 16385, .active = 1, .active_b = 1, .pins = 4);
  assert_ptr_equal(HALLOC(e.a, 2049), b4); /* the most recently freed 4 KiB block */
  assert_ptr_equal(HALLOC(e.a, 4096), a4);
  char *n4 = HALLOC(e.a, 4000); /* no free 4 KiB block: the free 8 KiB one is not taken */
  assert_true(n4 != c8);
  PINNED(e.b, 1 + 3 * 4096 + 8192, 0);
  EXPECT_HOST(e.a, .blocks = 5, .bytes = 20481, .active = 4, .active_b = 12289, .pins = 5);
  assert_ptr_equal(HALLOC(e.a, 8192), c8);
  HFREE(e.a, one);
  HFREE(e.a, NULL); /* a no-op */
  EXPECT_HOST(e.a, .blocks = 5, .bytes = 20481, .active = 4, .active_b = 20480, .pins = 5);
  env_free(&e);
}

/* A block marked with streams is reused only after the work enqueued on each before its free is done;
 * one freed without marks is reusable at once, pending work or not. */
static void test_streams_delay_reuse(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 1);
  char *p = HALLOC(e.a, 64 * KiB);
  OK(cachalot_sim_launch(e.b, s1)); /* the copies that read p */
  OK(cachalot_sim_launch(e.b, s2));
  OK(cachalot_sim_launch(e.b, NULL));
  OK(cachalot_host_record_event(e.a, p, 0, s1));
  OK(cachalot_host_record_event(e.a, p, 0, s1)); /* once per stream */
  OK(cachalot_host_record_event(e.a, p, 1, s2)); /* a stream of device 1 */
  OK(cachalot_host_record_event(e.a, p, 0, NULL)); /* device 0's default stream */
  uint64_t n1 = 0, n2 = 0, n0 = 0;
  OK(cachalot_sim_stream_submitted(e.b, s1, &n1));
  HFREE(e.a, p);
  uint64_t m1 = 0;
  OK(cachalot_sim_stream_submitted(e.b, s1, &m1));
  EQ(m1, n1 + 1); /* one event on s1 */
  OK(cachalot_sim_stream_submitted(e.b, s2, &n2));
  OK(cachalot_sim_stream_submitted(e.b, NULL, &n0));
  EQ(n2, 2);
  EQ(n0, 2);
  EXPECT_HOST(e.a, .blocks = 1, .bytes = 64 * KiB, .pins = 1);
  char *q = HALLOC(e.a, 64 * KiB); /* p waits: a new block */
  assert_true(q != p);
  HFREE(e.a, q);
  OK(cachalot_sim_stream_complete(e.b, s1));
  OK(cachalot_sim_stream_complete(e.b, s2));
  char *r = HALLOC(e.a, 64 * KiB); /* the default stream still works: q, not p */
  assert_ptr_equal(r, q);
  char *t = HALLOC(e.a, 64 * KiB);
  assert_true(t != p);
  EXPECT_HOST(e.a, .blocks = 3, .bytes = 192 * KiB, .active = 2, .active_b = 128 * KiB, .pins = 3);
  OK(cachalot_sim_stream_complete(e.b, NULL));
  assert_ptr_equal(HALLOC(e.a, 64 * KiB), p);
  /* unmarked: reusable at once, work pending on s1 or not */
  OK(cachalot_sim_launch(e.b, s1));
  HFREE(e.a, r);
  assert_ptr_equal(HALLOC(e.a, 33 * KiB), r);
  /* the marks go with the free: the block comes back unmarked */
  OK(cachalot_host_record_event(e.a, r, 0, s1));
  HFREE(e.a, r);
  OK(cachalot_sim_stream_complete(e.b, s1));
  char *r2 = HALLOC(e.a, 64 * KiB);
  assert_ptr_equal(r2, r);
  OK(cachalot_sim_launch(e.b, s1));
  HFREE(e.a, r2);
  assert_ptr_equal(HALLOC(e.a, 64 * KiB), r); /* no mark this time */
  EXPECT_HOST(e.a, .blocks = 3, .bytes = 192 * KiB, .active = 3, .active_b = 192 * KiB, .pins = 3);
  env_free(&e);
}

/* empty_cache gives back the free blocks only; waiting and allocated ones stay. */
static void test_empty_cache(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  char *a = HALLOC(e.a, 1 * MiB), *b = HALLOC(e.a, 2 * MiB), *c = HALLOC(e.a, 4 * MiB);
  OK(cachalot_sim_launch(e.b, s));
  OK(cachalot_host_record_event(e.a, b, 0, s));
  HFREE(e.a, a);
  HFREE(e.a, b);
  OK(cachalot_host_empty_cache(e.a));
  CHECK(e.a);
  PINNED(e.b, 6 * MiB, 0);
  EXPECT_HOST(e.a, .blocks = 2, .bytes = 6 * MiB, .active = 1, .active_b = 4 * MiB, .pins = 3, .unpins = 1);
  OK(cachalot_sim_stream_complete(e.b, s));
  OK(cachalot_host_empty_cache(e.a)); /* b's event is done now */
  PINNED(e.b, 4 * MiB, 0);
  EXPECT_HOST(e.a, .blocks = 1, .bytes = 4 * MiB, .active = 1, .active_b = 4 * MiB, .pins = 3, .unpins = 2);
  HFREE(e.a, c);
  OK(cachalot_host_empty_cache(e.a));
  PINNED(e.b, 0, 0);
  EXPECT_HOST(e.a, .pins = 3, .unpins = 3);
  OK(cachalot_host_empty_cache(e.a)); /* nothing left: a no-op */
  EXPECT_HOST(e.a, .pins = 3, .unpins = 3);
  env_free(&e);
}

/* pinned_use_cuda_host_register: blocks are the process's memory, registered; each is given back the
 * way it was pinned, also after the key changes. */
static void test_register_path(void **state) {
  (void)state;
  env e = ENV(1, 0, "pinned_use_cuda_host_register:True,pinned_num_register_threads:8");
  char *big = HALLOC(e.a, 3 * MiB); /* 4 MiB, touched by 8 threads */
  char *small = HALLOC(e.a, 100);   /* 128 B: fewer pages than threads, touched by one */
  PINNED(e.b, 0, 4 * MiB + 128);
  assert_int_equal((uintptr_t)big % 4096, 0);
  OK(cachalot_set_settings(e.a, "pinned_use_cuda_host_register:False"));
  char *plain = HALLOC(e.a, 1000);
  PINNED(e.b, 1024, 4 * MiB + 128);
  EXPECT_HOST(e.a, .blocks = 3, .bytes = 4 * MiB + 1152, .active = 3, .active_b = 4 * MiB + 1152, .pins = 3);
  HFREE(e.a, big);
  HFREE(e.a, small);
  HFREE(e.a, plain);
  OK(cachalot_host_empty_cache(e.a));
  PINNED(e.b, 0, 0);
  EXPECT_HOST(e.a, .pins = 3, .unpins = 3);
  OK(cachalot_set_settings(e.a, "pinned_use_cuda_host_register:True,pinned_num_register_threads:128"));
  char *one = HALLOC(e.a, 128 * 4096); /* exactly one page per thread */
  PINNED(e.b, 0, 128 * 4096);
  HFREE(e.a, one);
  env_free(&e); /* destroy gives back registered blocks too (ASan: nothing leaked) */
}

/* A pinning that fails gives the cache's free blocks back and tries once more; if that fails too, the
 * error says what was asked and nothing is left pinned or counted. */
static void test_oom(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *a = HALLOC(e.a, 8 * KiB), *b = HALLOC(e.a, 16 * KiB);
  HFREE(e.a, a);
  HFREE(e.a, b);
  OK(cachalot_sim_fail_host_pins(e.b, 1));
  char *c = HALLOC(e.a, 4 * KiB);
  PINNED(e.b, 4 * KiB, 0);
  EXPECT_HOST(e.a, .blocks = 1, .bytes = 4 * KiB, .active = 1, .active_b = 4 * KiB, .pins = 3, .unpins = 2);
  HFREE(e.a, c);
  OK(cachalot_sim_fail_host_pins(e.b, 2));
  void *p = (void *)(uintptr_t)0x1;
  STATUS(cachalot_host_malloc(e.a, 5 * KiB, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "cachalot_host_malloc: pinning 8192 bytes: injected host allocation failure");
  PINNED(e.b, 0, 0); /* the free 4 KiB block went back for the retry */
  EXPECT_HOST(e.a, .pins = 3, .unpins = 3);
  /* the register path fails the same way, with its memory freed (ASan) */
  OK(cachalot_set_settings(e.a, "pinned_use_cuda_host_register:True"));
  OK(cachalot_sim_fail_host_pins(e.b, 2));
  STATUS(cachalot_host_malloc(e.a, 5 * KiB, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "injected host register failure");
  EXPECT_HOST(e.a, .pins = 3, .unpins = 3);
  OK(cachalot_sim_fail_host_pins(e.b, 0)); /* nothing was cached to give back: one try, one failure used */
  STATUS(cachalot_host_malloc(e.a, ((size_t)1 << 63) + 1, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "cannot be rounded up to a power of two");
  char *d = HALLOC(e.a, 5 * KiB); /* and works again */
  PINNED(e.b, 0, 8 * KiB);
  HFREE(e.a, d);
  env_free(&e);
}

/* A free that cannot record an event on a marked stream changes nothing: the block stays allocated and
 * marked, and a later free works. */
static void test_event_failure_at_free(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  char *p = HALLOC(e.a, 4 * KiB);
  OK(cachalot_host_record_event(e.a, p, 0, s1));
  OK(cachalot_host_record_event(e.a, p, 0, s2));
  OK(cachalot_sim_launch(e.b, s2));
  OK(cachalot_sim_fail_events(e.b, 1));
  STATUS(cachalot_host_free(e.a, p), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "cachalot_host_free: recording an event on stream");
  EXPECT_HOST(e.a, .blocks = 1, .bytes = 4 * KiB, .active = 1, .active_b = 4 * KiB, .pins = 1);
  HFREE(e.a, p);
  char *q = HALLOC(e.a, 4 * KiB); /* the events on s1 and s2 are pending: p waits */
  assert_true(q != p);
  OK(cachalot_sim_stream_complete(e.b, s2));
  char *r = HALLOC(e.a, 4 * KiB); /* still s1's */
  assert_true(r != p && r != q);
  OK(cachalot_sim_stream_complete(e.b, s1));
  assert_ptr_equal(HALLOC(e.a, 4 * KiB), p);
  env_free(&e);
}

static void test_misuse(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *p = HALLOC(e.a, 4 * KiB);
  int local = 0;
  STATUS(cachalot_host_free(e.a, &local), CACHALOT_ERROR_INVALID_POINTER);
  CONTAINS(cachalot_last_error(), "is not a pinned block from cachalot_host_malloc");
  STATUS(cachalot_host_free(e.a, p + 8), CACHALOT_ERROR_INVALID_POINTER); /* interior */
  STATUS(cachalot_host_record_event(e.a, p + 8, 0, NULL), CACHALOT_ERROR_INVALID_POINTER);
  STATUS(cachalot_host_record_event(e.a, p, 1, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "device 1 out of range");
  STATUS(cachalot_host_record_event(e.a, p, -1, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_record_event(e.a, p, 0, (cachalot_stream)(uintptr_t)0x1234), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "cachalot_host_record_event: ");
  HFREE(e.a, p);
  STATUS(cachalot_host_free(e.a, p), CACHALOT_ERROR_INVALID_POINTER); /* twice */
  CONTAINS(cachalot_last_error(), "is a pinned block that is not allocated (freed already?)");
  STATUS(cachalot_host_record_event(e.a, p, 0, NULL), CACHALOT_ERROR_INVALID_POINTER);
  /* the device allocator and the host cache do not take each other's pointers */
  char *d = ALLOC(e.a, 0, 512, NULL);
  STATUS(cachalot_host_free(e.a, d), CACHALOT_ERROR_INVALID_POINTER);
  char *h = HALLOC(e.a, 512);
  STATUS(cachalot_free(e.a, h), CACHALOT_ERROR_INVALID_POINTER);
  FREE(e.a, d);
  HFREE(e.a, h);
  STATUS(cachalot_host_malloc(e.a, 8, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  void *q = &q; /* cleared however the call fails */
  STATUS(cachalot_host_malloc(NULL, 8, &q), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(q);
  STATUS(cachalot_host_free(NULL, h), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_record_event(NULL, h, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_empty_cache(NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_memory_stats(e.a, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_memory_stats(NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_reset_peak_stats(NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_host_reset_accumulated_stats(NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  EXPECT_HOST(e.a, .blocks = 2, .bytes = 4 * KiB + 512, .pins = 2);
  env_free(&e);
}

static void test_stats_reset(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *a = HALLOC(e.a, 1 * KiB), *b = HALLOC(e.a, 2 * KiB);
  HFREE(e.a, a);
  HFREE(e.a, b);
  OK(cachalot_host_empty_cache(e.a));
  char *c = HALLOC(e.a, 512);
  cachalot_host_stats s;
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.peak, 2);
  EQ(s.allocations.allocated, 3);
  EQ(s.allocations.freed, 2);
  EQ(s.allocated_bytes.peak, 3 * KiB);
  EQ(s.allocated_bytes.allocated, 3 * KiB + 512);
  EQ(s.allocated_bytes.freed, 3 * KiB);
  EQ(s.active_requests.allocated, 3);
  EQ(s.active_requests.freed, 2);
  EQ(s.active_bytes.peak, 3 * KiB);
  assert_true(s.host_alloc_time.total >= s.host_alloc_time.max && s.host_alloc_time.max >= s.host_alloc_time.min);
  OK(cachalot_host_reset_peak_stats(e.a));
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.peak, 1);
  EQ(s.allocated_bytes.peak, 512);
  EQ(s.active_bytes.peak, 512);
  EQ(s.host_alloc_time.max, 0);
  EQ(s.host_alloc_time.min, 0);
  EQ(s.host_alloc_time.count, 3);
  OK(cachalot_host_reset_accumulated_stats(e.a));
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.allocated, 0);
  EQ(s.allocations.freed, 0);
  EQ(s.allocated_bytes.allocated, 0);
  EQ(s.host_alloc_time.count, 0);
  EQ(s.host_alloc_time.total, 0);
  EXPECT_HOST(e.a, .blocks = 1, .bytes = 512, .active = 1, .active_b = 512);
  HFREE(e.a, c);
  env_free(&e);
}

/* The snapshot's allocator_settings carry both keys with their values. */
static void test_settings_in_snapshot(void **state) {
  (void)state;
  env e = ENV(1, 0, "pinned_use_cuda_host_register:True,pinned_num_register_threads:16");
  char *json = NULL;
  OK(cachalot_snapshot_json(e.a, &json));
  CONTAINS(json, "\"pinned_use_cuda_host_register\":true,\"pinned_num_register_threads\":16");
  free(json);
  OK(cachalot_set_settings(e.a, "pinned_num_register_threads:2"));
  OK(cachalot_snapshot_json(e.a, &json));
  CONTAINS(json, "\"pinned_use_cuda_host_register\":true,\"pinned_num_register_threads\":2");
  free(json);
  env_free(&e);
}

/* Destroying the allocator waits for the pending events and gives back every block, allocated or not. */
static void test_destroy_gives_all_back(void **state) {
  (void)state;
  cachalot_backend *b = NULL;
  OK(cachalot_backend_sim(NULL, &b));
  cachalot_allocator *a = NULL;
  OK(cachalot_create(b, "", &a));
  cachalot_stream s = STREAM(b, 0);
  char *p = HALLOC(a, 4 * KiB), *q = HALLOC(a, 8 * KiB);
  HALLOC(a, 16 * KiB); /* never freed */
  OK(cachalot_sim_launch(b, s));
  OK(cachalot_host_record_event(a, p, 0, s));
  HFREE(a, p);
  HFREE(a, q);
  PINNED(b, 28 * KiB, 0);
  cachalot_destroy(a);
  PINNED(b, 0, 0);
  cachalot_backend_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding_and_reuse),
      cmocka_unit_test(test_streams_delay_reuse),
      cmocka_unit_test(test_empty_cache),
      cmocka_unit_test(test_register_path),
      cmocka_unit_test(test_oom),
      cmocka_unit_test(test_event_failure_at_free),
      cmocka_unit_test(test_misuse),
      cmocka_unit_test(test_stats_reset),
      cmocka_unit_test(test_settings_in_snapshot),
      cmocka_unit_test(test_destroy_gives_all_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
