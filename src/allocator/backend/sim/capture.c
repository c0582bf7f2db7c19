/* Simulated stream capture: the threads' capture modes and the rule they set for unsafe calls, a capture's
 * begin and end (with CUDA's joined-fork check), the nodes and edges of the graph it builds, and the
 * stream waits that fork streams into a capture and join them back. */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

/* The calling thread's stream-capture mode (cudaThreadExchangeStreamCaptureMode). Per thread, not per
 * backend, as in CUDA; zero-initialized to GLOBAL, CUDA's default. */
static _Thread_local cachalot_capture_mode sim_thread_mode = CACHALOT_CAPTURE_GLOBAL;

/* CUDA's rule for calls that may synchronize (cudaMalloc, cudaFree) while a capture is underway; see the
 * comment at the top of sim.h. */
bool cl_sim_unsafe_call_prohibited_held(struct sim_backend *sim) {
  cachalot_capture_mode mine = sim_thread_mode;
  if (mine == CACHALOT_CAPTURE_RELAXED)
    return false;
  if (mine == CACHALOT_CAPTURE_GLOBAL && sim->global_captures > 0)
    return true;
  if (sim->strict_captures == 0)
    return false;
  pthread_t self = pthread_self();
  for (const struct sim_capture *c = sim->captures; c; c = c->next) {
    if (c->mode != CACHALOT_CAPTURE_RELAXED && pthread_equal(c->thread, self))
      return true;
  }
  return false;
}

/* The capture id a stream shows: 0 when it takes part in no capture, and also (as CUDA does) when its
 * capture has been invalidated. */
static uint64_t shown_capture_id(const struct sim_stream *st) {
  return st->capture && !st->capture->invalidated ? st->capture->id : 0;
}

cachalot_status cl_sim_stream_capture_info(cachalot_backend *b, int device, cachalot_stream s,
                                           bool *capturing, uint64_t *capture_id) {
  struct sim_backend *sim = sim_of(b);
  if (capturing)
    *capturing = false;
  if (capture_id)
    *capture_id = 0;
  if (!capturing || !capture_id)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated stream capture info: NULL output");
  struct sim_stream *stream;
  cachalot_status st = sim_enter_stream(sim, device, s, true, "simulated stream capture info", &stream);
  if (st != CACHALOT_OK)
    return st;
  /* An invalidated capture counts as capturing with id 0, as cudaStreamGetCaptureInfo reports it. */
  *capturing = stream->capture != NULL;
  *capture_id = shown_capture_id(stream);
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cl_sim_capture_frontier(cachalot_backend *b, int device, cachalot_stream s, uint64_t *capture_id,
                                        uintptr_t *nodes, size_t cap, size_t *n) {
  struct sim_backend *sim = sim_of(b);
  if (!capture_id || !n || (cap && !nodes))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture frontier: NULL output");
  *capture_id = 0;
  *n = 0;
  struct sim_stream *stream;
  cachalot_status st = sim_enter_stream(sim, device, s, true, "simulated capture frontier", &stream);
  if (st != CACHALOT_OK)
    return st;
  if (stream->capture && !stream->capture->invalidated) {
    *capture_id = stream->capture->id;
    *n = stream->n_deps;
    for (size_t i = 0; i < stream->n_deps && i < cap; i++)
      nodes[i] = (uintptr_t)stream->deps[i];
  }
  sim_unlock(sim);
  return CACHALOT_OK;
}

/* Whether every node of `to` is reached walking up the dependencies from `from` (one byte per node marks
 * the nodes reached). False on host out of memory: the caller then keeps waiting, which is safe. */
static bool sim_reaches(const struct sim_capture *c, const uintptr_t *from, size_t n_from, const uintptr_t *to,
                        size_t n_to) {
  const size_t room = c->n_nodes ? c->n_nodes : 1;
  unsigned char *seen = calloc(room, 1);
  size_t *stack = malloc(room * sizeof *stack);
  size_t top = 0;
  for (size_t i = 0; seen && stack && i < n_from; i++)
    if (from[i] < c->n_nodes && !seen[from[i]]) {
      seen[from[i]] = 1;
      stack[top++] = from[i];
    }
  while (seen && stack && top) {
    const size_t v = stack[--top];
    for (size_t e = 0; e < c->n_edges; e++) /* the sim's graphs are small: a scan of the edges per node */
      if (c->edges[e].to == v && !seen[c->edges[e].from]) {
        seen[c->edges[e].from] = 1;
        stack[top++] = c->edges[e].from;
      }
  }
  bool all = seen && stack;
  for (size_t i = 0; all && i < n_to; i++)
    all = to[i] < c->n_nodes && seen[to[i]];
  free(seen);
  free(stack);
  return all;
}

cachalot_status cl_sim_capture_reaches(cachalot_backend *b, int device, cachalot_stream s, const uintptr_t *from,
                                       size_t n_from, const uintptr_t *to, size_t n_to, bool *all) {
  struct sim_backend *sim = sim_of(b);
  if (!all || (n_from && !from) || (n_to && !to))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture reaches: NULL argument");
  *all = false;
  struct sim_stream *stream;
  cachalot_status st = sim_enter_stream(sim, device, s, true, "simulated capture reaches", &stream);
  if (st != CACHALOT_OK)
    return st;
  if (!stream->capture)
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE, "simulated capture reaches: the stream is not capturing");
  else
    *all = sim_reaches(stream->capture, from, n_from, to, n_to);
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_capture_mode_exchange(cachalot_backend *b, cachalot_capture_mode *mode) {
  (void)b;
  if (!mode)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture mode exchange: mode is NULL");
  if (!valid_mode(*mode))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture mode exchange: invalid mode %d",
                   (int)*mode);
  cachalot_capture_mode prev = sim_thread_mode;
  sim_thread_mode = *mode;
  *mode = prev;
  return CACHALOT_OK;
}

