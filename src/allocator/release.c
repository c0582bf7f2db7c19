/* Giving cached memory back to the device: whole free segments only (PyTorch's free rules), in three
 * policies: release everything (empty_cache, the OOM retry), garbage collection by age (malloc step 4) and
 * release of oversize blocks (step 6).
 *
 * Releasing is two-phase so that no lock is held across the device free: segments are first marked
 * `releasing` under the lock (out of their free index, so nobody can be handed their memory), then
 * flushed to the backend with the lock dropped; only a segment whose device free succeeded leaves the
 * books and the stats. A free can fail (e.g. while the program captures a CUDA graph): that segment
 * simply stays cached.
 *
 * The entry points cachalot_empty_cache and cachalot_empty_cache_pool are here too, with the rest the
 * emptying gives streams that have nothing left (cl_lanes_rest_locked). */
#include "internal.h"

#include <stdlib.h>

/* A whole free segment that can go back to the device (not a run of an expandable segment, which goes
 * back a page at a time: expandable.c). */
static inline bool segment_is_free(const cl_segment *s) {
  return !s->releasing && !s->expandable && s->head->state == CL_FREE && s->head->next == NULL;
}

/* Takes a whole free segment out of its free index and adds it to `out`. */
static void mark_release_locked(cl_device *d, cl_segment *s, cl_release_list *out) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_free_index_remove_locked(d, s->head);
  s->releasing = true;
  s->release_next = out->head;
  out->head = s;
}

/* The segment is gone from the device: off the books. */
static void forget_segment_locked(cl_device *d, cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_segment_unlink_locked(d, s);
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->segment, s->small, -1);
  cl_stat_array_add(st->reserved_bytes, s->small, -(int64_t)s->size);
  if (s->size >= d->cfg.max_split_size)
    cl_stat_dec(&st->oversize_segments, 1);
  st->num_device_free++;
  cl_trace_ctx_locked(d, CL_TRACE_SEGMENT_FREE, s->ptr, s->size, s->stream, s->ctx); /* the malloc's that made it */
  cl_segment_ctx_drop_locked(d, s);
  cl_page_map_remove(&d->owner->pages, s);
  cl_block_delete_locked(d, s->head);
  s->head = s->tail = NULL;
  s->release_next = d->spare_segments;
  d->spare_segments = s;
}

cachalot_status cl_release_flush_locked(cl_device *d, cl_release_list *list) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_segment *head = list->head;
  list->head = NULL;
  if (!head)
    return CACHALOT_OK;
  cachalot_backend *b = d->owner->backend;
  const bool drop = d->cfg.release_lock_on_cudamalloc;
  if (drop)
    cl_leave_exclusive(d);
  cachalot_status result = CACHALOT_OK;
  /* Other threads leave `releasing` segments alone (no index holds them, every walk skips them), so the
   * releasing thread may use ptr and device_freed without the lock. */
  for (cl_segment *s = head; s; s = s->release_next) {
    /* where the memory came from is the segment's: the pool (which outlives its segments) has the source */
    const cachalot_segment_source *src = s->from_source ? cl_pool_source(d, s->pool) : NULL;
    cachalot_status st = CACHALOT_OK;
    if (src)
      src->free((void *)s->ptr, s->size, d->index, s->stream, src->ctx);
    else
      st = b->ops->free(b, d->index, (void *)s->ptr);
    if (st != CACHALOT_OK && result == CACHALOT_OK)
      result = st;
    s->device_freed = st == CACHALOT_OK;
  }
  if (drop)
    cl_enter_exclusive(d);
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

/* The whole free segments of `only` (NULL: of the default pool and of every freeable private pool) go back,
 * and the device's free pages of expandable runs are unmapped (only when `only` has runs: unmapping is per
 * device, so one pool's pages go with everything else's, more than asked, never less). */
static cachalot_status release_locked(cl_device *d, const cl_pool *only) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_status synced = cl_sync_all_events_locked(d);
  cl_release_list rel = {0};
  bool expandable = false;
  for (cl_segment *s = d->segments, *next; s; s = next) {
    next = s->next;
    /* a private pool still in use keeps its segments: a graph may replay into them */
    bool eligible = only ? s->pool == only : cl_pool_is_default(d, s->pool) || s->pool->use_count == 0;
    if (!eligible)
      continue;
    expandable |= s->expandable;
    if (segment_is_free(s))
      mark_release_locked(d, s, &rel);
  }
  cachalot_status freed = cl_release_flush_locked(d, &rel);
  cachalot_status unmapped = CACHALOT_OK;
  if (!only || expandable) {
    bool device_synced = false;
    unmapped = cl_unmap_all_locked(d, &device_synced);
  }
  cl_pools_collect_locked(d);
  return synced != CACHALOT_OK ? synced : freed != CACHALOT_OK ? freed : unmapped;
}

