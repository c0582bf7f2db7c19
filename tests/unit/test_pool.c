/* Private pools on the simulated device (PyTorch's private pools): ids, routing, use counts, freeable pools,
 * outputs that outlive their pool's release, capture safety (deferred frees, no retry), checkpoint/restore.
 * Exact counts, cachalot_check after every step (ALLOC/FREE/... run it). */
#include "helpers.h"

#include "allocator/backend/ops.h" /* stream_wait, to join a side stream into a capture */
#include "allocator/internal.h"       /* a use count set near its limit, which 2^31 calls would take long to reach */

#include <cachalot/pool.h>

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static bool only_stream(cachalot_stream s, void *ctx) { return s == (cachalot_stream)ctx; }
static bool any_stream(cachalot_stream s, void *ctx) {
  (void)s, (void)ctx;
  return true;
}

#define BEGIN(a, id, s) OK(cachalot_begin_allocate_to_pool((a), 0, (id), only_stream, (void *)(s)))
#define END(a, id) OK(cachalot_end_allocate_to_pool((a), 0, (id)))
#define RELEASE(a, id) OK(cachalot_release_pool((a), 0, (id)))

static void test_ids(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_mempool_id h1 = cachalot_graph_pool_handle(e.a), h2 = cachalot_graph_pool_handle(e.a);
  EQ(h1.first, 0);
  EQ(h1.second, 1);
  EQ(h2.first, 0);
  EQ(h2.second, 2);
  cachalot_mempool_id none = cachalot_graph_pool_handle(NULL);
  EQ(none.first, 0);
  EQ(none.second, 0);
  env_free(&e);
}

static void test_errors(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  STATUS(cachalot_begin_allocate_to_pool(e.a, 0, (cachalot_mempool_id){0, 0}, any_stream, NULL),
         CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "not a private pool id");
  STATUS(cachalot_begin_allocate_to_pool(e.a, 0, (cachalot_mempool_id){1, 1}, any_stream, NULL),
         CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_begin_allocate_to_pool(e.a, 0, p, NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_begin_allocate_to_pool(e.a, 1, p, any_stream, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_begin_allocate_to_pool(NULL, 0, p, any_stream, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_end_allocate_to_pool(e.a, 0, p), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "not allocating to pool {0, 1}");
  STATUS(cachalot_release_pool(e.a, 0, p), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "no such pool {0, 1}");
  BEGIN(e.a, p, cap);
  STATUS(cachalot_begin_allocate_to_pool(e.a, 0, p, any_stream, NULL), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "already allocating to pool {0, 1}");
  void *x = ALLOC(e.a, 0, 512, cap); /* the pool gets a segment */
  END(e.a, p);
  STATUS(cachalot_end_allocate_to_pool(e.a, 0, p), CACHALOT_ERROR_INVALID_STATE);
  RELEASE(e.a, p); /* use count 0: freeable, but it still has a segment */
  STATUS(cachalot_release_pool(e.a, 0, p), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "already released");
  STATUS(cachalot_begin_allocate_to_pool(e.a, 0, p, any_stream, NULL), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "was released");
  FREE(e.a, x);
  EMPTY(e.a); /* the freeable pool gives its segment back and disappears: the id may be used afresh */
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  BEGIN(e.a, p, cap);
  END(e.a, p);
  RELEASE(e.a, p);
  STATUS(cachalot_release_pool(e.a, 0, p), CACHALOT_ERROR_INVALID_ARGUMENT); /* gone at once: no segment */
  CHECK(e.a);
  env_free(&e);
}

static void test_routing_and_own_segments(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0), other = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  void *a = ALLOC(e.a, 0, 512, cap);   /* pool p: a 2 MiB segment */
  void *b = ALLOC(e.a, 0, 512, other); /* the default pool: another */
  pool_x two = PX(.alloc = 2, .alloc_b = 1024, .active = 2, .active_b = 1024, .req_b = 1024, .seg = 2,
                  .res_b = 4 * MiB, .split = 2, .split_b = 4 * MiB - 1024);
  EXPECT_POOLS(e.a, 0, two, PX0);
  FREE(e.a, a);
  FREE(e.a, b);
  void *a2 = ALLOC(e.a, 0, 512, cap);
  assert_ptr_equal(a2, a); /* the pool's own free block */
  FREE(e.a, a2);
  END(e.a, p);
  void *c = ALLOC(e.a, 0, 512, cap); /* no routing: the default pool, where cap has no free block */
  assert_ptr_not_equal(c, a);
  FREE(e.a, c);
  EXPECT_COUNTERS(e.a, 0, 3, 0, 0, 0, 0);
  EMPTY(e.a); /* the pool is in use: its segment stays, the default pool's two go */
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  EXPECT_COUNTERS(e.a, 0, 3, 2, 0, 0, 1);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

static void test_most_recent_route_first(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_mempool_id pa = cachalot_graph_pool_handle(e.a), pb = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, pa, any_stream, NULL));
  void *x = ALLOC(e.a, 0, 512, s);
  FREE(e.a, x);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, pb, any_stream, NULL));
  void *y = ALLOC(e.a, 0, 512, s); /* pb, the most recent: a new segment */
  assert_ptr_not_equal(y, x);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  FREE(e.a, y);
  END(e.a, pb);
  void *z = ALLOC(e.a, 0, 512, s); /* pa again: its free block */
  assert_ptr_equal(z, x);
  FREE(e.a, z);
  END(e.a, pa);
  RELEASE(e.a, pa);
  RELEASE(e.a, pb);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

