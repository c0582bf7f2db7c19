/* The allocator core's internal header: the structures (types.h), the free index (fit.h), lanes and
 * exclusive mode (lanes.h), pointer lookup (lookup.h) and history (history.h), then the functions of
 * each file of src/allocator/, by file. Rooms above the core (stats/, graph/, process/) include it. */
#ifndef CACHALOT_ALLOCATOR_INTERNAL_H
#define CACHALOT_ALLOCATOR_INTERNAL_H

#include <string.h>

#include "fit.h"
#include "history.h"
#include "lanes.h"
#include "lookup.h"
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

/* --- allocator.c: the core's lifecycle (the public cachalot_create/destroy are in src/process/) --- */
/* A new allocator over `b` with `conf` (NULL: CACHALOT_ALLOC_CONF), with the errors cachalot_create
 * documents. */
cachalot_status cl_allocator_create(cachalot_backend *b, const char *conf, cachalot_allocator **out);
/* Frees `a` and everything it holds (a != NULL; no call in flight). */
void cl_allocator_destroy(cachalot_allocator *a);


/* --- capture_reuse.c (graph_capture_record_stream_reuse) --- */
/* The nodes where the captured work of b's stream and of every stream that used it ends, for a block
 * freed during a capture; NULL when that cannot be told (a stream not in the same capture, a backend
 * without capture frontiers, host out of memory): the block then waits for the capture's end. */
cl_capture_wait *cl_capture_wait_make_locked(cl_device *d, cl_block *b);
/* Frees the deferred blocks whose uses the captured work of stream s now depends on (a malloc on s during
 * its capture is about to look for a block). */
void cl_capture_reuse_locked(cl_device *d, cachalot_stream s);

/* --- pool.c --- */
/* A fresh id {n, 0} for a graph capture given no pool (the first counter; from 1, never reused). */
cachalot_mempool_id cl_capture_pool_id(cachalot_allocator *a);
static inline bool cl_capturing(const cl_device *d) { return d->n_routes > 0; }
static inline bool cl_pool_is_default(const cl_device *d, const cl_pool *p) { return p == &d->default_pool; }
/* A malloc's hold on its private pool while it may drop the device lock (released meanwhile, the pool
 * stays until the hold goes); the default pool needs none. cl_pool_unhold_locked collects it if freeable. */
static inline void cl_pool_hold_locked(cl_device *d, cl_pool *p) {
  if (!cl_pool_is_default(d, p))
    ((cl_private_pool *)p)->holds++;
}
void cl_pool_unhold_locked(cl_device *d, cl_pool *p);
/* The source of p's segments, or NULL for the backend's (cachalot_pool_set_source). */
static inline const cachalot_segment_source *cl_pool_source(const cl_device *d, const cl_pool *p) {
  const cachalot_segment_source *src = cl_pool_is_default(d, p) ? NULL : &((const cl_private_pool *)p)->source;
  return src && src->alloc ? src : NULL;
}
/* The pool a request on `s` goes to: the first route, most recent first, whose filter takes `s`. */
cl_pool *cl_route_pool_locked(cl_device *d, cachalot_stream s);
/* Private pool `id` of d, or NULL. */
cl_pool *cl_find_pool_locked(cl_device *d, cachalot_mempool_id id);
static inline bool cl_pool_id_is_default(cachalot_mempool_id id) { return id.first == 0 && id.second == 0; }
/* INVALID_ARGUMENT naming `who` unless id is a private pool's (exactly one half non-zero). */
cachalot_status cl_check_private_id(cachalot_mempool_id id, const char *who);
/* cachalot_begin_allocate_to_pool's work once its arguments are checked (the id a private one): `who`'s
 * errors, nothing changed on one. */
cachalot_status cl_route_begin_locked(cl_device *d, cachalot_mempool_id id, cachalot_stream_filter filter, void *ctx,
                                      const char *who);
