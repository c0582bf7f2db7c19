/* cachalot_malloc: PyTorch's malloc steps, in order.
 *
 *   poll events -> round, choose pool -> best fit on this stream -> (gc) -> new segment
 *     -> (free oversize blocks, new segment) -> (free all cached, new segment: a retry) -> OOM
 *
 * The warm path runs the same steps under the stream's lane lock alone when they reduce to "best fit,
 * hand out": no poll that could free a block best fit would pick (see CL_WARM_POLL), no capture routing,
 * no history stacks, a cached block that fits and the metadata at hand (with garbage collection set it
 * counts its lookup, CL_WARM_GC). Anything else goes to exclusive mode and the full sequence.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* malloc step 3: best fit honours the oversize rules. */
CL_INLINE bool fits(const cl_config *c, const cl_block *b, size_t size) {
  if (size < c->max_split_size)
    return b->size < c->max_split_size; /* a request below max_split_size never takes an oversize block */
  return b->size - size < c->max_non_split_rounding; /* nor an oversize one a block far larger than itself */
}

/* Best fit among the free blocks outside the plan's ranges (expandable_plan): a block the online policy
 * puts there would stand in the way of the planned ones every step after. The blocks passed over go back;
 * past PLAN_SKIPS of them the range's block is taken after all (it is safe, only not planned). */
enum { PLAN_SKIPS = 64 };
static cl_block *fit_outside_plan(cl_device *d, cl_fit *f, bool small, size_t size) {
  cl_block *skipped[PLAN_SKIPS], *b;
  size_t n = 0;
  unsigned cls;
  cl_block **link, *pred;
  while ((b = cl_fit_lower_bound_at(f, small, size, &cls, &link, &pred)) && fits(&d->cfg, b, size) &&
         cl_plan_holds(b) && n < PLAN_SKIPS) {
    cl_fit_remove_at(f, cls, link, b);
    skipped[n++] = b;
  }
  if (b && !fits(&d->cfg, b, size))
    b = NULL;
  if (b)
    cl_fit_remove_at(f, cls, link, b);
  while (n > 0) {
    cl_block *x = skipped[--n];
    cl_fit_insert(f, cl_fit_class(small, x->size), x);
  }
  return b;
}

static cl_block *get_free_block_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->fraction >= 0 && d->cfg.gc_threshold > 0)
    __atomic_fetch_add(&p->lookups[small], 1, __ATOMIC_RELAXED); /* (the warm mallocs count theirs so) */
  cl_bins *bins = cl_bins_get_locked(d, p, s, false);
  if (!bins)
    return NULL;
  cl_fit *f = &bins->kind[small];
  unsigned cls;
  cl_block **link, *pred;
  cl_block *b = cl_fit_lower_bound_at(f, small, size, &cls, &link, &pred);
  if (CL_UNLIKELY(d->plan) && b && fits(&d->cfg, b, size) && cl_plan_holds(b))
    return fit_outside_plan(d, f, small, size);
  if (!b || !fits(&d->cfg, b, size))
    return NULL;
  cl_fit_remove_at(f, cls, link, b);
  return b;
}


/* malloc step 3, with expandable_plan: the plan's block where it has one for this malloc of the default
 * pool, else best fit. */
static cl_block *planned_or_best_fit_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t rounded) {
  cl_block *b = NULL;
  if (d->step && cl_pool_is_default(d, p)) {
    cl_plan_before_malloc_locked(d);
    b = cl_plan_take_locked(d, s, small, rounded);
  }
  return b ? b : get_free_block_locked(d, p, s, small, rounded);
}

/* The last resort of a default-pool malloc that found no memory: a cached free block of a pool marked
 * use_on_oom, on the same stream, as PyTorch's allocator takes one (no new segment for it). *pool becomes
 * that pool. NULL when none fits. */
static cl_block *use_on_oom_block_locked(cl_device *d, cachalot_stream s, bool small, size_t size, cl_pool **pool) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pool *p, *tmp;
  HASH_ITER(hh, d->pools, p, tmp) {
    if (!p->use_on_oom || p->use_count == 0) /* a released pool's blocks only go back */
      continue;
    cl_block *b = get_free_block_locked(d, p, s, small, size);
    if (b) {
      *pool = p;
      return b;
    }
  }
  return NULL;
}

