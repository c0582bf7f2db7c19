/* cachalot_malloc: the steps of SPEC.md §3, in order.
 *
 *   poll events -> round, choose pool -> best fit on this stream -> (gc) -> new segment
 *     -> (free oversize blocks, new segment) -> (free all cached, new segment: a retry) -> OOM
 */
#include "internal.h"

#include <stdlib.h>

/* malloc step 3: best fit from (pool, stream, kind), honouring the oversize rules. The block is taken
 * out of the index. */
static cl_block *get_free_block_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size) {
  const cl_config *c = &d->cfg;
  if (d->fraction >= 0 && c->gc_threshold > 0)
    p->lookups[small]++;
  cl_bins *bins = cl_bins_get_locked(p, s, false);
  if (!bins)
    return NULL;
  cl_block *b = cl_tree_lower_bound(bins->root[small], size);
  if (!b)
    return NULL;
  if (size < c->max_split_size && b->size >= c->max_split_size)
    return NULL; /* a request below max_split_size never takes an oversize block */
  if (size >= c->max_split_size && b->size - size >= c->max_non_split_rounding)
    return NULL; /* nor does an oversize request take a block far larger than itself */
  cl_tree_remove(bins, small, b);
  return b;
}

/* malloc step 5: a new segment of `alloc_size` from the device. The lock is dropped around the device
 * call unless release_lock_on_cudamalloc is False. On success *out is the segment's single block, not
 * in any index. OUT_OF_MEMORY when the fraction or the device says no, or, with *host_oom set, when
 * the host has no memory for the metadata (freeing device memory would not help then); other statuses
 * are device errors. */
static cachalot_status alloc_segment_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small,
                                            size_t alloc_size, bool is_retry, cl_block **out, bool *host_oom) {
  *out = NULL;
  *host_oom = false;
  cachalot_device_stats *st = &d->stats;
  if (is_retry)
    st->num_alloc_retries++;
  if (d->fraction >= 0) {
    cl_fraction_resolve_locked(d);
    size_t reserved = (size_t)st->reserved_bytes[CACHALOT_STAT_ALL].current + d->inflight;
    if (reserved + alloc_size > d->allowed_max)
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "memory fraction limit reached");
  }
  /* Metadata first, so that a host allocation failure never strands device memory. */
  cl_bins *bins = cl_bins_get_locked(p, s, true);
  cl_segment *seg = calloc(1, sizeof *seg);
  cl_block *blk = cl_block_new_locked(d);
  if (!bins || !seg || !blk) {
    free(seg);
    if (blk)
      cl_block_delete_locked(d, blk);
    *host_oom = true;
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }

  cachalot_backend *b = d->owner->backend;
  const bool drop = d->cfg.release_lock_on_cudamalloc;
  void *ptr = NULL;
  d->inflight += alloc_size;
  if (drop)
    pthread_mutex_unlock(&d->lock);
  /* A plain device allocation while any stream captures in global mode fails and invalidates that
   * capture. cachalot is not always told about captures (a program may capture on its own), so the
   * thread is switched to relaxed mode around every device allocation: two cheap calls on a path that
   * is about to call the device anyway. */
  cachalot_capture_mode mode = CACHALOT_CAPTURE_RELAXED;
  cachalot_status rc = b->ops->capture_mode_exchange(b, &mode);
  if (rc == CACHALOT_OK) {
    rc = b->ops->alloc(b, d->index, alloc_size, &ptr);
    cachalot_capture_mode prev = mode;
    (void)b->ops->capture_mode_exchange(b, &prev);
  }
  if (drop)
    pthread_mutex_lock(&d->lock);
  d->inflight -= alloc_size;
  if (rc != CACHALOT_OK) {
    free(seg);
    cl_block_delete_locked(d, blk);
    return rc;
  }

  seg->ptr = (uintptr_t)ptr;
  seg->size = alloc_size;
  seg->pool = p;
  seg->stream = s;
  seg->small = small;
  seg->head = blk;
  seg->prev = NULL;
  seg->next = d->segments;
  if (d->segments)
    d->segments->prev = seg;
  d->segments = seg;
  d->n_segments++;
  p->n_segments++;

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
  cl_trace_locked(d, CL_TRACE_SEGMENT_ALLOC, seg->ptr, alloc_size, s);
  *out = blk;
  return CACHALOT_OK;
}

/* Hands out `b` (FREE, in no index) for a request of rounded `size`, splitting off the rest when the
 * split rule says so. On host OOM the block goes back
 * to its index and nothing changes. */
