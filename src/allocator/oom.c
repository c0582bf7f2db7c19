/* The out-of-memory path of PyTorch's malloc (its last step): count it, tell the observers, and say in words
 * what the device holds (the message is PyTorch's, with cachalot's names). */
#include "internal.h"

#include "../common/text.h"

#include <stdio.h>

cachalot_status cl_out_of_memory_unlock(cl_device *d, size_t alloc_size) {
  cachalot_allocator *a = d->owner;
  d->stats.num_ooms++;
  const bool fraction_set = d->fraction >= 0;
  cl_fraction_resolve_locked(d);
  const size_t allowed = d->allowed_max;
  const uint64_t allocated = (uint64_t)d->stats.allocated_bytes[CACHALOT_STAT_ALL].current;
  const uint64_t reserved = (uint64_t)d->stats.reserved_bytes[CACHALOT_STAT_ALL].current;
  const uint64_t in_private = cl_private_pool_free_bytes_locked(d);
  cl_leave_exclusive(d);

  cachalot_backend *b = a->backend;
  size_t device_free = 0, device_total = 0;
  if (b->ops->mem_info(b, d->index, &device_free, &device_total) != CACHALOT_OK)
    device_free = device_total = 0;
  cl_enter_exclusive(d);
  cl_trace_locked(d, CL_TRACE_OOM, device_free, alloc_size, NULL);
  cl_leave_exclusive(d);

  /* Observers run with no allocator lock held (they may allocate, or take their own locks). The list
   * only grows, so each entry is read under the lock and called without it; one attached meanwhile is
   * not called for this failure. */
  pthread_mutex_lock(&a->meta_lock);
  const size_t n = a->n_observers;
  pthread_mutex_unlock(&a->meta_lock);
  /* What an observer allocates is its own: the failing call's context does not go with it. */
  void *const alloc_ctx = cl_tls_alloc_ctx;
  cl_tls_alloc_ctx = NULL;
  for (size_t i = 0; i < n; i++) {
    pthread_mutex_lock(&a->meta_lock);
    cl_observer o = a->observers[i];
    pthread_mutex_unlock(&a->meta_lock);
    o.fn(d->index, alloc_size, fraction_set ? allowed : device_total, device_free, o.ctx);
  }
  cl_tls_alloc_ctx = alloc_ctx;

  /* PyTorch's units and rounding, to the byte: programs parse this message */
  char tried[CL_BYTES_BUF], total_s[CL_BYTES_BUF], free_s[CL_BYTES_BUF], allowed_s[48] = "", alloc_s[CL_BYTES_BUF],
      priv_s[96] = "", unalloc_s[CL_BYTES_BUF];
  cl_format_bytes(tried, alloc_size, CL_BYTES_TORCH);
  cl_format_bytes(total_s, device_total, CL_BYTES_TORCH);
  cl_format_bytes(free_s, device_free, CL_BYTES_TORCH);
  if (fraction_set) {
    char tmp[CL_BYTES_BUF];
    cl_format_bytes(tmp, allowed, CL_BYTES_TORCH);
    snprintf(allowed_s, sizeof allowed_s, "%s allowed; ", tmp);
  }
  cl_format_bytes(alloc_s, allocated + in_private, CL_BYTES_TORCH);
  if (in_private > 0) {
    char tmp[CL_BYTES_BUF];
    cl_format_bytes(tmp, in_private, CL_BYTES_TORCH);
    snprintf(priv_s, sizeof priv_s, "with %s allocated in private pools (e.g., CUDA Graphs), ", tmp);
  }
  uint64_t unallocated = reserved > allocated + in_private ? reserved - allocated - in_private : 0;
  cl_format_bytes(unalloc_s, unallocated, CL_BYTES_TORCH);
  (void)cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY,
                 "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is "
                 "free. %sOf the allocated memory %s is allocated by cachalot, %sand %s is reserved by cachalot "
                 "but unallocated. If reserved but unallocated memory is large try setting "
                 "CACHALOT_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
                 tried, d->index, total_s, free_s, allowed_s, alloc_s, priv_s, unalloc_s);
  if (a->on_oom)
    a->on_oom(a);
  return CACHALOT_ERROR_OUT_OF_MEMORY;
}