/* Metadata first, so that a host allocation failure never strands device memory: the lane, the free
 * index, the segment (a spare's when there is one) and its block, all set up but for the memory. */
static cachalot_status segment_metadata_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small,
                                               size_t alloc_size, cl_segment **seg_out, cl_block **blk_out,
                                               bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_lane *lane = cl_lane_get_locked(d, s);
  cl_bins *bins = cl_bins_get_locked(d, p, s, true);
  cl_segment *seg = d->spare_segments;
  if (seg) {
    d->spare_segments = seg->release_next;
  } else if ((seg = aligned_alloc(_Alignof(cl_segment), sizeof *seg))) { /* its first line: one cache line */
    memset(seg, 0, sizeof *seg); /* no table yet; not in the page map, so no reader yet */
  }
  cl_block *blk = cl_block_new_locked(d);
  const unsigned at_shift = cl_seg_shift(small);
  const size_t n_at = alloc_size >> at_shift;
  /* A spare keeps its table for a segment of as many entries; another gets a new one below. */
  if (seg && seg->at && cl_seg_entries(seg) != n_at) {
    free(seg->at);
    seg->at = NULL;
  }
  if (!lane || !bins || !seg || !blk) {
    if (seg) {
      seg->release_next = d->spare_segments;
      d->spare_segments = seg;
    }
    if (blk)
      cl_block_delete_locked(d, blk);
    *host_oom = true;
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  if (cl_pool_is_default(d, p))
    lane->bins = bins;
  cl_block **at = seg->at; /* all NULL: a spare segment had no handed-out block */
  cl_segment_clear(seg);
  seg->at = at;
  seg->at_shift = at_shift;
  /* set before the page map publishes the segment: a free() on another thread may read them */
  seg->pool = p;
  seg->stream = s;
  cl_seg_set_lane(seg, lane);
  seg->bins = bins;
  seg->small = small;
  *seg_out = seg;
  *blk_out = blk;
  return CACHALOT_OK;
}

/* The device call (or the pool's source's), with exclusive mode left around it unless
 * release_lock_on_cudamalloc is False (`inflight` keeps the memory fraction honest meanwhile). */
static cachalot_status device_alloc_locked(cl_device *d, const cachalot_segment_source *src, cachalot_stream s,
                                           size_t alloc_size, void **ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_backend *b = d->owner->backend;
  const bool drop = d->cfg.release_lock_on_cudamalloc;
  d->inflight += alloc_size;
  if (drop)
    cl_leave_exclusive(d);
  /* A plain device allocation while any stream captures in global mode fails and invalidates that
   * capture. cachalot is not always told about captures (a program may capture on its own), so the
   * thread is switched to relaxed mode around every device allocation: two cheap calls on a path that
   * is about to call the device anyway. */
  cachalot_capture_mode mode = CACHALOT_CAPTURE_RELAXED;
  cachalot_status rc = b->ops->capture_mode_exchange(b, &mode);
  if (rc == CACHALOT_OK) {
    if (src) {
      *ptr = src->alloc(alloc_size, d->index, s, src->ctx);
      rc = *ptr ? CACHALOT_OK
                : cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "the pool's allocator gave no memory for %zu bytes", alloc_size);
    } else {
      rc = b->ops->alloc(b, d->index, alloc_size, ptr);
    }
    cachalot_capture_mode prev = mode;
    (void)b->ops->capture_mode_exchange(b, &prev);
  }
  if (drop)
    cl_enter_exclusive(d);
  d->inflight -= alloc_size;
  return rc;
}

