/* Bad input: foreign, interior, freed and pending pointers; NULL out-pointers and allocators; devices out
 * of range; bad fractions; malformed configs; a non-simulated backend given to the simulator's controls;
 * the CUDA backend on a machine without a driver. Every misuse fails with the documented status and a
 * message, changes nothing, and the allocator keeps working (cachalot_check after every step). */
#include "helpers.h"

#include "allocator/backend/ops.h" /* to build a backend that is not the simulator */

#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

/* The allocator still works, and nothing it holds changed: a malloc/free round trip on a fresh stream
 * moves the stats and brings them back. */
static void still_works_(env *e, const char *file, int line) {
  check_(e->a, file, line);
  cachalot_device_stats before = stats_(e->a, 0, file, line);
  void *p = alloc_ok_(e->a, 0, 3000, NULL, file, line);
  cachalot_device_stats mid = stats_(e->a, 0, file, line);
  eq_i64_(mid.allocation[CACHALOT_STAT_ALL].current, before.allocation[CACHALOT_STAT_ALL].current + 1,
          "allocation.all.current after a malloc", file, line);
  eq_i64_(mid.allocated_bytes[CACHALOT_STAT_ALL].current, before.allocated_bytes[CACHALOT_STAT_ALL].current + 3072,
          "allocated_bytes.all.current after a malloc", file, line);
  free_ok_(e->a, p, file, line);
  cachalot_device_stats after = stats_(e->a, 0, file, line);
  eq_i64_(after.allocation[CACHALOT_STAT_ALL].current, before.allocation[CACHALOT_STAT_ALL].current,
          "allocation.all.current after the free", file, line);
  eq_i64_(after.active_bytes[CACHALOT_STAT_ALL].current, before.active_bytes[CACHALOT_STAT_ALL].current,
          "active_bytes.all.current after the free", file, line);
  eq_i64_(after.reserved_bytes[CACHALOT_STAT_ALL].current, (int64_t)used_(e->b, 0, file, line),
          "reserved_bytes vs device used", file, line);
}
#define STILL_WORKS(e) still_works_((e), __FILE__, __LINE__)

/* The stats are exactly as they were (a misuse changed nothing). */
static void same_stats_(cachalot_allocator *a, const cachalot_device_stats *before, const char *file, int line) {
  cachalot_device_stats now = stats_(a, 0, file, line);
  if (memcmp(before, &now, sizeof now) != 0) {
    print_error("%s:%d: the stats changed\n", file, line);
    _fail(file, line);
  }
}
#define SAME_STATS(a, before) same_stats_((a), &(before), __FILE__, __LINE__)

#define INVALID_PTR(call)                                                                                          \
  do {                                                                                                             \
    STATUS(call, CACHALOT_ERROR_INVALID_POINTER);                                                                  \
    CONTAINS(cachalot_last_error(), "invalid device pointer: 0x");                                               \
  } while (0)

