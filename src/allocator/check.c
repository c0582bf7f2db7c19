/* cachalot_check: walks every segment and block of every device, verifies the structural invariants
 * written above the structs in core/types.h, and recomputes every current stat from the blocks. It is
 * O(blocks x log blocks) and takes each device in exclusive mode in turn: for tests, fuzzers and
 * debugging. */
#include "host/host_cache.h"
#include "internal.h"

#include <string.h>

/* The fuzzers call cachalot_check after every operation: its walks over every table entry and size class
 * would otherwise take most of their time and drown their coverage feedback in loop counts. */
#if defined(__clang__)
#define CL_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#define CL_PLAIN_LOOP __attribute__((no_sanitize("coverage", "address", "undefined")))
#else
#define CL_NO_COVERAGE
#define CL_PLAIN_LOOP __attribute__((no_sanitize_address, no_sanitize_undefined))
#endif

/* The non-NULL entries of a handed-out table of n entries. Most of a check's time went here (a small
 * segment has 4096 entries, a small run 4096 per page); without sanitizer checks on each load the loop
 * vectorizes. It reads only the table's own entries. */
CL_PLAIN_LOOP static size_t count_entries(cl_block *const *at, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += at[i] != NULL;
  return k;
}

typedef struct {
  int64_t v[3];
} tally; /* all, small, large */

static void tally_add(tally *t, bool small, int64_t n) {
  t->v[CACHALOT_STAT_ALL] += n;
  t->v[small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL] += n;
}

static const char *kind_name[3] = {"all", "small_pool", "large_pool"};

static cachalot_status compare(int dev, const char *name, const cachalot_stat *arr, const tally *t) {
  for (int k = 0; k < 3; k++)
    if (arr[k].current != t->v[k])
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: %s.%s.current is %lld but the blocks say %lld", dev, name,
                     kind_name[k], (long long)arr[k].current, (long long)t->v[k]);
  return CACHALOT_OK;
}

/* Verifies the treap of class `cls`: keys strictly increase in order, priorities form a heap, every node
 * is a FREE block of this bins' stream and kind whose size falls in that class. Returns the node count,
 * or -1 after cl_fail. */
CL_NO_COVERAGE static long check_tree(int dev, const cl_block *t, const cl_bins *bins, bool small, unsigned cls,
                       const cl_block **last) {
  if (!t)
    return 0;
  long l = check_tree(dev, t->left, bins, small, cls, last);
  if (l < 0)
    return -1;
  if (t->state != CL_FREE || !t->seg || t->seg->stream != bins->stream || t->seg->small != small) {
    cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: block 0x%llx in a free index it does not belong to",
            dev, (unsigned long long)t->ptr);
    return -1;
  }
  if ((t->left && t->left->prio > t->prio) || (t->right && t->right->prio > t->prio)) {
    cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: free index heap order broken", dev);
    return -1;
  }
  if (*last && !((*last)->size < t->size || ((*last)->size == t->size && (*last)->ptr < t->ptr))) {
    cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: free index key order broken", dev);
    return -1;
  }
  if (cl_fit_class(small, t->size) != cls || t->cls != cls) {
    cl_fail(CACHALOT_ERROR_INVALID_STATE,
            "cachalot_check: device %d: free block 0x%llx of %zu bytes (class %u, recorded %u) is in class %u's tree",
            dev, (unsigned long long)t->ptr, t->size, cl_fit_class(small, t->size), (unsigned)t->cls, cls);
    return -1;
  }
  *last = t;
  long r = check_tree(dev, t->right, bins, small, cls, last);
  return r < 0 ? -1 : l + 1 + r;
}

/* Verifies one kind of a free index: every class tree (check_tree), keys increasing across classes too,
 * a map bit set iff its class is non-empty, a summary bit set iff its map word is non-zero. Returns the
 * block count (the caller compares it with the free blocks of the segments), or -1 after cl_fail. */
