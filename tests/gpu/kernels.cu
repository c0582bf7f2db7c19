// Kernels for the gpu suite: fill a buffer with a pattern, spin for a while first, count mismatches.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void fill_kernel(uint32_t *p, size_t n, uint32_t pattern, long long spin_cycles) {
  if (spin_cycles > 0) {
    long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
  }
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = pattern ^ (uint32_t)i;
}

__global__ void verify_kernel(const uint32_t *p, size_t n, uint32_t pattern, unsigned long long *bad) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    if (p[i] != (pattern ^ (uint32_t)i))
      atomicAdd(bad, 1ull);
}

extern "C" int cl_test_fill(void *p, size_t bytes, uint32_t pattern, long long spin_cycles, cudaStream_t s) {
  size_t n = bytes / 4;
  if (n == 0)
    return 0;
  unsigned blocks = spin_cycles > 0 ? 1u : (unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
  fill_kernel<<<blocks, 256, 0, s>>>((uint32_t *)p, n, pattern, spin_cycles);
  return (int)cudaGetLastError();
}

// Counts the words of p that do not hold the pattern; synchronizes `s`. Returns -1 on a CUDA error.
extern "C" long long cl_test_verify(const void *p, size_t bytes, uint32_t pattern, cudaStream_t s) {
  size_t n = bytes / 4;
  unsigned long long *bad = nullptr, host = 0;
  if (cudaMallocAsync((void **)&bad, sizeof *bad, s) != cudaSuccess)
    return -1;
  cudaMemsetAsync(bad, 0, sizeof *bad, s);
  if (n)
    verify_kernel<<<(unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024), 256, 0, s>>>((const uint32_t *)p, n,
                                                                                             pattern, bad);
  cudaMemcpyAsync(&host, bad, sizeof host, cudaMemcpyDeviceToHost, s);
  cudaFreeAsync(bad, s);
  if (cudaStreamSynchronize(s) != cudaSuccess || cudaGetLastError() != cudaSuccess)
    return -1;
  return (long long)host;
}
