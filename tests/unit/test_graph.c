/* Graphs on private pools (PyTorch's private pools and CUDA graphs) on the simulated device: what a capture
 * reserves, sharing a pool between graphs, what reset gives back, every misuse with its message, failed and
 * invalidated captures (no pool left behind), replay, the empty-graph warning, debug dumps, raw graphs, state
 * hooks and the graphed helper. cachalot_check runs after every step that changes the allocator. */
#include "helpers.h"

#include "allocator/backend/ops.h" /* stream_wait, to join a side stream into a capture */
#include "common/error.h"            /* cl_fail, for a body that fails with a message */

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static const cachalot_mempool_id NO_POOL = {0, 0};

static int64_t reserved(cachalot_allocator *a) { return STATS(a, 0).reserved_bytes[CACHALOT_STAT_ALL].current; }
static int64_t segments(cachalot_allocator *a) { return STATS(a, 0).segment[CACHALOT_STAT_ALL].current; }

static uint64_t submitted_(cachalot_backend *b, cachalot_stream s, const char *file, int line) {
  uint64_t n = 0;
  status_is_(cachalot_sim_stream_submitted(b, s, &n), CACHALOT_OK, "cachalot_sim_stream_submitted", file, line);
  return n;
}
#define SUBMITTED(b, s) submitted_((b), (s), __FILE__, __LINE__)

/* One simulated kernel on s (a graph node while s is capturing). */
#define LAUNCH(b, s) OK(cachalot_sim_launch((b), (s)))

static cachalot_graph *graph_new_(cachalot_allocator *a, bool keep, const char *file, int line) {
  cachalot_graph *g = NULL;
  status_is_(cachalot_graph_create(a, 0, keep, &g), CACHALOT_OK, "cachalot_graph_create", file, line);
  if (!g)
    _fail(file, line);
  return g;
}
#define GRAPH(a, keep) graph_new_((a), (keep), __FILE__, __LINE__)

#define BEGIN(e, g, s, pool)                                                                                        \
  do {                                                                                                              \
    OK(cachalot_graph_capture_begin((g), (s), (pool), CACHALOT_CAPTURE_GLOBAL));                                    \
    CHECK((e)->a);                                                                                                  \
  } while (0)
#define END(e, g)                                                                                                   \
  do {                                                                                                              \
    OK(cachalot_graph_capture_end(g));                                                                              \
    CHECK((e)->a);                                                                                                  \
  } while (0)
#define RESET(e, g)                                                                                                 \
  do {                                                                                                              \
    OK(cachalot_graph_reset(g));                                                                                    \
    CHECK((e)->a);                                                                                                  \
  } while (0)

/* ---- warnings --------------------------------------------------------------------------------- */

typedef struct {
  int count;
  char last[512];
} warnings;

static void on_warning(const char *msg, void *ctx) {
  warnings *w = ctx;
  w->count++;
  snprintf(w->last, sizeof w->last, "%s", msg);
}

/* ---- memory ----------------------------------------------------------------------------------- */

/* A 512 B allocation captured into a fresh pool takes a 2 MiB small segment of that pool; once the
 * capture has ended, the same request on the same stream no longer goes to the pool. */
static void test_capture_small_fresh_pool(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  cachalot_mempool_id none = cachalot_graph_pool(g);
  EQ(none.first, 0);
  EQ(none.second, 0);

  BEGIN(&e, g, s, NO_POOL);
  cachalot_mempool_id id = cachalot_graph_pool(g);
  EQ(id.first >= 1, 1); /* a capture's own pool is {n, 0} */
  EQ(id.second, 0);
  void *p = ALLOC(e.a, 0, 512, s);
  LAUNCH(e.b, s);
  EQ(segments(e.a), 1);
  EQ(reserved(e.a), 2 * MiB);
  END(&e, g);
  EXPECT_POOLS(e.a, 0, PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 512, .seg = 1,
                          .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 512),
               PX0);

  /* routing stopped: the free 2 MiB - 512 of the pool's segment is not used by the default pool */
  void *q = ALLOC(e.a, 0, 512, s);
  EQ(segments(e.a), 2);
  EQ(reserved(e.a), 4 * MiB);
  FREE(e.a, q);
  FREE(e.a, p);
  /* the graph still holds its pool: empty_cache gives back the default pool's segment only */
  EMPTY(e.a);
  EQ(reserved(e.a), 2 * MiB);
  RESET(&e, g);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* the pool id stays after reset, as PyTorch keeps mempool_id_ */
  cachalot_mempool_id after = cachalot_graph_pool(g);
  EQ(after.first, id.first);
  EQ(after.second, id.second);
  cachalot_graph_destroy(g);
  env_free(&e);
}

/* Three 10 MiB + 512 B allocations in one capture: each takes its own 12 MiB segment of the pool (the
 * 2 MiB - 512 left in each is too small for the next). */
