/* The gpu suite: the core behaviours of the unit suite on a real device through the CUDA backend, with
 * kernels writing and checking the memory cachalot hands out. Exits 77 (skipped) without a usable GPU.
 *
 * The exact figures are PyTorch's, the same the unit suite checks on the simulated device. */
#include "gpu_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static cachalot_device_stats stats_of(cachalot_allocator *a, int dev) {
  cachalot_device_stats st;
  if (cachalot_memory_stats(a, dev, &st) != CACHALOT_OK)
    memset(&st, 0xff, sizeof st);
  return st;
}

/* One request on a fresh cache: the block and segment it gets. */
static void expect_one(cachalot_allocator *a, size_t size, int kind, int64_t block, int64_t segment) {
  void *p;
  OK(cachalot_malloc(a, 0, size, NULL, &p));
  CHECKED(a);
  cachalot_device_stats st = stats_of(a, 0);
  EXPECT(st.allocated_bytes[kind].current == block, "%zu B -> block of %lld (want %lld)", size,
         (long long)st.allocated_bytes[kind].current, (long long)block);
  EXPECT(st.reserved_bytes[kind].current == segment, "%zu B -> segment of %lld (want %lld)", size,
         (long long)st.reserved_bytes[kind].current, (long long)segment);
  EXPECT(cl_test_fill(p, (size_t)block, 0xABCD0000u, 0, NULL) == 0, "fill");
  EXPECT(cl_test_verify(p, (size_t)block, 0xABCD0000u, NULL) == 0, "verify");
  OK(cachalot_free(a, p));
  OK(cachalot_empty_cache(a));
  CHECKED(a);
}

static void test_sizes(cachalot_allocator *a) {
  current_test = "sizes";
  const int before = failures;
  expect_one(a, 1, CACHALOT_STAT_SMALL_POOL, 512, (int64_t)(2 * MiB));
  expect_one(a, MiB, CACHALOT_STAT_SMALL_POOL, (int64_t)MiB, (int64_t)(2 * MiB));
  expect_one(a, MiB + 1, CACHALOT_STAT_LARGE_POOL, (int64_t)(MiB + 512), (int64_t)(20 * MiB));
  expect_one(a, 10 * MiB + 512, CACHALOT_STAT_LARGE_POOL, (int64_t)(10 * MiB + 512), (int64_t)(12 * MiB));
  if (failures != before)
    return;
  void *p1, *p2, *p3, *p4, *p5;
  OK(cachalot_malloc(a, 0, 1, NULL, &p1));
  OK(cachalot_malloc(a, 0, MiB + 1, NULL, &p2));
  OK(cachalot_malloc(a, 0, 10 * MiB + 512, NULL, &p3)); /* carved from the 20 MiB segment's rest */
  OK(cachalot_malloc(a, 0, 10 * MiB - 512, NULL, &p4));
  OK(cachalot_malloc(a, 0, 10 * MiB - 512, NULL, &p5));
  CHECKED(a);
  cachalot_device_stats st = stats_of(a, 0);
  /* segment A (20 MiB): p2, then p3 carved from its rest; segment B (20 MiB): p4, then p5 takes B's whole
   * rest (10 MiB + 512: a remainder of 1 KiB is not split off in the large pool) */
  EXPECT((char *)p5 - (char *)p4 == (ptrdiff_t)(10 * MiB - 512), "second 10 MiB - 512 block right after the first");
  EXPECT(st.segment[CACHALOT_STAT_LARGE_POOL].current == 2, "two large segments (%lld)",
         (long long)st.segment[CACHALOT_STAT_LARGE_POOL].current);
  EXPECT(st.reserved_bytes[CACHALOT_STAT_LARGE_POOL].current == (int64_t)(40 * MiB), "40 MiB large reserved");
  /* the memory is real: fill and verify every block */
  void *ps[] = {p1, p2, p3, p4, p5};
  size_t sz[] = {512, MiB + 512, 10 * MiB + 512, 10 * MiB - 512, 10 * MiB + 512};
  for (int i = 0; i < 5; i++)
    EXPECT(cl_test_fill(ps[i], sz[i], 0xC0DE0000u + (uint32_t)i, 0, NULL) == 0, "fill");
  for (int i = 0; i < 5; i++)
    EXPECT(cl_test_verify(ps[i], sz[i], 0xC0DE0000u + (uint32_t)i, NULL) == 0, "block %d overwritten", i);
  for (int i = 0; i < 5; i++)
    OK(cachalot_free(a, ps[i]));
  CHECKED(a);
  OK(cachalot_empty_cache(a));
  CHECKED(a);
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == 0 && st.num_device_free == st.num_device_alloc, "all segments returned");
}

