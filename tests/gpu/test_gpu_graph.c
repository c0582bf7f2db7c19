/* The gpu suite's graph half: real kernels captured into CUDA graphs on cachalot's private pools.
 * Exits 77 (skipped) without a usable GPU. */
#include "gpu_test.h"

#include <stdlib.h>
#include <string.h>

enum { N = 1 << 20 }; /* floats: 4 MiB buffers */

static float host_in[N], host_out[N];

static int64_t reserved(cachalot_allocator *a) {
  cachalot_device_stats st;
  return cachalot_memory_stats(a, 0, &st) == CACHALOT_OK ? st.reserved_bytes[0].current : -1;
}

/* y = ((2x + 1) * 3) - 1 through two temporaries from the pool, freed inside the capture. */
static void capture_chain(cachalot_allocator *a, cudaStream_t s, const float *x, float **y_out) {
  float *t1, *t2, *y;
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&t1));
  EXPECT(cl_test_axpb(t1, x, N, 2.f, 1.f, s) == 0, "kernel");
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&t2));
  EXPECT(cl_test_axpb(t2, t1, N, 3.f, 0.f, s) == 0, "kernel");
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&y));
  EXPECT(cl_test_axpb(y, t2, N, 1.f, -1.f, s) == 0, "kernel");
  OK(cachalot_free(a, t1));
  OK(cachalot_free(a, t2));
  *y_out = y;
}

static void test_chain_replays(cachalot_allocator *a) {
  current_test = "chain_replays";
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *x;
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&x));
  int64_t before = reserved(a);
  cachalot_graph *g;
  OK(cachalot_graph_create(a, 0, false, &g));
  OK(cachalot_graph_capture_begin(g, (cachalot_stream)s, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_GLOBAL));
  float *y = NULL;
  capture_chain(a, s, x, &y);
  OK(cachalot_graph_capture_end(g));
  /* three 4 MiB blocks in one 20 MiB segment of the graph's pool (t2 could not reuse t1: same capture) */
  EXPECT(reserved(a) - before == (int64_t)(20 * MiB), "the capture reserved %lld bytes",
         (long long)(reserved(a) - before));
  CHECKED(a);
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < N; i++)
      host_in[i] = (float)(i % 1000) * 0.5f + (float)r;
    CUDA(cudaMemcpyAsync(x, host_in, sizeof host_in, cudaMemcpyHostToDevice, s));
    OK(cachalot_graph_replay(g, (cachalot_stream)s));
    CUDA(cudaMemcpyAsync(host_out, y, sizeof host_out, cudaMemcpyDeviceToHost, s));
    CUDA(cudaStreamSynchronize(s));
    int bad = 0;
    for (int i = 0; i < N; i++)
      bad += host_out[i] != (2.f * host_in[i] + 1.f) * 3.f - 1.f;
    EXPECT(bad == 0, "replay %d: %d wrong values", r, bad);
  }
  /* reset + empty_cache: the output keeps its segment (it is still allocated), everything else goes */
  OK(cachalot_graph_reset(g));
  OK(cachalot_free(a, x));
  OK(cachalot_empty_cache(a));
  EXPECT(reserved(a) == (int64_t)(20 * MiB), "after reset the output's segment stays (%lld)", (long long)reserved(a));
  OK(cachalot_free(a, y));
  OK(cachalot_empty_cache(a));
  EXPECT(reserved(a) == 0, "all pool memory returned (%lld)", (long long)reserved(a));
  CHECKED(a);
  cachalot_graph_destroy(g);
  cudaStreamDestroy(s);
}

