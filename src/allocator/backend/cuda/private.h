/* The CUDA backend: the backend interface on the CUDA runtime (cudart).
 *
 * CUDA's current device is per thread, so an operation that needs another device switches to it and
 * back without disturbing other threads; the switch is made only when needed because a thread that
 * already sits on the device (the common case) should pay one cudaGetDevice, not two cudaSetDevice.
 *
 * Every failing CUDA call is followed by cudaGetLastError(): cudart also records the error as the
 * thread's "last error", and a caller who checks cudaGetLastError() after its own kernel launch would
 * otherwise be blamed for an allocator OOM that cachalot already handled.
 *
 * This header is private to backend/cuda/: the backend's types, the device switch and the error
 * wording every file uses (static inline, as they were when one file held them all), and the functions
 * one file defines for the others. What code above the backend may use is in cuda.h.
 */
#ifndef CACHALOT_BACKEND_CUDA_PRIVATE_H
#define CACHALOT_BACKEND_CUDA_PRIVATE_H

#include "../ops.h"
#include "cuda.h" /* cl_cuda_driver_symbol */

#include "../../../common/error.h"

#include <cuda.h> /* the driver's types, for the functions found through cl_cuda_driver_symbol */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cl_event {
  cudaEvent_t ev;
  int device;
  cachalot_stream stream; /* recorded on, for completion_watch to pick its watching stream */
  struct cl_event *next;  /* free-stack link while pooled */
};

/* Streams of the backend's own per device that wait for watched events and then write the completion
 * word: a watch never touches the user's stream. A watching stream runs its waits in order, so a watch
 * behind a slow one moves the word only when both are done; picked by the recording stream, whose own
 * events complete in order anyway, so only two user streams that share one hold each other up. That
 * delays a block's return to the cache, never the memory: a malloc that finds no fit polls. */
enum { CL_CUDA_WATCH_STREAMS = 16 };

/* Events are recycled because cudaEventCreate/Destroy cost microseconds and take driver locks, and the
 * allocator records one per cross-stream free. A pool per device keeps each event on the device whose
 * streams it is recorded on (cudaEventRecord requires the same context), and a lock per pool keeps
 * threads working on different devices apart. */
typedef struct {
  pthread_mutex_t mu;
  struct cl_event *free;
  cudaStream_t watch[CL_CUDA_WATCH_STREAMS]; /* made on first use, under mu */
} cl_cuda_event_pool;

/* The completion words (ops.h): one 64-byte line per device of mapped, pinned host memory, made when the
 * core first asks for them. For each completion_watch, a watching stream waits for the event and then
 * writes a number never written before (`next`) to the device's word. `off` once a write could not be
 * enqueued: the words are no longer trusted (the failure moves every word, so the warm paths reading them
 * go to poll). */
typedef struct {
  pthread_mutex_t mu; /* guards making them */
  uint32_t *_Atomic host; /* NULL until made */
  CUdeviceptr dev;        /* the device address of `host` */
  _Atomic uint32_t next;
  _Atomic bool off;
  CUresult (*write32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int); /* cuStreamWriteValue32 */
} cl_cuda_words;

typedef struct {
  struct cachalot_backend base; /* first: a cachalot_backend* is a cl_cuda_backend* */
  cl_cuda_words words;
  cl_cuda_event_pool pools[];   /* device_count of them */
} cl_cuda_backend;

/* Words per device in cl_cuda_words.host: one cache line each. */
enum { CL_CUDA_WORD_STRIDE = 16 };

static inline cl_cuda_backend *as_cuda(cachalot_backend *b) { return (cl_cuda_backend *)b; }

/* Clears the thread's pending cudart error (see the top of the file) and records a message naming
 * the operation, the CUDA call and CUDA's own words for the error. */
static inline cachalot_status cuda_fail(cachalot_status s, cudaError_t err, const char *op, const char *call) {
  (void)cudaGetLastError();
  return cl_fail(s, "cuda backend: %s: %s failed: %s (%s)", op, call, cudaGetErrorString(err),
                 cudaGetErrorName(err));
}

typedef struct {
  int prev;
  bool switched;
} cl_cuda_device_scope;

static inline cachalot_status device_enter(int device, cl_cuda_device_scope *sc, const char *op) {
  sc->prev = 0;
  sc->switched = false;
  int cur = 0;
  cudaError_t err = cudaGetDevice(&cur);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, op, "cudaGetDevice");
  if (cur == device)
    return CACHALOT_OK;
  err = cudaSetDevice(device);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, op, "cudaSetDevice");
  sc->prev = cur;
  sc->switched = true;
  return CACHALOT_OK;
}