static void test_reuse_and_streams(cachalot_allocator *a) {
  current_test = "reuse_and_streams";
  cudaStream_t s1, s2;
  EXPECT(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess, "stream");
  EXPECT(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess, "stream");
  void *p, *q;
  OK(cachalot_malloc(a, 0, 4096, (cachalot_stream)s1, &p));
  OK(cachalot_free(a, p));
  OK(cachalot_malloc(a, 0, 4096, (cachalot_stream)s1, &q));
  EXPECT(p == q, "freed block reused at once on its own stream");
  OK(cachalot_free(a, q));
  OK(cachalot_malloc(a, 0, 4096, (cachalot_stream)s2, &q));
  EXPECT(p != q, "another stream does not get the block");
  OK(cachalot_free(a, q));
  CHECKED(a);

  /* record_stream with a real kernel still running on the other stream: the memory is not reused until
   * the kernel (and so the event after it) completes, and the kernel's writes survive. */
  const size_t bytes = 8 * MiB;
  OK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, &p));
  EXPECT(cl_test_fill(p, bytes, 0x5EED0000u, 0, (cudaStream_t)s1) == 0, "fill");
  EXPECT(cudaStreamSynchronize(s1) == cudaSuccess, "sync");
  /* about half a second on an H100/H200 clock */
  EXPECT(cl_test_fill(p, bytes, 0xFEEDBEEFu, 800000000ll, s2) == 0, "slow kernel");
  OK(cachalot_record_stream(a, p, (cachalot_stream)s2));
  OK(cachalot_free(a, p));
  cachalot_device_stats st = stats_of(a, 0);
  EXPECT(st.allocation[0].current == 0 && st.active[0].current == 1, "pending free: allocation 0, active 1");
  EXPECT(cudaStreamQuery(s2) == cudaErrorNotReady, "the kernel is still running");
  (void)cudaGetLastError();
  void *r;
  OK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, &r));
  EXPECT(r != p, "memory still used by a running kernel was handed out again");
  /* write into the new block on s1 while the kernel runs: it must not touch p */
  EXPECT(cl_test_fill(r, bytes, 0x12345678u, 0, s1) == 0, "fill");
  EXPECT(cudaStreamSynchronize(s2) == cudaSuccess, "sync");
  EXPECT(cl_test_verify(p, bytes, 0xFEEDBEEFu, s2) == 0, "the slow kernel's writes were clobbered");
  void *t;
  OK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s1, &t));
  EXPECT(t == p, "after the event completed the block is reused (got %p, want %p)", t, p);
  CHECKED(a);
  OK(cachalot_free(a, r));
  OK(cachalot_free(a, t));
  EXPECT(cudaStreamSynchronize(s1) == cudaSuccess, "sync");
  OK(cachalot_empty_cache(a));
  CHECKED(a);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

static int observer_calls;
static size_t observer_size, observer_limit;
static void on_oom(int device, size_t alloc_size, size_t limit, size_t device_free, void *ctx) {
  (void)device, (void)device_free, (void)ctx;
  observer_calls++;
  observer_size = alloc_size;
  observer_limit = limit;
}

