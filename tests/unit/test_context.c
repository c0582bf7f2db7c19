/* The C API for language bindings on the simulated device: contexts kept with blocks and trace entries
 * (reference counts exact at every step), cachalot_snapshot_take, get_memory_fraction, pool_use_count,
 * empty_cache_pool and cachalot_version. Exact counts, cachalot_check after every step (ALLOC/FREE/...
 * run it, the context calls below too). */
#include "helpers.h"

#include <cachalot/pool.h>
#include <cachalot/snapshot.h>

#include <ctype.h>
#include <string.h>

/* ---- a test context: the caller holds one reference (refs starts at 1) ------------------------------ */

typedef struct {
  int refs, retains, releases;
  bool underflow; /* a release below zero: the callbacks run under allocator locks, so no cmocka call */
} tctx;

static void t_retain(void *p) {
  tctx *c = p;
  c->refs++;
  c->retains++;
}

static void t_release(void *p) {
  tctx *c = p;
  if (c->refs <= 0)
    c->underflow = true;
  c->refs--;
  c->releases++;
}

static const cachalot_context_ops OPS = {t_retain, t_release};

#define CTX_INIT {.refs = 1}

static void refs_are_(const tctx *c, int refs, const char *what, const char *file, int line) {
  if (c->underflow) {
    print_error("%s:%d: %s was released more often than retained\n", file, line, what);
    _fail(file, line);
  }
  if (c->refs != refs || c->retains - c->releases != refs - 1) {
    print_error("%s:%d: %s has %d references (%d retains, %d releases), expected %d\n", file, line, what, c->refs,
                c->retains, c->releases, refs);
    _fail(file, line);
  }
}
/* REFS(c, n): the caller's own reference plus n - 1 kept by cachalot. */
#define REFS(c, n) refs_are_(&(c), (n), #c, __FILE__, __LINE__)

static void ptr_eq_(const void *actual, const void *expected, const char *what, const char *file, int line) {
  if (actual != expected) {
    print_error("%s:%d: %s is %p, expected %p\n", file, line, what, actual, expected);
    _fail(file, line);
  }
}
#define PTR_EQ(actual, expected) ptr_eq_((const void *)(actual), (const void *)(expected), #actual, __FILE__, __LINE__)

static void *alloc_ctx_(cachalot_allocator *a, int device, size_t size, cachalot_stream s, void *ctx,
                        const char *file, int line) {
  void *p = NULL;
  status_is_(cachalot_malloc_with_context(a, device, size, s, ctx, &p), CACHALOT_OK, "cachalot_malloc_with_context",
             file, line);
  if (!p)
    _fail(file, line);
  check_(a, file, line);
  return p;
}
#define ALLOC_CTX(a, device, size, s, ctx) alloc_ctx_((a), (device), (size), (s), (ctx), __FILE__, __LINE__)

static void free_ctx_(cachalot_allocator *a, void *p, void *ctx, const char *file, int line) {
  status_is_(cachalot_free_with_context(a, p, ctx), CACHALOT_OK, "cachalot_free_with_context", file, line);
  check_(a, file, line);
}
#define FREE_CTX(a, p, ctx) free_ctx_((a), (p), (ctx), __FILE__, __LINE__)

#define HISTORY(a, on, n)                                                                                             \
  do {                                                                                                                \
    OK(cachalot_record_history((a), (on), (n)));                                                                      \
    CHECK(a);                                                                                                         \
  } while (0)

static cachalot_snapshot_info *take_(cachalot_allocator *a, bool trace, const char *file, int line) {
  cachalot_snapshot_info *s = NULL;
  status_is_(cachalot_snapshot_take(a, trace, &s), CACHALOT_OK, "cachalot_snapshot_take", file, line);
  if (!s)
    _fail(file, line);
  check_(a, file, line);
  return s;
}
#define TAKE(a, trace) take_((a), (trace), __FILE__, __LINE__)

static bool only(cachalot_stream s, void *ctx) { return s == (cachalot_stream)ctx; }

/* ---- set_context_ops -------------------------------------------------------------------------------- */

static void test_set_ops_arguments(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  STATUS(cachalot_set_context_ops(NULL, &OPS), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_set_context_ops(e.a, &(cachalot_context_ops){t_retain, NULL}), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_set_context_ops(e.a, &(cachalot_context_ops){NULL, t_release}), CACHALOT_ERROR_INVALID_ARGUMENT);
  OK(cachalot_set_context_ops(e.a, &OPS));
  OK(cachalot_set_context_ops(e.a, NULL));
  OK(cachalot_set_context_ops(e.a, &OPS));
  CHECK(e.a);
  env_free(&e);
}

/* NULL ops turn contexts off: with history on, nothing is retained. Also the refused half-set ops must not
 * have replaced the ones in force. */
static void test_null_ops_keep_nothing(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  tctx c = CTX_INIT;
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, NULL, &c); /* no ops were ever set */
  REFS(c, 1);
  OK(cachalot_set_context_ops(e.a, &OPS));
  OK(cachalot_set_context_ops(e.a, NULL));
  void *q = ALLOC_CTX(e.a, 0, 1000, NULL, &c);
  FREE_CTX(e.a, p, &c);
  REFS(c, 1);
  OK(cachalot_set_context_ops(e.a, &OPS));
  STATUS(cachalot_set_context_ops(e.a, &(cachalot_context_ops){NULL, t_release}), CACHALOT_ERROR_INVALID_ARGUMENT);
  void *r = ALLOC_CTX(e.a, 0, 1000, NULL, &c);
  REFS(c, 3);
  FREE(e.a, q);
  FREE(e.a, r);
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  env_free(&e);
  REFS(c, 1);
}

/* ---- reference counting ------------------------------------------------------------------------------ */

static void test_history_off_keeps_nothing(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  tctx c = CTX_INIT, f = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  void *p = ALLOC_CTX(e.a, 0, 1000, NULL, &c);
  void *q = ALLOC_CTX(e.a, 0, 3 * MiB, NULL, &c);
  REFS(c, 1);
  FREE_CTX(e.a, p, &f);
  FREE_CTX(e.a, q, &f);
  REFS(c, 1);
  REFS(f, 1);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX(.seg = 1, .res_b = 20 * MiB));
  /* nothing kept: changing the ops is allowed at once */
  OK(cachalot_set_context_ops(e.a, NULL));
  env_free(&e);
  REFS(c, 1);
  REFS(f, 1);
}

