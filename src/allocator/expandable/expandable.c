/* Expandable segments (config key expandable_segments; PyTorch's expandable_segments): for each (pool,
 * stream, kind) one reservation of address space, the vrange, backed by pages that are mapped when malloc
 * needs more memory and unmapped when they fall wholly free (empty_cache, the out-of-memory retry, garbage
 * collection, the release of oversize blocks).
 *
 * Why it fragments less: a request that no free block holds maps only what it lacks, right after the
 * free block at the end of a run, and the two become one block; without it a new segment would be made
 * beside the free block, which stays unused. And memory goes back a page at a time, where a segment goes
 * back only when all of it is free.
 *
 * Every contiguous mapped run is an ordinary segment (cl_segment.expandable), so blocks, free indexes,
 * lanes, free()'s page map lookup and both warm paths work on it unchanged; this file keeps the runs
 * right as they grow, merge, shrink and split. All of it runs in exclusive mode, with the lock held
 * across the device calls: a run's neighbours change with them.
 *
 * A run's handed-out table is indexed from the run's start, which is always on a page boundary (a
 * multiple of 2 MiB from the reservation's 2 MiB-aligned base), so an entry keeps its meaning when the
 * run's start moves by whole pages: tables are moved, never rebuilt. The large kind keeps one entry per
 * MiB: its handed-out blocks are larger than 1 MiB, so no two start in one MiB, split rule or not. */
#include "runs.h"

#include <stdlib.h>
#include <string.h>

bool cl_exp_table_reserve(cl_segment *s, size_t size) {
  const size_t need = entries(s, size);
  if (need <= s->at_cap)
    return true;
  const size_t cap = need > 2 * s->at_cap ? need : 2 * s->at_cap;
  cl_block **t = realloc(s->at, cap * sizeof *t);
  if (!t)
    return false;
  s->at = t;
  s->at_cap = cap;
  return true;
}

static void table_clear(cl_segment *s, size_t from_size, size_t to_size) {
  memset(s->at + entries(s, from_size), 0, (entries(s, to_size) - entries(s, from_size)) * sizeof *s->at);
}

cl_segment *cl_exp_segment_new_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_segment *s = d->spare_segments;
  cl_lane *lane = NULL;
  if (s) {
    d->spare_segments = s->release_next;
    free(s->at);
    lane = cl_seg_lane(s);
  } else if (!(s = aligned_alloc(_Alignof(cl_segment), sizeof *s))) {
    return NULL;
  }
  if (lane)
    cl_segment_clear(s); /* a racing free() may still read a spare's lane: never NULL once set */
  else
    memset(s, 0, sizeof *s); /* new, or never given a lane: no reader */
  return s;
}

void cl_exp_segment_spare_locked(cl_device *d, cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  free(s->at);
  s->at = NULL;
  s->at_cap = 0;
  s->size = 0;
  s->head = s->tail = NULL;
  s->release_next = d->spare_segments;
  d->spare_segments = s;
}

void cl_exp_drop_metadata(cl_device *d, cl_segment *s, cl_block *b) {
  if (s)
    cl_exp_segment_spare_locked(d, s);
  if (b)
    cl_block_delete_locked(d, b);
}

void cl_exp_run_init(cl_segment *s, cl_vrange *vr, cl_pool *p, cachalot_stream stream, cl_lane *lane) {
  s->pool = p;
  s->stream = stream;
  cl_seg_set_lane(s, lane);
  s->bins = vr->bins;
  s->small = vr->small;
  s->expandable = true;
  s->vr = vr;
  s->at_shift = cl_seg_shift(vr->small);
}

void cl_exp_run_insert(cl_vrange *vr, cl_segment *after, cl_segment *s) {
  s->run_prev = after;
  s->run_next = after ? after->run_next : vr->runs;
  if (s->run_next)
    s->run_next->run_prev = s;
  if (after)
    after->run_next = s;
  else
    vr->runs = s;
}

