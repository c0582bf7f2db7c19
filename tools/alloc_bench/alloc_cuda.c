/* alloc_bench: the CUDA runtime's own allocators, and the CUDA helpers the cachalot allocator uses.
 *
 * cudaMallocAsync: a pool of its own (cudaMemPoolCreate on device 0, release threshold UINT64_MAX so it
 * keeps what it reserved, as a warmed caching allocator does), used with cudaMallocFromPoolAsync /
 * cudaFreeAsync on the row's streams. Peaks: cudaMemPoolAttrReservedMemHigh / UsedMemHigh (reset when the
 * row starts); in the graph workload the allocations belong to the graphs, so the peaks are the device's
 * graph memory (cudaGraphMemAttrReservedMemHigh / UsedMemHigh). Device calls: unknown (the pool grows
 * inside the driver).
 *
 * cudaMalloc: cudaMalloc / cudaFree, every allocation a device call; peaks are the requested bytes (the
 * caller fills them in). It cannot be captured into a graph.
 *
 * cudaHostAlloc: the host workload's uncached baseline, cudaHostAlloc (cudaHostAllocDefault) / cudaFreeHost,
 * every allocation a pinning; peaks are the requested bytes, as for cudaMalloc.
 *
 * Built without the CUDA runtime, both are reported as skipped. */
#include "bench.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef ALLOC_BENCH_HAVE_CUDA
#include <cuda_runtime.h>

static int cuda_fail(char err[AB_ERR_LEN], const char *what, cudaError_t e) {
  snprintf(err, AB_ERR_LEN, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return -1;
}

int ab_cuda_probe(char err[AB_ERR_LEN]) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return cuda_fail(err, "cudaGetDeviceCount", e);
  if (n == 0) {
    snprintf(err, AB_ERR_LEN, "no CUDA device");
    return -1;
  }
  return 0;
}

int ab_cuda_streams_create(void **streams, int n, char err[AB_ERR_LEN]) {
  for (int i = 0; i < n; i++) {
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess)
      return cuda_fail(err, "cudaStreamCreateWithFlags", e);
    streams[i] = s;
  }
  return 0;
}

void ab_cuda_streams_destroy(void **streams, int n) {
  for (int i = 0; i < n; i++)
    if (streams[i] != NULL)
      (void)cudaStreamDestroy((cudaStream_t)streams[i]);
}

int ab_cuda_streams_sync(void *const *streams, int n, char err[AB_ERR_LEN]) {
  for (int i = 0; i < n; i++) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)streams[i]);
    if (e != cudaSuccess)
      return cuda_fail(err, "cudaStreamSynchronize", e);
  }
  return 0;
}

int ab_cuda_node_buffer(void **out, char err[AB_ERR_LEN]) {
  cudaError_t e = cudaMalloc(out, 256);
  return e == cudaSuccess ? 0 : cuda_fail(err, "cudaMalloc", e);
}

int ab_cuda_node(void *buffer, void *stream, char err[AB_ERR_LEN]) {
  cudaError_t e = cudaMemsetAsync(buffer, 0, 1, (cudaStream_t)stream);
  return e == cudaSuccess ? 0 : cuda_fail(err, "cudaMemsetAsync", e);
}

void ab_cuda_free_buffer(void *buffer) {
  if (buffer != NULL)
    (void)cudaFree(buffer);
}

void ab_cuda_device_name(char *buf, size_t len) {
  struct cudaDeviceProp p;
  buf[0] = '\0';
  if (len > 0 && cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    snprintf(buf, len, "%s", p.name);
}

/* ---- instances ---- */

typedef struct {
  ab_alloc base;
  cudaMemPool_t pool;   /* cudaMallocAsync */
  _Atomic int64_t device_allocs; /* cudaMalloc */
  bool graph_used;
  cudaGraphExec_t exec;
  void *node_buffer;
} cu_inst;

static void cu_close(ab_alloc *base) {
  cu_inst *c = (cu_inst *)base;
  (void)cudaDeviceSynchronize();
  if (c->exec != NULL)
    (void)cudaGraphExecDestroy(c->exec);
  ab_cuda_free_buffer(c->node_buffer);
  if (c->pool != NULL)
    (void)cudaMemPoolDestroy(c->pool);
  if (c->graph_used)
    (void)cudaDeviceGraphMemTrim(0);
  ab_cuda_streams_destroy(c->base.streams, c->base.n_streams);
  free(c->base.streams);
  free(c);
}

static int reset_graph_peaks(char err[AB_ERR_LEN]) {
  uint64_t zero = 0;
  cudaError_t e = cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &zero);
  if (e == cudaSuccess)
    e = cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero);
  return e == cudaSuccess ? 0 : cuda_fail(err, "cudaDeviceSetGraphMemAttribute", e);
}