/* The new segment and its single FREE block enter the books: the segment list, the stats, the history. */
static void book_segment_locked(cl_device *d, cl_segment *seg, cl_block *blk) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_device_stats *st = &d->stats;
  const bool small = seg->small;
  const size_t alloc_size = seg->size;
  seg->head = seg->tail = blk;
  cl_segment_link_locked(d, seg);

  blk->ptr = seg->ptr;
  blk->size = alloc_size;
  blk->seg = seg;
  blk->prev = blk->next = NULL;
  blk->state = CL_FREE;

  cl_stat_array_add(st->segment, small, 1);
  cl_stat_array_add(st->reserved_bytes, small, (int64_t)alloc_size);
  if (alloc_size >= d->cfg.max_split_size)
    cl_stat_inc(&st->oversize_segments, 1);
  st->num_device_alloc++;
  cl_trace_locked(d, CL_TRACE_SEGMENT_ALLOC, seg->ptr, alloc_size, seg->stream);
  if (CL_UNLIKELY(d->trace.cap != 0))
    cl_segment_ctx_attach_locked(d, seg);
}

/* malloc step 5: a new segment of `alloc_size` from the device. The lock is dropped around the device
 * call unless release_lock_on_cudamalloc is False. On success *out is the segment's single block, not
 * in any index. OUT_OF_MEMORY when the fraction or the device says no, or, with *host_oom set, when
 * the host has no memory for the metadata (freeing device memory would not help then); other statuses
 * are device errors. */
static cachalot_status alloc_segment_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small,
                                            size_t alloc_size, bool is_retry, cl_block **out, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  *out = NULL;
  *host_oom = false;
  if (is_retry)
    d->stats.num_alloc_retries++;
  cachalot_status rc = cl_fraction_admit_locked(d, alloc_size);
  if (rc != CACHALOT_OK)
    return rc;
  cl_segment *seg = NULL;
  cl_block *blk = NULL;
  if ((rc = segment_metadata_locked(d, p, s, small, alloc_size, &seg, &blk, host_oom)) != CACHALOT_OK)
    return rc;

  void *ptr = NULL;
  const cachalot_segment_source *src = cl_pool_source(d, p);
  rc = device_alloc_locked(d, src, s, alloc_size, &ptr);
  seg->ptr = (uintptr_t)ptr;
  seg->size = alloc_size;
  /* The table after the device allocation: its size follows the segment's, and a request the device
   * refuses must be reported as the device's out of memory, not the host's. */
  if (rc == CACHALOT_OK && !seg->at)
    seg->at = calloc(cl_seg_entries(seg), sizeof *seg->at);
  seg->from_source = src != NULL;
  if (rc == CACHALOT_OK && (!seg->at || !cl_page_map_add(&d->owner->pages, seg))) {
    cachalot_backend *b = d->owner->backend;
    if (src) /* rare: no host memory for the table or a page map node */
      src->free(ptr, alloc_size, d->index, s, src->ctx);
    else
      (void)b->ops->free(b, d->index, ptr);
    *host_oom = true;
    rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  if (rc != CACHALOT_OK) {
    seg->release_next = d->spare_segments;
    d->spare_segments = seg;
    cl_block_delete_locked(d, blk);
    return rc;
  }
  book_segment_locked(d, seg, blk);
  *out = blk;
  return CACHALOT_OK;
}

/* malloc step 5: memory for a rounded request that no cached block serves: pages mapped into an
 * expandable segment, or a new segment. */
static cachalot_status new_memory_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t rounded,
                                         bool is_retry, cl_block **out, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->cfg.expandable_segments && !cl_pool_source(d, p)) /* a source's memory cannot be mapped */
    return cl_expand_locked(d, p, s, small, rounded, is_retry, out, host_oom);
  return alloc_segment_locked(d, p, s, small, cl_segment_size(rounded), is_retry, out, host_oom);
}

/* Hands out `size` bytes from the front of `b` (FREE), splitting off the rest when the split rule says
 * so, and returns the ALLOCATED block. As in PyTorch, a split leaves `b` itself as the free rest (its
 * address and size move up and down) and the allocated front gets new metadata: when the rest keeps
 * b's class and its key still sorts after pred, the class tree is not touched at all.
 *   CL_EXCLUSIVE: b is in no index; on host OOM it goes back to its index, nothing changes and NULL
 *     is returned.
 *   CL_WARM (b's lane locked): b is still in the tree of class `cls` at `link`, `pred` its
 *     predecessor in that tree; the caller has made sure of a spare for a split: it cannot fail. */
/* What handing `size` bytes out of FREE block b, split or whole, changes in the split stats: a whole
 * segment split makes its rest a new inactive split block; an inactive split block shrinks by `size`, or,
 * handed out whole, is one no more. */
