/* Expandable segments giving pages back: the whole free pages inside a free block of a run are unmapped
 * (empty_cache, the out-of-memory retry, garbage collection, the release of oversize blocks), which cuts
 * the run around them; and at the end the reservations go. How runs grow is in expandable.c. */
#include "runs.h"

#include <stdlib.h>
#include <string.h>

size_t cl_unmappable_bytes(const cl_block *b) {
  const cl_vrange *vr = b->seg->vr;
  const size_t lo = cl_round_up(b->ptr - vr->base, vr->page);
  const size_t hi = (b->ptr + b->size - vr->base) / vr->page * vr->page;
  return hi > lo ? hi - lo : 0;
}

/* An unmapping under way: the hole [lo, hi) made in free block f of run r, and what it leaves either side. */
typedef struct {
  cl_block *f;
  cl_segment *r;
  uintptr_t lo, hi;
  cl_segment *r2;                    /* metadata for a run above the hole, when r keeps a part below it */
  cl_block *nb;                      /* metadata for a free rest above the hole, when f keeps one below it */
  bool small;
  cl_block *f1, *f2;                 /* f's free rests [f->ptr, lo) and [hi, f_end), or NULL */
  cl_block *before, *after;          /* f's neighbours */
  cl_block *lower_tail, *upper_head; /* the blocks next to the hole, below and above it, or NULL */
  cl_segment *upper;                 /* the run that [hi, r_end) belongs to, when it exists */
  uint64_t age_base;                 /* f's age, which its rests keep */
  int64_t blocks, bytes;             /* the change to the split stats */
} cut;

/* The hole: the n bytes of whole pages inside f, or `limit` of them rounded up to pages. */
static void hole_bounds(cut *c, size_t n, size_t limit) {
  const cl_vrange *vr = c->r->vr;
  c->lo = vr->base + cl_round_up(c->f->ptr - vr->base, vr->page);
  c->hi = c->lo + n;
  if (n > limit) { /* the pages at the run's nearer end, so that the run keeps one piece where it can */
    const size_t part = cl_round_up(limit, vr->page);
    if (c->f->prev)
      c->lo = c->hi - part;
    else
      c->hi = c->lo + part;
  }
}

/* Taken before anything is unmapped, so that a host allocation failure changes nothing. */
static cachalot_status cut_metadata_locked(cl_device *d, cut *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const cl_segment *r = c->r;
  /* Metadata for the worst case (a page that cannot be unmapped leaves a free rest after the hole). */
  const bool need_r2 = c->lo > r->ptr, need_nb = c->f->ptr < c->lo;
  if (need_r2 && (c->r2 = cl_exp_segment_new_locked(d))) {
    cl_exp_run_init(c->r2, r->vr, r->pool, r->stream, r->lane);
    if (!cl_exp_table_reserve(c->r2, r->ptr + r->size - c->lo)) {
      cl_exp_segment_spare_locked(d, c->r2);
      c->r2 = NULL;
    }
  }
  if (need_nb)
    c->nb = cl_block_new_locked(d);
  if ((need_r2 && !c->r2) || (need_nb && !c->nb)) {
    cl_exp_drop_metadata(d, c->r2, c->nb);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory for allocator metadata");
  }
  return CACHALOT_OK;
}

/* Unmapping does not wait for work still using the memory: the device is synchronized first, once per
 * *synced. The hole shrinks to what was unmapped. */
static cachalot_status unmap_hole(cl_device *d, cut *c, bool *synced) {
  cachalot_status rc = CACHALOT_OK;
  if (!*synced) {
    cachalot_backend *b = d->owner->backend;
    if ((rc = b->ops->device_sync(b, d->index)) == CACHALOT_OK)
      *synced = true;
  }
  /* no sync: nothing may be unmapped */
  c->hi = rc == CACHALOT_OK ? cl_exp_unmap_pages(d, c->r->vr, c->lo, c->hi, &rc) : c->lo;
  return rc;
}