void cl_exp_run_remove(cl_vrange *vr, cl_segment *s) {
  if (s->run_prev)
    s->run_prev->run_next = s->run_next;
  else
    vr->runs = s->run_next;
  if (s->run_next)
    s->run_next->run_prev = s->run_prev;
  s->run_prev = s->run_next = NULL;
}

/* The reservation of (bins, kind), made on first use: the device's memory and an eighth more (room for
 * gaps between runs), in pages. */
static cachalot_status vrange_get_locked(cl_device *d, cl_bins *bins, bool small, cl_vrange **out, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  if ((*out = bins->vr[small]))
    return CACHALOT_OK;
  cachalot_backend *b = d->owner->backend;
  size_t gran = 0, free_bytes = 0, total = 0;
  cachalot_status rc = b->ops->va_granularity(b, d->index, &gran);
  if (rc == CACHALOT_OK)
    rc = b->ops->mem_info(b, d->index, &free_bytes, &total);
  if (rc != CACHALOT_OK)
    return rc;
  if (gran == 0 || (gran & (gran - 1)))
    return cl_fail(CACHALOT_ERROR_DEVICE, "the device's mapping granularity %zu is not a power of two", gran);
  cl_vrange *vr = calloc(1, sizeof *vr);
  if (!vr) {
    *host_oom = true;
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  vr->page = cl_round_up(small ? SMALL_PAGE : d->cfg.expandable_page, gran);
  vr->size = cl_round_up(total + total / 8, vr->page);
  void *base = NULL;
  rc = b->ops->va_reserve(b, d->index, vr->size, &base);
  if (rc == CACHALOT_OK && ((uintptr_t)base & (((uintptr_t)1 << CL_PAGE_SHIFT) - 1))) {
    (void)b->ops->va_release(b, d->index, base, vr->size);
    rc = cl_fail(CACHALOT_ERROR_DEVICE, "reserved address space at 0x%llx is not 2 MiB aligned",
                 (unsigned long long)(uintptr_t)base);
  }
  if (rc != CACHALOT_OK) {
    free(vr);
    return rc;
  }
  vr->base = (uintptr_t)base;
  vr->bins = bins;
  vr->small = small;
  vr->next = d->vranges;
  d->vranges = vr;
  bins->vr[small] = vr;
  *out = vr;
  return CACHALOT_OK;
}

/* Where a growth goes: `map` bytes at `at`, extending run `a` (NULL: a new run, placed after run `after`,
 * NULL at the reservation's start) and reaching run `b` (NULL: not reaching the next run). */
typedef struct {
  cl_segment *a, *b;
  uintptr_t at;
  size_t map;
  cl_segment *after;
} growth;

/* The lowest gap of vr where, with the free tail of the run before it (and the free head of the run
 * after it, if the gap is mapped whole), a block of `size` fits; with `least`, the gap where the least
 * is mapped (the lowest among equals). False when none does. */
static bool find_gap(const cl_vrange *vr, size_t size, bool least, growth *g) {
  bool found = false;
  for (cl_segment *prev = NULL, *run = vr->runs;; prev = run, run = run->run_next) {
    const uintptr_t lo = prev ? prev->ptr + prev->size : vr->base;
    const uintptr_t hi = run ? run->ptr : vr->base + vr->size;
    const size_t gap = hi - lo;
    const size_t tail = prev && prev->tail->state == CL_FREE ? prev->tail->size : 0;
    const size_t head = run && run->head->state == CL_FREE ? run->head->size : 0;
    growth c;
    if (gap && tail + gap >= size) {
      /* Nothing to map when the tail is large enough alone: best fit passed it over as oversize, but any
       * pages mapped here would join it, so it is handed out as it is (PyTorch does the same). */
      c = (growth){prev, NULL, lo, tail >= size ? 0 : cl_round_up(size - tail, vr->page), prev};
      if (c.map == gap)
        c.b = run;
    } else if (gap && run && tail + gap + head >= size) {
      c = (growth){prev, run, lo, gap, prev};
    } else if (run) {
      continue;
    } else {
      return found;
    }
    /* the plan's ranges are the plan's: online growth neither maps them nor joins their blocks */
    if (CL_UNLIKELY(vr->plan_hi) && cl_vrange_planned(vr, lo - tail, c.b ? hi + head : lo + (c.map ? c.map : tail))) {
      if (!run)
        return found;
      continue;
    }
    if (!found || c.map < g->map)
      *g = c;
    found = true;
    if (!least || c.map == 0)
      return true;
    if (!run)
      return true;
  }
}

uintptr_t cl_exp_unmap_pages(cl_device *d, const cl_vrange *vr, uintptr_t lo, uintptr_t hi, cachalot_status *rc) {
  cachalot_backend *b = d->owner->backend;
  cachalot_status st = CACHALOT_OK;
  while (lo < hi && (st = b->ops->va_unmap(b, d->index, (void *)lo, vr->page)) == CACHALOT_OK)
    lo += vr->page;
  if (rc)
    *rc = st;
  return lo;
}

/* Maps [at, at + size) page by page (each page its own physical memory, so that any page can go back
 * alone). All or nothing: on a failure the pages this call mapped are unmapped again; *left is the bytes
 * at `at` that stay mapped all the same (an unmap failed too: rare, the device is in trouble then). */
static cachalot_status map_pages(cl_device *d, const cl_vrange *vr, uintptr_t at, size_t size, size_t *left) {
  cachalot_backend *b = d->owner->backend;
  /* as for a device allocation (malloc.c): mapping is refused while a capture in global mode is underway */
  cachalot_capture_mode mode = CACHALOT_CAPTURE_RELAXED;
  cachalot_status rc = b->ops->capture_mode_exchange(b, &mode);
  if (rc != CACHALOT_OK)
    return rc;
  size_t done = 0;
  while (done < size && (rc = b->ops->va_map(b, d->index, (void *)(at + done), vr->page)) == CACHALOT_OK)
    done += vr->page;
  /* Roll back from the top, so that pages a failed unmap leaves are a prefix: the caller books them */
  while (rc != CACHALOT_OK && done > 0 &&
         b->ops->va_unmap(b, d->index, (void *)(at + done - vr->page), vr->page) == CACHALOT_OK)
    done -= vr->page;
  *left = rc == CACHALOT_OK ? 0 : done;
  cachalot_capture_mode prev = mode;
  (void)b->ops->capture_mode_exchange(b, &prev);
  return rc;
}

/* Merges run `b`, which now touches run s from above, into s; blk is s's free tail (in no index). The
 * split stats of the blocks involved are moved from two runs to one. */
static void merge_runs_locked(cl_device *d, cl_segment *s, cl_block *blk, cl_segment *b) {
  CL_ASSERT_EXCLUSIVE(d);
  const bool small = s->small;
  int64_t blocks = 0, bytes = 0;
  if (blk->prev) { /* blk stops counting as the free block of a split run; it is counted again below */
    blocks--;
    bytes -= (int64_t)blk->size;
  }
  const bool b_split = b->head != b->tail;
  int64_t b_free = 0, b_free_bytes = 0; /* b's free blocks that stay blocks of their own */
  cl_block *h = b->head;
  for (cl_block *x = h; x; x = x->next) {
    x->seg = s;
    if (x->state == CL_FREE && x != h) {
      b_free++;
      b_free_bytes += (int64_t)x->size;
    }
  }
  if (b_split && h->state == CL_FREE) { /* b's head stops counting too: it joins blk */
    blocks--;
    bytes -= (int64_t)h->size;
  }
  if (b_split) {
    blocks -= b_free;
    bytes -= b_free_bytes;
  }
  memcpy(s->at + entries(s, b->ptr - s->ptr), b->at, entries(b, b->size) * sizeof *s->at);
  cl_block *tail = b->tail;
  if (h->state == CL_FREE) {
    cl_free_index_remove_locked(d, h);
    blk->size += h->size;
    blk->next = h->next;
    if (h->next)
      h->next->prev = blk;
    if (tail == h)
      tail = blk;
    cl_block_delete_locked(d, h);
  } else {
    blk->next = h;
    h->prev = blk;
  }
  s->tail = tail;
  s->size += b->size;
  if (s->head != s->tail) {
    blocks += 1 + b_free;
    bytes += (int64_t)blk->size + b_free_bytes;
  }
  cl_count_split_locked(d, small, blocks, bytes);
  (void)cl_page_map_point(&d->owner->pages, b->ptr, b->size, s); /* its leaves exist: b's pages were mapped */
  cl_exp_run_remove(s->vr, b);
  cl_segment_unlink_locked(d, b);
  cl_exp_segment_spare_locked(d, b);
}

bool cl_exp_vrange_releasable(const cl_device *d, const cl_vrange *vr) {
  const cl_pool *p = vr->runs ? vr->runs->pool : NULL;
  return p && (cl_pool_is_default(d, p) || p->use_count == 0);
}

/* expandable_compact: growth unmaps free pages elsewhere first when it would take reserved memory to a
 * new peak and above this bound: the most the program has had live (counting the request being served)
 * and 1/64 more. Both conditions keep a workload that repeats from trading pages back and forth each
 * round: below its reserved peak nothing is unmapped, and once reserved is within 1/64 of what the
 * program needs there is nothing worth unmapping. (Where sizes vary too much for the bound to be met,
 * some trading remains: see docs/expandable-segments.md.) */
static size_t compact_bound(const cachalot_device_stats *st, size_t size) {
  const cachalot_stat *req = &st->requested_bytes[CACHALOT_STAT_ALL];
  size_t peak = (size_t)req->current + size;
  if ((size_t)req->peak > peak)
    peak = (size_t)req->peak;
  return peak + peak / 64;
}

/* expandable_compact: unmaps up to `need` bytes of the default pool's whole free pages, in address
 * order within each reservation. Why: memory freed in a hole between handed-out blocks is otherwise
 * mapped and unused while a request that does not fit there maps new pages elsewhere; unmapping it first
 * keeps the reserved peak near what the program has live, for the price of a device synchronization
 * when it happens (during warm-up, mostly). Why address order: growth refills the lowest of the gaps
 * that map the least, so the holes opened low are the ones refilled, and free blocks high up, where runs
 * end and growth extends them, stay mapped. Measured against largest-first on the eight traces
 * (docs/expandable-segments.md), one replay each with 2 MiB pages: the same reserved peaks on six, lower
 * on kv_generate (1.042 against 1.081) and lm_train (1.019 against 1.022); over six replays in a row,
 * higher on kv_generate, llm_serving, moe_train and lm_train (by 0.002-0.034). Unmapping a block
 * changes only that block and its run, so the other blocks collected stay valid. */
static void compact_locked(cl_device *d, size_t need, const cl_block *keep1, const cl_block *keep2,
                           bool keep_plan) {
  CL_ASSERT_EXCLUSIVE(d);
  size_t n = 0, cap = 0;
  cl_block **v = NULL;
  for (cl_vrange *vr = d->vranges; vr; vr = vr->next) {
    /* the default pool's only: a freeable private pool that lost its last run here would have to be
     * collected, which the growth under way (perhaps into that very pool) cannot afford; empty_cache and
     * the OOM retry give those back */
    if (!vr->runs || !cl_pool_is_default(d, vr->runs->pool))
      continue;
    for (cl_segment *run = vr->runs; run; run = run->run_next) {
      for (cl_block *b = run->head; b; b = b->next) {
        if (b->state != CL_FREE || b == keep1 || b == keep2 || !cl_unmappable_bytes(b) ||
            (keep_plan && cl_vrange_planned(vr, b->ptr, b->ptr + b->size)))
          continue;
        if (n == cap) {
          cap = cap ? 2 * cap : 16;
          cl_block **nv = realloc(v, cap * sizeof *nv);
          if (!nv) { /* no host memory: no compaction this time, which is safe */
            free(v);
            return;
          }
          v = nv;
        }
        v[n++] = b;
      }
    }
  }
  bool synced = false;
  size_t done = 0;
  for (size_t i = 0; i < n && done < need; i++) {
    size_t k;
    (void)cl_unmap_block_locked(d, v[i], need - done, &synced, &k); /* a failure leaves it mapped */
    done += k;
  }
  free(v);
}

/* The lane, free index and reservation a growth needs, made on first use (a retry counts as one first). */
static cachalot_status expand_setup_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, bool is_retry,
                                           cl_lane **lane, cl_vrange **vr, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  if (is_retry)
    d->stats.num_alloc_retries++;
  *lane = cl_lane_get_locked(d, s);
  cl_bins *bins = cl_bins_get_locked(d, p, s, true);
  if (!*lane || !bins) {
    *host_oom = true;
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  if (cl_pool_is_default(d, p))
    (*lane)->bins = bins;
  return vrange_get_locked(d, bins, small, vr, host_oom);
}

/* The reserved peak that compaction keeps below: since the program's latest restart where the step
 * tracker saw one with no plan (a run placed again is compacted as the first was, not against the peak of
 * the run before, under which it would fragment freely), else the reserved bytes' peak. */
static size_t compact_peak(const cl_device *d) {
  return (size_t)(d->step && d->step->restarted ? d->step->peak : d->stats.reserved_bytes[CACHALOT_STAT_ALL].peak);
}

/* expandable_compact before growth g: when it would take reserved memory to a new peak and above `bound`,
 * unmaps up to the excess (at most g's size) of whole free pages elsewhere. The blocks g would join are
 * kept: unmapping them would only mean mapping more. keep_plan keeps the free pages of a plan's ranges
 * too. Whether it compacted (the runs changed then). */
static bool compact_before_locked(cl_device *d, const growth *g, size_t bound, bool keep_plan) {
  CL_ASSERT_EXCLUSIVE(d);
  const cachalot_device_stats *st = &d->stats;
  const size_t after = (size_t)st->reserved_bytes[CACHALOT_STAT_ALL].current + g->map;
  if (!d->cfg.expandable_compact || !g->map || cl_capturing(d) || after <= bound ||
      after <= compact_peak(d))
    return false;
  compact_locked(d, after - bound < g->map ? after - bound : g->map, g->a ? g->a->tail : NULL,
                 g->b ? g->b->head : NULL, keep_plan);
  return true;
}

/* Where the growth goes (*g), after compacting first when expandable_compact asks for it. */
static cachalot_status plan_growth_locked(cl_device *d, cl_vrange *vr, size_t size, growth *g) {
  CL_ASSERT_EXCLUSIVE(d);
  const cachalot_device_stats *st = &d->stats;
  if (!find_gap(vr, size, d->cfg.expandable_compact, g))
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "no room left in the expandable segment's address space");
  /* where a plan keeps a range (expandable_plan), what repeats is planned and only deviations grow: no
   * slack above the reserved peak for them */
  const size_t peak = compact_peak(d);
  /* the runs changed after a compaction (a gap may have opened where less is mapped): plan again */
  if (compact_before_locked(d, g, vr->plan_hi ? peak : compact_bound(st, size), false) && !find_gap(vr, size, true, g))
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "no room left in the expandable segment's address space");
  return CACHALOT_OK;
}

