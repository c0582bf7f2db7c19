/* Capture detection (detect_captures:True): mallocs on a stream being captured go to a private pool of
 * that capture, which keeps its memory after the capture until cachalot_release_capture_pools. Exact
 * byte counts as PyTorch's rules give them: 1 MiB requests are small blocks, each 2 MiB small segment holds
 * two. */
#include "helpers.h"

#include "allocator/backend/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How many segments the snapshot puts in pool {first, 0}. */
static int segments_in_pool(cachalot_allocator *a, unsigned first) {
  char *json = NULL, key[64];
  OK(cachalot_snapshot_json(a, &json));
  snprintf(key, sizeof key, "\"segment_pool_id\":[%u,0]", first);
  int n = 0;
  for (const char *p = json; (p = strstr(p, key)); p++)
    n++;
  free(json);
  return n;
}

static void capture_begin(env *e, cachalot_stream s) { OK(cachalot_sim_capture_begin(e->b, s, CACHALOT_CAPTURE_GLOBAL)); }
static void capture_end(env *e, cachalot_stream s) { OK(cachalot_sim_capture_end(e->b, s)); }

/* A capture's mallocs never take the default pool's cached blocks, reuse what they free among
 * themselves, and their memory is not handed to anyone else after the capture. */
static void capture_gets_its_own_pool(void **state) {
  (void)state;
  env e = ENV(1, 0, "detect_captures:True");
  cachalot_stream s = STREAM(e.b, 0);
  void *a = ALLOC(e.a, 0, 1 * MiB, s);
  FREE(e.a, a); /* cached: a 2 MiB segment of the default pool, all free */
  CHECK(e.a);
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 2 * MiB);

  capture_begin(&e, s);
  void *b = ALLOC(e.a, 0, 1 * MiB, s);
  CHECK(e.a);
  assert_ptr_not_equal(b, a); /* without detection it would be `a` (the capture would then own it) */
  cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.reserved_bytes[0].current, 4 * MiB); /* a segment of the capture's own */
  EQ(st.segment[0].current, 2);
  EQ(st.allocated_bytes[0].current, 1 * MiB);
  FREE(e.a, b); /* freed during the capture: back to the capture's pool */
  void *c = ALLOC(e.a, 0, 1 * MiB, s);
  assert_ptr_equal(c, b); /* reused within the capture */
  void *c2 = ALLOC(e.a, 0, 1 * MiB, s); /* the second half of the capture's segment */
  EQ((char *)c2 - (char *)c, 1 * MiB);
  CHECK(e.a);
  capture_end(&e, s);

  /* after the capture: the default pool again */
  void *d = ALLOC(e.a, 0, 1 * MiB, s);
  assert_ptr_equal(d, a);
  FREE(e.a, c);
  FREE(e.a, c2);
  CHECK(e.a);
  /* the capture's memory is free but kept for the graph: another request does not get it */
  void *f = ALLOC(e.a, 0, 1 * MiB, s);
  EQ((char *)f - (char *)d, 1 * MiB); /* the default segment's other half */
  void *g = ALLOC(e.a, 0, 1 * MiB, s);
  assert_true(g != b && g != c2);
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 6 * MiB); /* a new default segment, not the capture's */
  FREE(e.a, d);
  FREE(e.a, f);
  FREE(e.a, g);
  EMPTY(e.a); /* the default pool's segments go; the capture's stays */
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 2 * MiB);
  CHECK(e.a);
  OK(cachalot_release_capture_pools(e.a, 0));
  EMPTY(e.a);
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 0);
  EQ(USED(e.b, 0), 0);
  CHECK(e.a);
  env_free(&e);
}

/* Without the key a malloc during a capture takes the default pool's cached block: the case the key is
 * for (a graph would own memory the allocator hands out again). */
static void without_detection_the_cache_is_used(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  void *a = ALLOC(e.a, 0, 1 * MiB, s);
  FREE(e.a, a);
  capture_begin(&e, s);
  void *b = ALLOC(e.a, 0, 1 * MiB, s);
  assert_ptr_equal(b, a);
  FREE(e.a, b);
  capture_end(&e, s);
  CHECK(e.a);
  env_free(&e);
}

/* A side stream joined into the capture shares its pool; each capture gets a pool of its own; releasing
 * leaves the pool of a capture still underway alone. */
