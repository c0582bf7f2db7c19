/* cachalot_free and cachalot_record_stream (PyTorch's free rules); the merges of a block going back to
 * its free index are merge.h's.
 *
 * free() finds the block through the page map (address -> segment -> lane) without a lock, then runs
 * under that lane's lock alone when the block has no other stream's uses; the rest (events, captures,
 * history, errors) goes through exclusive mode. */
#include "internal.h"
#include "core/merge.h"

#include <assert.h>
#include <stdlib.h>

/* Adds stream use `s` to allocated block `b` where its array has room (or `s` needs none); false when
 * it must grow, which exclusive mode does. */
CL_INLINE bool add_use(cl_block *b, cachalot_stream s) {
  if (s == b->seg->stream)
    return true;
  for (uint32_t i = 0; i < b->n_uses; i++)
    if (b->uses[i] == s)
      return true;
  if (b->n_uses == b->cap_uses)
    return false;
  b->uses[b->n_uses++] = s;
  return true;
}

/* record_stream's warm path, under the block's lane lock alone (the side-stream prefetch loop calls it on
 * every batch): exclusive mode, which reads the uses, holds that lock while the lane is armed. False when
 * the call needs exclusive mode: a cold or stopped lane, an unknown pointer or a full array. */
static bool record_warm(cachalot_allocator *a, uintptr_t key, cachalot_stream s) {
  cl_segment *seg = cl_page_get(&a->pages, key);
  if (!seg || seg == CL_PAGE_SHARED)
    return false;
  cl_lane *ln = cl_seg_lane(seg);
  cl_spin_lock(&ln->lock);
  const unsigned warm = atomic_load_explicit(&ln->warm, memory_order_relaxed);
  bool done = false;
  /* FREE without STOP: the lane is armed (its flags are cleared when it cools) */
  if ((warm & (CL_WARM_FREE | CL_WARM_STOP)) == CL_WARM_FREE && cl_lookup_holds(seg, ln, key)) {
    cl_block *b = *cl_seg_slot(seg, key);
    done = b && b->ptr == key && b->state == CL_ALLOCATED && add_use(b, s);
  }
  cl_spin_unlock(&ln->lock);
  return done;
}

