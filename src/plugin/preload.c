/* libcachalot_preload: cachalot under unmodified CUDA programs, through LD_PRELOAD.
 *
 *   LD_PRELOAD=libcachalot_preload.so ./app        (app linked with the shared CUDA runtime)
 *
 * It defines cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync (and their per-thread default stream
 * names, cudaMallocAsync_ptsz and cudaFreeAsync_ptsz), cudaHostAlloc, cudaMallocHost, cudaFreeHost,
 * cudaMemGetInfo and cudaStreamDestroy, which the dynamic linker then binds the program's calls to instead
 * of libcudart's. Allocations come from cachalot's process-wide allocator (cachalot_default:
 * $CACHALOT_ALLOC_CONF and the snapshot variables apply) with capture detection on, pinned host memory
 * from its host cache; pointers cachalot did not hand out go to the runtime's own functions, reached with
 * dlsym(RTLD_NEXT) (the backend inside this library gets them too: cl_cuda_set_real, cl_cuda_set_real_host).
 * A program linked with the static runtime (nvcc's default) binds these calls inside itself at link time:
 * nothing can interpose them, and the library is not used. CACHALOT_PRELOAD_STATS=1 prints cachalot's
 * device allocation count and peaks, and what the host cache served, to stderr at exit.
 *
 * Semantics kept from the runtime:
 * - cudaMalloc memory is usable on any stream: it is taken on the legacy default stream, and cudaFree
 *   synchronizes the pointer's device first (as the runtime's cudaFree does), so no stream still uses a
 *   block that the next cudaMalloc may hand out again; not during a capture it can see (one cachalot
 *   detected, or any blocking stream's), where a device-wide wait would break it (a capture of a
 *   non-blocking stream it cannot see: a cudaFree of cachalot's memory meanwhile invalidates it);
 * - cudaMallocAsync / cudaFreeAsync are stream-ordered: a block freed on another stream than its
 *   allocation's is freed once that stream's work so far is done (record_stream);
 * - cudaFree(NULL) still goes to the runtime (programs call it to create the context); a second free of
 *   cachalot's memory is refused (cudaErrorInvalidDevicePointer), never passed to the runtime, which
 *   would release the whole segment;
 * - cudaHostAlloc with flags cudaHostAllocDefault or cudaHostAllocPortable (which unified addressing makes
 *   every pinning), and cudaMallocHost, come from the host cache; other flags (Mapped, WriteCombined, any
 *   unknown bit), size 0, a NULL out-pointer, and any request the cache cannot serve go to the runtime's
 *   cudaHostAlloc, which answers as it always does;
 * - cudaFreeHost waits for every device that has a context (the runtime's does too, and a program may
 *   rely on it: an asynchronous copy from the memory, then its free), and only then gives the block back
 *   to the cache; during a capture it can see, where that wait would break the capture, the block is
 *   kept until the next cudaFreeHost outside one. A pointer the cache does not hold goes to the runtime's
 *   cudaFreeHost; one inside memory the cache holds (a second free) is refused with cudaErrorInvalidValue,
 *   as the runtime refuses one, never passed on (the runtime would unpin a block the cache reuses);
 * - cudaStreamDestroy tells cachalot first (cachalot_forget_stream), so that capture detection never
 *   asks about a destroyed stream;
 * - cudaMemGetInfo counts the memory cachalot holds but does not use as free. */
#include "plugin.h"

#include "../allocator/backend/cuda/cuda.h"
#include "../allocator/internal.h" /* cl_address_is_ours; uthash, set up as the library uses it */
#include "../common/error.h"

#include <cuda.h> /* the driver's primary-context state: which devices cudaFreeHost waits for */
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);

static cudaError_t (*real_cudaMalloc)(void **, size_t);
static cudaError_t (*real_cudaFree)(void *);
static cudaError_t (*real_cudaMemGetInfo)(size_t *, size_t *);
static malloc_async_fn real_cudaMallocAsync, real_cudaMallocAsync_ptsz;
static free_async_fn real_cudaFreeAsync, real_cudaFreeAsync_ptsz;
static cudaError_t (*real_cudaStreamDestroy)(cudaStream_t);
static cudaError_t (*real_cudaHostAlloc)(void **, size_t, unsigned int);
static cudaError_t (*real_cudaMallocHost)(void **, size_t);
static cudaError_t (*real_cudaFreeHost)(void *);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cachalot_allocator *allocator;

static cudaError_t cache_pin(void **p, size_t size, unsigned int flags);
static cudaError_t cache_unpin(void *p);