static void test_history_on_block_and_entries(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  tctx c = CTX_INIT, f = CTX_INIT, g = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, s, &c);
  REFS(c, 5); /* the block, the alloc entry, the segment it made and that segment's segment_alloc entry */
  void *n = ALLOC_CTX(e.a, 0, 512, s, NULL); /* a NULL context is allowed and keeps nothing */
  /* the thread's context is the call's alone: a plain malloc/free afterwards keeps nothing */
  void *x = ALLOC(e.a, 0, 512, s);
  FREE(e.a, x);
  REFS(c, 5);
  STATUS(cachalot_set_context_ops(e.a, &OPS), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "4 context references are still kept");
  FREE_CTX(e.a, p, &f);
  REFS(c, 4); /* the block's reference goes at free; the entries' and the segment's stay */
  REFS(f, 3); /* the free_requested and free_completed entries */
  /* a failed free keeps nothing */
  STATUS(cachalot_free_with_context(e.a, (void *)(uintptr_t)0x10, &g), CACHALOT_ERROR_INVALID_POINTER);
  REFS(g, 1);
  FREE_CTX(e.a, n, NULL);

  cachalot_snapshot_info *si = TAKE(e.a, true);
  /* segment_alloc, alloc p, alloc n, alloc x, free_requested x, free_completed x, free_requested p,
   * free_completed p, free_requested n, free_completed n (the snapshot's own entry comes after the trace
   * is read, as PyTorch's) */
  const cachalot_trace_action want[] = {
      CACHALOT_TRACE_SEGMENT_ALLOC, CACHALOT_TRACE_ALLOC,          CACHALOT_TRACE_ALLOC,
      CACHALOT_TRACE_ALLOC,         CACHALOT_TRACE_FREE_REQUESTED, CACHALOT_TRACE_FREE_COMPLETED,
      CACHALOT_TRACE_FREE_REQUESTED, CACHALOT_TRACE_FREE_COMPLETED, CACHALOT_TRACE_FREE_REQUESTED,
      CACHALOT_TRACE_FREE_COMPLETED};
  const void *want_ctx[] = {&c, &c, NULL, NULL, NULL, NULL, &f, &f, NULL, NULL};
  EQ(si->n_trace, 10);
  for (size_t i = 0; i < si->n_trace; i++) {
    EQ(si->trace[i].action, want[i]);
    PTR_EQ(si->trace[i].context, want_ctx[i]);
  }
  PTR_EQ(si->trace[1].addr, p);
  PTR_EQ(si->trace[6].addr, p);
  REFS(c, 6); /* one more for each of the snapshot's entries */
  REFS(f, 5);
  cachalot_snapshot_info_free(e.a, si);
  REFS(c, 4);
  REFS(f, 3);

  HISTORY(e.a, false, 0); /* the trace's references go */
  REFS(c, 1);
  REFS(f, 1);
  OK(cachalot_set_context_ops(e.a, &OPS)); /* none kept any more */
  CHECK(e.a);
  env_free(&e);
  REFS(c, 1);
  REFS(f, 1);
  REFS(g, 1);
}

/* Turning history on again clears the buffer: the old entries' references go, the blocks' stay. */
static void test_history_restart_releases_entries(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  tctx c = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, NULL, &c);
  REFS(c, 5); /* the block, its alloc and segment_alloc entries, its segment */
  HISTORY(e.a, true, 100);
  REFS(c, 3); /* the entries go; the block and the segment keep theirs */
  FREE(e.a, p); /* its free entries take the block's context: the new buffer keeps two */
  REFS(c, 4);
  HISTORY(e.a, false, 0);
  env_free(&e);
  REFS(c, 1);
}

static void test_ring_overwrite_releases(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  tctx c[4] = {CTX_INIT, CTX_INIT, CTX_INIT, CTX_INIT};
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 2);
  void *p[4];
  /* the ring after each: [segment_alloc, alloc0], [alloc0, alloc1], [alloc1, alloc2], [alloc2, alloc3] */
  for (int i = 0; i < 4; i++)
    p[i] = ALLOC_CTX(e.a, 0, 512, NULL, &c[i]);
  REFS(c[0], 3); /* the block and the segment block 0's malloc made */
  REFS(c[1], 2);
  REFS(c[2], 3);
  REFS(c[3], 3);
  FREE(e.a, p[0]); /* [free_requested 0, free_completed 0], which take block 0's context (the free gives
                      none): 2's and 3's entries are overwritten */
  REFS(c[0], 4);
  REFS(c[1], 2);
  REFS(c[2], 2);
  REFS(c[3], 2);
  cachalot_snapshot_info *si = TAKE(e.a, true);
  EQ(si->n_trace, 2); /* [free_requested 0, free_completed 0]; the snapshot's entry comes after */
  EQ(si->trace[0].action, CACHALOT_TRACE_FREE_REQUESTED);
  EQ(si->trace[1].action, CACHALOT_TRACE_FREE_COMPLETED);
  REFS(c[1], 3); /* blocks 1..3 in the snapshot */
  cachalot_snapshot_info_free(e.a, si);
  for (int i = 1; i < 4; i++) {
    REFS(c[i], 2);
    FREE(e.a, p[i]);
    REFS(c[i], 3); /* its two free entries fill the ring */
    REFS(c[i - 1], i == 1 ? 2 : 1); /* c[0] stays with the segment */
  }
  HISTORY(e.a, false, 0);
  env_free(&e);
  for (int i = 0; i < 4; i++)
    REFS(c[i], 1);
}

/* An unbounded limit (PyTorch's max_entries=sys.maxsize) is taken, and the ring grows as entries come: past
 * its first 4096 rows twice, every entry kept in order. A limit between two sizes of the ring stops the
 * growth there and wraps: the last 5000 entries, in order. */