static int cu_open(ab_alloc **out, int n_streams, bool async, const ab_allocator *vt, char err[AB_ERR_LEN]) {
  *out = NULL;
  cu_inst *c = calloc(1, sizeof *c);
  void **streams = calloc((size_t)n_streams, sizeof *streams);
  if (c == NULL || streams == NULL) {
    free(c);
    free(streams);
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  c->base = (ab_alloc){.vt = vt, .n_streams = n_streams, .streams = streams};
  cudaError_t e = cudaSetDevice(0);
  if (e != cudaSuccess) {
    cuda_fail(err, "cudaSetDevice", e);
    cu_close(&c->base);
    return -1;
  }
  if (ab_cuda_streams_create(streams, n_streams, err) != 0) {
    cu_close(&c->base);
    return -1;
  }
  if (async) {
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    uint64_t threshold = UINT64_MAX, zero = 0;
    if ((e = cudaMemPoolCreate(&c->pool, &props)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &threshold)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &zero)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrUsedMemHigh, &zero)) != cudaSuccess) {
      cuda_fail(err, "creating the cudaMallocAsync pool", e);
      cu_close(&c->base);
      return -1;
    }
  }
  *out = &c->base;
  return 0;
}

static int open_async(ab_alloc **out, int n, char err[AB_ERR_LEN]);
static int open_malloc(ab_alloc **out, int n, char err[AB_ERR_LEN]);

static int probe_async(char err[AB_ERR_LEN]) {
  if (ab_cuda_probe(err) != 0)
    return -1;
  int supported = 0;
  cudaError_t e = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0);
  if (e != cudaSuccess)
    return cuda_fail(err, "cudaDeviceGetAttribute", e);
  if (!supported) {
    snprintf(err, AB_ERR_LEN, "device 0 does not support memory pools (cudaMallocAsync)");
    return -1;
  }
  return 0;
}

static int async_run(ab_alloc *base, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
                     char err[AB_ERR_LEN]) {
  cudaMemPool_t pool = ((cu_inst *)base)->pool;
  for (size_t i = 0; i < n; i++) {
    const ab_op *o = &ops[i];
    cudaError_t e = o->size != 0 ? cudaMallocFromPoolAsync(&slots[o->slot], (size_t)o->size, pool,
                                                           (cudaStream_t)streams[o->stream])
                                 : cudaFreeAsync(slots[o->slot], (cudaStream_t)streams[o->stream]);
    if (e != cudaSuccess) {
      *done = i;
      return cuda_fail(err, o->size ? "cudaMallocFromPoolAsync" : "cudaFreeAsync", e);
    }
  }
  *done = n;
  return 0;
}

/* The cross rows: a block used on another stream is freed on that stream (stream-ordered, what
 * cudaMallocAsync asks of a program whose last use of a block is there). */
static int async_run_rec(ab_alloc *base, void *const *streams, const ab_op *ops, size_t n, void **slots,
                         size_t *done, char err[AB_ERR_LEN]) {
  cudaMemPool_t pool = ((cu_inst *)base)->pool;
  for (size_t i = 0; i < n; i++) {
    const ab_op *o = &ops[i];
    cudaError_t e = o->size != 0 ? cudaMallocFromPoolAsync(&slots[o->slot], (size_t)o->size, pool,
                                                           (cudaStream_t)streams[o->stream])
                                 : cudaFreeAsync(slots[o->slot],
                                                 (cudaStream_t)streams[o->record ? o->record - 1 : o->stream]);
    if (e != cudaSuccess) {
      *done = i;
      return cuda_fail(err, o->size ? "cudaMallocFromPoolAsync" : "cudaFreeAsync", e);
    }
  }
  *done = n;
  return 0;
}

static int malloc_run(ab_alloc *base, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
                      char err[AB_ERR_LEN]) {
  (void)streams;
  int64_t allocs = 0;
  int rc = 0;
  size_t i = 0;
  for (; i < n; i++) {
    const ab_op *o = &ops[i];
    cudaError_t e = o->size != 0 ? cudaMalloc(&slots[o->slot], (size_t)o->size) : cudaFree(slots[o->slot]);
    if (e != cudaSuccess) {
      rc = cuda_fail(err, o->size ? "cudaMalloc" : "cudaFree", e);
      break;
    }
    allocs += o->size != 0;
  }
  *done = i;
  atomic_fetch_add(&((cu_inst *)base)->device_allocs, allocs);
  return rc;
}

