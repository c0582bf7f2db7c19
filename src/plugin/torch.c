/* libcachalot_torch: PyTorch's pluggable-allocator ABI (torch.cuda.memory.CUDAPluggableAllocator) over
 * cachalot's process-wide allocator (cachalot_default: the CUDA backend, $CACHALOT_ALLOC_CONF).
 *
 * PyTorch's Python plug-in path tells an allocator nothing but malloc and free: not about graph captures,
 * not about record_stream. So capture detection (detect_captures) is turned on unless the config names
 * the key itself, and every malloc of a capture goes to a private pool of that capture. python/
 * cachalot_torch.py installs this library and reads cachalot's stats and snapshots through ctypes. */
#include "plugin.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>

/* cudaStream_t without the CUDA headers: the ABI is a pointer either way. */
typedef struct CUstream_st *cudaStream_t;

#define EXPORT __attribute__((visibility("default")))

EXPORT void *cachalot_torch_malloc(ssize_t size, int device, cudaStream_t stream);
EXPORT void cachalot_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream);
EXPORT cachalot_allocator *cachalot_torch_allocator(void);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cachalot_allocator *allocator;

static void init(void) { allocator = cl_plugin_allocator("cachalot_torch"); }

/* The allocator the plug-in uses (NULL when the CUDA backend could not start; the reason went to stderr). */
cachalot_allocator *cachalot_torch_allocator(void) {
  pthread_once(&once, init);
  return allocator;
}

void *cachalot_torch_malloc(ssize_t size, int device, cudaStream_t stream) {
  cachalot_allocator *a = cachalot_torch_allocator();
  if (!a || size <= 0)
    return NULL;
  void *p = NULL;
  cachalot_status rc = cachalot_malloc(a, device, (size_t)size, (cachalot_stream)stream, &p);
  if (rc != CACHALOT_OK) /* PyTorch turns NULL into its out-of-memory error; this says why */
    fprintf(stderr, "cachalot_torch: malloc of %zd bytes on device %d: %s\n", size, device, cachalot_last_error());
  return p;
}

void cachalot_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)size, (void)device, (void)stream;
  cachalot_allocator *a = cachalot_torch_allocator();
  if (a && cachalot_free(a, ptr) != CACHALOT_OK)
    fprintf(stderr, "cachalot_torch: free(%p): %s\n", ptr, cachalot_last_error());
}