/* Books the g->map bytes just mapped at g->at into run seg (fresh when g->a is NULL) as free block blk,
 * then joins the run g->b it reached. */
static void grow_run_locked(cl_device *d, cl_vrange *vr, cl_segment *seg, cl_block *blk, const growth *g,
                            bool small) {
  CL_ASSERT_EXCLUSIVE(d);
  const bool fresh = !g->a;
  const size_t old_size = fresh ? 0 : seg->size;
  if (fresh) {
    seg->ptr = g->at;
    seg->size = g->map;
    blk->ptr = g->at;
    blk->size = g->map;
    blk->seg = seg;
    blk->prev = blk->next = NULL;
    blk->state = CL_FREE;
    seg->head = seg->tail = blk;
    cl_exp_run_insert(vr, g->after, seg);
    cl_segment_link_locked(d, seg);
  } else if (blk == seg->tail) { /* the free tail grows */
    cl_free_index_remove_locked(d, blk);
    blk->size += g->map;
    seg->size += g->map;
    if (blk->prev)
      cl_count_split_locked(d, small, 0, (int64_t)g->map);
  } else { /* a new free block after a handed-out tail: the run is split now */
    blk->ptr = g->at;
    blk->size = g->map;
    blk->seg = seg;
    blk->prev = seg->tail;
    blk->next = NULL;
    blk->state = CL_FREE;
    seg->tail->next = blk;
    seg->tail = blk;
    seg->size += g->map;
    cl_count_split_locked(d, small, 1, (int64_t)g->map);
  }
  table_clear(seg, old_size, seg->size);
  if (g->b)
    merge_runs_locked(d, seg, blk, g->b);
}

