/* The runs of expandable segments, shared by expandable.c (reservations, growth, compaction) and
 * expandable_unmap.c (giving pages back): a run's handed-out table, its metadata, its place in its
 * vrange's list, and unmapping a range of pages. All in exclusive mode. */
#ifndef CACHALOT_ALLOCATOR_EXPANDABLE_RUNS_H
#define CACHALOT_ALLOCATOR_EXPANDABLE_RUNS_H

#include "expandable.h"

enum { SMALL_PAGE = 2u << 20 }; /* the large kind's page is the config's expandable_page */

/* Entries of s's table that a run of `size` bytes uses. */
static inline size_t entries(const cl_segment *s, size_t size) { return size >> s->at_shift; }

/* Puts run s into vr's list after `after` (NULL: first). */
void cl_exp_run_insert(cl_vrange *vr, cl_segment *after, cl_segment *s);
/* Whether empty_cache may unmap vr's free pages: those of the default pool and of freeable private
 * pools (a private pool still in use keeps its memory: a graph may replay into it). */
bool cl_exp_vrange_releasable(const cl_device *d, const cl_vrange *vr);
void cl_exp_run_remove(cl_vrange *vr, cl_segment *s);
/* Back to the spares. A racing free() may still read it through the page map: with size 0 and no table
 * it matches no pointer. */
void cl_exp_segment_spare_locked(cl_device *d, cl_segment *s);
/* Gives back metadata taken for a change that did not happen (either may be NULL). */
void cl_exp_drop_metadata(cl_device *d, cl_segment *s, cl_block *b);
/* Segment metadata for a new run (a spare's, else new), cleared, with no table. NULL on host OOM. */
cl_segment *cl_exp_segment_new_locked(cl_device *d);
/* Unmaps [lo, hi) page by page; returns where it stopped (hi unless a page could not be unmapped, whose
 * status goes to *rc if rc is not NULL). */
uintptr_t cl_exp_unmap_pages(cl_device *d, const cl_vrange *vr, uintptr_t lo, uintptr_t hi, cachalot_status *rc);
/* Makes s a run of vr, for requests on `stream` from pool p. */
void cl_exp_run_init(cl_segment *s, cl_vrange *vr, cl_pool *p, cachalot_stream stream, cl_lane *lane);
/* Makes s's table hold a run of `size` bytes (entries past the run's current size are not cleared:
 * the caller clears them once the run has grown). Doubles, so that a run grown page by page copies its
 * table a logarithmic number of times. */
bool cl_exp_table_reserve(cl_segment *s, size_t size);

#endif
