/* Smoke test of the CUDA backend through its ops table, on a real GPU.
 *
 * Standalone (no cmocka) so it can run on the GPU machine with nothing but cudart beside it. Exits 0 on
 * success, 1 on the first failure ("FAIL: ..."), and 77 (meson's skip code) with "SKIP: ..." when
 * there is no usable device, so a GPU-less CI machine reports a skip rather than a failure.
 */
#include "../../src/allocator/backend/ops.h"

#include <cachalot/backend.h>
#include <cachalot/status.h>

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      printf("FAIL: %s:%d: %s: ", __FILE__, __LINE__, #cond);                                     \
      printf(__VA_ARGS__);                                                                        \
      printf(" [last error: %s]\n", cachalot_last_error());                                       \
      fflush(stdout);                                                                             \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

#define CHECK_OK(expr)                                                                            \
  do {                                                                                            \
    cachalot_status st_ = (expr);                                                                 \
    CHECK(st_ == CACHALOT_OK, "%s returned %s", #expr, cachalot_status_name(st_));                \
  } while (0)

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    CHECK(e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(e_));                            \
  } while (0)

enum { MIB = 1 << 20 };

static int current_device(void) {
  int d = -1;
  CHECK_CUDA(cudaGetDevice(&d));
  return d;
}

/* No cachalot failure may leave a cudart error pending for the caller's next check. */
static void check_no_pending_error(const char *where) {
  cudaError_t e = cudaPeekAtLastError();
  CHECK(e == cudaSuccess, "pending CUDA error after %s: %s", where, cudaGetErrorString(e));
}

static void test_devices_and_mem_info(cachalot_backend *b) {
  const cl_backend_ops *ops = b->ops;
  CHECK(strcmp(ops->name, "cuda") == 0, "name is %s", ops->name);
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  CHECK(b->device_count == n && n >= 1, "device_count %d, cudaGetDeviceCount %d", b->device_count, n);
  int count = 0;
  CHECK_OK(cachalot_backend_device_count(b, &count));
  CHECK(count == n, "cachalot_backend_device_count %d", count);
  CHECK_CUDA(cudaSetDevice(0));
  for (int d = 0; d < n; d++) {
    size_t f = 0, t = 0;
    CHECK_OK(ops->mem_info(b, d, &f, &t));
    CHECK(t > 0 && f <= t, "device %d: free %zu total %zu", d, f, t);
    CHECK(current_device() == 0, "mem_info on device %d left device %d current", d, current_device());
    printf("device %d: %zu MiB free of %zu MiB\n", d, f / MIB, t / MIB);
  }
}

static void test_alloc_free(cachalot_backend *b) {
  const cl_backend_ops *ops = b->ops;
  CHECK_CUDA(cudaSetDevice(0));
  for (int d = 0; d < b->device_count; d++) {
    void *p = NULL;
    CHECK_OK(ops->alloc(b, d, MIB, &p));
    CHECK(p != NULL, "alloc returned NULL");
    CHECK(current_device() == 0, "alloc on device %d left device %d current", d, current_device());
    struct cudaPointerAttributes attr;
    CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == d, "pointer is on device %d, type %d",
          attr.device, (int)attr.type);
    CHECK_CUDA(cudaSetDevice(d));
    CHECK_CUDA(cudaMemset(p, 0xab, MIB));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_OK(ops->free(b, d, p));
    CHECK(current_device() == 0, "free on device %d left device %d current", d, current_device());
  }

  void *p = (void *)1;
  cachalot_status st = ops->alloc(b, 0, 0, &p);
  CHECK(st == CACHALOT_ERROR_INVALID_ARGUMENT && p == NULL, "alloc(0): %s", cachalot_status_name(st));

  size_t f = 0, t = 0;
  CHECK_OK(ops->mem_info(b, 0, &f, &t));
  p = (void *)1;
  st = ops->alloc(b, 0, t * 2, &p);
  CHECK(st == CACHALOT_ERROR_OUT_OF_MEMORY, "alloc(2 x total) returned %s", cachalot_status_name(st));
  CHECK(p == NULL, "ptr not cleared on OOM");
  printf("OOM message: %s\n", cachalot_last_error());
  check_no_pending_error("an out-of-memory alloc");
  CHECK_OK(ops->alloc(b, 0, MIB, &p));
  CHECK_OK(ops->free(b, 0, p));
}