static void side_streams_and_second_capture(void **state) {
  (void)state;
  env e = ENV(1, 0, "detect_captures:True");
  cachalot_backend *be = e.b;
  cachalot_stream s = STREAM(e.b, 0), t = STREAM(e.b, 0);
  capture_begin(&e, s);
  void *x = ALLOC(e.a, 0, 1 * MiB, s);
  OK(be->ops->stream_wait(be, 0, t, s)); /* t joins s's capture */
  void *y = ALLOC(e.a, 0, 1 * MiB, t);
  /* the same pool (its free blocks are per stream, as everywhere: a segment of t's own) */
  EQ(STATS(e.a, 0).segment[0].current, 2);
  EQ(segments_in_pool(e.a, 1), 2);
  OK(be->ops->stream_wait(be, 0, s, t)); /* joined back */
  capture_end(&e, s);
  FREE(e.a, x);
  FREE(e.a, y);
  CHECK(e.a);

  capture_begin(&e, s); /* a second capture: a pool of its own, the first one's memory stays put */
  void *z = ALLOC(e.a, 0, 1 * MiB, s);
  assert_true(z != x && z != y);
  EQ(STATS(e.a, 0).segment[0].current, 3);
  EQ(segments_in_pool(e.a, 2), 1);
  OK(cachalot_release_capture_pools(e.a, 0)); /* only the first (over) is given up */
  EMPTY(e.a);                                   /* empty_cache frees nothing during a capture */
  EQ(STATS(e.a, 0).segment[0].current, 3);
  FREE(e.a, z);
  capture_end(&e, s);
  EMPTY(e.a);
  EQ(STATS(e.a, 0).segment[0].current, 1); /* the first capture's went; the second's stays */
  EQ(segments_in_pool(e.a, 2), 1);
  OK(cachalot_release_capture_pools(e.a, 0));
  EMPTY(e.a);
  EQ(STATS(e.a, 0).segment[0].current, 0);
  CHECK(e.a);
  env_free(&e);
}

/* The routing ends by itself after the capture (the warm paths come back), found by a free as well as
 * a malloc; the key can be turned on and off at run time; misuse is refused. */
static void routing_ends_and_key(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  OK(cachalot_set_settings(e.a, "detect_captures:True"));
  capture_begin(&e, s);
  void *x = ALLOC(e.a, 0, 4 * KiB, s);
  capture_end(&e, s);
  FREE(e.a, x); /* the free finds the capture over and ends its routing */
  void *y = ALLOC(e.a, 0, 4 * KiB, s);
  void *w = ALLOC(e.a, 0, 4 * KiB, s);
  EQ(STATS(e.a, 0).segment[0].current, 2); /* y came from a default segment, not the capture's */
  assert_true(y != x);
  FREE(e.a, y);
  FREE(e.a, w);
  OK(cachalot_set_settings(e.a, "detect_captures:False"));
  capture_begin(&e, s);
  void *v = ALLOC(e.a, 0, 4 * KiB, s);
  assert_ptr_equal(v, y); /* off again: the cached block */
  FREE(e.a, v);
  capture_end(&e, s);
  STATUS(cachalot_set_settings(e.a, "detect_captures:maybe"), CACHALOT_ERROR_CONFIG);
  CONTAINS(cachalot_last_error(), "detect_captures");
  STATUS(cachalot_release_capture_pools(e.a, 1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_release_capture_pools(NULL, 0), CACHALOT_ERROR_INVALID_ARGUMENT);
  OK(cachalot_release_capture_pools(e.a, 0));
  EMPTY(e.a);
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 0);
  CHECK(e.a);
  env_free(&e);
}

/* A capture the device has invalidated shows no id: no pool can be chosen, and the malloc says so. */
static void invalidated_capture_refused(void **state) {
  (void)state;
  env e = ENV(1, 0, "detect_captures:True");
  cachalot_backend *be = e.b;
  cachalot_stream s = STREAM(e.b, 0), u = STREAM(e.b, 0);
  OK(be->ops->capture_begin(be, 0, u, CACHALOT_CAPTURE_GLOBAL));
  cl_graph *g = NULL;
  size_t n = 0;
  OK(be->ops->capture_end(be, 0, u, &g, &n));
  cl_graph_exec *x = NULL;
  OK(be->ops->graph_instantiate(be, 0, g, &x));
  capture_begin(&e, s);
  STATUS(be->ops->graph_launch(be, 0, x, s), CACHALOT_ERROR_DEVICE); /* a launch into a capture breaks it */
  void *p = (void *)1;
  STATUS(cachalot_malloc(e.a, 0, 4 * KiB, s, &p), CACHALOT_ERROR_INVALID_STATE);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "invalidated");
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 0);
  STATUS(cachalot_sim_capture_end(e.b, s), CACHALOT_ERROR_DEVICE); /* ends it, without a graph */
  void *q = ALLOC(e.a, 0, 4 * KiB, s); /* and the stream allocates as usual again */
  FREE(e.a, q);
  CHECK(e.a);
  be->ops->graph_exec_destroy(be, x);
  be->ops->graph_destroy(be, g);
  env_free(&e);
}

