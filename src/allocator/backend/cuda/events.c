/* Events on the CUDA runtime: recorded from a per-device pool of recycled cudaEvent_t, queried, waited
 * on and given back to their pool. */
#include "private.h"

#include <stdlib.h>

static void pool_push(cl_cuda_event_pool *pool, struct cl_event *e) {
  pthread_mutex_lock(&pool->mu);
  e->next = pool->free;
  pool->free = e;
  pthread_mutex_unlock(&pool->mu);
}

static struct cl_event *pool_pop(cl_cuda_event_pool *pool) {
  pthread_mutex_lock(&pool->mu);
  struct cl_event *e = pool->free;
  if (e)
    pool->free = e->next;
  pthread_mutex_unlock(&pool->mu);
  return e;
}

cachalot_status cl_cuda_event_record(cachalot_backend *b, int device, cachalot_stream s,
                                     cl_event **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_record: out is NULL");
  *out = NULL;
  /* A stream of another device (a block used by a peer device's stream) is recorded on that device,
   * with an event of that device: cudaEventRecord refuses an event and a stream of different devices. */
  if (s) {
    int sdev = device;
    cudaError_t derr = cl_cuda_stream_device(s, device, &sdev);
    if (derr != cudaSuccess)
      return cuda_fail(CACHALOT_ERROR_DEVICE, derr, "event_record", "cudaStreamGetDevice");
    if (sdev >= 0 && sdev < b->device_count)
      device = sdev;
  }
  cl_cuda_event_pool *pool = &as_cuda(b)->pools[device];
  /* The device must be current even for a pooled event: the NULL (legacy) and per-thread default
   * stream handles name the current device's stream. */
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "event_record");
  if (st != CACHALOT_OK)
    return st;
  struct cl_event *e = pool_pop(pool);
  if (!e) {
    e = malloc(sizeof *e);
    if (!e) {
      device_leave(&sc);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cuda backend: event_record: out of host memory");
    }
    /* Timing is never read, and untimed events are cheaper to record and to wait on. */
    cudaError_t err = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      free(e);
      device_leave(&sc);
      return cuda_fail(CACHALOT_ERROR_DEVICE, err, "event_record", "cudaEventCreateWithFlags");
    }
    e->device = device;
  }
  e->next = NULL;
  cudaError_t err = cudaEventRecord(e->ev, s);
  device_leave(&sc);
  if (err != cudaSuccess) {
    /* A failed record leaves the event usable; the next record overwrites whatever it holds. */
    pool_push(pool, e);
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "event_record", "cudaEventRecord");
  }
  *out = e;
  return CACHALOT_OK;
}

/* Query and synchronize need no device switch: an event carries its own context. */
cachalot_status cl_cuda_event_query(cachalot_backend *b, cl_event *e, bool *done) {
  (void)b;
  if (!done)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_query: done is NULL");
  *done = false;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_query: event is NULL");
  cudaError_t err = cudaEventQuery(e->ev);
  if (err == cudaSuccess) {
    *done = true;
    return CACHALOT_OK;
  }
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError(); /* not an error to the caller; see the top of private.h */
    return CACHALOT_OK;
  }
  return cuda_fail(CACHALOT_ERROR_DEVICE, err, "event_query", "cudaEventQuery");
}

cachalot_status cl_cuda_event_sync(cachalot_backend *b, cl_event *e) {
  (void)b;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_sync: event is NULL");
  cudaError_t err = cudaEventSynchronize(e->ev);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "event_sync", "cudaEventSynchronize");
  return CACHALOT_OK;
}

void cl_cuda_event_release(cachalot_backend *b, cl_event *e) {
  if (e)
    pool_push(&as_cuda(b)->pools[e->device], e);
}
