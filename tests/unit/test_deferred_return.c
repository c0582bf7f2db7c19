/* The deferred return (src/allocator/free.c, cl_lane's memo): a warm free of the block the lane's plain
 * warm malloc handed out last counts its stats at once but leaves the block where it is; a malloc of the
 * same rounded size takes it back, and anything else makes the return first. These tests watch the lane
 * take each of those ways, then hold the result to what the rules give without the deferral: pointers,
 * every current stat (cachalot_memory_stats and cachalot_check enter exclusive mode, which makes the
 * return first) and the requested bytes' peak. */
#include "helpers.h"

#include "allocator/internal.h"

static void *take(cachalot_allocator *a, size_t size, cachalot_stream s) {
  void *p = NULL;
  STATUS(cachalot_malloc(a, 0, size, s, &p), CACHALOT_OK);
  assert_non_null(p);
  return p;
}

static void give(cachalot_allocator *a, void *p) { STATUS(cachalot_free(a, p), CACHALOT_OK); }

/* A stream with a warm lane and one 2 MiB small segment cached, and the peaks that leave the warm paths
 * room for the steps below (a step that would pass a peak goes to exclusive mode). */
static cl_lane *warm_lane(env *e, cachalot_stream s) {
  FREE(e->a, ALLOC(e->a, 0, 512, s));
  void *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = ALLOC(e->a, 0, 64 << 10, s);
  for (int i = 0; i < 4; i++)
    FREE(e->a, p[i]);
  cl_lane *ln = cl_lane_find(&e->a->devices[0], s);
  assert_non_null(ln);
  assert_null(ln->memo);
  return ln;
}

static void same_size_comes_back(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cl_lane *ln = warm_lane(&e, s);
  void *p = take(e.a, 3600, s); /* 4096 rounded */
  assert_non_null(ln->memo);
  EQ(ln->memo->ptr, (uintptr_t)p);
  assert_false(ln->memo_freed);
  give(e.a, p);
  assert_true(ln->memo_freed);
  void *q = take(e.a, 4000, s); /* the same rounded size: the same block, no return */
  EQ((uintptr_t)q, (uintptr_t)p);
  assert_false(ln->memo_freed);
  EQ(ln->memo->ptr, (uintptr_t)p);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 4096, .active = 1, .active_b = 4096, .req_b = 4000, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 4096),
               PX0);
  CHECK(e.a);
  assert_null(ln->memo); /* exclusive mode forgets it */

  /* Another size after a deferred free: the return first, then best fit takes the merged block's front. */
  give(e.a, take(e.a, 4096, s)); /* q is no memo: this free is not deferred, but the malloc's is */
  give(e.a, q);
  q = take(e.a, 4096, s);
  EQ((uintptr_t)q, (uintptr_t)p);
  give(e.a, q);
  assert_true(ln->memo_freed);
  void *r = take(e.a, 8192, s);
  EQ((uintptr_t)r, (uintptr_t)p);
  assert_false(ln->memo_freed);
  EQ(ln->memo->ptr, (uintptr_t)r);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 8192, .active = 1, .active_b = 8192, .req_b = 8192, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 8192),
               PX0);
  CHECK(e.a);
  r = take(e.a, 8192, s);
  EQ((uintptr_t)r, (uintptr_t)p + 8192);
  give(e.a, r);
  assert_true(ln->memo_freed);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 8192, .active = 1, .active_b = 8192, .req_b = 8192, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 8192),
               PX0);
  CHECK(e.a);
  FREE(e.a, p);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);

  /* A smaller size after a deferred free: the return first too, and the front split anew to 512 B. */
  give(e.a, take(e.a, 4096, s));
  p = take(e.a, 4096, s);
  give(e.a, p);
  assert_true(ln->memo_freed);
  q = take(e.a, 100, s);
  EQ((uintptr_t)q, (uintptr_t)p);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 100, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 512),
               PX0);
  FREE(e.a, q);
  env_free(&e);
}

/* A free of another block makes the deferred return first: the neighbours it merges with are the real
 * ones. Here the last free leaves the whole segment free, no split block left. */