static void test_history_grows_as_entries_come(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  static const cachalot_trace_action cycle[3] = {CACHALOT_TRACE_ALLOC, CACHALOT_TRACE_FREE_REQUESTED,
                                                 CACHALOT_TRACE_FREE_COMPLETED};
  HISTORY(e.a, true, SIZE_MAX);
  for (int i = 0; i < 3000; i++)
    FREE(e.a, ALLOC(e.a, 0, 512, NULL));
  cachalot_snapshot_info *si = TAKE(e.a, true);
  EQ(si->n_trace, 1 + 3 * 3000); /* segment_alloc, the pairs: 9001 > 2 x 4096 */
  EQ(si->trace[0].action, CACHALOT_TRACE_SEGMENT_ALLOC);
  for (size_t k = 1; k < si->n_trace; k++) {
    EQ(si->trace[k].action, cycle[(k - 1) % 3]);
    EQ(si->trace[k].size, 512);
  }
  cachalot_snapshot_info_free(e.a, si);

  HISTORY(e.a, true, 5000); /* cleared; the segment stays cached, so no segment_alloc */
  for (int i = 0; i < 3000; i++)
    FREE(e.a, ALLOC(e.a, 0, 512, NULL));
  si = TAKE(e.a, true);
  EQ(si->n_trace, 5000); /* the first take's snapshot entry is gone with the clearing: entries 4000..8999 */
  for (size_t k = 0; k < si->n_trace; k++)
    EQ(si->trace[k].action, cycle[(4000 + k) % 3]);
  cachalot_snapshot_info_free(e.a, si);
  HISTORY(e.a, false, 0);
  env_free(&e);
}

/* Turning history off lets go of every context, the blocks' too, so that the warm paths (which run only
 * while no block holds one) come back; the blocks themselves stay allocated and free as usual. */
static void test_history_off_lets_go_of_blocks(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  tctx c = CTX_INIT, d = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, s, &c);
  void *q = ALLOC_CTX(e.a, 0, 3 * MiB, s, &d);
  REFS(c, 5); /* the block, its alloc entry, its segment and the segment's segment_alloc entry */
  REFS(d, 5);
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  REFS(d, 1);
  /* nothing kept: the ops may change, and a snapshot shows no context */
  OK(cachalot_set_context_ops(e.a, NULL));
  OK(cachalot_set_context_ops(e.a, &OPS));
  cachalot_snapshot_info *si = TAKE(e.a, true);
  EQ(si->n_trace, 0);
  EQ(si->n_segments, 2);
  for (size_t i = 0; i < 2; i++)
    PTR_EQ(si->segments[i].blocks[0].context, NULL);
  cachalot_snapshot_info_free(e.a, si);
  /* with history off a new block keeps nothing */
  void *r = ALLOC_CTX(e.a, 0, 1000, s, &c);
  REFS(c, 1);
  FREE(e.a, p);
  FREE(e.a, q);
  FREE(e.a, r);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX(.seg = 1, .res_b = 20 * MiB));
  env_free(&e);
  REFS(c, 1);
  REFS(d, 1);
}

/* History on again after off: blocks allocated before keep nothing, new ones keep theirs, and each free
 * lets go of exactly its own. */
static void test_history_off_then_free_each(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  tctx c[8];
  void *p[8];
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 4);
  for (int i = 0; i < 4; i++) {
    c[i] = (tctx)CTX_INIT;
    p[i] = ALLOC_CTX(e.a, 0, (size_t)(i + 1) * 512, s, &c[i]);
  }
  HISTORY(e.a, false, 0);
  HISTORY(e.a, true, 100);
  for (int i = 4; i < 8; i++) {
    c[i] = (tctx)CTX_INIT;
    p[i] = ALLOC_CTX(e.a, 0, (size_t)(i + 1) * 512, s, &c[i]);
  }
  for (int i = 0; i < 8; i++)
    REFS(c[i], i < 4 ? 1 : 3);
  for (int i = 0; i < 8; i++) {
    FREE(e.a, p[i]);
    REFS(c[i], i < 4 ? 1 : 4); /* the alloc entry stays in the ring, and its free entries take it */
    for (int k = i + 1; k < 8; k++)
      REFS(c[k], k < 4 ? 1 : 3);
  }
  HISTORY(e.a, false, 0);
  for (int i = 0; i < 8; i++)
    REFS(c[i], 1);
  OK(cachalot_set_context_ops(e.a, NULL));
  void *x = ALLOC(e.a, 0, 512, s);
  FREE(e.a, x);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  env_free(&e);
}

/* A failed malloc keeps no block, and its context only on its oom entry (as PyTorch's oom entry keeps the
 * malloc's context); a call refused for its arguments, or of size 0, keeps nothing. */
static void test_failed_malloc_keeps_nothing(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "");
  tctx c = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = (void *)(uintptr_t)1;
  STATUS(cachalot_malloc_with_context(e.a, 0, GiB, NULL, &c, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  CHECK(e.a);
  REFS(c, 2); /* the oom entry's */
  cachalot_snapshot_info *si = TAKE(e.a, true);
  EQ(si->n_trace, 1);
  EQ(si->trace[0].action, CACHALOT_TRACE_OOM);
  PTR_EQ(si->trace[0].context, &c);
  cachalot_snapshot_info_free(e.a, si);
  STATUS(cachalot_malloc_with_context(e.a, 1, 512, NULL, &c, &p), CACHALOT_ERROR_INVALID_ARGUMENT);
  REFS(c, 2);
  OK(cachalot_malloc_with_context(e.a, 0, 0, NULL, &c, &p)); /* size 0: no block, nothing kept */
  assert_null(p);
  REFS(c, 2);
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  env_free(&e);
  REFS(c, 1);
}

/* cachalot_destroy lets go of everything: blocks still allocated (default and private pool, two devices)
 * and trace entries. */
static void test_destroy_releases_everything(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  cachalot_stream s0 = STREAM(e.b, 0), s1 = STREAM(e.b, 1), cap = STREAM(e.b, 1);
  tctx c[5] = {CTX_INIT, CTX_INIT, CTX_INIT, CTX_INIT, CTX_INIT};
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  (void)ALLOC_CTX(e.a, 0, 1000, s0, &c[0]);
  (void)ALLOC_CTX(e.a, 0, 5 * MiB, s0, &c[1]);
  void *q = ALLOC_CTX(e.a, 1, 1000, s1, &c[2]);
  FREE_CTX(e.a, q, &c[3]);
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 1, id, only, cap));
  (void)ALLOC_CTX(e.a, 1, 3 * MiB, cap, &c[4]);
  REFS(c[0], 5); /* the block, its alloc entry, its segment and the segment's segment_alloc entry */
  REFS(c[1], 5);
  REFS(c[2], 4); /* the alloc and segment_alloc entries, the segment */
  REFS(c[3], 3); /* the free_requested and free_completed entries */
  REFS(c[4], 5);
  cachalot_snapshot_info *si = TAKE(e.a, true);
  cachalot_snapshot_info_free(e.a, si);
  cachalot_destroy(e.a); /* the routing still active, the blocks still allocated */
  e.a = NULL;
  for (int i = 0; i < 5; i++)
    REFS(c[i], 1);
  cachalot_backend_destroy(e.b);
}