cachalot_status cachalot_record_stream(cachalot_allocator *a, void *ptr, cachalot_stream s) {
  cl_device *d;
  cl_block *b;
  if (a && cl_forked(a))
    return cl_forked_fail("cachalot_record_stream");
  /* A stream no event can be recorded on would make every later free of the block fail: refuse it now. */
  if (a && a->backend->ops->stream_check(a->backend, s) != CACHALOT_OK) {
    cl_error_prefix("cachalot_record_stream: ");
    return CACHALOT_ERROR_INVALID_ARGUMENT;
  }
  if (a && record_warm(a, (uintptr_t)ptr, s))
    return CACHALOT_OK;
  cachalot_status rc = cl_enter_block(a, ptr, "cachalot_record_stream", &d, &b);
  if (rc != CACHALOT_OK)
    return rc;
  if (!add_use(b, s)) { /* the array is full */
    uint32_t cap = b->cap_uses ? b->cap_uses * 2 : 4;
    cachalot_stream *u = realloc(b->uses, cap * sizeof *u);
    if (!u) {
      cl_leave_exclusive(d);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_record_stream: host out of memory");
    }
    b->uses = u;
    b->cap_uses = cap;
    b->uses[b->n_uses++] = s;
  }
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

/* A free on the warm path: allocation and active drop together (cl_stats_free_called's part too), in
 * lane ln's share. */
CL_INLINE void free_stats_warm(cl_device *d, cl_lane *ln, bool small, size_t size, size_t requested) {
  cl_lane_stat *e = ln->st[small];
  cl_share_down(&e[CL_LS_COUNT], 1);
  cl_share_down(&e[CL_LS_BYTES], (int64_t)size);
  cl_share_down(&e[CL_LS_REQUESTED], (int64_t)requested);
  if (CL_UNLIKELY(size >= d->cfg.max_split_size))
    cl_share_down(&ln->oversize, 1);
  if (CL_UNLIKELY(e[CL_LS_BYTES].rem > e[CL_LS_BYTES].cap))
    cl_lane_trim(ln, small);
}

/* Frees lane ln's memo b (the lane locked, b checked as free_warm does) with its return deferred: the
 * stats change as the return would change them, undoing what the hand-out counted; the blocks stay. Why:
 * a program that frees a block and asks for the same size again, the commonest pair of calls, gets the
 * same block back with no merge, no split and no tree touched. False when the lane lacks room for the
 * split stats (nothing changed then). */
CL_INLINE bool free_deferred(cl_device *d, cl_lane *ln, cl_block *b, cl_block **slot) {
  const bool small = b->seg->small;
  const int64_t blocks = -(int64_t)ln->memo_split_blocks, bytes = -ln->memo_split_bytes;
  if (CL_UNLIKELY(!cl_split_room(ln, small, blocks, bytes)))
    return false;
  *slot = NULL;
  const size_t requested = b->requested;
  b->requested = 0;
  ln->memo_gc = __atomic_load_n(&b->seg->pool->lookups[small], __ATOMIC_RELAXED);
  cl_count_split_warm(ln, small, blocks, bytes);
  free_stats_warm(d, ln, small, b->size, requested);
  ln->memo_freed = true;
  return true;
}

/* free()'s warm path once the lane is locked and warm: a block with no other stream's uses; the same
 * steps as exclusive mode's cl_stats_free_called + cl_free_block_locked, counted into the lane's share
 * (for the lane's memo, deferred: free_deferred). With `traced` (a constant in each call) it records
 * free_requested and free_completed too. False when the call needs exclusive mode (nothing changed then,
 * but a deferred return made). */
CL_INLINE bool free_warm(cl_device *d, cl_lane *ln, cl_segment *seg, uintptr_t key, bool traced, uint64_t stamp,
                         bool solo) {
  cl_block **slot = NULL, *b = NULL;
  if (CL_LIKELY(cl_lookup_holds(seg, ln, key))) {
    slot = cl_seg_slot(seg, key);
    b = *slot;
  }
  if (CL_UNLIKELY(!b || b->ptr != key || b->state != CL_ALLOCATED || b->n_uses))
    return false;
  if (b == ln->memo) {
    const size_t requested = b->requested;
    if (!free_deferred(d, ln, b, slot))
      return false;
    if (traced) /* before the lane goes: exclusive mode reads the ring */
      cl_trace_warm(d, CL_TRACE_FREE_REQUESTED, key, requested, seg->stream, stamp, solo);
    return true;
  }
  cl_lane_settle_memo(d, ln); /* b's neighbours as they are */
  const merge_plan m = plan_merge(b);
  if (CL_UNLIKELY(!cl_split_room(ln, seg->small, m.split_blocks, m.split_bytes)))
    return false;
  *slot = NULL;
  const size_t requested = b->requested, size = b->size; /* (b's node may go to a merge) */
  /* counts the free() and the block's return at once; `small` a constant in each call (see malloc's) */
  if (seg->small) {
    free_block(d, CL_WARM, b, true, &m);
    free_stats_warm(d, ln, true, size, requested);
  } else {
    free_block(d, CL_WARM, b, false, &m);
    free_stats_warm(d, ln, false, size, requested);
  }
  if (traced) /* before the lane goes: exclusive mode reads the ring */
    cl_trace_warm(d, CL_TRACE_FREE_REQUESTED, key, requested, seg->stream, stamp, solo);
  return true;
}

/* History on (CL_WARM_TRACE): out of the plain path's way. A call with a context goes to exclusive mode,
 * where history keeps it. */
static __attribute__((noinline)) bool free_warm_traced(cl_device *d, cl_lane *ln, cl_segment *seg, uintptr_t key,
                                                       uint64_t stamp, bool solo) {
  return !cl_free_ctx() && free_warm(d, ln, seg, key, true, stamp, solo);
}

/* free()'s warm path, under its lane's lock alone. A STOPPED result comes after the exclusive mode that
 * stopped it is over. */
CL_INLINE cl_warm_result free_fast(cachalot_allocator *a, void *ptr) {
  cl_segment *seg = cl_page_get(&a->pages, (uintptr_t)ptr);
  if (CL_UNLIKELY(!seg || seg == CL_PAGE_SHARED)) /* the slow path scans then */
    return CL_WARM_SLOW;
  /* lanes live until destroy, so a stale seg's lane is still a lane to lock */
  cl_lane *ln = cl_seg_lane(seg);
  cl_device *d = ln->dev;
  const uint64_t stamp = cl_trace_stamp(atomic_load_explicit(&ln->warm, memory_order_relaxed));
  cl_spin_lock(&ln->lock);
  /* the flags first: a cold lane's segments may be changing meanwhile */
  const unsigned warm = atomic_load_explicit(&ln->warm, memory_order_relaxed);
  const unsigned w = warm & (CL_WARM_FREE | CL_WARM_STOP | CL_WARM_TRACE);
  bool done = false;
  if (CL_LIKELY(w == CL_WARM_FREE))
    done = free_warm(d, ln, seg, (uintptr_t)ptr, false, 0, false);
  else if (w == (CL_WARM_FREE | CL_WARM_TRACE))
    done = free_warm_traced(d, ln, seg, (uintptr_t)ptr, stamp, warm & CL_WARM_SOLO);
  cl_spin_unlock(&ln->lock);
  if (CL_LIKELY(done))
    return CL_WARM_DONE;
  return cl_warm_missed(d, warm);
}

/* Everything but the warm path, in exclusive mode. */
static __attribute__((noinline)) cachalot_status free_slow(cachalot_allocator *a, void *ptr, cl_warm_result warm) {
  if (CL_UNLIKELY(cl_forked(a)))
    return cl_forked_fail("cachalot_free");
  while (warm == CL_WARM_STOPPED) /* another thread was entering exclusive mode: after it, warm again */
    if ((warm = free_fast(a, ptr)) == CL_WARM_DONE)
      return CACHALOT_OK;
  cl_segment *seg = cl_page_get(&a->pages, (uintptr_t)ptr);
  if (seg && seg != CL_PAGE_SHARED) { /* a cold lane's free: armed quickly, then warm (lanes outlive segments) */
    cl_lane *ln = cl_seg_lane(seg);
    if (cl_lane_looks_cold(ln) && cl_lane_arm_quick(ln->dev, ln) && free_fast(a, ptr) == CL_WARM_DONE)
      return CACHALOT_OK;
  }
  cl_device *d;
  cl_block *b;
  cachalot_status rc = cl_enter_block(a, ptr, "cachalot_free", &d, &b);
  if (rc != CACHALOT_OK)
    return rc;
  cl_lane_arm_locked(d, cl_seg_lane(b->seg)); /* its stream's next frees on the warm path */
  if (b->n_uses > 0 && (cl_capturing(d) || cl_uses_capturing_locked(d, b))) {
    /* Recording an event now would be captured into the graph (this device's capture, or another
     * device's on a stream that used the block): the block waits, PENDING without events, until no
     * capture is underway (PyTorch's private pools). */
    if (d->n_deferred == d->cap_deferred) {
      size_t cap = d->cap_deferred ? d->cap_deferred * 2 : 16;
      cl_deferred *nd = realloc(d->deferred, cap * sizeof *nd);
      if (!nd) {
        cl_leave_exclusive(d);
        return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_free: host out of memory");
      }
      d->deferred = nd;
      d->cap_deferred = cap;
    }
    /* with graph_capture_record_stream_reuse: the nodes its uses ended at, to reuse it within the capture */
    d->deferred[d->n_deferred++] = (cl_deferred){b, d->cfg.capture_reuse ? cl_capture_wait_make_locked(d, b) : NULL};
    b->state = CL_PENDING;
  } else if (b->n_uses > 0) {
    rc = cl_insert_events_locked(d, b);
    if (rc != CACHALOT_OK) {
      cl_leave_exclusive(d);
      return rc;
    }
  }
  cl_stats_free_called(d, b->seg->small, b->size);
  cl_trace_locked(d, CL_TRACE_FREE_REQUESTED, b->ptr, b->requested, b->seg->stream);
  if (b->state == CL_ALLOCATED)
    cl_free_block_locked(d, b);
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

/* cachalot_free, with or without a context (the entry points are shells over it). */
CL_INLINE cachalot_status free_entry(cachalot_allocator *a, void *ptr) {
  if (!ptr || !a) {
    if (!a)
      return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_free: allocator is NULL");
    return CACHALOT_OK;
  }
  if (CL_UNLIKELY(atomic_load_explicit(&a->n_auto, memory_order_relaxed)))
    cl_autocapture_poll(a); /* a detected capture may be over: end its routing, warm paths back on */
  cl_warm_result warm = free_fast(a, ptr);
  if (CL_LIKELY(warm == CL_WARM_DONE))
    return CACHALOT_OK;
  return free_slow(a, ptr, warm);
}

cachalot_status cachalot_free(cachalot_allocator *a, void *ptr) { return free_entry(a, ptr); }

cachalot_status cachalot_free_with_context(cachalot_allocator *a, void *ptr, void *ctx) {
  void *const saved = cl_ctx_push(&cl_tls_free_ctx, ctx);
  const cachalot_status rc = free_entry(a, ptr);
  cl_ctx_pop(&cl_tls_free_ctx, saved);
  return rc;
}
