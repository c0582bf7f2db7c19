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

// y[i] = a * x[i] + b, over floats.
__global__ void axpb_kernel(float *y, const float *x, size_t n, float a, float b) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] = a * x[i] + b;
}

extern "C" int cl_test_axpb(float *y, const float *x, size_t n, float a, float b, cudaStream_t s) {
  unsigned blocks = (unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
  axpb_kernel<<<blocks, 256, 0, s>>>(y, x, n, a, b);
  return (int)cudaGetLastError();
}

// A counter-based generator: out[i] = hash(seed, offset + i), with the offset either a value (eager) or
// read from device memory plus a captured increment (graph mode, as PyTorch's philox offsets are).
__device__ uint32_t cl_hash(uint64_t seed, uint64_t ctr) {
  uint64_t z = seed ^ (ctr * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)(z ^ (z >> 31));
}

__global__ void rng_kernel(uint32_t *out, size_t n, uint64_t seed, uint64_t offset, const uint64_t *offset_ptr) {
  uint64_t base = offset_ptr ? *offset_ptr + offset : offset;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = cl_hash(seed, base + i);
}

__global__ void set_u64_kernel(uint64_t *p, uint64_t v) { *p = v; }

extern "C" int cl_test_rng(uint32_t *out, size_t n, uint64_t seed, uint64_t offset, const uint64_t *offset_ptr,
                           cudaStream_t s) {
  rng_kernel<<<64, 256, 0, s>>>(out, n, seed, offset, offset_ptr);
  return (int)cudaGetLastError();
}

extern "C" int cl_test_set_u64(uint64_t *p, uint64_t v, cudaStream_t s) {
  set_u64_kernel<<<1, 1, 0, s>>>(p, v);
  return (int)cudaGetLastError();
}
