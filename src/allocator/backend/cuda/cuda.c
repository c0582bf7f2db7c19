/* The CUDA backend: the backend interface on the CUDA runtime (cudart).
 *
 * Built only when CUDA is found (CACHALOT_HAVE_CUDA); a build without it provides a
 * cachalot_backend_cuda() that fails with CACHALOT_ERROR_NOT_SUPPORTED elsewhere.
 *
 * CUDA's current device is per thread, so an operation that needs another device switches to it and
 * back without disturbing other threads; the switch is made only when needed because a thread that
 * already sits on the device (the common case) should pay one cudaGetDevice, not two cudaSetDevice.
 *
 * Every failing CUDA call is followed by cudaGetLastError(): cudart also records the error as the
 * thread's "last error", and a caller who checks cudaGetLastError() after its own kernel launch would
 * otherwise be blamed for an allocator OOM that cachalot already handled.
 */
#include "../ops.h"
#include "cuda.h"

#include "../../../common/error.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* The runtime's cudaMalloc, cudaFree and cudaMemGetInfo, as cuda/cuda.h describes: the runtime's own
 * unless cl_cuda_set_real replaced them (libcachalot_preload.so does, from its load-time constructor).
 * Each entry is its own atomic so that the fill never races with a use on another thread; NULL: whoever
 * filled the table could not find the function. */
typedef cudaError_t (*cl_cuda_malloc_fn)(void **, size_t);
typedef cudaError_t (*cl_cuda_free_fn)(void *);
typedef cudaError_t (*cl_cuda_mem_get_info_fn)(size_t *, size_t *);
static _Atomic(cl_cuda_malloc_fn) real_malloc = cudaMalloc;
static _Atomic(cl_cuda_free_fn) real_free = cudaFree;
static _Atomic(cl_cuda_mem_get_info_fn) real_mem_get_info = cudaMemGetInfo;

void cl_cuda_set_real(const cl_cuda_real_fns *fns) {
  if (!fns)
    return;
  atomic_store_explicit(&real_malloc, fns->malloc, memory_order_release);
  atomic_store_explicit(&real_free, fns->free, memory_order_release);
  atomic_store_explicit(&real_mem_get_info, fns->mem_get_info, memory_order_release);
}

struct cl_event {
  cudaEvent_t ev;
  int device;
  struct cl_event *next; /* free-stack link while pooled */
};

/* Events are recycled because cudaEventCreate/Destroy cost microseconds and take driver locks, and the
 * allocator records one per cross-stream free. A pool per device keeps each event on the device whose
 * streams it is recorded on (cudaEventRecord requires the same context), and a lock per pool keeps
 * threads working on different devices apart. */
typedef struct {
  pthread_mutex_t mu;
  struct cl_event *free;
} cl_cuda_event_pool;

typedef struct {
  struct cachalot_backend base; /* first: a cachalot_backend* is a cl_cuda_backend* */
  cl_cuda_event_pool pools[];   /* device_count of them */
} cl_cuda_backend;

static const cl_backend_ops cuda_ops;

static cl_cuda_backend *as_cuda(cachalot_backend *b) { return (cl_cuda_backend *)b; }

/* Clears the thread's pending cudart error (see the top of the file) and records a message naming
 * the operation, the CUDA call and CUDA's own words for the error. */
static cachalot_status cuda_fail(cachalot_status s, cudaError_t err, const char *op, const char *call) {
  (void)cudaGetLastError();
  return cl_fail(s, "cuda backend: %s: %s failed: %s (%s)", op, call, cudaGetErrorString(err),
                 cudaGetErrorName(err));
}

typedef struct {
  int prev;
  bool switched;
} cl_cuda_device_scope;