static void test_shared_pool(cachalot_allocator *a) {
  current_test = "shared_pool";
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *x;
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&x));
  cachalot_mempool_id pool = cachalot_graph_pool_handle(a);
  cachalot_graph *g1, *g2;
  OK(cachalot_graph_create(a, 0, false, &g1));
  OK(cachalot_graph_create(a, 0, false, &g2));
  float *y1 = NULL, *y2 = NULL;
  OK(cachalot_graph_capture_begin(g1, (cachalot_stream)s, pool, CACHALOT_CAPTURE_GLOBAL));
  capture_chain(a, s, x, &y1);
  OK(cachalot_graph_capture_end(g1));
  OK(cachalot_graph_capture_begin(g2, (cachalot_stream)s, pool, CACHALOT_CAPTURE_GLOBAL));
  capture_chain(a, s, y1, &y2); /* reads g1's output; its temporaries reuse g1's freed ones */
  OK(cachalot_graph_capture_end(g2));
  EXPECT(cachalot_graph_pool(g1).second == pool.second && cachalot_graph_pool(g2).second == pool.second, "pool ids");
  for (int r = 0; r < 2; r++) {
    for (int i = 0; i < N; i++)
      host_in[i] = (float)(i % 777) - (float)r;
    CUDA(cudaMemcpyAsync(x, host_in, sizeof host_in, cudaMemcpyHostToDevice, s));
    OK(cachalot_graph_replay(g1, (cachalot_stream)s)); /* capture order */
    OK(cachalot_graph_replay(g2, (cachalot_stream)s));
    CUDA(cudaMemcpyAsync(host_out, y2, sizeof host_out, cudaMemcpyDeviceToHost, s));
    CUDA(cudaStreamSynchronize(s));
    int bad = 0;
    for (int i = 0; i < N; i++) {
      float v = (2.f * host_in[i] + 1.f) * 3.f - 1.f;
      bad += host_out[i] != (2.f * v + 1.f) * 3.f - 1.f;
    }
    EXPECT(bad == 0, "replay %d: %d wrong values", r, bad);
  }
  OK(cachalot_graph_reset(g1));
  OK(cachalot_graph_reset(g2));
  OK(cachalot_free(a, y1));
  OK(cachalot_free(a, y2));
  OK(cachalot_free(a, x));
  OK(cachalot_empty_cache(a));
  EXPECT(reserved(a) == 0, "all memory returned (%lld)", (long long)reserved(a));
  CHECKED(a);
  cachalot_graph_destroy(g1);
  cachalot_graph_destroy(g2);
  cudaStreamDestroy(s);
}

static void test_multi_stream(cachalot_allocator *a) {
  current_test = "multi_stream_capture";
  cudaStream_t s, side;
  cudaEvent_t fork, join;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  float *x, *y, *z;
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&x));
  cachalot_graph *g;
  OK(cachalot_graph_create(a, 0, false, &g));
  OK(cachalot_graph_capture_begin(g, (cachalot_stream)s, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_GLOBAL));
  CUDA(cudaEventRecord(fork, s));
  CUDA(cudaStreamWaitEvent(side, fork, 0)); /* side joins the capture */
  cachalot_device_stats st0;
  OK(cachalot_memory_stats(a, 0, &st0));
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)side, (void **)&y)); /* from the graph's pool */
  EXPECT(cl_test_axpb(y, x, N, 5.f, 0.f, side) == 0, "kernel");
  OK(cachalot_malloc(a, 0, N * sizeof(float), (cachalot_stream)s, (void **)&z));
  EXPECT(cl_test_axpb(z, x, N, 1.f, 7.f, s) == 0, "kernel");
  CUDA(cudaEventRecord(join, side));
  CUDA(cudaStreamWaitEvent(s, join, 0));
  EXPECT(cl_test_axpb(z, y, N, 1.f, 0.f, s) == 0, "kernel"); /* z = y, after both branches */
  OK(cachalot_graph_capture_end(g));
  cachalot_mempool_id pool = cachalot_graph_pool(g);
  cachalot_pool_state *ck = NULL;
  OK(cachalot_checkpoint_pool(a, 0, pool, &ck));
  int found = 0;
  for (size_t i = 0; i < ck->n_segments; i++)
    for (size_t k = 0; k < ck->segments[i].n_blocks; k++)
      found += ck->segments[i].address + ck->segments[i].blocks[k].offset == (uintptr_t)y;
  cachalot_pool_state_free(ck);
  EXPECT(found == 1, "the side stream's allocation is in the graph's pool");
  for (int i = 0; i < N; i++)
    host_in[i] = (float)(i % 313);
  CUDA(cudaMemcpyAsync(x, host_in, sizeof host_in, cudaMemcpyHostToDevice, s));
  OK(cachalot_graph_replay(g, (cachalot_stream)s));
  CUDA(cudaMemcpyAsync(host_out, z, sizeof host_out, cudaMemcpyDeviceToHost, s));
  CUDA(cudaStreamSynchronize(s));
  int bad = 0;
  for (int i = 0; i < N; i++)
    bad += host_out[i] != 5.f * host_in[i];
  EXPECT(bad == 0, "%d wrong values", bad);
  OK(cachalot_graph_reset(g));
  OK(cachalot_free(a, y));
  OK(cachalot_free(a, z));
  OK(cachalot_free(a, x));
  OK(cachalot_empty_cache(a));
  EXPECT(reserved(a) == 0, "all memory returned (%lld)", (long long)reserved(a));
  CHECKED(a);
  cachalot_graph_destroy(g);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
}

/* A counter-based RNG whose state is graph-safe: PyTorch's generator registered with a graph. */
typedef struct {
  uint64_t seed, offset;   /* host state: the next call starts at offset */
  bool capturing;
  uint64_t captured;       /* offsets consumed inside the capture so far */
  uint64_t *dev_offset;    /* where a replay reads its base offset */
} rng_state;