static int async_sync(ab_alloc *base, void *const *streams, int n, char err[AB_ERR_LEN]) {
  (void)base;
  return ab_cuda_streams_sync(streams, n, err);
}

static int malloc_sync(ab_alloc *base, void *const *streams, int n, char err[AB_ERR_LEN]) {
  (void)base, (void)streams, (void)n;
  cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? 0 : cuda_fail(err, "cudaDeviceSynchronize", e);
}

static int async_stats(ab_alloc *base, bool graph, ab_stats *out, char err[AB_ERR_LEN]) {
  cu_inst *c = (cu_inst *)base;
  uint64_t reserved = 0, used = 0;
  cudaError_t e;
  if (graph) {
    if ((e = cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemHigh, &reserved)) != cudaSuccess ||
        (e = cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &used)) != cudaSuccess)
      return cuda_fail(err, "cudaDeviceGetGraphMemAttribute", e);
  } else {
    if ((e = cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrReservedMemHigh, &reserved)) != cudaSuccess ||
        (e = cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemHigh, &used)) != cudaSuccess)
      return cuda_fail(err, "cudaMemPoolGetAttribute", e);
  }
  out->peak_reserved = (int64_t)reserved;
  out->peak_allocated = (int64_t)used;
  out->device_allocs = -1;
  return 0;
}

static int malloc_stats(ab_alloc *base, bool graph, ab_stats *out, char err[AB_ERR_LEN]) {
  (void)graph, (void)err;
  out->peak_reserved = out->peak_allocated = AB_PEAK_REQUESTED;
  out->device_allocs = atomic_load(&((cu_inst *)base)->device_allocs);
  return 0;
}

static int async_check(ab_alloc *base, char err[AB_ERR_LEN]) {
  cu_inst *c = (cu_inst *)base;
  uint64_t used = 0;
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess)
    e = cudaMemPoolGetAttribute(c->pool, cudaMemPoolAttrUsedMemCurrent, &used);
  if (e != cudaSuccess)
    return cuda_fail(err, "cudaMemPoolGetAttribute", e);
  if (used != 0) {
    snprintf(err, AB_ERR_LEN, "everything was freed, yet the pool has %llu bytes in use", (unsigned long long)used);
    return -1;
  }
  return 0;
}

/* Graphs: the captured cudaMallocFromPoolAsync calls become allocation nodes (their memory belongs to the
 * graph), the cudaFreeAsync calls free nodes; every replay allocates and frees again. */
static int async_graph_capture(ab_alloc *base, void *stream, const ab_op *ops, size_t n, void **slots,
                               uint64_t *ns, char err[AB_ERR_LEN]) {
  cu_inst *c = (cu_inst *)base;
  cudaStream_t s = (cudaStream_t)stream;
  if (!c->graph_used) {
    if (reset_graph_peaks(err) != 0)
      return -1;
    c->graph_used = true;
  }
  if (c->node_buffer == NULL && ab_cuda_node_buffer(&c->node_buffer, err) != 0)
    return -1;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  if (e != cudaSuccess)
    return cuda_fail(err, "cudaStreamBeginCapture", e);
  int rc = ab_cuda_node(c->node_buffer, stream, err);
  size_t done = 0;
  void *const streams[1] = {stream};
  uint64_t t0 = ab_now_ns();
  if (rc == 0)
    rc = async_run(base, streams, ops, n, slots, &done, err);
  uint64_t t1 = ab_now_ns();
  *ns = t1 - t0;
  cudaGraph_t graph = NULL;
  e = cudaStreamEndCapture(s, &graph);
  if (e != cudaSuccess && rc == 0)
    rc = cuda_fail(err, "cudaStreamEndCapture", e);
  if (rc == 0 && (e = cudaGraphInstantiate(&c->exec, graph, 0)) != cudaSuccess)
    rc = cuda_fail(err, "cudaGraphInstantiate", e);
  if (graph != NULL)
    (void)cudaGraphDestroy(graph);
  return rc;
}

static int async_graph_replay(ab_alloc *base, void *stream, int k, char err[AB_ERR_LEN]) {
  cu_inst *c = (cu_inst *)base;
  for (int i = 0; i < k; i++) {
    cudaError_t e = cudaGraphLaunch(c->exec, (cudaStream_t)stream);
    if (e != cudaSuccess)
      return cuda_fail(err, "cudaGraphLaunch", e);
  }
  return 0;
}

