/* The out-of-memory path of PyTorch's malloc (its last step): count it, tell the observers, and say in words
 * what the device holds (the message is PyTorch's, with cachalot's names). */
#include "internal.h"

#include "../common/c_locale.h"

#include <stdio.h>

/* `n` bytes as PyTorch's OOM message writes them ("N bytes", "%.2f KiB", "%.2f MiB", "%.2f GiB"). */
static void format_size(char *buf, size_t cap, uint64_t n) {
  if (n <= 1024)
    snprintf(buf, cap, "%llu bytes", (unsigned long long)n);
  else if (n <= 1048576)
    cl_snprintf_c(buf, cap, "%.2f KiB", (double)n / 1024.0);
  else if (n <= 1073741824ull)
    cl_snprintf_c(buf, cap, "%.2f MiB", (double)n / 1048576.0);
  else
    cl_snprintf_c(buf, cap, "%.2f GiB", (double)n / 1073741824.0);
}

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

  char tried[32], total_s[32], free_s[32], allowed_s[48] = "", alloc_s[32], priv_s[96] = "", unalloc_s[32];
  format_size(tried, sizeof tried, alloc_size);
  format_size(total_s, sizeof total_s, device_total);
  format_size(free_s, sizeof free_s, device_free);
  if (fraction_set) {
    char tmp[32];
    format_size(tmp, sizeof tmp, allowed);
    snprintf(allowed_s, sizeof allowed_s, "%s allowed; ", tmp);
  }
  format_size(alloc_s, sizeof alloc_s, allocated + in_private);
  if (in_private > 0) {
    char tmp[32];
    format_size(tmp, sizeof tmp, in_private);
    snprintf(priv_s, sizeof priv_s, "with %s allocated in private pools (e.g., CUDA Graphs), ", tmp);
  }
  uint64_t unallocated = reserved > allocated + in_private ? reserved - allocated - in_private : 0;
  format_size(unalloc_s, sizeof unalloc_s, unallocated);
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