CL_NO_COVERAGE static long check_kind(int dev, const cl_bins *bins, bool small) {
  const cl_fit *f = &bins->kind[small];
  const unsigned n = cl_fit_n_classes(small);
  const cl_block *last = NULL;
  long total = 0;
  for (unsigned c = 0; c < CL_FIT_CLASSES; c++) {
    const bool bit = (f->map[c / 64] >> (c % 64)) & 1;
    if (bit != (f->root[c] != NULL) || (c >= n && f->root[c])) {
      cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: free index bitmap bit %u of the %s kind is %d",
              dev, c, small ? "small" : "large", (int)bit);
      return -1;
    }
    long k = check_tree(dev, f->root[c], bins, small, c, &last);
    if (k < 0)
      return -1;
    total += k;
  }
  for (unsigned w = 0; w < 64; w++) {
    const uint64_t word = w < CL_FIT_WORDS ? f->map[w] : 0;
    const uint64_t beyond = w * 64 >= n ? ~(uint64_t)0 : w * 64 + 64 > n ? ~(((uint64_t)1 << (n % 64)) - 1) : 0;
    if ((word & beyond) || (((f->summary >> w) & 1) != (word != 0))) {
      cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: free index summary word %u of the %s kind is off",
              dev, w, small ? "small" : "large");
      return -1;
    }
  }
  return total;
}

/* The reservations of expandable segments (cl_vrange's invariants): each belongs to its bins, its runs
 * are expandable segments of it in address order, page-aligned inside it, never touching, each with a
 * table large enough; and every run of the device's segment list (n_runs) is in one. */
CL_NO_COVERAGE static cachalot_status check_vranges(cl_device *d, size_t n_runs) {
  const int dev = d->index;
  size_t listed = 0;
  for (const cl_vrange *vr = d->vranges; vr; vr = vr->next) {
    if (!vr->bins || vr->bins->vr[vr->small] != vr || !vr->page || vr->size % vr->page ||
        vr->base % (2u << 20))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: reservation 0x%llx is not its index's",
                     dev, (unsigned long long)vr->base);
    uintptr_t low = vr->base; /* where the next run may start */
    for (const cl_segment *r = vr->runs, *prev = NULL; r; prev = r, r = r->run_next) {
      listed++;
      if (!r->expandable || r->vr != vr || r->run_prev != prev || r->small != vr->small || r->bins != vr->bins ||
          r->ptr < low || (r->ptr - vr->base) % vr->page || r->size == 0 || r->size % vr->page ||
          r->size > vr->base + vr->size - r->ptr || (r->size >> r->at_shift) > r->at_cap)
        return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                       "cachalot_check: device %d: run 0x%llx of reservation 0x%llx is misplaced or touches the one "
                       "before it", dev, (unsigned long long)r->ptr, (unsigned long long)vr->base);
      low = r->ptr + r->size + 1;
    }
  }
  if (listed != n_runs)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: %zu expandable segments, the reservations list %zu runs", dev, n_runs,
                   listed);
  for (const cl_segment *s = d->segments; s; s = s->next) { /* and each in its own vrange's list */
    const cl_segment *r = NULL;
    if (s->expandable)
      for (r = s->vr ? s->vr->runs : NULL; r && r != s; r = r->run_next) {
      }
    if (s->expandable && !r)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: run 0x%llx is in no reservation's list",
                     dev, (unsigned long long)s->ptr);
  }
  return CACHALOT_OK;
}

/* What the blocks and segments say the stats and counters should be, summed over one walk. */
typedef struct {
  tally allocation, allocated_bytes, active, active_bytes, requested, segment, reserved, inactive, inactive_bytes;
  int64_t oversize_allocs, oversize_segs;
  size_t n_free, n_segments, n_event_refs, n_runs;
} recount;

/* A segment's own fields, before its blocks: list links, head, lane and index, page map, table. */
CL_NO_COVERAGE static cachalot_status check_segment_locked(cl_device *d, const cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  if (s->next && s->next->prev != s)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: segment list links broken", dev);
  if (!s->head || s->head->prev || s->head->ptr != s->ptr)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: segment 0x%llx has a bad head block",
                   dev, (unsigned long long)s->ptr);
  if (!s->lane || s->lane->dev != d || s->lane->stream != s->stream || s->lane->dormant ||
      s->bins != cl_bins_get_locked(d, s->pool, s->stream, false))
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: segment 0x%llx has the wrong lane or index",
                   dev, (unsigned long long)s->ptr);
  for (uintptr_t pg = s->ptr; pg < s->ptr + s->size && cl_page_mappable(s->ptr + s->size - 1);
       pg += (uintptr_t)1 << CL_PAGE_SHIFT) {
    const cl_segment *m = cl_page_get(&d->owner->pages, pg);
    if (m != s && m != CL_PAGE_SHARED)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: the page map misses segment 0x%llx",
                     dev, (unsigned long long)s->ptr);
  }
  if (s->at_shift != cl_seg_shift(s->small) || !s->at)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: segment 0x%llx has a bad handed-out table",
                   dev, (unsigned long long)s->ptr);
  return CACHALOT_OK;
}