static int async_graph_reset(ab_alloc *base, char err[AB_ERR_LEN]) {
  cu_inst *c = (cu_inst *)base;
  cudaError_t e = cudaDeviceSynchronize();
  if (c->exec != NULL) {
    cudaError_t e2 = cudaGraphExecDestroy(c->exec);
    e = e == cudaSuccess ? e2 : e;
    c->exec = NULL;
  }
  return e == cudaSuccess ? 0 : cuda_fail(err, "destroying the graph", e);
}

/* ---- cudaHostAlloc: pinned host memory, uncached ---- */

static int host_alloc_run(ab_alloc *base, const ab_op *ops, size_t n, void **slots, size_t *done, uint64_t *ns,
                          char err[AB_ERR_LEN]) {
  int64_t allocs = 0;
  cudaError_t e = cudaSuccess;
  size_t i = 0;
  uint64_t t0 = ab_now_ns();
  for (; i < n; i++) {
    const ab_op *o = &ops[i];
    e = o->size != 0 ? cudaHostAlloc(&slots[o->slot], (size_t)o->size, cudaHostAllocDefault)
                     : cudaFreeHost(slots[o->slot]);
    if (e != cudaSuccess)
      break;
    allocs += o->size != 0;
  }
  *ns = ab_now_ns() - t0;
  *done = i;
  atomic_fetch_add(&((cu_inst *)base)->device_allocs, allocs);
  return e == cudaSuccess ? 0 : cuda_fail(err, ops[i].size ? "cudaHostAlloc" : "cudaFreeHost", e);
}

static int host_alloc_stats(ab_alloc *base, ab_stats *out, char err[AB_ERR_LEN]) {
  (void)err;
  out->peak_reserved = out->peak_allocated = AB_PEAK_REQUESTED;
  out->device_allocs = atomic_load(&((cu_inst *)base)->device_allocs);
  return 0;
}

static int open_async(ab_alloc **out, int n, char err[AB_ERR_LEN]) { return cu_open(out, n, true, &ab_cuda_async, err); }
static int open_malloc(ab_alloc **out, int n, char err[AB_ERR_LEN]) {
  return cu_open(out, n, false, &ab_cuda_malloc, err);
}
static int open_host_alloc(ab_alloc **out, int n, char err[AB_ERR_LEN]) {
  return cu_open(out, n, false, &ab_cuda_host_alloc, err);
}

const ab_allocator ab_cuda_async = {
    .name = "cudaMallocAsync",
    .kinds = AB_DEVICE,
    .probe = probe_async,
    .open = open_async,
    .run = async_run,
    .run_rec = async_run_rec,
    .history_na = "keeps no history",
    .sync = async_sync,
    .stats = async_stats,
    .check = async_check,
    .graph_capture = async_graph_capture,
    .graph_replay = async_graph_replay,
    .graph_reset = async_graph_reset,
    .close = cu_close,
};

const ab_allocator ab_cuda_malloc = {
    .name = "cudaMalloc",
    .kinds = AB_DEVICE,
    .probe = ab_cuda_probe,
    .open = open_malloc,
    .run = malloc_run,
    .run_rec = malloc_run, /* cudaFree waits for the device: any stream's use is over */
    .history_na = "keeps no history",
    .sync = malloc_sync,
    .stats = malloc_stats,
    .check = NULL,
    .graph_na = "cudaMalloc cannot be captured into a CUDA graph",
    .close = cu_close,
};

const ab_allocator ab_cuda_host_alloc = {
    .name = "cudaHostAlloc",
    .kinds = AB_HOST,
    .probe = ab_cuda_probe,
    .open = open_host_alloc,
    .host_run = host_alloc_run,
    .host_stats = host_alloc_stats,
    .close = cu_close,
};

#else /* no CUDA runtime in this build */

static int no_cuda(char err[AB_ERR_LEN]) {
  snprintf(err, AB_ERR_LEN, "alloc_bench was built without the CUDA runtime");
  return -1;
}

const ab_allocator ab_cuda_async = {.name = "cudaMallocAsync", .kinds = AB_DEVICE, .probe = no_cuda};
const ab_allocator ab_cuda_malloc = {.name = "cudaMalloc",
                                     .kinds = AB_DEVICE,
                                     .probe = no_cuda,
                                     .graph_na = "cudaMalloc cannot be captured into a CUDA graph"};
const ab_allocator ab_cuda_host_alloc = {.name = "cudaHostAlloc", .kinds = AB_HOST, .probe = no_cuda};

#endif
