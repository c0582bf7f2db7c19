/* Expandable segments on the simulated device (expandable_segments:True): growth page by page with exact
 * byte counts, runs that merge and split, unmapping of whole free pages only, out of memory and
 * injected faults while mapping, max_split_size, garbage collection, private pools during a capture,
 * snapshots, and cachalot_check after every step (the helpers run it). White-box where it helps: the
 * runs are read from the allocator's own structures. */
#include "helpers.h"

#include "allocator/internal.h"

#define LP (20 * MiB) /* the large kind's page */
#define SP (2 * MiB)  /* the small kind's */
#define EXP "expandable_segments:True"

/* The runs of the device's reservation of `small` kind for (default pool, stream s), in address order,
 * as offsets from the reservation's base: out[2i] = start, out[2i + 1] = size. Returns the count. */
static size_t runs_of(cachalot_allocator *a, cachalot_stream s, bool small, size_t *out, size_t cap) {
  cl_device *d = &a->devices[0];
  cl_enter_exclusive(d);
  cl_bins *bins = cl_bins_get_locked(d, &d->default_pool, s, false);
  size_t n = 0;
  for (cl_segment *r = bins && bins->vr[small] ? bins->vr[small]->runs : NULL; r && n < cap; r = r->run_next, n++) {
    out[2 * n] = r->ptr - bins->vr[small]->base;
    out[2 * n + 1] = r->size;
  }
  cl_leave_exclusive(d);
  return n;
}

/* The offset of p from the start of the reservation holding it. */
static size_t off(cachalot_allocator *a, cachalot_stream s, bool small, void *p) {
  cl_device *d = &a->devices[0];
  cl_enter_exclusive(d);
  cl_bins *bins = cl_bins_get_locked(d, &d->default_pool, s, false);
  cl_leave_exclusive(d);
  assert_non_null(bins);
  assert_non_null(bins->vr[small]);
  return (uintptr_t)p - bins->vr[small]->base;
}

static void expect_runs_(cachalot_allocator *a, cachalot_stream s, bool small, const size_t *want, size_t n,
                         const char *file, int line) {
  size_t got[64];
  eq_i64_((int64_t)runs_of(a, s, small, got, 32), (int64_t)(n / 2), "number of runs", file, line);
  for (size_t i = 0; i < n; i++)
    eq_i64_((int64_t)got[i], (int64_t)want[i], i % 2 ? "run size" : "run offset", file, line);
}
/* EXPECT_RUNS(a, stream, small, offset, size, ...): exactly these runs. */
#define EXPECT_RUNS(a, s, small, ...)                                                                             \
  expect_runs_((a), (s), (small), (const size_t[]){__VA_ARGS__},                                                  \
               sizeof((const size_t[]){__VA_ARGS__}) / sizeof(size_t), __FILE__, __LINE__)
#define EXPECT_NO_RUNS(a, s, small) expect_runs_((a), (s), (small), NULL, 0, __FILE__, __LINE__)

/* A request maps only what the free tail of the run lacks, in whole pages; the tail and the new pages
 * become one block, so consecutive requests lie back to back. */
static void growth_maps_what_is_missing(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  void *a = ALLOC(e.a, 0, 30 * MiB, NULL);
  EQ(off(e.a, NULL, false, a), 0);
  /* 2 pages; the 10 MiB left is a free block of the split run; no segment is counted */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 30 * MiB, .active = 1, .active_b = 30 * MiB, .req_b = 30 * MiB, .seg = 0,
                  .res_b = 2 * LP, .split = 1, .split_b = 10 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EXPECT_RUNS(e.a, NULL, false, 0, 2 * LP);

  void *b = ALLOC(e.a, 0, 15 * MiB, NULL); /* 10 MiB free at the tail: one more page, not two */
  EQ((char *)b - (char *)a, 30 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 45 * MiB, .active = 2, .active_b = 45 * MiB, .req_b = 45 * MiB,
                  .res_b = 3 * LP, .split = 1, .split_b = 15 * MiB));
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  EXPECT_RUNS(e.a, NULL, false, 0, 3 * LP);

  void *c = ALLOC(e.a, 0, 15 * MiB, NULL); /* the tail holds it exactly: nothing mapped */
  EQ((char *)c - (char *)b, 15 * MiB);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  /* a handed-out tail: the next pages start a new free block after it, in the same run */
  void *d = ALLOC(e.a, 0, 5 * MiB, NULL);
  EQ((char *)d - (char *)c, 15 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 4, .alloc_b = 65 * MiB, .active = 4, .active_b = 65 * MiB, .req_b = 65 * MiB,
                  .res_b = 4 * LP, .split = 1, .split_b = 15 * MiB));
  EXPECT_RUNS(e.a, NULL, false, 0, 4 * LP);

  /* the small kind: 2 MiB pages, its own reservation */
  void *s1 = ALLOC(e.a, 0, 1000, NULL);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 1024, .active = 1, .active_b = 1024, .req_b = 1000, .res_b = SP, .split = 1,
                  .split_b = SP - 1024),
               PX(.alloc = 4, .alloc_b = 65 * MiB, .active = 4, .active_b = 65 * MiB, .req_b = 65 * MiB,
                  .res_b = 4 * LP, .split = 1, .split_b = 15 * MiB));
  EXPECT_RUNS(e.a, NULL, true, 0, SP);
  EXPECT_RESERVED_IS_USED(&e, 0);

  FREE(e.a, a);
  FREE(e.a, b);
  FREE(e.a, c);
  FREE(e.a, d);
  FREE(e.a, s1);
  EXPECT_POOLS(e.a, 0, PX(.res_b = SP), PX(.res_b = 4 * LP)); /* one free block per run: not split */
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_COUNTERS(e.a, 0, 4, 2, 0, 0, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EXPECT_NO_RUNS(e.a, NULL, false);
  env_free(&e);
}