static void test_bad_pointers(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  /* a second allocator on the same backend (its addresses are distinct), working on device 1 so that
   * device 0's reserved bytes stay comparable with the device's own count */
  env other = {e.b, NULL};
  OK(cachalot_create(e.b, "", &other.a));
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, 4 * MiB, s1);
  char *small = ALLOC(e.a, 0, 1000, s1);
  char *foreign = ALLOC(other.a, 1, 4 * MiB, NULL); /* another allocator's pointer */
  cachalot_device_stats before = STATS(e.a, 0);

  void *bad[] = {(void *)(uintptr_t)0x1000, p + 512, p + 4 * MiB, small + 512, small - 512, foreign};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    INVALID_PTR(cachalot_free(e.a, bad[i]));
    CHECK(e.a);
    INVALID_PTR(cachalot_record_stream(e.a, bad[i], s2));
    CHECK(e.a);
    SAME_STATS(e.a, before);
  }
  STILL_WORKS(&e);
  CHECK(other.a);

  /* already freed (and merged away) */
  FREE(e.a, small);
  before = STATS(e.a, 0);
  INVALID_PTR(cachalot_free(e.a, small));
  CHECK(e.a);
  INVALID_PTR(cachalot_record_stream(e.a, small, s2));
  CHECK(e.a);
  SAME_STATS(e.a, before);
  STILL_WORKS(&e);

  /* pending free: freed with a stream use whose event has not completed */
  RECORD(e.a, p, s2);
  FREE(e.a, p);
  before = STATS(e.a, 0);
  EQ(before.active[CACHALOT_STAT_ALL].current, 1);
  INVALID_PTR(cachalot_free(e.a, p));
  CHECK(e.a);
  CONTAINS(cachalot_last_error(), "already freed");
  INVALID_PTR(cachalot_record_stream(e.a, p, s1));
  CHECK(e.a);
  SAME_STATS(e.a, before);
  STILL_WORKS(&e);
  /* the pending block still completes normally, once */
  COMPLETE(&e, s2);
  void *q = ALLOC(e.a, 0, 4 * MiB, s1);
  assert_ptr_equal(q, p);
  FREE(e.a, q);
  INVALID_PTR(cachalot_free(e.a, q));
  CHECK(e.a);
  /* small: the s1 segment and the default stream's (STILL_WORKS) */
  EXPECT_POOLS(e.a, 0, PX(.seg = 2, .res_b = 4 * MiB), PX(.seg = 1, .res_b = 20 * MiB));

  /* NULL is a no-op for free, but not a pointer for record_stream */
  OK(cachalot_free(e.a, NULL));
  CHECK(e.a);
  INVALID_PTR(cachalot_record_stream(e.a, NULL, s1));
  CHECK(e.a);

  /* the other allocator's pointer is fine over there */
  FREE(other.a, foreign);
  STILL_WORKS(&e);
  cachalot_destroy(other.a);
  env_free(&e);
}

/* The page map holds the low 48 bits of the address space (where CUDA puts device memory); the
 * simulator places device 4's memory above that, where free() and record_stream find their blocks by
 * scanning the segment list instead. Everything must work the same there, errors included. */
static void test_addresses_above_the_page_map(void **state) {
  (void)state;
  env e = ENV(5, 0, "");
  cachalot_stream s = STREAM(e.b, 4), s2 = STREAM(e.b, 4);
  char *small = ALLOC(e.a, 4, 1000, s);
  char *large = ALLOC(e.a, 4, 4 * MiB, s);
  assert_true((uintptr_t)small >> 48 != 0 && (uintptr_t)large >> 48 != 0);
  char *near = ALLOC(e.a, 4, 1000, s);
  assert_ptr_equal(near, small + 1024);
  EXPECT_POOLS(e.a, 4, PX(.alloc = 2, .alloc_b = 2048, .active = 2, .active_b = 2048, .req_b = 2000, .seg = 1,
                          .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 2048),
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 16 * MiB));
  INVALID_PTR(cachalot_free(e.a, small + 512));
  INVALID_PTR(cachalot_record_stream(e.a, large + 512, s2));
  CHECK(e.a);
  RECORD(e.a, large, s2);
  FREE(e.a, small);
  INVALID_PTR(cachalot_free(e.a, small));
  FREE(e.a, large);
  INVALID_PTR(cachalot_free(e.a, large));
  CONTAINS(cachalot_last_error(), "already freed");
  COMPLETE(&e, s2);
  /* both come back from the cache */
  assert_ptr_equal(ALLOC(e.a, 4, 1000, s), small);
  assert_ptr_equal(ALLOC(e.a, 4, 4 * MiB, s), large);
  FREE(e.a, small);
  FREE(e.a, large);
  FREE(e.a, near);
  EXPECT_POOLS(e.a, 4, PX(.seg = 1, .res_b = 2 * MiB), PX(.seg = 1, .res_b = 20 * MiB));
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 4, PX0, PX0);
  EQ(USED(e.b, 4), 0);
  env_free(&e);
}

