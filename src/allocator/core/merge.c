/* Returning blocks to their free index in exclusive mode (a free that waited for events or a capture, a
 * pool's blocks recarved), and the lane's deferred return (free.c's free_deferred). */
#include "merge.h"

#include <assert.h>

void cl_free_block_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  const uintptr_t ptr = b->ptr;
  if (d->step && b->step_seq) { /* its free completes now: the tracker's event */
    cl_step_free(d->step, b->step_seq, b->size);
    b->step_seq = 0;
  }
  *cl_seg_slot(b->seg, b->ptr) = NULL;
  const merge_plan m = plan_merge(b);
  free_block(d, CL_EXCLUSIVE, b, b->seg->small, &m);
  /* A block pending free keeps its context until it is free: its free_completed entry, recorded above,
   * takes it when the free gives none. No block starts at ptr meanwhile (the merge only joins free ones). */
  cl_ctx_drop_locked(d, ptr);
}

void cl_lane_settle(cl_device *d, cl_lane *ln) {
  cl_block *b = ln->memo;
  ln->memo = NULL;
  if (!ln->memo_freed)
    return;
  ln->memo_freed = false;
  const merge_plan m = plan_merge(b);
  /* the free counted these already: the very changes the hand-out made, undone */
  assert(m.split_blocks == -(int64_t)ln->memo_split_blocks && m.split_bytes == -ln->memo_split_bytes);
  cl_block *keep = b->seg->small ? return_block(d, CL_WARM, b, true, &m) : return_block(d, CL_WARM, b, false, &m);
  keep->gc_base = ln->memo_gc; /* its age from the free, as garbage collection counts it */
}