/* Maps g's pages and books them (the metadata first, so that a host allocation failure never strands
 * device memory): on success *out is the free block that holds them, in no index. A failure that leaves
 * some pages mapped books those as a free block in its index and returns the failure with *out NULL. */
static cachalot_status grow_locked(cl_device *d, cl_vrange *vr, cl_pool *p, cachalot_stream s, cl_lane *lane,
                                   bool small, growth g, cl_block **out, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  *out = NULL;
  cachalot_status rc = cl_fraction_admit_locked(d, g.map);
  if (rc != CACHALOT_OK)
    return rc;
  cl_segment *seg = g.a ? g.a : cl_exp_segment_new_locked(d);
  const bool fresh = !g.a;
  cl_block *blk = fresh || g.a->tail->state != CL_FREE ? cl_block_new_locked(d) : g.a->tail;
  if (seg && fresh)
    cl_exp_run_init(seg, vr, p, s, lane);
  cl_segment *const new_seg = fresh ? seg : NULL; /* what this call took, to give back on failure */
  cl_block *const new_blk = blk != (g.a ? g.a->tail : NULL) ? blk : NULL;
  const size_t old_size = fresh ? 0 : seg->size;
  const size_t new_size = old_size + g.map + (g.b ? g.b->size : 0);
  if (!seg || !blk || !cl_exp_table_reserve(seg, new_size) || !cl_page_map_point(&d->owner->pages, g.at, g.map, seg)) {
    cl_exp_drop_metadata(d, new_seg, new_blk);
    *host_oom = true;
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  size_t left = 0;
  if ((rc = map_pages(d, vr, g.at, g.map, &left)) != CACHALOT_OK && left == 0) {
    (void)cl_page_map_point(&d->owner->pages, g.at, g.map, NULL);
    cl_exp_drop_metadata(d, new_seg, new_blk);
    return rc;
  }
  if (rc != CACHALOT_OK) { /* pages that could not be unmapped are booked as cached memory */
    (void)cl_page_map_point(&d->owner->pages, g.at + left, g.map - left, NULL);
    g.map = left;
    g.b = NULL; /* the gap was not filled */
  }

  grow_run_locked(d, vr, seg, blk, &g, small);
  cl_stat_array_add(d->stats.reserved_bytes, small, (int64_t)g.map);
  if (CL_UNLIKELY(d->step) && d->step->peak < d->stats.reserved_bytes[CACHALOT_STAT_ALL].current)
    d->step->peak = d->stats.reserved_bytes[CACHALOT_STAT_ALL].current;
  d->stats.num_device_alloc++;
  cl_trace_locked(d, CL_TRACE_SEGMENT_MAP, g.at, g.map, s);
  if (rc != CACHALOT_OK) {
    cl_free_index_insert_locked(d, blk);
    return rc;
  }
  *out = blk;
  return CACHALOT_OK;
}

cachalot_status cl_expand_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                 bool is_retry, cl_block **out, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  *out = NULL;
  *host_oom = false;
  cl_lane *lane;
  cl_vrange *vr;
  cachalot_status rc = expand_setup_locked(d, p, s, small, is_retry, &lane, &vr, host_oom);
  if (rc != CACHALOT_OK)
    return rc;
  growth g;
  if ((rc = plan_growth_locked(d, vr, size, &g)) != CACHALOT_OK)
    return rc;
  if (g.map == 0) { /* the run's free tail holds it */
    *out = g.a->tail;
    cl_free_index_remove_locked(d, *out);
    return CACHALOT_OK;
  }
  return grow_locked(d, vr, p, s, lane, small, g, out, host_oom);
}