/* The runtime's functions, found when the library is loaded: before anything (the program, or cachalot's
 * API that this library also exports) can reach the backend, which gets cudaMalloc, cudaFree,
 * cudaMemGetInfo, and cudaHostAlloc and cudaFreeHost (through cache_pin and cache_unpin) here. Inside
 * this library the backend's own references to those names would bind to the definitions below, so it
 * must not run before cl_cuda_set_real and cl_cuda_set_real_host: a constructor is earlier than any
 * allocator or backend can exist. Should a function be missing, the library aborts before handing
 * anything down. */
__attribute__((constructor)) static void resolve(void) {
  real_cudaMalloc = (cudaError_t(*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
  real_cudaFree = (cudaError_t(*)(void *))dlsym(RTLD_NEXT, "cudaFree");
  real_cudaMemGetInfo = (cudaError_t(*)(size_t *, size_t *))dlsym(RTLD_NEXT, "cudaMemGetInfo");
  real_cudaMallocAsync = (malloc_async_fn)dlsym(RTLD_NEXT, "cudaMallocAsync");
  real_cudaFreeAsync = (free_async_fn)dlsym(RTLD_NEXT, "cudaFreeAsync");
  real_cudaMallocAsync_ptsz = (malloc_async_fn)dlsym(RTLD_NEXT, "cudaMallocAsync_ptsz");
  real_cudaFreeAsync_ptsz = (free_async_fn)dlsym(RTLD_NEXT, "cudaFreeAsync_ptsz");
  real_cudaStreamDestroy = (cudaError_t(*)(cudaStream_t))dlsym(RTLD_NEXT, "cudaStreamDestroy");
  real_cudaHostAlloc = (cudaError_t(*)(void **, size_t, unsigned int))dlsym(RTLD_NEXT, "cudaHostAlloc");
  real_cudaMallocHost = (cudaError_t(*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMallocHost");
  real_cudaFreeHost = (cudaError_t(*)(void *))dlsym(RTLD_NEXT, "cudaFreeHost");
  if (!real_cudaMalloc || !real_cudaFree || !real_cudaMemGetInfo || !real_cudaMallocAsync ||
      !real_cudaFreeAsync || !real_cudaStreamDestroy || !real_cudaHostAlloc || !real_cudaMallocHost ||
      !real_cudaFreeHost) {
    fprintf(stderr, "cachalot_preload: the CUDA runtime's functions were not found (libcudart.so)\n");
    abort(); /* nothing sensible can be answered to the program's allocations */
  }
  cl_cuda_set_real(&(cl_cuda_real_fns){
      .malloc = real_cudaMalloc, .free = real_cudaFree, .mem_get_info = real_cudaMemGetInfo});
  cl_cuda_set_real_host(cache_pin, cache_unpin);
}

static void report(void) {
  cachalot_device_stats st;
  if (allocator && cachalot_memory_stats(allocator, 0, &st) == CACHALOT_OK)
    fprintf(stderr,
            "cachalot_preload: device 0: %lld device allocations, %lld device frees, allocated peak %lld B, "
            "reserved peak %lld B\n",
            (long long)st.num_device_alloc, (long long)st.num_device_free, (long long)st.allocated_bytes[0].peak,
            (long long)st.reserved_bytes[0].peak);
  cachalot_host_stats hs;
  if (allocator && cachalot_host_memory_stats(allocator, &hs) == CACHALOT_OK)
    fprintf(stderr, "cachalot_preload: host: %lld pinned requests served, %lld pinnings, %lld unpinnings, "
            "pinned peak %lld B\n", (long long)hs.active_requests.allocated, (long long)hs.num_host_alloc,
            (long long)hs.num_host_free, (long long)hs.allocated_bytes.peak);
}

static void register_fork_handlers(void);

static void init(void) {
  allocator = cl_plugin_allocator("cachalot_preload (the runtime's allocator is used)");
  if (!allocator)
    return;
  register_fork_handlers();
  const char *stats = getenv("CACHALOT_PRELOAD_STATS");
  if (stats && strcmp(stats, "0") != 0)
    atexit(report);
}

static cachalot_allocator *get(void) {
  pthread_once(&once, init);
  return allocator;
}

static cudaError_t error_of(cachalot_status s) {
  switch (s) {
  case CACHALOT_OK: return cudaSuccess;
  case CACHALOT_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case CACHALOT_ERROR_INVALID_ARGUMENT: return cudaErrorInvalidValue;
  case CACHALOT_ERROR_INVALID_POINTER: return cudaErrorInvalidDevicePointer;
  case CACHALOT_ERROR_INVALID_STATE: return cudaErrorStreamCaptureInvalidated; /* the only such malloc */
  default: return cudaErrorUnknown;
  }
}

static cudaError_t do_malloc(void **p, size_t size, cudaStream_t s, malloc_async_fn real_async, bool async) {
  cachalot_allocator *a = get();
  if (!a)
    return async ? (real_async ? real_async(p, size, s) : cudaErrorNotSupported) : real_cudaMalloc(p, size);
  if (!p)
    return cudaErrorInvalidValue;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess)
    return e;
  return error_of(cachalot_malloc(a, dev, size, (cachalot_stream)s, p)); /* size 0: success and NULL */
}

/* Frees cachalot's block p stream-ordered on s (record_stream when s is not its allocation stream); the
 * runtime's `real` takes pointers that are not cachalot's at all. */
static cudaError_t do_free_async(void *p, cudaStream_t s, free_async_fn real) {
  cachalot_allocator *a = get();
  if (!a || !p)
    return real ? real(p, s) : cudaErrorNotSupported;
  cachalot_status rc = cachalot_record_stream(a, p, (cachalot_stream)s);
  if (rc == CACHALOT_OK)
    rc = cachalot_free(a, p);
  if (rc == CACHALOT_ERROR_INVALID_POINTER && !cl_address_is_ours(a, p))
    return real ? real(p, s) : cudaErrorInvalidDevicePointer;
  return error_of(rc);
}

EXPORT cudaError_t cudaMalloc(void **p, size_t size) { return do_malloc(p, size, NULL, NULL, false); }

EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  return do_malloc(p, size, s, real_cudaMallocAsync, true);
}

/* The per-thread default stream build's names: its stream 0 is cudaStreamPerThread. */
EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s) {
  return do_malloc(p, size, s ? s : cudaStreamPerThread, real_cudaMallocAsync_ptsz, true);
}

EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return do_free_async(p, s, real_cudaFreeAsync); }

EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) {
  return do_free_async(p, s ? s : cudaStreamPerThread, real_cudaFreeAsync_ptsz);
}

/* Whether the current device has a capture that a device-wide wait would invalidate and that can be
 * seen: a blocking stream's, which makes the legacy stream capturing or unaskable. */
static bool capture_on_current_device(void) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(0, &cs) != cudaSuccess) { /* cudaErrorStreamCaptureImplicit */
    (void)cudaGetLastError();
    return true;
  }
  return cs != cudaStreamCaptureStatusNone;
}

/* Waits for the device of cachalot's block p, as the runtime's cudaFree does; not during a capture it
 * can see (one cachalot detected, or a blocking stream's), where a device-wide wait would invalidate it. */
static cudaError_t wait_for_device_of(cachalot_allocator *a, void *p) {
  if (atomic_load_explicit(&a->n_auto, memory_order_relaxed))
    return cudaSuccess;
  int cur = 0;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess)
    return e;
  if (capture_on_current_device())
    return cudaSuccess;
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* only the error this call made: a program's own came back from cudaGetDevice */
    return cudaSuccess;       /* not the runtime's pointer: the free below answers for it */
  }
  if (attr.type != cudaMemoryTypeDevice || attr.device == cur)
    return cudaDeviceSynchronize();
  if ((e = cudaSetDevice(attr.device)) != cudaSuccess)
    return e;
  e = cudaDeviceSynchronize();
  (void)cudaSetDevice(cur);
  return e;
}

EXPORT cudaError_t cudaFree(void *p) {
  cachalot_allocator *a = get();
  if (!a || !p)
    return real_cudaFree(p);
  cudaError_t e = wait_for_device_of(a, p); /* the runtime's would wait too, for its own pointers */
  if (e != cudaSuccess)
    return e;
  cachalot_status rc = cachalot_free(a, p);
  if (rc == CACHALOT_ERROR_INVALID_POINTER && !cl_address_is_ours(a, p))
    return real_cudaFree(p);
  return error_of(rc); /* a second free of cachalot's memory: cudaErrorInvalidDevicePointer */
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  cachalot_allocator *a = get();
  cudaError_t e = real_cudaMemGetInfo(free_bytes, total);
  int dev = 0;
  cachalot_device_stats st;
  if (e != cudaSuccess || !a || !free_bytes || cudaGetDevice(&dev) != cudaSuccess ||
      cachalot_memory_stats(a, dev, &st) != CACHALOT_OK)
    return e;
  /* held by cachalot but not in use: the program may have it */
  *free_bytes += (size_t)(st.reserved_bytes[0].current - st.allocated_bytes[0].current);
  return e;
}

EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
  cachalot_allocator *a = get();
  if (a && cachalot_forget_stream(a, (cachalot_stream)s) != CACHALOT_OK) /* cannot fail with an allocator */
    fprintf(stderr, "cachalot_preload: cudaStreamDestroy: %s\n", cachalot_last_error());
  return real_cudaStreamDestroy(s);
}

/* ---- pinned host memory: cudaHostAlloc, cudaMallocHost, cudaFreeHost through the host cache ---- */

/* Every block the host cache of any allocator in this process holds pinned by cudaHostAlloc (handed out,
 * waiting or free), recorded by the backend's pinning and unpinning, which come through cache_pin and
 * cache_unpin. cudaFreeHost reads it for pointers the cache reports as not allocated: passing one inside
 * these blocks to the runtime's cudaFreeHost would unpin memory the cache goes on handing out. Looked up
 * only on that path and changed only by pinnings and unpinnings, which take milliseconds anyway. */
typedef struct {
  void *ptr;
  size_t size;
  UT_hash_handle hh;
} pinned_block;

static pinned_block *pinned;
static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;

static cudaError_t cache_pin(void **p, size_t size, unsigned int flags) {
  cudaError_t e = real_cudaHostAlloc(p, size, flags);
  if (e != cudaSuccess || !*p)
    return e;
  pinned_block *b = malloc(sizeof *b);
  bool hash_oom = !b;
  if (b) {
    *b = (pinned_block){.ptr = *p, .size = size};
    pthread_mutex_lock(&pinned_lock);
    HASH_ADD_PTR(pinned, ptr, b);
    pthread_mutex_unlock(&pinned_lock);
  }
  if (!hash_oom)
    return cudaSuccess;
  /* a block cudaFreeHost could not tell from the runtime's would be unpinned under the cache's feet */
  free(b);
  if (real_cudaFreeHost(*p) != cudaSuccess)
    (void)cudaGetLastError();
  *p = NULL;
  return cudaErrorMemoryAllocation;
}

/* The lock is held across the runtime's cudaFreeHost: once it returns, the runtime may hand the same
 * address to an uncached cudaHostAlloc, whose cudaFreeHost must not find it here. */
static cudaError_t cache_unpin(void *p) {
  pinned_block *b = NULL;
  pthread_mutex_lock(&pinned_lock);
  cudaError_t e = real_cudaFreeHost(p);
  if (e == cudaSuccess) {
    HASH_FIND_PTR(pinned, &p, b);
    if (b)
      HASH_DEL(pinned, b);
  }
  pthread_mutex_unlock(&pinned_lock);
  free(b);
  return e;
}

/* Whether p lies in a block of `pinned`: a scan, for the rare pointers the cache does not take (frees of
 * the runtime's own pinned memory, second frees), so that no lookup structure costs the common paths. */
static bool inside_pinned(const void *p) {
  const uintptr_t at = (uintptr_t)p;
  bool in = false;
  pthread_mutex_lock(&pinned_lock);
  pinned_block *b, *tmp;
  HASH_ITER(hh, pinned, b, tmp) {
    if (at - (uintptr_t)b->ptr < b->size) {
      in = true;
      break;
    }
  }
  pthread_mutex_unlock(&pinned_lock);
  return in;
}

static cudaError_t host_error_of(cachalot_status s) {
  switch (s) {
  case CACHALOT_OK: return cudaSuccess;
  case CACHALOT_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case CACHALOT_ERROR_INVALID_ARGUMENT:
  case CACHALOT_ERROR_INVALID_POINTER: return cudaErrorInvalidValue; /* the runtime's for a bad host pointer */
  default: return cudaErrorUnknown;
  }
}

/* Only Portable among the flags leaves the memory what the cache's pinnings are (with unified addressing
 * every pinning is portable); Mapped and WriteCombined make other memory, and unknown bits are the
 * runtime's to refuse. */
static bool cacheable(unsigned int flags) { return (flags & ~(unsigned int)cudaHostAllocPortable) == 0; }

/* `real` answers what the cache does not take. Size 0 is among those: the runtime documents nothing for
 * it, and its answer (CUDA 13: success and NULL; older releases left *p untouched) is kept exactly so. A
 * request the cache fails (it rounds up to a power of two, so the exact size may still fit) gets the
 * runtime's answer too; cachalot's message then says why the cache did not serve it. */
