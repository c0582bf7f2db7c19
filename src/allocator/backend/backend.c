/* The public entry points that work on any backend. */
#include "ops.h"

#include "../../common/error.h"

cachalot_status cachalot_backend_cuda(cachalot_backend **out) { return cl_backend_cuda(out); }

void cachalot_backend_destroy(cachalot_backend *b) {
  if (b)
    b->ops->destroy(b);
}

cachalot_status cachalot_backend_device_count(cachalot_backend *b, int *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_device_count: out is NULL");
  *out = 0;
  if (!b)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_device_count: backend is NULL");
  *out = b->device_count;
  return CACHALOT_OK;
}
