/* The step plan (expandable_plan, set by preset:low_fragmentation): once the step tracker (core/step.c)
 * has found that the default pool's mallocs and frees repeat with some period, one period's blocks are
 * packed into one range per (stream, kind) by their lives (pack.c), and each later malloc the tracker
 * recognizes is handed the planned address.
 *
 * Why: the online policy places a block where the free blocks of the moment let it, so a step that
 * repeats can still leave holes that a later request does not fit, and expandable_compact then trades
 * pages back and forth every step. A plan puts every block of the step where the step's whole schedule
 * fits in about its live-bytes peak, so that once its range is mapped, no page is mapped or unmapped
 * again while the step repeats.
 *
 * Safety never depends on the plan being right: a planned range is handed out only when it lies wholly
 * inside one free block of the stream's reservation (pages missing from it are mapped first); else the
 * online policy serves the malloc as it would have. Each block of the plan has two places, one for even
 * periods and one for odd ones, so that a block that lives into the next period (a batch being prefetched,
 * gradients kept to the next step) does not meet its next copy.
 *
 * The ranges sit at the top of the reservation, above the online policy's blocks, which growth puts as
 * low as it can. Compaction leaves their free pages mapped while the plan lasts; the plan is dropped once
 * a whole period of events has not followed it, and the tracker looks for a period again. */
#include "runs.h"

#include <stdlib.h>

#include "../core/step.h"
#include "pack.h"

enum { MAX_REGIONS = 16 };
/* Without a plan, nothing live counts as a restart once this many events passed since the last one: a
 * program that frees everything in a loop of a few blocks (a benchmark, a test) must not trade its pages
 * at every turn, and one that starts a whole run over has made far more. */
enum { RESTART_EVENTS = 4096 };

/* The range of one (stream, kind): [base, base + size) of the default pool's reservation of that stream and
 * kind, `size` whole pages (0: none). The reservation is found again at each use, not kept: empty_cache
 * gives back the reservation of a stream left with nothing, and the range then goes with it. */
typedef struct {
  cachalot_stream stream;
  bool small;
  uintptr_t base;
  size_t size;
} region;

/* The reservation that keeps region g's range, or NULL when it is gone (see region). */
static cl_vrange *region_vr(cl_device *d, const region *g) {
  cl_bins *bins = g->size ? cl_bins_get_locked(d, &d->default_pool, g->stream, false) : NULL;
  cl_vrange *vr = bins ? bins->vr[g->small] : NULL;
  return vr && vr->plan_lo == g->base && vr->plan_hi == g->base + g->size ? vr : NULL;
}

/* A malloc of the period: its region (-1: left to the online policy) and its offset there by the lap's
 * parity. */
typedef struct {
  int32_t region;
  size_t size;
  size_t off[2];
} slot;

/* Invariant: while `period` is set, the tracker follows a period of that many events, slots[k] is its
 * k-th event's (a free's is unused), every region lies inside its vrange's reservation and every slot's
 * two ranges inside its region. The counters outlive the plans. */
struct cl_plan {
  cachalot_plan_stats st;
  uint64_t period;
  slot *slots;
  region regions[MAX_REGIONS];
  size_t n_regions;
  uint64_t lap;         /* the lap of the latest malloc served */
  bool lap_clean;       /* no miss in it so far */
  int64_t lap_calls;    /* device calls when it began */
  int64_t calls_base;   /* device calls when in force began or were last counted */
  uint64_t lost_seen;   /* the tracker's count of losses at the latest malloc served */
  uint64_t serve_from;  /* the tracker's event count from which the plan serves (its first lap's start) */
};

static int64_t device_calls(const cl_device *d) { return d->stats.num_device_alloc + d->stats.num_device_free; }

/* Counts the device calls made in force since they were last counted. */
static void count_calls(cl_device *d) {
  cl_plan *pl = d->plan;
  const int64_t now = device_calls(d);
  if (pl->st.in_force && now > pl->calls_base)
    pl->st.device_calls_in_force += now - pl->calls_base;
  pl->calls_base = now;
}