static cachalot_status device_enter(int device, cl_cuda_device_scope *sc, const char *op) {
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

static void device_leave(const cl_cuda_device_scope *sc) {
  /* Switching back to a device that was current a moment ago does not fail in practice; if it ever
   * does, the operation's own outcome is the more useful status, so only the pending error is
   * cleared. */
  if (sc->switched && cudaSetDevice(sc->prev) != cudaSuccess)
    (void)cudaGetLastError();
}

static cachalot_status cuda_alloc(cachalot_backend *b, int device, size_t size, void **ptr) {
  (void)b;
  if (!ptr)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: alloc: ptr is NULL");
  *ptr = NULL;
  /* cudaMalloc(0) succeeds with a NULL pointer, which the contract rules out. */
  if (size == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: alloc: size is 0");
  cl_cuda_malloc_fn real = atomic_load_explicit(&real_malloc, memory_order_acquire);
  if (!real)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: alloc: the runtime's cudaMalloc was not found");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "alloc");
  if (st != CACHALOT_OK)
    return st;
  void *p = NULL;
  cudaError_t err = real(&p, size);
  device_leave(&sc);
  if (err == cudaErrorMemoryAllocation)
    return cuda_fail(CACHALOT_ERROR_OUT_OF_MEMORY, err, "alloc", "cudaMalloc");
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "alloc", "cudaMalloc");
  if (!p)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: alloc: cudaMalloc returned NULL for %zu bytes",
                   size);
  *ptr = p;
  return CACHALOT_OK;
}

static cachalot_status cuda_free(cachalot_backend *b, int device, void *ptr) {
  (void)b;
  cl_cuda_free_fn real = atomic_load_explicit(&real_free, memory_order_acquire);
  if (!real)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: free: the runtime's cudaFree was not found");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "free");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = real(ptr);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "free", "cudaFree");
  return CACHALOT_OK;
}

static cachalot_status cuda_mem_info(cachalot_backend *b, int device, size_t *free_bytes,
                                     size_t *total_bytes) {
  (void)b;
  if (free_bytes)
    *free_bytes = 0;
  if (total_bytes)
    *total_bytes = 0;
  if (!free_bytes || !total_bytes)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: mem_info: an out-pointer is NULL");
  cl_cuda_mem_get_info_fn real = atomic_load_explicit(&real_mem_get_info, memory_order_acquire);
  if (!real)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: mem_info: the runtime's cudaMemGetInfo was not found");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "mem_info");
  if (st != CACHALOT_OK)
    return st;
  size_t f = 0, t = 0;
  cudaError_t err = real(&f, &t);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "mem_info", "cudaMemGetInfo");
  *free_bytes = f;
  *total_bytes = t;
  return CACHALOT_OK;
}

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

/* Whether stream `s` (not NULL) takes part in a capture, active or invalidated. Of the stream queries,
 * only cudaStreamGetCaptureInfo may be asked of a capturing stream: cudaStreamGetDevice, GetFlags, GetId
 * and cuStreamGetCtx fail with cudaErrorStreamCaptureUnsupported and invalidate the capture, whatever
 * the capture and thread modes (seen on CUDA 13.0, driver 580.159). */
static cudaError_t stream_capturing(cachalot_stream s, bool *capturing) {
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamGetCaptureInfo(s, &status, NULL, NULL, NULL, NULL, NULL);
  *capturing = err == cudaSuccess && status != cudaStreamCaptureStatusNone;
  return err;
}

/* The device of stream `s`; NULL (the legacy stream) is `device`'s. A capturing stream cannot be asked
 * (see stream_capturing), so it is taken to be `device`'s: the caller's device, which is the capture's
 * in every use cachalot makes of it. */
static cudaError_t stream_device(cachalot_stream s, int device, int *out) {
  *out = device;
  if (!s)
    return cudaSuccess;
  bool capturing = false;
  cudaError_t err = stream_capturing(s, &capturing);
  if (err != cudaSuccess || capturing)
    return err;
  return cudaStreamGetDevice(s, out);
}

static cachalot_status cuda_stream_check(cachalot_backend *b, cachalot_stream s) {
  (void)b;
  if (!s)
    return CACHALOT_OK;
  int dev = 0;
  /* stream_device asks cudaStreamGetCaptureInfo first, so checking a capturing stream does not break the
   * capture (record_stream may be called during one). */
  cudaError_t err = stream_device(s, 0, &dev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: %p is not a usable stream: %s", (void *)s,
                   cudaGetErrorString(err));
  }
  return CACHALOT_OK;
}