typedef struct {
  int blocks;
  int64_t bytes;
} split_change;
CL_INLINE split_change split_change_of(const cl_block *b, bool split, size_t size) {
  const bool already_split = b->prev || b->next;
  if (split)
    return already_split ? (split_change){0, -(int64_t)size} : (split_change){1, (int64_t)(b->size - size)};
  return already_split ? (split_change){-1, -(int64_t)b->size} : (split_change){0, 0};
}

CL_INLINE cl_block *hand_out(cl_device *d, cl_mode mode, cl_block *b, bool small, unsigned cls,
                             cl_block **link, cl_block *pred, size_t size, size_t requested) {
  cl_segment *seg = b->seg;
  cl_lane *lane = seg->lane;
  /* a private pool (exclusive mode only: the warm path serves the default pool) may forbid splitting */
  const bool split = cl_should_split(&d->cfg, small || seg->expandable, b->size, size) &&
                     (mode == CL_WARM || !seg->pool->no_split);
  const split_change sc = split_change_of(b, split, size);
  cl_block *a = b; /* the block handed out */
  if (mode == CL_WARM) {
    if (split) {
      a = lane->spare;
      lane->spare = a->next;
      lane->n_spare--;
    }
  } else {
    if (split && !(a = cl_block_new_locked(d))) {
      cl_free_index_insert_locked(d, b);
      cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
      return NULL;
    }
  }

  cl_fit *f = &seg->bins->kind[small];
  if (split) {
    /* a spare is clean: requested, uses and events are 0, as on every FREE block */
    a->ptr = b->ptr;
    a->size = size;
    a->seg = seg;
    a->next = b;
    a->prev = b->prev;
    if (a->prev)
      a->prev->next = a;
    else
      seg->head = a;
    b->prev = a;
    b->ptr += size;
    b->size -= size;
    const unsigned rest_cls = cl_fit_class(small, b->size);
    cl_block_becomes_free(b);
    if (mode == CL_EXCLUSIVE) {
      cl_fit_insert(f, rest_cls, b);
    } else if (rest_cls != cls || (pred && !cl_key_less(pred, b))) {
      cl_fit_remove_at(f, cls, link, b);
      cl_fit_insert(f, rest_cls, b);
    } /* else: b keeps its place (its key only got smaller, and still sorts after pred) */
    cl_count_split(d, lane, mode, small, sc.blocks, sc.bytes);
  } else {
    if (mode == CL_WARM)
      cl_fit_remove_at(f, cls, link, b);
    if (sc.blocks) /* (an inactive split block handed out whole) */
      cl_count_split(d, lane, mode, small, sc.blocks, sc.bytes);
  }
  *cl_seg_slot(seg, a->ptr) = a;

  a->state = CL_ALLOCATED;
  a->requested = requested;
  a->n_uses = 0;
  a->event_count = 0;
  if (mode == CL_WARM) {
    cl_stats_hand_out_warm(d, lane, small, a->size, requested);
  } else {
    cl_stats_hand_out_locked(d, small, a->size, requested);
    /* the warm paths record their own (cl_trace_warm, in malloc_fast) */
    cl_trace_locked(d, CL_TRACE_ALLOC, a->ptr, requested, seg->stream);
    if (CL_UNLIKELY(cl_tls_alloc_ctx != NULL || d->trace.frames != NULL))
      cl_ctx_attach_locked(d, a->ptr);
  }
  return a;
}

/* The warm path of one kind (`small` a constant at each call, so that the class arithmetic and the
 * index's offsets fold), under the lane's lock; the block handed out becomes the lane's memo (see
 * cl_lane). False when the request needs exclusive mode (nothing changed then). */
