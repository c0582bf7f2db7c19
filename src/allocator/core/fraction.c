/* The memory fraction (set_per_process_memory_fraction): the cap on reserved bytes as a share of the
 * device's total, resolved once per device from the backend, and the check every new segment or mapped
 * page passes. */
#include "core.h"

void cl_fraction_resolve_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->total_known || d->fraction < 0)
    return;
  cachalot_backend *b = d->owner->backend;
  size_t free_bytes = 0, total = 0;
  if (b->ops->mem_info(b, d->index, &free_bytes, &total) != CACHALOT_OK)
    return; /* allowed_max stays 0: every new segment is refused, which is the safe side */
  d->allowed_max = cl_scale_bytes(d->fraction, total);
  d->total_known = true;
}

cachalot_status cl_fraction_admit_locked(cl_device *d, size_t bytes) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->fraction < 0)
    return CACHALOT_OK;
  cl_fraction_resolve_locked(d);
  const size_t reserved = (size_t)d->stats.reserved_bytes[CACHALOT_STAT_ALL].current + d->inflight;
  if (reserved + bytes > d->allowed_max)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "memory fraction limit reached");
  return CACHALOT_OK;
}

cachalot_status cachalot_set_memory_fraction(cachalot_allocator *a, int device, double fraction) {
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_set_memory_fraction");
  if (rc != CACHALOT_OK)
    return rc;
  if (!(fraction >= 0.0 && fraction <= 1.0))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_set_memory_fraction: fraction %g is outside [0, 1]", fraction);
  cl_device *d = &a->devices[device];
  cachalot_backend *b = a->backend;
  size_t free_bytes = 0, total = 0;
  rc = b->ops->mem_info(b, device, &free_bytes, &total);
  if (rc != CACHALOT_OK) {
    cl_error_prefix("cachalot_set_memory_fraction: ");
    return rc;
  }
  cl_enter_exclusive(d);
  d->fraction = fraction;
  d->allowed_max = cl_scale_bytes(fraction, total);
  d->total_known = true;
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_get_memory_fraction(cachalot_allocator *a, int device, double *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_get_memory_fraction: out is NULL");
  *out = 0.0;
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_get_memory_fraction");
  if (rc != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  cl_lock_device(d);
  *out = d->fraction < 0 ? 1.0 : d->fraction;
  cl_unlock_device(d);
  return CACHALOT_OK;
}
