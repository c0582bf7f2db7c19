/* The backend interface: the only way the allocator core reaches a device.
 *
 * The core never includes a CUDA header; each device action is one function of this table. A backend
 * is a struct whose first member is `struct cachalot_backend` (so a cachalot_backend* can be cast to the
 * concrete type after checking `ops`).
 *
 * Contract, for every function:
 * - thread-safe: any thread may call any function at any time; the backend takes its own locks and
 *   never calls back into the allocator;
 * - a failure returns a status and sets cachalot_last_error() via cl_fail(); no sticky device error is
 *   left behind after an out-of-memory failure;
 * - `device` has been validated by the caller (0 <= device < device_count).
 */
#ifndef CACHALOT_BACKEND_OPS_H
#define CACHALOT_BACKEND_OPS_H

#include <cachalot/backend.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A recorded event. Owned by the backend; the core holds it from event_record until event_release. */
typedef struct cl_event cl_event;
/* A captured graph (on CUDA, the cudaGraph_t itself) and an instantiated one (cudaGraphExec_t). */
typedef struct cl_graph cl_graph;
typedef struct cl_graph_exec cl_graph_exec;

typedef struct cl_backend_ops {
  const char *name; /* "cuda" or "sim" */

  /* Allocates `size` bytes of device memory on `device`. CACHALOT_OK with *ptr set; OUT_OF_MEMORY when the
   * device cannot hold it (or an injected fault); DEVICE for any other failure (e.g. not permitted
   * while a stream is capturing). Never returns OK with *ptr == NULL. */
  cachalot_status (*alloc)(cachalot_backend *b, int device, size_t size, void **ptr);
  /* Frees memory from alloc() on the same device (synchronizes the device, as cudaFree does). */
  cachalot_status (*free)(cachalot_backend *b, int device, void *ptr);
  /* The device's free and total bytes (cudaMemGetInfo). */
  cachalot_status (*mem_info)(cachalot_backend *b, int device, size_t *free_bytes, size_t *total_bytes);

  /* --- virtual memory (for expandable segments) ---
   * Address space is reserved once and backed by physical memory one mapping at a time; sizes and
   * addresses are multiples of the granularity. */
  /* The mapping granularity of `device` in bytes (a power of two; 2 MiB on the GPUs seen so far). */
  cachalot_status (*va_granularity)(cachalot_backend *b, int device, size_t *out);
  /* Reserves `size` bytes of address space for `device`, no memory behind them: *base. Costs no device
   * memory; DEVICE when the address space is exhausted. */
  cachalot_status (*va_reserve)(cachalot_backend *b, int device, size_t size, void **base);
  /* Gives a reservation back (base and size as reserved); INVALID_STATE while anything in it is mapped. */
  cachalot_status (*va_release)(cachalot_backend *b, int device, void *base, size_t size);
  /* Backs [addr, addr + size), inside a reservation of `device` and not mapped, with new physical memory
   * of `device`, readable and writable by it (create, map, set access: all or nothing). OUT_OF_MEMORY when
   * the device has not the memory (or an injected fault: maps count as device allocations). */
  cachalot_status (*va_map)(cachalot_backend *b, int device, void *addr, size_t size);
  /* Undoes one va_map (the same addr and size) and frees its physical memory; does not wait for the
   * device: the caller makes sure no work still uses the range. */
  cachalot_status (*va_unmap)(cachalot_backend *b, int device, void *addr, size_t size);

  /* --- pinned host memory (the host cache, host_cache.c) ---
   * Page-locked host memory, which a device copies from and to asynchronously. Not tied to a device. */
  /* Allocates `size` (> 0) bytes of page-locked host memory (cudaHostAlloc): *ptr. OUT_OF_MEMORY when
   * they cannot be had or pinned (or an injected fault: pinning counts as a host allocation). */
  cachalot_status (*host_alloc)(cachalot_backend *b, size_t size, void **ptr);
  /* Frees memory from host_alloc (cudaFreeHost, which synchronizes the device first). */
  cachalot_status (*host_free)(cachalot_backend *b, void *ptr);
  /* Page-locks [ptr, ptr + size) of ordinary host memory (cudaHostRegister): OUT_OF_MEMORY when it
   * cannot (or an injected fault, as for host_alloc). */
  cachalot_status (*host_register)(cachalot_backend *b, void *ptr, size_t size);
  /* Undoes host_register (ptr as registered; cudaHostUnregister). The memory stays the caller's. */
  cachalot_status (*host_unregister)(cachalot_backend *b, void *ptr);

  /* Records an event on stream `s`, capturing all work enqueued on `s` so far. A non-NULL stream is
   * recorded on its own device (which may differ from `device`: a block can be used by a stream of
   * another device); NULL is `device`'s default stream. The event comes from a recycled pool; *out is
   * valid until event_release. */
  cachalot_status (*event_record)(cachalot_backend *b, int device, cachalot_stream s, cl_event **out);
  /* *done = whether the event has completed. Never blocks. */
  cachalot_status (*event_query)(cachalot_backend *b, cl_event *e, bool *done);
  /* Blocks until the event has completed. */
  cachalot_status (*event_sync)(cachalot_backend *b, cl_event *e);
  /* Returns the event to the backend's pool. Never fails. */
  void (*event_release)(cachalot_backend *b, cl_event *e);
  /* A word that takes a value it has not held before soon after each event given to completion_watch
   * completes (see there for what may delay it; it may move at other times too); NULL when the backend
   * keeps none, then or any more. Read it with an atomic load. The warm malloc reads it to skip a poll that
   * could only find nothing done. NULL in the ops table is the same as NULL returned. */
  const uint32_t *(*completion_word)(cachalot_backend *b, int device);
  /* Makes `device`'s completion word move once event `e` (recorded, not yet released) completes, and not
   * later for work enqueued after it on its stream (CUDA: a stream of the backend's own waits for the
   * event, then writes the word: ~1.2 us of CPU, which is why the core asks only for slow events; the
   * recording stream is not touched, as it may be destroyed or captured by then; a watch that shares its
   * waiting stream with a slower one moves the word once both are done). Where that cannot be had, the
   * backend moves the word at once and keeps none from then on. Required with completion_word. */
  void (*completion_watch)(cachalot_backend *b, int device, cl_event *e);

  /* Verifies that events can be recorded on `s` (NULL, the default stream, always can): INVALID_ARGUMENT
   * for a handle the backend knows is not a stream. Lets record_stream refuse a bad stream at once,
   * instead of every later free of the block failing. */
  cachalot_status (*stream_check)(cachalot_backend *b, cachalot_stream s);

  /* Whether stream `s` of `device` is being captured, and the capture's id (0 when not capturing). */
  cachalot_status (*stream_capture_info)(cachalot_backend *b, int device, cachalot_stream s, bool *capturing,
                                         uint64_t *capture_id);
  /* While stream `s` is being captured: its capture's id, and the nodes its next captured work will depend
   * on (opaque ids: up to `cap` written to nodes, *n the whole count). Not capturing: *capture_id 0, *n 0.
   * For graph_capture_record_stream_reuse (capture_reuse.c). */
  cachalot_status (*capture_frontier)(cachalot_backend *b, int device, cachalot_stream s, uint64_t *capture_id,
                                      uintptr_t *nodes, size_t cap, size_t *n);
  /* Whether every node of `to` is one of `from` or an ancestor of one (every path of dependencies counts),
   * in the graph stream `s` is capturing into: one walk up from `from` for all of them. */
  cachalot_status (*capture_reaches)(cachalot_backend *b, int device, cachalot_stream s, const uintptr_t *from,
                                     size_t n_from, const uintptr_t *to, size_t n_to, bool *all);
  /* Exchanges the calling thread's stream-capture mode (cudaThreadExchangeStreamCaptureMode): *mode in,
   * previous mode out. */
  cachalot_status (*capture_mode_exchange)(cachalot_backend *b, cachalot_capture_mode *mode);

  /* --- graphs (used by src/graph/) --- */
  /* Begins capturing stream `s` of `device` in `mode` (cudaStreamBeginCapture). */
  cachalot_status (*capture_begin)(cachalot_backend *b, int device, cachalot_stream s, cachalot_capture_mode mode);
  /* Ends the capture of `s`: *graph is the captured graph (destroy it with graph_destroy), *n_nodes its
   * node count. An invalidated capture fails with DEVICE (and still ends it, with no graph). */
  cachalot_status (*capture_end)(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
                                 size_t *n_nodes);
  /* Instantiates with auto-free-on-launch. */
  cachalot_status (*graph_instantiate)(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec);
  /* Launches an instance on `s`. */
  cachalot_status (*graph_launch)(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s);
  void (*graph_destroy)(cachalot_backend *b, cl_graph *g);
  void (*graph_exec_destroy)(cachalot_backend *b, cl_graph_exec *e);
  /* Writes the graph as a DOT file (cudaGraphDebugDotPrint). */
  cachalot_status (*graph_debug_dot)(cachalot_backend *b, cl_graph *g, const char *path);

  /* --- interprocess (CUDA IPC) --- */
  /* The IPC handle of the device allocation at `base` on `device` (cudaIpcGetMemHandle). */
  cachalot_status (*ipc_handle)(cachalot_backend *b, int device, void *base, unsigned char handle[64]);
  /* Copies n bytes between device buffers on `s`, in stream order (cudaMemcpyAsync). */
  cachalot_status (*memcpy_async)(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                  cachalot_stream s);
  /* Makes `waiter` wait for the work enqueued on `s` so far (an event recorded on s, waited on by waiter). */
  cachalot_status (*stream_wait)(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s);
  /* A new stream of `device` (non-blocking), and its destruction. */
  cachalot_status (*stream_create)(cachalot_backend *b, int device, cachalot_stream *out);
  void (*stream_destroy)(cachalot_backend *b, cachalot_stream s);
  /* Blocks until all work enqueued on `s` is done. */
  cachalot_status (*stream_sync)(cachalot_backend *b, int device, cachalot_stream s);
  /* Blocks until all work on `device` is done (cudaDeviceSynchronize): before memory is unmapped, which,
   * unlike a device free, does not wait by itself. Refused while a capture the thread must respect is
   * underway. */
  cachalot_status (*device_sync)(cachalot_backend *b, int device);

  /* Frees the backend and everything it owns. */
  void (*destroy)(cachalot_backend *b);
} cl_backend_ops;

struct cachalot_backend {
  const cl_backend_ops *ops;
  int device_count;
};

/* A backend over the CUDA runtime (cuda/cuda.c), or NOT_SUPPORTED in a build without it (cuda_none.c);
 * cachalot_backend_cuda is a shell over it. */
cachalot_status cl_backend_cuda(cachalot_backend **out);

#endif
