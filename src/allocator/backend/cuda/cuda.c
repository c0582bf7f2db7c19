/* The CUDA backend as a whole: creating one (cachalot_backend_cuda, with an event pool per device),
 * destroying it, and the ops table that makes it a backend.
 *
 * Built only when CUDA is found (CACHALOT_HAVE_CUDA); a build without it provides a
 * cachalot_backend_cuda() that fails with CACHALOT_ERROR_NOT_SUPPORTED elsewhere (../cuda_none.c). */
#include "private.h"

#include <stdlib.h>

static void cuda_destroy(cachalot_backend *b) {
  if (!b)
    return;
  cl_cuda_backend *cb = as_cuda(b);
  for (int d = 0; d < b->device_count; d++) {
    cl_cuda_event_pool *pool = &cb->pools[d];
    struct cl_event *e = pool->free;
    while (e) {
      struct cl_event *next = e->next;
      /* At process exit cudart may already be unloading (cudaErrorCudartUnloading); the events die
       * with the context then, so a failure only needs its pending error cleared. */
      if (cudaEventDestroy(e->ev) != cudaSuccess)
        (void)cudaGetLastError();
      free(e);
      e = next;
    }
    pool->free = NULL;
    for (int k = 0; k < CL_CUDA_WATCH_STREAMS; k++)
      if (pool->watch[k] && cudaStreamDestroy(pool->watch[k]) != cudaSuccess) /* (at exit: as above) */
        (void)cudaGetLastError();
    pthread_mutex_destroy(&pool->mu);
  }
  uint32_t *words = atomic_load_explicit(&cb->words.host, memory_order_relaxed);
  if (words && cl_cuda_real_free_host(words) != cudaSuccess) /* (at exit: as for the events above) */
    (void)cudaGetLastError();
  pthread_mutex_destroy(&cb->words.mu);
  free(cb);
}

static const cl_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cl_cuda_alloc,
    .free = cl_cuda_free,
    .va_granularity = cl_cuda_va_granularity,
    .va_reserve = cl_cuda_va_reserve,
    .va_release = cl_cuda_va_release,
    .va_map = cl_cuda_va_map,
    .va_unmap = cl_cuda_va_unmap,
    .mem_info = cl_cuda_mem_info,
    .host_alloc = cl_cuda_host_alloc,
    .host_free = cl_cuda_host_free,
    .host_register = cl_cuda_host_register,
    .host_unregister = cl_cuda_host_unregister,
    .event_record = cl_cuda_event_record,
    .event_query = cl_cuda_event_query,
    .event_sync = cl_cuda_event_sync,
    .event_release = cl_cuda_event_release,
    .completion_word = cl_cuda_completion_word,
    .completion_watch = cl_cuda_completion_watch,
    .stream_check = cl_cuda_stream_check,
    .stream_capture_info = cl_cuda_stream_capture_info,
    .capture_frontier = cl_cuda_capture_frontier,
    .capture_reaches = cl_cuda_capture_reaches,
    .capture_mode_exchange = cl_cuda_capture_mode_exchange,
    .capture_begin = cl_cuda_capture_begin,
    .capture_end = cl_cuda_capture_end,
    .graph_instantiate = cl_cuda_graph_instantiate,
    .graph_launch = cl_cuda_graph_launch,
    .graph_destroy = cl_cuda_graph_destroy,
    .graph_exec_destroy = cl_cuda_graph_exec_destroy,
    .graph_debug_dot = cl_cuda_graph_debug_dot,
    .ipc_handle = cl_cuda_ipc_handle,
    .memcpy_async = cl_cuda_memcpy_async,
    .stream_wait = cl_cuda_stream_wait,
    .stream_create = cl_cuda_stream_create,
    .stream_destroy = cl_cuda_stream_destroy,
    .stream_sync = cl_cuda_stream_sync,
    .device_sync = cl_cuda_device_sync,
    .destroy = cuda_destroy,
};

cachalot_status cl_backend_cuda(cachalot_backend **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_cuda: out is NULL");
  *out = NULL;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cl_fail(CACHALOT_ERROR_DEVICE,
                   "no usable CUDA device: cudaGetDeviceCount failed: %s (%s); "
                   "use cachalot_backend_sim() for a simulated device",
                   cudaGetErrorString(err), cudaGetErrorName(err));
  }
  if (n <= 0)
    return cl_fail(CACHALOT_ERROR_DEVICE,
                   "no usable CUDA device: cudaGetDeviceCount found no devices; "
                   "use cachalot_backend_sim() for a simulated device");
  cl_cuda_backend *cb = calloc(1, sizeof *cb + (size_t)n * sizeof cb->pools[0]);
  if (!cb)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_cuda: out of host memory");
  cb->base.ops = &cuda_ops;
  cb->base.device_count = 0;
  if (pthread_mutex_init(&cb->words.mu, NULL) != 0) {
    free(cb);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_cuda: pthread_mutex_init failed");
  }
  for (int d = 0; d < n; d++) {
    if (pthread_mutex_init(&cb->pools[d].mu, NULL) != 0) {
      cuda_destroy(&cb->base); /* destroys the device_count pools made so far */
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_cuda: pthread_mutex_init failed");
    }
    cb->base.device_count = d + 1;
  }
  *out = &cb->base;
  return CACHALOT_OK;
}