/* The block side of the cut: f leaves its index and becomes its rests (f reused, nb for a second one). */
static void cut_block_locked(cl_device *d, cut *c) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block *f = c->f;
  const uintptr_t lo = c->lo, hi = c->hi, f_end = f->ptr + f->size;
  const bool has_f1 = f->ptr < lo, has_f2 = hi < f_end, has_r1 = c->r->ptr < lo;
  c->before = f->prev;
  c->after = f->next;
  /* split stats: f counted while its run had more blocks; f1 and f2 count when their run has others */
  if (c->before || c->after) {
    c->blocks--;
    c->bytes -= (int64_t)f->size;
  }
  cl_free_index_remove_locked(d, f);
  c->age_base = f->gc_base;
  c->f1 = has_f1 ? f : NULL;
  c->f2 = has_f2 ? (has_f1 ? c->nb : f) : NULL;
  if (c->nb && c->nb != c->f2)
    cl_block_delete_locked(d, c->nb);
  if (c->f1) {
    c->f1->size = lo - c->f1->ptr;
    c->f1->next = NULL;
  }
  c->upper = has_r1 ? c->r2 : c->r;
  if (c->f2) {
    c->f2->ptr = hi;
    c->f2->size = f_end - hi;
    c->f2->seg = c->upper;
    c->f2->prev = NULL;
    c->f2->next = c->after;
    c->f2->state = CL_FREE;
  }
  c->upper_head = c->f2 ? c->f2 : c->after;
  if (c->after)
    c->after->prev = c->f2;
  c->lower_tail = c->f1 ? c->f1 : c->before;
  if (c->before)
    c->before->next = c->f1;
  if (!c->f1 && !c->f2)
    cl_block_delete_locked(d, f);
}

/* The run side of the cut: r keeps the part below the hole, r2 (or r itself) takes the part above; a run
 * left with neither goes back to the spares. */
static void cut_run_locked(cl_device *d, cut *c) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_segment *r = c->r, *r2 = c->r2;
  const uintptr_t lo = c->lo, hi = c->hi, r_end = r->ptr + r->size;
  const bool has_r1 = r->ptr < lo, has_r2 = hi < r_end;
  (void)cl_page_map_point(&d->owner->pages, lo, hi - lo, NULL);
  if (has_r1 && has_r2) {
    r2->ptr = hi;
    r2->size = r_end - hi;
    memcpy(r2->at, r->at + entries(r, hi - r->ptr), entries(r2, r2->size) * sizeof *r2->at);
    r2->head = c->upper_head;
    r2->tail = r->tail == c->f ? c->f2 : r->tail;
    for (cl_block *x = c->upper_head; x; x = x->next)
      x->seg = r2;
    r->size = lo - r->ptr;
    r->tail = c->lower_tail;
    cl_exp_run_insert(r->vr, r, r2);
    cl_segment_link_locked(d, r2);
    (void)cl_page_map_point(&d->owner->pages, hi, r2->size, r2); /* its leaves exist: r's pages were mapped */
  } else {
    if (r2)
      cl_exp_segment_spare_locked(d, r2);
    if (has_r1) {
      r->size = lo - r->ptr;
      r->tail = c->lower_tail;
    } else if (has_r2) {
      memmove(r->at, r->at + entries(r, hi - r->ptr), entries(r, r_end - hi) * sizeof *r->at);
      r->ptr = hi;
      r->size = r_end - hi;
      r->head = c->upper_head;
      if (r->tail == c->f)
        r->tail = c->f2;
    } else {
      cl_exp_run_remove(r->vr, r);
      cl_segment_unlink_locked(d, r);
      cl_exp_segment_spare_locked(d, r);
    }
  }
}

/* f's rests go back to the index with f's age, and the stats and history learn of the unmapping. */
static void cut_book_locked(cl_device *d, cut *c) {
  CL_ASSERT_EXCLUSIVE(d);
  if (c->f1) {
    cl_free_index_insert_locked(d, c->f1);
    c->f1->gc_base = c->age_base;
    if (c->before) {
      c->blocks++;
      c->bytes += (int64_t)c->f1->size;
    }
  }
  if (c->f2) {
    cl_free_index_insert_locked(d, c->f2);
    c->f2->gc_base = c->age_base;
    if (c->after) {
      c->blocks++;
      c->bytes += (int64_t)c->f2->size;
    }
  }
  cl_count_split_locked(d, c->small, c->blocks, c->bytes);
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->reserved_bytes, c->small, -(int64_t)(c->hi - c->lo));
  st->num_device_free++;
  cl_trace_locked(d, CL_TRACE_SEGMENT_UNMAP, c->lo, c->hi - c->lo, c->upper->stream);
}