/* Room for `need` elements of `elem` bytes in the array `p` of capacity *cap, where need > *cap: the
 * (possibly moved) array, or NULL on host OOM with `p` untouched. */
static void *grow_array(void *p, size_t *cap, size_t need, size_t elem) {
  size_t n = *cap ? *cap : 8;
  while (n < need) {
    if (n > SIZE_MAX / 2)
      return NULL;
    n *= 2;
  }
  if (n > SIZE_MAX / elem)
    return NULL;
  void *q = realloc(p, n * elem);
  if (q)
    *cap = n;
  return q;
}

static bool reserve_deps(struct sim_stream *st, size_t need) {
  if (need <= st->cap_deps)
    return true;
  size_t *q = grow_array(st->deps, &st->cap_deps, need, sizeof *q);
  if (q)
    st->deps = q;
  return q != NULL;
}

/* Ends capture `c` whatever its state: every member leaves it, and the counters and the capture list
 * forget it. Its node arrays are freed unless they were moved to a graph (set to NULL) first. */
void cl_sim_capture_finish_held(struct sim_backend *sim, struct sim_capture *c) {
  for (size_t i = 0; i < c->n_members; i++) {
    c->members[i]->capture = NULL;
    c->members[i]->n_deps = 0;
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    sim->captures = c->next;
  if (c->next)
    c->next->prev = c->prev;
  if (c->mode == CACHALOT_CAPTURE_GLOBAL)
    sim->global_captures--;
  if (c->mode != CACHALOT_CAPTURE_RELAXED)
    sim->strict_captures--;
  free(c->members);
  free(c->kinds);
  free(c->edges);
  free(c);
}

/* Shared by the capture_begin op and cachalot_sim_capture_begin; `stream` is a live created stream. */
cachalot_status cl_sim_capture_begin_held(struct sim_backend *sim, struct sim_stream *stream,
                                            cachalot_capture_mode mode, const char *fn) {
  if (stream->capture)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: stream 0x%" PRIxPTR " is already capturing (capture %" PRIu64 ")", fn,
                   (uintptr_t)stream->key, stream->capture->id);
  struct sim_capture *c = calloc(1, sizeof *c);
  struct sim_stream **members = malloc(4 * sizeof *members);
  if (!c || !members) {
    free(c);
    free(members);
    return host_oom(fn);
  }
  c->id = sim->next_capture_id++;
  c->origin = stream;
  c->mode = mode;
  c->thread = pthread_self();
  c->members = members;
  c->members[0] = stream;
  c->n_members = 1;
  c->cap_members = 4;
  c->next = sim->captures;
  if (sim->captures)
    sim->captures->prev = c;
  sim->captures = c;
  if (mode == CACHALOT_CAPTURE_GLOBAL)
    sim->global_captures++;
  if (mode != CACHALOT_CAPTURE_RELAXED)
    sim->strict_captures++;
  stream->capture = c;
  stream->n_deps = 0;
  return CACHALOT_OK;
}

