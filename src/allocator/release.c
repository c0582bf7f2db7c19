/* Giving cached memory back to the device: whole free segments only (SPEC.md §2), in three policies:
 * release everything (empty_cache, the OOM retry), garbage collection by age (malloc step 4) and
 * release of oversize blocks (step 6).
 *
 * Releasing is two-phase so that no lock is held across the device free: segments are first marked
 * `releasing` under the lock (out of their free index, so nobody can be handed their memory), then
 * flushed to the backend with the lock dropped; only a segment whose device free succeeded leaves the
 * books and the stats. A free can fail (e.g. while the program captures a CUDA graph): that segment
 * simply stays cached. */
#include "internal.h"

#include <stdlib.h>

static inline bool segment_is_free(const cl_segment *s) {
  return !s->releasing && s->head->state == CL_FREE && s->head->next == NULL;
}

void cl_mark_release_locked(cl_device *d, cl_segment *s, cl_release_list *out) {
  cl_free_index_remove_locked(d, s->head);
  s->releasing = true;
  s->release_next = out->head;
  out->head = s;
}

/* The segment is gone from the device: off the books. */
static void forget_segment_locked(cl_device *d, cl_segment *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    d->segments = s->next;
  if (s->next)
    s->next->prev = s->prev;
  d->n_segments--;
  s->pool->n_segments--;
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->segment, s->small, -1);
  cl_stat_array_add(st->reserved_bytes, s->small, -(int64_t)s->size);
  if (s->size >= d->cfg.max_split_size)
    cl_stat_dec(&st->oversize_segments, 1);
  st->num_device_free++;
  cl_trace_locked(d, CL_TRACE_SEGMENT_FREE, s->ptr, s->size, s->stream);
  cl_page_map_remove(&d->owner->pages, s);
  cl_block_delete_locked(d, s->head);
  s->head = NULL;
  s->release_next = d->spare_segments;
  d->spare_segments = s;
}

cachalot_status cl_release_flush_locked(cl_device *d, cl_release_list *list) {
  cl_segment *head = list->head;
  list->head = NULL;
  if (!head)
    return CACHALOT_OK;
  cachalot_backend *b = d->owner->backend;
  const bool drop = d->cfg.release_lock_on_cudamalloc;
  if (drop)
    cl_unlock(d);
  cachalot_status result = CACHALOT_OK;
  /* Other threads leave `releasing` segments alone (no index holds them, every walk skips them), so the
   * releasing thread may use ptr and device_freed without the lock. */
  for (cl_segment *s = head; s; s = s->release_next) {
    cachalot_status st = b->ops->free(b, d->index, (void *)s->ptr);
    if (st != CACHALOT_OK && result == CACHALOT_OK)
      result = st;
    s->device_freed = st == CACHALOT_OK;
  }
  if (drop)
    cl_lock(d);
  for (cl_segment *s = head, *next; s; s = next) {
    next = s->release_next;
    s->release_next = NULL;
    s->releasing = false;
    if (s->device_freed)
      forget_segment_locked(d, s);
    else
      cl_free_index_insert_locked(d, s->head);
  }
  return result;
}

cachalot_status cl_release_all_locked(cl_device *d) {
  cachalot_status synced = cl_sync_all_events_locked(d);
  cl_release_list rel = {0};
  for (cl_segment *s = d->segments, *next; s; s = next) {
    next = s->next;
    /* a private pool still in use keeps its segments: a graph may replay into them */
    bool eligible = cl_pool_is_default(d, s->pool) || s->pool->use_count == 0;
    if (eligible && segment_is_free(s))
      cl_mark_release_locked(d, s, &rel);
  }
  cachalot_status freed = cl_release_flush_locked(d, &rel);
  cl_pools_collect_locked(d);
  return synced != CACHALOT_OK ? synced : freed;
}

static inline bool gc_candidate(const cl_device *d, const cl_segment *s) {
  return s->pool == &d->default_pool && !s->small && segment_is_free(s);
}

void cl_garbage_collect_locked(cl_device *d, cl_release_list *out) {
  cl_fraction_resolve_locked(d);
  const size_t threshold = (size_t)(d->cfg.gc_threshold * (double)d->allowed_max);
  const size_t reserved = (size_t)d->stats.reserved_bytes[CACHALOT_STAT_ALL].current + d->inflight;
  if (reserved <= threshold)
    return;
  const size_t target = reserved - threshold;
  const uint64_t now = d->default_pool.lookups[0];

  uint64_t total_age = 0;
  size_t count = 0;
  for (cl_segment *s = d->segments; s; s = s->next) {
    if (gc_candidate(d, s)) {
      total_age += now - s->head->gc_base;
      count++;
    }
  }
  /* Passes free every candidate at least as old as the mean age; a pass does not stop at the target,
   * so that collection is not triggered again at once (PyTorch's policy). */
  size_t reclaimed = 0;
  bool freed = true;
  while (reclaimed < target && freed && count > 0) {
    const double mean_age = (double)total_age / (double)count;
    freed = false;
    cl_segment *s = d->segments;
    while (s) {
      cl_segment *next = s->next;
      if (gc_candidate(d, s)) {
        uint64_t age = now - s->head->gc_base;
        if ((double)age >= mean_age) {
          freed = true;
          reclaimed += s->size;
          total_age -= age;
          count--;
          cl_mark_release_locked(d, s, out);
        }
      }
      s = next;
    }
  }
}

bool cl_release_oversize_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                cl_release_list *out) {
  const size_t max_split = d->cfg.max_split_size;
  /* Small-pool blocks (at most 2 MiB) are never oversize: max_split_size is at least 20 MiB. */
  if (max_split == SIZE_MAX || small)
    return false;
  cl_bins *bins = cl_bins_get_locked(p, s, false);
  if (!bins)
    return false;
  const size_t key = size < max_split ? max_split : size;
  cl_fit *f = &bins->kind[0];
  cl_block *b = cl_fit_lower_bound(f, false, key);
  if (b && !b->prev && !b->next) {
    cl_mark_release_locked(d, b->seg, out);
    return true;
  }
  /* No single block is large enough: free oversize blocks from the largest down until enough, in
   * (size, ptr) order across the classes. Only whole segments can go back; a split one is passed over. */
  cl_block *cur = b ? cl_fit_prev(f, false, b) : cl_fit_max(f);
  size_t released = 0;
  while (cur && released < key && cur->size >= max_split) {
    cl_block *prev = cl_fit_prev(f, false, cur);
    if (!cur->prev && !cur->next) {
      released += cur->size;
      cl_mark_release_locked(d, cur->seg, out);
    }
    cur = prev;
  }
  return released >= key;
}