/* The first piece of [lo, hi) that no run maps, as a growth; false when the runs map all of it. */
static bool unmapped_piece(const cl_vrange *vr, uintptr_t lo, uintptr_t hi, growth *g) {
  for (cl_segment *prev = NULL, *run = vr->runs;; prev = run, run = run->run_next) {
    const uintptr_t glo = prev ? prev->ptr + prev->size : vr->base, ghi = run ? run->ptr : vr->base + vr->size;
    const uintptr_t x = glo > lo ? glo : lo, y = ghi < hi ? ghi : hi;
    if (x < y) {
      *g = (growth){x == glo ? prev : NULL, y == ghi ? run : NULL, x, y - x, prev};
      return true;
    }
    if (!run || run->ptr >= hi)
      return false;
  }
}

cachalot_status cl_expand_range_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, uintptr_t lo,
                                       uintptr_t hi, bool *host_oom) {
  CL_ASSERT_EXCLUSIVE(d);
  *host_oom = false;
  cl_lane *lane;
  cl_vrange *vr;
  cachalot_status rc = expand_setup_locked(d, p, s, small, false, &lane, &vr, host_oom);
  if (rc != CACHALOT_OK)
    return rc;
  lo = vr->base + (lo - vr->base) / vr->page * vr->page;
  hi = vr->base + cl_round_up(hi - vr->base, vr->page);
  if (lo < vr->base || hi > vr->base + vr->size || lo >= hi)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "the range to map is outside the expandable segment's reservation");
  bool compacted = false;
  growth g;
  while (unmapped_piece(vr, lo, hi, &g)) {
    /* A plan's range is mapped once and kept: unmapping free pages elsewhere so that it sets no new peak
     * at all (not only none above compaction's bound, which is there to stop trading) costs no trading.
     * The plan's own free pages go only down to compaction's bound: they are the other lap's places, and
     * unmapping them to map these would trade pages every lap (cnn_train over 35 steps: 27 maps and
     * unmaps a step, never a clean lap), so a range that fits within the bound sets a new peak once
     * instead; one that does not (var_inference, whose period is the whole run) trades. Once a piece:
     * the runs changed, so the piece is found again. */
    if (!compacted) {
      const bool outside = compact_before_locked(d, &g, compact_peak(d), true);
      const bool own = compact_before_locked(d, &g, compact_bound(&d->stats, 0), false);
      if (outside || own) {
        compacted = true;
        continue;
      }
    }
    cl_block *blk;
    if ((rc = grow_locked(d, vr, p, s, lane, small, g, &blk, host_oom)) != CACHALOT_OK)
      return rc;
    cl_free_index_insert_locked(d, blk);
    compacted = false;
  }
  return CACHALOT_OK;
}
