/* memory_stats and its resets (torch.cuda.memory_stats()). The counters themselves are updated in place by
 * the allocator (cl_stat_array_add); this file reads and resets them. */
#include "../allocator/internal.h"

#include <string.h>

static void stat_reset_peak(cachalot_stat *s) { s->peak = s->current; }

static void stat_reset_accumulated(cachalot_stat *s) { s->allocated = s->freed = 0; }

/* Applies `fn` to every cachalot_stat of the struct. */
static void for_each_stat(cachalot_device_stats *st, void (*fn)(cachalot_stat *)) {
#define ARRAY(name) st->name,
  cachalot_stat *arrays[] = {CL_STAT_ARRAYS(ARRAY)};
#undef ARRAY
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
    for (int k = 0; k < CACHALOT_STAT_TYPES; k++)
      fn(&arrays[i][k]);
  fn(&st->oversize_allocations);
  fn(&st->oversize_segments);
}

cachalot_status cachalot_memory_stats(cachalot_allocator *a, int device, cachalot_device_stats *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_memory_stats: out is NULL");
  memset(out, 0, sizeof *out);
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_memory_stats", &d);
  if (rc != CACHALOT_OK)
    return rc;
  *out = d->stats;
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_plan_stats_get(cachalot_allocator *a, int device, cachalot_plan_stats *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_plan_stats_get: out is NULL");
  memset(out, 0, sizeof *out);
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_plan_stats_get", &d);
  if (rc != CACHALOT_OK)
    return rc;
  cl_plan_stats_locked(d, out);
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_reset_peak_stats(cachalot_allocator *a, int device) {
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_reset_peak_stats", &d);
  if (rc != CACHALOT_OK)
    return rc;
  for_each_stat(&d->stats, stat_reset_peak);
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_reset_accumulated_stats(cachalot_allocator *a, int device) {
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_reset_accumulated_stats", &d);
  if (rc != CACHALOT_OK)
    return rc;
  cachalot_device_stats *st = &d->stats;
  for_each_stat(st, stat_reset_accumulated);
  st->num_alloc_retries = st->num_ooms = st->num_sync_all_streams = 0;
  st->num_device_alloc = st->num_device_free = 0;
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

