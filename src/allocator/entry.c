/* The entry points' first steps, shared by every file that has entry points: the argument checks, the
 * forked child's error, and the opening of a device in exclusive mode. */
#include "internal.h"

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