static void end_plan(cl_device *d) {
  cl_plan *pl = d->plan;
  count_calls(d);
  for (size_t r = 0; r < pl->n_regions; r++) {
    cl_vrange *vr = region_vr(d, &pl->regions[r]);
    if (vr)
      vr->plan_lo = vr->plan_hi = 0;
  }
  free(pl->slots);
  pl->slots = NULL;
  pl->period = 0;
  pl->n_regions = 0;
  pl->st.in_force = 0;
  pl->st.period = pl->st.footprint = 0;
}

void cl_plan_configure_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  const bool on = d->cfg.expandable_segments && d->cfg.expandable_plan;
  if (on && !d->step) {
    d->step = cl_step_new();
    d->plan = calloc(1, sizeof *d->plan);
    if (!d->step || !d->plan) { /* no host memory: no plan, which is safe */
      cl_step_delete(d->step);
      free(d->plan);
      d->step = NULL;
      d->plan = NULL;
      return;
    }
    /* a new tracker: numbers an earlier one gave (the key turned off and on again) mean nothing to it */
    for (cl_segment *seg = d->segments; seg; seg = seg->next)
      for (cl_block *b = seg->head; b; b = b->next)
        b->step_seq = 0;
  } else if (!on && d->step) {
    cl_plan_destroy_locked(d);
  }
}

void cl_plan_destroy_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->plan)
    end_plan(d);
  free(d->plan);
  cl_step_delete(d->step);
  d->plan = NULL;
  d->step = NULL;
}

/* The highest stretch of `size` bytes in vr that no run maps, as high as it goes; false if none. */
static bool top_gap(const cl_vrange *vr, size_t size, uintptr_t *base) {
  bool found = false;
  for (const cl_segment *prev = NULL, *run = vr->runs;; prev = run, run = run->run_next) {
    const uintptr_t lo = prev ? prev->ptr + prev->size : vr->base, hi = run ? run->ptr : vr->base + vr->size;
    if (hi - lo >= size) {
      *base = hi - size;
      found = true;
    }
    if (!run)
      return found;
  }
}

/* The region of (stream, small), made if there is room (-1: none). */
static int region_of(cl_device *d, cachalot_stream stream, bool small) {
  cl_plan *pl = d->plan;
  for (size_t r = 0; r < pl->n_regions; r++)
    if (pl->regions[r].stream == stream && pl->regions[r].small == small)
      return (int)r;
  if (pl->n_regions == MAX_REGIONS)
    return -1;
  cl_bins *bins = cl_bins_get_locked(d, &d->default_pool, stream, false);
  if (!bins || !bins->vr[small])
    return -1;
  pl->regions[pl->n_regions] = (region){stream, small, 0, 0};
  return (int)pl->n_regions++;
}

/* Packs region r's blocks; false when they cannot be (the region is left empty, its slots unplanned). */
static bool pack_region(cl_device *d, int r, cl_pack_item *items, const uint64_t *ks, size_t n) {
  cl_plan *pl = d->plan;
  region *g = &pl->regions[r];
  cl_vrange *vr = cl_bins_get_locked(d, &d->default_pool, g->stream, false)->vr[g->small]; /* (region_of) */
  const size_t span = cl_pack(items, 2 * n, 2 * pl->period);
  if (span == SIZE_MAX || span == 0)
    return false;
  const size_t size = cl_round_up(span, vr->page);
  if (!top_gap(vr, size, &g->base))
    return false;
  g->size = size;
  for (size_t i = 0; i < n; i++)
    pl->slots[ks[i]] = (slot){r, items[2 * i].size, {items[2 * i].off, items[2 * i + 1].off}};
  vr->plan_lo = g->base;
  vr->plan_hi = g->base + g->size;
  return true;
}