static void test_capture_large_chain(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  const size_t big = 10 * MiB + 512;
  void *p[3];
  BEGIN(&e, g, s, NO_POOL);
  for (int i = 0; i < 3; i++) {
    p[i] = ALLOC(e.a, 0, big, s);
    LAUNCH(e.b, s);
    EQ(segments(e.a), i + 1);
    EQ(reserved(e.a), (int64_t)(12 * MiB) * (i + 1));
  }
  END(&e, g);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 3, .alloc_b = 3 * big, .active = 3, .active_b = 3 * big, .req_b = 3 * big, .seg = 3,
                  .res_b = 36 * MiB, .split = 3, .split_b = 3 * (2 * MiB - 512)));
  for (int i = 0; i < 3; i++)
    FREE(e.a, p[i]);
  cachalot_graph_destroy(g);
  CHECK(e.a);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* Two captures on one stream, each with a 512 B temporary freed inside the capture. Returns the reserved
 * bytes with both graphs alive, and the device allocations made. */
static void two_captures(bool shared, int64_t *res, int64_t *dev_allocs) {
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g[2] = {GRAPH(e.a, false), GRAPH(e.a, false)};
  cachalot_mempool_id pool = shared ? cachalot_graph_pool_handle(e.a) : NO_POOL;
  if (shared) {
    EQ(pool.first, 0);
    EQ(pool.second >= 1, 1);
  }
  for (int i = 0; i < 2; i++) {
    BEGIN(&e, g[i], s, pool);
    void *t = ALLOC(e.a, 0, 512, s);
    LAUNCH(e.b, s);
    FREE(e.a, t);
    END(&e, g[i]);
  }
  if (shared) {
    EQ(cachalot_graph_pool(g[0]).second, pool.second);
    EQ(cachalot_graph_pool(g[1]).second, pool.second);
  } else {
    EQ(cachalot_graph_pool(g[0]).first != cachalot_graph_pool(g[1]).first, 1);
  }
  *res = reserved(e.a);
  *dev_allocs = STATS(e.a, 0).num_device_alloc;
  RESET(&e, g[0]);
  EMPTY(e.a);
  EQ(reserved(e.a), 2 * MiB); /* separate pools: g[1]'s; shared: the pool, which g[1] still holds */
  RESET(&e, g[1]);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  cachalot_graph_destroy(g[0]);
  cachalot_graph_destroy(g[1]);
  env_free(&e);
}

static void test_shared_pool_reuses_segment(void **state) {
  (void)state;
  int64_t sep_res = 0, sep_allocs = 0, shared_res = 0, shared_allocs = 0;
  two_captures(false, &sep_res, &sep_allocs);
  two_captures(true, &shared_res, &shared_allocs);
  EQ(sep_res, 4 * MiB);
  EQ(sep_allocs, 2);
  EQ(shared_res, 2 * MiB);
  EQ(shared_allocs, 1);
  EQ(sep_res - shared_res, 2 * MiB);
}

/* After reset and empty_cache, an output still allocated keeps its segment and everything else goes
 * back; freeing the output lets the last segment go too. */
static void test_reset_keeps_live_output(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  BEGIN(&e, g, s, NO_POOL);
  void *out = ALLOC(e.a, 0, 512, s);
  void *tmp = ALLOC(e.a, 0, 10 * MiB + 512, s);
  LAUNCH(e.b, s);
  FREE(e.a, tmp);
  END(&e, g);
  EQ(reserved(e.a), 14 * MiB);
  /* held by the graph: nothing goes back */
  EMPTY(e.a);
  EQ(reserved(e.a), 14 * MiB);
  RESET(&e, g);
  EMPTY(e.a);
  EQ(reserved(e.a), 2 * MiB);
  EQ(segments(e.a), 1);
  EXPECT_POOLS(e.a, 0, PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 512, .seg = 1,
                          .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 512),
               PX0);
  FREE(e.a, out);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  cachalot_graph_destroy(g);
  env_free(&e);
}

/* A side stream joined into the capture (it waited on the capturing stream) allocates from the pool too;
 * an unrelated stream does not. */
static void test_side_stream_routes(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0), other = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  OK(e.b->ops->stream_wait(e.b, 0, side, s)); /* side joins the capture */
  void *y = ALLOC(e.a, 0, 512, side);        /* the pool: a segment of side's */
  LAUNCH(e.b, side);
  FREE(e.a, y);
  OK(e.b->ops->stream_wait(e.b, 0, s, side)); /* and is joined back before the end */
  void *x = ALLOC(e.a, 0, 512, other);        /* not part of the capture: default pool */
  FREE(e.a, x);
  EQ(reserved(e.a), 4 * MiB);
  END(&e, g);
  /* the default pool's segment goes back; the pool's stays while the graph holds it */
  EMPTY(e.a);
  EQ(reserved(e.a), 2 * MiB);
  RESET(&e, g);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  cachalot_graph_destroy(g);
  env_free(&e);
}

/* The filter runs in whichever thread allocates: another thread's request on a stream joined into the
 * capture goes to the pool, one on an unrelated stream does not. */
typedef struct {
  cachalot_allocator *a;
  cachalot_stream joined, other;
  void *in_pool;
  cachalot_status rc;
} thread_job;

static void *allocating_thread(void *arg) {
  thread_job *j = arg;
  void *x = NULL;
  j->rc = cachalot_malloc(j->a, 0, 512, j->joined, &j->in_pool);
  if (j->rc == CACHALOT_OK)
    j->rc = cachalot_malloc(j->a, 0, 512, j->other, &x);
  if (j->rc == CACHALOT_OK)
    j->rc = cachalot_free(j->a, x);
  return NULL;
}

