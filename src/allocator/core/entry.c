/* The entry points' first steps, shared by every file that has entry points: the argument checks, the
 * forked child's error, and the opening of a device, or of the device of a block, in exclusive mode. */
#include "core.h"

#include <inttypes.h>

cachalot_status cl_check_allocator_arg(const cachalot_allocator *a, const char *fn) {
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", fn);
  if (cl_forked(a))
    return cl_forked_fail(fn);
  return CACHALOT_OK;
}

cachalot_status cl_check_device_arg(const cachalot_allocator *a, int device, const char *fn) {
  cachalot_status rc = cl_check_allocator_arg(a, fn);
  if (rc != CACHALOT_OK)
    return rc;
  if (device < 0 || device >= a->device_count)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range (the backend has %d device%s)",
                   fn, device, a->device_count, a->device_count == 1 ? "" : "s");
  return CACHALOT_OK;
}

cachalot_status cl_enter_device(cachalot_allocator *a, int device, const char *fn, cl_device **d) {
  cachalot_status rc = cl_check_device_arg(a, device, fn);
  if (rc != CACHALOT_OK)
    return rc;
  *d = &a->devices[device];
  cl_enter_exclusive(*d);
  return CACHALOT_OK;
}

cachalot_status cl_forked_fail(const char *who) {
  return cl_fail(CACHALOT_ERROR_DEVICE,
                 "%s: this process was forked after cachalot was used; CUDA cannot be used in a forked child "
                 "(start the child with spawn, or fork before using CUDA)", who);
}

bool cl_address_is_ours(cachalot_allocator *a, const void *ptr) {
  const uintptr_t key = (uintptr_t)ptr;
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    bool ours = false;
    cl_enter_exclusive(d);
    for (const cl_segment *s = d->segments; s && !ours; s = s->next)
      ours = key - s->ptr < s->size;
    cl_leave_exclusive(d);
    if (ours)
      return true;
  }
  return false;
}

cachalot_status cl_enter_block(cachalot_allocator *a, void *ptr, const char *fn, cl_device **dev, cl_block **blk) {
  *dev = NULL;
  *blk = NULL;
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", fn);
  const uintptr_t key = (uintptr_t)ptr;
  if (key) {
    /* The page map names the likely device; a racing release may change it, so every device is tried,
     * that one first. */
    cl_segment *seg = cl_page_get(&a->pages, key);
    const cl_lane *ln = seg && seg != CL_PAGE_SHARED ? cl_seg_lane(seg) : NULL;
    int first = ln ? ln->dev->index : 0;
    for (int n = 0; n < a->device_count; n++) {
      cl_device *d = &a->devices[(first + n) % a->device_count];
      cl_enter_exclusive(d);
      cl_block *b = cl_block_at_locked(a, d, key);
      if (b && b->state == CL_ALLOCATED) {
        *dev = d;
        *blk = b;
        return CACHALOT_OK;
      }
      cl_leave_exclusive(d);
      if (b)
        return cl_fail(CACHALOT_ERROR_INVALID_POINTER, "%s: invalid device pointer: 0x%" PRIxPTR " (already freed)",
                       fn, key);
    }
  }
  return cl_fail(CACHALOT_ERROR_INVALID_POINTER, "%s: invalid device pointer: 0x%" PRIxPTR, fn, key);
}
