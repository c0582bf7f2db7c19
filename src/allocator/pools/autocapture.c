/* Capture detection (the config key detect_captures), for callers that cannot tell cachalot about CUDA
 * graph captures: the PyTorch plug-in, the LD_PRELOAD interposer, any program that captures on its own.
 *
 * With it on, every malloc asks the backend whether its stream is being captured. The first malloc of a
 * capture makes a private pool {n,0} for it and routes the capture's streams (the capture stream and
 * every side stream joined into it: they share its capture id) to that pool, as a cachalot_graph does.
 * Once the capture is over (the next malloc or free that looks finds the capture's first stream no
 * longer capturing with that id) the routing ends, but the pool keeps its memory: a graph made from the
 * capture may be replayed at any time, and nothing tells cachalot when it is destroyed. So memory a
 * captured graph uses is never handed to anyone else; cachalot_release_capture_pools gives those pools
 * up once the program knows its graphs are gone.
 *
 * To see that a capture is over, cachalot asks the stream of its first malloc; CUDA may crash when asked
 * about a destroyed stream, so a program must call cachalot_forget_stream before destroying a stream
 * that allocated during a capture (the interposer does it in cudaStreamDestroy; PyTorch never destroys
 * its streams).
 *
 * Locking: d->auto_lock guards d->autos and is taken before (never inside) exclusive mode; the records'
 * capture_id, device and allocator never change while they route, so the filter reads them under the
 * device lock alone. */
#include "pools.h"

#include <stdlib.h>

/* One detected capture. Invariant: `routing` while begin_allocate_to_pool(pool) is active for it, and
 * then the record is counted in its device's n_auto and the allocator's n_auto. */
struct cl_autocap {
  cachalot_allocator *a;
  int device;
  uint64_t capture_id;
  cachalot_stream origin; /* the stream of the capture's first malloc */
  cachalot_mempool_id pool;
  bool routing;
  struct cl_autocap *next;
};

/* The routing filter: the stream is in this capture (called under the device lock; asks the backend
 * only). */
static bool in_capture(cachalot_stream s, void *ctx) {
  const cl_autocap *c = ctx;
  cachalot_backend *b = c->a->backend;
  bool capturing = false;
  uint64_t id = 0;
  return b->ops->stream_capture_info(b, c->device, s, &capturing, &id) == CACHALOT_OK && capturing &&
         id == c->capture_id;
}

/* Ends c's routing (auto_lock held). */
static void stop_routing(cachalot_allocator *a, cl_device *d, cl_autocap *c) {
  /* cannot fail: the routing exists and only this file ends it */
  cl_enter_exclusive(d);
  cachalot_status rc = cl_route_end_locked(d, c->pool);
  cl_leave_exclusive(d);
  (void)rc;
  c->routing = false;
  atomic_fetch_sub_explicit(&d->n_auto, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&a->n_auto, 1, memory_order_relaxed);
}

/* Ends the routing of every record of `d` whose capture is over (auto_lock held). Asks the capture's
 * first stream, which must therefore not have been destroyed: cachalot_forget_stream. */
static void end_finished(cachalot_allocator *a, cl_device *d) {
  cachalot_backend *b = a->backend;
  for (cl_autocap *c = d->autos; c; c = c->next) {
    if (!c->routing)
      continue;
    bool capturing = false;
    uint64_t id = 0;
    if (b->ops->stream_capture_info(b, d->index, c->origin, &capturing, &id) == CACHALOT_OK && capturing &&
        id == c->capture_id)
      continue;
    stop_routing(a, d, c);
  }
}

/* Starts routing capture `id` (whose stream `s` is allocating) unless it already is, or unless another
 * routing claims `s` (a cachalot_graph or the caller's begin_allocate_to_pool: the pool they chose wins)
 * (auto_lock held). */
