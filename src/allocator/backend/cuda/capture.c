/* Stream capture on the CUDA runtime: whether a stream is capturing (through the driver where it is
 * faster), the thread's capture mode, and beginning and ending a capture, which hands a graph to
 * graph.c's functions. */
#include "private.h"

#include <cuda.h>
#include <stdlib.h>
#include <uthash.h>

/* The driver's cuStreamGetCaptureInfo, found through the runtime (no link-time libcuda): for a stream
 * other than NULL it answers without a device switch, in ~25 ns on an H100 host where the runtime's
 * cudaGetDevice + cudaStreamGetCaptureInfo take ~120 ns. Capture detection asks it on every malloc. */
typedef CUresult (*capture_info_fn)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                    const CUgraphNode **, size_t *);
static capture_info_fn driver_capture_info;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void find_driver_capture_info(void) {
  /* version 12000 (cl_cuda_driver_symbol): the signature above; later versions of the symbol take edge
   * data too */
  driver_capture_info = (capture_info_fn)cl_cuda_driver_symbol("cuStreamGetCaptureInfo");
}

/* cudaStreamGetCaptureInfo of stream s on `device`, the device made current for it (the NULL stream is
 * the current device's legacy stream): the status, the id and, where deps is not NULL, the nodes the
 * stream's next captured work will depend on. */
static cachalot_status runtime_capture_info(int device, cachalot_stream s, const char *who,
                                            enum cudaStreamCaptureStatus *status, unsigned long long *id,
                                            const cudaGraphNode_t **deps, size_t *n_deps) {
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, who);
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaStreamGetCaptureInfo(s, status, id, NULL, deps, NULL, n_deps);
  device_leave(&sc);
  return err == cudaSuccess ? CACHALOT_OK : cuda_fail(CACHALOT_ERROR_DEVICE, err, who, "cudaStreamGetCaptureInfo");
}

cachalot_status cl_cuda_stream_capture_info(cachalot_backend *b, int device, cachalot_stream s,
                                            bool *capturing, uint64_t *capture_id) {
  (void)b;
  if (capturing)
    *capturing = false;
  if (capture_id)
    *capture_id = 0;
  if (!capturing || !capture_id)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cuda backend: stream_capture_info: an out-pointer is NULL");
  if (s) {
    pthread_once(&driver_once, find_driver_capture_info);
    CUstreamCaptureStatus ds = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t did = 0;
    if (driver_capture_info && driver_capture_info((CUstream)s, &ds, &did, NULL, NULL, NULL) == CUDA_SUCCESS &&
        ds != CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
      *capturing = ds == CU_STREAM_CAPTURE_STATUS_ACTIVE;
      *capture_id = *capturing ? did : 0;
      return CACHALOT_OK;
    }
    /* an error or an invalidated capture: the runtime's path below words and classifies it */
  }
  /* cudaErrorStreamCaptureImplicit (the legacy stream queried while a blocking stream of its device
   * is capturing) is passed on as an error: the legacy stream is then neither capturing nor safe to
   * use as if nothing were, and there is no capture id to give. */
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cachalot_status st = runtime_capture_info(device, s, "stream_capture_info", &status, &id, NULL, NULL);
  if (st != CACHALOT_OK)
    return st;
  switch (status) {
  case cudaStreamCaptureStatusActive:
    *capturing = true;
    *capture_id = id;
    break;
  case cudaStreamCaptureStatusInvalidated:
    /* The capture is broken but not yet ended: memory handed out now must still not be treated as
     * ordinary, so this counts as capturing. CUDA gives no id for it (the driver writes 0, as seen
     * on CUDA 13 / H200), so the caller gets capturing with id 0 and cannot tell which capture it
     * was; it should refuse the request rather than pick a pool. */
    *capturing = true;
    *capture_id = 0;
    break;
  case cudaStreamCaptureStatusNone:
  default:
    break;
  }
  return CACHALOT_OK;
}

static bool mode_to_cuda(cachalot_capture_mode m, enum cudaStreamCaptureMode *out) {
  switch (m) {
  case CACHALOT_CAPTURE_GLOBAL: *out = cudaStreamCaptureModeGlobal; return true;
  case CACHALOT_CAPTURE_THREAD_LOCAL: *out = cudaStreamCaptureModeThreadLocal; return true;
  case CACHALOT_CAPTURE_RELAXED: *out = cudaStreamCaptureModeRelaxed; return true;
  }
  return false;
}