static void test_outputs_outlive_release(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  void *out = ALLOC(e.a, 0, 3 * MiB, cap);
  void *tmp = ALLOC(e.a, 0, 512, cap);
  FREE(e.a, tmp);
  END(e.a, p);
  RELEASE(e.a, p);
  EMPTY(e.a); /* the small segment goes; the output keeps the large one */
  pool_x out_only = PX(.alloc = 1, .alloc_b = 3 * MiB, .active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 1,
                       .res_b = 20 * MiB, .split = 1, .split_b = 17 * MiB);
  EXPECT_POOLS(e.a, 0, PX0, out_only);
  FREE(e.a, out); /* back to its (freeable) pool, not to the default pool */
  void *d = ALLOC(e.a, 0, 3 * MiB, cap);
  assert_ptr_not_equal(d, out);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 3 * MiB, .active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 2,
                  .res_b = 40 * MiB, .split = 1, .split_b = 17 * MiB));
  FREE(e.a, d);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

static void test_deferred_free_during_capture(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0), other = STREAM(e.b, 0), side = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  void *q = ALLOC(e.a, 0, 512, other);
  RECORD(e.a, q, side);
  FREE(e.a, q); /* an event on side, before any capture */
  void *p1 = ALLOC(e.a, 0, 512, other);
  assert_ptr_not_equal(p1, q);
  RECORD(e.a, p1, side);
  COMPLETE(&e, side); /* q's event is done, but nothing polls it before the capture */
  BEGIN(e.a, p, cap);
  /* during the capture: no event is queried (q's completed event is not polled) nor recorded */
  OK(cachalot_sim_fail_events(e.b, 1));
  FREE(e.a, p1); /* deferred: it would have failed had an event been recorded */
  OK(cachalot_sim_fail_events(e.b, 0));
  void *r = ALLOC(e.a, 0, 512, other);
  assert_ptr_not_equal(r, q);
  assert_ptr_not_equal(r, p1);
  cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.allocation[CACHALOT_STAT_ALL].current, 1);
  EQ(st.active[CACHALOT_STAT_ALL].current, 3);
  END(e.a, p);
  /* after the capture: q's event is polled, p1 gets its event now (not complete yet) */
  void *s1 = ALLOC(e.a, 0, 512, other);
  assert_ptr_equal(s1, q);
  void *s2 = ALLOC(e.a, 0, 512, other);
  assert_ptr_not_equal(s2, p1);
  COMPLETE(&e, side);
  void *s3 = ALLOC(e.a, 0, 512, other);
  assert_ptr_equal(s3, p1);
  FREE(e.a, r);
  FREE(e.a, s1);
  FREE(e.a, s2);
  FREE(e.a, s3);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

