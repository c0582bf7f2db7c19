/* The GPU soak (issue 8): several threads, each with two streams of its own, allocate, fill every block
 * with a pattern tied to its owner (thread and sequence number) by a kernel on the allocation stream,
 * hand some blocks to their second stream (a slow kernel there rewrites the same pattern, then
 * record_stream), free them, and capture small CUDA graphs into private pools and replay them. Before a
 * block is freed by its owner its pattern is verified on the device; any reuse of memory still in use
 * (by a kernel on either stream) shows up as a wrong pattern in some block. At the end everything is
 * freed: empty_cache must give the device all of it back (reserved 0, cudaMemGetInfo where it started).
 *
 *   soak SECONDS [CONF]   (exit 77 without a GPU; prints corruptions, leaks and counts, exits 1 on any)
 */
#include <cachalot/cachalot.h>

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_test.h"

enum { THREADS = 4, LIVE = 24 };

static cachalot_allocator *alloc;
static double deadline;
static _Atomic long corruptions, ops, graphs, cross_uses, ooms, errors;
static cudaStream_t streams_of[THREADS][2];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static void error(const char *what, int thread) {
  atomic_fetch_add(&errors, 1);
  printf("thread %d: %s failed: %s\n", thread, what, cachalot_last_error());
}

typedef struct {
  void *p;
  size_t bytes;
  uint32_t pattern;
} block;

/* Verifies b on stream s (synchronizing it); counts a corruption if any word is wrong. */
static void check_block(const block *b, cudaStream_t s, int thread) {
  long long bad = cl_test_verify(b->p, b->bytes, b->pattern, s);
  if (bad != 0) {
    atomic_fetch_add(&corruptions, 1);
    printf("thread %d: block %p (%zu B, pattern %08x): %lld wrong words\n", thread, b->p, b->bytes, b->pattern, bad);
  }
}

/* A graph captured on s into a private pool: a block allocated inside the capture is filled by a captured
 * kernel, the graph is replayed, and the block (the graph's output) holds the pattern afterwards. */
static void graph_round(int thread, cudaStream_t s, uint32_t pattern) {
  cachalot_graph *g = NULL;
  if (cachalot_graph_create(alloc, 0, false, &g) != CACHALOT_OK) {
    error("graph_create", thread);
    return;
  }
  block out = {NULL, 4 * MiB, pattern};
  if (cachalot_graph_capture_begin(g, (cachalot_stream)s, (cachalot_mempool_id){0, 0},
                                   CACHALOT_CAPTURE_THREAD_LOCAL) != CACHALOT_OK) {
    error("capture_begin", thread);
    cachalot_graph_destroy(g);
    return;
  }
  void *tmp = NULL;
  bool ok = cachalot_malloc(alloc, 0, out.bytes, (cachalot_stream)s, &out.p) == CACHALOT_OK &&
            cachalot_malloc(alloc, 0, 1 * MiB, (cachalot_stream)s, &tmp) == CACHALOT_OK;
  if (ok) {
    cl_test_fill(tmp, 1 * MiB, ~pattern, 0, s);
    cl_test_fill(out.p, out.bytes, pattern, 0, s);
    ok = cachalot_free(alloc, tmp) == CACHALOT_OK; /* a temporary of the graph */
  }
  if (cachalot_graph_capture_end(g) != CACHALOT_OK || !ok) {
    error("capture", thread);
    cachalot_graph_destroy(g);
    return;
  }
  for (int r = 0; r < 3; r++)
    if (cachalot_graph_replay(g, (cachalot_stream)s) != CACHALOT_OK)
      error("graph_replay", thread);
  check_block(&out, s, thread);
  if (cachalot_free(alloc, out.p) != CACHALOT_OK)
    error("free of a graph output", thread);
  if (cachalot_graph_reset(g) != CACHALOT_OK)
    error("graph_reset", thread);
  cachalot_graph_destroy(g);
  atomic_fetch_add(&graphs, 1);
}

