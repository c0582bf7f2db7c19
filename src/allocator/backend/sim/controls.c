/* The public cachalot_sim_* controls: what a test or a benchmark uses to drive the simulated device
 * (completing work, injecting faults, capturing and launching outside the allocator, reading counters). */
#include "sim.h"

/* The public controls accept any backend handle; anything but a simulated one is the caller's mistake. */
static cachalot_status sim_check(cachalot_backend *b, const char *fn) {
  if (!b)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: backend is NULL", fn);
  if (!cl_backend_is_sim(b))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: not a simulated backend (it is \"%s\")", fn,
                   b->ops->name);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_stream_create(cachalot_backend *b, int device, cachalot_stream *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_stream_create: out is NULL");
  *out = NULL;
  cachalot_status st = sim_check(b, "cachalot_sim_stream_create");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  st = sim_check_device(sim, device, "cachalot_sim_stream_create");
  if (st != CACHALOT_OK)
    return st;
  return cl_sim_stream_create_impl(sim, device, out, "cachalot_sim_stream_create");
}

cachalot_status cachalot_sim_stream_complete(cachalot_backend *b, cachalot_stream s) {
  cachalot_status st = sim_check(b, "cachalot_sim_stream_complete");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  if (!s) {
    for (int d = 0; d < sim->base.device_count; d++) {
      sim->dev[d].default_stream.completed = sim->dev[d].default_stream.submitted;
      sim_completed_held(sim, &sim->dev[d].default_stream);
    }
  } else {
    struct sim_stream *stream = find_stream_held(sim, s);
    if (stream) {
      stream->completed = stream->submitted;
      sim_completed_held(sim, stream);
    } else {
      st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_sim_stream_complete: unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
    }
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_fail_device_allocs(cachalot_backend *b, int count) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_device_allocs");
  if (st != CACHALOT_OK)
    return st;
  if (count < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_device_allocs: count %d is negative",
                   count);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_allocs = count;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_fail_every(cachalot_backend *b, int k) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_every");
  if (st != CACHALOT_OK)
    return st;
  if (k < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_every: k %d is negative", k);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_every = k;
  sim->alloc_count = 0;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_fail_events(cachalot_backend *b, int count) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_events");
  if (st != CACHALOT_OK)
    return st;
  if (count < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_events: count %d is negative", count);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_events = count;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_completion_word(cachalot_backend *b, bool keep) {
  cachalot_status st = sim_check(b, "cachalot_sim_completion_word");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->no_word = !keep;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_device_used(cachalot_backend *b, int device, size_t *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_device_used: out is NULL");
  *out = 0;
  cachalot_status st = sim_check(b, "cachalot_sim_device_used");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  st = sim_check_device(sim, device, "cachalot_sim_device_used");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  *out = sim->dev[device].used;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_capture_begin(cachalot_backend *b, cachalot_stream s,
                                           cachalot_capture_mode mode) {
  cachalot_status st = sim_check(b, "cachalot_sim_capture_begin");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  if (!valid_mode(mode))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_capture_begin: invalid capture mode %d",
                   (int)mode);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = live_stream_held(sim, s, &stream);
  if (st != CACHALOT_OK)
    cl_error_prefix("cachalot_sim_capture_begin: ");
  else
    st = cl_sim_capture_begin_held(sim, stream, mode, "cachalot_sim_capture_begin");
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_capture_end(cachalot_backend *b, cachalot_stream s) {
  cachalot_status st = sim_check(b, "cachalot_sim_capture_end");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = live_stream_held(sim, s, &stream);
  if (st != CACHALOT_OK)
    cl_error_prefix("cachalot_sim_capture_end: ");
  else
    st = cl_sim_capture_end_held(sim, stream, "cachalot_sim_capture_end", NULL, NULL);
  sim_unlock(sim);
  return st;
}

/* The stream a public control names: NULL is device 0's default stream; a destroyed stream is still
 * named (its work can still be inspected). */
static cachalot_status public_stream_held(struct sim_backend *sim, cachalot_stream s, const char *fn,
                                            struct sim_stream **out) {
  *out = s ? find_stream_held(sim, s) : &sim->dev[0].default_stream;
  if (!*out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: unknown simulated stream 0x%" PRIxPTR, fn, handle_bits(s));
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_launch(cachalot_backend *b, cachalot_stream s) {
  cachalot_status st = sim_check(b, "cachalot_sim_launch");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = public_stream_held(sim, s, "cachalot_sim_launch", &stream);
  if (st == CACHALOT_OK && stream->destroyed)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_launch: simulated stream 0x%" PRIxPTR " was destroyed",
                 handle_bits(s));
  if (st == CACHALOT_OK)
    st = cl_sim_enqueue_held(sim, stream, SIM_NODE_KERNEL, "cachalot_sim_launch");
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_stream_submitted(cachalot_backend *b, cachalot_stream s, uint64_t *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_stream_submitted: out is NULL");
  *out = 0;
  cachalot_status st = sim_check(b, "cachalot_sim_stream_submitted");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = public_stream_held(sim, s, "cachalot_sim_stream_submitted", &stream);
  if (st == CACHALOT_OK)
    *out = stream->submitted;
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_fail_host_pins(cachalot_backend *b, int count) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_host_pins");
  if (st != CACHALOT_OK)
    return st;
  if (count < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_host_pins: count %d is negative", count);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_host = count;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_host_pinned(cachalot_backend *b, size_t *allocated, size_t *registered) {
  if (!allocated || !registered)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_host_pinned: an out-pointer is NULL");
  *allocated = *registered = 0;
  cachalot_status st = sim_check(b, "cachalot_sim_host_pinned");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  *allocated = sim->host_allocated;
  *registered = sim->host_registered;
  sim_unlock(sim);
  return CACHALOT_OK;
}
