/* The graph object, PyTorch's torch.cuda.CUDAGraph on top of the private pools (pool.c).
 *
 * A capture routes the device's allocations to the graph's pool *before* the device capture begins, so
 * that nothing the captured work allocates can come from (or go back to) memory that others may reuse
 * while the graph replays. The routing filter recognises the capture by its id, so side streams joined
 * into the capture (which share the capture id) allocate from the pool too.
 *
 * A graph object is not thread-safe: one thread at a time calls its functions, as with PyTorch. Only the
 * routing filter runs on other threads (any thread's malloc on the device), and it reads nothing but
 * fields fixed at create time and the atomic capture id.
 */
#include "../allocator/internal.h"
#include "graph.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_STATE_HOOKS = 16 };

typedef enum {
  GRAPH_EMPTY,     /* nothing held: may capture */
  GRAPH_CAPTURING, /* routing active and a device capture open on `stream` */
  GRAPH_CAPTURED,  /* the capture succeeded: graph and/or exec held */
  GRAPH_FAILED     /* the device capture ended invalidated: only the pool use is held, until reset */
} graph_state;

typedef struct {
  cachalot_graph_state_hooks h;
  uint64_t increment; /* what the last successful capture_end returned; 0 before */
} state_hook;

/* Invariants:
 * - EMPTY: !pool_held, graph == NULL, exec == NULL, capture_id == 0.
 * - CAPTURING: pool_held, routing to `pool` active (begin_allocate_to_pool done, end not yet), a device
 *   capture open on `stream`; capture_id is that capture's id once read (0 for the instant before);
 *   graph == exec == NULL.
 * - CAPTURED: pool_held, routing ended, graph != NULL || exec != NULL; graph is kept only when
 *   keep_graph or debug_mode (or when instantiation at capture_end failed, so reset can destroy it).
 * - FAILED: pool_held, routing ended, graph == exec == NULL.
 * - pool is {0,0} until the first successful begin_allocate_to_pool; afterwards the last pool used, kept
 *   after reset (as PyTorch keeps mempool_id_) so a caller can still name it.
 * - hooks[0..n_hooks) are complete (all three callbacks set) and pairwise distinct. */
struct cachalot_graph {
  cachalot_allocator *allocator;
  int device;
  bool keep_graph;
  bool debug_mode;
  graph_state state;
  cachalot_stream stream;
  /* Written by the capturing thread, read by the filter from any thread's malloc (under the device lock,
   * which the writer does not take): hence atomic. 0 means "no capture id known". */
  _Atomic uint64_t capture_id;
  cachalot_mempool_id pool;
  bool pool_held;
  cl_graph *graph;
  cl_graph_exec *exec;
  state_hook hooks[MAX_STATE_HOOKS];
  int n_hooks;
};

/* A copy of the calling thread's error message, to put back after clean-up calls that may overwrite it. */
typedef struct {
  char text[1024];
} saved_error;

static void save_error(saved_error *e) { snprintf(e->text, sizeof e->text, "%s", cl_error_message()); }
static cachalot_status restore_error(cachalot_status rc, const saved_error *e) { return cl_fail(rc, "%s", e->text); }

static cachalot_backend *backend_of(const cachalot_graph *g) { return g->allocator->backend; }

static const char *state_name(graph_state s) {
  switch (s) {
  case GRAPH_EMPTY: return "no capture";
  case GRAPH_CAPTURING: return "capture underway";
  case GRAPH_CAPTURED: return "captured";
  case GRAPH_FAILED: return "failed capture, not reset yet";
  }
  return "?";
}

/* The routing filter: a stream belongs to this graph's capture when the device says it is capturing with
 * our capture id, which covers the capture stream and every side stream joined into the capture. Called
 * under the device lock: it may ask the backend (which never calls back) but must not call cachalot. */
static bool capture_filter(cachalot_stream s, void *ctx) {
  const cachalot_graph *g = ctx;
  uint64_t mine = atomic_load_explicit(&g->capture_id, memory_order_acquire);
  if (mine == 0)
    return false; /* between begin_allocate_to_pool and the device capture: nothing is captured yet */
  cachalot_backend *b = backend_of(g);
  bool capturing = false;
  uint64_t id = 0;
  if (b->ops->stream_capture_info(b, g->device, s, &capturing, &id) != CACHALOT_OK)
    return false;
  return capturing && id == mine;
}

