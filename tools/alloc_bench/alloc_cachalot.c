/* alloc_bench: cachalot on the CUDA backend ("cachalot") and on the simulated device ("cachalot-sim",
 * events complete at once, default options otherwise). Both use the default config ("", not the
 * environment), one allocator per result row, device 0. Both serve the host workload too, through the
 * allocator's host cache (cachalot_host_malloc / cachalot_host_free): on the simulated device its pinnings
 * are plain host memory, so the row is the cache's own CPU cost. */
#include "bench.h"

#include <cachalot/cachalot.h>

#include "../common/cuda_hint.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  ab_alloc base;
  bool sim;
  cachalot_backend *b;
  cachalot_allocator *a;
  cachalot_graph *g;
  cachalot_mempool_id pool; /* the graphs' shared pool, held by one use of ours; {0,0} before */
  void *node_buffer;        /* CUDA: what the captured memset node writes */
} cl_inst;

static int fail(char err[AB_ERR_LEN], const char *what, cachalot_status st) {
  snprintf(err, AB_ERR_LEN, "%s: %s: %s", what, cachalot_status_name(st), cachalot_last_error());
  return -1;
}

static int probe_sim(char err[AB_ERR_LEN]) {
  (void)err;
  return 0;
}

static const char sim_hint[] = "-a cachalot-sim runs cachalot on a simulated device";

static int probe_cuda(char err[AB_ERR_LEN]) {
  cachalot_backend *b = NULL;
  cachalot_status st = cachalot_backend_cuda(&b);
  if (st != CACHALOT_OK) {
    tool_cuda_hint(err, AB_ERR_LEN, cachalot_last_error(), sim_hint);
    return -1;
  }
  cachalot_backend_destroy(b);
#ifndef ALLOC_BENCH_HAVE_CUDA
  snprintf(err, AB_ERR_LEN, "alloc_bench was built without the CUDA runtime (it makes the streams)");
  return -1;
#else
  return 0;
#endif
}

static void cl_close(ab_alloc *base) {
  cl_inst *c = (cl_inst *)base;
  cachalot_graph_destroy(c->g);
  if (c->pool.first != 0 || c->pool.second != 0) {
    cachalot_status st = cachalot_release_pool(c->a, 0, c->pool);
    (void)st; /* the allocator is destroyed next: nothing to do about a failure */
  }
  cachalot_destroy(c->a);
#ifdef ALLOC_BENCH_HAVE_CUDA
  if (!c->sim) {
    ab_cuda_streams_destroy(c->base.streams, c->base.n_streams);
    ab_cuda_free_buffer(c->node_buffer);
  }
#endif
  cachalot_backend_destroy(c->b); /* simulated streams live as long as their backend */
  free(c->base.streams);
  free(c);
}

static const char *conf = "";

int ab_cachalot_set_conf(const char *c, char err[AB_ERR_LEN]) {
  /* Checked at once, on a simulated device (always there), as alloc_snapshot replay checks --conf: a
   * bad string is a usage error (exit 2), not a failure of every cachalot row (exit 1). */
  cachalot_sim_options opt = {.device_count = 1, .capacity_bytes = (size_t)1 << 30, .complete_immediately = true};
  cachalot_backend *b = NULL;
  cachalot_allocator *a = NULL;
  cachalot_status st = cachalot_backend_sim(&opt, &b);
  if (st == CACHALOT_OK)
    st = cachalot_create(b, c, &a);
  if (st == CACHALOT_ERROR_CONFIG)
    snprintf(err, AB_ERR_LEN, "%s", cachalot_last_error());
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
  if (st == CACHALOT_ERROR_CONFIG)
    return -1;
  conf = c;
  return 0;
}