cachalot_status cl_unmap_block_locked(cl_device *d, cl_block *f, size_t limit, bool *synced, size_t *unmapped) {
  CL_ASSERT_EXCLUSIVE(d);
  *unmapped = 0;
  const size_t n = cl_unmappable_bytes(f);
  if (!n || !limit || cl_capturing(d))
    return CACHALOT_OK;
  cut c = {.f = f, .r = f->seg};
  hole_bounds(&c, n, limit);
  cachalot_status rc = cut_metadata_locked(d, &c);
  if (rc != CACHALOT_OK)
    return rc;
  rc = unmap_hole(d, &c, synced);
  if (c.hi == c.lo) {
    cl_exp_drop_metadata(d, c.r2, c.nb);
    return rc;
  }

  /* f becomes up to two free blocks around the hole [lo, hi): f1 = [f->ptr, lo), f2 = [hi, f_end); the run
   * r becomes up to two runs: [r->ptr, lo) and [hi, r_end). */
  c.small = c.r->small;
  cut_block_locked(d, &c);
  cut_run_locked(d, &c);
  cut_book_locked(d, &c);
  *unmapped = c.hi - c.lo;
  return rc;
}

cachalot_status cl_unmap_vrange_locked(cl_device *d, cl_vrange *vr, bool keep_plan, bool *synced) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_status result = CACHALOT_OK;
  for (cl_segment *run = vr->runs, *following; run; run = following) {
    following = run->run_next; /* a run split below is walked through its blocks, not through the list */
    for (cl_block *b = run->head, *next; b; b = next) {
      next = b->next; /* survives: unmapping b changes b and the runs only */
      size_t n;
      if (b->state == CL_FREE && !(keep_plan && cl_plan_holds(b))) {
        cachalot_status rc = cl_unmap_block_locked(d, b, SIZE_MAX, synced, &n);
        if (rc != CACHALOT_OK && result == CACHALOT_OK)
          result = rc;
      }
    }
  }
  return result;
}

cachalot_status cl_unmap_all_locked(cl_device *d, bool *synced) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_status result = CACHALOT_OK;
  for (cl_vrange *vr = d->vranges; vr; vr = vr->next) {
    if (!cl_exp_vrange_releasable(d, vr))
      continue;
    cachalot_status rc = cl_unmap_vrange_locked(d, vr, false, synced);
    if (rc != CACHALOT_OK && result == CACHALOT_OK)
      result = rc;
  }
  return result;
}

void cl_vranges_release_locked(cl_device *d, cl_bins *bins) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_backend *b = d->owner->backend;
  for (int k = 0; k < 2; k++) {
    cl_vrange *vr = bins->vr[k];
    if (!vr)
      continue;
    bins->vr[k] = NULL;
    for (cl_vrange **link = &d->vranges; *link; link = &(*link)->next) {
      if (*link == vr) {
        *link = vr->next;
        break;
      }
    }
    (void)b->ops->va_release(b, d->index, (void *)vr->base, vr->size); /* it holds no run: nothing is mapped
    * */
    free(vr);
  }
}

size_t cl_expandable_destroy_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_backend *b = d->owner->backend;
  size_t kept = 0;
  if (d->vranges)
    (void)b->ops->device_sync(b, d->index);
  /* every run of every kind first: a bins' two reservations go back together */
  for (cl_vrange *vr = d->vranges; vr; vr = vr->next) {
    for (cl_segment *run = vr->runs; run; run = run->run_next)
      kept += run->ptr + run->size - cl_exp_unmap_pages(d, vr, run->ptr, run->ptr + run->size, NULL);
    vr->runs = NULL; /* the runs stay in the device's segment list, which destroy frees */
  }
  while (d->vranges)
    cl_vranges_release_locked(d, d->vranges->bins);
  return kept;
}