cachalot_status cl_graph_create(cachalot_allocator *a, int device, bool keep_graph, cachalot_graph **out) {
  if (out)
    *out = NULL;
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_graph_create");
  if (rc != CACHALOT_OK)
    return rc;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_create: out is NULL");
  if (!a->backend->ops->capture_begin)
    return cl_fail(CACHALOT_ERROR_NOT_SUPPORTED, "cachalot_graph_create: the %s backend has no graph support",
                   a->backend->ops->name);
  cachalot_graph *g = calloc(1, sizeof *g);
  if (!g)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_graph_create: host out of memory");
  g->allocator = a;
  g->device = device;
  g->keep_graph = keep_graph;
  g->state = GRAPH_EMPTY;
  atomic_init(&g->capture_id, 0);
  *out = g;
  return CACHALOT_OK;
}

/* The hooks' capture_end, storing the increments (or dropping them when the capture did not succeed,
 * where the call only returns the state objects to their normal mode). */
static void hooks_capture_end(cachalot_graph *g, bool keep_increments) {
  for (int i = 0; i < g->n_hooks; i++) {
    uint64_t inc = g->hooks[i].h.capture_end(g->hooks[i].h.ctx);
    g->hooks[i].increment = keep_increments ? inc : 0;
  }
}

cachalot_status cl_graph_capture_begin(cachalot_graph *g, cachalot_stream s, cachalot_mempool_id pool,
                                             cachalot_capture_mode mode) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_capture_begin: graph is NULL");
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_graph_capture_begin: CUDA graphs must be captured on a non-default stream");
  if (mode != CACHALOT_CAPTURE_GLOBAL && mode != CACHALOT_CAPTURE_THREAD_LOCAL && mode != CACHALOT_CAPTURE_RELAXED)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_capture_begin: invalid capture mode %d",
                   (int)mode);
  if (pool.first != 0 && pool.second != 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_graph_capture_begin: pool id " CL_POOL_ID_FMT " has two non-zero halves",
                   CL_POOL_ID_ARGS(pool));
  if (g->state != GRAPH_EMPTY)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_capture_begin: this graph already owns a captured graph (state: %s); call "
                   "cachalot_graph_reset first",
                   state_name(g->state));

  cachalot_allocator *a = g->allocator;
  cachalot_backend *b = a->backend;
  cachalot_mempool_id id = (pool.first == 0 && pool.second == 0) ? cl_capture_pool_id(a) : pool;

  /* PyTorch's order: the state objects switch to graph-safe mode first, then the routing starts, then
   * the device capture, so the first captured allocation already lands in the pool. */
  for (int i = 0; i < g->n_hooks; i++)
    g->hooks[i].h.capture_begin(g->hooks[i].h.ctx);
  atomic_store_explicit(&g->capture_id, 0, memory_order_release);
  cachalot_status rc = cl_route_begin(a, g->device, id, capture_filter, g);
  if (rc != CACHALOT_OK) {
    saved_error e;
    save_error(&e);
    hooks_capture_end(g, false);
    rc = restore_error(rc, &e);
    cl_error_prefix("cachalot_graph_capture_begin: ");
    return rc;
  }
  rc = b->ops->capture_begin(b, g->device, s, mode);
  bool capturing = false;
  uint64_t cid = 0;
  if (rc == CACHALOT_OK) {
    rc = b->ops->stream_capture_info(b, g->device, s, &capturing, &cid);
    if (rc == CACHALOT_OK && (!capturing || cid == 0))
      rc = cl_fail(CACHALOT_ERROR_DEVICE, "the device reports no capture on the stream just after it began");
    if (rc != CACHALOT_OK) {
      /* The capture is open but unusable: close it so the stream is not left capturing. */
      saved_error e;
      save_error(&e);
      cl_graph *junk = NULL;
      size_t n = 0;
      if (b->ops->capture_end(b, g->device, s, &junk, &n) == CACHALOT_OK && junk)
        b->ops->graph_destroy(b, junk);
      rc = restore_error(rc, &e);
    }
  }
  if (rc != CACHALOT_OK) {
    /* Undo the routing and the pool use, so a failed begin leaves nothing held. */
    saved_error e;
    save_error(&e);
    if (cl_route_end(a, g->device, id) != CACHALOT_OK || cl_pool_release_use(a, g->device, id) != CACHALOT_OK)
      cl_warn("cachalot_graph_capture_begin: undoing the pool routing failed: %s", cl_error_message());
    hooks_capture_end(g, false);
    rc = restore_error(rc, &e);
    cl_error_prefix("cachalot_graph_capture_begin: ");
    return rc;
  }
  g->pool = id;
  g->pool_held = true;
  g->stream = s;
  g->state = GRAPH_CAPTURING;
  atomic_store_explicit(&g->capture_id, cid, memory_order_release);
  return CACHALOT_OK;
}