/* empty_cache unmaps the pages that lie wholly inside free blocks and nothing else; the run splits
 * around what went, and a later growth that fills the hole merges the runs again. */
static void unmaps_whole_free_pages_only(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  void *a = ALLOC(e.a, 0, 30 * MiB, NULL); /* [0, 30) of pages [0, 40) */
  void *b = ALLOC(e.a, 0, 15 * MiB, NULL); /* [30, 45), one more page: [0, 60) */
  FREE(e.a, a);                            /* free [0, 30): page [0, 20) is wholly free */
  EMPTY(e.a);
  EXPECT_RUNS(e.a, NULL, false, LP, 2 * LP);
  /* left: [20, 30) free, b, [45, 60) free (no whole page: b ends in it) */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 15 * MiB, .active = 1, .active_b = 15 * MiB, .req_b = 15 * MiB,
                  .res_b = 2 * LP, .split = 2, .split_b = 25 * MiB));
  EXPECT_COUNTERS(e.a, 0, 2, 1, 0, 0, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EMPTY(e.a); /* nothing more to give back */
  EXPECT_COUNTERS(e.a, 0, 2, 1, 0, 0, 2);

  /* 40 MiB: no free block holds it; the gap before the run (20) and its free head (10) are too small;
   * after the run, its free tail (15) and 25 more, so 2 pages: [60, 100) */
  void *c = ALLOC(e.a, 0, 40 * MiB, NULL);
  EQ(off(e.a, NULL, false, c), 45 * MiB);
  EXPECT_RUNS(e.a, NULL, false, LP, 4 * LP);
  /* 25 MiB: the gap before the run (20) with the run's free head (10) holds it: the gap is mapped whole
   * and the runs become one */
  void *d = ALLOC(e.a, 0, 25 * MiB, NULL);
  EQ(off(e.a, NULL, false, d), 0);
  EXPECT_RUNS(e.a, NULL, false, 0, 5 * LP);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 3, .alloc_b = 80 * MiB, .active = 3, .active_b = 80 * MiB, .req_b = 80 * MiB,
                  .res_b = 5 * LP, .split = 2, .split_b = 20 * MiB));
  EXPECT_COUNTERS(e.a, 0, 4, 1, 0, 0, 2);
  EXPECT_RESERVED_IS_USED(&e, 0);

  /* a hole in the middle: free b and c, [25, 100) is free: pages [40, 100) go, [25, 40) stays */
  FREE(e.a, b);
  FREE(e.a, c);
  EMPTY(e.a);
  EXPECT_RUNS(e.a, NULL, false, 0, 2 * LP);
  FREE(e.a, d);
  EMPTY(e.a);
  EXPECT_NO_RUNS(e.a, NULL, false);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);

  /* a run split in two: pages in the middle of a free block between two handed-out blocks */
  void *x = ALLOC(e.a, 0, 10 * MiB, NULL);
  void *y = ALLOC(e.a, 0, 50 * MiB, NULL);
  void *z = ALLOC(e.a, 0, 10 * MiB, NULL);
  EQ(off(e.a, NULL, false, z), 60 * MiB);
  FREE(e.a, y); /* [10, 60) free: pages [20, 60) */
  EMPTY(e.a);
  EXPECT_RUNS(e.a, NULL, false, 0, LP, 3 * LP, LP);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 20 * MiB, .active = 2, .active_b = 20 * MiB, .req_b = 20 * MiB,
                  .res_b = 2 * LP, .split = 2, .split_b = 20 * MiB));
  FREE(e.a, x); /* the first run is one free block again */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 10 * MiB, .active = 1, .active_b = 10 * MiB, .req_b = 10 * MiB,
                  .res_b = 2 * LP, .split = 1, .split_b = 10 * MiB));
  FREE(e.a, z);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* Out of memory while mapping: the pages this call mapped go back, the retry after empty_cache is
 * counted, and the allocator goes on. */