/* Whether every node of `c` is one the origin stream depends on, or an ancestor of one: CUDA's rule that
 * each fork is joined back into the origin stream before the capture ends. Relies on the edges being
 * sorted by `to` (a node's incoming edges are added with the node). False on host OOM. */
static bool capture_joined(const struct sim_capture *c, bool *joined, size_t *unjoined) {
  size_t n = c->n_nodes;
  *joined = true;
  *unjoined = 0;
  if (n == 0)
    return true;
  size_t *first_in = malloc((n + 1) * sizeof *first_in);
  size_t *stack = malloc(n * sizeof *stack);
  unsigned char *seen = calloc(n, 1);
  if (!first_in || !stack || !seen) {
    free(first_in);
    free(stack);
    free(seen);
    return false;
  }
  size_t e = 0;
  for (size_t v = 0; v <= n; v++) {
    while (e < c->n_edges && c->edges[e].to < v)
      e++;
    first_in[v] = e; /* the edges into v are [first_in[v], first_in[v + 1]) */
  }
  size_t top = 0, reached = 0;
  const struct sim_stream *o = c->origin;
  for (size_t i = 0; i < o->n_deps; i++) {
    if (!seen[o->deps[i]]) {
      seen[o->deps[i]] = 1;
      stack[top++] = o->deps[i];
    }
  }
  while (top > 0) {
    size_t v = stack[--top];
    reached++;
    for (size_t k = first_in[v]; k < first_in[v + 1]; k++) {
      size_t u = c->edges[k].from;
      if (!seen[u]) {
        seen[u] = 1;
        stack[top++] = u;
      }
    }
  }
  free(first_in);
  free(stack);
  free(seen);
  *joined = reached == n;
  *unjoined = n - reached;
  return true;
}

/* Shared by the capture_end op and cachalot_sim_capture_end (graph == NULL: the graph is dropped). */
cachalot_status cl_sim_capture_end_held(struct sim_backend *sim, struct sim_stream *stream, const char *fn,
                                          struct cl_graph **graph, size_t *n_nodes) {
  struct sim_capture *c = stream->capture;
  if (!c)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "%s: stream 0x%" PRIxPTR " is not capturing", fn,
                   (uintptr_t)stream->key);
  if (c->origin != stream) {
    /* cudaErrorStreamCaptureUnmatched, which also invalidates the capture (seen on CUDA 13). */
    capture_invalidate_held(c);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: capture was not initiated in this stream (stream 0x%" PRIxPTR
                   " joined capture %" PRIu64 " of stream 0x%" PRIxPTR "); the capture is now invalidated",
                   fn, (uintptr_t)stream->key, c->id, (uintptr_t)c->origin->key);
  }
  uint64_t id = c->id;
  if (c->mode != CACHALOT_CAPTURE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
    /* cudaErrorStreamCaptureWrongThread, which also ends the capture (seen on CUDA 13). */
    cl_sim_capture_finish_held(sim, c);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: capture %" PRIu64 " must be ended by the thread that began it; it is ended, with no graph",
                   fn, id);
  }
  if (c->invalidated) {
    cl_sim_capture_finish_held(sim, c);
    return cl_fail(CACHALOT_ERROR_DEVICE, "%s: %s (capture %" PRIu64 " was invalidated; no graph)", fn,
                   MSG_INVALIDATED, id);
  }
  bool joined = true;
  size_t unjoined = 0;
  if (!capture_joined(c, &joined, &unjoined))
    return host_oom(fn); /* the capture stays underway */
  if (!joined) {
    size_t total = c->n_nodes;
    cl_sim_capture_finish_held(sim, c);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: capture sequence contains a fork that was not joined to the primary stream (%zu of the "
                   "%zu nodes of capture %" PRIu64 " are not waited on by stream 0x%" PRIxPTR
                   "); it is ended, with no graph",
                   fn, unjoined, total, id, (uintptr_t)stream->key);
  }
  if (graph) {
    struct cl_graph *g = calloc(1, sizeof *g);
    if (!g)
      return host_oom(fn); /* the capture stays underway */
    g->capture_id = id;
    g->n_nodes = c->n_nodes;
    g->kinds = c->kinds;
    g->edges = c->edges;
    g->n_edges = c->n_edges;
    c->kinds = NULL;
    c->edges = NULL;
    g->next = sim->graphs;
    if (sim->graphs)
      sim->graphs->prev = g;
    sim->graphs = g;
    *graph = g;
    *n_nodes = g->n_nodes;
  }
  cl_sim_capture_finish_held(sim, c);
  return CACHALOT_OK;
}