cachalot_status cl_graph_capture_end(cachalot_graph *g) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_capture_end: graph is NULL");
  if (g->state != GRAPH_CAPTURING)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_capture_end: no capture is underway (state: %s)", state_name(g->state));
  cachalot_allocator *a = g->allocator;
  cachalot_backend *b = a->backend;
  cl_graph *graph = NULL;
  size_t n_nodes = 0;
  cachalot_status rc = b->ops->capture_end(b, g->device, g->stream, &graph, &n_nodes);
  saved_error e;
  save_error(&e);
  /* Routing stops whatever the capture's outcome: otherwise later allocations on a stream that happens to
   * capture again with a recycled id could land in this pool. */
  cachalot_status end_rc = cl_route_end(a, g->device, g->pool);
  atomic_store_explicit(&g->capture_id, 0, memory_order_release);
  hooks_capture_end(g, rc == CACHALOT_OK);
  if (rc != CACHALOT_OK) {
    if (graph)
      b->ops->graph_destroy(b, graph);
    g->state = GRAPH_FAILED; /* the pool use stays held until reset */
    rc = restore_error(rc, &e);
    cl_error_prefix("cachalot_graph_capture_end: the capture failed (cachalot_graph_reset releases its pool): ");
    return rc;
  }
  g->graph = graph;
  g->state = GRAPH_CAPTURED;
  if (end_rc != CACHALOT_OK) {
    cl_error_prefix("cachalot_graph_capture_end: ");
    return end_rc;
  }
  if (n_nodes == 0)
    cl_warn("the captured graph is empty; this usually means the work was enqueued on another stream or device "
            "than the capture's");
  if (g->keep_graph)
    return CACHALOT_OK;
  rc = b->ops->graph_instantiate(b, g->device, g->graph, &g->exec);
  if (rc != CACHALOT_OK) {
    g->exec = NULL;
    cl_error_prefix("cachalot_graph_capture_end: instantiating the graph: ");
    return rc; /* the raw graph stays, so the state stays CAPTURED and reset destroys it */
  }
  if (!g->debug_mode) {
    b->ops->graph_destroy(b, g->graph);
    g->graph = NULL;
  }
  return CACHALOT_OK;
}

cachalot_status cachalot_graph_instantiate(cachalot_graph *g) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_instantiate: graph is NULL");
  if (!g->keep_graph)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_instantiate: only a graph created with keep_graph is instantiated by the "
                   "caller (capture_end instantiates the others)");
  if (g->state != GRAPH_CAPTURED || !g->graph)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_instantiate: no successful capture to instantiate (state: %s)",
                   state_name(g->state));
  cachalot_backend *b = backend_of(g);
  cl_graph_exec *exec = NULL;
  cachalot_status rc = b->ops->graph_instantiate(b, g->device, g->graph, &exec);
  if (rc != CACHALOT_OK) {
    cl_error_prefix("cachalot_graph_instantiate: ");
    return rc; /* the previous instance, if any, stays usable */
  }
  if (g->exec)
    b->ops->graph_exec_destroy(b, g->exec);
  g->exec = exec;
  return CACHALOT_OK;
}

cachalot_status cl_graph_replay(cachalot_graph *g, cachalot_stream s) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_replay: graph is NULL");
  if (!g->exec) {
    if (g->state == GRAPH_CAPTURED && g->keep_graph)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_graph_replay: the graph was kept (keep_graph); call cachalot_graph_instantiate first");
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_replay: no successful capture to replay (state: %s)", state_name(g->state));
  }
  for (int i = 0; i < g->n_hooks; i++) {
    cachalot_status rc = g->hooks[i].h.before_replay(g->hooks[i].h.ctx, g->hooks[i].increment, s);
    if (rc != CACHALOT_OK) {
      cl_error_prefix("cachalot_graph_replay: state object %d: ", i);
      return rc;
    }
  }
  cachalot_backend *b = backend_of(g);
  cachalot_status rc = b->ops->graph_launch(b, g->device, g->exec, s);
  if (rc != CACHALOT_OK)
    cl_error_prefix("cachalot_graph_replay: ");
  return rc;
}

/* reset's work; it cannot fail (a failure to undo is only warned about), so destroy can use it too. */
static void graph_reset(cachalot_graph *g) {
  cachalot_allocator *a = g->allocator;
  cachalot_backend *b = a->backend;
  if (g->state == GRAPH_CAPTURING) {
    /* A capture left open (the caller never ended it): close the device capture, whatever it says, and
     * stop the routing. Failures are expected here (an invalidated capture) and change nothing below. */
    cl_graph *junk = NULL;
    size_t n = 0;
    if (b->ops->capture_end(b, g->device, g->stream, &junk, &n) == CACHALOT_OK && junk)
      b->ops->graph_destroy(b, junk);
    if (cl_route_end(a, g->device, g->pool) != CACHALOT_OK)
      cl_warn("cachalot_graph_reset: ending the pool routing failed: %s", cl_error_message());
    atomic_store_explicit(&g->capture_id, 0, memory_order_release);
    hooks_capture_end(g, false);
  }
  if (g->exec) {
    b->ops->graph_exec_destroy(b, g->exec);
    g->exec = NULL;
  }
  if (g->graph) {
    b->ops->graph_destroy(b, g->graph);
    g->graph = NULL;
  }
  if (g->pool_held) {
    /* Exactly once per capture_begin: the pool's blocks become reusable once nothing holds it. */
    if (cl_pool_release_use(a, g->device, g->pool) != CACHALOT_OK)
      cl_warn("cachalot_graph_reset: releasing the pool failed: %s", cl_error_message());
    g->pool_held = false;
  }
  for (int i = 0; i < g->n_hooks; i++)
    g->hooks[i].increment = 0;
  g->stream = NULL;
  g->state = GRAPH_EMPTY;
}

