/* libcachalot_preload: cachalot under unmodified CUDA programs, through LD_PRELOAD.
 *
 *   LD_PRELOAD=libcachalot_preload.so ./app        (app linked with the shared CUDA runtime)
 *
 * It defines cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync and cudaMemGetInfo, which the dynamic
 * linker then binds the program's calls to instead of libcudart's. Allocations come from cachalot's
 * process-wide allocator (cachalot_default: $CACHALOT_ALLOC_CONF and the snapshot variables apply) with
 * capture detection on; pointers cachalot did not hand out go to the runtime's own functions, reached
 * with dlsym(RTLD_NEXT) (so does the backend inside this library: cuda.c's CL_CUDA). A program linked
 * with the static runtime (nvcc's default) binds these calls inside itself at link time: nothing can
 * interpose them, and the library is not used. CACHALOT_PRELOAD_STATS=1 prints cachalot's device
 * allocation count and peaks to stderr at exit.
 *
 * Semantics kept from the runtime:
 * - cudaMalloc memory is usable on any stream: it is taken on the legacy default stream, and cudaFree
 *   synchronizes the device first (as the runtime's cudaFree does), so no stream still uses a block that
 *   the next cudaMalloc may hand out again;
 * - cudaMallocAsync / cudaFreeAsync are stream-ordered: a block freed on another stream than its
 *   allocation's is freed once that stream's work so far is done (record_stream);
 * - cudaFree(NULL) still goes to the runtime (programs call it to create the context);
 * - cudaMemGetInfo counts the memory cachalot holds but does not use as free. */
#include "plugin.h"

#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

cudaError_t (*cl_real_cudaMalloc)(void **, size_t);
cudaError_t (*cl_real_cudaFree)(void *);
cudaError_t (*cl_real_cudaMemGetInfo)(size_t *, size_t *);
static cudaError_t (*real_cudaMallocAsync)(void **, size_t, cudaStream_t);
static cudaError_t (*real_cudaFreeAsync)(void *, cudaStream_t);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cachalot_allocator *allocator;

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
  cl_real_cudaMalloc = (cudaError_t(*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
  cl_real_cudaFree = (cudaError_t(*)(void *))dlsym(RTLD_NEXT, "cudaFree");
  cl_real_cudaMemGetInfo = (cudaError_t(*)(size_t *, size_t *))dlsym(RTLD_NEXT, "cudaMemGetInfo");
  real_cudaMallocAsync = (cudaError_t(*)(void **, size_t, cudaStream_t))dlsym(RTLD_NEXT, "cudaMallocAsync");
  real_cudaFreeAsync = (cudaError_t(*)(void *, cudaStream_t))dlsym(RTLD_NEXT, "cudaFreeAsync");
  if (!cl_real_cudaMalloc || !cl_real_cudaFree || !cl_real_cudaMemGetInfo || !real_cudaMallocAsync ||
      !real_cudaFreeAsync) {
    fprintf(stderr, "cachalot_preload: the CUDA runtime's allocation functions were not found: is the "
                    "program linked with the shared runtime (nvcc -cudart shared)?\n");
    abort(); /* nothing sensible can be answered to the program's allocations */
  }
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
  default: return cudaErrorUnknown;
  }
}

static cudaError_t do_malloc(void **p, size_t size, cudaStream_t s, bool async) {
  cachalot_allocator *a = get();
  if (!a)
    return async ? real_cudaMallocAsync(p, size, s) : cl_real_cudaMalloc(p, size);
  if (!p)
    return cudaErrorInvalidValue;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess)
    return e;
  cachalot_status rc = cachalot_malloc(a, dev, size, (cachalot_stream)s, p);
  return error_of(rc); /* size 0: success and NULL, as the runtime answers */
}

EXPORT cudaError_t cudaMalloc(void **p, size_t size) { return do_malloc(p, size, NULL, false); }

EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) { return do_malloc(p, size, s, true); }

EXPORT cudaError_t cudaFree(void *p) {
  cachalot_allocator *a = get();
  if (!a || !p)
    return cl_real_cudaFree(p);
  /* The runtime's cudaFree waits for the device: programs rely on it before reusing memory. That is the
   * pointer's device, which need not be the current one. */
  struct cudaPointerAttributes attr;
  int cur = 0;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.type == cudaMemoryTypeDevice &&
      attr.device != cur) {
    if ((e = cudaSetDevice(attr.device)) == cudaSuccess) {
      e = cudaDeviceSynchronize();
      (void)cudaSetDevice(cur);
    }
  } else {
    (void)cudaGetLastError(); /* a pointer the runtime does not know: the free below answers for it */
    e = cudaDeviceSynchronize();
  }
  if (e != cudaSuccess)
    return e;
  cachalot_status rc = cachalot_free(a, p);
  return rc == CACHALOT_ERROR_INVALID_POINTER ? cl_real_cudaFree(p) : error_of(rc);
}

EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  cachalot_allocator *a = get();
  if (!a || !p)
    return real_cudaFreeAsync(p, s);
  /* stream order: when s is not the allocation stream, the block waits for s's work so far */
  cachalot_status rc = cachalot_record_stream(a, p, (cachalot_stream)s);
  if (rc == CACHALOT_OK)
    rc = cachalot_free(a, p);
  return rc == CACHALOT_ERROR_INVALID_POINTER ? real_cudaFreeAsync(p, s) : error_of(rc);
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  cachalot_allocator *a = get();
  cudaError_t e = cl_real_cudaMemGetInfo(free_bytes, total);
  int dev = 0;
  cachalot_device_stats st;
  if (e != cudaSuccess || !a || !free_bytes || cudaGetDevice(&dev) != cudaSuccess ||
      cachalot_memory_stats(a, dev, &st) != CACHALOT_OK)
    return e;
  /* held by cachalot but not in use: the program may have it */
  *free_bytes += (size_t)(st.reserved_bytes[0].current - st.allocated_bytes[0].current);
  return e;
}