static void form_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_plan *pl = d->plan;
  cl_step *t = d->step;
  pl->st.periods_found++;
  end_plan(d);
  const uint64_t P = t->period;
  pl->slots = malloc(P * sizeof *pl->slots);
  cl_pack_item *items = malloc(2 * P * sizeof *items);
  uint64_t *ks = malloc(P * sizeof *ks);
  struct {
    int region; /* -1: left to the online policy */
    uint64_t life;
  } *reg = malloc(P * sizeof *reg);
  if (!pl->slots || !items || !ks || !reg)
    goto fail;
  for (uint64_t k = 0; k < P; k++) {
    pl->slots[k] = (slot){-1, 0, {0, 0}};
    const cl_step_event *e = cl_step_window(t, k);
    reg[k].region = -1;
    if (e->size && cl_step_life(t, k, &reg[k].life) && reg[k].life < 2 * P)
      reg[k].region = region_of(d, e->stream, cl_is_small(e->size));
  }
  pl->period = P;
  for (size_t r = 0; r < pl->n_regions; r++) {
    size_t n = 0;
    for (uint64_t k = 0; k < P; k++) {
      if (reg[k].region != (int)r)
        continue;
      const size_t size = cl_step_window(t, k)->size;
      items[2 * n] = (cl_pack_item){size, k, reg[k].life, 0};
      items[2 * n + 1] = (cl_pack_item){size, k + P, reg[k].life, 0};
      ks[n++] = k;
    }
    if (pack_region(d, (int)r, items, ks, n))
      pl->st.footprint += (int64_t)pl->regions[r].size;
  }
  free(items);
  free(ks);
  free(reg);
  if (!cl_step_follow(t)) {
    end_plan(d);
    return;
  }
  /* Served from the next time the period passes its fewest live bytes: the blocks the online policy
   * placed are fewest then, and the range fills while they go. */
  uint64_t low = 0;
  for (uint64_t k = 1; k < P; k++)
    if (cl_step_window(t, k)->live < cl_step_window(t, low)->live)
      low = k;
  pl->serve_from = t->n + (low + 1 + P - t->pos) % P;
  pl->st.plans_formed++;
  pl->st.period = (int64_t)P;
  pl->lap = t->lap;
  pl->lost_seen = t->lost_since;
  pl->lap_clean = true;
  pl->lap_calls = device_calls(d);
  return;
fail:
  free(items);
  free(ks);
  free(reg);
  end_plan(d);
  cl_step_forget(t);
}

static void drop_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  end_plan(d);
  d->plan->st.plans_dropped++;
  cl_step_forget(d->step);
}

/* The plan is out of force: the program left it (a malloc it did not expect, a planned range taken). */
static void out_of_force(cl_device *d) {
  cl_plan *pl = d->plan;
  count_calls(d);
  pl->st.in_force = 0;
  pl->lap_clean = false;
}

/* A new lap: the one before counts as clean when nothing missed and no page was mapped or unmapped in it,
 * and a clean lap puts the plan in force. */
static void note_lap(cl_device *d, uint64_t lap) {
  cl_plan *pl = d->plan;
  if (d->step->lost_since != pl->lost_seen) { /* the tracker lost the period since the last malloc */
    pl->lost_seen = d->step->lost_since;
    out_of_force(d);
  }
  if (lap == pl->lap)
    return;
  const int64_t now = device_calls(d);
  if (pl->lap_clean && now == pl->lap_calls && lap == pl->lap + 1) {
    pl->st.laps_clean++;
    if (!pl->st.in_force) {
      pl->st.in_force = 1;
      pl->calls_base = now;
    }
  }
  pl->lap = lap;
  pl->lap_clean = true;
  pl->lap_calls = now;
}

enum { BACK_ENTRIES = 64 };

/* The block of vr that holds address x, or NULL where no run maps it. From the nearest handed-out block
 * at or before x in the run's table (a few entries back, as a rule: the plan's blocks lie close), else
 * from the run's head. */
static cl_block *block_at(const cl_vrange *vr, uintptr_t x) {
  for (cl_segment *run = vr->runs; run && run->ptr <= x; run = run->run_next) {
    if (x >= run->ptr + run->size)
      continue;
    cl_block *b = run->head;
    const size_t i = (x - run->ptr) >> run->at_shift;
    for (size_t j = i + 1; j-- > 0 && i - j < BACK_ENTRIES;) {
      cl_block *h = run->at[j];
      if (h && h->ptr <= x) {
        b = h;
        break;
      }
    }
    for (; b; b = b->next)
      if (x < b->ptr + b->size)
        return b;
    return NULL;
  }
  return NULL;
}

/* Whether every block of vr that [lo, hi) meets is free (pages no run maps are free too). */
static bool range_free(const cl_vrange *vr, uintptr_t lo, uintptr_t hi) {
  for (cl_segment *run = vr->runs; run && run->ptr < hi; run = run->run_next) {
    if (run->ptr + run->size <= lo)
      continue;
    for (cl_block *b = run->head; b && b->ptr < hi; b = b->next)
      if (b->ptr + b->size > lo && b->state != CL_FREE)
        return false;
  }
  return true;
}