/* Adds a node of `kind` to the capture of `st` (capturing, not invalidated), depending on every node
 * `st` depends on; `st` then depends on the new node alone. Nothing changes on host OOM. */
static cachalot_status capture_add_node_held(struct sim_stream *st, enum sim_node_kind kind, const char *fn) {
  struct sim_capture *c = st->capture;
  if (c->n_nodes + 1 > c->cap_nodes) {
    unsigned char *q = grow_array(c->kinds, &c->cap_nodes, c->n_nodes + 1, sizeof *q);
    if (!q)
      return host_oom(fn);
    c->kinds = q;
  }
  if (c->n_edges + st->n_deps > c->cap_edges) {
    struct sim_edge *q = grow_array(c->edges, &c->cap_edges, c->n_edges + st->n_deps, sizeof *q);
    if (!q)
      return host_oom(fn);
    c->edges = q;
  }
  if (!reserve_deps(st, 1))
    return host_oom(fn);
  size_t id = c->n_nodes++;
  c->kinds[id] = (unsigned char)kind;
  for (size_t i = 0; i < st->n_deps; i++)
    c->edges[c->n_edges++] = (struct sim_edge){st->deps[i], id};
  st->deps[0] = id;
  st->n_deps = 1;
  return CACHALOT_OK;
}

/* One work item on `st`: a node of its capture, or the stream's next number. */
cachalot_status cl_sim_enqueue_held(struct sim_backend *sim, struct sim_stream *st, enum sim_node_kind kind,
                                      const char *fn) {
  if (st->capture) {
    if (st->capture->invalidated)
      return cl_fail(CACHALOT_ERROR_DEVICE, "%s: %s", fn, MSG_INVALIDATED);
    return capture_add_node_held(st, kind, fn);
  }
  (void)sim_submit_held(sim, st, 1);
  return CACHALOT_OK;
}

cachalot_status cl_sim_capture_begin(cachalot_backend *b, int device, cachalot_stream s,
                                     cachalot_capture_mode mode) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated capture begin");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  if (!valid_mode(mode))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture begin: invalid capture mode %d", (int)mode);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_held(sim, device, s, &stream);
  if (st == CACHALOT_OK)
    st = cl_sim_capture_begin_held(sim, stream, mode, "simulated capture begin");
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_capture_end(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
                                   size_t *n_nodes) {
  struct sim_backend *sim = sim_of(b);
  if (graph)
    *graph = NULL;
  if (n_nodes)
    *n_nodes = 0;
  if (!graph || !n_nodes)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture end: NULL output");
  cachalot_status st = sim_check_device(sim, device, "simulated capture end");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_held(sim, device, s, &stream);
  if (st == CACHALOT_OK)
    st = cl_sim_capture_end_held(sim, stream, "simulated capture end", graph, n_nodes);
  sim_unlock(sim);
  return st;
}