static cachalot_status cuda_event_record(cachalot_backend *b, int device, cachalot_stream s,
                                         cl_event **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_record: out is NULL");
  *out = NULL;
  /* A stream of another device (a block used by a peer device's stream) is recorded on that device,
   * with an event of that device: cudaEventRecord refuses an event and a stream of different devices. */
  if (s) {
    int sdev = device;
    cudaError_t derr = stream_device(s, device, &sdev);
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
static cachalot_status cuda_event_query(cachalot_backend *b, cl_event *e, bool *done) {
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
    (void)cudaGetLastError(); /* not an error to the caller; see the top of the file */
    return CACHALOT_OK;
  }
  return cuda_fail(CACHALOT_ERROR_DEVICE, err, "event_query", "cudaEventQuery");
}

static cachalot_status cuda_event_sync(cachalot_backend *b, cl_event *e) {
  (void)b;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: event_sync: event is NULL");
  cudaError_t err = cudaEventSynchronize(e->ev);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "event_sync", "cudaEventSynchronize");
  return CACHALOT_OK;
}

static void cuda_event_release(cachalot_backend *b, cl_event *e) {
  if (e)
    pool_push(&as_cuda(b)->pools[e->device], e);
}

/* ---- virtual memory: the driver's VMM API, found through the runtime's entry-point lookup (no
 * link-time libcuda). A mapping is one physical allocation (cuMemCreate), mapped and given read/write
 * access for its device; its handle is released at once, so that cuMemUnmap frees the memory. ---- */

static struct {
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*error_name)(CUresult, const char **);
  bool ok;
} vmm;
static pthread_once_t vmm_once = PTHREAD_ONCE_INIT;

/* A driver function through the runtime's entry-point lookup, in its CUDA 12.0 signature; NULL when the
 * driver has none. */
static void *driver_symbol(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

static void find_vmm(void) {
  vmm.device_get = (CUresult(*)(CUdevice *, int))driver_symbol("cuDeviceGet");
  vmm.granularity = (CUresult(*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))
      driver_symbol("cuMemGetAllocationGranularity");
  vmm.reserve = (CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))
      driver_symbol("cuMemAddressReserve");
  vmm.address_free = (CUresult(*)(CUdeviceptr, size_t))driver_symbol("cuMemAddressFree");
  vmm.create = (CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long))driver_symbol("cuMemCreate");
  vmm.map = (CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))
      driver_symbol("cuMemMap");
  vmm.set_access = (CUresult(*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))driver_symbol("cuMemSetAccess");
  vmm.unmap = (CUresult(*)(CUdeviceptr, size_t))driver_symbol("cuMemUnmap");
  vmm.release = (CUresult(*)(CUmemGenericAllocationHandle))driver_symbol("cuMemRelease");
  vmm.error_name = (CUresult(*)(CUresult, const char **))driver_symbol("cuGetErrorName");
  vmm.ok = vmm.device_get && vmm.granularity && vmm.reserve && vmm.address_free && vmm.create && vmm.map &&
           vmm.set_access && vmm.unmap && vmm.release;
}

static cachalot_status vmm_fail(CUresult r, const char *op, const char *call) {
  const char *name = NULL;
  if (!vmm.error_name || vmm.error_name(r, &name) != CUDA_SUCCESS || !name)
    name = "unknown error";
  return cl_fail(r == CUDA_ERROR_OUT_OF_MEMORY ? CACHALOT_ERROR_OUT_OF_MEMORY : CACHALOT_ERROR_DEVICE,
                 "cuda backend: %s: %s failed: %s (%d)", op, call, name, (int)r);
}

/* Makes `device`'s primary context current on this thread (the driver calls need one), remembering the
 * previous device in *sc; the VMM API also needs to be there. */