static int rng_generate(rng_state *r, uint32_t *out, size_t n, cudaStream_t s) {
  int rc;
  if (r->capturing) {
    rc = cl_test_rng(out, n, r->seed, r->captured, r->dev_offset, s);
    r->captured += n;
  } else {
    rc = cl_test_rng(out, n, r->seed, r->offset, NULL, s);
    r->offset += n;
  }
  return rc;
}

static void rng_capture_begin(void *ctx) {
  rng_state *r = ctx;
  r->capturing = true;
  r->captured = 0;
}
static uint64_t rng_capture_end(void *ctx) {
  rng_state *r = ctx;
  r->capturing = false;
  return r->captured;
}
static cachalot_status rng_before_replay(void *ctx, uint64_t increment, cachalot_stream s) {
  rng_state *r = ctx;
  if (cl_test_set_u64(r->dev_offset, r->offset, (cudaStream_t)s) != 0)
    return CACHALOT_ERROR_DEVICE;
  r->offset += increment;
  return CACHALOT_OK;
}

static void test_rng_state(cachalot_allocator *a) {
  current_test = "rng_state_hooks";
  enum { M = 4096, R = 3 };
  static uint32_t eager[R][2 * M], replayed[R][2 * M];
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  rng_state rng = {.seed = 42, .offset = 1000};
  OK(cachalot_malloc(a, 0, sizeof(uint64_t), (cachalot_stream)s, (void **)&rng.dev_offset));
  uint32_t *buf;
  OK(cachalot_malloc(a, 0, 2 * M * sizeof(uint32_t), (cachalot_stream)s, (void **)&buf));
  /* eager: R iterations of two generate calls */
  for (int r = 0; r < R; r++) {
    EXPECT(rng_generate(&rng, buf, M, s) == 0 && rng_generate(&rng, buf + M, M, s) == 0, "rng");
    CUDA(cudaMemcpyAsync(eager[r], buf, sizeof eager[r], cudaMemcpyDeviceToHost, s));
  }
  CUDA(cudaStreamSynchronize(s));
  /* the same two calls captured once, replayed R times from the same starting offset */
  rng.offset = 1000;
  cachalot_graph *g;
  OK(cachalot_graph_create(a, 0, false, &g));
  cachalot_graph_state_hooks hooks = {rng_capture_begin, rng_capture_end, rng_before_replay, &rng};
  OK(cachalot_graph_register_state(g, &hooks));
  OK(cachalot_graph_capture_begin(g, (cachalot_stream)s, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_GLOBAL));
  EXPECT(rng_generate(&rng, buf, M, s) == 0 && rng_generate(&rng, buf + M, M, s) == 0, "rng");
  OK(cachalot_graph_capture_end(g));
  EXPECT(rng.offset == 1000, "capturing does not advance the host offset");
  for (int r = 0; r < R; r++) {
    OK(cachalot_graph_replay(g, (cachalot_stream)s));
    CUDA(cudaMemcpyAsync(replayed[r], buf, sizeof replayed[r], cudaMemcpyDeviceToHost, s));
  }
  CUDA(cudaStreamSynchronize(s));
  EXPECT(memcmp(replayed[0], replayed[1], sizeof replayed[0]) != 0, "replays give fresh numbers");
  for (int r = 0; r < R; r++)
    EXPECT(memcmp(eager[r], replayed[r], sizeof eager[r]) == 0, "replay %d differs from eager call %d", r, r);
  EXPECT(rng.offset == 1000 + (uint64_t)R * 2 * M, "the host offset advanced by the increment per replay");
  OK(cachalot_graph_reset(g));
  cachalot_graph_destroy(g);
  OK(cachalot_free(a, buf));
  OK(cachalot_free(a, rng.dev_offset));
  CHECKED(a);
  cudaStreamDestroy(s);
}

int main(void) {
  cachalot_backend *b = NULL;
  if (cachalot_backend_cuda(&b) != CACHALOT_OK) {
    printf("SKIP: %s\n", cachalot_last_error());
    return 77;
  }
  void (*tests[])(cachalot_allocator *) = {test_chain_replays, test_shared_pool, test_multi_stream, test_rng_state};
  const char *names[] = {"chain_replays", "shared_pool", "multi_stream_capture", "rng_state_hooks"};
  int passed = 0, ran = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    cachalot_allocator *a = NULL;
    if (cachalot_create(b, "", &a) != CACHALOT_OK) {
      printf("FAIL: %s\n", cachalot_last_error());
      return 1;
    }
    int before = failures;
    tests[i](a);
    cachalot_destroy(a);
    ran++;
    passed += failures == before;
    printf("  %-24s %s\n", names[i], failures == before ? "ok" : "FAILED");
  }
  cachalot_backend_destroy(b);
  printf("%d passed, %d failed\n", passed, ran - passed);
  return failures ? 1 : 0;
}