/* Splits free block b (in no index) at `at`: the front becomes a free block of its own, in its index. */
static bool split_front(cl_device *d, cl_block *b, uintptr_t at) {
  cl_block *f = cl_block_new_locked(d);
  if (!f)
    return false;
  const bool was_split = b->prev || b->next;
  f->ptr = b->ptr;
  f->size = at - b->ptr;
  f->seg = b->seg;
  f->prev = b->prev;
  f->next = b;
  if (b->prev)
    b->prev->next = f;
  else
    b->seg->head = f;
  b->prev = f;
  b->ptr = at;
  b->size -= f->size;
  /* both are inactive blocks of a split run now: f is new, and b was one already unless its run was whole */
  cl_count_split_locked(d, b->seg->small, was_split ? 1 : 2, was_split ? 0 : (int64_t)(f->size + b->size));
  cl_free_index_insert_locked(d, f);
  return true;
}

cl_block *cl_plan_take_locked(cl_device *d, cachalot_stream s, bool small, size_t rounded) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_plan *pl = d->plan;
  uint64_t pos, lap;
  if (!pl->period)
    return NULL;
  if (!cl_step_position(d->step, rounded, s, &pos, &lap)) { /* a malloc the period does not have here */
    if (pl->st.in_force)
      out_of_force(d);
    return NULL;
  }
  if (d->step->n < pl->serve_from)
    return NULL;
  note_lap(d, lap);
  const slot *sl = &pl->slots[pos];
  if (sl->region < 0) {
    pl->st.unplanned++;
    return NULL;
  }
  const region *g = &pl->regions[sl->region];
  const uintptr_t lo = g->base + sl->off[lap & 1], hi = lo + rounded;
  bool host_oom;
  cl_vrange *vr = region_vr(d, g);
  cl_block *b = vr && g->stream == s && g->small == small ? block_at(vr, lo) : NULL;
  /* the steady state: one free block holds the range; else pages missing from it are mapped first */
  const bool holds = b && b->state == CL_FREE && b->ptr + b->size >= hi;
  if (!holds && vr && g->stream == s && g->small == small && range_free(vr, lo, hi) &&
      cl_expand_range_locked(d, &d->default_pool, s, small, lo, hi, &host_oom) == CACHALOT_OK)
    b = block_at(vr, lo);
  if (b && b->state == CL_FREE && b->ptr + b->size >= hi) {
    cl_free_index_remove_locked(d, b);
    if (b->ptr == lo || split_front(d, b, lo)) {
      pl->st.served++;
      return b;
    }
    cl_free_index_insert_locked(d, b);
  }
  pl->st.missed++;
  out_of_force(d);
  return NULL;
}

void cl_plan_note_malloc_locked(cl_device *d, cl_block *a, size_t rounded, cachalot_stream s) {
  CL_ASSERT_EXCLUSIVE(d);
  /* (a use_on_oom pool's block is not the default pool's: the tracker does not see it) */
  a->step_seq = cl_pool_is_default(d, a->seg->pool) ? cl_step_malloc(d->step, rounded, a->size, s) : 0;
}

/* Whether a range of the plan went with its reservation (empty_cache gave back a stream's). */
static bool range_gone(cl_device *d) {
  const cl_plan *pl = d->plan;
  for (size_t r = 0; r < pl->n_regions; r++)
    if (pl->regions[r].size && !region_vr(d, &pl->regions[r]))
      return true;
  return false;
}

/* A program that starts over (everything freed, its setup made again: a new model, a second run in one
 * process): nothing is live on the device and, with a plan kept, the tracker has lost the period (without
 * one, RESTART_EVENTS passed since the last restart). The online policy will place the setup's blocks and
 * the first steps' (a plan serves again only once a whole period has matched), and the free pages it left
 * mapped from the run before would scatter them: their holes no longer fit, and the free bytes left in
 * pages that also hold live bytes, which no compaction can reach, add to the reserved peak at each restart
 * (over six passes: lm_train 1.023 against 1.015 once, kv_generate 1.101 against 1.042). So those pages go
 * back now, and the run is placed as the first was, tightly from growth. A plan's ranges stay mapped: it
 * serves there again. The plan is out of force from here: the program left it. */