static atomic_bool gate_open;

static void CUDART_CB wait_for_gate(void *arg) {
  (void)arg;
  while (!atomic_load(&gate_open))
    sched_yield();
}

static void test_events(cachalot_backend *b) {
  const cl_backend_ops *ops = b->ops;
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  /* A host function holding the stream makes "not done yet" observable without a kernel. */
  atomic_store(&gate_open, false);
  CHECK_CUDA(cudaLaunchHostFunc(s, wait_for_gate, NULL));
  cl_event *e = NULL;
  CHECK_OK(ops->event_record(b, 0, s, &e));
  CHECK(e != NULL, "event_record gave NULL");
  bool done = true;
  CHECK_OK(ops->event_query(b, e, &done));
  CHECK(!done, "event done while its stream is held");
  check_no_pending_error("a not-ready event_query");
  atomic_store(&gate_open, true);
  CHECK_OK(ops->event_sync(b, e));
  CHECK_OK(ops->event_query(b, e, &done));
  CHECK(done, "event not done after event_sync");
  ops->event_release(b, e);

  /* The pool hands the released event back, here on the legacy default stream. */
  cl_event *e2 = NULL;
  CHECK_OK(ops->event_record(b, 0, NULL, &e2));
  CHECK(e2 == e, "released event was not reused");
  CHECK_OK(ops->event_sync(b, e2));
  CHECK_OK(ops->event_query(b, e2, &done));
  CHECK(done, "default-stream event not done after sync");
  ops->event_release(b, e2);

  if (b->device_count > 1) {
    int last = b->device_count - 1;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_OK(ops->event_record(b, last, NULL, &e));
    CHECK(current_device() == 0, "event_record on device %d changed the current device", last);
    CHECK_OK(ops->event_sync(b, e));
    ops->event_release(b, e);
  }
  CHECK_CUDA(cudaStreamDestroy(s));
}

static void end_capture(cudaStream_t s) {
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* an invalidated capture ends with an error, by design */
  if (g)
    CHECK_CUDA(cudaGraphDestroy(g));
}