static void oom_during_mapping_gives_back(void **state) {
  (void)state;
  env e = ENV(1, 50 * MiB, EXP);
  void *p = (void *)1;
  /* three pages are needed; the device has room for two: the two mapped go back */
  STATUS(cachalot_malloc(e.a, 0, 50 * MiB, NULL, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "CUDA out of memory. Tried to allocate 50.00 MiB.");
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_COUNTERS(e.a, 0, 0, 0, 1, 1, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EXPECT_NO_RUNS(e.a, NULL, false);
  /* the rest of the device still serves */
  void *q = ALLOC(e.a, 0, 40 * MiB, NULL);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, q);

  /* injected faults: every second map fails, so a 3-page growth never completes */
  env f = ENV(1, 1 * GiB, EXP);
  OK(cachalot_sim_fail_every(f.b, 2));
  STATUS(cachalot_malloc(f.a, 0, 50 * MiB, NULL, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  CHECK(f.a);
  EXPECT_POOLS(f.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&f, 0);
  /* a one-page growth passes on the odd calls */
  void *r = ALLOC(f.a, 0, 10 * MiB, NULL);
  EXPECT_RESERVED_IS_USED(&f, 0);
  OK(cachalot_sim_fail_every(f.b, 0));
  void *s = ALLOC(f.a, 0, 50 * MiB, NULL);
  EQ((char *)s - (char *)r, 10 * MiB);
  EXPECT_POOLS(f.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 60 * MiB, .active = 2, .active_b = 60 * MiB, .req_b = 60 * MiB,
                  .res_b = 3 * LP));
  FREE(f.a, r);
  FREE(f.a, s);
  EMPTY(f.a);
  EXPECT_RESERVED_IS_USED(&f, 0);
  env_free(&f);

  /* the OOM retry unmaps another stream's free pages */
  cachalot_stream s2 = STREAM(e.b, 0);
  void *t = ALLOC(e.a, 0, 30 * MiB, NULL);
  FREE(e.a, t); /* 40 MiB mapped and free on the default stream */
  void *u = ALLOC(e.a, 0, 30 * MiB, s2);
  EXPECT_COUNTERS(e.a, 0, 2, 1, 2, 1, 2);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 30 * MiB, .active = 1, .active_b = 30 * MiB, .req_b = 30 * MiB,
                  .res_b = 2 * LP, .split = 1, .split_b = 10 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, u);
  env_free(&e);
}

/* max_split_size: oversize blocks are released a page at a time at step 6; a free tail passed over by
 * best fit as oversize is handed out rather than mapped after (its new pages would join it). */
static void max_split_size_and_oversize_release(void **state) {
  (void)state;
  env e = ENV(1, 100 * MiB, EXP ",max_split_size_mb:40");
  void *a = ALLOC(e.a, 0, 45 * MiB, NULL); /* pages [0, 60), oversize */
  void *b = ALLOC(e.a, 0, 15 * MiB, NULL); /* the rest [45, 60) exactly */
  EXPECT_OVERSIZE(e.a, 0, 1, 0);
  FREE(e.a, a); /* [0, 45) free, oversize */
  /* 50 MiB: 60 MiB more is needed and 40 is left. Step 6 unmaps [0, 40) of the oversize block (not
   * enough alone), the retry after empty_cache then succeeds: [60, 120) */
  void *c = ALLOC(e.a, 0, 50 * MiB, NULL);
  EQ(off(e.a, NULL, false, c), 60 * MiB);
  EXPECT_COUNTERS(e.a, 0, 2, 1, 1, 0, 1);
  EXPECT_RUNS(e.a, NULL, false, 2 * LP, 4 * LP);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, c);
  FREE(e.a, b); /* the run [40, 120) is one free block of 80 MiB, oversize */
  /* 10 MiB may not take it: the gap below the run is mapped instead */
  void *d = ALLOC(e.a, 0, 10 * MiB, NULL);
  EQ(off(e.a, NULL, false, d), 0);
  EXPECT_RUNS(e.a, NULL, false, 0, LP, 2 * LP, 4 * LP);
  EXPECT_COUNTERS(e.a, 0, 3, 1, 1, 0, 1);
  FREE(e.a, d);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  /* with no gap below, an oversize free tail is handed out rather than mapped after (new pages would
   * join it): PyTorch's behaviour */
  void *f = ALLOC(e.a, 0, 75 * MiB, NULL);
  FREE(e.a, f);
  void *g = ALLOC(e.a, 0, 10 * MiB, NULL);
  EQ(g, f);
  EXPECT_COUNTERS(e.a, 0, 4, 3, 1, 0, 2);
  EXPECT_OVERSIZE(e.a, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 10 * MiB, .active = 1, .active_b = 10 * MiB, .req_b = 10 * MiB,
                  .res_b = 4 * LP, .split = 1, .split_b = 70 * MiB));
  FREE(e.a, g);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* Garbage collection unmaps the whole pages of aged free blocks of the large kind. */
