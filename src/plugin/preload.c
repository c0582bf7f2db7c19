/* libcachalot_preload: cachalot under unmodified CUDA programs, through LD_PRELOAD.
 *
 *   LD_PRELOAD=libcachalot_preload.so ./app        (app linked with the shared CUDA runtime)
 *
 * It defines cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync (and their per-thread default stream
 * names, cudaMallocAsync_ptsz and cudaFreeAsync_ptsz), cudaMemGetInfo and cudaStreamDestroy, which the
 * dynamic linker then binds the program's calls to instead of libcudart's. Allocations come from cachalot's
 * process-wide allocator (cachalot_default: $CACHALOT_ALLOC_CONF and the snapshot variables apply) with
 * capture detection on; pointers cachalot did not hand out go to the runtime's own functions, reached
 * with dlsym(RTLD_NEXT) (the backend inside this library gets them too: cl_cuda_set_real). A program
 * linked with the static runtime (nvcc's default) binds these calls inside itself at link time: nothing
 * can interpose them, and the library is not used. CACHALOT_PRELOAD_STATS=1 prints cachalot's device
 * allocation count and peaks to stderr at exit.
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
 * - cudaStreamDestroy tells cachalot first (cachalot_forget_stream), so that capture detection never
 *   asks about a destroyed stream;
 * - cudaMemGetInfo counts the memory cachalot holds but does not use as free. */
#include "plugin.h"

#include "../allocator/backend/cuda/cuda.h"
#include "../allocator/lookup.h" /* cl_address_is_ours */

#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
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

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cachalot_allocator *allocator;

/* The runtime's functions, found when the library is loaded: before anything (the program, or cachalot's
 * API that this library also exports) can reach the backend, which gets the first three here. Inside
 * this library the backend's own references to cudaMalloc, cudaFree and cudaMemGetInfo would bind to
 * the definitions below, so it must not run before cl_cuda_set_real: a constructor is earlier than any
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
  if (!real_cudaMalloc || !real_cudaFree || !real_cudaMemGetInfo || !real_cudaMallocAsync ||
      !real_cudaFreeAsync || !real_cudaStreamDestroy) {
    fprintf(stderr, "cachalot_preload: the CUDA runtime's functions were not found (libcudart.so)\n");
    abort(); /* nothing sensible can be answered to the program's allocations */
  }
  cl_cuda_set_real(&(cl_cuda_real_fns){
      .malloc = real_cudaMalloc, .free = real_cudaFree, .mem_get_info = real_cudaMemGetInfo});
}

static void report(void) {
  cachalot_device_stats st;
  if (allocator && cachalot_memory_stats(allocator, 0, &st) == CACHALOT_OK)
    fprintf(stderr,
            "cachalot_preload: device 0: %lld device allocations, %lld device frees, allocated peak %lld B, "
            "reserved peak %lld B\n",
            (long long)st.num_device_alloc, (long long)st.num_device_free, (long long)st.allocated_bytes[0].peak,
            (long long)st.reserved_bytes[0].peak);
}

static void init(void) {
  allocator = cl_plugin_allocator("cachalot_preload (the runtime's allocator is used)");
  if (!allocator)
    return;
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

/* Waits for the device of cachalot's block p, as the runtime's cudaFree does; not during a capture it
 * can see (one cachalot detected, or a blocking stream's, which makes the legacy stream unaskable), where
 * a device-wide wait would invalidate it. */
static cudaError_t wait_for_device_of(cachalot_allocator *a, void *p) {
  if (atomic_load_explicit(&a->n_auto, memory_order_relaxed))
    return cudaSuccess;
  int cur = 0;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess)
    return e;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(0, &cs) != cudaSuccess) { /* cudaErrorStreamCaptureImplicit */
    (void)cudaGetLastError();
    return cudaSuccess;
  }
  if (cs != cudaStreamCaptureStatusNone)
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