cachalot_status cl_release_all_locked(cl_device *d) { return release_locked(d, NULL); }

cachalot_status cl_release_pool_locked(cl_device *d, const cl_pool *p) { return release_locked(d, p); }

/* What garbage collection may give back: a whole free segment of the large default pool, or the whole
 * pages of a free block in one of its expandable runs; `age` counts the lookups since it became free. */
typedef struct {
  cl_segment *seg; /* a whole free segment, or NULL */
  cl_block *blk;   /* else: a free block of an expandable run */
  uint64_t age;
  size_t bytes;
  bool taken;
} gc_candidate;

/* The candidates, in a malloc'ed array (NULL with *n 0 when there are none or the host has no memory:
 * no collection this time, which is safe). */
static gc_candidate *gc_candidates_locked(cl_device *d, uint64_t now, size_t *n) {
  CL_ASSERT_EXCLUSIVE(d);
  size_t count = 0, cap = 0;
  gc_candidate *v = NULL;
  for (cl_segment *s = d->segments; s; s = s->next) {
    if (s->pool != &d->default_pool || s->small || !(segment_is_free(s) || (s->expandable && !cl_capturing(d))))
      continue;
    for (cl_block *b = s->head; b; b = b->next) {
      gc_candidate c = {0};
      if (!s->expandable)
        c = (gc_candidate){s, NULL, now - b->gc_base, s->size, false};
      else if (b->state == CL_FREE)
        c = (gc_candidate){NULL, b, now - b->gc_base, cl_unmappable_bytes(b), false};
      if (!c.bytes)
        continue;
      if (count == cap) {
        cap = cap ? 2 * cap : 16;
        gc_candidate *nv = realloc(v, cap * sizeof *nv);
        if (!nv) {
          free(v);
          *n = 0;
          return NULL;
        }
        v = nv;
      }
      v[count++] = c;
    }
  }
  *n = count;
  return v;
}

void cl_garbage_collect_locked(cl_device *d, cl_release_list *out) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_fraction_resolve_locked(d);
  const size_t threshold = cl_scale_bytes(d->cfg.gc_threshold, d->allowed_max);
  const size_t reserved = (size_t)d->stats.reserved_bytes[CACHALOT_STAT_ALL].current + d->inflight;
  if (reserved <= threshold)
    return;
  const size_t target = reserved - threshold;
  size_t count;
  gc_candidate *cand = gc_candidates_locked(d, d->default_pool.lookups[0], &count);
  uint64_t total_age = 0;
  for (size_t i = 0; i < count; i++)
    total_age += cand[i].age;
  /* Passes free every candidate at least as old as the mean age; a pass does not stop at the target,
   * so that collection is not triggered again at once (PyTorch's policy). Unmapping a free block
   * changes that block and its run only, so the other candidates stay valid. */
  size_t reclaimed = 0, left = count;
  bool freed = true, synced = false;
  while (reclaimed < target && freed && left > 0) {
    const double mean_age = (double)total_age / (double)left;
    freed = false;
    for (size_t i = 0; i < count; i++) {
      gc_candidate *c = &cand[i];
      if (c->taken || (double)c->age < mean_age)
        continue;
      c->taken = freed = true;
      total_age -= c->age;
      left--;
      if (c->seg) {
        reclaimed += c->bytes;
        mark_release_locked(d, c->seg, out);
      } else {
        size_t n;
        (void)cl_unmap_block_locked(d, c->blk, SIZE_MAX, &synced, &n); /* a failure leaves it cached */
        reclaimed += n;
      }
    }
  }
  free(cand);
}

/* Gives back what a free oversize block can: its segment if it is whole (marked in `out`), or the
 * whole pages of a block of an expandable run (unmapped now; smaller than a page, what is left around
 * them is not oversize). Returns the bytes. */
static size_t release_oversize_block(cl_device *d, cl_block *b, cl_release_list *out, bool *synced) {
  if (b->seg->expandable) {
    size_t n;
    (void)cl_unmap_block_locked(d, b, SIZE_MAX, synced, &n); /* a failure leaves it cached */
    return n;
  }
  if (b->prev || b->next)
    return 0;
  mark_release_locked(d, b->seg, out);
  return b->seg->size;
}