static void garbage_collection_unmaps(void **state) {
  (void)state;
  env e = ENV(1, 200 * MiB, EXP ",garbage_collection_threshold:0.3,per_process_memory_fraction:1.0");
  cachalot_stream s2 = STREAM(e.b, 0), s3 = STREAM(e.b, 0);
  void *a = ALLOC(e.a, 0, 50 * MiB, NULL);
  FREE(e.a, a);
  void *b = ALLOC(e.a, 0, 50 * MiB, s2); /* 120 MiB reserved now, above the 60 MiB threshold */
  FREE(e.a, b);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  /* on s3: collection frees the older candidate (the default stream's pages), then maps */
  void *c = ALLOC(e.a, 0, 50 * MiB, s3);
  EXPECT_COUNTERS(e.a, 0, 3, 1, 0, 0, 0);
  EXPECT_NO_RUNS(e.a, NULL, false);
  EXPECT_RUNS(e.a, s2, false, 0, 3 * LP);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_LARGE_POOL].current, 6 * LP);
  FREE(e.a, c);
  EMPTY(e.a);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

static bool only_stream(cachalot_stream s, void *ctx) { return s == ctx; }

/* A private pool grows its own runs during a capture (mapping is allowed in a global-mode capture), keeps
 * them while in use, and gives them and its reservation back once released. */
static void private_pool_during_capture(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  cachalot_stream s = STREAM(e.b, 0);
  const cachalot_mempool_id id = {0, 7};
  OK(cachalot_sim_capture_begin(e.b, s, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only_stream, s));
  void *a = ALLOC(e.a, 0, 30 * MiB, s);
  void *b = ALLOC(e.a, 0, 100, s);
  void *c = ALLOC(e.a, 0, 30 * MiB, NULL); /* not routed: the default pool */
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  OK(cachalot_sim_capture_end(e.b, s));
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 100, .res_b = SP, .split = 1,
                  .split_b = SP - 512),
               PX(.alloc = 2, .alloc_b = 60 * MiB, .active = 2, .active_b = 60 * MiB, .req_b = 60 * MiB,
                  .res_b = 4 * LP, .split = 2, .split_b = 20 * MiB));
  EXPECT_RUNS(e.a, NULL, false, 0, 2 * LP); /* the default pool's own reservation */
  FREE(e.a, a);
  FREE(e.a, b);
  FREE(e.a, c);
  EMPTY(e.a); /* the pool is still in use: its pages stay */
  EXPECT_POOLS(e.a, 0, PX(.res_b = SP), PX(.res_b = 2 * LP));
  EXPECT_RESERVED_IS_USED(&e, 0);
  size_t vranges = 0;
  for (cl_vrange *vr = e.a->devices[0].vranges; vr; vr = vr->next)
    vranges++;
  EQ(vranges, 2); /* the pool's two; the default pool's stream has nothing left: its reservation went too */
  OK(cachalot_release_pool(e.a, 0, id));
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  vranges = 0;
  for (cl_vrange *vr = e.a->devices[0].vranges; vr; vr = vr->next)
    vranges++;
  EQ(vranges, 0); /* the pool's two went with it */
  env_free(&e);
}

/* A cachalot_graph captures into its pool's own runs, replays, and gives them back after reset. */
static void graph_capture_and_reset(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = NULL;
  OK(cachalot_graph_create(e.a, 0, false, &g));
  OK(cachalot_graph_capture_begin(g, s, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_GLOBAL));
  void *a = ALLOC(e.a, 0, 30 * MiB, s);
  void *b = ALLOC(e.a, 0, 30 * MiB, s); /* the free tail (10) and one more page */
  EQ((char *)b - (char *)a, 30 * MiB);
  OK(cachalot_sim_launch(e.b, s));
  FREE(e.a, a); /* a temporary of the graph: its memory stays in the graph's pool */
  OK(cachalot_graph_capture_end(g));
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 30 * MiB, .active = 1, .active_b = 30 * MiB, .req_b = 30 * MiB,
                  .res_b = 3 * LP, .split = 1, .split_b = 30 * MiB));
  OK(cachalot_graph_replay(g, s));
  OK(cachalot_graph_replay(g, s));
  FREE(e.a, b);
  EMPTY(e.a); /* the graph holds its pool */
  EXPECT_POOLS(e.a, 0, PX0, PX(.res_b = 3 * LP));
  OK(cachalot_graph_reset(g));
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EQ(e.a->devices[0].vranges == NULL, 1); /* the pool and its reservation are gone */
  cachalot_graph_destroy(g);
  env_free(&e);
}