static void test_capture(cachalot_backend *b) {
  const cl_backend_ops *ops = b->ops;
  CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t s, other;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));

  bool capturing = true;
  uint64_t id = 1;
  CHECK_OK(ops->stream_capture_info(b, 0, s, &capturing, &id));
  CHECK(!capturing && id == 0, "idle stream: capturing %d id %llu", capturing, (unsigned long long)id);
  CHECK_OK(ops->stream_capture_info(b, 0, NULL, &capturing, &id));
  CHECK(!capturing && id == 0, "legacy stream: capturing %d", capturing);

  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CHECK_OK(ops->stream_capture_info(b, 0, s, &capturing, &id));
  CHECK(capturing && id != 0, "capturing stream: capturing %d id %llu", capturing,
        (unsigned long long)id);
  uint64_t first_id = id;
  CHECK_OK(ops->stream_capture_info(b, 0, other, &capturing, &id));
  CHECK(!capturing && id == 0, "other stream: capturing %d", capturing);

  /* This thread's mode is GLOBAL, so cudaMalloc is refused while its own capture runs. */
  void *p = (void *)1;
  cachalot_status st = ops->alloc(b, 0, MIB, &p);
  CHECK(st == CACHALOT_ERROR_DEVICE && p == NULL, "alloc during capture: %s", cachalot_status_name(st));
  CHECK(strstr(cachalot_last_error(), "operation not permitted when stream is capturing") != NULL,
        "message lacks CUDA's words");
  printf("alloc during capture: %s\n", cachalot_last_error());
  check_no_pending_error("an alloc refused by capture");
  CHECK_OK(ops->stream_capture_info(b, 0, s, &capturing, &id));
  /* A refused cudaMalloc invalidates the capture (CUDA 13), and CUDA gives no id for that. */
  CHECK(capturing, "stream no longer reported capturing after a refused alloc");
  printf("after the refused alloc: id %llu (was %llu)\n", (unsigned long long)id,
         (unsigned long long)first_id);

  cachalot_capture_mode mode = CACHALOT_CAPTURE_RELAXED;
  CHECK_OK(ops->capture_mode_exchange(b, &mode));
  CHECK(mode == CACHALOT_CAPTURE_GLOBAL, "previous mode %d, expected GLOBAL", (int)mode);
  void *relaxed = NULL;
  CHECK_OK(ops->alloc(b, 0, MIB, &relaxed));
  mode = CACHALOT_CAPTURE_THREAD_LOCAL;
  CHECK_OK(ops->capture_mode_exchange(b, &mode));
  CHECK(mode == CACHALOT_CAPTURE_RELAXED, "previous mode %d, expected RELAXED", (int)mode);
  mode = CACHALOT_CAPTURE_GLOBAL;
  CHECK_OK(ops->capture_mode_exchange(b, &mode));
  CHECK(mode == CACHALOT_CAPTURE_THREAD_LOCAL, "previous mode %d, expected THREAD_LOCAL", (int)mode);
  mode = (cachalot_capture_mode)42;
  st = ops->capture_mode_exchange(b, &mode);
  CHECK(st == CACHALOT_ERROR_INVALID_ARGUMENT, "bad mode: %s", cachalot_status_name(st));
  end_capture(s);
  CHECK_OK(ops->free(b, 0, relaxed));

  /* An invalidated capture still counts as capturing until it is ended. */
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CHECK(cudaStreamSynchronize(s) != cudaSuccess, "synchronizing a capturing stream succeeded");
  (void)cudaGetLastError();
  enum cudaStreamCaptureStatus raw = cudaStreamCaptureStatusNone;
  CHECK_CUDA(cudaStreamIsCapturing(s, &raw));
  CHECK_OK(ops->stream_capture_info(b, 0, s, &capturing, &id));
  CHECK(capturing, "invalidated capture reported as not capturing (raw status %d)", (int)raw);
  CHECK(raw == cudaStreamCaptureStatusInvalidated, "raw status %d, expected invalidated", (int)raw);
  CHECK(id == 0, "invalidated capture reported id %llu", (unsigned long long)id);
  end_capture(s);
  CHECK_OK(ops->stream_capture_info(b, 0, s, &capturing, &id));
  CHECK(!capturing && id == 0, "ended capture still reported capturing");

  /* The legacy stream cannot be asked while a blocking stream of its device captures. */
  cudaStream_t blocking;
  CHECK_CUDA(cudaStreamCreate(&blocking));
  CHECK_CUDA(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed));
  st = ops->stream_capture_info(b, 0, NULL, &capturing, &id);
  printf("legacy stream during a blocking capture: %s: %s\n", cachalot_status_name(st),
         st == CACHALOT_OK ? "" : cachalot_last_error());
  CHECK(st == CACHALOT_ERROR_DEVICE || (st == CACHALOT_OK && capturing), "legacy stream: %s, capturing %d",
        cachalot_status_name(st), capturing);
  check_no_pending_error("a legacy-stream capture query");
  CHECK_CUDA(cudaStreamIsCapturing(blocking, &raw));
  CHECK(raw == cudaStreamCaptureStatusActive, "querying the legacy stream broke the capture (%d)", (int)raw);
  end_capture(blocking);

  CHECK_CUDA(cudaStreamDestroy(blocking));
  CHECK_CUDA(cudaStreamDestroy(other));
  CHECK_CUDA(cudaStreamDestroy(s));
}

enum { THREADS = 4, ITERS = 2000 };

typedef struct {
  cachalot_backend *b;
  int device;
} worker_arg;

static void *worker(void *arg) {
  cachalot_backend *b = ((worker_arg *)arg)->b;
  const cl_backend_ops *ops = b->ops;
  int dev = ((worker_arg *)arg)->device;
  cudaStream_t s;
  CHECK_CUDA(cudaSetDevice(dev));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cl_event *held[8] = {0};
  for (int i = 0; i < ITERS; i++) {
    int k = i % 8;
    if (held[k]) {
      bool done = false;
      CHECK_OK(ops->event_query(b, held[k], &done));
      if (!done)
        CHECK_OK(ops->event_sync(b, held[k]));
      ops->event_release(b, held[k]);
      held[k] = NULL;
    }
    CHECK_OK(ops->event_record(b, dev, s, &held[k]));
    if (i % 100 == 0) {
      void *p = NULL;
      CHECK_OK(ops->alloc(b, dev, 64 * 1024, &p));
      CHECK_OK(ops->free(b, dev, p));
    }
  }
  for (int k = 0; k < 8; k++)
    if (held[k]) {
      CHECK_OK(ops->event_sync(b, held[k]));
      ops->event_release(b, held[k]);
    }
  CHECK_CUDA(cudaStreamDestroy(s));
  return NULL;
}