static cachalot_status start_routing(cachalot_allocator *a, cl_device *d, cachalot_stream s, uint64_t id) {
  for (cl_autocap *c = d->autos; c; c = c->next)
    if (c->routing && c->capture_id == id)
      return CACHALOT_OK;
  cl_autocap *c = calloc(1, sizeof *c);
  if (!c)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
  *c = (cl_autocap){.a = a, .device = d->index, .capture_id = id, .origin = s};
  /* the check and the routing in one section: no routing can begin in between */
  cl_enter_exclusive(d);
  const bool routed = d->n_routes && cl_route_pool_locked(d, s) != &d->default_pool;
  cachalot_status rc = CACHALOT_OK;
  if (!routed) {
    c->pool = (cachalot_mempool_id){atomic_fetch_add_explicit(&a->next_capture_pool, 1, memory_order_relaxed), 0};
    rc = cl_route_begin_locked(d, c->pool, in_capture, c, "cachalot_begin_allocate_to_pool");
  }
  cl_leave_exclusive(d);
  if (routed || rc != CACHALOT_OK) {
    free(c);
    return rc;
  }
  c->routing = true;
  c->next = d->autos;
  d->autos = c;
  atomic_fetch_add_explicit(&d->n_auto, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&a->n_auto, 1, memory_order_relaxed);
  return CACHALOT_OK;
}

cachalot_status cl_autocapture_malloc(cachalot_allocator *a, cl_device *d, cachalot_stream s) {
  cachalot_backend *b = a->backend;
  bool capturing = false;
  uint64_t id = 0;
  cachalot_status rc = b->ops->stream_capture_info(b, d->index, s, &capturing, &id);
  if (rc != CACHALOT_OK && s) {
    cl_error_prefix("cachalot_malloc: device %d: asking whether the stream is being captured: ", d->index);
    return rc;
  }
  /* The legacy stream cannot be asked while a blocking stream of its device captures (CUDA answers
   * cudaErrorStreamCaptureImplicit): it is not part of that capture itself, so its mallocs go on as
   * outside one, as cudaMalloc does then in relaxed mode. */
  if (rc != CACHALOT_OK)
    capturing = false;
  if (!capturing && !atomic_load_explicit(&d->n_auto, memory_order_relaxed))
    return CACHALOT_OK;
  if (capturing && id == 0) /* an invalidated capture: no id says which pool, and the graph is lost anyway */
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_malloc: device %d: the stream's capture was invalidated; end it before allocating",
                   d->index);
  pthread_mutex_lock(&d->auto_lock);
  end_finished(a, d);
  if (capturing && (rc = start_routing(a, d, s, id)) != CACHALOT_OK)
    cl_error_prefix("cachalot_malloc: device %d: a private pool for capture %llu: ", d->index,
                    (unsigned long long)id);
  pthread_mutex_unlock(&d->auto_lock);
  return rc;
}

void cl_autocapture_poll(cachalot_allocator *a) {
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    if (!atomic_load_explicit(&d->n_auto, memory_order_relaxed))
      continue;
    pthread_mutex_lock(&d->auto_lock);
    end_finished(a, d);
    pthread_mutex_unlock(&d->auto_lock);
  }
}

cachalot_status cachalot_forget_stream(cachalot_allocator *a, cachalot_stream s) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_forget_stream");
  if (arg != CACHALOT_OK)
    return arg;
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    pthread_mutex_lock(&d->auto_lock);
    for (cl_autocap *c = d->autos; c; c = c->next) {
      if (c->origin != s)
        continue;
      if (c->routing) /* its capture is over: a capturing stream cannot be destroyed */
        stop_routing(a, d, c);
      c->origin = NULL;
    }
    pthread_mutex_unlock(&d->auto_lock);
  }
  return CACHALOT_OK;
}

cachalot_status cachalot_release_capture_pools(cachalot_allocator *a, int device) {
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_release_capture_pools");
  if (rc != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  pthread_mutex_lock(&d->auto_lock);
  end_finished(a, d);
  for (cl_autocap **link = &d->autos; *link;) {
    cl_autocap *c = *link;
    if (c->routing) {
      link = &c->next;
      continue;
    }
    /* cannot fail: the pool exists with the use its routing gave it */
    cl_enter_exclusive(d);
    rc = cl_pool_release_use_locked(d, c->pool);
    cl_leave_exclusive(d);
    (void)rc;
    *link = c->next;
    free(c);
  }
  pthread_mutex_unlock(&d->auto_lock);
  return CACHALOT_OK;
}

void cl_autocapture_destroy(cl_device *d) {
  while (d->autos) {
    cl_autocap *c = d->autos;
    d->autos = c->next;
    free(c);
  }
  pthread_mutex_destroy(&d->auto_lock);
}
