/* Pinning host memory for the host cache, the two ways PyTorch does: cudaHostAlloc, or (the config's
 * pinned_use_cuda_host_register) ordinary memory whose pages threads touch first and cudaHostRegister then
 * locks. Touching first is why the second way exists: registration of pages already backed costs the
 * driver less, and several threads back a large block sooner than one. */
#include "host_pin.h"

#include "../../common/error.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

enum { TOUCH_PAGE = 4096 }; /* the pages touched: 4 KiB, PyTorch's (a larger page is touched more than once) */

typedef struct {
  volatile char *base;
  size_t lo, hi; /* the bytes [lo, hi) of base this thread touches */
} touch_job;

static void *touch(void *arg) {
  const touch_job *j = arg;
  for (size_t at = j->lo; at < j->hi; at += TOUCH_PAGE)
    j->base[at] = 0;
  return NULL;
}

/* Touches every page of [p, p + size) with `threads` threads, each a contiguous share of whole pages;
 * one thread below `threads` pages. A thread that cannot be started has its share touched here. */
static void touch_pages(char *p, size_t size, unsigned threads) {
  const size_t pages = (size + TOUCH_PAGE - 1) / TOUCH_PAGE;
  if (threads < 2 || pages < threads) {
    touch(&(touch_job){p, 0, size});
    return;
  }
  touch_job jobs[CL_MAX_REGISTER_THREADS];
  pthread_t tid[CL_MAX_REGISTER_THREADS];
  bool started[CL_MAX_REGISTER_THREADS] = {false};
  const size_t share = (pages + threads - 1) / threads * TOUCH_PAGE;
  for (unsigned i = 0; i < threads; i++) {
    size_t lo = (size_t)i * share, hi = lo + share;
    jobs[i] = (touch_job){p, lo < size ? lo : size, hi < size ? hi : size};
    if (i > 0)
      started[i] = pthread_create(&tid[i], NULL, touch, &jobs[i]) == 0;
  }
  touch(&jobs[0]);
  for (unsigned i = 1; i < threads; i++) {
    if (started[i])
      pthread_join(tid[i], NULL);
    else
      touch(&jobs[i]);
  }
}

/* cudaHostAlloc and cudaHostRegister are calls CUDA refuses while any stream captures in global mode, and
 * the refusal invalidates that capture; PyTorch pins during captures (a graph may copy from pinned
 * memory), and cachalot is not always told of a capture. So the thread pins in relaxed mode, as
 * device_alloc_locked allocates. */
static cachalot_status pin_relaxed(cachalot_backend *b, void **ptr, size_t size, bool use_register) {
  cachalot_capture_mode mode = CACHALOT_CAPTURE_RELAXED;
  cachalot_status rc = b->ops->capture_mode_exchange(b, &mode);
  if (rc != CACHALOT_OK)
    return rc;
  rc = use_register ? b->ops->host_register(b, *ptr, size) : b->ops->host_alloc(b, size, ptr);
  cachalot_capture_mode prev = mode;
  (void)b->ops->capture_mode_exchange(b, &prev);
  return rc;
}

cachalot_status cl_host_pin(cachalot_backend *b, size_t size, bool use_register, unsigned threads, void **ptr) {
  *ptr = NULL;
  if (!use_register)
    return pin_relaxed(b, ptr, size, false);
  void *p = NULL;
  /* aligned to the host's page: registration locks whole pages, so the block shares none with other memory */
  const long page = sysconf(_SC_PAGESIZE);
  const size_t align = page > TOUCH_PAGE ? (size_t)page : TOUCH_PAGE;
  if (size > SIZE_MAX - align || posix_memalign(&p, align, size) != 0)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory: cannot allocate %zu bytes to register",
                   size);
  touch_pages(p, size, threads > CL_MAX_REGISTER_THREADS ? CL_MAX_REGISTER_THREADS : threads);
  cachalot_status rc = pin_relaxed(b, &p, size, true);
  if (rc != CACHALOT_OK) {
    free(p);
    return rc;
  }
  *ptr = p;
  return CACHALOT_OK;
}

cachalot_status cl_host_unpin(cachalot_backend *b, void *ptr, bool registered) {
  if (!registered)
    return b->ops->host_free(b, ptr);
  cachalot_status rc = b->ops->host_unregister(b, ptr);
  if (rc == CACHALOT_OK)
    free(ptr);
  return rc;
}