/* Blocks freed on a stream with other streams' uses wait for their events before their pages can go;
 * the snapshot shows each run as one expandable segment. */
static void events_and_snapshot(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  OK(cachalot_record_history(e.a, true, 100));
  cachalot_stream s2 = STREAM(e.b, 0);
  void *a = ALLOC(e.a, 0, 30 * MiB, NULL);
  void *b = ALLOC(e.a, 0, 10 * MiB, NULL);
  RECORD(e.a, a, s2);
  OK(cachalot_sim_launch(e.b, s2)); /* work on s2 that the event waits for */
  FREE(e.a, a);                     /* pending */
  char *json = NULL;
  OK(cachalot_snapshot_json(e.a, &json));
  CONTAINS(json, "\"is_expandable\":true");
  CONTAINS(json, "\"active_pending_free\"");
  free(json);
  /* empty_cache waits for the event; then [0, 20) is a whole free page */
  EMPTY(e.a);
  EXPECT_RUNS(e.a, NULL, false, LP, LP);
  EXPECT_COUNTERS(e.a, 0, 1, 1, 0, 0, 1);
  OK(cachalot_snapshot_json(e.a, &json));
  /* one segment: the run [20, 40) of 20 MiB: [20, 30) free, then b */
  CONTAINS(json, "\"total_size\":20971520");
  assert_null(strstr(json, "\"is_expandable\":false"));
  /* the trace: one map of 40 MiB at the start, one unmap of the first page */
  char entry[160];
  const uintptr_t base = (uintptr_t)a;
  snprintf(entry, sizeof entry, "\"action\":\"segment_map\",\"addr\":%llu,\"size\":%zu", (unsigned long long)base,
           2 * LP);
  CONTAINS(json, entry);
  snprintf(entry, sizeof entry, "\"action\":\"segment_unmap\",\"addr\":%llu,\"size\":%zu", (unsigned long long)base,
           LP);
  CONTAINS(json, entry);
  assert_null(strstr(json, "segment_alloc"));
  free(json);
  FREE(e.a, b);
  EMPTY(e.a);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* expandable_compact: a growth that would set a new reserved peak, above the requested peak + 1/64,
 * first unmaps whole free pages held elsewhere (here a hole between two handed-out blocks); without the
 * key they stay mapped. */
static void compact_unmaps_before_a_new_peak(void **state) {
  (void)state;
  for (int compact = 0; compact <= 1; compact++) {
    env e = ENV(1, 1 * GiB, compact ? EXP ",expandable_compact:True" : EXP);
    void *x = ALLOC(e.a, 0, 40 * MiB, NULL);
    void *y = ALLOC(e.a, 0, 40 * MiB, NULL);
    void *z = ALLOC(e.a, 0, 40 * MiB, NULL);
    FREE(e.a, y); /* a hole of two whole pages: [40, 80) */
    void *w = ALLOC(e.a, 0, 60 * MiB, NULL); /* fits in no free block: 60 MiB more after z */
    EQ(off(e.a, NULL, false, w), 120 * MiB);
    cachalot_device_stats st = STATS(e.a, 0);
    EQ(st.reserved_bytes[CACHALOT_STAT_ALL].peak, compact ? 140 * MiB : 180 * MiB);
    EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, compact ? 140 * MiB : 180 * MiB);
    EQ(st.num_device_free, compact);
    if (compact)
      EXPECT_RUNS(e.a, NULL, false, 0, 2 * LP, 4 * LP, 5 * LP);
    else
      EXPECT_RUNS(e.a, NULL, false, 0, 9 * LP);
    EXPECT_RESERVED_IS_USED(&e, 0);
    /* 40 MiB go into the hole: mapped again (compact; nothing free is left to unmap first) or the free
     * block still there */
    void *v = ALLOC(e.a, 0, 40 * MiB, NULL);
    EQ(off(e.a, NULL, false, v), 40 * MiB);
    EQ(STATS(e.a, 0).num_device_free, compact);
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, 180 * MiB);
    EXPECT_RUNS(e.a, NULL, false, 0, 9 * LP);
    FREE(e.a, x);
    FREE(e.a, z);
    FREE(e.a, w);
    FREE(e.a, v);
    EMPTY(e.a);
    EXPECT_POOLS(e.a, 0, PX0, PX0);
    EXPECT_RESERVED_IS_USED(&e, 0);
    env_free(&e);
  }
}