static void test_null_allocator_and_out_pointers(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  void *p = (void *)(uintptr_t)0x1;
  cachalot_device_stats st;
  int n = 7;
  char *json = NULL;
  (void)json;

  /* NULL allocator: every entry point says so, and clears what it can */
  STATUS(cachalot_malloc(NULL, 0, 512, NULL, &p), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "allocator is NULL");
  STATUS(cachalot_free(NULL, (void *)(uintptr_t)0x1000), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_free(NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_record_stream(NULL, (void *)(uintptr_t)0x1000, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_empty_cache(NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_set_memory_fraction(NULL, 0, 0.5), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_set_settings(NULL, ""), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_attach_oom_observer(NULL, NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  memset(&st, 0x5a, sizeof st);
  STATUS(cachalot_memory_stats(NULL, 0, &st), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(st.num_ooms, 0);
  EQ(st.max_split_size, 0);
  STATUS(cachalot_reset_peak_stats(NULL, 0), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_reset_accumulated_stats(NULL, 0), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_check(NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  unsigned char handle[64];
  size_t offset = 7;
  STATUS(cachalot_ipc_handle(NULL, (void *)(uintptr_t)0x1000, handle, &offset), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(offset, 0);
  const cachalot_mempool_id pool = {0, 1};
  STATUS(cachalot_pool_set_no_split(NULL, 0, pool), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_set_use_on_oom(NULL, 0, pool, true), CACHALOT_ERROR_INVALID_ARGUMENT);
  const cachalot_segment_source src = {0};
  STATUS(cachalot_pool_set_source(NULL, 0, pool, &src), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_device_count(NULL, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(n, 0);
  cachalot_destroy(NULL); /* no-op */
  cachalot_backend_destroy(NULL);
  CHECK(e.a);

  /* NULL out-pointers */
  STATUS(cachalot_malloc(e.a, 0, 512, NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "out is NULL");
  CHECK(e.a);
  STATUS(cachalot_memory_stats(e.a, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_device_count(e.a, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_create(e.b, "", NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_backend_sim(NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_backend_device_count(e.b, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_stream_create(e.b, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_device_used(e.b, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_backend_cuda(NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  n = 7;
  STATUS(cachalot_backend_device_count(NULL, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(n, 0);
  cachalot_allocator *a2 = (cachalot_allocator *)(uintptr_t)0x1;
  STATUS(cachalot_create(NULL, "", &a2), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(a2);
  STATUS(cachalot_set_settings(e.a, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_attach_oom_observer(e.a, NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CHECK(e.a);
  STILL_WORKS(&e);
  env_free(&e);
}

static void test_device_out_of_range(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_device_stats before = STATS(e.a, 0);
  const int bad[] = {-1, 1, 64, -2147483647 - 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    void *p = (void *)(uintptr_t)0x1;
    STATUS(cachalot_malloc(e.a, bad[i], 512, NULL, &p), CACHALOT_ERROR_INVALID_ARGUMENT);
    assert_null(p);
    CONTAINS(cachalot_last_error(), "out of range");
    CHECK(e.a);
    cachalot_device_stats st;
    memset(&st, 0x5a, sizeof st);
    STATUS(cachalot_memory_stats(e.a, bad[i], &st), CACHALOT_ERROR_INVALID_ARGUMENT);
    EQ(st.allocation[CACHALOT_STAT_ALL].current, 0);
    STATUS(cachalot_reset_peak_stats(e.a, bad[i]), CACHALOT_ERROR_INVALID_ARGUMENT);
    STATUS(cachalot_reset_accumulated_stats(e.a, bad[i]), CACHALOT_ERROR_INVALID_ARGUMENT);
    STATUS(cachalot_set_memory_fraction(e.a, bad[i], 0.5), CACHALOT_ERROR_INVALID_ARGUMENT);
    cachalot_stream s = (cachalot_stream)(uintptr_t)0x1;
    STATUS(cachalot_sim_stream_create(e.b, bad[i], &s), CACHALOT_ERROR_INVALID_ARGUMENT);
    assert_null(s);
    size_t used = 7;
    STATUS(cachalot_sim_device_used(e.b, bad[i], &used), CACHALOT_ERROR_INVALID_ARGUMENT);
    EQ(used, 0);
    CHECK(e.a);
    SAME_STATS(e.a, before);
  }
  STILL_WORKS(&e);
  env_free(&e);
}

static void test_bad_fractions(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "");
  cachalot_device_stats before = STATS(e.a, 0);
  const double bad[] = {-0.1, 1.5, NAN, INFINITY, -INFINITY, 1.0000001, -1e-300};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    STATUS(cachalot_set_memory_fraction(e.a, 0, bad[i]), CACHALOT_ERROR_INVALID_ARGUMENT);
    CONTAINS(cachalot_last_error(), "fraction");
    CHECK(e.a);
  }
  SAME_STATS(e.a, before);
  /* no limit was set: 60 MiB of 64 can be had */
  void *a = ALLOC(e.a, 0, 30 * MiB, NULL);
  void *b = ALLOC(e.a, 0, 30 * MiB, NULL);
  FREE(e.a, a);
  FREE(e.a, b);
  /* the edges are valid: 0 refuses every new segment, 1 is the whole device */
  OK(cachalot_set_memory_fraction(e.a, 0, 0.0));
  CHECK(e.a);
  void *x = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 61 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY); /* cached: released first */
  CONTAINS(cachalot_last_error(), "0 bytes allowed; ");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 2, 2, 1, 1, 1);
  OK(cachalot_set_memory_fraction(e.a, 0, 1.0));
  CHECK(e.a);
  void *y = ALLOC(e.a, 0, 62 * MiB, NULL);
  FREE(e.a, y);
  STILL_WORKS(&e);
  env_free(&e);
}

static void test_malformed_config_at_create(void **state) {
  (void)state;
  cachalot_backend *b = NULL;
  OK(cachalot_backend_sim(NULL, &b));
  static const struct {
    const char *conf;
    cachalot_status st;
    const char *names; /* the message names this */
  } cases[] = {
      {"bogus:1", CACHALOT_ERROR_CONFIG, "bogus"},
      {"max_split_size_mb:19", CACHALOT_ERROR_CONFIG, "max_split_size_mb"},
      {"max_split_size_mb:-40", CACHALOT_ERROR_CONFIG, "max_split_size_mb"},
      {"max_split_size_mb", CACHALOT_ERROR_CONFIG, "max_split_size_mb"},
      {"max_split_size_mb:", CACHALOT_ERROR_CONFIG, "max_split_size_mb"},
      {"max_non_split_rounding_mb:10", CACHALOT_ERROR_CONFIG, "max_non_split_rounding_mb"},
      {"garbage_collection_threshold:1.0", CACHALOT_ERROR_CONFIG, "garbage_collection_threshold"},
      {"garbage_collection_threshold:0", CACHALOT_ERROR_CONFIG, "garbage_collection_threshold"},
      {"garbage_collection_threshold:nan", CACHALOT_ERROR_CONFIG, "garbage_collection_threshold"},
      {"per_process_memory_fraction:1.5", CACHALOT_ERROR_CONFIG, "per_process_memory_fraction"},
      {"per_process_memory_fraction:-0.1", CACHALOT_ERROR_CONFIG, "per_process_memory_fraction"},
      {"roundup_power2_divisions:3", CACHALOT_ERROR_CONFIG, "roundup_power2_divisions"},
      {"roundup_power2_divisions:[64:8", CACHALOT_ERROR_CONFIG, "roundup_power2_divisions"},
      {"roundup_power2_divisions:[63:8]", CACHALOT_ERROR_CONFIG, "roundup_power2_divisions"},
      {"expandable_segments:yes", CACHALOT_ERROR_CONFIG, "expandable_segments"},
      {"release_lock_on_cudamalloc:true", CACHALOT_ERROR_CONFIG, "release_lock_on_cudamalloc"},
      {"max_split_size_mb:40 max_split_size_mb:60", CACHALOT_ERROR_CONFIG, "max_split_size_mb"},
      {"max_split_size_mb:40,,", CACHALOT_ERROR_CONFIG, "expected a key"},
      {":", CACHALOT_ERROR_CONFIG, "expected a key"},
      {"]", CACHALOT_ERROR_CONFIG, "]"},
      {"max_split_size_mb:40,bogus:1", CACHALOT_ERROR_CONFIG, "bogus"},
      {"expandable_segments:1", CACHALOT_ERROR_CONFIG, "expandable_segments"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cachalot_allocator *a = (cachalot_allocator *)(uintptr_t)0x1;
    cachalot_status st = cachalot_create(b, cases[i].conf, &a);
    if (st != cases[i].st)
      fail_msg("'%s': %s, expected %s (%s)", cases[i].conf, cachalot_status_name(st),
               cachalot_status_name(cases[i].st), cachalot_last_error());
    assert_null(a);
    CONTAINS(cachalot_last_error(), cases[i].names);
  }
  /* the environment is read when conf is NULL */
  setenv("CACHALOT_ALLOC_CONF", "max_split_size_mb:10", 1);
  cachalot_allocator *a = (cachalot_allocator *)(uintptr_t)0x1;
  STATUS(cachalot_create(b, NULL, &a), CACHALOT_ERROR_CONFIG);
  assert_null(a);
  CONTAINS(cachalot_last_error(), "max_split_size_mb");
  setenv("CACHALOT_ALLOC_CONF", "max_split_size_mb:64", 1);
  OK(cachalot_create(b, NULL, &a));
  CHECK(a);
  EQ(STATS(a, 0).max_split_size, 64 * MiB);
  cachalot_destroy(a);
  unsetenv("CACHALOT_ALLOC_CONF");
  OK(cachalot_create(b, NULL, &a));
  EQ(STATS(a, 0).max_split_size, -1);
  env e = {b, a};
  STILL_WORKS(&e);
  env_free(&e);
}

/* ---- a backend that is not the simulator ---- */

static void fake_destroy(cachalot_backend *b) { (void)b; }
static const cl_backend_ops fake_ops = {.name = "fake", .destroy = fake_destroy};

static void test_sim_controls_reject_other_backends(void **state) {
  (void)state;
  cachalot_backend fake = {&fake_ops, 1};
  cachalot_stream s = (cachalot_stream)(uintptr_t)0x1;
  size_t used = 7;
  STATUS(cachalot_sim_stream_create(&fake, 0, &s), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  CONTAINS(cachalot_last_error(), "not a simulated backend");
  CONTAINS(cachalot_last_error(), "fake");
  STATUS(cachalot_sim_stream_complete(&fake, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "not a simulated backend");
  STATUS(cachalot_sim_fail_device_allocs(&fake, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_every(&fake, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_events(&fake, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_device_used(&fake, 0, &used), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(used, 0);
  STATUS(cachalot_sim_capture_begin(&fake, (cachalot_stream)(uintptr_t)0x10, CACHALOT_CAPTURE_GLOBAL),
         CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_capture_end(&fake, (cachalot_stream)(uintptr_t)0x10), CACHALOT_ERROR_INVALID_ARGUMENT);
  /* NULL backends too */
  STATUS(cachalot_sim_stream_complete(NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_device_allocs(NULL, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_every(NULL, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_events(NULL, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  s = (cachalot_stream)(uintptr_t)0x1;
  STATUS(cachalot_sim_stream_create(NULL, 0, &s), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(s);

  /* bad arguments to a real simulator change nothing */
  env e = ENV(1, 0, "");
  STATUS(cachalot_sim_fail_device_allocs(e.b, -1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_every(e.b, -3), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_fail_events(e.b, -1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_sim_stream_complete(e.b, (cachalot_stream)(uintptr_t)0x4242), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "unknown simulated stream");
  CHECK(e.a);
  STILL_WORKS(&e);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0); /* no injected failure is pending */
  env_free(&e);

  /* bad simulator options create nothing */
  const cachalot_sim_options bad_opts[] = {
      {.device_count = 0, .capacity_bytes = GiB},
      {.device_count = 65, .capacity_bytes = GiB},
      {.device_count = -1, .capacity_bytes = GiB},
      {.device_count = 1, .capacity_bytes = 0},
  };
  for (size_t i = 0; i < sizeof bad_opts / sizeof bad_opts[0]; i++) {
    cachalot_backend *b = (cachalot_backend *)(uintptr_t)0x1;
    STATUS(cachalot_backend_sim(&bad_opts[i], &b), CACHALOT_ERROR_INVALID_ARGUMENT);
    assert_null(b);
  }
}

static void test_cuda_backend_without_driver(void **state) {
  (void)state;
  cachalot_backend *b = (cachalot_backend *)(uintptr_t)0x1;
  cachalot_status st = cachalot_backend_cuda(&b);
  if (st == CACHALOT_OK) {
    /* a machine with a GPU: nothing to test here, but the backend must be a usable one */
    int n = 0;
    OK(cachalot_backend_device_count(b, &n));
    assert_true(n >= 1);
    cachalot_backend_destroy(b);
    skip();
  }
  if (st != CACHALOT_ERROR_DEVICE && st != CACHALOT_ERROR_NOT_SUPPORTED)
    fail_msg("cachalot_backend_cuda: %s (%s)", cachalot_status_name(st), cachalot_last_error());
  assert_null(b);
  CONTAINS(cachalot_last_error(), "cachalot_backend_sim");
  if (st == CACHALOT_ERROR_DEVICE)
    CONTAINS(cachalot_last_error(), "no usable CUDA device");
  /* the simulated backend is unaffected */
  env e = ENV(1, 0, "");
  STILL_WORKS(&e);
  env_free(&e);
}

static void test_status_names(void **state) {
  (void)state;
  STR_EQ(cachalot_status_name(CACHALOT_OK), "CACHALOT_OK");
  STR_EQ(cachalot_status_name(CACHALOT_ERROR_INVALID_POINTER), "CACHALOT_ERROR_INVALID_POINTER");
  STR_EQ(cachalot_status_name((cachalot_status)99), "CACHALOT_STATUS_UNKNOWN");
  assert_non_null(cachalot_last_error());
}

/* A child forked after the allocator was used: every call fails with a message that says why, the warm
 * paths too (a cached block would otherwise be handed out: the parent's device memory, no CUDA context in
 * the child); the parent goes on as before. */
static void test_forked_child_fails_clearly(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  void *keep = ALLOC(e.a, 0, 1000, s);
  FREE(e.a, ALLOC(e.a, 0, 1000, s)); /* a cached block the warm path would hand out */
  pid_t pid = fork();
  if (pid == 0) {
    void *p = (void *)1;
    int rc = 0;
    if (cachalot_malloc(e.a, 0, 1000, s, &p) != CACHALOT_ERROR_DEVICE || p)
      rc = 1;
    else if (!strstr(cachalot_last_error(), "forked after cachalot was used"))
      rc = 2;
    else if (cachalot_free(e.a, keep) != CACHALOT_ERROR_DEVICE)
      rc = 3;
    else if (cachalot_empty_cache(e.a) != CACHALOT_ERROR_DEVICE)
      rc = 4;
    else if (cachalot_record_stream(e.a, keep, s) != CACHALOT_ERROR_DEVICE)
      rc = 5;
    _exit(rc);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  void *p = ALLOC(e.a, 0, 1000, s); /* the parent: the warm path as before */
  FREE(e.a, p);
  FREE(e.a, keep);
  EMPTY(e.a);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_pointers),
      cmocka_unit_test(test_forked_child_fails_clearly),
      cmocka_unit_test(test_addresses_above_the_page_map),
      cmocka_unit_test(test_null_allocator_and_out_pointers),
      cmocka_unit_test(test_device_out_of_range),
      cmocka_unit_test(test_bad_fractions),
      cmocka_unit_test(test_malformed_config_at_create),
      cmocka_unit_test(test_sim_controls_reject_other_backends),
      cmocka_unit_test(test_cuda_backend_without_driver),
      cmocka_unit_test(test_status_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