/* ---- a block pending free --------------------------------------------------------------------------- */

/* Freed while another stream still uses it, the block is pending: it is still the caller's allocation as
 * far as the snapshot goes, with its context, until its events complete. */
static void test_pending_free_keeps_context(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0);
  tctx c = CTX_INIT, f = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, s, &c);
  RECORD(e.a, p, side);
  FREE_CTX(e.a, p, &f);
  REFS(f, 2);
  cachalot_snapshot_info *si = TAKE(e.a, false);
  EQ(si->n_segments, 1);
  EQ(si->segments[0].n_blocks, 2);
  const cachalot_snapshot_block *b = &si->segments[0].blocks[0];
  PTR_EQ(b->address, p);
  EQ(b->size, 1024);
  EQ(b->requested, 1000);
  EQ(b->state, CACHALOT_BLOCK_PENDING_FREE);
  PTR_EQ(b->context, &c);
  REFS(c, 6); /* the block, the alloc and segment_alloc entries, the segment, the snapshot's block */
  cachalot_snapshot_info_free(e.a, si);
  REFS(c, 5);
  COMPLETE(&e, side);
  EMPTY(e.a); /* the completed event is seen: the block is free, its context goes to the free_completed
                 entry, which no free call gave one (PyTorch's rule: the block's own); the segment goes,
                 its context to its segment_free entry */
  REFS(c, 5);
  si = TAKE(e.a, true);
  PTR_EQ(si->trace[si->n_trace - 2].context, &c); /* free_completed, then the segment's segment_free */
  EQ(si->trace[si->n_trace - 2].action, CACHALOT_TRACE_FREE_COMPLETED);
  EQ(si->trace[si->n_trace - 1].action, CACHALOT_TRACE_SEGMENT_FREE);
  PTR_EQ(si->trace[si->n_trace - 1].context, &c); /* the malloc's that made the segment */
  cachalot_snapshot_info_free(e.a, si);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  REFS(f, 1);
  env_free(&e);
}

/* Expandable segments: a malloc that must unmap another stream's cached pages to map its own gives both
 * the segment_unmap and the segment_map entries its context, as PyTorch's allocator gives the release it
 * runs for a malloc the malloc's context; empty_cache, called without one, leaves its unmap without. */
static void test_unmap_takes_the_calls_context(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "expandable_segments:True");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  tctx c = CTX_INIT, d = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 40 * MiB, s1, &c);
  FREE(e.a, p); /* cached on s1, mapped */
  void *q = ALLOC_CTX(e.a, 0, 40 * MiB, s2, &d); /* 80 MiB would not fit: s1's pages go first */
  cachalot_snapshot_info *si = TAKE(e.a, true);
  size_t unmaps = 0, maps_d = 0;
  for (size_t i = 0; i < si->n_trace; i++) {
    const cachalot_trace_entry *t = &si->trace[i];
    if (t->action == CACHALOT_TRACE_SEGMENT_UNMAP) {
      unmaps++;
      PTR_EQ(t->context, &d);
    }
    maps_d += t->action == CACHALOT_TRACE_SEGMENT_MAP && t->context == &d;
  }
  EQ(unmaps, 1);
  EQ(maps_d, 1);
  cachalot_snapshot_info_free(e.a, si);
  FREE(e.a, q);
  EMPTY(e.a);
  si = TAKE(e.a, true);
  EQ(si->trace[si->n_trace - 1].action, CACHALOT_TRACE_SEGMENT_UNMAP);
  PTR_EQ(si->trace[si->n_trace - 1].context, NULL);
  cachalot_snapshot_info_free(e.a, si);
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  REFS(d, 1);
  env_free(&e);
}

/* A pool restore frees the blocks allocated since the checkpoint: their contexts go with them. */
static void test_restore_releases_block_contexts(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  tctx c = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, cap));
  void *x = ALLOC(e.a, 0, 512, cap);
  cachalot_pool_state *ck = NULL;
  OK(cachalot_checkpoint_pool(e.a, 0, id, &ck));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, cap, &c);
  REFS(c, 3);
  void **ptrs = NULL;
  size_t n = 0;
  OK(cachalot_restore_pool(e.a, ck, &ptrs, &n));
  CHECK(e.a);
  EQ(n, 1);
  PTR_EQ(ptrs[0], x);
  REFS(c, 4); /* p is free again; its alloc entry stays, and its free entries took its context */
  void *again = ALLOC_CTX(e.a, 0, 1000, cap, NULL);
  PTR_EQ(again, p);
  FREE(e.a, again);
  /* restored with a context: the re-carved block keeps it (and its alloc entry), as PyTorch gives the
   * re-carved blocks the restore's */
  tctx r = CTX_INIT;
  free(ptrs);
  ptrs = NULL;
  OK(cachalot_restore_pool_with_context(e.a, ck, &r, &ptrs, &n));
  CHECK(e.a);
  EQ(n, 1);
  PTR_EQ(ptrs[0], x);
  REFS(r, 3); /* the block, its alloc entry */
  cachalot_snapshot_info *si = TAKE(e.a, false);
  bool found = false;
  for (size_t i = 0; i < si->n_segments; i++)
    for (size_t k = 0; k < si->segments[i].n_blocks; k++)
      if (si->segments[i].blocks[k].address == (uintptr_t)x) {
        PTR_EQ(si->segments[i].blocks[k].context, &r);
        found = true;
      }
  assert_true(found);
  cachalot_snapshot_info_free(e.a, si);
  FREE(e.a, ptrs[0]);
  REFS(r, 4); /* the block's went to its free entries (requested and completed) */
  free(ptrs);
  cachalot_pool_state_free(ck);
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  REFS(r, 1);
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  OK(cachalot_release_pool(e.a, 0, id));
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

/* ---- cachalot_snapshot_take -------------------------------------------------------------------------- */

typedef struct {
  uintptr_t address;
  size_t size, requested;
  cachalot_block_kind state;
  const void *context;
} block_x;

typedef struct {
  int device;
  uintptr_t address;
  size_t total;
  cachalot_stream stream;
  bool small;
  cachalot_mempool_id pool;
  size_t n_blocks;
  block_x blocks[2];
} segment_x;