static void test_oom(cachalot_allocator *a) {
  current_test = "oom";
  size_t free_b = 0, total = 0;
  EXPECT(cudaMemGetInfo(&free_b, &total) == cudaSuccess, "meminfo");
  /* a fraction small enough to reach quickly: 1 GiB worth of the device */
  double fraction = (double)(1ull << 30) / (double)total;
  OK(cachalot_set_memory_fraction(a, 0, fraction));
  OK(cachalot_attach_oom_observer(a, on_oom, NULL));
  void *p[64];
  int n = 0;
  cachalot_status s;
  while (n < 64 && (s = cachalot_malloc(a, 0, 100 * MiB, NULL, &p[n])) == CACHALOT_OK)
    n++;
  EXPECT(s == CACHALOT_ERROR_OUT_OF_MEMORY, "out of memory under the fraction");
  EXPECT(n == 10, "ten 100 MiB blocks fit in 1 GiB (got %d)", n);
  EXPECT(strstr(cachalot_last_error(), "CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a total capacity of "),
         "message: %s", cachalot_last_error());
  EXPECT(strstr(cachalot_last_error(), "1024.00 MiB allowed; Of the allocated memory 1000.00 MiB is allocated by cachalot"),
         "message: %s", cachalot_last_error());
  EXPECT(observer_calls == 1 && observer_size == 100 * MiB && observer_limit == (size_t)(fraction * (double)total),
         "observer called once with the segment size and the limit");
  cachalot_device_stats st = stats_of(a, 0);
  EXPECT(st.num_ooms == 1 && st.num_alloc_retries == 1, "num_ooms 1, num_alloc_retries 1 (%lld, %lld)",
         (long long)st.num_ooms, (long long)st.num_alloc_retries);
  CHECKED(a);
  OK(cachalot_free(a, p[--n]));
  void *q;
  OK(cachalot_malloc(a, 0, 100 * MiB, NULL, &q));
  EXPECT(q == p[n], "the freed block serves the retry");
  p[n++] = q;
  for (int i = 0; i < n; i++)
    OK(cachalot_free(a, p[i]));
  OK(cachalot_set_memory_fraction(a, 0, 1.0));
  OK(cachalot_empty_cache(a));
  size_t free_after = 0;
  EXPECT(cudaMemGetInfo(&free_after, &total) == cudaSuccess, "meminfo");
  EXPECT(free_after + 64 * MiB >= free_b, "empty_cache gave the memory back to the device");
  CHECKED(a);
}

typedef struct {
  cachalot_allocator *a;
  int id;
  int errors;
} thread_arg;

static void *thread_main(void *argp) {
  thread_arg *arg = argp;
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    arg->errors++;
    return NULL;
  }
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(arg->id + 1);
  void *live[16] = {0};
  size_t size[16] = {0};
  uint32_t pat[16] = {0};
  for (int op = 0; op < 2000; op++) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    int k = (int)(rng % 16);
    if (live[k]) {
      if (cl_test_verify(live[k], size[k], pat[k], s) != 0)
        arg->errors++;
      if (cachalot_free(arg->a, live[k]) != CACHALOT_OK)
        arg->errors++;
      live[k] = NULL;
    } else {
      size[k] = ((size_t)(rng >> 20) % (4 * MiB)) / 4 * 4 + 4;
      pat[k] = (uint32_t)(rng >> 32);
      if (cachalot_malloc(arg->a, 0, size[k], (cachalot_stream)s, &live[k]) != CACHALOT_OK ||
          cl_test_fill(live[k], size[k], pat[k], 0, s) != 0)
        arg->errors++;
    }
  }
  for (int k = 0; k < 16; k++)
    if (live[k] && (cl_test_verify(live[k], size[k], pat[k], s) != 0 || cachalot_free(arg->a, live[k]) != CACHALOT_OK))
      arg->errors++;
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return NULL;
}

static void test_threads(cachalot_allocator *a) {
  current_test = "threads";
  enum { T = 8 };
  pthread_t t[T];
  thread_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (thread_arg){a, i, 0};
    pthread_create(&t[i], NULL, thread_main, &args[i]);
  }
  int errors = 0;
  for (int i = 0; i < T; i++) {
    pthread_join(t[i], NULL);
    errors += args[i].errors;
  }
  EXPECT(errors == 0, "%d pattern or call errors across %d threads", errors, T);
  CHECKED(a);
  cachalot_device_stats st = stats_of(a, 0);
  EXPECT(st.allocation[0].current == 0, "everything freed");
  OK(cachalot_empty_cache(a));
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == 0, "nothing reserved after empty_cache");
}

