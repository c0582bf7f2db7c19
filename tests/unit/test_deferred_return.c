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

/* Every current stat with one block of `size` bytes (`req` asked for) handed out of the one 2 MiB small
 * segment, the rest of it one free block. */
#define EXPECT_ONE_SMALL(a, size, req)                                                                       \
  EXPECT_POOLS((a), 0,                                                                                       \
               PX(.alloc = 1, .alloc_b = (size), .active = 1, .active_b = (size), .req_b = (req), .seg = 1,  \
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - (size)),                                \
               PX0)

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
  EXPECT_ONE_SMALL(e.a, 4096, 4000);
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
  EXPECT_ONE_SMALL(e.a, 8192, 8192);
  CHECK(e.a);
  r = take(e.a, 8192, s);
  EQ((uintptr_t)r, (uintptr_t)p + 8192);
  give(e.a, r);
  assert_true(ln->memo_freed);
  EXPECT_ONE_SMALL(e.a, 8192, 8192);
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
  EXPECT_ONE_SMALL(e.a, 512, 100);
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

/* The block that starts at p, whatever its state. */
static const cl_block *block_at(const cl_device *d, const void *p) {
  for (const cl_segment *seg = d->segments; seg; seg = seg->next)
    for (const cl_block *b = seg->head; b; b = b->next)
      if (b->ptr == (uintptr_t)p)
        return b;
  fail();
  return NULL;
}

/* With history on, the deferred free and the hand-out again record the entries of a free and a malloc. */
static void memo_with_history(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  STATUS(cachalot_record_history(e.a, true, 1000), CACHALOT_OK);
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0);
  cl_lane *ln = warm_lane(&e, s);
  void *p = take(e.a, 4096, s);
  give(e.a, p);
  assert_true(ln->memo_freed);
  void *q = take(e.a, 4000, s);
  EQ((uintptr_t)q, (uintptr_t)p);
  give(e.a, q);
  assert_true(ln->memo_freed);
  const cl_trace *t = &d->trace;
  static const struct {
    cl_trace_action action;
    uint64_t size;
  } want[] = {{CL_TRACE_ALLOC, 4096},         {CL_TRACE_FREE_REQUESTED, 4096}, {CL_TRACE_FREE_COMPLETED, 4096},
              {CL_TRACE_ALLOC, 4000},         {CL_TRACE_FREE_REQUESTED, 4000}, {CL_TRACE_FREE_COMPLETED, 4000}};
  const size_t n = sizeof want / sizeof want[0];
  assert_true(t->count >= n);
  for (size_t i = 0; i < n; i++) {
    const cl_trace_entry *en = &t->entries[(t->head + t->count - n + i) % t->cap];
    EQ(en->action, want[i].action);
    EQ(en->addr, (uintptr_t)p);
    EQ(en->size, want[i].size);
  }
  CHECK(e.a);
  env_free(&e);
}

/* While a block waits for its event on a busy stream (the warm malloc skips polls that could change
 * nothing), the memo serves pairs; once the event is done, the malloc that polls makes the return first,
 * and the block comes back merged. */
static void memo_beside_a_pending_block(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, MiB, s);
  RECORD(e.a, p, side);
  FREE(e.a, p);
  for (int i = 0; i < CL_POLLS_BEFORE_WATCH + 1; i++) /* polls until the event is watched, then warm */
    FREE(e.a, ALLOC(e.a, 0, 4096, s));
  EQ(d->n_unwatched, 0);
  cl_lane *ln = cl_lane_find(d, s);
  EQ(atomic_load(&ln->warm) & (CL_WARM_POLL | CL_WARM_WATCH), CL_WARM_POLL | CL_WARM_WATCH);
  void *q = take(e.a, 4096, s);
  EQ((uintptr_t)q, (uintptr_t)(p + MiB));
  give(e.a, q);
  assert_true(ln->memo_freed);
  EQ((uintptr_t)take(e.a, 4096, s), (uintptr_t)q);
  give(e.a, q);
  assert_true(ln->memo_freed);
  COMPLETE(&e, side); /* (its check makes the return) */
  void *x = ALLOC(e.a, 0, 4096, s); /* polls: the block is back, merged, and best fit starts the segment */
  EQ((uintptr_t)x, (uintptr_t)p);
  EXPECT_ONE_SMALL(e.a, 4096, 4096);
  FREE(e.a, x);
  env_free(&e);
}

/* With garbage collection set, free blocks age by the pool's lookups (every search for a free block, of
 * any stream). The deferred return gives the merged block the count at the free, however many lookups
 * other streams make before the return; a hand-out again stamps the rest of its split anew, as a split
 * does. */
static void gc_ages_through_the_memo(void **state) {
  (void)state;
  env e = ENV(1, 0, "per_process_memory_fraction:1.0,garbage_collection_threshold:0.5");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  cl_lane *ln = warm_lane(&e, s);
  (void)warm_lane(&e, s2);
  void *x = ALLOC(e.a, 0, 4096, s), *y = ALLOC(e.a, 0, 4096, s2); /* the split peak of both at once */
  FREE(e.a, x);
  FREE(e.a, y);
  const uint64_t *lookups = &d->default_pool.lookups[1];
  const uint64_t l0 = *lookups;
  void *p = take(e.a, 4096, s);
  assert_non_null(ln->memo);
  EQ(*lookups, l0 + 1);
  give(e.a, p);
  assert_true(ln->memo_freed);
  give(e.a, take(e.a, 8192, s2)); /* another stream's lookup before the return */
  EQ(*lookups, l0 + 2);
  CHECK(e.a); /* the return, in exclusive mode */
  const cl_block *merged = block_at(d, p);
  EQ(merged->state, CL_FREE);
  EQ(merged->gc_base, l0 + 1);

  p = take(e.a, 4096, s); /* lookup l0 + 3 */
  give(e.a, p);
  assert_true(ln->memo_freed);
  void *q = take(e.a, 4096, s); /* lookup l0 + 4: the memo again, its rest stamped */
  EQ((uintptr_t)q, (uintptr_t)p);
  assert_false(ln->memo_freed);
  EQ(*lookups, l0 + 4);
  EQ(ln->memo->next->state, CL_FREE);
  EQ(ln->memo->next->gc_base, l0 + 4);
  FREE(e.a, q);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(same_size_comes_back),
      cmocka_unit_test(other_free_returns_first),
      cmocka_unit_test(whole_block_and_double_free),
      cmocka_unit_test(two_streams_keep_their_own),
      cmocka_unit_test(memo_with_history),
      cmocka_unit_test(memo_beside_a_pending_block),
      cmocka_unit_test(gc_ages_through_the_memo),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
