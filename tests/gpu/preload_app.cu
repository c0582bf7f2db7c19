// An unmodified CUDA program for the interposer test (tests/gpu/preload_test.sh): it allocates with
// cudaMalloc / cudaFree and cudaMallocAsync / cudaFreeAsync (freeing on the other stream too), runs
// kernels on what it got, pins host memory with cudaMallocHost / cudaHostAlloc (default, portable, mapped
// and write-combined), and prints a checksum of the results and how many allocation calls it made.
// Its output must be the same with and without LD_PRELOAD=libcachalot_preload.so.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                                            \
  do {                                                                                                      \
    cudaError_t e_ = (x);                                                                                   \
    if (e_ != cudaSuccess) {                                                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                   \
      exit(1);                                                                                              \
    }                                                                                                       \
  } while (0)

__global__ void fill(float *p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = v + (float)(i % 7);
}

__global__ void axpy(float *y, const float *x, size_t n, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    y[i] += a * x[i];
}

/* Holds its stream for about `cycles` clock ticks, so that a copy queued behind it is still to run when
 * the host frees and reuses the copy's pinned source. */
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static float pattern(int round, size_t i) { return (float)(round * 1000 + (int)(i % 991)); }

/* Pinned host memory, as programs use it: pinned (default or portable flags: the host cache serves these
 * under the interposer), filled, copied to the device asynchronously behind a kernel, freed at once (the
 * runtime's cudaFreeHost waits for the device, and the program relies on it), pinned again at the same
 * size (under the interposer: the block just freed) and overwritten; the device copy must still hold the
 * first contents. Streams: the legacy one, blocking ones, a non-blocking one and the per-thread one.
 * Then mapped and write-combined memory (the runtime's), a second free, a free of pageable memory and a
 * pinning of 0 bytes. Prints what each part saw; *calls counts the default-flag pinnings, which the host
 * cache must have served, each one, under the interposer (preload_test.sh reads its stats). */