/* expandable_page_mb:2 (what preset:low_fragmentation sets): the large kind maps and unmaps 2 MiB pages,
 * so a hole between handed-out blocks gives back all its whole 2 MiB pages where a 20 MiB page that
 * still holds a live block gives back nothing; the small kind keeps its 2 MiB page either way. A
 * reservation keeps the page it was made with when the key changes later. */
static void page_size_of_the_large_kind(void **state) {
  (void)state;
  for (int fine = 0; fine <= 1; fine++) {
    env e = ENV(1, 1 * GiB, fine ? EXP ",expandable_page_mb:2" : EXP);
    const size_t pg = fine ? 2 * MiB : LP;
    void *a = ALLOC(e.a, 0, 3 * MiB, NULL); /* 2 pages, or 1 */
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, fine ? 4 * MiB : LP);
    void *b = ALLOC(e.a, 0, 5 * MiB, NULL); /* the free 1 MiB tail and 4 MiB more, or the page's tail */
    EQ((char *)b - (char *)a, 3 * MiB);
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, fine ? 8 * MiB : LP);
    void *c = ALLOC(e.a, 0, 3 * MiB, NULL);
    EQ((char *)c - (char *)a, 8 * MiB);
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, fine ? 12 * MiB : LP);
    EXPECT_RUNS(e.a, NULL, false, 0, fine ? 12 * MiB : LP);
    EXPECT_COUNTERS(e.a, 0, fine ? 3 : 1, 0, 0, 0, 0);
    void *s = ALLOC(e.a, 0, 1000, NULL); /* the small kind: one 2 MiB page in both */
    EXPECT_RUNS(e.a, NULL, true, 0, SP);
    FREE(e.a, b); /* a hole [3, 8) MiB: whole 2 MiB pages [4, 8), no whole 20 MiB page */
    EMPTY(e.a);
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, fine ? 8 * MiB + SP : LP + SP);
    if (fine)
      EXPECT_RUNS(e.a, NULL, false, 0, 4 * MiB, 8 * MiB, 4 * MiB);
    else
      EXPECT_RUNS(e.a, NULL, false, 0, LP);
    EXPECT_RESERVED_IS_USED(&e, 0);
    /* 3 MiB: with 2 MiB pages, the hole's free MiB [3, 4) and [4, 6) mapped again (the lowest gap that
     * holds it with the free tail before it); with 20 MiB pages, the hole itself */
    void *d = ALLOC(e.a, 0, 3 * MiB, NULL);
    EQ((char *)d - (char *)a, 3 * MiB);
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, fine ? 10 * MiB + SP : LP + SP);
    EXPECT_RESERVED_IS_USED(&e, 0);
    /* the key changed later: the reservation made keeps its page */
    OK(cachalot_set_settings(e.a, fine ? "expandable_page_mb:20" : "expandable_page_mb:2"));
    void *f = ALLOC(e.a, 0, 30 * MiB, NULL);
    const size_t before = fine ? 10 * MiB : LP;
    const size_t tail = fine ? 1 * MiB : LP - 11 * MiB; /* the run's free tail after c */
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current,
       before + SP + (30 * MiB - tail + pg - 1) / pg * pg);
    EXPECT_RESERVED_IS_USED(&e, 0);
    FREE(e.a, a);
    FREE(e.a, c);
    FREE(e.a, d);
    FREE(e.a, f);
    FREE(e.a, s);
    EMPTY(e.a);
    EXPECT_POOLS(e.a, 0, PX0, PX0);
    EXPECT_RESERVED_IS_USED(&e, 0);
    env_free(&e);
  }
}

/* preset:low_fragmentation, the sequence tests/gpu/test_gpu.c's fine_pages runs on the device: a growth
 * to a new peak first unmaps the whole 2 MiB page of a hole (compaction at the fine page), the block it
 * joins is kept. */
