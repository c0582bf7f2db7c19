// cachalot in a CUDA program: temporaries on two streams (one shared across them with record_stream),
// then a CUDA graph captured into a private pool and replayed on new inputs.
//
//   build: meson builds it when CUDA is found (build/examples/streams_and_graph), or
//          nvcc streams_and_graph.cu $(pkg-config --cflags --libs cachalot) -o streams_and_graph
#include <cachalot/cachalot.h>

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                            \
  do {                                                                                                      \
    cachalot_status s_ = (call);                                                                            \
    if (s_ != CACHALOT_OK) {                                                                                \
      fprintf(stderr, "%s: %s: %s\n", #call, cachalot_status_name(s_), cachalot_last_error());              \
      exit(1);                                                                                              \
    }                                                                                                       \
  } while (0)
#define CU(call)                                                                                            \
  do {                                                                                                      \
    cudaError_t e_ = (call);                                                                                \
    if (e_ != cudaSuccess) {                                                                                \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                                           \
      exit(1);                                                                                              \
    }                                                                                                       \
  } while (0)

__global__ void scale(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a * x[i];
}

__global__ void fill(float *y, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = v;
}

__global__ void add(float *y, const float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a[i] + b[i];
}

static float first(const float *dev) {
  float v;
  CU(cudaMemcpy(&v, dev, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

int main(void) {
  enum { N = 1 << 20 };
  const size_t bytes = N * sizeof(float);
  const int blocks = (N + 255) / 256;
  cachalot_backend *b;
  cachalot_allocator *a;
  CK(cachalot_backend_cuda(&b));
  CK(cachalot_create(b, NULL, &a)); /* config from $CACHALOT_ALLOC_CONF */
  cudaStream_t s1, s2;
  CU(cudaStreamCreate(&s1));
  CU(cudaStreamCreate(&s2));
  cudaEvent_t ready;
  CU(cudaEventCreate(&ready));

  /* 1. Temporaries on two streams. `x` is made on s1 and read on s2: record_stream tells cachalot, so
   * freeing it on the host right away keeps it from reuse until s2's work so far is done. */
  float *x, *y1, *y2;
  CK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, (void **)&x));
  CK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, (void **)&y1));
  CK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s2, (void **)&y2));
  fill<<<blocks, 256, 0, s1>>>(x, 1.5f, N);
  CU(cudaEventRecord(ready, s1));
  CU(cudaStreamWaitEvent(s2, ready, 0));
  scale<<<blocks, 256, 0, s2>>>(y2, x, 2.0f, N);
  CK(cachalot_record_stream(a, x, (cachalot_stream)s2));
  CK(cachalot_free(a, x)); /* pending until s2 has read it */
  fill<<<blocks, 256, 0, s1>>>(y1, 7.0f, N); /* other work on s1 meanwhile */
  CK(cachalot_free(a, y1));
  CU(cudaStreamSynchronize(s2));
  printf("two streams: y2[0] = %.1f (2 x 1.5)\n", first(y2));
  CK(cachalot_free(a, y2));

  /* 2. A graph: its allocations come from a private pool that outlives the capture, so every replay
   * finds its temporaries where the capture put them, while nothing else is handed that memory. */
  float *in, *out;
  CK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, (void **)&in));
  fill<<<blocks, 256, 0, s1>>>(in, 0.0f, N);
  cachalot_graph *g;
  CK(cachalot_graph_create(a, 0, false, &g));
  CK(cachalot_graph_capture_begin(g, (cachalot_stream)s1, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_GLOBAL));
  float *tmp;
  CK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, (void **)&tmp));
  CK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, (void **)&out));
  scale<<<blocks, 256, 0, s1>>>(tmp, in, 3.0f, N);
  add<<<blocks, 256, 0, s1>>>(out, tmp, in, N); /* out = 4 * in */
  CK(cachalot_free(a, tmp));                     /* freed inside the capture: stays the graph's */
  CK(cachalot_graph_capture_end(g));
  for (int r = 1; r <= 3; r++) {
    float v = (float)r;
    CU(cudaMemcpyAsync(in, &v, sizeof v, cudaMemcpyHostToDevice, s1));
    CK(cachalot_graph_replay(g, (cachalot_stream)s1));
    CU(cudaStreamSynchronize(s1));
    printf("replay %d: out[0] = %.1f (4 x %d)\n", r, first(out), r);
  }
  cachalot_device_stats st;
  CK(cachalot_memory_stats(a, 0, &st));
  printf("segments %lld, reserved %.1f MiB, device allocations %lld\n", (long long)st.segment[0].current,
         st.reserved_bytes[0].current / 1048576.0, (long long)st.num_device_alloc);

  CK(cachalot_free(a, out));
  CK(cachalot_free(a, in));
  cachalot_graph_destroy(g); /* releases the pool: its memory can go back at empty_cache */
  CK(cachalot_empty_cache(a));
  CK(cachalot_check(a));
  CU(cudaEventDestroy(ready));
  CU(cudaStreamDestroy(s1));
  CU(cudaStreamDestroy(s2));
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
  return 0;
}