static void expect_segment_(const cachalot_snapshot_segment *g, const segment_x *x, const char *file, int line) {
  eq_i64_(g->device, x->device, "segment.device", file, line);
  eq_i64_((int64_t)g->address, (int64_t)x->address, "segment.address", file, line);
  eq_i64_((int64_t)g->total_size, (int64_t)x->total, "segment.total_size", file, line);
  eq_i64_((int64_t)(uintptr_t)g->stream, (int64_t)(uintptr_t)x->stream, "segment.stream", file, line);
  eq_i64_(g->small, x->small, "segment.small", file, line);
  eq_i64_(g->expandable, 0, "segment.expandable", file, line);
  eq_i64_((int64_t)g->pool.first, (int64_t)x->pool.first, "segment.pool.first", file, line);
  eq_i64_((int64_t)g->pool.second, (int64_t)x->pool.second, "segment.pool.second", file, line);
  eq_i64_((int64_t)g->n_blocks, (int64_t)x->n_blocks, "segment.n_blocks", file, line);
  for (size_t k = 0; k < x->n_blocks; k++) {
    const cachalot_snapshot_block *gb = &g->blocks[k];
    const block_x *xb = &x->blocks[k];
    eq_i64_((int64_t)gb->address, (int64_t)xb->address, "block.address", file, line);
    eq_i64_((int64_t)gb->size, (int64_t)xb->size, "block.size", file, line);
    eq_i64_((int64_t)gb->requested, (int64_t)xb->requested, "block.requested", file, line);
    eq_i64_(gb->state, xb->state, "block.state", file, line);
    ptr_eq_(gb->context, xb->context, "block.context", file, line);
  }
}
#define EXPECT_SEGMENT(g, x) expect_segment_((g), (x), __FILE__, __LINE__)

static int cmp_segment_x(const void *x, const void *y) {
  const segment_x *a = x, *b = y;
  if (a->device != b->device)
    return a->device < b->device ? -1 : 1;
  return a->address < b->address ? -1 : a->address > b->address;
}

static void expect_trace_(const cachalot_trace_entry *t, cachalot_trace_action action, int device, uintptr_t addr,
                          size_t size, cachalot_stream s, const void *ctx, const char *file, int line) {
  eq_i64_(t->action, action, "trace.action", file, line);
  eq_i64_(t->device, device, "trace.device", file, line);
  eq_i64_((int64_t)t->addr, (int64_t)addr, "trace.addr", file, line);
  eq_i64_((int64_t)t->size, (int64_t)size, "trace.size", file, line);
  eq_i64_((int64_t)(uintptr_t)t->stream, (int64_t)(uintptr_t)s, "trace.stream", file, line);
  ptr_eq_(t->context, ctx, "trace.context", file, line);
}
#define EXPECT_TRACE(t, action, device, addr, size, s, ctx)                                                         \
  expect_trace_((t), (action), (device), (uintptr_t)(addr), (size), (s), (ctx), __FILE__, __LINE__)

static void test_snapshot_take_layout(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  cachalot_stream s = STREAM(e.b, 0), cap = STREAM(e.b, 0), s1 = STREAM(e.b, 1);
  tctx c = CTX_INIT, d = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  char *p = ALLOC_CTX(e.a, 0, 1000, s, &c);    /* a small segment (2 MiB) */
  char *q = ALLOC_CTX(e.a, 0, 3 * MiB, s, &d); /* a large one (20 MiB) */
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, cap));
  char *r = ALLOC(e.a, 0, 512, cap); /* the private pool's own small segment */
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  char *t = ALLOC(e.a, 1, 512, s1);
  char *u = ALLOC(e.a, 1, 512, s1);
  FREE(e.a, u); /* merges back into the free rest of device 1's segment */
  REFS(c, 5); /* the block, its alloc entry, its segment and the segment's segment_alloc entry */
  REFS(d, 5);

  cachalot_snapshot_info *si = TAKE(e.a, true);
  const cachalot_mempool_id dflt = {0, 0};
  segment_x want[] = {
      {0, (uintptr_t)p, 2 * MiB, s, true, dflt, 2,
       {{(uintptr_t)p, 1024, 1000, CACHALOT_BLOCK_ALLOCATED, &c},
        {(uintptr_t)p + 1024, 2 * MiB - 1024, 0, CACHALOT_BLOCK_FREE, NULL}}},
      {0, (uintptr_t)q, 20 * MiB, s, false, dflt, 2,
       {{(uintptr_t)q, 3 * MiB, 3 * MiB, CACHALOT_BLOCK_ALLOCATED, &d},
        {(uintptr_t)q + 3 * MiB, 17 * MiB, 0, CACHALOT_BLOCK_FREE, NULL}}},
      {0, (uintptr_t)r, 2 * MiB, cap, true, id, 2,
       {{(uintptr_t)r, 512, 512, CACHALOT_BLOCK_ALLOCATED, NULL},
        {(uintptr_t)r + 512, 2 * MiB - 512, 0, CACHALOT_BLOCK_FREE, NULL}}},
      {1, (uintptr_t)t, 2 * MiB, s1, true, dflt, 2,
       {{(uintptr_t)t, 512, 512, CACHALOT_BLOCK_ALLOCATED, NULL},
        {(uintptr_t)t + 512, 2 * MiB - 512, 0, CACHALOT_BLOCK_FREE, NULL}}},
  };
  qsort(want, 4, sizeof want[0], cmp_segment_x); /* by device, then address */
  EQ(si->n_segments, 4);
  for (size_t i = 0; i < 4; i++)
    EXPECT_SEGMENT(&si->segments[i], &want[i]);

  /* device 0's entries, oldest first, then device 1's */
  EQ(si->n_trace, 6 + 5);
  const cachalot_trace_entry *tr = si->trace;
  EXPECT_TRACE(&tr[0], CACHALOT_TRACE_SEGMENT_ALLOC, 0, p, 2 * MiB, s, &c); /* the malloc's context */
  EXPECT_TRACE(&tr[1], CACHALOT_TRACE_ALLOC, 0, p, 1000, s, &c);
  EXPECT_TRACE(&tr[2], CACHALOT_TRACE_SEGMENT_ALLOC, 0, q, 20 * MiB, s, &d);
  EXPECT_TRACE(&tr[3], CACHALOT_TRACE_ALLOC, 0, q, 3 * MiB, s, &d);
  EXPECT_TRACE(&tr[4], CACHALOT_TRACE_SEGMENT_ALLOC, 0, r, 2 * MiB, cap, NULL);
  EXPECT_TRACE(&tr[5], CACHALOT_TRACE_ALLOC, 0, r, 512, cap, NULL);
  EXPECT_TRACE(&tr[6], CACHALOT_TRACE_SEGMENT_ALLOC, 1, t, 2 * MiB, s1, NULL);
  EXPECT_TRACE(&tr[7], CACHALOT_TRACE_ALLOC, 1, t, 512, s1, NULL);
  EXPECT_TRACE(&tr[8], CACHALOT_TRACE_ALLOC, 1, u, 512, s1, NULL);
  EXPECT_TRACE(&tr[9], CACHALOT_TRACE_FREE_REQUESTED, 1, u, 512, s1, NULL);
  EXPECT_TRACE(&tr[10], CACHALOT_TRACE_FREE_COMPLETED, 1, u, 512, s1, NULL);
  for (size_t i = 0; i < si->n_trace; i++) {
    assert_true(tr[i].time_us > 0);
    if (i && tr[i].device == tr[i - 1].device)
      assert_true(tr[i].time_us >= tr[i - 1].time_us);
  }
  REFS(c, 8); /* the block and the two entries, each once in cachalot and once in the snapshot, and
                 the segment */
  REFS(d, 8);
  cachalot_snapshot_info_free(e.a, si);
  REFS(c, 5);
  REFS(d, 5);
  /* each device's "snapshot" entry, recorded after its trace was read (as PyTorch's), is in the next
   * snapshot, its size the device's active bytes then */
  si = TAKE(e.a, true);
  EQ(si->n_trace, 7 + 6);
  EXPECT_TRACE(&si->trace[6], CACHALOT_TRACE_SNAPSHOT, 0, 0, 1024 + 3 * MiB + 512, NULL, NULL);
  EXPECT_TRACE(&si->trace[12], CACHALOT_TRACE_SNAPSHOT, 1, 0, 512, NULL, NULL);
  cachalot_snapshot_info_free(e.a, si);

  FREE(e.a, p);
  FREE(e.a, q);
  FREE(e.a, r);
  FREE(e.a, t);
  OK(cachalot_release_pool(e.a, 0, id));
  HISTORY(e.a, false, 0);
  REFS(c, 1);
  REFS(d, 1);
  env_free(&e);
}