static cachalot_status vmm_enter(int device, cl_cuda_device_scope *sc, const char *op) {
  pthread_once(&vmm_once, find_vmm);
  if (!vmm.ok)
    return cl_fail(CACHALOT_ERROR_NOT_SUPPORTED, "cuda backend: %s: the driver has no virtual memory API", op);
  sc->prev = 0;
  sc->switched = false;
  cudaError_t err = cudaGetDevice(&sc->prev);
  if (err == cudaSuccess)
    err = cudaSetDevice(device); /* also when it is current: it makes the primary context current */
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, op, "cudaSetDevice");
  sc->switched = sc->prev != device;
  return CACHALOT_OK;
}

static CUmemAllocationProp vmm_prop(CUdevice dev) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

static cachalot_status cuda_va_granularity(cachalot_backend *b, int device, size_t *out) {
  (void)b;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: va_granularity: out is NULL");
  *out = 0;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_granularity");
  if (st != CACHALOT_OK)
    return st;
  CUdevice dev = 0;
  CUresult r = vmm.device_get(&dev, device);
  CUmemAllocationProp prop = vmm_prop(dev);
  if (r == CUDA_SUCCESS)
    r = vmm.granularity(out, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_granularity", "cuMemGetAllocationGranularity");
}

static cachalot_status cuda_va_reserve(cachalot_backend *b, int device, size_t size, void **base) {
  (void)b;
  if (!base)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: va_reserve: base is NULL");
  *base = NULL;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_reserve");
  if (st != CACHALOT_OK)
    return st;
  CUdeviceptr p = 0;
  CUresult r = vmm.reserve(&p, size, 0, 0, 0);
  device_leave(&sc);
  if (r != CUDA_SUCCESS)
    return vmm_fail(r, "va_reserve", "cuMemAddressReserve");
  *base = (void *)(uintptr_t)p;
  return CACHALOT_OK;
}

static cachalot_status cuda_va_release(cachalot_backend *b, int device, void *base, size_t size) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_release");
  if (st != CACHALOT_OK)
    return st;
  CUresult r = vmm.address_free((CUdeviceptr)(uintptr_t)base, size);
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_release", "cuMemAddressFree");
}

static cachalot_status cuda_va_map(cachalot_backend *b, int device, void *addr, size_t size) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_map");
  if (st != CACHALOT_OK)
    return st;
  const CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
  CUdevice dev = 0;
  CUmemGenericAllocationHandle h = 0;
  const char *call = "cuDeviceGet";
  CUresult r = vmm.device_get(&dev, device);
  CUmemAllocationProp prop = vmm_prop(dev);
  if (r == CUDA_SUCCESS && (r = vmm.create(&h, size, &prop, 0)) != CUDA_SUCCESS)
    call = "cuMemCreate";
  else if (r == CUDA_SUCCESS) {
    if ((r = vmm.map(p, size, 0, h, 0)) != CUDA_SUCCESS) {
      call = "cuMemMap";
    } else {
      CUmemAccessDesc access = {0};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = dev;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if ((r = vmm.set_access(p, size, &access, 1)) != CUDA_SUCCESS) {
        call = "cuMemSetAccess";
        (void)vmm.unmap(p, size);
      }
    }
    (void)vmm.release(h); /* mapped: the mapping keeps the memory until cuMemUnmap; else it goes now */
  }
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_map", call);
}

static cachalot_status cuda_va_unmap(cachalot_backend *b, int device, void *addr, size_t size) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = vmm_enter(device, &sc, "va_unmap");
  if (st != CACHALOT_OK)
    return st;
  CUresult r = vmm.unmap((CUdeviceptr)(uintptr_t)addr, size);
  device_leave(&sc);
  return r == CUDA_SUCCESS ? CACHALOT_OK : vmm_fail(r, "va_unmap", "cuMemUnmap");
}

/* The driver's cuStreamGetCaptureInfo, found through the runtime (no link-time libcuda): for a stream
 * other than NULL it answers without a device switch, in ~25 ns on an H100 host where the runtime's
 * cudaGetDevice + cudaStreamGetCaptureInfo take ~120 ns. Capture detection asks it on every malloc. */
