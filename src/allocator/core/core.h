/* The core's header: the structures (types.h), the free index (fit.h), lanes and exclusive mode
 * (lanes.h), pointer lookup (lookup.h) and the history recorder (history.h), then the functions of each
 * file of core/, by file. The rooms above (expandable/, host/, pools/, the policy files) include it. */
#ifndef CACHALOT_ALLOCATOR_CORE_H
#define CACHALOT_ALLOCATOR_CORE_H

#include <string.h>

#include "fit.h"
#include "history.h"
#include "lanes.h"
#include "lookup.h"
#include "step.h"
#include "types.h"

/* --- segments --- */
/* Zeroes every field of s but its lane (see cl_seg_lane), for metadata taken from the spares. */
static inline void cl_segment_clear(cl_segment *s) {
  const size_t lane_at = offsetof(cl_segment, lane), lane_end = lane_at + sizeof s->lane;
  memset(s, 0, lane_at);
  memset((char *)s + lane_end, 0, sizeof *s - lane_end);
}

static inline unsigned cl_seg_shift(bool small) { return small ? 9 : 20; }
/* The entries of s's table (a spare segment keeps its last size, shift and table; a spared run has size
 * 0 and no table). */
static inline size_t cl_seg_entries(const cl_segment *s) { return s->size >> s->at_shift; }

/* Adds s to its device's segment list and to its pool's count, and takes it off again. */
static inline void cl_segment_link_locked(cl_device *d, cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  s->prev = NULL;
  s->next = d->segments;
  if (d->segments)
    d->segments->prev = s;
  d->segments = s;
  d->n_segments++;
  s->pool->n_segments++;
}
/* qsort order of segment pointers: by address. */
static inline int cl_segment_cmp_addr(const void *x, const void *y) {
  const cl_segment *a = *(cl_segment *const *)x, *b = *(cl_segment *const *)y;
  return a->ptr < b->ptr ? -1 : a->ptr > b->ptr;
}
static inline void cl_segment_unlink_locked(cl_device *d, cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  if (s->prev)
    s->prev->next = s->next;
  else
    d->segments = s->next;
  if (s->next)
    s->next->prev = s->prev;
  d->n_segments--;
  s->pool->n_segments--;
}

/* In a child forked after `a` was made: CACHALOT_ERROR_DEVICE with the message, for `who`. CUDA cannot be
 * used in a forked child, and the parent's locks and memory are not the child's (entry.c). */
cachalot_status cl_forked_fail(const char *who);
static inline bool cl_forked(const cachalot_allocator *a) {
  return atomic_load_explicit(&a->forked, memory_order_relaxed);
}

/* --- pools: what the types say of a device's pools (pools/ keeps them) --- */
static inline bool cl_capturing(const cl_device *d) { return d->n_routes > 0; }
static inline bool cl_pool_is_default(const cl_device *d, const cl_pool *p) { return p == &d->default_pool; }
/* The source of p's segments, or NULL for the backend's (cachalot_pool_set_source). */
static inline const cachalot_segment_source *cl_pool_source(const cl_device *d, const cl_pool *p) {
  const cachalot_segment_source *src = cl_pool_is_default(d, p) ? NULL : &((const cl_private_pool *)p)->source;
  return src && src->alloc ? src : NULL;
}
static inline bool cl_pool_id_is_default(cachalot_mempool_id id) { return id.first == 0 && id.second == 0; }

/* --- entry.c --- */
/* The entry points' first step, before any lock: INVALID_ARGUMENT naming `fn` unless a is an allocator;
 * in a forked child, DEVICE (cl_forked_fail). */
cachalot_status cl_check_allocator_arg(const cachalot_allocator *a, const char *fn);
/* cl_check_allocator_arg, and INVALID_ARGUMENT unless `device` is one of a's devices. */
cachalot_status cl_check_device_arg(const cachalot_allocator *a, int device, const char *fn);
/* The entry points' opening: cl_check_device_arg, then *d = that device in exclusive mode (the caller
 * leaves it). */
cachalot_status cl_enter_device(cachalot_allocator *a, int device, const char *fn, cl_device **d);
/* The opening of a call on a block: finds the ALLOCATED block at exactly `ptr` and returns with its device
 * in exclusive mode; else INVALID_ARGUMENT (no allocator) or INVALID_POINTER, and nothing locked. */
cachalot_status cl_enter_block(cachalot_allocator *a, void *ptr, const char *fn, cl_device **dev, cl_block **blk);
/* Whether `ptr` lies in one of a's segments, handed out or not (a slow scan: for error paths, e.g. the
 * interposer telling a second free of cachalot's memory from a pointer of the runtime's). */
bool cl_address_is_ours(cachalot_allocator *a, const void *ptr);

/* --- metadata.c: free lists of block and pending-event records. NULL on host OOM. --- */
cl_block *cl_block_new_locked(cl_device *d);
void cl_block_delete_locked(cl_device *d, cl_block *b);
cl_pending_event *cl_pending_new_locked(cl_device *d);
void cl_pending_delete_locked(cl_device *d, cl_pending_event *e);

/* --- fraction.c --- */
/* Makes sure allowed_max is known (asks the backend once). */
void cl_fraction_resolve_locked(cl_device *d);
/* f x bytes, for f in [0, 1], rounded down: SIZE_MAX where the product reaches 2^64 (converting such a double
 * to size_t is undefined, and on x86 gave 0). */
static inline size_t cl_scale_bytes(double f, size_t bytes) {
  const double v = f * (double)bytes;
  return v >= 18446744073709551616.0 ? SIZE_MAX : v <= 0 ? 0 : (size_t)v;
}
/* Whether `bytes` more of device memory (a segment, or pages to map) stay within the memory fraction:
 * OK, or OUT_OF_MEMORY with the message (reserved bytes in transit count). */
cachalot_status cl_fraction_admit_locked(cl_device *d, size_t bytes);

/* --- events.c --- */
/* Records an event per stream use of `b` and makes it PENDING; all or nothing. */
cachalot_status cl_insert_events_locked(cl_device *d, cl_block *b);
/* Whether a stream that used b (its record_stream streams, of any device) is being captured now: an event
 * recorded there would become part of the captured graph and never complete. */
bool cl_uses_capturing_locked(cl_device *d, const cl_block *b);
/* Polls outstanding events in order per stream and frees the blocks whose events all completed. */
void cl_process_events_locked(cl_device *d);
/* Streams whose oldest outstanding event no watch covers (what d->n_unwatched keeps). */
size_t cl_count_unwatched_locked(cl_device *d);
/* Waits for every outstanding event (num_sync_all_streams + 1) and frees their blocks. */
cachalot_status cl_sync_all_events_locked(cl_device *d);

/* --- merge.c --- */
/* Returns a block to its free index, merging with free neighbours (PyTorch's free). */
void cl_free_block_locked(cl_device *d, cl_block *b);
/* Makes lane ln's deferred return, if any, and forgets its memo (ln locked; see cl_lane). */
void cl_lane_settle(cl_device *d, cl_lane *ln);
static inline void cl_lane_settle_memo(cl_device *d, cl_lane *ln) {
  if (ln->memo)
    cl_lane_settle(d, ln);
}

#endif