static void test_no_retry_during_capture(void **state) {
  (void)state;
  env e = ENV(1, 40 * MiB, "");
  cachalot_stream s = STREAM(e.b, 0), cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  void *x = ALLOC(e.a, 0, 3 * MiB, s);
  FREE(e.a, x); /* a cached 20 MiB default segment */
  BEGIN(e.a, p, cap);
  void *g = ALLOC(e.a, 0, 3 * MiB, cap); /* the pool's 20 MiB: the device is full */
  void *y = NULL;
  STATUS(cachalot_malloc(e.a, 0, 512, cap, &y), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(y);
  /* the out-of-memory message counts the private pool's free bytes (17 MiB) */
  CONTAINS(cachalot_last_error(), "Of the allocated memory 20.00 MiB is allocated by cachalot, with 17.00 MiB "
                                  "allocated in private pools (e.g., CUDA Graphs), and 20.00 MiB is reserved");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 1, 0); /* no sync, no release, no retry during a capture */
  END(e.a, p);
  void *z = ALLOC(e.a, 0, 512, cap); /* now the retry frees the cached default segment */
  EXPECT_COUNTERS(e.a, 0, 3, 1, 1, 1, 1);
  FREE(e.a, z);
  FREE(e.a, g);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* A pool released while it is still routed to stays until end_allocate_to_pool (it was collected at once,
 * and the next routed malloc used it after it was freed), then goes with its last segment. */
static void test_release_while_routed(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  RELEASE(e.a, p);
  void *x = ALLOC(e.a, 0, 512, cap); /* still routed: served from p */
  EXPECT_POOLS(e.a, 0, PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 512, .seg = 1,
                          .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 512), PX0);
  int n = -1;
  OK(cachalot_pool_use_count(e.a, 0, p, &n));
  EQ(n, 0);
  END(e.a, p);
  FREE(e.a, x);
  EMPTY(e.a); /* freeable: its segment goes back, and the pool with it */
  STATUS(cachalot_pool_use_count(e.a, 0, p, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(USED(e.b, 0), 0);
  /* released and routed with nothing allocated: it goes at end */
  cachalot_mempool_id q = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, q, cap);
  RELEASE(e.a, q);
  OK(cachalot_pool_use_count(e.a, 0, q, &n));
  END(e.a, q);
  STATUS(cachalot_pool_use_count(e.a, 0, q, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  CHECK(e.a);
  env_free(&e);
}

/* A caller-built state that names one segment twice (it was re-carved twice: a null dereference), or is out
 * of address order, or has segments but no array, is refused with nothing changed. */
static void test_restore_refuses_bad_states(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  void *x = ALLOC(e.a, 0, 500, cap);
  void *y = ALLOC(e.a, 0, 3 * MiB, cap);
  cachalot_pool_state *ck = NULL;
  OK(cachalot_checkpoint_pool(e.a, 0, p, &ck));
  EQ(ck->n_segments, 2);
  cachalot_device_stats before = STATS(e.a, 0);
  cachalot_segment_state segs[2] = {ck->segments[0], ck->segments[0]};
  cachalot_pool_state twice = *ck;
  twice.segments = segs;
  void **ptrs = (void **)1;
  size_t n = 9;
  STATUS(cachalot_restore_pool(e.a, &twice, &ptrs, &n), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "does not follow segment 0");
  assert_null(ptrs);
  EQ(n, 0);
  segs[0] = ck->segments[1];
  segs[1] = ck->segments[0];
  STATUS(cachalot_restore_pool(e.a, &twice, &ptrs, &n), CACHALOT_ERROR_INVALID_STATE);
  twice.segments = NULL;
  STATUS(cachalot_restore_pool(e.a, &twice, &ptrs, &n), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "2 segments but no array");
  cachalot_device_stats after = STATS(e.a, 0);
  assert_memory_equal(&before, &after, sizeof before); /* nothing changed */
  CHECK(e.a);
  OK(cachalot_restore_pool(e.a, ck, &ptrs, &n)); /* the real one still applies */
  EQ(n, 2);
  assert_ptr_equal(ptrs[0], x);
  assert_ptr_equal(ptrs[1], y);
  free(ptrs);
  cachalot_pool_state_free(ck);
  FREE(e.a, x);
  FREE(e.a, y);
  END(e.a, p);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* During a capture nothing goes back to the device: not a free oversize segment of the capture's pool that
 * the captured work uses (the oversize-release step of an out-of-memory retry gave it back), and not a
 * default-pool segment that garbage collection would collect. */
static void test_nothing_freed_during_capture(void **state) {
  (void)state;
  env e = ENV(1, 200 * MiB, "max_split_size_mb:20");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  void *tmp = ALLOC(e.a, 0, 64 * MiB, cap); /* a temporary of the captured work, freed inside the capture */
  FREE(e.a, tmp);
  void *big = NULL;
  STATUS(cachalot_malloc(e.a, 0, 150 * MiB, cap, &big), CACHALOT_ERROR_OUT_OF_MEMORY);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 1, 0);
  EQ(USED(e.b, 0), 64 * MiB); /* the graph's segment is still there */
  END(e.a, p);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EQ(USED(e.b, 0), 0);
  env_free(&e);

  /* garbage collection: a cached default segment, then a capture whose malloc needs a new one */
  e = ENV(1, 200 * MiB, "garbage_collection_threshold:0.5,per_process_memory_fraction:1.0");
  cap = STREAM(e.b, 0);
  cachalot_stream s = STREAM(e.b, 0);
  void *x = ALLOC(e.a, 0, 30 * MiB, s);
  FREE(e.a, x); /* 30 MiB cached in the default pool, above half the device: collectable */
  void *y = ALLOC(e.a, 0, 90 * MiB, s);
  FREE(e.a, y);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  void *g = ALLOC(e.a, 0, 40 * MiB, cap);
  EXPECT_COUNTERS(e.a, 0, 3, 0, 0, 0, 0); /* nothing collected during the capture */
  END(e.a, p);
  FREE(e.a, g);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* cachalot_destroy during a global capture: the device refuses frees, as CUDA does, so memory stays on the
 * device; destroy (which returns nothing) says so in a warning that names the bytes. Unmapping pages is no
 * stream operation and goes through: with expandable segments nothing stays, and nothing is said. */
static char destroy_warning[512];
static void keep_warning(const char *m, void *ctx) {
  (void)ctx;
  snprintf(destroy_warning, sizeof destroy_warning, "%s", m);
}
static void test_destroy_during_capture_warns(void **state) {
  (void)state;
  const char *confs[] = {"", "", "expandable_segments:True"};
  const size_t kept[] = {2 * MiB, 22 * MiB, 0};
  for (int i = 0; i < 3; i++) {
    env e = ENV(1, 0, confs[i]);
    cachalot_stream s = STREAM(e.b, 0), cap = STREAM(e.b, 0);
    FREE(e.a, ALLOC(e.a, 0, 512, s)); /* a cached segment (or a run of mapped pages) */
    if (i == 1)
      (void)ALLOC(e.a, 0, 3 * MiB, s); /* and a block still allocated: destroy gives its segment back too */
    OK(cachalot_sim_capture_begin(e.b, cap, CACHALOT_CAPTURE_GLOBAL));
    destroy_warning[0] = '\0';
    cachalot_set_warning_handler(keep_warning, NULL);
    cachalot_destroy(e.a);
    cachalot_set_warning_handler(NULL, NULL);
    char want[128];
    snprintf(want, sizeof want, "cachalot_destroy: %zu bytes", kept[i]);
    if (kept[i]) {
      CONTAINS(destroy_warning, want);
      CONTAINS(destroy_warning, "could not be given back");
    } else {
      EQ(strlen(destroy_warning), 0);
    }
    OK(cachalot_sim_capture_end(e.b, cap));
    EQ(USED(e.b, 0), kept[i]); /* what the warning named is what the device still holds */
    cachalot_backend_destroy(e.b);
  }
}

/* A device-1 block used by device 0's capturing stream and freed during that capture: its event would be
 * recorded into the capture and never complete (2 MiB lost on device 1, empty_cache failing for good). It
 * waits, deferred, until the capture is over, then goes back as any other. */
static void test_cross_device_use_freed_during_capture(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  cachalot_stream cap = STREAM(e.b, 0), s1 = STREAM(e.b, 1);
  void *x = ALLOC(e.a, 1, 1000, s1);
  OK(cachalot_record_stream(e.a, x, cap));
  OK(cachalot_sim_capture_begin(e.b, cap, CACHALOT_CAPTURE_RELAXED));
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  FREE(e.a, x); /* device 1 is not capturing, but the stream that used x is */
  uint64_t before = 0, after = 0;
  OK(cachalot_sim_stream_submitted(e.b, cap, &before));
  void *y = ALLOC(e.a, 1, 1000, s1); /* x is not handed out again meanwhile */
  assert_ptr_not_equal(y, x);
  FREE(e.a, y);
  END(e.a, p);
  OK(cachalot_sim_capture_end(e.b, cap));
  OK(cachalot_sim_stream_submitted(e.b, cap, &after));
  EQ(after, before); /* nothing was recorded on the stream during the capture */
  OK(cachalot_sim_stream_complete(e.b, cap)); /* (the event goes in once the capture is over) */
  EMPTY(e.a);
  RELEASE(e.a, p);
  OK(cachalot_sim_stream_complete(e.b, cap));
  EMPTY(e.a);
  EQ(USED(e.b, 1), 0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

static void expect_same_state(const cachalot_pool_state *x, const cachalot_pool_state *y) {
  EQ(x->device, y->device);
  EQ(x->pool.first, y->pool.first);
  EQ(x->pool.second, y->pool.second);
  EQ(x->n_segments, y->n_segments);
  for (size_t i = 0; i < x->n_segments; i++) {
    const cachalot_segment_state *a = &x->segments[i], *b = &y->segments[i];
    EQ(a->address, b->address);
    EQ(a->size, b->size);
    assert_ptr_equal(a->stream, b->stream);
    EQ(a->small, b->small);
    EQ(a->n_blocks, b->n_blocks);
    for (size_t k = 0; k < a->n_blocks; k++) {
      EQ(a->blocks[k].offset, b->blocks[k].offset);
      EQ(a->blocks[k].size, b->blocks[k].size);
      EQ(a->blocks[k].requested, b->blocks[k].requested);
      EQ(a->blocks[k].allocated, b->blocks[k].allocated);
    }
  }
}

static void test_checkpoint_restore(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, p, cap);
  char *a1 = ALLOC(e.a, 0, 500, cap);
  char *a2 = ALLOC(e.a, 0, 4096, cap);
  char *a3 = ALLOC(e.a, 0, 3 * MiB, cap);
  char *a4 = ALLOC(e.a, 0, 1000, cap);
  FREE(e.a, a2); /* a hole between a1 and a4 */
  cachalot_pool_state *ck = NULL;
  OK(cachalot_checkpoint_pool(e.a, 0, p, &ck));
  EQ(ck->n_segments, 2);
  const cachalot_segment_state *sm = ck->segments[0].small ? &ck->segments[0] : &ck->segments[1];
  const cachalot_segment_state *lg = ck->segments[0].small ? &ck->segments[1] : &ck->segments[0];
  EQ(sm->size, 2 * MiB);
  EQ(sm->n_blocks, 4);
  EQ(sm->blocks[0].size, 512);
  EQ(sm->blocks[0].requested, 500);
  EQ(sm->blocks[0].allocated, 1);
  EQ(sm->blocks[1].size, 4096);
  EQ(sm->blocks[1].allocated, 0);
  EQ(sm->blocks[2].offset, 512 + 4096);
  EQ(sm->blocks[2].requested, 1000);
  EQ(sm->blocks[3].size, 2 * MiB - 512 - 4096 - 1024);
  EQ(lg->n_blocks, 2);
  EQ(lg->blocks[0].size, 3 * MiB);
  EQ(lg->blocks[1].size, 17 * MiB);
  assert_true(ck->segments[0].address < ck->segments[1].address);
  cachalot_device_stats before = STATS(e.a, 0);

  /* change everything, then restore */
  FREE(e.a, a1);
  FREE(e.a, a3);
  FREE(e.a, a4);
  (void)ALLOC(e.a, 0, MiB, cap);
  (void)ALLOC(e.a, 0, 7 * MiB, cap);
  void **ptrs = NULL;
  size_t n = 0;
  OK(cachalot_restore_pool(e.a, ck, &ptrs, &n));
  CHECK(e.a);
  EQ(n, 3);
  /* checkpoint order: segments by address, blocks by address */
  void *want_small[] = {a1, a4}, *want_large[] = {a3};
  void **first = sm == &ck->segments[0] ? want_small : want_large;
  assert_ptr_equal(ptrs[0], first[0]);
  cachalot_pool_state *ck2 = NULL;
  OK(cachalot_checkpoint_pool(e.a, 0, p, &ck2));
  expect_same_state(ck, ck2);
  cachalot_device_stats after = STATS(e.a, 0);
  EQ(after.allocation[CACHALOT_STAT_ALL].current, before.allocation[CACHALOT_STAT_ALL].current);
  EQ(after.allocated_bytes[CACHALOT_STAT_ALL].current, before.allocated_bytes[CACHALOT_STAT_ALL].current);
  EQ(after.requested_bytes[CACHALOT_STAT_ALL].current, before.requested_bytes[CACHALOT_STAT_ALL].current);
  EQ(after.inactive_split[CACHALOT_STAT_ALL].current, before.inactive_split[CACHALOT_STAT_ALL].current);
  EQ(after.inactive_split_bytes[CACHALOT_STAT_ALL].current, before.inactive_split_bytes[CACHALOT_STAT_ALL].current);
  EQ(after.reserved_bytes[CACHALOT_STAT_ALL].current, before.reserved_bytes[CACHALOT_STAT_ALL].current);

  /* a checkpoint that no longer fits is refused before anything changes */
  ck2->segments[0].blocks[0].size += 512;
  void **bad = (void **)1;
  size_t nbad = 9;
  STATUS(cachalot_restore_pool(e.a, ck2, &bad, &nbad), CACHALOT_ERROR_INVALID_STATE);
  assert_null(bad);
  EQ(nbad, 0);
  ck2->segments[0].blocks[0].size -= 512;
  ck2->segments[0].address += 512; /* no segment starts there */
  STATUS(cachalot_restore_pool(e.a, ck2, &bad, &nbad), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "no longer in the pool");
  cachalot_device_stats same = STATS(e.a, 0);
  assert_memory_equal(&same, &after, sizeof same);
  CHECK(e.a);

  for (size_t i = 0; i < n; i++)
    FREE(e.a, ptrs[i]);
  free(ptrs);
  cachalot_pool_state_free(ck);
  cachalot_pool_state_free(ck2);
  END(e.a, p);
  RELEASE(e.a, p);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

/* MemPool(no_split=True): every block of the pool is handed out whole, each its segment's only block (two
 * 4 MiB requests: two 20 MiB segments, where the default pool splits one); the default pool still splits.
 * Errors: the default id, a pool not made, a released pool. */
static void test_no_split_pool(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  STATUS(cachalot_pool_set_no_split(e.a, 0, p), CACHALOT_ERROR_INVALID_ARGUMENT); /* not made yet */
  CONTAINS(cachalot_last_error(), "no such pool");
  OK(cachalot_pool_incref(e.a, 0, p));
  OK(cachalot_pool_set_no_split(e.a, 0, p));
  STATUS(cachalot_pool_set_no_split(e.a, 0, (cachalot_mempool_id){0, 0}), CACHALOT_ERROR_INVALID_ARGUMENT);
  BEGIN(e.a, p, s);
  char *a = ALLOC(e.a, 0, 4 * MiB, s);
  char *b = ALLOC(e.a, 0, 4 * MiB, s);
  char *c = ALLOC(e.a, 0, 1000, s); /* small: a whole 2 MiB segment */
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 2 * MiB, .active = 1, .active_b = 2 * MiB, .req_b = 1000, .seg = 1,
                  .res_b = 2 * MiB),
               PX(.alloc = 2, .alloc_b = 40 * MiB, .active = 2, .active_b = 40 * MiB, .req_b = 8 * MiB, .seg = 2,
                  .res_b = 40 * MiB));
  FREE(e.a, b);
  char *b2 = ALLOC(e.a, 0, 1 * MiB + 512, s); /* a cached whole block, taken whole again */
  assert_ptr_equal(b2, b);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_LARGE_POOL].current, 40 * MiB);
  END(e.a, p);
  char *d = ALLOC(e.a, 0, 4 * MiB, s); /* the default pool splits as ever */
  char *f = ALLOC(e.a, 0, 4 * MiB, s);
  assert_ptr_equal(f, d + 4 * MiB);
  CHECK(e.a);
  FREE(e.a, a);
  FREE(e.a, b2);
  FREE(e.a, c);
  FREE(e.a, d);
  FREE(e.a, f);
  RELEASE(e.a, p); /* the incref's use, then the routing's */
  RELEASE(e.a, p);
  STATUS(cachalot_pool_set_no_split(e.a, 0, p), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "released pool");
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* MemPool(use_on_oom=True): a default-pool malloc that finds no memory, after its retry, takes a cached
 * free block of such a pool on its stream (which then holds it), and fails when none fits; a pool without
 * the flag, or whose flag went off, is not used. */
static void test_use_on_oom_pool(void **state) {
  (void)state;
  env e = ENV(1, 80 * MiB, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_mempool_id keep = cachalot_graph_pool_handle(e.a), use = cachalot_graph_pool_handle(e.a);
  STATUS(cachalot_pool_set_use_on_oom(e.a, 0, use, true), CACHALOT_ERROR_INVALID_ARGUMENT); /* not made */
  OK(cachalot_pool_set_use_on_oom(e.a, 0, use, false)); /* off needs no pool */
  OK(cachalot_pool_incref(e.a, 0, keep));
  OK(cachalot_pool_incref(e.a, 0, use));
  OK(cachalot_pool_set_use_on_oom(e.a, 0, use, true));
  BEGIN(e.a, keep, s);
  char *a = ALLOC(e.a, 0, 40 * MiB, s);
  END(e.a, keep);
  BEGIN(e.a, use, s);
  char *b = ALLOC(e.a, 0, 40 * MiB, s);
  END(e.a, use);
  void *x = (void *)(uintptr_t)1;
  STATUS(cachalot_malloc(e.a, 0, 40 * MiB, s, &x), CACHALOT_ERROR_OUT_OF_MEMORY); /* nothing free anywhere */
  assert_null(x);
  FREE(e.a, a);
  FREE(e.a, b);
  CHECK(e.a);
  char *c = ALLOC(e.a, 0, 30 * MiB, s); /* no device memory: use's free block, split */
  assert_ptr_equal(c, b);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 30 * MiB, .active = 1, .active_b = 30 * MiB, .req_b = 30 * MiB, .seg = 2,
                  .res_b = 80 * MiB, .split = 1, .split_b = 10 * MiB));
  STATUS(cachalot_malloc(e.a, 0, 30 * MiB, s, &x), CACHALOT_ERROR_OUT_OF_MEMORY); /* keep's is not used */
  CHECK(e.a);
  FREE(e.a, c); /* back to use */
  OK(cachalot_pool_set_use_on_oom(e.a, 0, use, false));
  STATUS(cachalot_malloc(e.a, 0, 30 * MiB, s, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CHECK(e.a);
  for (int i = 0; i < 2; i++) { /* the incref's use and the routing's */
    RELEASE(e.a, keep);
    RELEASE(e.a, use);
  }
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

/* A pool's segments from a source of the caller's (PyTorch's MemPool(allocator=...)): each new segment of
 * the pool is one alloc call of the segment's size on the malloc's stream, each segment given back one
 * free call of the same, the source's release once the pool and its last segment are gone; the default
 * pool still uses the device; expandable segments are not used for it; a source that gives nothing is
 * the device's out of memory (after the retry); the errors of set_source. */
typedef struct {
  int allocs, frees, releases;
  size_t bytes; /* live */
  size_t limit; /* what it can give in all */
  cachalot_stream last_stream;
} fake_source;

static void *fake_alloc(size_t size, int device, cachalot_stream s, void *ctx) {
  fake_source *f = ctx;
  assert_int_equal(device, 0);
  if (f->bytes + size > f->limit)
    return NULL;
  f->allocs++;
  f->bytes += size;
  f->last_stream = s;
  return aligned_alloc(2 * MiB, size); /* never touched: an address like any other to cachalot */
}

static void fake_free(void *ptr, size_t size, int device, cachalot_stream s, void *ctx) {
  fake_source *f = ctx;
  assert_ptr_equal(s, f->last_stream); /* the segment's stream, as its alloc was given */
  assert_int_equal(device, 0);
  f->frees++;
  f->bytes -= size;
  free(ptr);
}

static void fake_release(void *ctx) { ((fake_source *)ctx)->releases++; }

static void test_pool_source(void **state) {
  (void)state;
  env e = ENV(1, 0, "expandable_segments:True");
  cachalot_stream s = STREAM(e.b, 0);
  fake_source f = {.limit = 24 * MiB};
  const cachalot_segment_source src = {fake_alloc, fake_free, fake_release, &f};
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  STATUS(cachalot_pool_set_source(e.a, 0, p, &src), CACHALOT_ERROR_INVALID_ARGUMENT); /* no such pool */
  OK(cachalot_pool_incref(e.a, 0, p));
  STATUS(cachalot_pool_set_source(e.a, 0, p, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  const cachalot_segment_source half = {fake_alloc, NULL, NULL, &f};
  STATUS(cachalot_pool_set_source(e.a, 0, p, &half), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "both alloc and free");
  OK(cachalot_pool_set_source(e.a, 0, p, &src));
  STATUS(cachalot_pool_set_source(e.a, 0, p, &src), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "already has a source");
  BEGIN(e.a, p, s);
  char *a = ALLOC(e.a, 0, 1000, s);     /* a 2 MiB segment from the source */
  char *b = ALLOC(e.a, 0, 4 * MiB, s);  /* a 20 MiB one, not an expandable run */
  EQ(f.allocs, 2);
  EQ(f.bytes, 22 * MiB);
  assert_ptr_equal(f.last_stream, s);
  EQ(USED(e.b, 0), 0); /* nothing from the device */
  void *x = (void *)(uintptr_t)1;
  STATUS(cachalot_malloc(e.a, 0, 18 * MiB, s, &x), CACHALOT_ERROR_OUT_OF_MEMORY); /* the source has 2 MiB left */
  assert_null(x);
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 1024, .active = 1, .active_b = 1024, .req_b = 1000, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 1024),
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 16 * MiB));
  STATUS(cachalot_pool_set_source(e.a, 0, p, &src), CACHALOT_ERROR_INVALID_STATE);
  /* a pool allocated from without a source cannot take one: its segments are the backend's */
  cachalot_mempool_id used = cachalot_graph_pool_handle(e.a);
  BEGIN(e.a, used, s);
  FREE(e.a, ALLOC(e.a, 0, 512, s));
  STATUS(cachalot_pool_set_source(e.a, 0, used, &src), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "has already been allocated from");
  END(e.a, used);
  RELEASE(e.a, used);
  END(e.a, p);
  char *c = ALLOC(e.a, 0, 1000, s); /* the default pool: the device's (an expandable run) */
  EQ(f.allocs, 2);
  assert_true(USED(e.b, 0) > 0);
  FREE(e.a, a);
  FREE(e.a, b);
  FREE(e.a, c);
  EMPTY(e.a); /* the pool is in use: its segments stay */
  EQ(f.frees, 0);
  RELEASE(e.a, p); /* the incref's use and the routing's */
  RELEASE(e.a, p);
  EQ(f.releases, 0);
  EMPTY(e.a);
  EQ(f.frees, 2);
  EQ(f.bytes, 0);
  EQ(f.releases, 1); /* the pool went with its last segment */
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  CHECK(e.a);

  /* destroy gives a source's segments back to it, then releases it */
  fake_source g = {.limit = 64 * MiB};
  const cachalot_segment_source src2 = {fake_alloc, fake_free, fake_release, &g};
  cachalot_mempool_id q = cachalot_graph_pool_handle(e.a);
  OK(cachalot_pool_incref(e.a, 0, q));
  OK(cachalot_pool_set_source(e.a, 0, q, &src2));
  BEGIN(e.a, q, s);
  (void)ALLOC(e.a, 0, 30 * MiB, s);
  END(e.a, q);
  EQ(g.allocs, 1);
  env_free(&e);
  EQ(g.frees, 1);
  EQ(g.bytes, 0);
  EQ(g.releases, 1);
}

/* A malloc for a private pool drops the device lock around its source's alloc (as around the device's):
 * another thread that ends the routing and releases the pool meanwhile must not free it under the
 * malloc, nor release the source while its alloc runs. The segment lands in the pool, which goes (its
 * source released once) with that segment. */
typedef struct {
  cachalot_allocator *a;
  cachalot_mempool_id id;
  int allocs, releases, releases_during_alloc;
} racing_source;

static void *release_pool_meanwhile(void *arg) {
  racing_source *r = arg;
  assert_int_equal(cachalot_end_allocate_to_pool(r->a, 0, r->id), CACHALOT_OK);
  assert_int_equal(cachalot_release_pool(r->a, 0, r->id), CACHALOT_OK); /* the incref's use */
  assert_int_equal(cachalot_release_pool(r->a, 0, r->id), CACHALOT_OK); /* the routing's */
  return NULL;
}

static void *racing_alloc(size_t size, int device, cachalot_stream s, void *ctx) {
  racing_source *r = ctx;
  (void)device;
  (void)s;
  if (r->allocs++ == 0) { /* the device lock is dropped here: another thread releases the pool */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, release_pool_meanwhile, r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    r->releases_during_alloc = r->releases;
  }
  return aligned_alloc(2 * MiB, size);
}

static void racing_free(void *ptr, size_t size, int device, cachalot_stream s, void *ctx) {
  (void)size;
  (void)device;
  (void)s;
  (void)ctx;
  free(ptr);
}

static void racing_release(void *ctx) { ((racing_source *)ctx)->releases++; }

static void test_pool_released_during_source_alloc(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  racing_source r = {.a = e.a, .id = cachalot_graph_pool_handle(e.a)};
  const cachalot_segment_source src = {racing_alloc, racing_free, racing_release, &r};
  OK(cachalot_pool_incref(e.a, 0, r.id));
  OK(cachalot_pool_set_source(e.a, 0, r.id, &src));
  BEGIN(e.a, r.id, s);
  char *x = ALLOC(e.a, 0, 3 * MiB, s);
  EQ(r.releases_during_alloc, 0);
  EQ(r.releases, 0); /* the pool holds the segment now */
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 3 * MiB, .active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 17 * MiB));
  FREE(e.a, x); /* back to the released pool */
  EMPTY(e.a);
  EQ(r.releases, 1);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  CHECK(e.a);
  env_free(&e);
  EQ(r.releases, 1);
}

/* graph_capture_record_stream_reuse (PyTorch's test_graph_capture_reclaim_2_streams, on the simulated
 * device): a block freed during a capture while a side stream of the capture reads it is not reused by a
 * malloc whose captured work does not yet depend on that read (before the side stream joins back), and is
 * reused once it does; without the key it waits for the capture's end. */
static void capture_reclaim(bool reuse, bool *reused_before_join, bool *reused_after_join) {
  env e = ENV(1, 0, reuse ? "graph_capture_record_stream_reuse:True" : "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, p, any_stream, NULL));
  OK(cachalot_sim_capture_begin(e.b, s1, CACHALOT_CAPTURE_GLOBAL));
  char *sink = ALLOC(e.a, 0, 512, s1);
  char *data1 = ALLOC(e.a, 0, 512, s1);
  OK(e.b->ops->stream_wait(e.b, 0, s2, s1)); /* s2 joins the capture */
  OK(cachalot_sim_launch(e.b, s2));          /* reads data1 */
  RECORD(e.a, data1, s2);
  FREE(e.a, data1);
  char *data2 = ALLOC(e.a, 0, 512, s1); /* s1's work does not depend on s2's read yet */
  *reused_before_join = data2 == data1;
  OK(e.b->ops->stream_wait(e.b, 0, s1, s2)); /* s2 joins back into s1 */
  OK(cachalot_sim_launch(e.b, s1));          /* a node after the join */
  char *data3 = ALLOC(e.a, 0, 512, s1);
  *reused_after_join = data3 == data1;
  CHECK(e.a);
  OK(cachalot_sim_capture_end(e.b, s1));
  OK(cachalot_end_allocate_to_pool(e.a, 0, p));
  FREE(e.a, sink);
  FREE(e.a, data2);
  FREE(e.a, data3);
  CHECK(e.a);
  OK(cachalot_release_pool(e.a, 0, p));
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

/* The four-stream case (PyTorch's test_graph_capture_reclaim_4_streams): three side streams read the block;
 * after partial joins (s2 into s1, s4 into s3) s1 still does not depend on s3's and s4's reads, so the
 * block waits; once s3 joins s1 it is reused. */
static void capture_reclaim_4(bool *reused_partial, bool *reused_full) {
  env e = ENV(1, 0, "graph_capture_record_stream_reuse:True");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0), s3 = STREAM(e.b, 0), s4 = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, p, any_stream, NULL));
  OK(cachalot_sim_capture_begin(e.b, s1, CACHALOT_CAPTURE_GLOBAL));
  char *data1 = ALLOC(e.a, 0, 512, s1);
  char *sink = ALLOC(e.a, 0, 512, s1);
  cachalot_stream side[3] = {s2, s3, s4};
  for (int i = 0; i < 3; i++) {
    OK(e.b->ops->stream_wait(e.b, 0, side[i], s1));
    OK(cachalot_sim_launch(e.b, side[i]));
    RECORD(e.a, data1, side[i]);
  }
  FREE(e.a, data1);
  OK(e.b->ops->stream_wait(e.b, 0, s1, s2));
  OK(cachalot_sim_launch(e.b, s1));
  OK(e.b->ops->stream_wait(e.b, 0, s3, s4));
  OK(cachalot_sim_launch(e.b, s3));
  char *data2 = ALLOC(e.a, 0, 512, s1);
  *reused_partial = data2 == data1;
  OK(e.b->ops->stream_wait(e.b, 0, s1, s3));
  OK(cachalot_sim_launch(e.b, s1));
  char *data3 = ALLOC(e.a, 0, 512, s1);
  *reused_full = data3 == data1;
  CHECK(e.a);
  OK(cachalot_sim_capture_end(e.b, s1));
  OK(cachalot_end_allocate_to_pool(e.a, 0, p));
  FREE(e.a, sink);
  FREE(e.a, data2);
  FREE(e.a, data3);
  OK(cachalot_release_pool(e.a, 0, p));
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

static void test_capture_reuse_after_join(void **state) {
  (void)state;
  bool before = true, after = false;
  capture_reclaim(true, &before, &after);
  assert_false(before);
  assert_true(after);
  capture_reclaim(false, &before, &after); /* the key off: the block waits for the capture's end */
  assert_false(before);
  assert_false(after);
  before = true;
  after = false;
  capture_reclaim_4(&before, &after);
  assert_false(before);
  assert_true(after);
}

/* The use count stops at INT_MAX: one more use is refused (it overflowed into a negative count). */
static void test_use_count_limit(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  OK(cachalot_pool_incref(e.a, 0, id));
  cl_device *d = &e.a->devices[0];
  cl_enter_exclusive(d);
  cl_find_pool_locked(d, id)->use_count = INT_MAX - 1;
  cl_leave_exclusive(d);
  OK(cachalot_pool_incref(e.a, 0, id));
  int n = 0;
  OK(cachalot_pool_use_count(e.a, 0, id, &n));
  assert_int_equal(n, INT_MAX);
  STATUS(cachalot_pool_incref(e.a, 0, id), CACHALOT_ERROR_INVALID_STATE);
  assert_non_null(strstr(cachalot_last_error(), "the most it can count"));
  STATUS(cachalot_begin_allocate_to_pool(e.a, 0, id, only_stream, s), CACHALOT_ERROR_INVALID_STATE);
  OK(cachalot_pool_use_count(e.a, 0, id, &n));
  assert_int_equal(n, INT_MAX);
  CHECK(e.a);
  cl_enter_exclusive(d);
  cl_find_pool_locked(d, id)->use_count = 1;
  cl_leave_exclusive(d);
  OK(cachalot_release_pool(e.a, 0, id));
  CHECK(e.a);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_use_count_limit),
      cmocka_unit_test(test_ids),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_routing_and_own_segments),
      cmocka_unit_test(test_most_recent_route_first),
      cmocka_unit_test(test_outputs_outlive_release),
      cmocka_unit_test(test_deferred_free_during_capture),
      cmocka_unit_test(test_no_retry_during_capture),
      cmocka_unit_test(test_release_while_routed),
      cmocka_unit_test(test_restore_refuses_bad_states),
      cmocka_unit_test(test_nothing_freed_during_capture),
      cmocka_unit_test(test_destroy_during_capture_warns),
      cmocka_unit_test(test_cross_device_use_freed_during_capture),
      cmocka_unit_test(test_checkpoint_restore),
      cmocka_unit_test(test_no_split_pool),
      cmocka_unit_test(test_use_on_oom_pool),
      cmocka_unit_test(test_pool_source),
      cmocka_unit_test(test_pool_released_during_source_alloc),
      cmocka_unit_test(test_capture_reuse_after_join),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