/* A cachalot_graph routes its capture itself: its pool wins over a detected one. A stream forgotten
 * after its capture ends the capture's routing and is not asked again. */
static void graph_pool_wins_and_forget(void **state) {
  (void)state;
  env e = ENV(1, 0, "detect_captures:True");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = NULL;
  OK(cachalot_graph_create(e.a, 0, false, &g));
  const cachalot_mempool_id shared = cachalot_graph_pool_handle(e.a);
  OK(cachalot_graph_capture_begin(g, s, shared, CACHALOT_CAPTURE_GLOBAL));
  void *x = ALLOC(e.a, 0, 1 * MiB, s);
  EQ(segments_in_pool(e.a, 1), 0); /* no detected pool {1,0} */
  char *json = NULL, key[64];
  OK(cachalot_snapshot_json(e.a, &json));
  snprintf(key, sizeof key, "\"segment_pool_id\":[0,%u]", (unsigned)shared.second);
  assert_non_null(strstr(json, key)); /* the graph's own pool */
  free(json);
  FREE(e.a, x);
  OK(cachalot_graph_capture_end(g));
  cachalot_graph_destroy(g);
  CHECK(e.a);

  capture_begin(&e, s); /* a capture cachalot only detects */
  void *y = ALLOC(e.a, 0, 4 * KiB, s);
  capture_end(&e, s);
  OK(cachalot_forget_stream(e.a, s)); /* ends the routing at once */
  FREE(e.a, y);
  OK(cachalot_release_capture_pools(e.a, 0));
  EMPTY(e.a);
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 0);
  STATUS(cachalot_forget_stream(NULL, s), CACHALOT_ERROR_INVALID_ARGUMENT);
  OK(cachalot_forget_stream(e.a, NULL)); /* a stream that never captured: nothing to do */
  CHECK(e.a);
  env_free(&e);
}

/* A block used by a stream and freed there once a capture of it has begun, before the capture's first malloc
 * (the interposer's captured cudaFreeAsync: record_stream, then free): no capture is routed yet, but the
 * event would be recorded into the capture and never complete (empty_cache failing for good, the block's
 * memory lost). It waits until the capture is over. */
static void free_on_captured_stream_before_first_malloc(void **state) {
  (void)state;
  env e = ENV(1, 0, "detect_captures:True");
  cachalot_stream s = STREAM(e.b, 0), a = STREAM(e.b, 0);
  void *x = ALLOC(e.a, 0, 1000, a);
  capture_begin(&e, s);
  OK(cachalot_record_stream(e.a, x, s));
  FREE(e.a, x);
  void *y = ALLOC(e.a, 0, 1000, s); /* the capture's first malloc: its own pool, never x */
  assert_ptr_not_equal(y, x);
  FREE(e.a, y);
  capture_end(&e, s);
  OK(cachalot_forget_stream(e.a, s));
  OK(cachalot_release_capture_pools(e.a, 0));
  OK(cachalot_sim_stream_complete(e.b, s));
  EMPTY(e.a);
  OK(cachalot_sim_stream_complete(e.b, s));
  EMPTY(e.a);
  EQ(STATS(e.a, 0).reserved_bytes[0].current, 0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(capture_gets_its_own_pool),
      cmocka_unit_test(free_on_captured_stream_before_first_malloc),
      cmocka_unit_test(without_detection_the_cache_is_used),
      cmocka_unit_test(side_streams_and_second_capture),
      cmocka_unit_test(routing_ends_and_key),
      cmocka_unit_test(invalidated_capture_refused),
      cmocka_unit_test(graph_pool_wins_and_forget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