/* Adds the dependencies of `s` to those of `waiter` (both in the same capture), without duplicates. */
static cachalot_status deps_union_held(struct sim_stream *waiter, const struct sim_stream *s, const char *fn) {
  if (waiter == s)
    return CACHALOT_OK;
  if (!reserve_deps(waiter, waiter->n_deps + s->n_deps))
    return host_oom(fn);
  size_t n = waiter->n_deps;
  for (size_t i = 0; i < s->n_deps; i++) {
    bool have = false;
    for (size_t j = 0; j < n && !have; j++)
      have = waiter->deps[j] == s->deps[i];
    if (!have)
      waiter->deps[waiter->n_deps++] = s->deps[i];
  }
  return CACHALOT_OK;
}

/* See the comment at the top of sim.h and the ops table entry. During a capture this is CUDA's event
 * record on `s` + wait on `waiter`; outside one it only checks its arguments: the simulation does not make
 * the waiter's completion wait for `s` (the caller completes streams, and may complete `s` first). */
cachalot_status cl_sim_stream_wait(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  static const char fn[] = "simulated stream wait";
  cachalot_status st = sim_check_device(sim, device, fn);
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_stream *w = NULL, *src = NULL;
  if ((st = resolve_any_stream_held(sim, device, waiter, &w)) != CACHALOT_OK ||
      (st = resolve_any_stream_held(sim, device, s, &src)) != CACHALOT_OK)
    goto out;
  struct sim_capture *cs = src->capture, *cw = w->capture;
  if (cs && cs->invalidated) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s: recording on the waited stream: %s", fn, MSG_INVALIDATED);
  } else if (cw && cw->invalidated) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s: %s", fn, MSG_INVALIDATED);
  } else if (cs && !cw) {
    /* A fork: the waiter joins the capture of `s`, depending on what `s` depends on. */
    if (w == &sim->dev[w->device].default_stream) {
      st = cl_fail(CACHALOT_ERROR_DEVICE, "%s: the default stream cannot join capture %" PRIu64 ": %s", fn, cs->id,
                   MSG_UNSUPPORTED);
    } else if (cs->n_members + 1 > cs->cap_members) {
      struct sim_stream **q = grow_array(cs->members, &cs->cap_members, cs->n_members + 1, sizeof *q);
      if (q)
        cs->members = q;
      else
        st = host_oom(fn);
    }
    if (st == CACHALOT_OK && !reserve_deps(w, src->n_deps))
      st = host_oom(fn);
    if (st == CACHALOT_OK) {
      cs->members[cs->n_members++] = w;
      w->capture = cs;
      if (src->n_deps > 0)
        memcpy(w->deps, src->deps, src->n_deps * sizeof *w->deps);
      w->n_deps = src->n_deps;
    }
  } else if (cs && cw == cs) {
    /* A join (or a further fork) inside one capture. */
    st = deps_union_held(w, src, fn);
  } else if (cs && cw) {
    /* cudaErrorStreamCaptureMerge, which invalidates both captures (seen on CUDA 13). */
    capture_invalidate_held(cs);
    capture_invalidate_held(cw);
    st = cl_fail(CACHALOT_ERROR_DEVICE,
                 "%s: operation would have resulted in a merge of two independent capture sequences (captures %" PRIu64
                 " and %" PRIu64 " are now invalidated)",
                 fn, cw->id, cs->id);
  } else if (cw) {
    /* cudaErrorStreamCaptureIsolation, which invalidates the capture (seen on CUDA 13). */
    capture_invalidate_held(cw);
    st = cl_fail(CACHALOT_ERROR_DEVICE,
                 "%s: dependency created on uncaptured work in another stream (capture %" PRIu64
                 " is now invalidated)",
                 fn, cw->id);
  }
  /* else: neither captures; see the comment above. */
out:
  sim_unlock(sim);
  return st;
}