bool cl_release_oversize_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                cl_release_list *out) {
  CL_ASSERT_EXCLUSIVE(d);
  const size_t max_split = d->cfg.max_split_size;
  /* Small-pool blocks (at most 2 MiB) are never oversize: max_split_size is at least 20 MiB. */
  if (max_split == SIZE_MAX || small)
    return false;
  cl_bins *bins = cl_bins_get_locked(d, p, s, false);
  if (!bins)
    return false;
  const size_t key = size < max_split ? max_split : size;
  cl_fit *f = &bins->kind[0];
  bool synced = false;
  cl_block *b = cl_fit_lower_bound(f, false, key);
  cl_block *cur = b ? cl_fit_prev(f, false, b) : cl_fit_max(f); /* before b changes */
  size_t released = b ? release_oversize_block(d, b, out, &synced) : 0;
  if (released >= key)
    return true;
  /* No single block gave enough: free oversize blocks from the largest down until enough, in (size, ptr)
   * order across the classes. Only whole segments (or whole pages of runs) can go back; a split segment
   * is passed over. */
  while (cur && released < key && cur->size >= max_split) {
    cl_block *prev = cl_fit_prev(f, false, cur); /* not changed by what happens to cur */
    released += release_oversize_block(d, cur, out, &synced);
    cur = prev;
  }
  return released >= key;
}

void cl_lanes_rest_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  /* A malloc that dropped the lock around its device allocation holds its lane and free index, for a
   * segment not yet in the list: resting must wait for another time (the stress test found it). */
  if (d->inflight)
    return;
  for (size_t i = 0; i < d->n_lanes; i++)
    d->lanes[i]->busy = false;
  for (cl_segment *s = d->segments; s; s = s->next)
    cl_seg_lane(s)->busy = true;
  size_t kept = 0, kept_armed = 0; /* a stable compaction: the armed lanes stay first */
  for (size_t i = 0; i < d->n_lanes; i++) {
    cl_lane *ln = d->lanes[i];
    if (ln->busy) {
      kept_armed += ln->armed;
      ln->pos = kept;
      d->lanes[kept++] = ln;
      continue;
    }
    if (!ln->armed) /* cold: exclusive mode does not hold it (a warm path may, for a moment) */
      cl_spin_lock(&ln->lock);
    /* No segment of its stream is left in any pool: nothing refers to its default-pool bins */
    cl_bins *bins = cl_bins_get_locked(d, &d->default_pool, ln->stream, false);
    if (bins) {
      HASH_DEL(d->default_pool.bins, bins);
      if (d->default_pool.last_bins == bins)
        d->default_pool.last_bins = NULL;
      cl_vranges_release_locked(d, bins);
      free(bins);
    }
    ln->bins = NULL;
    while (ln->spare) {
      cl_block *b = ln->spare;
      ln->spare = b->next;
      cl_block_delete_locked(d, b);
    }
    ln->n_spare = 0;
    ln->dormant = true;
    ln->armed = false;
    atomic_store_explicit(&ln->warm, 0, memory_order_relaxed);
    cl_spin_unlock(&ln->lock); /* cl_leave_exclusive no longer lets go of it */
  }
  d->n_lanes = kept;
  d->n_armed = kept_armed;
  cl_stream_events *se, *tmp;
  HASH_ITER(hh, d->events, se, tmp) {
    if (!se->head) {
      HASH_DEL(d->events, se);
      free(se);
    }
  }
}

/* cachalot_empty_cache (also cachalot_empty_cache_pool's for the default pool). */
static cachalot_status empty_cache(cachalot_allocator *a) {
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_empty_cache: allocator is NULL");
  if (cl_forked(a))
    return cl_forked_fail("cachalot_empty_cache");
  cachalot_status result = CACHALOT_OK;
  if (atomic_load_explicit(&a->n_auto, memory_order_relaxed))
    cl_autocapture_poll(a); /* a detected capture that is over no longer counts as one underway */
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    /* During a capture nothing is synchronized or freed: either would break the capture. */
    if (!cl_capturing(d)) {
      cachalot_status rc = cl_release_all_locked(d);
      if (rc != CACHALOT_OK && result == CACHALOT_OK)
        result = rc;
      cl_lanes_rest_locked(d); /* streams with nothing left cost exclusive mode nothing from now on */
    }
    cl_leave_exclusive(d);
  }
  if (result != CACHALOT_OK)
    cl_error_prefix("cachalot_empty_cache: ");
  return result;
}

cachalot_status cachalot_empty_cache(cachalot_allocator *a) { return empty_cache(a); }

cachalot_status cachalot_empty_cache_pool(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  static const char who[] = "cachalot_empty_cache_pool";
  cachalot_status rc = cl_check_device_arg(a, device, who);
  if (rc != CACHALOT_OK)
    return rc;
  if (cl_pool_id_is_default(id))
    return empty_cache(a);
  if ((rc = cl_check_private_id(id, who)) != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  cl_enter_exclusive(d);
  cl_pool *p = cl_find_pool_locked(d, id);
  if (!p || p->use_count > 0 || cl_capturing(d)) { /* nothing of it, in use, or not now: nothing to do */
    cl_leave_exclusive(d);
    return CACHALOT_OK;
  }
  rc = cl_release_pool_locked(d, p);
  cl_leave_exclusive(d);
  if (rc != CACHALOT_OK)
    cl_error_prefix("cachalot_empty_cache_pool: ");
  return rc;
}