static void test_multi_device(cachalot_allocator *a, int n) {
  current_test = "multi_device";
  if (n < 2) {
    printf("  (one device: multi-device test skipped)\n");
    return;
  }
  void *p[8];
  for (int d = 0; d < n && d < 8; d++) {
    OK(cachalot_malloc(a, d, 3 * MiB, NULL, &p[d]));
    struct cudaPointerAttributes attr;
    EXPECT(cudaPointerGetAttributes(&attr, p[d]) == cudaSuccess && attr.device == d, "block lives on device %d", d);
  }
  for (int d = 0; d < n && d < 8; d++) {
    cachalot_device_stats st = stats_of(a, d);
    EXPECT(st.reserved_bytes[0].current == (int64_t)(20 * MiB), "device %d has its own segment", d);
    OK(cachalot_free(a, p[d]));
  }
  CHECKED(a);

  /* A block of device 0 used by a stream of device 1: the event goes on device 1, after a kernel that
   * runs there for a while; the block is not reused until that kernel is done. */
  cudaStream_t s1;
  void *scratch = NULL;
  EXPECT(cudaSetDevice(1) == cudaSuccess && cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess,
         "stream on device 1");
  OK(cachalot_malloc(a, 1, MiB, (cachalot_stream)s1, &scratch));
  EXPECT(cl_test_fill(scratch, MiB, 1u, 800000000ll, s1) == 0, "slow kernel on device 1");
  EXPECT(cudaSetDevice(0) == cudaSuccess, "device 0");
  void *blk, *other, *again;
  OK(cachalot_malloc(a, 0, 4 * MiB, NULL, &blk));
  OK(cachalot_record_stream(a, blk, (cachalot_stream)s1));
  OK(cachalot_free(a, blk));
  EXPECT(cudaStreamQuery(s1) == cudaErrorNotReady, "the kernel on device 1 is still running");
  (void)cudaGetLastError();
  OK(cachalot_malloc(a, 0, 4 * MiB, NULL, &other));
  EXPECT(other != blk, "a block waiting on device 1's stream was handed out again");
  EXPECT(cudaStreamSynchronize(s1) == cudaSuccess, "sync device 1");
  OK(cachalot_malloc(a, 0, 4 * MiB, NULL, &again));
  EXPECT(again == blk, "after device 1's stream is done the block is reused");
  OK(cachalot_free(a, other));
  OK(cachalot_free(a, again));
  OK(cachalot_free(a, scratch));
  cudaStreamDestroy(s1);
  CHECKED(a);
  OK(cachalot_empty_cache(a));
}

static void test_capture_info(cachalot_allocator *a) {
  current_test = "capture_relaxed_alloc";
  /* While a global-mode capture is underway, a plain cudaMalloc fails ("operation not permitted when
   * stream is capturing") and invalidates the capture. cachalot switches the thread to relaxed mode
   * around its device allocations, so a new segment can be had and the capture survives. */
  cudaStream_t s;
  EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  void *p;
  OK(cachalot_malloc(a, 0, 4096, NULL, &p));
  OK(cachalot_free(a, p));
  EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  void *q, *big;
  OK(cachalot_malloc(a, 0, 4096, NULL, &q));
  EXPECT(q == p, "served from cache during the capture");
  cachalot_status st = cachalot_malloc(a, 0, 3 * MiB, NULL, &big); /* needs a new 20 MiB segment */
  cudaGraph_t g = NULL;
  cudaError_t end = cudaStreamEndCapture(s, &g);
  if (g)
    cudaGraphDestroy(g);
  (void)cudaGetLastError();
  EXPECT(st == CACHALOT_OK, "a new segment during a global-mode capture");
  EXPECT(end == cudaSuccess, "the capture was invalidated: %s", cudaGetErrorString(end));
  cachalot_device_stats stats = stats_of(a, 0);
  EXPECT(stats.num_device_alloc == 2, "two device allocations (%lld)", (long long)stats.num_device_alloc);
  OK(cachalot_free(a, q));
  OK(cachalot_free(a, big));
  cudaStreamDestroy(s);
  CHECKED(a);
}