static void other_free_returns_first(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cl_lane *ln = warm_lane(&e, s);
  void *x = take(e.a, 4096, s), *y = take(e.a, 8192, s);
  EQ((uintptr_t)y, (uintptr_t)x + 4096);
  give(e.a, y);
  assert_true(ln->memo_freed);
  give(e.a, x);
  assert_false(ln->memo_freed);
  assert_null(ln->memo);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  CHECK(e.a);
  void *z = ALLOC(e.a, 0, MiB, s); /* the whole segment's front */
  EQ((uintptr_t)z, (uintptr_t)x);
  FREE(e.a, z);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  env_free(&e);
}

/* A block handed out whole (no split: a large segment of exactly its size) is deferred as well, and a
 * double free of a deferred block is still an error. */
static void whole_block_and_double_free(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  FREE(e.a, ALLOC(e.a, 0, 32 * MiB, s));
  cl_lane *ln = cl_lane_find(&e.a->devices[0], s);
  void *p = take(e.a, 32 * MiB, s);
  assert_non_null(ln->memo);
  give(e.a, p);
  assert_true(ln->memo_freed);
  STATUS(cachalot_free(e.a, p), CACHALOT_ERROR_INVALID_POINTER);
  assert_false(ln->memo_freed);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 32 * MiB));
  CHECK(e.a);
  void *q = take(e.a, 32 * MiB, s);
  give(e.a, q);
  q = take(e.a, 31 * MiB, s); /* 32 MiB rounded */
  EQ((uintptr_t)q, (uintptr_t)p);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 32 * MiB, .active = 1, .active_b = 32 * MiB, .req_b = 31 * MiB, .seg = 1,
                  .res_b = 32 * MiB));
  FREE(e.a, q);
  env_free(&e);
}

/* Each lane keeps its own memo. */
static void two_streams_keep_their_own(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  cl_lane *l1 = warm_lane(&e, s1), *l2 = warm_lane(&e, s2);
  void *p = ALLOC(e.a, 0, 4096, s1), *q = ALLOC(e.a, 0, 4096, s2); /* the split peak of both at once */
  FREE(e.a, p);
  FREE(e.a, q);
  p = take(e.a, 4096, s1);
  q = take(e.a, 4096, s2);
  give(e.a, p);
  give(e.a, q);
  assert_true(l1->memo_freed);
  assert_true(l2->memo_freed);
  EQ((uintptr_t)take(e.a, 4096, s2), (uintptr_t)q);
  EQ((uintptr_t)take(e.a, 4096, s1), (uintptr_t)p);
  assert_false(l1->memo_freed);
  assert_false(l2->memo_freed);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 2, .alloc_b = 8192, .active = 2, .active_b = 8192, .req_b = 8192, .seg = 2,
                  .res_b = 4 * MiB, .split = 2, .split_b = 4 * MiB - 8192),
               PX0);
  CHECK(e.a);
  FREE(e.a, p);
  FREE(e.a, q);
  env_free(&e);
}

/* With history on the warm paths record entries, with garbage collection set they count lookups: no memo
 * then (the blocks' age bases are stamped at the free). */
static void no_memo_with_history_or_gc(void **state) {
  (void)state;
  const char *confs[] = {"", "garbage_collection_threshold:0.5"};
  for (int i = 0; i < 2; i++) {
    env e = ENV(1, 0, confs[i]);
    if (i == 0)
      STATUS(cachalot_record_history(e.a, true, 1000), CACHALOT_OK);
    else
      STATUS(cachalot_set_memory_fraction(e.a, 0, 1.0), CACHALOT_OK);
    cachalot_stream s = STREAM(e.b, 0);
    cl_lane *ln = warm_lane(&e, s);
    void *p = take(e.a, 4096, s);
    assert_null(ln->memo);
    give(e.a, p);
    assert_false(ln->memo_freed);
    CHECK(e.a);
    env_free(&e);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_size_comes_back),
      cmocka_unit_test(other_free_returns_first),
      cmocka_unit_test(whole_block_and_double_free),
      cmocka_unit_test(two_streams_keep_their_own),
      cmocka_unit_test(no_memo_with_history_or_gc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