static inline void device_leave(const cl_cuda_device_scope *sc) {
  /* Switching back to a device that was current a moment ago does not fail in practice; if it ever
   * does, the operation's own outcome is the more useful status, so only the pending error is
   * cleared. */
  if (sc->switched && cudaSetDevice(sc->prev) != cudaSuccess)
    (void)cudaGetLastError();
}

/* ---- what one file defines for the others ---- */

/* memory.c */
cachalot_status cl_cuda_alloc(cachalot_backend *b, int device, size_t size, void **ptr);
cachalot_status cl_cuda_free(cachalot_backend *b, int device, void *ptr);
cachalot_status cl_cuda_mem_info(cachalot_backend *b, int device, size_t *free_bytes, size_t *total_bytes);

/* host.c */
cachalot_status cl_cuda_host_alloc(cachalot_backend *b, size_t size, void **ptr);
cachalot_status cl_cuda_host_free(cachalot_backend *b, void *ptr);
cachalot_status cl_cuda_host_register(cachalot_backend *b, void *ptr, size_t size);
cachalot_status cl_cuda_host_unregister(cachalot_backend *b, void *ptr);

/* events.c */
cachalot_status cl_cuda_event_record(cachalot_backend *b, int device, cachalot_stream s, cl_event **out);
cachalot_status cl_cuda_event_query(cachalot_backend *b, cl_event *e, bool *done);
cachalot_status cl_cuda_event_sync(cachalot_backend *b, cl_event *e);
void cl_cuda_event_release(cachalot_backend *b, cl_event *e);
const uint32_t *cl_cuda_completion_word(cachalot_backend *b, int device);
void cl_cuda_completion_watch(cachalot_backend *b, int device, cl_event *e);
/* The runtime's own cudaHostAlloc and cudaFreeHost (not the interposer's), for the backend's own pinning. */
cudaError_t cl_cuda_real_host_alloc(void **ptr, size_t size, unsigned int flags);
cudaError_t cl_cuda_real_free_host(void *ptr);

/* streams.c: the device of stream `s`; NULL (the legacy stream) and a capturing stream are `device`'s. */
cudaError_t cl_cuda_stream_device(cachalot_stream s, int device, int *out);
cachalot_status cl_cuda_stream_check(cachalot_backend *b, cachalot_stream s);
cachalot_status cl_cuda_stream_wait(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s);
cachalot_status cl_cuda_stream_create(cachalot_backend *b, int device, cachalot_stream *out);
void cl_cuda_stream_destroy(cachalot_backend *b, cachalot_stream s);
cachalot_status cl_cuda_stream_sync(cachalot_backend *b, int device, cachalot_stream s);
cachalot_status cl_cuda_device_sync(cachalot_backend *b, int device);
cachalot_status cl_cuda_memcpy_async(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                     cachalot_stream s);

/* capture.c */
cachalot_status cl_cuda_stream_capture_info(cachalot_backend *b, int device, cachalot_stream s, bool *capturing,
                                            uint64_t *capture_id);
cachalot_status cl_cuda_capture_mode_exchange(cachalot_backend *b, cachalot_capture_mode *mode);
cachalot_status cl_cuda_capture_frontier(cachalot_backend *b, int device, cachalot_stream s, uint64_t *capture_id,
                                         uintptr_t *nodes, size_t cap, size_t *n);
cachalot_status cl_cuda_capture_reaches(cachalot_backend *b, int device, cachalot_stream s, const uintptr_t *from,
                                        size_t n_from, const uintptr_t *to, size_t n_to, bool *all);
cachalot_status cl_cuda_capture_begin(cachalot_backend *b, int device, cachalot_stream s,
                                      cachalot_capture_mode mode);
cachalot_status cl_cuda_capture_end(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
                                    size_t *n_nodes);

/* graph.c */
cachalot_status cl_cuda_graph_instantiate(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec);
cachalot_status cl_cuda_graph_launch(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s);
void cl_cuda_graph_destroy(cachalot_backend *b, cl_graph *g);
void cl_cuda_graph_exec_destroy(cachalot_backend *b, cl_graph_exec *e);
cachalot_status cl_cuda_graph_debug_dot(cachalot_backend *b, cl_graph *g, const char *path);
cachalot_status cl_cuda_ipc_handle(cachalot_backend *b, int device, void *base, unsigned char handle[64]);

/* vmm.c (and cl_cuda_driver_symbol, in cuda.h) */
cachalot_status cl_cuda_va_granularity(cachalot_backend *b, int device, size_t *out);
cachalot_status cl_cuda_va_reserve(cachalot_backend *b, int device, size_t size, void **base);
cachalot_status cl_cuda_va_release(cachalot_backend *b, int device, void *base, size_t size);
cachalot_status cl_cuda_va_map(cachalot_backend *b, int device, void *addr, size_t size);
cachalot_status cl_cuda_va_unmap(cachalot_backend *b, int device, void *addr, size_t size);

#endif