static void test_filter_in_another_thread(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0), other = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  OK(e.b->ops->stream_wait(e.b, 0, side, s));
  thread_job job = {.a = e.a, .joined = side, .other = other, .rc = CACHALOT_ERROR_INVALID_STATE};
  pthread_t t;
  EQ(pthread_create(&t, NULL, allocating_thread, &job), 0);
  EQ(pthread_join(t, NULL), 0);
  OK(job.rc);
  CHECK(e.a);
  EQ(reserved(e.a), 4 * MiB);
  END(&e, g);
  EMPTY(e.a);
  EQ(reserved(e.a), 2 * MiB); /* the default pool's segment went back; the pool's is held */
  FREE(e.a, job.in_pool);
  RESET(&e, g);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  cachalot_graph_destroy(g);
  env_free(&e);
}

/* ---- misuse ----------------------------------------------------------------------------------- */

#define FAILS(call, status, text)                                                                                   \
  do {                                                                                                              \
    STATUS(call, status);                                                                                           \
    CONTAINS(cachalot_last_error(), text);                                                                          \
  } while (0)

static uint64_t hook_end_zero(void *ctx) {
  (void)ctx;
  return 0;
}
static void hook_begin_nop(void *ctx) { (void)ctx; }
static cachalot_status hook_replay_ok(void *ctx, uint64_t inc, cachalot_stream s) {
  (void)ctx;
  (void)inc;
  (void)s;
  return CACHALOT_OK;
}

