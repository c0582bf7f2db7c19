/* The expandable room's face: segments that grow by mapping pages into a reserved range, and give
 * pages back (expandable_segments). runs.h is the room's own. */
#ifndef CACHALOT_ALLOCATOR_EXPANDABLE_H
#define CACHALOT_ALLOCATOR_EXPANDABLE_H

#include "../core/core.h"

/* --- expandable.c: growing; expandable_unmap.c: pages given back --- */
/* malloc step 5 for an expandable kind: maps pages of the (pool, stream, kind) vrange (reserved on first
 * use) where a free block of at least `size` can then be made: after the free tail of a run when there
 * is one, in the lowest gap that holds it. On success *out is that FREE block, in no index, counted in
 * the split stats like any free block. Same statuses as a new segment (*host_oom for the host's). */
cachalot_status cl_expand_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                 bool is_retry, cl_block **out, bool *host_oom);
/* The bytes of the whole pages inside free block b of an expandable segment. */
size_t cl_unmappable_bytes(const cl_block *b);
/* Unmaps the whole pages inside FREE block b of an expandable segment (in its index), at most `limit`
 * bytes of them rounded up to pages (SIZE_MAX: all), splitting the run around them; *unmapped is the
 * bytes given back. The device is synchronized first unless *synced (set then): unmapping does not wait
 * for work still using the memory. Nothing is done during a capture. */
cachalot_status cl_unmap_block_locked(cl_device *d, cl_block *b, size_t limit, bool *synced, size_t *unmapped);
/* Unmaps the whole free pages of every run of vr (but those in the plan's range there, with keep_plan).
 * Returns the first failure; what could not be unmapped stays cached. */
cachalot_status cl_unmap_vrange_locked(cl_device *d, cl_vrange *vr, bool keep_plan, bool *synced);
/* empty_cache and the OOM retry: unmaps the whole free pages of every run of the default pool and of
 * freeable private pools. Returns the first failure; what could not be unmapped stays cached. */
cachalot_status cl_unmap_all_locked(cl_device *d, bool *synced);
/* Gives back the reservations of `bins`, which hold no run any more (its pool goes). */
void cl_vranges_release_locked(cl_device *d, cl_bins *bins);
/* Maps every page of [lo, hi) (widened to whole pages) of the (pool, stream, kind) reservation that no run
 * maps yet, joining the runs it reaches; what it maps goes to the free index. Compacts first as growth does. */
cachalot_status cl_expand_range_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, uintptr_t lo,
                                       uintptr_t hi, bool *host_oom);

/* --- plan.c: the step plan (expandable_plan) --- */
/* Makes or ends the device's step tracker and plan as its config asks (expandable_segments and
 * expandable_plan); without host memory for them there is simply no plan. */
void cl_plan_configure_locked(cl_device *d);
void cl_plan_destroy_locked(cl_device *d);
/* Before a default-pool malloc (d->step set): forms a plan from a period just found, or drops one the
 * program has stopped following. */
void cl_plan_before_malloc_locked(cl_device *d);
/* The planned FREE block (in no index) starting where the plan puts a default-pool malloc of `rounded`
 * bytes on stream s, when the tracker expects this malloc and the planned range is free (its missing
 * pages mapped); NULL otherwise, and the online policy serves it. */
cl_block *cl_plan_take_locked(cl_device *d, cachalot_stream s, bool small, size_t rounded);
/* Numbers block a, just handed out by the default pool on stream s for `rounded` bytes, for the tracker. */
void cl_plan_note_malloc_locked(cl_device *d, cl_block *a, size_t rounded, cachalot_stream s);
/* Whether [lo, hi) of vr meets the range the plan in force keeps there. */
static inline bool cl_vrange_planned(const cl_vrange *vr, uintptr_t lo, uintptr_t hi) {
  return lo < vr->plan_hi && vr->plan_lo < hi;
}
/* Whether free block b lies in part in a range of the plan in force (best fit passes it over). */
static inline bool cl_plan_holds(const cl_block *b) {
  return b->seg->expandable && cl_vrange_planned(b->seg->vr, b->ptr, b->ptr + b->size);
}
void cl_plan_stats_locked(cl_device *d, cachalot_plan_stats *out);
/* cachalot_check's part: the plan's ranges where their reservations keep them, its blocks inside them, the
 * tracker following the plan's period. */
cachalot_status cl_plan_check_locked(cl_device *d);

/* destroy: unmaps every run and releases every reservation; returns the bytes that stayed mapped. */
size_t cl_expandable_destroy_locked(cl_device *d);

#endif