static void *worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  cudaStream_t own, other;
  if (cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) != cudaSuccess) {
    atomic_fetch_add(&errors, 1);
    return NULL;
  }
  block live[LIVE];
  memset(live, 0, sizeof live);
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  uint32_t seq = 0;
  while (now() < deadline) {
    const uint64_t r = rnd(&x);
    const int k = (int)(r % LIVE);
    const unsigned what = (unsigned)((r >> 8) % 100);
    atomic_fetch_add(&ops, 1);
    if (what < 2) {
      graph_round(id, own, ((uint32_t)id << 28) | (seq++ & 0x0FFFFFFFu));
    } else if (what < 3) {
      if (cachalot_empty_cache(alloc) != CACHALOT_OK)
        error("empty_cache", id);
    } else if (live[k].p) {
      if ((r >> 16) % 4 == 0) {
        /* cross-stream use: a slow kernel on the other stream rewrites the pattern; the block may not be
         * reused until it is done */
        cl_test_fill(live[k].p, live[k].bytes, live[k].pattern, 20000 + (long long)((r >> 20) % 200000), other);
        if (cachalot_record_stream(alloc, live[k].p, (cachalot_stream)other) != CACHALOT_OK)
          error("record_stream", id);
        atomic_fetch_add(&cross_uses, 1);
      } else {
        check_block(&live[k], own, id);
      }
      if (cachalot_free(alloc, live[k].p) != CACHALOT_OK)
        error("free", id);
      live[k].p = NULL;
    } else {
      const unsigned shift = (unsigned)((r >> 24) % 25); /* 1 B .. 32 MiB */
      const size_t bytes = ((size_t)1 << shift) + ((r >> 32) % ((size_t)1 << shift));
      block b = {NULL, bytes & ~(size_t)3, ((uint32_t)id << 28) | (seq++ & 0x0FFFFFFFu)};
      cachalot_status rc = cachalot_malloc(alloc, 0, bytes, (cachalot_stream)own, &b.p);
      if (rc == CACHALOT_ERROR_OUT_OF_MEMORY) {
        atomic_fetch_add(&ooms, 1);
        continue;
      }
      if (rc != CACHALOT_OK) {
        error("malloc", id);
        continue;
      }
      cl_test_fill(b.p, b.bytes, b.pattern, 0, own);
      live[k] = b;
    }
  }
  for (int k = 0; k < LIVE; k++)
    if (live[k].p) {
      check_block(&live[k], own, id);
      if (cachalot_free(alloc, live[k].p) != CACHALOT_OK)
        error("final free", id);
    }
  cudaStreamSynchronize(own);
  cudaStreamSynchronize(other);
  /* Not destroyed here: a block used on `other` and freed while another thread was capturing waits for
   * the end of that capture before its event is recorded, on `other` (PyTorch's private pools). main destroys
   * the streams after the final empty_cache. (The first runs destroyed them here and crashed in the driver
   * now and then: an event recorded on a destroyed stream.) */
  streams_of[id][0] = own;
  streams_of[id][1] = other;
  return NULL;
}

/* A crash (inside the CUDA driver, say) prints the stack that led there. */
static void on_crash(int sig) {
  void *frames[64];
  const int n = backtrace(frames, 64);
  static const char msg[] = "soak: crashed; stack:\n";
  (void)!write(2, msg, sizeof msg - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

int main(int argc, char **argv) {
  signal(SIGSEGV, on_crash);
  signal(SIGABRT, on_crash);
  setvbuf(stdout, NULL, _IOLBF, 0); /* a finding is printed even if the process dies after it */
  (void)failures; /* gpu_test.h's harness is not used here */
  (void)current_test;
  const double seconds = argc > 1 ? atof(argv[1]) : 30;
  const char *conf = argc > 2 ? argv[2] : "";
  cachalot_backend *b = NULL;
  if (cachalot_backend_cuda(&b) != CACHALOT_OK) {
    printf("SKIP: %s\n", cachalot_last_error());
    return 77;
  }
  size_t free0 = 0, total = 0;
  cudaSetDevice(0);
  cudaFree(NULL);
  cudaMemGetInfo(&free0, &total);
  if (cachalot_create(b, conf, &alloc) != CACHALOT_OK) {
    printf("FAIL: %s\n", cachalot_last_error());
    return 1;
  }
  deadline = now() + seconds;
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  cachalot_device_stats st = {0};
  const bool checked = cachalot_check(alloc) == CACHALOT_OK;
  if (cachalot_empty_cache(alloc) != CACHALOT_OK)
    error("final empty_cache", -1);
  if (cachalot_memory_stats(alloc, 0, &st) != CACHALOT_OK)
    error("memory_stats", -1);
  cudaDeviceSynchronize();
  for (int i = 0; i < THREADS; i++)
    for (int k = 0; k < 2; k++)
      if (streams_of[i][k])
        cudaStreamDestroy(streams_of[i][k]);
  size_t free1 = 0;
  cudaMemGetInfo(&free1, &total);
  const long long leaked = (long long)st.reserved_bytes[0].current;
  printf("soak '%s', %.0f s, %d threads x 2 streams: %ld ops, %ld graphs, %ld cross-stream uses, %ld OOMs, "
         "%lld device allocs, %lld device frees, peak reserved %.1f MiB; corruptions %ld, errors %ld, "
         "reserved after empty_cache %lld B, device free %zu -> %zu MiB, check %s\n",
         conf, seconds, THREADS, (long)ops, (long)graphs, (long)cross_uses, (long)ooms,
         (long long)st.num_device_alloc, (long long)st.num_device_free,
         (double)st.reserved_bytes[0].peak / (double)MiB, (long)corruptions, (long)errors, leaked, free0 / MiB,
         free1 / MiB, checked ? "ok" : cachalot_last_error());
  cachalot_destroy(alloc);
  cachalot_backend_destroy(b);
  const bool pass = corruptions == 0 && errors == 0 && leaked == 0 && checked && free1 + 16 * MiB >= free0;
  printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
