/* What the gpu suite's programs share: the kernels of kernels.cu and a tiny check harness (a failed
 * EXPECT counts, prints and leaves the test function; main prints "N passed, N failed"). */
#ifndef CACHALOT_TESTS_GPU_TEST_H
#define CACHALOT_TESTS_GPU_TEST_H

#include <cachalot/cachalot.h>

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>

int cl_test_fill(void *p, size_t bytes, uint32_t pattern, long long spin_cycles, cudaStream_t s);
long long cl_test_verify(const void *p, size_t bytes, uint32_t pattern, cudaStream_t s);
int cl_test_axpb(float *y, const float *x, size_t n, float a, float b, cudaStream_t s);
int cl_test_rng(uint32_t *out, size_t n, uint64_t seed, uint64_t offset, const uint64_t *offset_ptr, cudaStream_t s);
int cl_test_set_u64(uint64_t *p, uint64_t v, cudaStream_t s);

#define MiB ((size_t)1 << 20)
static int failures;
static const char *current_test = "";

#define EXPECT(cond, ...)                                                                                         \
  do {                                                                                                           \
    if (!(cond)) {                                                                                               \
      failures++;                                                                                                \
      printf("FAIL [%s] %s:%d: ", current_test, __FILE__, __LINE__);                                            \
      printf(__VA_ARGS__);                                                                                       \
      printf(" (cachalot: %s)\n", cachalot_last_error());                                                       \
      return;                                                                                                    \
    }                                                                                                            \
  } while (0)
#define OK(call) EXPECT((call) == CACHALOT_OK, "%s", #call)
#define CUDA(call) EXPECT((call) == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))
#define CHECKED(a) EXPECT(cachalot_check(a) == CACHALOT_OK, "cachalot_check")

#endif