static double pinned_rounds(cudaStream_t blocking0, cudaStream_t blocking1, long *calls) {
  cudaStream_t nb;
  CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
  const cudaStream_t streams[] = {0, blocking0, nb, cudaStreamPerThread, blocking1};
  const size_t max_n = 1 << 20;
  float *dev, *back = (float *)malloc(max_n * sizeof(float));
  CHECK(cudaMalloc(&dev, max_n * sizeof(float)));
  long mismatches = 0;
  for (int r = 0; r < 40; r++) {
    const size_t n = (size_t)1024 << (r % 11); /* 4 KiB to 4 MiB */
    const cudaStream_t st = streams[r % 5];
    float *h, *reused;
    if (r % 3 == 0)
      CHECK(cudaMallocHost((void **)&h, n * sizeof(float))); /* the C function */
    else if (r % 3 == 1)
      CHECK(cudaMallocHost(&h, n * sizeof(float))); /* cuda_runtime.h's template: cudaHostAlloc */
    else
      CHECK(cudaHostAlloc(&h, n * sizeof(float), r % 2 ? cudaHostAllocPortable : cudaHostAllocDefault));
    for (size_t i = 0; i < n; i++)
      h[i] = pattern(r, i);
    spin<<<1, 1, 0, st>>>(2000000); /* about a millisecond */
    CHECK(cudaMemcpyAsync(dev, h, n * sizeof(float), cudaMemcpyHostToDevice, st));
    CHECK(cudaFreeHost(h)); /* the copy is still queued: this must wait for it */
    CHECK(cudaHostAlloc(&reused, n * sizeof(float), cudaHostAllocDefault));
    memset(reused, 0xab, n * sizeof(float));
    *calls += 2;
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemcpy(back, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
      mismatches += back[i] != pattern(r, i);
    CHECK(cudaFreeHost(reused));
  }
  double sum = 0;
  /* Mapped and write-combined memory: the runtime's kinds, which the interposer passes on. */
  float *mapped, *mapped_dev, *wc;
  CHECK(cudaHostAlloc(&mapped, 4096 * sizeof(float), cudaHostAllocMapped));
  unsigned int flags = 0;
  CHECK(cudaHostGetFlags(&flags, mapped));
  CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
  fill<<<4, 256>>>(mapped_dev, 4096, 8.0f);
  CHECK(cudaDeviceSynchronize());
  const float wrote = mapped[0];
  sum += mapped[6];
  CHECK(cudaFreeHost(mapped));
  CHECK(cudaHostAlloc(&wc, 4096 * sizeof(float), cudaHostAllocWriteCombined | cudaHostAllocMapped));
  for (int i = 0; i < 4096; i++)
    wc[i] = (float)i;
  CHECK(cudaMemcpyAsync(dev, wc, 4096 * sizeof(float), cudaMemcpyHostToDevice, nb));
  CHECK(cudaStreamSynchronize(nb));
  CHECK(cudaMemcpy(back, dev, 4096 * sizeof(float), cudaMemcpyDeviceToHost));
  sum += back[4095];
  CHECK(cudaFreeHost(wc));
  printf("mapped: flags %s, kernel wrote %.1f; write-combined copied\n",
         flags & cudaHostAllocMapped ? "mapped" : "NOT MAPPED", wrote);

  /* A second free is refused, and the block is not released: pinned again, it works. */
  float *twice;
  CHECK(cudaMallocHost((void **)&twice, 8192 * sizeof(float)));
  CHECK(cudaFreeHost(twice));
  cudaError_t again = cudaFreeHost(twice);
  (void)cudaGetLastError();
  float *next;
  CHECK(cudaMallocHost((void **)&next, 8192 * sizeof(float)));
  *calls += 2;
  for (int i = 0; i < 8192; i++)
    next[i] = 2.0f;
  CHECK(cudaMemcpyAsync(dev, next, 8192 * sizeof(float), cudaMemcpyHostToDevice, blocking0));
  CHECK(cudaStreamSynchronize(blocking0));
  CHECK(cudaMemcpy(back, dev, 8192 * sizeof(float), cudaMemcpyDeviceToHost));
  sum += back[8191];
  CHECK(cudaFreeHost(next));
  /* Memory the runtime did not pin: its cudaFreeHost answers, under the interposer too. */
  char *pageable = (char *)malloc(4096);
  cudaError_t bad = cudaFreeHost(pageable);
  (void)cudaGetLastError();
  free(pageable);
  /* 0 bytes: whatever the runtime answers, the same under the interposer. */
  void *const unset = (void *)&pageable; /* any address the call would not return */
  void *zero = unset;
  cudaError_t z = cudaHostAlloc(&zero, 0, cudaHostAllocDefault);
  (void)cudaGetLastError();
  printf("second cudaFreeHost %s; cudaFreeHost of pageable memory: %s; cudaHostAlloc of 0 bytes: %s, pointer %s\n",
         again == cudaSuccess ? "ACCEPTED" : "refused", cudaGetErrorName(bad), cudaGetErrorName(z),
         zero == NULL ? "NULL" : zero == unset ? "untouched" : "set");
  if (z == cudaSuccess && zero != NULL && zero != unset)
    CHECK(cudaFreeHost(zero));
  printf("pinned: %ld default-flag calls, %ld mismatches after free and reuse\n", *calls, mismatches);
  CHECK(cudaFree(dev));
  CHECK(cudaStreamDestroy(nb));
  free(back);
  return sum;
}

int main(void) {
  cudaStream_t s[2];
  CHECK(cudaStreamCreate(&s[0]));
  CHECK(cudaStreamCreate(&s[1]));
  size_t free0 = 0, total0 = 0;
  float *host = (float *)malloc(sizeof(float) * 1024 * 400);
  double sum = 0;
  long calls = 0;
  for (int it = 0; it < 300; it++) {
    size_t n = 1024 * (size_t)(1 + (it * 37) % 400);
    float *a, *b, *c;
    CHECK(cudaMalloc(&a, n * sizeof(float)));
    CHECK(cudaMalloc(&b, n * sizeof(float)));
    calls += 2;
    fill<<<64, 256>>>(a, n, (float)it);
    fill<<<64, 256>>>(b, n, 1.0f);
    axpy<<<64, 256>>>(b, a, n, 0.5f);
    cudaStream_t st = s[it % 2];
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMallocAsync(&c, n * sizeof(float), st));
    calls++;
    CHECK(cudaMemcpyAsync(c, b, n * sizeof(float), cudaMemcpyDeviceToDevice, st));
    axpy<<<64, 256, 0, st>>>(c, a, n, 2.0f);
    CHECK(cudaMemcpyAsync(host, c, n * sizeof(float), cudaMemcpyDeviceToHost, st));
    CHECK(cudaStreamSynchronize(st));
    for (size_t i = 0; i < n; i += 97)
      sum += host[i];
    CHECK(cudaFreeAsync(c, s[(it + 1) % 2])); /* freed on the other stream: stream order still holds */
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    if (it == 0) /* the kernels are loaded now (lazily, on first launch), and all is freed again */
      CHECK(cudaMemGetInfo(&free0, &total0));
  }
  /* Everything is freed: what the program may have again is what it had after the first round
   * (cachalot's cache counts as free). */
  size_t free_b = 0, total = 0;
  CHECK(cudaMemGetInfo(&free_b, &total));
  const size_t slack = (size_t)16 << 20;
  const bool back = free_b + slack >= free0;
  /* Memory that did not come from cudaMalloc / cudaMallocAsync, freed with cudaFree / cudaFreeAsync:
   * under the interposer it must reach the runtime's own functions. */
  float *managed;
  CHECK(cudaMallocManaged(&managed, 1 << 20));
  fill<<<64, 256>>>(managed, 1024, 2.0f);
  CHECK(cudaDeviceSynchronize());
  sum += managed[5];
  CHECK(cudaFree(managed));
  cudaMemPool_t pool;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  CHECK(cudaMemPoolCreate(&pool, &props));
  float *pooled;
  CHECK(cudaMallocFromPoolAsync((void **)&pooled, 1 << 20, pool, s[0]));
  fill<<<64, 256, 0, s[0]>>>(pooled, 1024, 3.0f);
  CHECK(cudaMemcpyAsync(host, pooled, 16, cudaMemcpyDeviceToHost, s[0]));
  CHECK(cudaFreeAsync(pooled, s[0]));
  CHECK(cudaStreamSynchronize(s[0]));
  sum += host[1];
  CHECK(cudaMemPoolDestroy(pool));

  /* A second free is refused (and must not release memory that is in use: the work below runs on it). */
  float *twice, *live;
  CHECK(cudaMalloc(&twice, 1 << 20));
  CHECK(cudaMalloc(&live, 1 << 20));
  CHECK(cudaFree(twice));
  cudaError_t again = cudaFree(twice);
  (void)cudaGetLastError();
  printf("second free %s\n", again == cudaSuccess ? "ACCEPTED" : "refused");
  fill<<<64, 256>>>(live, 1 << 18, 4.0f);
  CHECK(cudaMemcpy(host, live, 64, cudaMemcpyDeviceToHost));
  sum += host[3];
  CHECK(cudaFree(live));

  /* Stream-ordered allocations inside a capture, the graph replayed, then its stream destroyed; a
   * relaxed capture of a blocking stream during which cudaMalloc and cudaFree are called. */
  cudaStream_t cs;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  float *out;
  CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  float *tmp;
  CHECK(cudaMallocAsync(&tmp, 1024 * sizeof(float), cs));
  fill<<<4, 256, 0, cs>>>(tmp, 1024, 5.0f);
  axpy<<<4, 256, 0, cs>>>(out, tmp, 1024, 1.0f);
  CHECK(cudaFreeAsync(tmp, cs));
  CHECK(cudaStreamEndCapture(cs, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaMemset(out, 0, 1024 * sizeof(float)));
  for (int r = 0; r < 3; r++)
    CHECK(cudaGraphLaunch(exec, cs));
  CHECK(cudaStreamSynchronize(cs));
  CHECK(cudaMemcpy(host, out, 64, cudaMemcpyDeviceToHost));
  sum += host[2];
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(cs));
  float *after;
  CHECK(cudaMalloc(&after, 4096)); /* capture detection must not ask about the destroyed stream */
  CHECK(cudaFree(after));

  cudaStream_t bs;
  CHECK(cudaStreamCreate(&bs)); /* blocking */
  CHECK(cudaStreamBeginCapture(bs, cudaStreamCaptureModeRelaxed));
  float *during;
  cudaError_t m = cudaMalloc(&during, 3 << 20);
  cudaError_t f = m == cudaSuccess ? cudaFree(during) : m;
  fill<<<4, 256, 0, bs>>>(out, 1024, 6.0f);
  CHECK(cudaStreamEndCapture(bs, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, bs));
  CHECK(cudaStreamSynchronize(bs));
  CHECK(cudaMemcpy(host, out, 64, cudaMemcpyDeviceToHost));
  sum += host[4];
  printf("relaxed capture: cudaMalloc %s, cudaFree %s, graph ran\n", cudaGetErrorName(m), cudaGetErrorName(f));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(bs));
  CHECK(cudaFree(out));
  CHECK(cudaDeviceSynchronize());
  long pinned_calls = 0;
  sum += pinned_rounds(s[0], s[1], &pinned_calls);
  printf("checksum %.3f after %ld allocation calls; free memory %s\n", sum, calls,
         back ? "back to where it started" : "LOWER than at the start");
  free(host);
  return free_b > 0 && free_b <= total ? 0 : 1;
}