static cachalot_status hand_out_locked(cl_device *d, cl_block *b, size_t size, size_t requested) {
  cl_segment *seg = b->seg;
  const bool small = seg->small;
  cachalot_device_stats *st = &d->stats;
  const bool split = cl_should_split(&d->cfg, small, b->size, size);
  const bool already_split = b->prev || b->next;

  cl_block *rest = NULL;
  if (split && !(rest = cl_block_new_locked(d))) {
    cl_free_index_insert_locked(d, b);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  bool hash_oom = false;
  HASH_ADD_PTR(d->active, ptr, b);
  if (hash_oom) {
    if (rest)
      cl_block_delete_locked(d, rest);
    cl_free_index_insert_locked(d, b);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }

  if (split) {
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->seg = seg;
    rest->prev = b;
    rest->next = b->next;
    if (rest->next)
      rest->next->prev = rest;
    b->next = rest;
    b->size = size;
    cl_free_index_insert_locked(d, rest);
    if (already_split) {
      /* an inactive split block shrinks by `size` */
      cl_stat_array_add(st->inactive_split_bytes, small, -(int64_t)size);
    } else {
      /* a whole segment becomes split: its rest is a new inactive split block */
      cl_stat_array_add(st->inactive_split_bytes, small, (int64_t)rest->size);
      cl_stat_array_add(st->inactive_split, small, 1);
    }
  } else if (already_split) {
    cl_stat_array_add(st->inactive_split_bytes, small, -(int64_t)b->size);
    cl_stat_array_add(st->inactive_split, small, -1);
  }

  b->state = CL_ALLOCATED;
  b->requested = requested;
  b->n_uses = 0;
  b->event_count = 0;
  cl_stats_hand_out(st, &d->cfg, small, b->size, requested);
  cl_trace_locked(d, CL_TRACE_ALLOC, b->ptr, requested, seg->stream);
  return CACHALOT_OK;
}

cachalot_status cachalot_malloc(cachalot_allocator *a, int device, size_t size, cachalot_stream s, void **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_malloc: out is NULL");
  *out = NULL;
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_malloc");
  if (rc != CACHALOT_OK)
    return rc;
  if (size == 0)
    return CACHALOT_OK;
  if (size >= CL_MAX_REQUEST)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "CUDA out of memory. Tried to allocate more than 1EB memory.");

  cl_device *d = &a->devices[device];
  pthread_mutex_lock(&d->lock);
  if (!cl_capturing(d))
    cl_process_events_locked(d);

  const size_t rounded = cl_round_size(&d->cfg, size);
  const bool small = cl_is_small(rounded);
  const size_t alloc_size = cl_segment_size(rounded);
  cl_pool *p = d->n_routes ? cl_route_pool_locked(d, s) : &d->default_pool;

  cl_block *b = get_free_block_locked(d, p, s, small, rounded);
  if (!b) {
    cl_release_list rel = {0};
    bool host_oom = false;
    if (d->fraction >= 0 && d->cfg.gc_threshold > 0) {
      cl_garbage_collect_locked(d, &rel);
      (void)cl_release_flush_locked(d, &rel);
    }
    rc = alloc_segment_locked(d, p, s, small, alloc_size, false, &b, &host_oom);
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom) {
      bool enough = cl_release_oversize_locked(d, p, s, small, rounded, &rel);
      (void)cl_release_flush_locked(d, &rel); /* what was marked goes back, enough or not */
      if (enough)
        rc = alloc_segment_locked(d, p, s, small, alloc_size, false, &b, &host_oom);
    }
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom && !cl_capturing(d)) {
      (void)cl_release_all_locked(d);
      rc = alloc_segment_locked(d, p, s, small, alloc_size, true, &b, &host_oom);
    }
    if (rc == CACHALOT_ERROR_OUT_OF_MEMORY && !host_oom)
      return cl_out_of_memory_unlock(d, alloc_size);
    if (rc != CACHALOT_OK) {
      pthread_mutex_unlock(&d->lock);
      cl_error_prefix("cachalot_malloc: device %d: ", device);
      return rc;
    }
  }
  rc = hand_out_locked(d, b, rounded, size);
  void *ptr = (void *)b->ptr;
  pthread_mutex_unlock(&d->lock);
  if (rc != CACHALOT_OK) {
    cl_error_prefix("cachalot_malloc: device %d: ", device);
    return rc;
  }
  *out = ptr;
  return CACHALOT_OK;
}
