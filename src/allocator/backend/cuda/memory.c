/* Device memory on the CUDA runtime (alloc, free, mem_info), and the table of the runtime's entry points
 * they call, which cuda.h lets the preload interposer fill in. */
#include "private.h"

#include "cuda.h"

#include <stdatomic.h>
#include <string.h>

/* The runtime's cudaMalloc, cudaFree and cudaMemGetInfo, as cuda.h describes: the runtime's own
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

cachalot_status cl_cuda_alloc(cachalot_backend *b, int device, size_t size, void **ptr) {
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

cachalot_status cl_cuda_free(cachalot_backend *b, int device, void *ptr) {
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

cachalot_status cl_cuda_mem_info(cachalot_backend *b, int device, size_t *free_bytes,
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

cachalot_status cl_cuda_ipc_handle(cachalot_backend *b, int device, void *base, unsigned char handle[64]) {
  (void)b;
  _Static_assert(sizeof(cudaIpcMemHandle_t) == 64, "CUDA_IPC_HANDLE_SIZE");
  if (!base || !handle)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: ipc_handle: %s is NULL", !base ? "base" : "handle");
  cl_cuda_device_scope sc;
  cachalot_status st = device_enter(device, &sc, "ipc_handle");
  if (st != CACHALOT_OK)
    return st;
  cudaIpcMemHandle_t h;
  cudaError_t err = cudaIpcGetMemHandle(&h, base);
  device_leave(&sc);
  if (err != cudaSuccess)
    return cuda_fail(CACHALOT_ERROR_DEVICE, err, "ipc_handle", "cudaIpcGetMemHandle");
  memcpy(handle, &h, sizeof h);
  return CACHALOT_OK;
}