/* expandable_segments:True on the device: blocks grown across mapped pages hold what kernels write,
 * pages unmapped under free blocks leave their neighbours intact, a hole mapped again holds new data,
 * and empty_cache waits for a kernel still writing to freed memory before unmapping it. */
static void test_expandable(cachalot_allocator *a) {
  current_test = "expandable";
  OK(cachalot_set_settings(a, "expandable_segments:True"));
  cudaStream_t s;
  EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const cachalot_stream cs = (cachalot_stream)s;
  size_t free0 = 0, total = 0;
  CUDA(cudaMemGetInfo(&free0, &total));
  void *p1, *p2, *p3, *p4, *p5;
  OK(cachalot_malloc(a, 0, 30 * MiB, cs, &p1)); /* 2 pages of 20 MiB */
  OK(cachalot_malloc(a, 0, 15 * MiB, cs, &p2)); /* the free tail and 1 more page */
  OK(cachalot_malloc(a, 0, 100 * MiB, cs, &p3)); /* the free tail and 5 more */
  OK(cachalot_malloc(a, 0, 1000, cs, &p4));      /* the small kind's own reservation */
  EXPECT((char *)p2 == (char *)p1 + 30 * MiB && (char *)p3 == (char *)p2 + 15 * MiB,
         "grown blocks lie back to back (%p %p %p)", p1, p2, p3);
  cachalot_device_stats st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == (int64_t)(160 * MiB + 2 * MiB) && st.segment[0].current == 0,
         "reserved %lld, segments %lld", (long long)st.reserved_bytes[0].current, (long long)st.segment[0].current);
  EXPECT(cl_test_fill(p1, 30 * MiB, 0xA1A1A1A1u, 0, s) == 0, "fill");
  EXPECT(cl_test_fill(p2, 15 * MiB, 0xB2B2B2B2u, 0, s) == 0, "fill");
  EXPECT(cl_test_fill(p3, 100 * MiB, 0xC3C3C3C3u, 0, s) == 0, "fill");
  EXPECT(cl_test_fill(p4, 1000 & ~3u, 0xD4D4D4D4u, 0, s) == 0, "fill");
  EXPECT(cl_test_verify(p1, 30 * MiB, 0xA1A1A1A1u, s) == 0, "p1 across a page boundary");
  EXPECT(cl_test_verify(p2, 15 * MiB, 0xB2B2B2B2u, s) == 0, "p2 across a page boundary");
  EXPECT(cl_test_verify(p3, 100 * MiB, 0xC3C3C3C3u, s) == 0, "p3 across five pages");
  EXPECT(cl_test_verify(p4, 1000 & ~3u, 0xD4D4D4D4u, s) == 0, "p4");
  CHECKED(a);

  /* free p1: its first page goes at empty_cache; p2 and p3 keep their data */
  OK(cachalot_free(a, p1));
  OK(cachalot_empty_cache(a));
  CHECKED(a);
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == (int64_t)(140 * MiB + 2 * MiB) && st.num_device_free == 1,
         "after empty_cache: reserved %lld, device frees %lld", (long long)st.reserved_bytes[0].current,
         (long long)st.num_device_free);
  EXPECT(cl_test_verify(p2, 15 * MiB, 0xB2B2B2B2u, s) == 0, "p2 after the unmap");
  EXPECT(cl_test_verify(p3, 100 * MiB, 0xC3C3C3C3u, s) == 0, "p3 after the unmap");
  /* 25 MiB: the unmapped page and the free 10 MiB after it: mapped again, at p1's place */
  OK(cachalot_malloc(a, 0, 25 * MiB, cs, &p5));
  EXPECT(p5 == p1, "the hole is mapped again (%p, want %p)", p5, p1);
  EXPECT(cl_test_fill(p5, 25 * MiB, 0xE5E5E5E5u, 0, s) == 0, "fill");
  EXPECT(cl_test_verify(p5, 25 * MiB, 0xE5E5E5E5u, s) == 0, "p5 in remapped memory");
  EXPECT(cl_test_verify(p2, 15 * MiB, 0xB2B2B2B2u, s) == 0, "p2 after the remap");
  CHECKED(a);

  /* a kernel still writing p3 on its own stream when p3 is freed (stream-ordered: free at once) and
   * empty_cache runs: the unmap waits for the device (an unmap under a running kernel is a fault that
   * poisons the context) */
  EXPECT(cl_test_fill(p3, 100 * MiB, 0x0F0F0F0Fu, 200000000ll, s) == 0, "slow kernel");
  OK(cachalot_free(a, p3));
  EXPECT(cudaStreamQuery(s) == cudaErrorNotReady, "the kernel is still running");
  (void)cudaGetLastError();
  OK(cachalot_free(a, p2));
  OK(cachalot_free(a, p5));
  OK(cachalot_free(a, p4));
  OK(cachalot_empty_cache(a));
  CHECKED(a);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess,
         "the device is healthy after the unmaps");
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == 0, "reserved %lld after empty_cache", (long long)st.reserved_bytes[0].current);
  size_t free1 = 0;
  CUDA(cudaMemGetInfo(&free1, &total));
  EXPECT(free1 + 8 * MiB >= free0, "the device got its memory back: %zu MiB free, %zu before", free1 / MiB,
         free0 / MiB);
  cudaStreamDestroy(s);
}

