/* The simulated backend as a whole: creating one (cachalot_backend_sim), destroying it with everything it
 * still holds, and the ops table that makes it a backend. */
#include "sim.h"

#include <stdlib.h>

static void sim_destroy(cachalot_backend *b) {
  struct sim_backend *sim = sim_of(b);
  while (sim->captures)
    cl_sim_capture_finish_held(sim, sim->captures);
  while (sim->graphs) {
    struct cl_graph *next = sim->graphs->next;
    free(sim->graphs->kinds);
    free(sim->graphs->edges);
    free(sim->graphs);
    sim->graphs = next;
  }
  while (sim->execs) {
    struct cl_graph_exec *next = sim->execs->next;
    free(sim->execs);
    sim->execs = next;
  }
  struct sim_stream *st, *stmp;
  HASH_ITER(hh, sim->streams, st, stmp) {
    HASH_DEL(sim->streams, st);
    free(st->deps);
    free(st);
  }
  struct sim_alloc *a, *atmp;
  HASH_ITER(hh, sim->allocs, a, atmp) {
    HASH_DEL(sim->allocs, a);
    free(a);
  }
  struct sim_range *r, *rtmp;
  HASH_ITER(hh, sim->reservations, r, rtmp) {
    HASH_DEL(sim->reservations, r);
    free(r);
  }
  HASH_ITER(hh, sim->mappings, r, rtmp) {
    HASH_DEL(sim->mappings, r);
    free(r);
  }
  cl_sim_host_destroy_held(sim);
  while (sim->slabs) {
    struct sim_event_slab *next = sim->slabs->next;
    free(sim->slabs);
    sim->slabs = next;
  }
  free(sim->watches);
  pthread_mutex_destroy(&sim->mu);
  free(sim);
}

static const cl_backend_ops sim_ops = {
    .name = "sim",
    .alloc = cl_sim_alloc,
    .free = cl_sim_free,
    .mem_info = cl_sim_mem_info,
    .va_granularity = cl_sim_va_granularity,
    .va_reserve = cl_sim_va_reserve,
    .va_release = cl_sim_va_release,
    .va_map = cl_sim_va_map,
    .va_unmap = cl_sim_va_unmap,
    .host_alloc = cl_sim_host_alloc,
    .host_free = cl_sim_host_free,
    .host_register = cl_sim_host_register,
    .host_unregister = cl_sim_host_unregister,
    .event_record = cl_sim_event_record,
    .event_query = cl_sim_event_query,
    .event_sync = cl_sim_event_sync,
    .event_release = cl_sim_event_release,
    .completion_word = cl_sim_completion_word,
    .completion_watch = cl_sim_completion_watch,
    .stream_check = cl_sim_stream_check,
    .stream_capture_info = cl_sim_stream_capture_info,
    .capture_frontier = cl_sim_capture_frontier,
    .capture_reaches = cl_sim_capture_reaches,
    .capture_mode_exchange = cl_sim_capture_mode_exchange,
    .capture_begin = cl_sim_capture_begin,
    .capture_end = cl_sim_capture_end,
    .graph_instantiate = cl_sim_graph_instantiate,
    .graph_launch = cl_sim_graph_launch,
    .graph_destroy = cl_sim_graph_destroy,
    .graph_exec_destroy = cl_sim_graph_exec_destroy,
    .graph_debug_dot = cl_sim_graph_debug_dot,
    .ipc_handle = cl_sim_ipc_handle,
    .memcpy_async = cl_sim_memcpy_async,
    .stream_wait = cl_sim_stream_wait,
    .stream_create = cl_sim_stream_create,
    .stream_destroy = cl_sim_stream_destroy,
    .stream_sync = cl_sim_stream_sync,
    .device_sync = cl_sim_device_sync,
    .destroy = sim_destroy,
};

bool cl_backend_is_sim(const cachalot_backend *b) { return b && b->ops == &sim_ops; }

cachalot_status cachalot_backend_sim(const cachalot_sim_options *opt, cachalot_backend **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_sim: out is NULL");
  *out = NULL;
  cachalot_sim_options o = {
      .device_count = 1, .capacity_bytes = SIM_DEFAULT_CAPACITY, .complete_immediately = false};
  if (opt)
    o = *opt;
  if (o.device_count < 1 || o.device_count > SIM_MAX_DEVICES)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_backend_sim: device_count must be 1..%d, got %d", SIM_MAX_DEVICES,
                   o.device_count);
  if (o.capacity_bytes == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_sim: capacity_bytes must be > 0");

  struct sim_backend *sim = calloc(1, sizeof *sim);
  if (!sim)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_sim: host out of memory");
  if (pthread_mutex_init(&sim->mu, NULL) != 0) {
    free(sim);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_sim: cannot create a mutex");
  }
  sim->base.ops = &sim_ops;
  sim->base.device_count = o.device_count;
  sim->capacity = o.capacity_bytes;
  sim->complete_immediately = o.complete_immediately;
  sim->next_capture_id = 1;
  for (int d = 0; d < o.device_count; d++)
    sim->dev[d].default_stream.device = d;
  *out = &sim->base;
  return CACHALOT_OK;
}