static void test_errors(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = (cachalot_graph *)(uintptr_t)0x1;

  FAILS(cachalot_graph_create(NULL, 0, false, &g), CACHALOT_ERROR_INVALID_ARGUMENT, "allocator is NULL");
  EQ(g == NULL, 1);
  FAILS(cachalot_graph_create(e.a, 1, false, &g), CACHALOT_ERROR_INVALID_ARGUMENT, "out of range");
  FAILS(cachalot_graph_create(e.a, 0, false, NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "out is NULL");

  FAILS(cachalot_graph_capture_begin(NULL, s, NO_POOL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_ARGUMENT,
        "graph is NULL");
  FAILS(cachalot_graph_capture_end(NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  FAILS(cachalot_graph_replay(NULL, s), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  FAILS(cachalot_graph_reset(NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  FAILS(cachalot_graph_instantiate(NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  FAILS(cachalot_graph_enable_debug_mode(NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  FAILS(cachalot_graph_debug_dump(NULL, "x.dot"), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  void *raw = (void *)(uintptr_t)0x1;
  FAILS(cachalot_graph_raw(NULL, &raw), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  EQ(raw == NULL, 1);
  EQ(cachalot_graph_pool(NULL).first, 0);
  cachalot_graph_destroy(NULL);

  g = GRAPH(e.a, false);
  FAILS(cachalot_graph_capture_begin(g, NULL, NO_POOL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_ARGUMENT,
        "CUDA graphs must be captured on a non-default stream");
  FAILS(cachalot_graph_capture_begin(g, s, NO_POOL, (cachalot_capture_mode)42), CACHALOT_ERROR_INVALID_ARGUMENT,
        "invalid capture mode");
  FAILS(cachalot_graph_capture_begin(g, s, ((cachalot_mempool_id){1, 1}), CACHALOT_CAPTURE_GLOBAL),
        CACHALOT_ERROR_INVALID_ARGUMENT, "two non-zero halves");
  EQ(cachalot_graph_pool(g).first, 0); /* nothing was begun */
  FAILS(cachalot_graph_capture_end(g), CACHALOT_ERROR_INVALID_STATE, "no capture is underway");
  FAILS(cachalot_graph_replay(g, s), CACHALOT_ERROR_INVALID_STATE, "no successful capture");
  FAILS(cachalot_graph_instantiate(g), CACHALOT_ERROR_INVALID_STATE, "keep_graph");
  FAILS(cachalot_graph_debug_dump(g, NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "path is NULL");
  FAILS(cachalot_graph_debug_dump(g, "x.dot"), CACHALOT_ERROR_INVALID_STATE, "cachalot_graph_enable_debug_mode");
  FAILS(cachalot_graph_raw(g, &raw), CACHALOT_ERROR_INVALID_STATE, "keep_graph");
  FAILS(cachalot_graph_raw(g, NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "out is NULL");

  /* state hooks: all three callbacks are needed */
  cachalot_graph_state_hooks h = {hook_begin_nop, hook_end_zero, hook_replay_ok, NULL};
  FAILS(cachalot_graph_register_state(g, NULL), CACHALOT_ERROR_INVALID_ARGUMENT, "capture_begin, capture_end");
  FAILS(cachalot_graph_register_state(NULL, &h), CACHALOT_ERROR_INVALID_ARGUMENT, "graph is NULL");
  cachalot_graph_state_hooks bad = h;
  bad.capture_begin = NULL;
  FAILS(cachalot_graph_register_state(g, &bad), CACHALOT_ERROR_INVALID_ARGUMENT, "capture_begin");
  bad = h;
  bad.capture_end = NULL;
  FAILS(cachalot_graph_register_state(g, &bad), CACHALOT_ERROR_INVALID_ARGUMENT, "capture_end");
  bad = h;
  bad.before_replay = NULL;
  FAILS(cachalot_graph_register_state(g, &bad), CACHALOT_ERROR_INVALID_ARGUMENT, "before_replay");
  /* up to 16 distinct states; the same one twice counts once */
  int ctxs[17];
  for (int i = 0; i < 16; i++) {
    h.ctx = &ctxs[i];
    OK(cachalot_graph_register_state(g, &h));
  }
  OK(cachalot_graph_register_state(g, &h));
  h.ctx = &ctxs[16];
  FAILS(cachalot_graph_register_state(g, &h), CACHALOT_ERROR_INVALID_STATE, "already has 16 state objects");

  /* while capturing */
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  FAILS(cachalot_graph_capture_begin(g, s, NO_POOL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE,
        "already owns a captured graph");
  FAILS(cachalot_graph_register_state(g, &h), CACHALOT_ERROR_INVALID_STATE, "before capture_begin");
  FAILS(cachalot_graph_replay(g, s), CACHALOT_ERROR_INVALID_STATE, "no successful capture");
  END(&e, g);
  /* once captured */
  FAILS(cachalot_graph_capture_begin(g, s, NO_POOL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE,
        "already owns a captured graph");
  FAILS(cachalot_graph_capture_end(g), CACHALOT_ERROR_INVALID_STATE, "no capture is underway");
  FAILS(cachalot_graph_instantiate(g), CACHALOT_ERROR_INVALID_STATE, "keep_graph");
  FAILS(cachalot_graph_raw(g, &raw), CACHALOT_ERROR_INVALID_STATE, "keep_graph");
  FAILS(cachalot_graph_debug_dump(g, "x.dot"), CACHALOT_ERROR_INVALID_STATE, "cachalot_graph_enable_debug_mode");
  OK(cachalot_graph_replay(g, s));
  CHECK(e.a);
  cachalot_graph_destroy(g);

  /* keep_graph: instantiate is the caller's call */
  g = GRAPH(e.a, true);
  FAILS(cachalot_graph_instantiate(g), CACHALOT_ERROR_INVALID_STATE, "no successful capture");
  FAILS(cachalot_graph_raw(g, &raw), CACHALOT_ERROR_INVALID_STATE, "no captured graph");
  FAILS(cachalot_graph_debug_dump(g, "x.dot"), CACHALOT_ERROR_INVALID_STATE, "no captured graph");
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  END(&e, g);
  FAILS(cachalot_graph_replay(g, s), CACHALOT_ERROR_INVALID_STATE, "call cachalot_graph_instantiate first");
  cachalot_graph_destroy(g);
  CHECK(e.a);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  env_free(&e);
}

/* reset twice, reset of a fresh graph, and a graph captures again after reset. */
static void test_reset_twice_and_recapture(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  RESET(&e, g);
  for (int round = 0; round < 2; round++) {
    BEGIN(&e, g, s, NO_POOL);
    void *t = ALLOC(e.a, 0, 512, s);
    LAUNCH(e.b, s);
    FREE(e.a, t);
    END(&e, g);
    OK(cachalot_graph_replay(g, s));
    RESET(&e, g);
    RESET(&e, g);
    FAILS(cachalot_graph_replay(g, s), CACHALOT_ERROR_INVALID_STATE, "no successful capture");
    EMPTY(e.a);
    EQ(reserved(e.a), 0);
  }
  cachalot_graph_destroy(g);
  env_free(&e);
}

/* A capture_begin whose device capture cannot begin (the stream is already capturing) gives back the
 * routing and the pool use: once the other holder of a shared pool resets, all of its memory goes back. */
static void test_failed_begin_leaves_no_pool(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  cachalot_mempool_id pool = cachalot_graph_pool_handle(e.a);
  cachalot_graph *holder = GRAPH(e.a, false), *g = GRAPH(e.a, false);
  BEGIN(&e, holder, s2, pool);
  void *t = ALLOC(e.a, 0, 512, s2);
  LAUNCH(e.b, s2);
  FREE(e.a, t);
  END(&e, holder);
  EQ(reserved(e.a), 2 * MiB);

  OK(cachalot_sim_capture_begin(e.b, s, CACHALOT_CAPTURE_GLOBAL)); /* behind the graph's back */
  STATUS(cachalot_graph_capture_begin(g, s, pool, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "cachalot_graph_capture_begin: ");
  CONTAINS(cachalot_last_error(), "already capturing");
  CHECK(e.a);
  EQ(cachalot_graph_pool(g).second, 0); /* a failed begin changes nothing */
  OK(cachalot_sim_capture_end(e.b, s));
  /* not routing any more: a request on s goes to the default pool */
  void *x = ALLOC(e.a, 0, 512, s);
  EQ(reserved(e.a), 4 * MiB);
  FREE(e.a, x);
  /* the graph is reusable at once, without a reset */
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  END(&e, g);
  RESET(&e, g);
  RESET(&e, holder);
  EMPTY(e.a);
  EQ(reserved(e.a), 0); /* the shared pool had one use left (holder's) and it is gone */
  EXPECT_RESERVED_IS_USED(&e, 0);
  cachalot_graph_destroy(g);
  cachalot_graph_destroy(holder);
  env_free(&e);
}

/* A capture that fails at its end stops the routing at once; the graph then holds only its pool use,
 * which reset gives back. Three ways to fail: a stream sync inside the capture invalidates it (as CUDA
 * does), a side stream forked into the capture is never joined back, the capture is ended behind the
 * graph's back. */
static void test_invalidated_capture(void **state) {
  (void)state;
  static const struct {
    cachalot_status status;
    const char *message;
  } ways[3] = {{CACHALOT_ERROR_DEVICE, "was invalidated"},
               {CACHALOT_ERROR_INVALID_STATE, "not joined"},
               {CACHALOT_ERROR_INVALID_STATE, "is not capturing"}};
  for (int way = 0; way < 3; way++) {
    env e = ENV(1, 0, "");
    cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0);
    cachalot_graph *g = GRAPH(e.a, false);
    BEGIN(&e, g, s, NO_POOL);
    void *p = ALLOC(e.a, 0, 512, s); /* the pool's */
    LAUNCH(e.b, s);
    if (way == 0) {
      STATUS(e.b->ops->stream_sync(e.b, 0, s), CACHALOT_ERROR_DEVICE);
    } else if (way == 1) {
      OK(e.b->ops->stream_wait(e.b, 0, side, s));
      LAUNCH(e.b, side);
    } else {
      OK(cachalot_sim_capture_end(e.b, s));
    }
    STATUS(cachalot_graph_capture_end(g), ways[way].status);
    CONTAINS(cachalot_last_error(), "cachalot_graph_capture_end: the capture failed");
    CONTAINS(cachalot_last_error(), ways[way].message);
    CHECK(e.a);
    /* routing stopped: the next request on s does not take the pool's free 2 MiB - 512 */
    void *q = ALLOC(e.a, 0, 512, s);
    EQ(reserved(e.a), 4 * MiB);
    FREE(e.a, q);
    FAILS(cachalot_graph_replay(g, s), CACHALOT_ERROR_INVALID_STATE, "no successful capture");
    FAILS(cachalot_graph_capture_begin(g, s, NO_POOL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE,
          "call cachalot_graph_reset first");
    FREE(e.a, p);
    EMPTY(e.a);
    EQ(reserved(e.a), 2 * MiB); /* the pool is still held */
    RESET(&e, g);
    EMPTY(e.a);
    EQ(reserved(e.a), 0);
    EXPECT_RESERVED_IS_USED(&e, 0);
    /* and the graph captures again */
    BEGIN(&e, g, s, NO_POOL);
    LAUNCH(e.b, s);
    END(&e, g);
    OK(cachalot_graph_replay(g, s));
    COMPLETE(&e, s);
    cachalot_graph_destroy(g);
    CHECK(e.a);
    env_free(&e);
  }
}

/* A capture never ended: reset closes the device capture and the routing, and gives back the pool. So
 * does destroy. */
static void test_reset_open_capture(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  BEGIN(&e, g, s, NO_POOL);
  void *p = ALLOC(e.a, 0, 512, s);
  LAUNCH(e.b, s);
  RESET(&e, g);
  /* the stream is no longer capturing: the simulator refuses to end it again */
  STATUS(cachalot_sim_capture_end(e.b, s), CACHALOT_ERROR_INVALID_STATE);
  void *q = ALLOC(e.a, 0, 512, s); /* default pool */
  EQ(reserved(e.a), 4 * MiB);
  FREE(e.a, q);
  FREE(e.a, p);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);

  BEGIN(&e, g, s, NO_POOL);
  p = ALLOC(e.a, 0, 512, s);
  FREE(e.a, p);
  cachalot_graph_destroy(g);
  CHECK(e.a);
  STATUS(cachalot_sim_capture_end(e.b, s), CACHALOT_ERROR_INVALID_STATE);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* ---- replay, warnings, dumps, raw ---------------------------------------------------------------- */

/* Replay enqueues the graph's nodes on the replay stream, every time. */
static void test_replay_launches_nodes(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), r = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  uint64_t s0 = SUBMITTED(e.b, s);
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  LAUNCH(e.b, s);
  LAUNCH(e.b, s);
  END(&e, g);
  EQ(SUBMITTED(e.b, s), s0); /* capturing submits nothing */
  uint64_t r0 = SUBMITTED(e.b, r);
  OK(cachalot_graph_replay(g, r));
  EQ(SUBMITTED(e.b, r), r0 + 3);
  OK(cachalot_graph_replay(g, r));
  EQ(SUBMITTED(e.b, r), r0 + 6);
  EQ(SUBMITTED(e.b, s), s0);
  COMPLETE(&e, r);
  cachalot_graph_destroy(g);
  env_free(&e);
}

static void test_empty_graph_warns(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, false);
  warnings w = {0};
  cachalot_set_warning_handler(on_warning, &w);
  BEGIN(&e, g, s, NO_POOL);
  END(&e, g);
  EQ(w.count, 1);
  CONTAINS(w.last, "the captured graph is empty");
  OK(cachalot_graph_replay(g, s)); /* an empty graph is still instantiated and replays */
  RESET(&e, g);
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  END(&e, g);
  EQ(w.count, 1); /* a graph with a node does not warn */
  cachalot_set_warning_handler(NULL, NULL);
  cachalot_graph_destroy(g);
  env_free(&e);
}

static int64_t file_size(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0)
    return -1;
  return (int64_t)st.st_size;
}

static void test_debug_dump(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  char path[] = "/tmp/cachalot_test_graph_XXXXXX";
  int fd = mkstemp(path);
  EQ(fd >= 0, 1);
  close(fd);
  unlink(path);

  /* debug mode keeps the raw graph after instantiation */
  cachalot_graph *g = GRAPH(e.a, false);
  OK(cachalot_graph_enable_debug_mode(g));
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  END(&e, g);
  OK(cachalot_graph_debug_dump(g, path));
  EQ(file_size(path) > 0, 1);
  unlink(path);
  OK(cachalot_graph_replay(g, s));
  void *raw = NULL;
  FAILS(cachalot_graph_raw(g, &raw), CACHALOT_ERROR_INVALID_STATE, "keep_graph"); /* debug mode is not enough
  * */
  RESET(&e, g);
  FAILS(cachalot_graph_debug_dump(g, path), CACHALOT_ERROR_INVALID_STATE, "no captured graph");
  cachalot_graph_destroy(g);

  /* keep_graph dumps too */
  g = GRAPH(e.a, true);
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  END(&e, g);
  OK(cachalot_graph_debug_dump(g, path));
  EQ(file_size(path) > 0, 1);
  unlink(path);
  cachalot_graph_destroy(g);
  CHECK(e.a);
  env_free(&e);
}

/* keep_graph: raw works once captured, instantiate is explicit and may be repeated, reset drops it all. */
static void test_keep_graph_raw_instantiate(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), r = STREAM(e.b, 0);
  cachalot_graph *g = GRAPH(e.a, true);
  BEGIN(&e, g, s, NO_POOL);
  LAUNCH(e.b, s);
  LAUNCH(e.b, s);
  END(&e, g);
  void *raw = NULL, *raw2 = NULL;
  OK(cachalot_graph_raw(g, &raw));
  EQ(raw != NULL, 1);
  OK(cachalot_graph_instantiate(g));
  uint64_t r0 = SUBMITTED(e.b, r);
  OK(cachalot_graph_replay(g, r));
  EQ(SUBMITTED(e.b, r), r0 + 2);
  OK(cachalot_graph_instantiate(g)); /* replaces the instance */
  OK(cachalot_graph_replay(g, r));
  EQ(SUBMITTED(e.b, r), r0 + 4);
  OK(cachalot_graph_raw(g, &raw2));
  EQ(raw2 == raw, 1); /* the raw graph stays the same after instantiation */
  COMPLETE(&e, r);
  RESET(&e, g);
  FAILS(cachalot_graph_raw(g, &raw), CACHALOT_ERROR_INVALID_STATE, "no captured graph");
  EQ(raw == NULL, 1);
  FAILS(cachalot_graph_instantiate(g), CACHALOT_ERROR_INVALID_STATE, "no successful capture");
  cachalot_graph_destroy(g);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  env_free(&e);
}

/* ---- state hooks -------------------------------------------------------------------------------- */

typedef struct {
  char log[256]; /* one letter per call: B(egin) E(nd) R(eplay), then the hook's name */
  size_t len;
} call_log;

typedef struct {
  call_log *log;
  char name;
  uint64_t increment; /* what capture_end returns */
  uint64_t seen;      /* the last increment before_replay got */
  int replays;
  cachalot_stream replay_stream;
  cachalot_status fail_with;
} fake_state;

static void log_call(fake_state *f, char what) {
  if (f->log->len + 2 < sizeof f->log->log) {
    f->log->log[f->log->len++] = what;
    f->log->log[f->log->len++] = f->name;
    f->log->log[f->log->len] = '\0';
  }
}
static void fs_begin(void *ctx) { log_call(ctx, 'B'); }
static uint64_t fs_end(void *ctx) {
  fake_state *f = ctx;
  log_call(f, 'E');
  return f->increment;
}
static cachalot_status fs_replay(void *ctx, uint64_t inc, cachalot_stream s) {
  fake_state *f = ctx;
  log_call(f, 'R');
  f->seen = inc;
  f->replays++;
  f->replay_stream = s;
  return f->fail_with;
}

static void test_state_hooks(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0), r = STREAM(e.b, 0);
  call_log log = {{0}, 0};
  fake_state x = {.log = &log, .name = 'x', .increment = 7}, y = {.log = &log, .name = 'y', .increment = 3};
  cachalot_graph *g = GRAPH(e.a, false);
  cachalot_graph_state_hooks hx = {fs_begin, fs_end, fs_replay, &x}, hy = {fs_begin, fs_end, fs_replay, &y};
  OK(cachalot_graph_register_state(g, &hx));
  OK(cachalot_graph_register_state(g, &hy));
  BEGIN(&e, g, s, NO_POOL);
  STR_EQ(log.log, "BxBy");
  LAUNCH(e.b, s);
  END(&e, g);
  STR_EQ(log.log, "BxByExEy");
  uint64_t r0 = SUBMITTED(e.b, r);
  OK(cachalot_graph_replay(g, r));
  STR_EQ(log.log, "BxByExEyRxRy");
  EQ(x.seen, 7);
  EQ(y.seen, 3);
  EQ(x.replay_stream == r, 1);
  EQ(SUBMITTED(e.b, r), r0 + 1);

  /* a failing hook aborts the replay: no launch, later hooks not called */
  x.fail_with = CACHALOT_ERROR_DEVICE;
  STATUS(cachalot_graph_replay(g, r), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "cachalot_graph_replay: state object 0");
  EQ(x.replays, 2);
  EQ(y.replays, 1);
  EQ(SUBMITTED(e.b, r), r0 + 1);
  x.fail_with = CACHALOT_OK;

  /* the default stream is a valid replay stream */
  OK(cachalot_graph_replay(g, NULL));
  EQ(x.replay_stream == NULL, 1);

  /* a capture reset while open still returns the states to normal mode */
  RESET(&e, g);
  log.len = 0;
  log.log[0] = '\0';
  BEGIN(&e, g, s, NO_POOL);
  RESET(&e, g);
  STR_EQ(log.log, "BxByExEy");
  /* a failed begin too */
  log.len = 0;
  log.log[0] = '\0';
  OK(cachalot_sim_capture_begin(e.b, s, CACHALOT_CAPTURE_GLOBAL));
  STATUS(cachalot_graph_capture_begin(g, s, NO_POOL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE);
  OK(cachalot_sim_capture_end(e.b, s));
  STR_EQ(log.log, "BxByExEy");
  COMPLETE(&e, NULL);
  COMPLETE(&e, r);
  cachalot_graph_destroy(g);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  env_free(&e);
}

/* ---- graphed helper ------------------------------------------------------------------------------ */

typedef struct {
  cachalot_allocator *a;
  cachalot_backend *b;
  int calls;
  int fail_at;              /* the call (1-based) that fails after its work, 0: none */
  cachalot_stream streams[8]; /* the stream of each call */
} body_ctx;

/* A 512 B temporary and one kernel per run. */
static cachalot_status body_fn(cachalot_stream s, void *ctx) {
  body_ctx *c = ctx;
  if (c->calls < 8)
    c->streams[c->calls] = s;
  c->calls++;
  void *t = NULL;
  cachalot_status rc = cachalot_malloc(c->a, 0, 512, s, &t);
  if (rc != CACHALOT_OK)
    return rc;
  rc = cachalot_sim_launch(c->b, s);
  if (rc == CACHALOT_OK)
    rc = cachalot_free(c->a, t);
  if (rc == CACHALOT_OK && c->calls == c->fail_at)
    rc = cl_fail(CACHALOT_ERROR_DEVICE, "the body failed on purpose");
  return rc;
}

static void test_graphed(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  void *in0 = ALLOC(e.a, 0, 4096, s), *in1 = ALLOC(e.a, 0, 1024, s);
  void *new0 = ALLOC(e.a, 0, 4096, s), *new1 = ALLOC(e.a, 0, 1024, s);
  cachalot_buffer inputs[2] = {{in0, 4096}, {in1, 1024}};
  body_ctx c = {.a = e.a, .b = e.b};
  cachalot_graphed *h = NULL;
  OK(cachalot_graphed_create(e.a, 0, body_fn, &c, inputs, 2, NO_POOL, 3, s, &h));
  CHECK(e.a);
  EQ(h != NULL, 1);
  EQ(c.calls, 4); /* 3 warm-up runs and the captured one */
  /* all on one side stream, not the caller's */
  for (int i = 0; i < 4; i++) {
    EQ(c.streams[i] == c.streams[0], 1);
    EQ(c.streams[i] != s, 1);
  }
  cachalot_graph *g = cachalot_graphed_graph(h);
  EQ(g != NULL, 1);
  EQ(cachalot_graph_pool(g).first >= 1, 1);
  /* default pool: the inputs (one 2 MiB segment) and the warm-up temporary's segment (side stream);
   * the graph's pool: its temporary's segment */
  EQ(reserved(e.a), 6 * MiB);
  inputs[0].ptr = NULL; /* the helper kept its own copy */

  /* a replay copies the given inputs on s, then launches the graph's one node on s */
  uint64_t s0 = SUBMITTED(e.b, s);
  const void *both[2] = {new0, new1};
  OK(cachalot_graphed_replay(h, both, s));
  EQ(SUBMITTED(e.b, s), s0 + 3);
  const void *second_only[2] = {NULL, new1};
  OK(cachalot_graphed_replay(h, second_only, s));
  EQ(SUBMITTED(e.b, s), s0 + 5);
  OK(cachalot_graphed_replay(h, NULL, s));
  EQ(SUBMITTED(e.b, s), s0 + 6);
  EQ(c.calls, 4); /* replays do not run the body */
  CHECK(e.a);
  FAILS(cachalot_graphed_replay(NULL, NULL, s), CACHALOT_ERROR_INVALID_ARGUMENT, "handle is NULL");
  EQ(cachalot_graphed_graph(NULL) == NULL, 1);

  COMPLETE(&e, s);
  cachalot_graphed_destroy(h);
  cachalot_graphed_destroy(NULL);
  CHECK(e.a);
  FREE(e.a, in0);
  FREE(e.a, in1);
  FREE(e.a, new0);
  FREE(e.a, new1);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e);
}

/* No warm-up, no inputs, and a shared pool. */
static void test_graphed_minimal(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  cachalot_mempool_id pool = cachalot_graph_pool_handle(e.a);
  body_ctx c = {.a = e.a, .b = e.b};
  cachalot_graphed *h = NULL;
  OK(cachalot_graphed_create(e.a, 0, body_fn, &c, NULL, 0, pool, 0, s, &h));
  CHECK(e.a);
  EQ(c.calls, 1);
  EQ(cachalot_graph_pool(cachalot_graphed_graph(h)).second, pool.second);
  EQ(reserved(e.a), 2 * MiB);
  uint64_t s0 = SUBMITTED(e.b, s);
  OK(cachalot_graphed_replay(h, NULL, s));
  EQ(SUBMITTED(e.b, s), s0 + 1);
  COMPLETE(&e, s);
  cachalot_graphed_destroy(h);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  env_free(&e);
}

static void test_graphed_failures(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  body_ctx c = {.a = e.a, .b = e.b};
  cachalot_graphed *h = (cachalot_graphed *)(uintptr_t)0x1;
  cachalot_buffer bad = {NULL, 16};
  FAILS(cachalot_graphed_create(NULL, 0, body_fn, &c, NULL, 0, NO_POOL, 1, s, &h), CACHALOT_ERROR_INVALID_ARGUMENT,
        "allocator is NULL");
  EQ(h == NULL, 1);
  FAILS(cachalot_graphed_create(e.a, 0, body_fn, &c, NULL, 0, NO_POOL, 1, s, NULL), CACHALOT_ERROR_INVALID_ARGUMENT,
        "out is NULL");
  FAILS(cachalot_graphed_create(e.a, 0, NULL, &c, NULL, 0, NO_POOL, 1, s, &h), CACHALOT_ERROR_INVALID_ARGUMENT,
        "body is NULL");
  FAILS(cachalot_graphed_create(e.a, 0, body_fn, &c, NULL, 0, NO_POOL, -1, s, &h), CACHALOT_ERROR_INVALID_ARGUMENT,
        "warmup is negative");
  FAILS(cachalot_graphed_create(e.a, 0, body_fn, &c, NULL, 2, NO_POOL, 1, s, &h), CACHALOT_ERROR_INVALID_ARGUMENT,
        "inputs is NULL");
  FAILS(cachalot_graphed_create(e.a, 0, body_fn, &c, &bad, 1, NO_POOL, 1, s, &h), CACHALOT_ERROR_INVALID_ARGUMENT,
        "input 0");
  EQ(c.calls, 0);

  /* a warm-up run fails: nothing is left behind */
  c.fail_at = 2;
  FAILS(cachalot_graphed_create(e.a, 0, body_fn, &c, NULL, 0, NO_POOL, 3, s, &h), CACHALOT_ERROR_DEVICE,
        "warm-up run of the body: the body failed on purpose");
  EQ(h == NULL, 1);
  EQ(c.calls, 2);
  CHECK(e.a);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);

  /* the captured run fails after allocating in the pool: the capture is closed and the pool released */
  c.calls = 0;
  c.fail_at = 3;
  FAILS(cachalot_graphed_create(e.a, 0, body_fn, &c, NULL, 0, NO_POOL, 2, s, &h), CACHALOT_ERROR_DEVICE,
        "captured run of the body: the body failed on purpose");
  EQ(h == NULL, 1);
  EQ(c.calls, 3);
  CHECK(e.a);
  EMPTY(e.a);
  EQ(reserved(e.a), 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* and the allocator still works normally on s */
  void *p = ALLOC(e.a, 0, 512, s);
  FREE(e.a, p);
  EMPTY(e.a);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture_small_fresh_pool),
      cmocka_unit_test(test_capture_large_chain),
      cmocka_unit_test(test_shared_pool_reuses_segment),
      cmocka_unit_test(test_reset_keeps_live_output),
      cmocka_unit_test(test_side_stream_routes),
      cmocka_unit_test(test_filter_in_another_thread),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_reset_twice_and_recapture),
      cmocka_unit_test(test_failed_begin_leaves_no_pool),
      cmocka_unit_test(test_invalidated_capture),
      cmocka_unit_test(test_reset_open_capture),
      cmocka_unit_test(test_replay_launches_nodes),
      cmocka_unit_test(test_empty_graph_warns),
      cmocka_unit_test(test_debug_dump),
      cmocka_unit_test(test_keep_graph_raw_instantiate),
      cmocka_unit_test(test_state_hooks),
      cmocka_unit_test(test_graphed),
      cmocka_unit_test(test_graphed_minimal),
      cmocka_unit_test(test_graphed_failures),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