typedef CUresult (*capture_info_fn)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                    const CUgraphNode **, size_t *);
static capture_info_fn driver_capture_info;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void find_driver_capture_info(void) {
  /* version 12000 (driver_symbol): the signature above; later versions of the symbol take edge data too */
  driver_capture_info = (capture_info_fn)driver_symbol("cuStreamGetCaptureInfo");
}

static cachalot_status cuda_stream_capture_info(cachalot_backend *b, int device, cachalot_stream s,
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
  /* The NULL stream means the current device's legacy stream, so the device must be current. */
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "stream_capture_info");
  if (st != CACHALOT_OK)
    return st;
  enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL, NULL);
  device_leave(&sc);
  /* cudaErrorStreamCaptureImplicit (the legacy stream queried while a blocking stream of its device
   * is capturing) is passed on as an error: the legacy stream is then neither capturing nor safe to
   * use as if nothing were, and there is no capture id to give. */
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_capture_info", "cudaStreamGetCaptureInfo");
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

static cachalot_status cuda_capture_mode_exchange(cachalot_backend *b, cachalot_capture_mode *mode) {
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

/* ---- graphs (used by src/graph/) ---- */

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

static cachalot_status cuda_capture_begin(cachalot_backend *b, int device, cachalot_stream s,
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

static cachalot_status cuda_capture_end(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
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

static cachalot_status cuda_graph_instantiate(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec) {
  (void)b;
  if (!exec)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_instantiate: exec is NULL");
  *exec = NULL;
  if (!g)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_instantiate: graph is NULL");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "graph_instantiate");
  if (st != CACHALOT_OK)
    return st;
  cudaGraphExec_t e = NULL;
  cudaError_t err = cudaGraphInstantiateWithFlags(&e, (cudaGraph_t)g, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "graph_instantiate", "cudaGraphInstantiateWithFlags");
  *exec = (cl_graph_exec *)e;
  return CACHALOT_OK;
}

static cachalot_status cuda_graph_launch(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s) {
  (void)b;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_launch: instance is NULL");
  /* The device must be current: NULL names the current device's legacy stream. */
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "graph_launch");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaGraphLaunch((cudaGraphExec_t)e, s);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "graph_launch", "cudaGraphLaunch");
  return CACHALOT_OK;
}

static void cuda_graph_destroy(cachalot_backend *b, cl_graph *g) {
  (void)b;
  if (g && cudaGraphDestroy((cudaGraph_t)g) != cudaSuccess)
    (void)cudaGetLastError();
}

static void cuda_graph_exec_destroy(cachalot_backend *b, cl_graph_exec *e) {
  (void)b;
  if (e && cudaGraphExecDestroy((cudaGraphExec_t)e) != cudaSuccess)
    (void)cudaGetLastError();
}

static cachalot_status cuda_graph_debug_dot(cachalot_backend *b, cl_graph *g, const char *path) {
  (void)b;
  if (!g || !path)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: graph_debug_dot: %s is NULL",
                   !g ? "graph" : "path");
  cudaError_t err = cudaGraphDebugDotPrint((cudaGraph_t)g, path, cudaGraphDebugDotFlagsVerbose);
  if (err != cudaSuccess) {
    /* cudaErrorOperatingSystem is what CUDA 13 says when the file cannot be opened (a bad path, as the
     * simulated backend's INVALID_ARGUMENT), cudaErrorInvalidValue for a bad graph. */
    bool bad_arg = err == cudaErrorOperatingSystem || err == cudaErrorInvalidValue;
    cachalot_status rc = cuda_fail(bad_arg ? CACHALOT_ERROR_INVALID_ARGUMENT : CACHALOT_ERROR_DEVICE, err,
                                   "graph_debug_dot", "cudaGraphDebugDotPrint");
    cl_error_prefix("writing '%s': ", path);
    return rc;
  }
  return CACHALOT_OK;
}

static cachalot_status cuda_memcpy_async(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                         cachalot_stream s) {
  (void)b;
  if (n == 0)
    return CACHALOT_OK;
  if (!dst || !src)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: memcpy_async: %s is NULL for %zu bytes",
                   !dst ? "dst" : "src", n);
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "memcpy_async");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "memcpy_async", "cudaMemcpyAsync");
  return CACHALOT_OK;
}