static cudaError_t host_alloc(void **p, size_t size, unsigned int flags, cudaError_t (*real)(void **, size_t)) {
  cachalot_allocator *a = get();
  if (!a || !p || size == 0 || !cacheable(flags))
    return real ? real(p, size) : real_cudaHostAlloc(p, size, flags);
  cachalot_status rc = cachalot_host_malloc(a, size, p);
  if (rc == CACHALOT_OK)
    return cudaSuccess;
  cl_error_prefix("cudaHostAlloc: %zu bytes asked of the runtime's cudaHostAlloc instead: ", size);
  return real ? real(p, size) : real_cudaHostAlloc(p, size, flags);
}

EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  return host_alloc(p, size, flags, NULL);
}

/* cudaHostAlloc with cudaHostAllocDefault, as the runtime defines it; C++'s overloads and templates in
 * cuda_runtime.h call cudaHostAlloc itself. */
EXPORT cudaError_t cudaMallocHost(void **p, size_t size) {
  return host_alloc(p, size, cudaHostAllocDefault, real_cudaMallocHost);
}

/* The driver's view of which devices have a context: cudaFreeHost waits for those, and must not create
 * one on a device the program never used (cudaSetDevice does, since CUDA 12). */
static struct {
  CUresult (*device_get)(CUdevice *, int);
  CUresult (*primary_state)(CUdevice, unsigned int *, int *);
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void find_driver(void) {
  drv.device_get = (CUresult(*)(CUdevice *, int))cl_cuda_driver_symbol("cuDeviceGet");
  drv.primary_state = (CUresult(*)(CUdevice, unsigned int *, int *))cl_cuda_driver_symbol("cuDevicePrimaryCtxGetState");
}

static bool has_context(int device) {
  CUdevice dev;
  unsigned int flags = 0;
  int active = 0;
  return drv.device_get(&dev, device) == CUDA_SUCCESS && drv.primary_state(dev, &flags, &active) == CUDA_SUCCESS &&
         active;
}

/* Waits for the current device `cur` and every other device with a context, as the runtime's cudaFreeHost
 * does: pinned memory may be in use by a copy on any stream of any of them, non-blocking streams
 * included, which no event on a default stream would cover. *capturing is set, and the wait left
 * unfinished, where one of them has a capture that a device-wide wait would invalidate. Without the
 * driver's entry points, only `cur` is waited for. */
static cudaError_t wait_for_devices(cachalot_allocator *a, int cur, bool *capturing) {
  *capturing = atomic_load_explicit(&a->n_auto, memory_order_relaxed) != 0 || capture_on_current_device();
  if (*capturing)
    return cudaSuccess;
  cudaError_t e = cudaDeviceSynchronize();
  int n = 0;
  pthread_once(&drv_once, find_driver);
  if (e != cudaSuccess || !drv.device_get || !drv.primary_state)
    return e;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaSuccess;
  }
  bool switched = false;
  for (int d = 0; d < n && e == cudaSuccess && !*capturing; d++) {
    if (d == cur || !has_context(d))
      continue;
    if ((e = cudaSetDevice(d)) != cudaSuccess)
      break;
    switched = true;
    *capturing = capture_on_current_device();
    if (!*capturing)
      e = cudaDeviceSynchronize();
  }
  cudaError_t back = switched ? cudaSetDevice(cur) : cudaSuccess;
  if (back != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaSuccess)
      e = back;
  }
  return e;
}

