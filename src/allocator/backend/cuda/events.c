/* Events on the CUDA runtime: recorded from a per-device pool of recycled cudaEvent_t, queried, waited
 * on and given back to their pool; and the completion words, moved by a stream of the backend's own
 * once an event the core watches is done. */
#include "private.h"

#include <stdlib.h>
#include <string.h>

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

/* (words_get, under the words' lock) */
static uint32_t *make_words_held(cl_cuda_backend *cb) {
  cl_cuda_words *w = &cb->words;
  uint32_t *host = atomic_load_explicit(&w->host, memory_order_relaxed);
  if (!host && !atomic_load_explicit(&w->off, memory_order_relaxed)) {
    w->write32 = (CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))cl_cuda_driver_symbol("cuStreamWriteValue32");
    void *p = NULL, *dp = NULL;
    const size_t bytes = (size_t)cb->base.device_count * CL_CUDA_WORD_STRIDE * sizeof(uint32_t);
    if (w->write32 && cl_cuda_real_host_alloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess &&
        cudaHostGetDevicePointer(&dp, p, 0) == cudaSuccess) {
      memset(p, 0, bytes);
      w->dev = (CUdeviceptr)(uintptr_t)dp;
      host = p;
      atomic_store_explicit(&w->host, host, memory_order_release);
    } else {
      (void)cudaGetLastError(); /* no words: the core polls as it did before them */
      if (p)
        (void)cl_cuda_real_free_host(p);
      atomic_store_explicit(&w->off, true, memory_order_relaxed);
    }
  }
  return host;
}

/* The words, made on first use; NULL when they cannot be had or are off. */
static uint32_t *words_get(cl_cuda_backend *cb) {
  cl_cuda_words *w = &cb->words;
  uint32_t *host = atomic_load_explicit(&w->host, memory_order_acquire);
  if (!host && !atomic_load_explicit(&w->off, memory_order_relaxed)) {
    pthread_mutex_lock(&w->mu);
    host = make_words_held(cb);
    pthread_mutex_unlock(&w->mu);
  }
  return atomic_load_explicit(&w->off, memory_order_relaxed) ? NULL : host;
}

/* Turns the words off and moves every device's at once: none will be written again. Once: a second
 * move of 2^31 would bring a word back to where a warm path saw it. */
static void words_fail(cl_cuda_backend *cb, uint32_t *host) {
  if (atomic_exchange_explicit(&cb->words.off, true, memory_order_relaxed))
    return;
  for (int k = 0; k < cb->base.device_count; k++)
    __atomic_fetch_add(&host[(size_t)k * CL_CUDA_WORD_STRIDE], 1u << 31, __ATOMIC_RELEASE);
}

/* The write on s that moves `device`'s word (of `host`, the words) once the work before it is done; a
 * failure turns the words off (words_fail). */
static void word_write(cl_cuda_backend *cb, uint32_t *host, int device, cachalot_stream s) {
  cl_cuda_words *w = &cb->words;
  const uint32_t v = atomic_fetch_add_explicit(&w->next, 1, memory_order_relaxed) + 1;
  const size_t at = (size_t)device * CL_CUDA_WORD_STRIDE;
  if (w->write32((CUstream)s, w->dev + at * sizeof(uint32_t), v, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
    (void)cudaGetLastError();
    words_fail(cb, host);
  }
}

/* Made on the first call (the core asks before it records its first event). */
const uint32_t *cl_cuda_completion_word(cachalot_backend *b, int device) {
  uint32_t *host = words_get(as_cuda(b));
  if (!host || device < 0 || device >= b->device_count)
    return NULL;
  return &host[(size_t)device * CL_CUDA_WORD_STRIDE];
}

/* The watching stream of `pool`'s device for events recorded on `s`, made on first use (that device
 * current); NULL when it cannot be made. */
static cudaStream_t watch_stream(cl_cuda_event_pool *pool, cachalot_stream s) {
  /* (handles are aligned pointers: the multiply spreads their middle bits over the top ones) */
  const size_t k = (size_t)(((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 60) % CL_CUDA_WATCH_STREAMS;
  pthread_mutex_lock(&pool->mu);
  cudaStream_t ws = pool->watch[k];
  if (!ws && cudaStreamCreateWithFlags(&ws, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    ws = NULL;
  }
  pool->watch[k] = ws;
  pthread_mutex_unlock(&pool->mu);
  return ws;
}

void cl_cuda_completion_watch(cachalot_backend *b, int device, cl_event *e) {
  cl_cuda_backend *cb = as_cuda(b);
  uint32_t *host = words_get(cb);
  if (!host || !e) /* words off: every word has moved already */
    return;
  cl_cuda_device_scope sc = {0, false};
  if (b->device_count > 1 && device_enter(e->device, &sc, "completion_watch") != CACHALOT_OK) {
    words_fail(cb, host);
    return;
  }
  cudaStream_t ws = watch_stream(&cb->pools[e->device], e->stream);
  if (!ws || cudaStreamWaitEvent(ws, e->ev, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    words_fail(cb, host);
  } else {
    word_write(cb, host, device, (cachalot_stream)ws);
  }
  device_leave(&sc);
}

cachalot_status cl_cuda_event_record(cachalot_backend *b, int device, cachalot_stream s,
                                     cl_event **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_record: out is NULL");
  *out = NULL;
  /* A stream of another device (a block used by a peer device's stream) is recorded on that device,
   * with an event of that device: cudaEventRecord refuses an event and a stream of different devices. */
  /* With one device there is no other to switch to or to find a stream on: three runtime calls fewer a
   * cross-stream free. */
  const bool one = b->device_count == 1;
  if (s && !one) {
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
  cl_cuda_device_scope sc = {0, false};
  cachalot_status st = one ? CACHALOT_OK : device_enter(device, &sc, "event_record");
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
  e->stream = s;
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