static void fine_pages_compact(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, "preset:low_fragmentation");
  void *p1 = ALLOC(e.a, 0, 3 * MiB, NULL);
  void *p2 = ALLOC(e.a, 0, 5 * MiB, NULL);
  void *p3 = ALLOC(e.a, 0, 3 * MiB, NULL);
  FREE(e.a, p2);
  EMPTY(e.a);
  void *p4 = ALLOC(e.a, 0, 3 * MiB, NULL);
  EQ((char *)p4 - (char *)p1, 3 * MiB);
  FREE(e.a, p4);
  void *p5 = ALLOC(e.a, 0, 40 * MiB, NULL);
  /* without compaction 50 MiB: the page [4, 6) MiB goes first; the run's free MiB [11, 12) is kept and
   * the 40 MiB start there */
  EQ((char *)p5 - (char *)p1, 11 * MiB);
  cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, 48 * MiB);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].peak, 48 * MiB);
  EXPECT_COUNTERS(e.a, 0, 5, 2, 0, 0, 1);
  EXPECT_RUNS(e.a, NULL, false, 0, 4 * MiB, 8 * MiB, 44 * MiB);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, p1);
  FREE(e.a, p3);
  FREE(e.a, p5);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* preset:low_fragmentation on a 64 MiB device: what is mapped never passes what the device holds; a
 * growth the device cannot hold makes the OOM retry unmap every free 2 MiB page, and a request that
 * still does not fit is an OOM with nothing left half-mapped. */
static void fine_pages_oom(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "preset:low_fragmentation");
  void *a = ALLOC(e.a, 0, 10 * MiB, NULL);
  void *b = ALLOC(e.a, 0, 10 * MiB, NULL);
  void *c = ALLOC(e.a, 0, 10 * MiB, NULL);
  void *d = ALLOC(e.a, 0, 30 * MiB, NULL);
  FREE(e.a, b);
  void *f = ALLOC(e.a, 0, 8 * MiB, NULL); /* in b's hole: [18, 20) MiB stays free */
  FREE(e.a, a);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, 60 * MiB);
  /* 12 MiB fit no free block: compaction gives back the 12 MiB of free pages first, so the device (64
   * MiB) is never asked for more than it holds and the reserved peak stays at 60 MiB */
  void *g = ALLOC(e.a, 0, 12 * MiB, NULL);
  EQ(off(e.a, NULL, false, g), 60 * MiB);
  cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, 60 * MiB);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].peak, 60 * MiB);
  EXPECT_COUNTERS(e.a, 0, 5, 2, 0, 0, 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  void *h = ALLOC(e.a, 0, 4 * MiB, NULL); /* the device is full now */
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, 64 * MiB);
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* c's 10 MiB free and mapped, 12 MiB asked: 54 MiB live + 12 do not fit in 64. The OOM retry unmaps
   * the free 10 MiB (reserved = live), the growth still fails, nothing stays half-mapped */
  FREE(e.a, c);
  void *p = (void *)1;
  STATUS(cachalot_malloc(e.a, 0, 12 * MiB, NULL, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "CUDA out of memory. Tried to allocate 12.00 MiB.");
  CONTAINS(cachalot_last_error(), "of which 10.00 MiB is free");
  st = STATS(e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, 54 * MiB);
  EQ(st.allocated_bytes[CACHALOT_STAT_ALL].current, 54 * MiB);
  EXPECT_COUNTERS(e.a, 0, 6, 3, 1, 1, 1);
  CHECK(e.a);
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* what the device has left serves: 10 MiB fill it to the byte */
  void *k = ALLOC(e.a, 0, 10 * MiB, NULL);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, 64 * MiB);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, d);
  FREE(e.a, f);
  FREE(e.a, g);
  FREE(e.a, h);
  FREE(e.a, k);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* Regression (fuzz_api's first finding): compaction unmapped the last run of a released private pool and
 * left the empty pool behind. It takes the default pool's pages only; released pools go at empty_cache. */
static void compact_leaves_private_pools_alone(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP ",expandable_compact:True");
  cachalot_stream s = STREAM(e.b, 0);
  const cachalot_mempool_id id = {0, 5};
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only_stream, s));
  void *p = ALLOC(e.a, 0, 30 * MiB, s);
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  FREE(e.a, p);
  OK(cachalot_release_pool(e.a, 0, id)); /* freeable, with a free run of 40 MiB */
  CHECK(e.a);
  void *q = ALLOC(e.a, 0, 100 * MiB, NULL); /* a new peak above the bound: compaction finds nothing */
  EQ(STATS(e.a, 0).num_device_free, 0);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, 2 * LP + 5 * LP);
  EMPTY(e.a); /* the released pool's pages go, and the pool with them */
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, 5 * LP);
  EQ(e.a->devices[0].pools == NULL, 1);
  FREE(e.a, q);
  EMPTY(e.a);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* A device that refuses the synchronization before an unmap (here: a global-mode capture cachalot was
 * not told of) gets nothing unmapped: the call reports it, the books and the device still agree, and the
 * pages go once the device allows it. */