CL_INLINE bool malloc_fast_kind(cl_device *d, cl_lane *ln, size_t rounded, size_t size, bool small, void **out) {
  const cl_config *c = &d->cfg;
  unsigned cls;
  cl_block **link, *pred;
  cl_block *b = cl_fit_lower_bound_at(&ln->bins->kind[small], small, rounded, &cls, &link, &pred);
  if (!b || !fits(c, b, rounded))
    return false;
  /* Everything hand_out will need, checked before anything changes: a spare for the split and room in
   * the stats shares (else the peak could be passed unseen: exclusive mode does it). */
  const bool split = cl_should_split(c, small || b->seg->expandable, b->size, rounded);
  const split_change sc = split_change_of(b, split, rounded); /* (a drop always has room) */
  if ((split && !ln->spare) || !cl_hand_out_room(d, ln, small, split ? rounded : b->size, size, sc.blocks, sc.bytes))
    return false;
  cl_block *a = hand_out(d, CL_WARM, b, small, cls, link, pred, rounded, size);
  ln->memo = a;
  ln->memo_rounded = rounded;
  ln->memo_split_blocks = sc.blocks;
  ln->memo_split_bytes = sc.bytes;
  *out = (void *)a->ptr;
  return true;
}

/* Lane ln's freed memo handed out again for `size` bytes of its rounded size, which best fit would find
 * (see cl_lane): the stats count what its hand-out counted. False when the lane lacks room for them
 * (nothing changed then). */
CL_INLINE bool hand_out_again(cl_device *d, cl_lane *ln, size_t size, void **out) {
  cl_block *a = ln->memo;
  cl_segment *seg = a->seg;
  const bool small = seg->small;
  if (CL_UNLIKELY(!cl_hand_out_room(d, ln, small, a->size, size, ln->memo_split_blocks, ln->memo_split_bytes)))
    return false;
  cl_count_split_warm(ln, small, ln->memo_split_blocks, ln->memo_split_bytes);
  if (a->next && a->next->state == CL_FREE) /* the rest of a split, as the split would stamp it */
    cl_block_becomes_free(a->next);
  *cl_seg_slot(seg, a->ptr) = a;
  a->requested = size;
  cl_stats_hand_out_warm(d, ln, small, a->size, size);
  ln->memo_freed = false;
  *out = (void *)a->ptr;
  return true;
}

/* malloc's warm path once the lane is locked and warm: the lane's freed memo again, or its return made
 * first and a search. */
CL_INLINE bool malloc_warm(cl_device *d, cl_lane *ln, size_t size, void **out) {
  const size_t rounded = cl_round_size(&d->cfg, size);
  if (ln->memo_freed) {
    if (CL_LIKELY(rounded == ln->memo_rounded))
      return hand_out_again(d, ln, size, out);
    cl_lane_settle(d, ln);
  }
  return cl_is_small(rounded) ? malloc_fast_kind(d, ln, rounded, size, true, out)
                              : malloc_fast_kind(d, ln, rounded, size, false, out);
}

/* The warm path with flags `w` beyond MALLOC, out of the plain path's way.
 * POLL (blocks are PENDING): the poll is skipped only while the completion word says that no event has
 * completed since the last poll (WATCH), when it would change nothing; else the call polls, in exclusive
 * mode.
 * TRACE (history on): the entry too. A call with a context goes to exclusive mode, where history keeps it.
 * GC (garbage collection set): the lookup counted first, as get_free_block_locked does (the rest of a split
 * takes its age base after it); taken back when the call goes on to exclusive mode, which counts its own.
 * Each keeps the lane's memo: a deferred return records no entry and gives the ages a return would. */
static __attribute__((noinline)) bool malloc_warm_flagged(cl_device *d, cl_lane *ln, size_t size, cachalot_stream s,
                                                          unsigned w, uint64_t stamp, void **out) {
  if ((w & CL_WARM_POLL) &&
      (!(w & CL_WARM_WATCH) || __atomic_load_n(d->done_word, __ATOMIC_ACQUIRE) != d->done_seen))
    return false;
  if ((w & CL_WARM_TRACE) && cl_alloc_ctx())
    return false;
  uint64_t *lookups = NULL;
  if (w & CL_WARM_GC) {
    lookups = &d->default_pool.lookups[cl_is_small(cl_round_size(&d->cfg, size))];
    __atomic_fetch_add(lookups, 1, __ATOMIC_RELAXED);
  }
  if (!malloc_warm(d, ln, size, out)) {
    if (lookups)
      __atomic_fetch_sub(lookups, 1, __ATOMIC_RELAXED);
    return false;
  }
  if (w & CL_WARM_TRACE) /* before the lane goes: exclusive mode reads it */
    cl_trace_warm(d, CL_TRACE_ALLOC, (uintptr_t)*out, size, s, stamp, w & CL_WARM_SOLO);
  return true;
}

