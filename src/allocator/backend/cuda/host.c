/* Pinned host memory on the CUDA runtime: cudaHostAlloc / cudaFreeHost, and cudaHostRegister /
 * cudaHostUnregister of memory the caller allocated. On the current device's context: pinned memory is
 * usable by every device of the process (unified addressing makes it portable). */
#include "private.h"

#include "cuda.h"

#include <stdatomic.h>

/* cudaHostAlloc and cudaFreeHost come through the table of cuda.h, as cudaMalloc does: the preload
 * interposer defines them too. */
static _Atomic(cl_cuda_host_alloc_fn) real_host_alloc = cudaHostAlloc;
static _Atomic(cl_cuda_free_host_fn) real_free_host = cudaFreeHost;

void cl_cuda_set_real_host(cl_cuda_host_alloc_fn host_alloc, cl_cuda_free_host_fn free_host) {
  atomic_store_explicit(&real_host_alloc, host_alloc, memory_order_release);
  atomic_store_explicit(&real_free_host, free_host, memory_order_release);
}

cudaError_t cl_cuda_real_host_alloc(void **ptr, size_t size, unsigned int flags) {
  cl_cuda_host_alloc_fn real = atomic_load_explicit(&real_host_alloc, memory_order_acquire);
  return real ? real(ptr, size, flags) : cudaErrorNotSupported;
}

cudaError_t cl_cuda_real_free_host(void *ptr) {
  cl_cuda_free_host_fn real = atomic_load_explicit(&real_free_host, memory_order_acquire);
  return real ? real(ptr) : cudaErrorNotSupported;
}

static cachalot_status host_fail(cudaError_t err, const char *op, const char *call) {
  return cuda_fail(err == cudaErrorMemoryAllocation ? CACHALOT_ERROR_OUT_OF_MEMORY : CACHALOT_ERROR_DEVICE, err, op,
                   call);
}

cachalot_status cl_cuda_host_alloc(cachalot_backend *b, size_t size, void **ptr) {
  (void)b;
  if (!ptr)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: host_alloc: ptr is NULL");
  *ptr = NULL;
  if (size == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cuda backend: host_alloc: size is 0");
  cl_cuda_host_alloc_fn real = atomic_load_explicit(&real_host_alloc, memory_order_acquire);
  if (!real)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: host_alloc: the runtime's cudaHostAlloc was not found");
  void *p = NULL;
  cudaError_t err = real(&p, size, cudaHostAllocDefault);
  if (err != cudaSuccess)
    return host_fail(err, "host_alloc", "cudaHostAlloc");
  if (!p)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: host_alloc: cudaHostAlloc returned NULL for %zu bytes",
                   size);
  *ptr = p;
  return CACHALOT_OK;
}

cachalot_status cl_cuda_host_free(cachalot_backend *b, void *ptr) {
  (void)b;
  cl_cuda_free_host_fn real = atomic_load_explicit(&real_free_host, memory_order_acquire);
  if (!real)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cuda backend: host_free: the runtime's cudaFreeHost was not found");
  cudaError_t err = real(ptr);
  return err == cudaSuccess ? CACHALOT_OK : host_fail(err, "host_free", "cudaFreeHost");
}

cachalot_status cl_cuda_host_register(cachalot_backend *b, void *ptr, size_t size) {
  (void)b;
  cudaError_t err = cudaHostRegister(ptr, size, cudaHostRegisterDefault);
  return err == cudaSuccess ? CACHALOT_OK : host_fail(err, "host_register", "cudaHostRegister");
}

cachalot_status cl_cuda_host_unregister(cachalot_backend *b, void *ptr) {
  (void)b;
  cudaError_t err = cudaHostUnregister(ptr);
  return err == cudaSuccess ? CACHALOT_OK : host_fail(err, "host_unregister", "cudaHostUnregister");
}