/* An event from the pool of the device of `s`, recorded on `s` (with that device current), waited on by
 * `waiter` (with its device current), and returned to the pool: the wait keeps the state the event had
 * when it was made, so re-recording the event later does not affect it. During a capture, this record and
 * wait are how a side stream joins the capture (a fork) and how its work is joined back; a capturing
 * stream is then taken to be of `device` (see stream_device). */
static cachalot_status cuda_stream_wait(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s) {
  cl_event *e = NULL;
  cachalot_status st = cuda_event_record(b, device, s, &e);
  if (st != CACHALOT_OK) {
    cl_error_prefix("cuda backend: stream_wait: recording on the waited stream: ");
    return st;
  }
  int wdev = device;
  cudaError_t derr = stream_device(waiter, device, &wdev);
  if (derr != cudaSuccess) {
    cuda_event_release(b, e);
    return cuda_fail(CACHALOT_ERROR_DEVICE, derr, "stream_wait", "cudaStreamGetDevice");
  }
  if (wdev < 0 || wdev >= b->device_count)
    wdev = device;
  cl_cuda_device_scope sc;
  st = device_enter(wdev, &sc, "stream_wait");
  if (st != CACHALOT_OK) {
    cuda_event_release(b, e);
    return st;
  }
  cudaError_t err = cudaStreamWaitEvent(waiter, e->ev, 0);
  device_leave(&sc);
  cuda_event_release(b, e);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_wait", "cudaStreamWaitEvent");
  return CACHALOT_OK;
}

static cachalot_status cuda_stream_create(cachalot_backend *b, int device, cachalot_stream *out) {
  (void)b;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: stream_create: out is NULL");
  *out = NULL;
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "stream_create");
  if (st != CACHALOT_OK)
    return st;
  cudaStream_t s = NULL;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_create", "cudaStreamCreateWithFlags");
  *out = s;
  return CACHALOT_OK;
}

static void cuda_stream_destroy(cachalot_backend *b, cachalot_stream s) {
  (void)b;
  /* Deliberately the plain name, not a table entry like cudaMalloc's: in libcachalot_preload.so it binds
   * to the interposer's exported cudaStreamDestroy, which tells the allocator (cachalot_forget_stream)
   * before it calls the runtime's, so a stream destroyed here is forgotten like one the program destroys.
   * That edge comes from how the library's symbols bind, not from this source. */
  if (s && cudaStreamDestroy(s) != cudaSuccess)
    (void)cudaGetLastError();
}

static cachalot_status cuda_stream_sync(cachalot_backend *b, int device, cachalot_stream s) {
  (void)b;
  /* The device must be current: NULL names the current device's legacy stream. */
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "stream_sync");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaStreamSynchronize(s);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "stream_sync", "cudaStreamSynchronize");
  return CACHALOT_OK;
}

static cachalot_status cuda_device_sync(cachalot_backend *b, int device) {
  (void)b;
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "device_sync");
  if (st != CACHALOT_OK)
    return st;
  cudaError_t err = cudaDeviceSynchronize();
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "device_sync", "cudaDeviceSynchronize");
  return CACHALOT_OK;
}

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
    pthread_mutex_destroy(&pool->mu);
  }
  free(cb);
}

cachalot_status cachalot_backend_cuda(cachalot_backend **out) {
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

static const cl_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .va_granularity = cuda_va_granularity,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .va_map = cuda_va_map,
    .va_unmap = cuda_va_unmap,
    .mem_info = cuda_mem_info,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .event_release = cuda_event_release,
    .stream_check = cuda_stream_check,
    .stream_capture_info = cuda_stream_capture_info,
    .capture_mode_exchange = cuda_capture_mode_exchange,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_instantiate = cuda_graph_instantiate,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .graph_exec_destroy = cuda_graph_exec_destroy,
    .graph_debug_dot = cuda_graph_debug_dot,
    .memcpy_async = cuda_memcpy_async,
    .stream_wait = cuda_stream_wait,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .device_sync = cuda_device_sync,
    .destroy = cuda_destroy,
};