/* The warm path: a cached block of stream `s`'s default pool, under its lane lock only. A STOPPED
 * result comes after the exclusive mode that stopped it is over. */
CL_INLINE cl_warm_result malloc_fast(cl_device *d, size_t size, cachalot_stream s, void **out) {
  cl_lane *ln = cl_lane_find(d, s);
  if (CL_UNLIKELY(!ln))
    return CL_WARM_SLOW;
  const uint64_t stamp = cl_trace_stamp(atomic_load_explicit(&ln->warm, memory_order_relaxed));
  cl_spin_lock(&ln->lock);
  const unsigned warm = atomic_load_explicit(&ln->warm, memory_order_relaxed);
  const unsigned w = warm & (CL_WARM_MALLOC | CL_WARM_STOP | CL_WARM_TRACE | CL_WARM_POLL | CL_WARM_WATCH | CL_WARM_GC);
  bool done = false;
  if (CL_LIKELY(w == CL_WARM_MALLOC)) /* (MALLOC: armed, bins there) */
    done = malloc_warm(d, ln, size, out);
  else if ((w & (CL_WARM_MALLOC | CL_WARM_STOP)) == CL_WARM_MALLOC)
    done = malloc_warm_flagged(d, ln, size, s, warm, stamp, out);
  cl_spin_unlock(&ln->lock);
  if (CL_LIKELY(done))
    return CL_WARM_DONE;
  return cl_warm_missed(d, warm);
}

/* Before exclusive mode: a cold lane arms, or a lane short of room for the stats' peaks gathers it, under
 * the device mutex alone, and the warm path runs again. Whether that served the call. */
static bool warm_again(cl_device *d, size_t size, cachalot_stream s, void **out) {
  cl_lane *ln = cl_lane_find(d, s);
  if (!ln)
    return false;
  if (cl_lane_looks_cold(ln) && cl_lane_arm_quick(d, ln) && malloc_fast(d, size, s, out) == CL_WARM_DONE)
    return true;
  return cl_lane_gather_room(d, ln) && malloc_fast(d, size, s, out) == CL_WARM_DONE;
}