static void test_threads(cachalot_backend *b) {
  pthread_t t[THREADS];
  worker_arg args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (worker_arg){b, i % b->device_count};
    CHECK(pthread_create(&t[i], NULL, worker, &args[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < THREADS; i++)
    CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
}

/* Virtual memory: a reservation backed page by page, written and read across a page boundary, a map too
 * large for the device refused as out of memory, then everything given back. */
static void test_vmm(cachalot_backend *b) {
  const cl_backend_ops *ops = b->ops;
  size_t g = 0;
  CHECK_OK(ops->va_granularity(b, 0, &g));
  CHECK(g > 0 && (g & (g - 1)) == 0 && g <= ((size_t)2 << 20), "granularity %zu", g);
  size_t f0 = 0, t = 0, f1 = 0;
  CHECK_OK(ops->mem_info(b, 0, &f0, &t));
  const size_t page = (size_t)2 << 20, reserved = 32 * page;
  void *base = NULL;
  CHECK_OK(ops->va_reserve(b, 0, reserved, &base));
  CHECK(base != NULL && (uintptr_t)base % page == 0, "reservation at %p", base);
  CHECK_OK(ops->va_map(b, 0, base, page));
  CHECK_OK(ops->va_map(b, 0, (char *)base + page, 10 * page));
  CHECK_OK(ops->mem_info(b, 0, &f1, &t));
  CHECK(f0 - f1 >= 11 * page, "11 pages mapped, free went from %zu to %zu", f0, f1);
  /* across the boundary of the two mappings */
  enum { N = 1 << 20 };
  unsigned *host = malloc(N * sizeof *host), *back = malloc(N * sizeof *back);
  CHECK(host && back, "host memory");
  for (unsigned i = 0; i < N; i++)
    host[i] = i * 2654435761u;
  char *at = (char *)base + page - N * sizeof(unsigned) / 2;
  CHECK_CUDA(cudaMemcpy(at, host, N * sizeof *host, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(back, at, N * sizeof *back, cudaMemcpyDeviceToHost));
  CHECK(memcmp(host, back, N * sizeof *host) == 0, "data read back through the mappings differs");
  free(host);
  free(back);
  /* more than the device has: out of memory, nothing left mapped */
  void *huge = NULL;
  const size_t too_much = (t / page + 8) * page;
  CHECK_OK(ops->va_reserve(b, 0, too_much, &huge));
  cachalot_status st = ops->va_map(b, 0, huge, too_much);
  CHECK(st == CACHALOT_ERROR_OUT_OF_MEMORY, "mapping %zu bytes returned %s (%s)", too_much, cachalot_status_name(st),
        cachalot_last_error());
  check_no_pending_error("a map refused as out of memory");
  CHECK_OK(ops->va_release(b, 0, huge, too_much));
  CHECK_OK(ops->va_unmap(b, 0, (char *)base + page, 10 * page));
  CHECK_OK(ops->va_unmap(b, 0, base, page));
  CHECK_OK(ops->va_release(b, 0, base, reserved));
  CHECK(current_device() == 0, "the VMM calls left device %d current", current_device());
  check_no_pending_error("the VMM calls");
}

int main(void) {
  cachalot_backend *b = (cachalot_backend *)1;
  cachalot_status st = cachalot_backend_cuda(&b);
  if (st == CACHALOT_ERROR_DEVICE) {
    CHECK(b == NULL, "out not cleared on failure");
    printf("SKIP: %s\n", cachalot_last_error());
    return 77;
  }
  CHECK(st == CACHALOT_OK, "cachalot_backend_cuda returned %s", cachalot_status_name(st));
  CHECK(b != NULL && b->ops != NULL, "no backend");

  test_devices_and_mem_info(b);
  test_alloc_free(b);
  test_events(b);
  test_capture(b);
  test_threads(b);
  test_vmm(b);
  check_no_pending_error("the whole run");

  cachalot_backend_destroy(b);
  printf("PASS\n");
  return 0;
}