static int cl_open(ab_alloc **out, int n_streams, bool sim, const ab_allocator *vt, char err[AB_ERR_LEN]) {
  *out = NULL;
  cl_inst *c = calloc(1, sizeof *c);
  void **streams = calloc((size_t)n_streams, sizeof *streams);
  if (c == NULL || streams == NULL) {
    free(c);
    free(streams);
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  c->base = (ab_alloc){.vt = vt, .n_streams = n_streams, .streams = streams};
  c->sim = sim;
  cachalot_status st;
  if (sim) {
    cachalot_sim_options opt = {.device_count = 1, .capacity_bytes = (size_t)80 << 30, .complete_immediately = true};
    st = cachalot_backend_sim(&opt, &c->b);
  } else {
    st = cachalot_backend_cuda(&c->b);
  }
  if (st != CACHALOT_OK) {
    if (sim) {
      fail(err, "cachalot_backend_sim", st);
    } else {
      char msg[AB_ERR_LEN];
      tool_cuda_hint(msg, sizeof msg, cachalot_last_error(), sim_hint);
      snprintf(err, AB_ERR_LEN, "cachalot_backend_cuda: %s: %.400s", cachalot_status_name(st), msg);
    }
    cl_close(&c->base);
    return -1;
  }
  if ((st = cachalot_create(c->b, conf, &c->a)) != CACHALOT_OK) {
    fail(err, "cachalot_create", st);
    cl_close(&c->base);
    return -1;
  }
  if (sim) {
    for (int i = 0; i < n_streams; i++)
      if ((st = cachalot_sim_stream_create(c->b, 0, (cachalot_stream *)&streams[i])) != CACHALOT_OK) {
        fail(err, "cachalot_sim_stream_create", st);
        cl_close(&c->base);
        return -1;
      }
  } else {
#ifdef ALLOC_BENCH_HAVE_CUDA
    if (ab_cuda_streams_create(streams, n_streams, err) != 0) {
      cl_close(&c->base);
      return -1;
    }
#endif
  }
  if ((st = cachalot_reset_peak_stats(c->a, 0)) != CACHALOT_OK) {
    fail(err, "cachalot_reset_peak_stats", st);
    cl_close(&c->base);
    return -1;
  }
  *out = &c->base;
  return 0;
}

static int open_sim(ab_alloc **out, int n, char err[AB_ERR_LEN]) { return cl_open(out, n, true, &ab_cachalot_sim, err); }
static int open_cuda(ab_alloc **out, int n, char err[AB_ERR_LEN]) { return cl_open(out, n, false, &ab_cachalot, err); }

/* The timed loop. */
static int cl_run(ab_alloc *base, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
                  char err[AB_ERR_LEN]) {
  cachalot_allocator *a = ((cl_inst *)base)->a;
  for (size_t i = 0; i < n; i++) {
    const ab_op *o = &ops[i];
    cachalot_status st = o->size != 0
                             ? cachalot_malloc(a, 0, (size_t)o->size, (cachalot_stream)streams[o->stream], &slots[o->slot])
                             : cachalot_free(a, slots[o->slot]);
    if (st != CACHALOT_OK) {
      *done = i;
      char what[64] = "cachalot_free";
      if (o->size != 0)
        snprintf(what, sizeof what, "cachalot_malloc(%llu)", (unsigned long long)o->size);
      return fail(err, what, st);
    }
  }
  *done = n;
  return 0;
}

/* cl_run with record_stream before the frees that ask for it (the cross rows). */
static int cl_run_rec(ab_alloc *base, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
                      char err[AB_ERR_LEN]) {
  cachalot_allocator *a = ((cl_inst *)base)->a;
  for (size_t i = 0; i < n; i++) {
    const ab_op *o = &ops[i];
    cachalot_status st = CACHALOT_OK;
    const char *what = "cachalot_free";
    if (o->size != 0) {
      st = cachalot_malloc(a, 0, (size_t)o->size, (cachalot_stream)streams[o->stream], &slots[o->slot]);
      what = "cachalot_malloc";
    } else {
      if (o->record != 0 &&
          (st = cachalot_record_stream(a, slots[o->slot], (cachalot_stream)streams[o->record - 1])) != CACHALOT_OK)
        what = "cachalot_record_stream";
      if (st == CACHALOT_OK)
        st = cachalot_free(a, slots[o->slot]);
    }
    if (st != CACHALOT_OK) {
      *done = i;
      return fail(err, what, st);
    }
  }
  *done = n;
  return 0;
}

static int cl_history(ab_alloc *base, bool on, bool stacks, char err[AB_ERR_LEN]) {
  cachalot_allocator *a = ((cl_inst *)base)->a;
  cachalot_status st = cachalot_record_history(a, on, 100000); /* PyTorch's default max_entries */
  if (st != CACHALOT_OK)
    return fail(err, "cachalot_record_history", st);
  if ((st = cachalot_record_history_stacks(a, on && stacks)) != CACHALOT_OK)
    return fail(err, "cachalot_record_history_stacks", st);
  return 0;
}

static int cl_sync(ab_alloc *base, void *const *streams, int n, char err[AB_ERR_LEN]) {
  cl_inst *c = (cl_inst *)base;
  if (c->sim)
    return 0; /* events complete at once; the simulated device has no work to wait for */
#ifdef ALLOC_BENCH_HAVE_CUDA
  return ab_cuda_streams_sync(streams, n, err);
#else
  (void)streams, (void)n, (void)err;
  return 0;
#endif
}

static int cl_stats(ab_alloc *base, bool graph, ab_stats *out, char err[AB_ERR_LEN]) {
  (void)graph;
  cachalot_device_stats st;
  cachalot_status s = cachalot_memory_stats(((cl_inst *)base)->a, 0, &st);
  if (s != CACHALOT_OK)
    return fail(err, "cachalot_memory_stats", s);
  out->peak_reserved = st.reserved_bytes[CACHALOT_STAT_ALL].peak;
  out->peak_allocated = st.allocated_bytes[CACHALOT_STAT_ALL].peak;
  out->device_allocs = st.num_device_alloc;
  return 0;
}

static int cl_check(ab_alloc *base, char err[AB_ERR_LEN]) {
  cl_inst *c = (cl_inst *)base;
  cachalot_status s = cachalot_check(c->a);
  if (s != CACHALOT_OK)
    return fail(err, "cachalot_check", s);
  cachalot_device_stats st;
  if ((s = cachalot_memory_stats(c->a, 0, &st)) != CACHALOT_OK)
    return fail(err, "cachalot_memory_stats", s);
  if (st.allocated_bytes[CACHALOT_STAT_ALL].current != 0 || st.allocation[CACHALOT_STAT_ALL].current != 0) {
    snprintf(err, AB_ERR_LEN, "everything was freed, yet memory_stats says %lld bytes in %lld allocations",
             (long long)st.allocated_bytes[CACHALOT_STAT_ALL].current,
             (long long)st.allocation[CACHALOT_STAT_ALL].current);
    return -1;
  }
  cachalot_host_stats hs;
  if ((s = cachalot_host_memory_stats(c->a, &hs)) != CACHALOT_OK)
    return fail(err, "cachalot_host_memory_stats", s);
  if (hs.active_requests.current != 0 || hs.active_bytes.current != 0) {
    snprintf(err, AB_ERR_LEN, "everything was freed, yet host_memory_stats says %lld pinned bytes in %lld blocks "
             "handed out", (long long)hs.active_bytes.current, (long long)hs.active_requests.current);
    return -1;
  }
  return 0;
}

/* ---- the host workload: the allocator's pinned-host cache ---- */

static int cl_host_run(ab_alloc *base, const ab_op *ops, size_t n, void **slots, size_t *done, uint64_t *ns,
                       char err[AB_ERR_LEN]) {
  cachalot_allocator *a = ((cl_inst *)base)->a;
  cachalot_status st = CACHALOT_OK;
  size_t i = 0;
  uint64_t t0 = ab_now_ns();
  for (; i < n; i++) {
    const ab_op *o = &ops[i];
    st = o->size != 0 ? cachalot_host_malloc(a, (size_t)o->size, &slots[o->slot])
                      : cachalot_host_free(a, slots[o->slot]);
    if (st != CACHALOT_OK)
      break;
  }
  *ns = ab_now_ns() - t0;
  *done = i;
  if (st == CACHALOT_OK)
    return 0;
  char what[64] = "cachalot_host_free";
  if (ops[i].size != 0)
    snprintf(what, sizeof what, "cachalot_host_malloc(%llu)", (unsigned long long)ops[i].size);
  return fail(err, what, st);
}

/* allocated_bytes are the blocks the cache holds pinned, handed out or not (torch.cuda.host_memory_stats'
 * meaning); active_bytes those handed out. */
static int cl_host_stats(ab_alloc *base, ab_stats *out, char err[AB_ERR_LEN]) {
  cachalot_host_stats st;
  cachalot_status s = cachalot_host_memory_stats(((cl_inst *)base)->a, &st);
  if (s != CACHALOT_OK)
    return fail(err, "cachalot_host_memory_stats", s);
  out->peak_reserved = st.allocated_bytes.peak;
  out->peak_allocated = st.active_bytes.peak;
  out->device_allocs = st.num_host_alloc;
  return 0;
}

/* ---- graphs: every capture of a row allocates from one pool, so the warm-up capture's segments serve
 * the timed ones (as graphs sharing a pool do in PyTorch). The pool is made by routing to a
 * graph_pool_handle id once (a use of ours, dropped at close) with a filter no stream passes. ---- */

static bool no_stream(cachalot_stream s, void *ctx) {
  (void)s, (void)ctx;
  return false;
}

static int cl_graph_capture(ab_alloc *base, void *stream, const ab_op *ops, size_t n, void **slots, uint64_t *ns,
                            char err[AB_ERR_LEN]) {
  cl_inst *c = (cl_inst *)base;
  cachalot_status st;
  if (c->pool.first == 0 && c->pool.second == 0) {
    cachalot_mempool_id id = cachalot_graph_pool_handle(c->a);
    if ((st = cachalot_begin_allocate_to_pool(c->a, 0, id, no_stream, NULL)) != CACHALOT_OK)
      return fail(err, "cachalot_begin_allocate_to_pool", st);
    c->pool = id;
    if ((st = cachalot_end_allocate_to_pool(c->a, 0, id)) != CACHALOT_OK)
      return fail(err, "cachalot_end_allocate_to_pool", st);
  }
  if (c->g == NULL && (st = cachalot_graph_create(c->a, 0, false, &c->g)) != CACHALOT_OK)
    return fail(err, "cachalot_graph_create", st);
#ifdef ALLOC_BENCH_HAVE_CUDA
  if (!c->sim && c->node_buffer == NULL && ab_cuda_node_buffer(&c->node_buffer, err) != 0)
    return -1;
#endif
  if ((st = cachalot_graph_capture_begin(c->g, (cachalot_stream)stream, c->pool, CACHALOT_CAPTURE_GLOBAL)) !=
      CACHALOT_OK)
    return fail(err, "cachalot_graph_capture_begin", st);
  /* One node of work, so the graph is not empty (untimed). */
  int rc = 0;
  if (c->sim) {
    if ((st = cachalot_sim_launch(c->b, (cachalot_stream)stream)) != CACHALOT_OK)
      rc = fail(err, "cachalot_sim_launch", st);
  } else {
#ifdef ALLOC_BENCH_HAVE_CUDA
    rc = ab_cuda_node(c->node_buffer, stream, err);
#endif
  }
  size_t done = 0;
  void *const streams[1] = {stream};
  uint64_t t0 = ab_now_ns();
  if (rc == 0)
    rc = cl_run(base, streams, ops, n, slots, &done, err);
  uint64_t t1 = ab_now_ns();
  *ns = t1 - t0;
  if ((st = cachalot_graph_capture_end(c->g)) != CACHALOT_OK && rc == 0)
    rc = fail(err, "cachalot_graph_capture_end", st);
  return rc;
}

static int cl_graph_replay(ab_alloc *base, void *stream, int k, char err[AB_ERR_LEN]) {
  cachalot_graph *g = ((cl_inst *)base)->g;
  for (int i = 0; i < k; i++) {
    cachalot_status st = cachalot_graph_replay(g, (cachalot_stream)stream);
    if (st != CACHALOT_OK)
      return fail(err, "cachalot_graph_replay", st);
  }
  return 0;
}

static int cl_graph_reset(ab_alloc *base, char err[AB_ERR_LEN]) {
  cl_inst *c = (cl_inst *)base;
  cachalot_status st = c->g ? cachalot_graph_reset(c->g) : CACHALOT_OK;
  return st == CACHALOT_OK ? 0 : fail(err, "cachalot_graph_reset", st);
}

const ab_allocator ab_cachalot = {
    .name = "cachalot",
    .kinds = AB_DEVICE | AB_HOST,
    .probe = probe_cuda,
    .open = open_cuda,
    .run = cl_run,
    .run_rec = cl_run_rec,
    .history = cl_history,
    .sync = cl_sync,
    .stats = cl_stats,
    .check = cl_check,
    .graph_capture = cl_graph_capture,
    .graph_replay = cl_graph_replay,
    .graph_reset = cl_graph_reset,
    .host_run = cl_host_run,
    .host_stats = cl_host_stats,
    .close = cl_close,
};

const ab_allocator ab_cachalot_sim = {
    .name = "cachalot-sim",
    .kinds = AB_DEVICE | AB_HOST,
    .probe = probe_sim,
    .open = open_sim,
    .run = cl_run,
    .run_rec = cl_run_rec,
    .history = cl_history,
    .sync = cl_sync,
    .stats = cl_stats,
    .check = cl_check,
    .graph_capture = cl_graph_capture,
    .graph_replay = cl_graph_replay,
    .graph_reset = cl_graph_reset,
    .host_run = cl_host_run,
    .host_stats = cl_host_stats,
    .close = cl_close,
};