static bool mode_from_cuda(enum cudaStreamCaptureMode m, cachalot_capture_mode *out) {
  switch (m) {
  case cudaStreamCaptureModeGlobal: *out = CACHALOT_CAPTURE_GLOBAL; return true;
  case cudaStreamCaptureModeThreadLocal: *out = CACHALOT_CAPTURE_THREAD_LOCAL; return true;
  case cudaStreamCaptureModeRelaxed: *out = CACHALOT_CAPTURE_RELAXED; return true;
  }
  return false;
}

cachalot_status cl_cuda_capture_mode_exchange(cachalot_backend *b, cachalot_capture_mode *mode) {
  (void)b;
  if (!mode)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: capture_mode_exchange: mode is NULL");
  enum cudaStreamCaptureMode m;
  if (!mode_to_cuda(*mode, &m))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: capture_mode_exchange: bad mode %d",
                   (int)*mode);
  const enum cudaStreamCaptureMode wanted = m;
  cudaError_t err = cudaThreadExchangeStreamCaptureMode(&m);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "capture_mode_exchange",
                     "cudaThreadExchangeStreamCaptureMode");
  cachalot_capture_mode prev;
  if (!mode_from_cuda(m, &prev)) {
    /* A mode this code does not know cannot be handed back for a later restore, so the exchange is
     * undone rather than leaving the thread in a mode nobody can name. */
    enum cudaStreamCaptureMode undo = m;
    if (cudaThreadExchangeStreamCaptureMode(&undo) != cudaSuccess)
      (void)cudaGetLastError();
    return cl_fail(CACHALOT_ERROR_DEVICE,
                   "cuda backend: capture_mode_exchange: unknown previous capture mode %d (asked for %d)",
                   (int)m, (int)wanted);
  }
  *mode = prev;
  return CACHALOT_OK;
}

/* The status for a CUDA error of the capture calls: misuses of the capture sequence (not capturing, ended
 * on a stream that only joined it, from the wrong thread, with an unjoined fork) are INVALID_STATE, as the
 * simulated backend reports them; everything else, an invalidated capture included, is DEVICE. */
static cachalot_status capture_status(cudaError_t err) {
  switch (err) {
  case cudaErrorIllegalState:
  case cudaErrorStreamCaptureUnmatched:
  case cudaErrorStreamCaptureWrongThread:
  case cudaErrorStreamCaptureUnjoined:
    return CACHALOT_ERROR_INVALID_STATE;
  default:
    return CACHALOT_ERROR_DEVICE;
  }
}

cachalot_status cl_cuda_capture_begin(cachalot_backend *b, int device, cachalot_stream s,
                                      cachalot_capture_mode mode) {
  (void)b;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  enum cudaStreamCaptureMode m;
  if (!mode_to_cuda(mode, &m))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: capture_begin: bad mode %d", (int)mode);
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "capture_begin");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaStreamBeginCapture(s, m);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(capture_status(err), err, "capture_begin", "cudaStreamBeginCapture");
  return CACHALOT_OK;
}

cachalot_status cl_cuda_capture_end(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
                                    size_t *n_nodes) {
  (void)b;
  if (graph)
    *graph = NULL;
  if (n_nodes)
    *n_nodes = 0;
  if (!graph || !n_nodes)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: capture_end: an out-pointer is NULL");
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "capture_end");
  if (st != CACHALOT_OK)
    return st;
  cudaGraph_t g = NULL;
  cudaError_t err = cudaStreamEndCapture(s, &g);
  device_leave(&sc);
  if (err != cudaSuccess) {
    /* An invalidated or unjoined capture is ended by the call, with no graph; should one come back
     * anyway, it is not handed on. */
    if (g && cudaGraphDestroy(g) != cudaSuccess)
      (void)cudaGetLastError();
    return cuda_fail(capture_status(err), err, "capture_end", "cudaStreamEndCapture");
  }
  if (!g)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: capture_end: cudaStreamEndCapture returned no graph");
  size_t n = 0;
  err = cudaGraphGetNodes(g, NULL, &n);
  if (err != cudaSuccess) {
    cachalot_status rc = cuda_fail(CACHALOT_ERROR_DEVICE, err, "capture_end", "cudaGraphGetNodes");
    if (cudaGraphDestroy(g) != cudaSuccess)
      (void)cudaGetLastError();
    return rc;
  }
  *graph = (cl_graph *)g;
  *n_nodes = n;
  return CACHALOT_OK;
}

