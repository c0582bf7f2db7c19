/* Simulated graphs: instantiating, launching and destroying what a capture produced, and its DOT dump. */
#include "sim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool graph_known_held(const struct sim_backend *sim, const struct cl_graph *g) {
  for (const struct cl_graph *x = sim->graphs; x; x = x->next)
    if (x == g)
      return true;
  return false;
}

static bool exec_known_held(const struct sim_backend *sim, const struct cl_graph_exec *e) {
  for (const struct cl_graph_exec *x = sim->execs; x; x = x->next)
    if (x == e)
      return true;
  return false;
}

cachalot_status cl_sim_graph_instantiate(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec) {
  struct sim_backend *sim = sim_of(b);
  if (!exec)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph instantiate: exec is NULL");
  *exec = NULL;
  cachalot_status st = sim_check_device(sim, device, "simulated graph instantiate");
  if (st != CACHALOT_OK)
    return st;
  struct cl_graph_exec *e = calloc(1, sizeof *e);
  if (!e)
    return host_oom("simulated graph instantiate");
  sim_lock(sim);
  if (!g || !graph_known_held(sim, g)) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph instantiate: %p is not a live simulated graph",
                 (void *)g);
    free(e);
  } else {
    e->n_nodes = g->n_nodes;
    e->next = sim->execs;
    if (sim->execs)
      sim->execs->prev = e;
    sim->execs = e;
    *exec = e;
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_graph_launch(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated graph launch");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  if (!e || !exec_known_held(sim, e)) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                 "simulated graph launch: %p is not a live simulated graph instance", (void *)e);
  } else if ((st = resolve_stream_held(sim, device, s, &stream)) != CACHALOT_OK) {
    /* failed */
  } else if (stream->capture) {
    /* cudaGraphLaunch into a capture is refused and invalidates it (seen on CUDA 13). */
    capture_invalidate_held(stream->capture);
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated graph launch: %s (the capture is now invalidated)",
                 MSG_UNSUPPORTED);
  } else {
    (void)sim_submit_held(sim, stream, e->n_nodes);
  }
  sim_unlock(sim);
  return st;
}

void cl_sim_graph_destroy(cachalot_backend *b, cl_graph *g) {
  struct sim_backend *sim = sim_of(b);
  if (!g)
    return;
  sim_lock(sim);
  /* An unknown handle (destroyed twice, or not ours) is ignored rather than freed. */
  if (graph_known_held(sim, g)) {
    if (g->prev)
      g->prev->next = g->next;
    else
      sim->graphs = g->next;
    if (g->next)
      g->next->prev = g->prev;
    free(g->kinds);
    free(g->edges);
    free(g);
  }
  sim_unlock(sim);
}

void cl_sim_graph_exec_destroy(cachalot_backend *b, cl_graph_exec *e) {
  struct sim_backend *sim = sim_of(b);
  if (!e)
    return;
  sim_lock(sim);
  if (exec_known_held(sim, e)) {
    if (e->prev)
      e->prev->next = e->next;
    else
      sim->execs = e->next;
    if (e->next)
      e->next->prev = e->prev;
    free(e);
  }
  sim_unlock(sim);
}

/* The DOT file: one line per node ("n3 [label=\"kernel\"];"), then one per edge ("n0 -> n3;"). */
cachalot_status cl_sim_graph_debug_dot(cachalot_backend *b, cl_graph *g, const char *path) {
  struct sim_backend *sim = sim_of(b);
  if (!path)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: path is NULL");
  sim_lock(sim);
  cachalot_status st = CACHALOT_OK;
  if (!g || !graph_known_held(sim, g)) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: %p is not a live simulated graph",
                 (void *)g);
    goto out;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    int err = errno;
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: cannot open '%s' for writing: %s",
                 path, strerror(err));
    goto out;
  }
  fprintf(f, "digraph cachalot_sim_graph {\n");
  fprintf(f, "  label=\"capture %" PRIu64 ", %zu nodes\";\n", g->capture_id, g->n_nodes);
  for (size_t i = 0; i < g->n_nodes; i++)
    fprintf(f, "  n%zu [label=\"%s\"];\n", i, g->kinds[i] == SIM_NODE_MEMCPY ? "memcpy" : "kernel");
  for (size_t i = 0; i < g->n_edges; i++)
    fprintf(f, "  n%zu -> n%zu;\n", g->edges[i].from, g->edges[i].to);
  fprintf(f, "}\n");
  int werr = ferror(f) ? (errno ? errno : EIO) : 0;
  if (fclose(f) != 0 && !werr)
    werr = errno ? errno : EIO;
  if (werr)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: writing '%s' failed: %s", path,
                 strerror(werr));
out:
  sim_unlock(sim);
  return st;
}