static void restart_locked(cl_device *d) {
  cl_plan *pl = d->plan;
  if (pl->period && pl->st.in_force)
    out_of_force(d);
  bool synced = false;
  for (cl_vrange *vr = d->vranges; vr; vr = vr->next)
    if (vr->runs && cl_pool_is_default(d, vr->runs->pool))
      (void)cl_unmap_vrange_locked(d, vr, true, &synced); /* a failure leaves those pages mapped */
}

void cl_plan_before_malloc_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_plan *pl = d->plan;
  if (CL_UNLIKELY(d->stats.allocated_bytes[CACHALOT_STAT_ALL].current == 0) &&
      (pl->period ? !cl_step_following(d->step) : d->step->n - d->step->restarted_at >= RESTART_EVENTS)) {
    d->step->restarted_at = d->step->n;
    restart_locked(d);
    /* without a plan, the run placed again is compacted against its own peak, as the first was; with one,
     * against the reserved peak, under which the plan's range was made to fit (compacting against less
     * would unmap the range's pages for the run's setup, to map them again for the plan) */
    d->step->restarted = !pl->period;
    d->step->peak = d->stats.reserved_bytes[CACHALOT_STAT_ALL].current;
  }
  if (cl_step_found(d->step))
    form_locked(d);
  else if (d->plan->period && (cl_step_gone(d->step) || range_gone(d)))
    drop_locked(d);
}

void cl_plan_stats_locked(cl_device *d, cachalot_plan_stats *out) {
  CL_ASSERT_EXCLUSIVE(d);
  if (!d->plan) {
    memset(out, 0, sizeof *out);
    return;
  }
  count_calls(d);
  *out = d->plan->st;
}

/* cl_plan's invariant and the tracker's. */
cachalot_status cl_plan_check_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  const int dev = d->index;
  const cl_plan *pl = d->plan;
  const cl_step *t = d->step;
  if (!pl != !t || (t && (!d->cfg.expandable_segments || !d->cfg.expandable_plan)))
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: a step plan where the config has none",
                   dev);
  size_t planned_vranges = 0;
  for (const cl_vrange *vr = d->vranges; vr; vr = vr->next)
    planned_vranges += vr->plan_hi != 0;
  if (!pl)
    return planned_vranges ? cl_fail(CACHALOT_ERROR_INVALID_STATE,
                                     "cachalot_check: device %d: a reservation keeps a range for no plan", dev)
                           : CACHALOT_OK;
  if (t->live < 0 || (t->sym && (t->pos >= t->period || !t->pgrams)) || (pl->period && pl->period != t->period) ||
      (pl->period && !t->sym))
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: the step tracker does not follow the plan",
                   dev);
  size_t kept = 0;
  for (size_t r = 0; r < pl->n_regions; r++) {
    const region *g = &pl->regions[r];
    const cl_vrange *vr = region_vr(d, g); /* (none when empty_cache gave its reservation back) */
    if (vr && (g->base < vr->base || g->size > vr->base + vr->size - g->base || (g->base - vr->base) % vr->page ||
               g->size % vr->page || vr->small != g->small || vr->bins->stream != g->stream))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: the plan's range 0x%llx lies outside its reservation", dev,
                     (unsigned long long)g->base);
    kept += vr != NULL;
  }
  if (kept != planned_vranges)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_check: device %d: %zu reservations keep a range, the plan has %zu", dev, planned_vranges,
                   kept);
  for (uint64_t k = 0; k < pl->period; k++) {
    const slot *sl = &pl->slots[k];
    if (sl->region < 0)
      continue;
    const region *g = (size_t)sl->region < pl->n_regions ? &pl->regions[sl->region] : NULL;
    if (!g || !g->size || !sl->size || sl->size > g->size || sl->off[0] > g->size - sl->size ||
        sl->off[1] > g->size - sl->size || sl->off[0] % 512 || sl->off[1] % 512)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: the plan's block %llu lies outside its range", dev,
                     (unsigned long long)k);
  }
  return CACHALOT_OK;
}