/* Blocks freed during a capture: the host cache gets them at the next cudaFreeHost outside one, after
 * its wait. Until then they stay handed out, so nothing reuses them while work from before their free
 * may still read them. */
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread holds either lock would leave it held in the child for good, and the
 * child's next cudaHostAlloc or cudaFreeHost would wait on it forever: the fork takes both, so the child
 * gets them free and the tables whole (its calls then fail as cachalot's do in a forked child). Neither
 * lock is ever held while the other is taken. */
static void fork_prepare(void) {
  pthread_mutex_lock(&pinned_lock);
  pthread_mutex_lock(&deferred_lock);
}
static void fork_release(void) {
  pthread_mutex_unlock(&deferred_lock);
  pthread_mutex_unlock(&pinned_lock);
}
static void register_fork_handlers(void) { (void)pthread_atfork(fork_prepare, fork_release, fork_release); }
static void **deferred;
static size_t n_deferred, cap_deferred;
static atomic_bool any_deferred;

static bool push_deferred_held(void *p) {
  if (n_deferred == cap_deferred) {
    size_t cap = cap_deferred ? 2 * cap_deferred : 16;
    void **d = realloc(deferred, cap * sizeof *d);
    if (!d)
      return false;
    deferred = d;
    cap_deferred = cap;
  }
  deferred[n_deferred++] = p;
  atomic_store_explicit(&any_deferred, true, memory_order_release);
  return true;
}

/* Called after wait_for_devices waited: the deferred blocks' earlier work is done. */
static void drain_deferred(cachalot_allocator *a) {
  if (!atomic_load_explicit(&any_deferred, memory_order_acquire))
    return;
  pthread_mutex_lock(&deferred_lock);
  void **list = deferred;
  size_t n = n_deferred;
  deferred = NULL;
  n_deferred = cap_deferred = 0;
  atomic_store_explicit(&any_deferred, false, memory_order_relaxed);
  pthread_mutex_unlock(&deferred_lock);
  for (size_t i = 0; i < n; i++) {
    cachalot_status rc = cachalot_host_free(a, list[i]);
    if (rc == CACHALOT_OK || rc == CACHALOT_ERROR_INVALID_POINTER)
      continue;
    pthread_mutex_lock(&deferred_lock);
    (void)push_deferred_held(list[i]); /* else it stays handed out for good: never reused too early */
    pthread_mutex_unlock(&deferred_lock);
  }
  free(list);
}

/* p is no allocated block of the host cache. Inside one of its blocks it is a second free (or a pointer
 * into one): refused, as the runtime refuses a pointer it did not hand out. Else it is the runtime's, whose
 * cudaFreeHost answers, and cachalot's message is put back as the program left it: this free was none
 * of cachalot's business. */
static cudaError_t free_not_cached(void *p, const char *saved_msg) {
  if (inside_pinned(p)) {
    cl_error_prefix("cudaFreeHost: refused (cudaErrorInvalidValue): ");
    return cudaErrorInvalidValue;
  }
  (void)cl_fail(CACHALOT_OK, "%s", saved_msg);
  return real_cudaFreeHost(p);
}

/* During a capture: p is marked as used by the legacy stream of `dev` (which also says whether the cache
 * has it allocated) and kept back; its free happens in drain_deferred. */
static cudaError_t defer_free_host(cachalot_allocator *a, void *p, int dev, const char *saved_msg) {
  cachalot_status rc = cachalot_host_record_event(a, p, dev, NULL);
  if (rc == CACHALOT_ERROR_INVALID_POINTER)
    return free_not_cached(p, saved_msg);
  if (rc != CACHALOT_OK)
    return host_error_of(rc);
  pthread_mutex_lock(&deferred_lock);
  for (size_t i = 0; i < n_deferred; i++) {
    if (deferred[i] == p) {
      pthread_mutex_unlock(&deferred_lock);
      (void)cl_fail(CACHALOT_ERROR_INVALID_POINTER, "cudaFreeHost: %p was freed already, during a capture", p);
      return cudaErrorInvalidValue;
    }
  }
  const bool kept = push_deferred_held(p);
  pthread_mutex_unlock(&deferred_lock);
  if (!kept) {
    (void)cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cudaFreeHost: host out of memory keeping %p until the capture ends",
                  p);
    return cudaErrorMemoryAllocation;
  }
  return cudaSuccess;
}

EXPORT cudaError_t cudaFreeHost(void *p) {
  cachalot_allocator *a = get();
  if (!a || !p)
    return real_cudaFreeHost(p);
  int cur = 0;
  cudaError_t e = cudaGetDevice(&cur);
  bool capturing = false;
  if (e == cudaSuccess)
    e = wait_for_devices(a, cur, &capturing);
  if (e != cudaSuccess)
    return e; /* as the runtime's cudaFreeHost, whose own wait would fail the same way */
  if (!capturing)
    drain_deferred(a);
  /* the thread's message, for a pointer that turns out to be the runtime's (free_not_cached) */
  char saved[1024];
  const char *msg = cachalot_last_error();
  const size_t len = strnlen(msg, sizeof saved - 1);
  memcpy(saved, msg, len);
  saved[len] = '\0';
  if (capturing)
    return defer_free_host(a, p, cur, saved);
  cachalot_status rc = cachalot_host_free(a, p);
  return rc == CACHALOT_ERROR_INVALID_POINTER ? free_not_cached(p, saved) : host_error_of(rc);
}