static void test_snapshot_take_without_trace(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  tctx c = CTX_INIT;
  OK(cachalot_set_context_ops(e.a, &OPS));
  HISTORY(e.a, true, 100);
  void *p = ALLOC_CTX(e.a, 0, 1000, NULL, &c);
  cachalot_snapshot_info *si = TAKE(e.a, false);
  EQ(si->n_trace, 0);
  EQ(si->n_segments, 1);
  PTR_EQ(si->segments[0].blocks[0].context, &c);
  REFS(c, 6); /* the block, the alloc and segment_alloc entries, the segment, + the snapshot's block only */
  /* the snapshot's own references outlive the block's and the trace's, and hold off new ops */
  FREE(e.a, p);
  HISTORY(e.a, false, 0);
  REFS(c, 2);
  STATUS(cachalot_set_context_ops(e.a, NULL), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "1 context references are still kept");
  PTR_EQ(si->segments[0].blocks[0].context, &c);
  cachalot_snapshot_info_free(e.a, si);
  REFS(c, 1);
  OK(cachalot_set_context_ops(e.a, NULL));

  /* without trace the history is left as it is: only the second take records its "snapshot" entry,
   * which the third shows */
  HISTORY(e.a, true, 100);
  si = TAKE(e.a, false);
  cachalot_snapshot_info_free(e.a, si);
  si = TAKE(e.a, true);
  EQ(si->n_trace, 0);
  cachalot_snapshot_info_free(e.a, si);
  si = TAKE(e.a, true);
  EQ(si->n_trace, 1);
  EQ(si->trace[0].action, CACHALOT_TRACE_SNAPSHOT);
  EQ(si->n_segments, 1);
  EQ(si->segments[0].n_blocks, 1);
  EQ(si->segments[0].blocks[0].state, CACHALOT_BLOCK_FREE);
  EQ(si->segments[0].blocks[0].requested, 0);
  cachalot_snapshot_info_free(e.a, si);
  env_free(&e);
  REFS(c, 1);
}