/* preset:low_fragmentation on the device: 2 MiB pages for the large kind. A hole between two live blocks
 * gives its whole 2 MiB pages back at empty_cache while the data on both sides survives, the hole
 * mapped again holds new data, and a growth to a new peak compacts (unmaps the hole first) without
 * touching live data. */
static void test_fine_pages(cachalot_allocator *a) {
  current_test = "fine_pages";
  OK(cachalot_set_settings(a, "preset:low_fragmentation"));
  cudaStream_t s;
  EXPECT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const cachalot_stream cs = (cachalot_stream)s;
  void *p1, *p2, *p3, *p4, *p5;
  OK(cachalot_malloc(a, 0, 3 * MiB, cs, &p1)); /* 2 pages */
  OK(cachalot_malloc(a, 0, 5 * MiB, cs, &p2)); /* the free MiB and 2 pages more */
  OK(cachalot_malloc(a, 0, 3 * MiB, cs, &p3)); /* 2 more */
  EXPECT((char *)p2 == (char *)p1 + 3 * MiB && (char *)p3 == (char *)p1 + 8 * MiB, "back to back (%p %p %p)", p1,
         p2, p3);
  cachalot_device_stats st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == (int64_t)(12 * MiB), "reserved %lld", (long long)st.reserved_bytes[0].current);
  EXPECT(cl_test_fill(p1, 3 * MiB, 0x11111111u, 0, s) == 0, "fill");
  EXPECT(cl_test_fill(p2, 5 * MiB, 0x22222222u, 0, s) == 0, "fill");
  EXPECT(cl_test_fill(p3, 3 * MiB, 0x33333333u, 0, s) == 0, "fill");
  CHECKED(a);
  OK(cachalot_free(a, p2)); /* the hole [3, 8) MiB: pages [4, 8) go */
  OK(cachalot_empty_cache(a));
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == (int64_t)(8 * MiB), "after empty_cache: reserved %lld",
         (long long)st.reserved_bytes[0].current);
  EXPECT(cl_test_verify(p1, 3 * MiB, 0x11111111u, s) == 0, "p1 beside the unmapped pages");
  EXPECT(cl_test_verify(p3, 3 * MiB, 0x33333333u, s) == 0, "p3 beside the unmapped pages");
  CHECKED(a);
  OK(cachalot_malloc(a, 0, 3 * MiB, cs, &p4)); /* the free MiB [3, 4) and [4, 6) mapped again */
  EXPECT(p4 == (char *)p1 + 3 * MiB, "the hole is mapped again (%p, want %p)", p4, (void *)((char *)p1 + 3 * MiB));
  EXPECT(cl_test_fill(p4, 3 * MiB, 0x44444444u, 0, s) == 0, "fill");
  EXPECT(cl_test_verify(p4, 3 * MiB, 0x44444444u, s) == 0, "p4 in remapped memory");
  /* a new peak that fits nowhere: compaction unmaps the free page [4, 6) first, then 40 MiB grow from the
   * run's free MiB at 11 (the simulated device's fine_pages_compact has the same numbers) */
  OK(cachalot_free(a, p4));
  OK(cachalot_malloc(a, 0, 40 * MiB, cs, &p5));
  EXPECT(cl_test_fill(p5, 40 * MiB, 0x55555555u, 0, s) == 0, "fill");
  EXPECT(cl_test_verify(p1, 3 * MiB, 0x11111111u, s) == 0, "p1 after compaction");
  EXPECT(cl_test_verify(p3, 3 * MiB, 0x33333333u, s) == 0, "p3 after compaction");
  EXPECT(cl_test_verify(p5, 40 * MiB, 0x55555555u, s) == 0, "p5");
  EXPECT(p5 == (char *)p1 + 11 * MiB, "p5 at %p, want %p", p5, (void *)((char *)p1 + 11 * MiB));
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == (int64_t)(48 * MiB) && st.num_device_free == 2,
         "after compaction: reserved %lld, device frees %lld", (long long)st.reserved_bytes[0].current,
         (long long)st.num_device_free);
  CHECKED(a);
  OK(cachalot_free(a, p1));
  OK(cachalot_free(a, p3));
  OK(cachalot_free(a, p5));
  OK(cachalot_empty_cache(a));
  st = stats_of(a, 0);
  EXPECT(st.reserved_bytes[0].current == 0, "reserved %lld after empty_cache", (long long)st.reserved_bytes[0].current);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess, "the device is healthy");
  CHECKED(a);
  cudaStreamDestroy(s);
}