cachalot_status cachalot_graph_reset(cachalot_graph *g) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_reset: graph is NULL");
  graph_reset(g);
  return CACHALOT_OK;
}

cachalot_mempool_id cachalot_graph_pool(const cachalot_graph *g) {
  if (!g)
    return (cachalot_mempool_id){0, 0};
  return g->pool;
}

cachalot_status cachalot_graph_enable_debug_mode(cachalot_graph *g) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_enable_debug_mode: graph is NULL");
  g->debug_mode = true;
  return CACHALOT_OK;
}

cachalot_status cachalot_graph_debug_dump(cachalot_graph *g, const char *path) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_debug_dump: graph is NULL");
  if (!path)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_debug_dump: path is NULL");
  if (!g->graph) {
    if (!g->keep_graph && !g->debug_mode)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_graph_debug_dump: the raw graph is dropped after instantiation; call "
                     "cachalot_graph_enable_debug_mode before capture_end, or create the graph with keep_graph");
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_graph_debug_dump: no captured graph (state: %s)",
                   state_name(g->state));
  }
  cachalot_backend *b = backend_of(g);
  cachalot_status rc = b->ops->graph_debug_dot(b, g->graph, path);
  if (rc != CACHALOT_OK)
    cl_error_prefix("cachalot_graph_debug_dump: ");
  return rc;
}

cachalot_status cachalot_graph_raw(cachalot_graph *g, void **out) {
  if (out)
    *out = NULL;
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_raw: graph is NULL");
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_raw: out is NULL");
  if (!g->keep_graph)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_raw: the raw graph is only available for a graph created with keep_graph");
  if (!g->graph)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_graph_raw: no captured graph (state: %s)",
                   state_name(g->state));
  *out = g->graph;
  return CACHALOT_OK;
}

void cl_graph_destroy(cachalot_graph *g) {
  if (!g)
    return;
  graph_reset(g);
  free(g);
}

cachalot_status cachalot_graph_register_state(cachalot_graph *g, const cachalot_graph_state_hooks *h) {
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graph_register_state: graph is NULL");
  if (!h || !h->capture_begin || !h->capture_end || !h->before_replay)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_graph_register_state: hooks must be given with capture_begin, capture_end and "
                   "before_replay all set");
  /* A state registered after the capture was never switched to graph mode: replaying would feed it an
   * increment the graph does not consume. */
  if (g->state != GRAPH_EMPTY)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_register_state: state objects are registered before capture_begin (state: "
                   "%s)",
                   state_name(g->state));
  for (int i = 0; i < g->n_hooks; i++) {
    const cachalot_graph_state_hooks *o = &g->hooks[i].h;
    if (o->capture_begin == h->capture_begin && o->capture_end == h->capture_end &&
        o->before_replay == h->before_replay && o->ctx == h->ctx)
      return CACHALOT_OK; /* the same state twice is one state, as PyTorch's map of generator states */
  }
  if (g->n_hooks == MAX_STATE_HOOKS)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_graph_register_state: the graph already has %d state objects", MAX_STATE_HOOKS);
  g->hooks[g->n_hooks++] = (state_hook){.h = *h, .increment = 0};
  return CACHALOT_OK;
}

/* The entry points that graphed.c uses too, as shells over the room's functions (graph.h). */
cachalot_status cachalot_graph_create(cachalot_allocator *a, int device, bool keep_graph, cachalot_graph **out) {
  return cl_graph_create(a, device, keep_graph, out);
}
cachalot_status cachalot_graph_capture_begin(cachalot_graph *g, cachalot_stream s, cachalot_mempool_id pool,
                                             cachalot_capture_mode mode) {
  return cl_graph_capture_begin(g, s, pool, mode);
}
cachalot_status cachalot_graph_capture_end(cachalot_graph *g) { return cl_graph_capture_end(g); }
cachalot_status cachalot_graph_replay(cachalot_graph *g, cachalot_stream s) { return cl_graph_replay(g, s); }
void cachalot_graph_destroy(cachalot_graph *g) { cl_graph_destroy(g); }