/* A FREE block must be in its free index (unless its segment is being released); it counts as inactive
 * when its segment is split. */
CL_NO_COVERAGE static cachalot_status check_free_block_locked(cl_device *d, const cl_segment *s, const cl_block *b,
                                                              bool split, recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  if (s->releasing) {
    if (split)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a split segment is being released",
                     dev);
    return CACHALOT_OK; /* being given back by another thread: in no index until that finishes */
  }
  cl_bins *bins = cl_bins_get_locked(d, s->pool, s->stream, false);
  if (!bins || !cl_fit_contains(&bins->kind[s->small], s->small, b))
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: free block 0x%llx is missing from its free index", dev,
                   (unsigned long long)b->ptr);
  c->n_free++;
  if (split) {
    tally_add(&c->inactive, s->small, 1);
    tally_add(&c->inactive_bytes, s->small, (int64_t)b->size);
  }
  return CACHALOT_OK;
}

/* An ALLOCATED or PENDING block must be in its segment's table, with a sane requested size and events
 * that match its state (a PENDING block freed during a capture waits in `deferred` instead). */
CL_NO_COVERAGE static cachalot_status check_handed_out_locked(cl_device *d, const cl_segment *s, const cl_block *b,
                                                              recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  if (*cl_seg_slot(s, b->ptr) != b)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: active block 0x%llx is missing from its segment's table", dev,
                   (unsigned long long)b->ptr);
  if (b->requested == 0 || b->requested > b->size)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: block 0x%llx has requested size %zu for size %zu", dev,
                   (unsigned long long)b->ptr, b->requested, b->size);
  tally_add(&c->active, s->small, 1);
  tally_add(&c->active_bytes, s->small, (int64_t)b->size);
  tally_add(&c->requested, s->small, (int64_t)b->requested);
  if (b->state == CL_ALLOCATED) {
    if (b->event_count)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: allocated block with events", dev);
    tally_add(&c->allocation, s->small, 1);
    tally_add(&c->allocated_bytes, s->small, (int64_t)b->size);
    c->oversize_allocs += b->size >= d->cfg.max_split_size;
  } else if (b->state == CL_PENDING) {
    bool deferred = false;
    for (size_t i = 0; i < d->n_deferred && !deferred; i++)
      deferred = d->deferred[i].b == b;
    if (!b->event_count && !deferred)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: pending block without events", dev);
    if (b->event_count && deferred)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: deferred block with events", dev);
    c->n_event_refs += b->event_count;
  } else {
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: block in unknown state %d", dev,
                   b->state);
  }
  return CACHALOT_OK;
}

/* The blocks of s tile it exactly, free neighbours are merged, and the table holds exactly the handed-out
 * ones; each block adds its share to the recount. */
CL_NO_COVERAGE static cachalot_status check_blocks_locked(cl_device *d, const cl_segment *s, recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  cachalot_status rc;
  size_t n_in_table = count_entries(s->at, cl_seg_entries(s)), n_handed_out = 0;
  bool split = s->head->next != NULL;
  uintptr_t expect = s->ptr;
  const cl_block *prev = NULL;
  for (const cl_block *b = s->head; b; prev = b, b = b->next) {
    if (b->seg != s || b->prev != prev || b->ptr != expect || b->size == 0 || b->size % CL_MIN_BLOCK)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: blocks of segment 0x%llx do not tile it at 0x%llx", dev,
                     (unsigned long long)s->ptr, (unsigned long long)expect);
    if (prev && prev->state == CL_FREE && b->state == CL_FREE)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: free neighbours at 0x%llx were not merged", dev,
                     (unsigned long long)b->ptr);
    expect += b->size;
    if (b->state == CL_FREE) {
      if ((rc = check_free_block_locked(d, s, b, split, c)) != CACHALOT_OK)
        return rc;
      continue;
    }
    if ((rc = check_handed_out_locked(d, s, b, c)) != CACHALOT_OK)
      return rc;
    n_handed_out++;
  }
  if (n_in_table != n_handed_out)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: segment 0x%llx's table holds %zu blocks, it has %zu handed out", dev,
                   (unsigned long long)s->ptr, n_in_table, n_handed_out);
  if (expect != s->ptr + s->size || s->tail != prev)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: blocks of segment 0x%llx do not cover it",
                   dev, (unsigned long long)s->ptr);
  return CACHALOT_OK;
}