cachalot_status cl_cuda_capture_frontier(cachalot_backend *b, int device, cachalot_stream s, uint64_t *capture_id,
                                         uintptr_t *nodes, size_t cap, size_t *n) {
  (void)b;
  if (!capture_id || !n || (cap && !nodes))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: capture_frontier: a NULL output");
  *capture_id = 0;
  *n = 0;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaGraphNode_t *deps = NULL;
  size_t n_deps = 0;
  cachalot_status st = runtime_capture_info(device, s, "capture_frontier", &status, &id, &deps, &n_deps);
  if (st == CACHALOT_OK && status == cudaStreamCaptureStatusActive) {
    *capture_id = id;
    *n = n_deps;
    for (size_t i = 0; i < n_deps && i < cap; i++)
      nodes[i] = (uintptr_t)deps[i];
  }
  return st;
}

/* The driver's cuGraphNodeGetDependencies in its first form (node, dependencies, count), found as
 * cuStreamGetCaptureInfo is: the runtime's changed its arguments across toolkits. */
typedef CUresult (*node_deps_fn)(CUgraphNode, CUgraphNode *, size_t *);
static node_deps_fn driver_node_deps;
static pthread_once_t node_deps_once = PTHREAD_ONCE_INIT;
static void find_driver_node_deps(void) {
  driver_node_deps = (node_deps_fn)cl_cuda_driver_symbol("cuGraphNodeGetDependencies");
}

/* The nodes a walk has reached (each once) and those still to visit. */
typedef struct seen_node {
  uintptr_t node;
  UT_hash_handle hh;
} seen_node;

typedef struct {
  seen_node *seen;
  uintptr_t *stack;
  size_t top, cap;
} node_walk;

static bool walk_seen(const node_walk *w, uintptr_t v) {
  seen_node *f;
  HASH_FIND(hh, w->seen, &v, sizeof v, f);
  return f != NULL;
}

/* Marks v reached and to visit, unless it was already. False on host out of memory. */
static bool walk_push(node_walk *w, uintptr_t v) {
  if (walk_seen(w, v))
    return true;
  seen_node *n = malloc(sizeof *n);
  if (n && w->top == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 64;
    uintptr_t *q = realloc(w->stack, cap * sizeof *q);
    if (q) {
      w->stack = q;
      w->cap = cap;
    }
  }
  if (!n || w->top == w->cap) {
    free(n);
    return false;
  }
  n->node = v;
  HASH_ADD(hh, w->seen, node, sizeof n->node, n);
  w->stack[w->top++] = v;
  return true;
}

cachalot_status cl_cuda_capture_reaches(cachalot_backend *b, int device, cachalot_stream s, const uintptr_t *from,
                                        size_t n_from, const uintptr_t *to, size_t n_to, bool *all) {
  (void)b;
  (void)device;
  (void)s; /* node handles name their graph */
  if (!all || (n_from && !from) || (n_to && !to))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: capture_reaches: a NULL argument");
  *all = false;
  pthread_once(&node_deps_once, find_driver_node_deps);
  if (!driver_node_deps)
    return cl_fail(CACHALOT_ERROR_NOT_SUPPORTED, "cuda backend: capture_reaches: the driver has no "
                                                 "cuGraphNodeGetDependencies");
  /* one walk up the dependencies from `from`, each node once; then every node of `to` is looked up */
  node_walk w = {0};
  cachalot_status st = CACHALOT_OK;
  CUgraphNode *deps = NULL;
  size_t cap_deps = 0;
  for (size_t i = 0; i < n_from && st == CACHALOT_OK; i++)
    if (!walk_push(&w, from[i]))
      st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cuda backend: capture_reaches: host out of memory");
  while (w.top && st == CACHALOT_OK) {
    const uintptr_t v = w.stack[--w.top];
    size_t n = 0;
    CUresult r = driver_node_deps((CUgraphNode)v, NULL, &n);
    if (r == CUDA_SUCCESS && n > cap_deps) {
      CUgraphNode *q = realloc(deps, n * sizeof *deps);
      if (!q) {
        st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cuda backend: capture_reaches: host out of memory");
        break;
      }
      deps = q;
      cap_deps = n;
    }
    if (r == CUDA_SUCCESS && n)
      r = driver_node_deps((CUgraphNode)v, deps, &n);
    if (r != CUDA_SUCCESS) {
      st = cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: capture_reaches: cuGraphNodeGetDependencies failed (%d)",
                   (int)r);
      break;
    }
    for (size_t i = 0; i < n && st == CACHALOT_OK; i++)
      if (!walk_push(&w, (uintptr_t)deps[i]))
        st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cuda backend: capture_reaches: host out of memory");
  }
  bool every = st == CACHALOT_OK;
  for (size_t i = 0; every && i < n_to; i++)
    every = walk_seen(&w, to[i]);
  *all = every;
  seen_node *e, *tmp;
  HASH_ITER(hh, w.seen, e, tmp) {
    HASH_DEL(w.seen, e);
    free(e);
  }
  free(w.stack);
  free(deps);
  return st;
}