/* Everything but the warm path, in exclusive mode. */
static __attribute__((noinline)) cachalot_status malloc_slow(cl_device *d, size_t size, cachalot_stream s,
                                                             void **out, cl_warm_result warm) {
  if (CL_UNLIKELY(cl_forked(d->owner))) {
    *out = NULL;
    return cl_forked_fail("cachalot_malloc");
  }
  while (warm == CL_WARM_STOPPED) /* another thread was entering exclusive mode: after it, warm again */
    if ((warm = malloc_fast(d, size, s, out)) == CL_WARM_DONE)
      return CACHALOT_OK;
  if (warm_again(d, size, s, out))
    return CACHALOT_OK;
  *out = NULL;
  const int device = d->index;
  cachalot_status rc;
  cl_enter_exclusive(d);
  if (!cl_capturing(d))
    cl_process_events_locked(d);

  const size_t rounded = cl_round_size(&d->cfg, size);
  const bool small = cl_is_small(rounded);
  const size_t alloc_size = cl_segment_size(rounded);
  cl_pool *p = d->n_routes ? cl_route_pool_locked(d, s) : &d->default_pool;
  if (d->n_deferred && d->cfg.capture_reuse && cl_capturing(d))
    cl_capture_reuse_locked(d, s);

  cl_block *b = planned_or_best_fit_locked(d, p, s, small, rounded);
  if (!b) {
    cl_release_list rel = {0};
    bool host_oom = false;
    cl_pool *const held = p; /* the steps below may drop the lock: p must outlive a release meanwhile */
    cl_pool_hold_locked(d, held);
    /* During a capture nothing goes back to the device (a free would break the capture, or take memory
     * the captured work uses): no collection, no oversize release, no release-all retry. */
    if (d->fraction >= 0 && d->cfg.gc_threshold > 0 && !cl_capturing(d)) {
      cl_garbage_collect_locked(d, &rel);
      (void)cl_release_flush_locked(d, &rel);
    }
    rc = new_memory_locked(d, p, s, small, rounded, false, &b, &host_oom);
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom && !cl_capturing(d)) {
      bool enough = cl_release_oversize_locked(d, p, s, small, rounded, &rel);
      (void)cl_release_flush_locked(d, &rel); /* what was marked goes back, enough or not */
      if (enough)
        rc = new_memory_locked(d, p, s, small, rounded, false, &b, &host_oom);
    }
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom && !cl_capturing(d)) {
      (void)cl_release_all_locked(d);
      cl_lanes_rest_locked(d); /* as empty_cache: streams left with nothing keep no state (the retry makes s's anew) */
      rc = new_memory_locked(d, p, s, small, rounded, true, &b, &host_oom);
    }
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom && p == &d->default_pool &&
        (b = use_on_oom_block_locked(d, s, small, rounded, &p)))
      rc = CACHALOT_OK;
    cl_pool_unhold_locked(d, held); /* b, if any, keeps its pool: it is in one of its segments */
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom)
      return cl_out_of_memory_unlock(d, alloc_size);
    if (rc != CACHALOT_OK) {
      cl_leave_exclusive(d);
      cl_error_prefix("cachalot_malloc: device %d: ", device);
      return rc;
    }
  }
  cl_block *a = hand_out(d, CL_EXCLUSIVE, b, small, 0, NULL, NULL, rounded, size);
  if (a && d->step) /* expandable_plan: the tracker numbers the default pool's blocks */
    cl_plan_note_malloc_locked(d, a, rounded, s);
  if (a) /* its stream's next calls on the warm path */
    cl_lane_arm_locked(d, a->seg->lane);
  if (a && cl_pool_is_default(d, p))
    cl_lane_refill_spares_locked(d, a->seg->lane);
  cl_leave_exclusive(d);
  if (!a) {
    rc = CACHALOT_ERROR_OUT_OF_MEMORY;
    cl_error_prefix("cachalot_malloc: device %d: ", device);
    return rc;
  }
  *out = (void *)a->ptr;
  return CACHALOT_OK;
}

/* cachalot_malloc, with or without a context (the entry points are shells over it). */
CL_INLINE cachalot_status malloc_entry(cachalot_allocator *a, int device, size_t size, cachalot_stream s, void **out) {
  if (CL_UNLIKELY(!out))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_malloc: out is NULL");
  /* *out is written once: the pointer, or NULL on every other return (malloc_slow sees to its own) */
  if (CL_UNLIKELY(!a || (unsigned)device >= (unsigned)a->device_count)) {
    *out = NULL;
    return cl_check_device_arg(a, device, "cachalot_malloc");
  }
  if (CL_UNLIKELY(size - 1 >= CL_MAX_REQUEST - 1)) { /* 0, or at least CL_MAX_REQUEST */
    *out = NULL;
    if (size == 0)
      return CACHALOT_OK;
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  cl_device *d = &a->devices[device];
  if (CL_UNLIKELY(atomic_load_explicit(&d->detect, memory_order_relaxed))) {
    cachalot_status rc = cl_autocapture_malloc(a, d, s);
    if (rc != CACHALOT_OK) {
      *out = NULL;
      return rc;
    }
  }
  const cl_warm_result warm = malloc_fast(d, size, s, out);
  if (CL_LIKELY(warm == CL_WARM_DONE))
    return CACHALOT_OK;
  return malloc_slow(d, size, s, out, warm);
}

cachalot_status cachalot_malloc(cachalot_allocator *a, int device, size_t size, cachalot_stream s, void **out) {
  return malloc_entry(a, device, size, s, out);
}

cachalot_status cachalot_malloc_with_context(cachalot_allocator *a, int device, size_t size, cachalot_stream s,
                                             void *ctx, void **out) {
  void *const saved = cl_ctx_push(&cl_tls_alloc_ctx, ctx);
  const cachalot_status rc = malloc_entry(a, device, size, s, out);
  cl_ctx_pop(&cl_tls_alloc_ctx, saved);
  return rc;
}