/* Segments and their blocks, walked once: the recount of everything the stats and counters hold. */
CL_NO_COVERAGE static cachalot_status check_segments_locked(cl_device *d, recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const size_t max_split = d->cfg.max_split_size;
  cachalot_status rc;
  for (cl_segment *s = d->segments; s; s = s->next) {
    c->n_segments++;
    if ((rc = check_segment_locked(d, s)) != CACHALOT_OK || (rc = check_blocks_locked(d, s, c)) != CACHALOT_OK)
      return rc;
    tally_add(&c->reserved, s->small, (int64_t)s->size);
    if (s->expandable) { /* runs are mapped memory, not device allocations: check_vranges */
      c->n_runs++;
      continue;
    }
    tally_add(&c->segment, s->small, 1);
    c->oversize_segs += s->size >= max_split;
  }
  return CACHALOT_OK;
}

/* Whether a lane holds no stats share (rem, got and inc all 0). */
CL_NO_COVERAGE static bool shares_empty(const cl_lane *ln) {
  for (int small = 0; small < 2; small++)
    for (int id = 0; id < CL_LS_N; id++)
      if (ln->st[small][id].rem || ln->st[small][id].got || ln->st[small][id].inc)
        return false;
  return !ln->oversize.rem && !ln->oversize.got && !ln->oversize.inc;
}

/* Lanes: every one in the lane index, the dormant ones out of `lanes` and holding nothing, the others
 * at their place in it (the armed first), with the right free index and an honest spare count, and the
 * cold ones with no free index and empty shares. */
CL_NO_COVERAGE static cachalot_status check_lanes_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  size_t n_dormant = 0;
  for (size_t i = 0; i < d->n_all_lanes; i++) {
    const cl_lane *ln = d->all_lanes[i];
    if (cl_lane_find(d, ln->stream) != ln)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a lane is missing from the lane index", dev);
    if (ln->dormant && (ln->bins || ln->spare || ln->armed)) /* (its lock may be held: a warm path on its way out) */
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: a dormant lane holds a free index or spares, or is armed", dev);
    n_dormant += ln->dormant;
  }
  if (n_dormant + d->n_lanes != d->n_all_lanes)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: %zu lanes, %zu dormant, %zu not",
                   dev, d->n_all_lanes, n_dormant, d->n_lanes);
  if (d->n_armed > d->n_lanes)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: %zu lanes armed of %zu", dev, d->n_armed,
                   d->n_lanes);
  for (size_t i = 0; i < d->n_lanes; i++) {
    const cl_lane *ln = d->lanes[i];
    if (ln->dormant)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a dormant lane is in `lanes`", dev);
    if (ln->pos != i || ln->armed != (i < d->n_armed))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: lane %zu of `lanes` is out of place", dev, i);
    if (!ln->armed && !shares_empty(ln))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a cold lane has a share", dev);
    if (cl_lane_find(d, ln->stream) != ln || ln->dev != d)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a lane is missing from the lane index", dev);
    if (ln->bins && ln->bins != cl_bins_get_locked(d, &d->default_pool, ln->stream, false))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a lane has the wrong free index", dev);
    size_t n_spare = 0;
    for (const cl_block *b = ln->spare; b; b = b->next, n_spare++)
      if (b->seg || b->state != CL_FREE)
        return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a spare block is in use", dev);
    if (n_spare != ln->n_spare)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a lane's spare count is off", dev);
  }
  return CACHALOT_OK;
}

/* Pools and their free indexes: sane use counts, segment counts that add up to the list's, and indexes
 * holding exactly the free blocks the segments hold. */
