/* CUDA IPC: the handle another process opens to reach a block (PyTorch's shareIpcHandle). A block is a
 * part of its segment's device allocation, so the handle is the segment's and the block's offset in it
 * goes with it. */
#include "internal.h"

#include <string.h>

cachalot_status cachalot_ipc_handle(cachalot_allocator *a, void *ptr, unsigned char handle[64], size_t *offset) {
  if (offset)
    *offset = 0;
  if (!handle || !offset)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_ipc_handle: %s is NULL", !handle ? "handle" : "offset");
  if (a && cl_forked(a))
    return cl_forked_fail("cachalot_ipc_handle");
  cl_device *d;
  cl_block *b;
  cachalot_status rc = cl_enter_block(a, ptr, "cachalot_ipc_handle", &d, &b);
  if (rc != CACHALOT_OK)
    return rc;
  const cl_segment *seg = b->seg;
  if (seg->expandable) {
    cl_leave_exclusive(d);
    return cl_fail(CACHALOT_ERROR_NOT_SUPPORTED,
                   "cachalot_ipc_handle: %p is in an expandable segment: mapped pages have no CUDA IPC handle "
                   "(share memory of a config without expandable_segments)", ptr);
  }
  cachalot_backend *be = a->backend;
  rc = be->ops->ipc_handle ? be->ops->ipc_handle(be, d->index, (void *)seg->ptr, handle)
                           : cl_fail(CACHALOT_ERROR_NOT_SUPPORTED, "the backend has no IPC handles");
  if (rc == CACHALOT_OK)
    *offset = b->ptr - seg->ptr;
  else
    memset(handle, 0, 64);
  cl_leave_exclusive(d);
  if (rc != CACHALOT_OK)
    cl_error_prefix("cachalot_ipc_handle: ");
  return rc;
}
