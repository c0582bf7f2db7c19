/* Simulated streams: creating, checking, destroying and synchronizing them, and copies enqueued on them. */
#include "sim.h"

#include <stdlib.h>

cachalot_status cl_sim_stream_check(cachalot_backend *b, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  if (!s)
    return CACHALOT_OK;
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  cachalot_status st = live_stream_held(sim, s, &stream);
  sim_unlock(sim);
  return st;
}

/* Shared by the stream_create op and cachalot_sim_stream_create, which check their arguments first. */
cachalot_status cl_sim_stream_create_impl(struct sim_backend *sim, int device, cachalot_stream *out,
                                          const char *fn) {
  struct sim_stream *stream = calloc(1, sizeof *stream);
  if (!stream)
    return host_oom(fn);
  stream->key = stream;
  stream->device = device;
  bool oom = false;
  sim_lock(sim);
  stream->sync_epoch = sim->dev[device].sync_epoch; /* nothing of it to complete from before */
  HASH_ADD_PTR(sim->streams, key, stream);
  sim_unlock(sim);
  if (oom) {
    free(stream);
    return host_oom(fn);
  }
  *out = (cachalot_stream)(void *)stream;
  return CACHALOT_OK;
}

cachalot_status cl_sim_stream_create(cachalot_backend *b, int device, cachalot_stream *out) {
  struct sim_backend *sim = sim_of(b);
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated stream create: out is NULL");
  *out = NULL;
  cachalot_status st = sim_check_device(sim, device, "simulated stream create");
  if (st != CACHALOT_OK)
    return st;
  return cl_sim_stream_create_impl(sim, device, out, "simulated stream create");
}

/* The stream is only marked destroyed (see struct sim_stream): its events stay valid and keep completing
 * as the caller completes work. Destroying a capture's origin abandons the capture; a destroyed joined
 * stream stays in its capture, whose end then still needs the stream's nodes joined (as CUDA does). */
void cl_sim_stream_destroy(cachalot_backend *b, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  if (!s)
    return;
  sim_lock(sim);
  struct sim_stream *stream = find_stream_held(sim, s);
  if (stream && !stream->destroyed) {
    stream->destroyed = true;
    if (stream->capture && stream->capture->origin == stream)
      cl_sim_capture_finish_held(sim, stream->capture);
  }
  sim_unlock(sim);
}

cachalot_status cl_sim_stream_sync(cachalot_backend *b, int device, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  struct sim_stream *stream;
  cachalot_status st = sim_enter_stream(sim, device, s, false, "simulated stream sync", &stream);
  if (st != CACHALOT_OK)
    return st;
  if (stream->capture) {
    /* cudaStreamSynchronize of a capturing stream is refused and invalidates it (seen on CUDA 13). */
    capture_invalidate_held(stream->capture);
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated stream sync: %s (the capture is now invalidated)",
                 MSG_UNSUPPORTED);
  } else {
    stream->completed = stream->submitted;
    sim_completed_held(sim, stream);
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_memcpy_async(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                    cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated memcpy");
  if (st != CACHALOT_OK)
    return st;
  if (n > 0 && (!dst || !src))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated memcpy: %s is NULL for %zu bytes",
                   !dst ? "dst" : "src", n);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_held(sim, device, s, &stream);
  /* Nothing is copied: the addresses are fake. A copy of 0 bytes is no work and no node, as in CUDA. */
  if (st == CACHALOT_OK && n > 0)
    st = cl_sim_enqueue_held(sim, stream, SIM_NODE_MEMCPY, "simulated memcpy");
  sim_unlock(sim);
  return st;
}
