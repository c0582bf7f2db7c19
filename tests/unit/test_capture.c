/* Stream capture on the simulated device (before private pools exist): a device allocation made while a
 * global-mode capture is underway must not fail (PyTorch's malloc, step 5: the thread's capture mode is
 * relaxed around the device call and restored after). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cachalot/cachalot.h>

#include <string.h>

#define MiB ((size_t)1 << 20)

static void new_segment_during_global_capture(void **state) {
  (void)state;
  cachalot_backend *b = NULL;
  cachalot_allocator *a = NULL;
  assert_int_equal(cachalot_backend_sim(NULL, &b), CACHALOT_OK);
  assert_int_equal(cachalot_create(b, "", &a), CACHALOT_OK);
  cachalot_stream cap, other;
  assert_int_equal(cachalot_sim_stream_create(b, 0, &cap), CACHALOT_OK);
  assert_int_equal(cachalot_sim_stream_create(b, 0, &other), CACHALOT_OK);
  assert_int_equal(cachalot_sim_capture_begin(b, cap, CACHALOT_CAPTURE_GLOBAL), CACHALOT_OK);

  /* the simulated device refuses a plain allocation now, as cudaMalloc does */
  cachalot_device_stats st;
  void *p = NULL, *q = NULL;
  assert_int_equal(cachalot_malloc(a, 0, 3 * MiB, other, &p), CACHALOT_OK);
  assert_non_null(p);
  assert_int_equal(cachalot_check(a), CACHALOT_OK);
  assert_int_equal(cachalot_malloc(a, 0, 100, cap, &q), CACHALOT_OK);
  assert_int_equal(cachalot_check(a), CACHALOT_OK);
  assert_int_equal(cachalot_memory_stats(a, 0, &st), CACHALOT_OK);
  assert_int_equal(st.num_device_alloc, 2);
  assert_int_equal(st.reserved_bytes[CACHALOT_STAT_ALL].current, (int64_t)(22 * MiB));

  assert_int_equal(cachalot_sim_capture_end(b, cap), CACHALOT_OK);
  assert_int_equal(cachalot_free(a, p), CACHALOT_OK);
  assert_int_equal(cachalot_free(a, q), CACHALOT_OK);
  assert_int_equal(cachalot_empty_cache(a), CACHALOT_OK);
  assert_int_equal(cachalot_check(a), CACHALOT_OK);
  assert_int_equal(cachalot_memory_stats(a, 0, &st), CACHALOT_OK);
  assert_int_equal(st.reserved_bytes[CACHALOT_STAT_ALL].current, 0);
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
}

static void sim_capture_state_errors(void **state) {
  (void)state;
  cachalot_backend *b = NULL;
  assert_int_equal(cachalot_backend_sim(NULL, &b), CACHALOT_OK);
  cachalot_stream cap;
  assert_int_equal(cachalot_sim_stream_create(b, 0, &cap), CACHALOT_OK);
  assert_int_equal(cachalot_sim_capture_begin(b, cap, CACHALOT_CAPTURE_GLOBAL), CACHALOT_OK);
  assert_int_equal(cachalot_sim_capture_begin(b, cap, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE);
  assert_int_equal(cachalot_sim_capture_begin(b, NULL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_int_equal(cachalot_sim_capture_end(b, cap), CACHALOT_OK);
  assert_int_equal(cachalot_sim_capture_end(b, cap), CACHALOT_ERROR_INVALID_STATE);
  cachalot_backend_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(new_segment_during_global_capture),
      cmocka_unit_test(sim_capture_state_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