static void refused_sync_unmaps_nothing(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  cachalot_stream s = STREAM(e.b, 0);
  void *a = ALLOC(e.a, 0, 30 * MiB, NULL);
  void *b = ALLOC(e.a, 0, 15 * MiB, NULL);
  FREE(e.a, a);
  OK(cachalot_sim_capture_begin(e.b, s, CACHALOT_CAPTURE_GLOBAL));
  STATUS(cachalot_empty_cache(e.a), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "cachalot_empty_cache: ");
  CHECK(e.a);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EXPECT_RUNS(e.a, NULL, false, 0, 3 * LP);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 1);
  OK(cachalot_sim_capture_end(e.b, s));
  void *c = ALLOC(e.a, 0, 25 * MiB, NULL); /* the free 30 MiB, still mapped */
  EQ(c, a);
  FREE(e.a, c);
  EMPTY(e.a);
  EXPECT_RUNS(e.a, NULL, false, LP, 2 * LP);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, b);
  env_free(&e);
}

/* destroy unmaps the runs of both kinds and gives every reservation back. */
static void destroy_gives_everything_back(void **state) {
  (void)state;
  env e = ENV(1, 1 * GiB, EXP);
  cachalot_stream s = STREAM(e.b, 0);
  (void)ALLOC(e.a, 0, 30 * MiB, NULL);
  (void)ALLOC(e.a, 0, 1000, NULL);
  (void)ALLOC(e.a, 0, 1000, s);
  (void)ALLOC(e.a, 0, 50 * MiB, s);
  EQ(USED(e.b, 0), 2 * LP + SP + SP + 3 * LP);
  cachalot_destroy(e.a); /* with memory still handed out: it all goes */
  e.a = NULL;
  EQ(USED(e.b, 0), 0);
  cachalot_backend_destroy(e.b);
}

/* Random requests of both kinds on two streams with frees, record_stream, empty_cache and injected map
 * failures: cachalot_check after every step, and the device's count equals reserved_bytes throughout. */
static void random_sequences(void **state) {
  (void)state;
  for (unsigned seed = 1; seed <= 6; seed++) {
    static const char *confs[4] = {EXP, EXP ",max_split_size_mb:30", EXP ",expandable_compact:True",
                                   "preset:low_fragmentation"};
    env e = ENV(1, 512 * MiB, confs[seed % 4]);
    cachalot_stream st[2] = {NULL, STREAM(e.b, 0)};
    void *live[64] = {0};
    uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    for (int step = 0; step < 1500; step++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const unsigned slot = (unsigned)(x % 64), op = (unsigned)((x >> 8) % 100);
      if (op < 3) {
        EMPTY(e.a);
      } else if (op < 5) {
        OK(cachalot_sim_fail_device_allocs(e.b, 1));
      } else if (live[slot]) {
        if (op < 15)
          RECORD(e.a, live[slot], st[1]);
        FREE(e.a, live[slot]);
        live[slot] = NULL;
        if (op < 20)
          COMPLETE(&e, st[1]);
      } else {
        const size_t size = (x >> 20) % 4 == 0 ? 1 + (x >> 24) % (1 * MiB) : 1 + (x >> 24) % (48 * MiB);
        void *p = NULL;
        cachalot_status rc = cachalot_malloc(e.a, 0, size, st[(x >> 40) & 1], &p);
        if (rc != CACHALOT_OK)
          STATUS(rc, CACHALOT_ERROR_OUT_OF_MEMORY);
        live[slot] = p;
        CHECK(e.a);
      }
      EXPECT_RESERVED_IS_USED(&e, 0);
    }
    OK(cachalot_sim_fail_device_allocs(e.b, 0));
    for (int i = 0; i < 64; i++)
      if (live[i])
        FREE(e.a, live[i]);
    COMPLETE(&e, st[1]);
    EMPTY(e.a);
    EXPECT_POOLS(e.a, 0, PX0, PX0);
    EXPECT_RESERVED_IS_USED(&e, 0);
    env_free(&e);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(growth_maps_what_is_missing),
      cmocka_unit_test(unmaps_whole_free_pages_only),
      cmocka_unit_test(oom_during_mapping_gives_back),
      cmocka_unit_test(max_split_size_and_oversize_release),
      cmocka_unit_test(garbage_collection_unmaps),
      cmocka_unit_test(private_pool_during_capture),
      cmocka_unit_test(graph_capture_and_reset),
      cmocka_unit_test(events_and_snapshot),
      cmocka_unit_test(compact_unmaps_before_a_new_peak),
      cmocka_unit_test(page_size_of_the_large_kind),
      cmocka_unit_test(fine_pages_compact),
      cmocka_unit_test(fine_pages_oom),
      cmocka_unit_test(compact_leaves_private_pools_alone),
      cmocka_unit_test(refused_sync_unmaps_nothing),
      cmocka_unit_test(destroy_gives_everything_back),
      cmocka_unit_test(random_sequences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