/* cachalot_end_allocate_to_pool's and cachalot_release_pool's work, on an entered device. */
cachalot_status cl_route_end_locked(cl_device *d, cachalot_mempool_id id);
cachalot_status cl_pool_release_use_locked(cl_device *d, cachalot_mempool_id id);
/* Frees the private pools that are freeable and have no segment left. */
void cl_pools_collect_locked(cl_device *d);
/* Frees every private pool (destroy). */
void cl_pools_destroy_locked(cl_device *d);
/* Bytes of free blocks held in private pools (for the OOM message). */
uint64_t cl_private_pool_free_bytes_locked(const cl_device *d);
/* Calls fn on every pool of the device, default first. */

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

/* --- free.c --- */
/* Returns a block to its free index, merging with free neighbours (PyTorch's free). */
void cl_free_block_locked(cl_device *d, cl_block *b);
/* Makes lane ln's deferred return, if any, and forgets its memo (ln locked; see cl_lane). */
void cl_lane_settle(cl_device *d, cl_lane *ln);
static inline void cl_lane_settle_memo(cl_device *d, cl_lane *ln) {
  if (ln->memo)
    cl_lane_settle(d, ln);
}

/* --- release.c --- */
/* Whole free segments marked `releasing`, waiting to be given back to the device. */
typedef struct cl_release_list {
  cl_segment *head;
} cl_release_list;
/* Gives a release list back to the device, dropping the lock meanwhile when the config allows. A
 * segment leaves the books when its device free succeeded; one whose free failed goes back to its free
 * index, so nothing is lost (the first failure is returned). */
cachalot_status cl_release_flush_locked(cl_device *d, cl_release_list *list);
/* empty_cache and the out-of-memory retry: waits for every outstanding event, gives back every whole free
 * segment of the default pool and of freeable private pools, and drops the pools left empty. Returns the
 * first failure (of the wait or of a device free); what could not be freed stays cached. */
cachalot_status cl_release_all_locked(cl_device *d);
/* empty_cache: lanes of streams with no segment left go dormant (see cl_lane), and empty per-stream event
 * queues go. */
void cl_lanes_rest_locked(cl_device *d);
/* empty_cache of one freeable private pool: its whole free segments (and the device's free pages). */
cachalot_status cl_release_pool_locked(cl_device *d, const cl_pool *p);
/* malloc step 4: garbage collection of aged whole free large segments of the default pool. */
void cl_garbage_collect_locked(cl_device *d, cl_release_list *out);
/* malloc step 6: frees oversize cached blocks of (pool, stream, kind). True when enough was marked. */
bool cl_release_oversize_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                cl_release_list *out);


/* --- autocapture.c (config key detect_captures) --- */
/* Before a malloc on `s`: if `s` is being captured, makes sure the capture routes to a private pool of
 * its own; ends the routing of captures that are over. A status only when the backend cannot say. */
cachalot_status cl_autocapture_malloc(cachalot_allocator *a, cl_device *d, cachalot_stream s);
/* Ends the routing of detected captures that are over (free calls it while any is routed). */
void cl_autocapture_poll(cachalot_allocator *a);
/* Frees the device's records (cachalot_destroy). */
void cl_autocapture_destroy(cl_device *d);

/* --- expandable.c (expandable_segments) --- */
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
/* empty_cache and the OOM retry: unmaps the whole free pages of every run of the default pool and of
 * freeable private pools. Returns the first failure; what could not be unmapped stays cached. */
cachalot_status cl_unmap_all_locked(cl_device *d, bool *synced);
/* Gives back the reservations of `bins`, which hold no run any more (its pool goes). */
void cl_vranges_release_locked(cl_device *d, cl_bins *bins);
/* destroy: unmaps every run and releases every reservation; returns the bytes that stayed mapped. */
size_t cl_expandable_destroy_locked(cl_device *d);

/* --- oom.c --- */
/* The out-of-memory path: counts, calls observers (lock dropped), sets the message. Called with the
 * device locked; returns with it unlocked. */
cachalot_status cl_out_of_memory_unlock(cl_device *d, size_t alloc_size);

#endif
