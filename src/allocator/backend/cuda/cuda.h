/* What the CUDA backend offers the code above it: the table of the runtime's real cudaMalloc, cudaFree
 * and cudaMemGetInfo, through which the backend allocates, frees and asks for free memory.
 *
 * Every program but one gets the runtime's own functions, the table's defaults. The exception is
 * libcachalot_preload.so (src/plugin/preload.c): it defines cudaMalloc, cudaFree and cudaMemGetInfo
 * itself, and inside that library the backend's references to those names bind to the interposer's, so
 * the defaults would lead back into the interposer. The interposer therefore resolves the runtime's
 * functions (dlsym(RTLD_NEXT)) and hands them down here, from its load-time constructor: before any
 * allocator or backend of the process exists, so every use of the table comes after the fill. */
#ifndef CACHALOT_BACKEND_CUDA_H
#define CACHALOT_BACKEND_CUDA_H

#include <cuda_runtime_api.h>

typedef struct cl_cuda_real_fns {
  cudaError_t (*malloc)(void **ptr, size_t size);
  cudaError_t (*free)(void *ptr);
  cudaError_t (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
} cl_cuda_real_fns;

/* Replaces the table's three entries with `fns`'s (`fns` itself is not kept). An entry that is NULL (a
 * function the caller could not find) makes the backend's operation that needs it fail with
 * CACHALOT_ERROR_DEVICE instead of calling anything. Meant to be called once, before any backend exists;
 * the entries are atomics, so a later call is not a data race, but an operation already under way may
 * still use the entry it read before. */
void cl_cuda_set_real(const cl_cuda_real_fns *fns);

/* A driver function through the runtime's entry-point lookup, in its CUDA 12.0 signature; NULL when the
 * driver has none (vmm.c). */
void *cl_cuda_driver_symbol(const char *name);

/* The same for cudaHostAlloc and cudaFreeHost, which the interposer serves too (src/plugin/preload.c). */
typedef cudaError_t (*cl_cuda_host_alloc_fn)(void **ptr, size_t size, unsigned int flags);
typedef cudaError_t (*cl_cuda_free_host_fn)(void *ptr);
void cl_cuda_set_real_host(cl_cuda_host_alloc_fn host_alloc, cl_cuda_free_host_fn free_host);

#endif