/* The host cache on a real GPU: pinned blocks copied from on two streams, each copy queued behind a slow
 * kernel, then freed at once. A block is not handed out again (and overwritten) before the copies that
 * read it are done: every device buffer ends with the pattern its own block held. Both ways of pinning. */
static void pinned_round(cachalot_allocator *a, const char *conf) {
  enum { ROUNDS = 6 };
  const size_t bytes = 16 * MiB;
  cudaStream_t st[2];
  EXPECT(cudaStreamCreateWithFlags(&st[0], cudaStreamNonBlocking) == cudaSuccess, "stream");
  EXPECT(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking) == cudaSuccess, "stream");
  void *dev[ROUNDS], *host[ROUNDS];
  for (int k = 0; k < ROUNDS; k++) {
    cudaStream_t s = st[k % 2];
    OK(cachalot_host_malloc(a, bytes, &host[k]));
    for (int j = 0; j < k; j++)
      EXPECT(host[k] != host[j] || k >= 4, "[%s] round %d got the block of round %d while its copy may run", conf,
             k, j);
    uint32_t *h = host[k];
    for (size_t i = 0; i < bytes / 4; i++)
      h[i] = (0xC0DE0000u + (uint32_t)k) ^ (uint32_t)i;
    OK(cachalot_malloc(a, 0, bytes, (cachalot_stream)s, &dev[k]));
    EXPECT(cl_test_fill(dev[k], 4096, 0, 300000000ll, s) == 0, "slow kernel"); /* ~0.2 s before the copy */
    CUDA(cudaMemcpyAsync(dev[k], h, bytes, cudaMemcpyHostToDevice, s));
    OK(cachalot_host_record_event(a, host[k], 0, (cachalot_stream)s));
    if (k == 1) /* round 1's block is read on both streams: both must be done */
      OK(cachalot_host_record_event(a, host[k], 0, (cachalot_stream)st[0]));
    OK(cachalot_host_free(a, host[k]));
    CHECKED(a);
    if (k == 3) { /* wait for rounds 0-3: their blocks come back, most recently freed first */
      CUDA(cudaStreamSynchronize(st[0]));
      CUDA(cudaStreamSynchronize(st[1]));
    }
  }
  for (int k = 0; k < ROUNDS; k++) {
    EXPECT(cl_test_verify(dev[k], bytes, 0xC0DE0000u + (uint32_t)k, st[k % 2]) == 0,
           "[%s] round %d's copy read a block overwritten before it was done", conf, k);
    OK(cachalot_free(a, dev[k]));
  }
  cachalot_host_stats hs;
  OK(cachalot_host_memory_stats(a, &hs));
  EXPECT(hs.active_requests.current == 0 && hs.allocations.current == 4 && hs.num_host_alloc == 4,
         "[%s] 4 blocks pinned for 6 rounds, got %lld in use, %lld held, %lld pinnings", conf,
         (long long)hs.active_requests.current, (long long)hs.allocations.current, (long long)hs.num_host_alloc);
  OK(cachalot_host_empty_cache(a));
  OK(cachalot_host_memory_stats(a, &hs));
  EXPECT(hs.allocations.current == 0 && hs.num_host_free == 4, "[%s] empty_cache gives the 4 back", conf);
  CHECKED(a);
  cudaStreamDestroy(st[0]);
  cudaStreamDestroy(st[1]);
}