CL_NO_COVERAGE static cachalot_status check_pools_locked(cl_device *d, const recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  size_t n_indexed = 0, pool_segments = 0;
  const cl_pool *pool = &d->default_pool;
  for (const cl_pool *next_private = d->pools; pool;
       pool = next_private, next_private = next_private ? next_private->hh.next : NULL) {
    if (pool != &d->default_pool && pool->use_count < 0)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: negative pool use count", dev);
    if (pool != &d->default_pool && pool->use_count == 0 && pool->n_segments == 0)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a freeable empty pool lingers", dev);
    pool_segments += pool->n_segments;
    for (const cl_bins *bins = pool->bins; bins; bins = bins->hh.next) {
      for (int k = 0; k < 2; k++) {
        long n = check_kind(dev, bins, k == 1);
        if (n < 0)
          return CACHALOT_ERROR_INVALID_STATE;
        n_indexed += (size_t)n;
      }
    }
  }
  if (pool_segments != c->n_segments)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: pools count %zu segments, the list %zu",
                   dev, pool_segments, c->n_segments);
  if (n_indexed != c->n_free)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: free indexes hold %zu blocks, segments hold %zu free ones", dev,
                   n_indexed, c->n_free);
  return CACHALOT_OK;
}

/* The event queues hold one entry per event the PENDING blocks wait for, as the counter says. */
CL_NO_COVERAGE static cachalot_status check_events_locked(cl_device *d, const recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  size_t n_queued = 0;
  cl_stream_events *se, *setmp;
  HASH_ITER(hh, d->events, se, setmp) {
    for (cl_pending_event *e = se->head; e; e = e->next) {
      if (e->blk->state != CL_PENDING)
        return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: event for a block not pending", dev);
      n_queued++;
    }
  }
  if (n_queued != c->n_event_refs || n_queued != d->n_pending_events)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: %zu queued events, blocks expect %zu, counter says %zu", dev, n_queued,
                   c->n_event_refs, d->n_pending_events);
  const size_t unwatched = cl_count_unwatched_locked(d);
  if (unwatched != d->n_unwatched)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: %zu streams with an unwatched event, counter says %zu",
                   dev, unwatched, (size_t)d->n_unwatched);
  return CACHALOT_OK;
}

/* The stats against the recount: every current value equal, no peak below its current value. */
CL_NO_COVERAGE static cachalot_status check_stats_locked(cl_device *d, const recount *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  cachalot_status rc;
  const cachalot_device_stats *st = &d->stats;
#define CMP(field, t)                                                                                              \
  if ((rc = compare(dev, #field, st->field, &t)) != CACHALOT_OK)                                                  \
    return rc;
  CMP(allocation, c->allocation)
  CMP(allocated_bytes, c->allocated_bytes)
  CMP(active, c->active)
  CMP(active_bytes, c->active_bytes)
  CMP(requested_bytes, c->requested)
  CMP(segment, c->segment)
  CMP(reserved_bytes, c->reserved)
  CMP(inactive_split, c->inactive)
  CMP(inactive_split_bytes, c->inactive_bytes)
#undef CMP
  if (st->oversize_allocations.current != c->oversize_allocs || st->oversize_segments.current != c->oversize_segs)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: oversize stats are off", dev);
#define ARRAY(name) st->name,
  const cachalot_stat *all[] = {CL_STAT_ARRAYS(ARRAY)};
#undef ARRAY
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    for (int k = 0; k < 3; k++)
      if (all[i][k].peak < all[i][k].current || all[i][k].current < 0)
        return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                       "cachalot_check: device %d: a stat is negative or its peak is below its current value", dev);
  return CACHALOT_OK;
}

CL_NO_COVERAGE static cachalot_status check_device_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  recount c;
  memset(&c, 0, sizeof c);
  cachalot_status rc;
  if ((rc = check_segments_locked(d, &c)) != CACHALOT_OK)
    return rc;
  if ((rc = cl_plan_check_locked(d)) != CACHALOT_OK)
    return rc;
  if ((rc = check_vranges(d, c.n_runs)) != CACHALOT_OK)
    return rc;
  if (c.n_segments != d->n_segments)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: segment count %zu, list holds %zu",
                   d->index, d->n_segments, c.n_segments);
  if ((rc = check_lanes_locked(d)) != CACHALOT_OK || (rc = check_pools_locked(d, &c)) != CACHALOT_OK ||
      (rc = check_events_locked(d, &c)) != CACHALOT_OK || (rc = cl_ctx_check_locked(d)) != CACHALOT_OK)
    return rc;
  return check_stats_locked(d, &c);
}

cachalot_status cachalot_check(cachalot_allocator *a) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_check");
  if (arg != CACHALOT_OK)
    return arg;
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    cachalot_status rc = check_device_locked(d);
    cl_leave_exclusive(d);
    if (rc != CACHALOT_OK)
      return rc;
  }
  return cl_host_check(a->host);
}