static void test_snapshot_take_arguments(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_snapshot_info *si = (cachalot_snapshot_info *)(uintptr_t)1;
  STATUS(cachalot_snapshot_take(NULL, true, &si), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(si);
  STATUS(cachalot_snapshot_take(e.a, true, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  cachalot_snapshot_info_free(e.a, NULL);
  /* an empty allocator: nothing at all, and with history off no trace */
  si = TAKE(e.a, true);
  EQ(si->n_segments, 0);
  EQ(si->n_trace, 0);
  cachalot_snapshot_info_free(e.a, si);
  env_free(&e);
}

/* ---- cachalot_get_memory_fraction -------------------------------------------------------------------- */

static double fraction_(cachalot_allocator *a, int device, const char *file, int line) {
  double f = -7.0;
  status_is_(cachalot_get_memory_fraction(a, device, &f), CACHALOT_OK, "cachalot_get_memory_fraction", file, line);
  return f;
}
#define FRACTION(a, device) fraction_((a), (device), __FILE__, __LINE__)

static void test_memory_fraction(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  assert_true(FRACTION(e.a, 0) == 1.0);
  assert_true(FRACTION(e.a, 1) == 1.0);
  OK(cachalot_set_memory_fraction(e.a, 1, 0.25));
  assert_true(FRACTION(e.a, 0) == 1.0);
  assert_true(FRACTION(e.a, 1) == 0.25);
  OK(cachalot_set_memory_fraction(e.a, 0, 0.0));
  assert_true(FRACTION(e.a, 0) == 0.0);
  STATUS(cachalot_set_memory_fraction(e.a, 0, 1.5), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_true(FRACTION(e.a, 0) == 0.0); /* a refused value changes nothing */
  double f = 0;
  STATUS(cachalot_get_memory_fraction(e.a, 2, &f), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "device 2 is out of range");
  STATUS(cachalot_get_memory_fraction(e.a, -1, &f), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_get_memory_fraction(NULL, 0, &f), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_get_memory_fraction(e.a, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  /* a config's fraction applies to every device */
  OK(cachalot_set_settings(e.a, "per_process_memory_fraction:0.75"));
  assert_true(FRACTION(e.a, 0) == 0.75);
  assert_true(FRACTION(e.a, 1) == 0.75);
  CHECK(e.a);
  env_free(&e);

  e = ENV(2, 0, "per_process_memory_fraction:0.5");
  assert_true(FRACTION(e.a, 0) == 0.5);
  assert_true(FRACTION(e.a, 1) == 0.5);
  env_free(&e);
}

/* ---- cachalot_pool_use_count ------------------------------------------------------------------------- */

static int use_count_(cachalot_allocator *a, cachalot_mempool_id id, const char *file, int line) {
  int n = -1;
  status_is_(cachalot_pool_use_count(a, 0, id, &n), CACHALOT_OK, "cachalot_pool_use_count", file, line);
  return n;
}
#define USE_COUNT(a, id) use_count_((a), (id), __FILE__, __LINE__)

static void test_pool_use_count(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  int n = 5;
  STATUS(cachalot_pool_use_count(e.a, 0, id, &n), CACHALOT_ERROR_INVALID_ARGUMENT); /* not made yet */
  CONTAINS(cachalot_last_error(), "no such pool {0, 1}");
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, cap));
  EQ(USE_COUNT(e.a, id), 1);
  STATUS(cachalot_pool_use_count(e.a, 1, id, &n), CACHALOT_ERROR_INVALID_ARGUMENT); /* pools are per device */
  void *x = ALLOC(e.a, 0, 512, cap);
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  EQ(USE_COUNT(e.a, id), 1); /* end leaves the count */
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, cap));
  EQ(USE_COUNT(e.a, id), 2);
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  OK(cachalot_release_pool(e.a, 0, id));
  EQ(USE_COUNT(e.a, id), 1);
  OK(cachalot_release_pool(e.a, 0, id));
  EQ(USE_COUNT(e.a, id), 0); /* freeable, but its segment keeps it */
  FREE(e.a, x);
  EMPTY(e.a);
  STATUS(cachalot_pool_use_count(e.a, 0, id, &n), CACHALOT_ERROR_INVALID_ARGUMENT); /* gone with its segment */
  STATUS(cachalot_pool_use_count(e.a, 0, (cachalot_mempool_id){0, 99}, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_use_count(e.a, 2, id, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_use_count(NULL, 0, id, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_use_count(e.a, 0, id, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CHECK(e.a);
  env_free(&e);
}

/* cachalot_pool_incref: PyTorch's createOrIncrefPool (a MemPool made before anything is routed to it).
 * It routes nothing: mallocs meanwhile go to the default pool, and nothing counts as a capture (an
 * empty_cache still gives memory back, an out-of-memory retry still releases the cache). */
static void test_pool_incref(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  OK(cachalot_pool_incref(e.a, 0, id));
  EQ(USE_COUNT(e.a, id), 1);
  void *x = ALLOC(e.a, 0, 3 * MiB, s);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 3 * MiB, .active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 17 * MiB));
  cachalot_snapshot_info *si = TAKE(e.a, false);
  EQ(si->n_segments, 1);
  EQ(si->segments[0].pool.first, 0); /* the default pool's */
  EQ(si->segments[0].pool.second, 0);
  cachalot_snapshot_info_free(e.a, si);
  FREE(e.a, x);
  EMPTY(e.a); /* not a capture: the default pool's segment goes back */
  size_t used = 1;
  OK(cachalot_sim_device_used(e.b, 0, &used));
  EQ(used, 0);
  OK(cachalot_pool_incref(e.a, 0, id));
  EQ(USE_COUNT(e.a, id), 2);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, s)); /* routing to it adds a use, as for any pool */
  EQ(USE_COUNT(e.a, id), 3);
  void *y = ALLOC(e.a, 0, 512, s); /* in the pool: its segment keeps the pool after the last release */
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  for (int k = 3; k > 0; k--)
    OK(cachalot_release_pool(e.a, 0, id));
  STATUS(cachalot_pool_incref(e.a, 0, id), CACHALOT_ERROR_INVALID_STATE); /* released: not to be used again */
  CONTAINS(cachalot_last_error(), "was released (use count 0)");
  FREE(e.a, y);
  EMPTY(e.a);
  OK(cachalot_pool_incref(e.a, 0, id)); /* gone with its segment: the id makes a new pool, as PyTorch's does */
  EQ(USE_COUNT(e.a, id), 1);
  OK(cachalot_release_pool(e.a, 0, id));
  STATUS(cachalot_pool_incref(e.a, 0, (cachalot_mempool_id){0, 0}), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_incref(e.a, 0, (cachalot_mempool_id){1, 1}), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_incref(e.a, 1, id), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_pool_incref(NULL, 0, id), CACHALOT_ERROR_INVALID_ARGUMENT);
  CHECK(e.a);
  env_free(&e);
}

/* ---- cachalot_empty_cache_pool ----------------------------------------------------------------------- */

static void test_empty_cache_pool(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), cap = STREAM(e.b, 0), cap2 = STREAM(e.b, 0);
  cachalot_mempool_id p = cachalot_graph_pool_handle(e.a), q = cachalot_graph_pool_handle(e.a);
  /* p: a small segment with a block still allocated and a free large one; released (freeable) */
  OK(cachalot_begin_allocate_to_pool(e.a, 0, p, only, cap));
  void *keep = ALLOC(e.a, 0, 512, cap);
  void *big = ALLOC(e.a, 0, 3 * MiB, cap);
  FREE(e.a, big);
  OK(cachalot_end_allocate_to_pool(e.a, 0, p));
  OK(cachalot_release_pool(e.a, 0, p));
  /* q: a free small segment, still in use */
  OK(cachalot_begin_allocate_to_pool(e.a, 0, q, only, cap2));
  void *y = ALLOC(e.a, 0, 512, cap2);
  FREE(e.a, y);
  OK(cachalot_end_allocate_to_pool(e.a, 0, q));
  /* the default pool: a free small segment */
  void *z = ALLOC(e.a, 0, 512, s);
  FREE(e.a, z);
  pool_x small3 = PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 512, .seg = 3,
                     .res_b = 6 * MiB, .split = 1, .split_b = 2 * MiB - 512);
  EXPECT_POOLS(e.a, 0, small3, PX(.seg = 1, .res_b = 20 * MiB));
  EQ(USED(e.b, 0), 26 * MiB);
  EXPECT_COUNTERS(e.a, 0, 4, 0, 0, 0, 0);

  OK(cachalot_empty_cache_pool(e.a, 0, q)); /* in use: nothing happens, not even a sync */
  CHECK(e.a);
  EQ(USED(e.b, 0), 26 * MiB);
  EXPECT_COUNTERS(e.a, 0, 4, 0, 0, 0, 0);
  OK(cachalot_empty_cache_pool(e.a, 0, p)); /* the large free segment goes; the one with `keep` stays */
  CHECK(e.a);
  EQ(USED(e.b, 0), 6 * MiB);
  EXPECT_POOLS(e.a, 0, small3, PX0);
  EXPECT_COUNTERS(e.a, 0, 4, 1, 0, 0, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EQ(USE_COUNT(e.a, p), 0);
  FREE(e.a, keep); /* back to p */
  OK(cachalot_empty_cache_pool(e.a, 0, p));
  CHECK(e.a);
  EQ(USED(e.b, 0), 4 * MiB);
  EXPECT_POOLS(e.a, 0, PX(.seg = 2, .res_b = 4 * MiB), PX0);
  int n = 0;
  STATUS(cachalot_pool_use_count(e.a, 0, p, &n), CACHALOT_ERROR_INVALID_ARGUMENT); /* p is gone */
  /* the default pool's segment and q's are still there; a default-pool malloc reuses its own */
  void *z2 = ALLOC(e.a, 0, 512, s);
  PTR_EQ(z2, z);
  FREE(e.a, z2);

  STATUS(cachalot_empty_cache_pool(e.a, 1, q), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_empty_cache_pool(NULL, 0, q), CACHALOT_ERROR_INVALID_ARGUMENT);
  OK(cachalot_release_pool(e.a, 0, q));
  OK(cachalot_empty_cache_pool(e.a, 0, q)); /* freeable now */
  CHECK(e.a);
  EQ(USED(e.b, 0), 2 * MiB);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  EXPECT_COUNTERS(e.a, 0, 4, 3, 0, 0, 3);
  env_free(&e);
}

/* {0,0} is cachalot_empty_cache: every device's default free segments go, and those of freeable pools. */
static void test_empty_cache_pool_default(void **state) {
  (void)state;
  env e = ENV(2, 0, "");
  cachalot_stream s0 = STREAM(e.b, 0), s1 = STREAM(e.b, 1), cap = STREAM(e.b, 0);
  cachalot_mempool_id q = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, q, only, cap));
  void *y = ALLOC(e.a, 0, 512, cap);
  FREE(e.a, y);
  OK(cachalot_end_allocate_to_pool(e.a, 0, q)); /* in use: its segment stays */
  void *x = ALLOC(e.a, 0, 3 * MiB, s0);
  void *z = ALLOC(e.a, 1, 512, s1);
  void *w = ALLOC(e.a, 0, 512, s0);
  FREE(e.a, x);
  FREE(e.a, z);
  EQ(USED(e.b, 0), 24 * MiB);
  EQ(USED(e.b, 1), 2 * MiB);
  OK(cachalot_empty_cache_pool(e.a, 0, (cachalot_mempool_id){0, 0}));
  CHECK(e.a);
  EQ(USED(e.b, 0), 4 * MiB); /* q's segment and w's */
  EQ(USED(e.b, 1), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EXPECT_RESERVED_IS_USED(&e, 1);
  FREE(e.a, w);
  OK(cachalot_release_pool(e.a, 0, q));
  OK(cachalot_empty_cache_pool(e.a, 0, (cachalot_mempool_id){0, 0}));
  CHECK(e.a);
  EQ(USED(e.b, 0), 0);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  /* arguments the other pool calls refuse: a device out of range (for {0,0} too), an id with both halves */
  STATUS(cachalot_empty_cache_pool(e.a, -7, (cachalot_mempool_id){0, 0}), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(cachalot_last_error(), "device -7 is out of range"));
  STATUS(cachalot_empty_cache_pool(e.a, 2, q), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_empty_cache_pool(e.a, 0, (cachalot_mempool_id){1, 1}), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(cachalot_last_error(), "not a private pool id"));
  CHECK(e.a);
  env_free(&e);
}

/* ---- cachalot_version ------------------------------------------------------------------------------- */

static void test_version(void **state) {
  (void)state;
  const char *v = cachalot_version();
  assert_non_null(v);
  /* digits.digits.digits, nothing else */
  const char *c = v;
  for (int part = 0; part < 3; part++) {
    if (!isdigit((unsigned char)*c))
      fail_msg("version '%s' is not N.N.N", v);
    while (isdigit((unsigned char)*c))
      c++;
    if (part < 2 && *c++ != '.')
      fail_msg("version '%s' is not N.N.N", v);
  }
  if (*c != '\0')
    fail_msg("version '%s' is not N.N.N", v);
  assert_string_equal(cachalot_version(), v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_set_ops_arguments),
      cmocka_unit_test(test_null_ops_keep_nothing),
      cmocka_unit_test(test_history_off_keeps_nothing),
      cmocka_unit_test(test_history_on_block_and_entries),
      cmocka_unit_test(test_history_restart_releases_entries),
      cmocka_unit_test(test_ring_overwrite_releases),
      cmocka_unit_test(test_history_grows_as_entries_come),
      cmocka_unit_test(test_history_off_lets_go_of_blocks),
      cmocka_unit_test(test_history_off_then_free_each),
      cmocka_unit_test(test_failed_malloc_keeps_nothing),
      cmocka_unit_test(test_destroy_releases_everything),
      cmocka_unit_test(test_pending_free_keeps_context),
      cmocka_unit_test(test_unmap_takes_the_calls_context),
      cmocka_unit_test(test_restore_releases_block_contexts),
      cmocka_unit_test(test_snapshot_take_layout),
      cmocka_unit_test(test_snapshot_take_without_trace),
      cmocka_unit_test(test_snapshot_take_arguments),
      cmocka_unit_test(test_memory_fraction),
      cmocka_unit_test(test_pool_use_count),
      cmocka_unit_test(test_pool_incref),
      cmocka_unit_test(test_empty_cache_pool),
      cmocka_unit_test(test_empty_cache_pool_default),
      cmocka_unit_test(test_version),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