static void test_pinned(cachalot_allocator *a) {
  current_test = "pinned";
  pinned_round(a, "cudaHostAlloc");
  cachalot_backend *b = NULL;
  cachalot_allocator *r = NULL;
  OK(cachalot_backend_cuda(&b));
  OK(cachalot_create(b, "pinned_use_cuda_host_register:True,pinned_num_register_threads:8", &r));
  pinned_round(r, "cudaHostRegister");
  cachalot_destroy(r);
  cachalot_backend_destroy(b);
}

int main(void) {
  cachalot_backend *b = NULL;
  cachalot_status s = cachalot_backend_cuda(&b);
  if (s != CACHALOT_OK) {
    printf("SKIP: %s\n", cachalot_last_error());
    return 77;
  }
  int n = 0;
  cachalot_allocator *a = NULL;
  if (cachalot_backend_device_count(b, &n) != CACHALOT_OK || cachalot_create(b, "", &a) != CACHALOT_OK) {
    printf("FAIL: %s\n", cachalot_last_error());
    return 1;
  }
  struct cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("gpu suite on %d device(s), device 0: %s\n", n, prop.name);
  cachalot_destroy(a); /* each test gets a fresh allocator: a failing one leaves nothing behind */
  void (*tests[])(cachalot_allocator *) = {test_sizes,  test_reuse_and_streams, test_oom,
                                           test_threads, test_capture_info,      test_expandable,
                                           test_fine_pages, test_pinned};
  const char *names[] = {"sizes",   "reuse_and_streams",     "oom",       "threads",
                         "capture_relaxed_alloc", "expandable", "fine_pages",     "pinned"};
  int passed = 0, ran = 0;
  for (size_t i = 0; i <= sizeof tests / sizeof tests[0]; i++) {
    if (cachalot_create(b, "", &a) != CACHALOT_OK) {
      printf("FAIL: %s\n", cachalot_last_error());
      return 1;
    }
    int before = failures;
    if (i < sizeof tests / sizeof tests[0])
      tests[i](a);
    else
      test_multi_device(a, n);
    cachalot_destroy(a);
    ran++;
    passed += failures == before;
    printf("  %-24s %s\n", i < sizeof tests / sizeof tests[0] ? names[i] : "multi_device",
           failures == before ? "ok" : "FAILED");
  }
  cachalot_backend_destroy(b);
  printf("%d passed, %d failed\n", passed, ran - passed);
  return failures ? 1 : 0;
}
