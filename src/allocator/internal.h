/* The allocator's core structures, shared by src/allocator/ and src/stats/.
 *
 * Glossary
 *   segment   one device allocation, tiled in address order by blocks.
 *   block     a run of a segment: FREE (cached, in a free index), ALLOCATED (handed out) or PENDING
 *             (freed by the program, waiting for events on the streams that used it).
 *   kind      small (segments of 2 MiB for rounded sizes <= 1 MiB) or large.
 *   pool      where a request is served from: a device's default pool, or (later) a private pool. A pool
 *             owns free indexes per (stream, kind); requests on stream S only see S's index.
 *   bins      the free index of one (pool, stream): one tree per kind.
 *
 * Locking: everything under a cl_device is guarded by that device's `lock` (names ending in _locked
 * expect it held). The lock is dropped around device allocations and frees unless the config's
 * release_lock_on_cudamalloc is False; `inflight` counts the bytes of device allocations in transit
 * meanwhile, so memory fraction checks stay honest (segments being freed still count as reserved).
 */
#ifndef CACHALOT_ALLOCATOR_INTERNAL_H
#define CACHALOT_ALLOCATOR_INTERNAL_H

#include <cachalot/cachalot.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"
#include "backend/backend.h"
#include "config.h"
#include "sizes.h"

#ifndef HASH_NONFATAL_OOM
#define HASH_NONFATAL_OOM 1
#endif
/* uthash's default on host OOM is exit(); with HASH_NONFATAL_OOM it calls this instead and leaves the
 * element out. Every HASH_ADD site declares `bool hash_oom = false;` and checks it afterwards. */
#define uthash_nonfatal_oom(obj) (hash_oom = true)
#include <uthash.h>

typedef enum { CL_FREE = 0, CL_ALLOCATED, CL_PENDING } cl_block_state;

typedef struct cl_segment cl_segment;
typedef struct cl_pool cl_pool;

/* A block. Invariants: ptr and size are multiples of 512, size > 0; prev/next are the address
 * neighbours inside the same segment (prev->ptr + prev->size == ptr); two FREE neighbours never stand
 * side by side; a FREE block is in exactly one tree, that of (seg->pool, seg->stream, seg->small); an
 * ALLOCATED or PENDING block is in the device's pointer map (hh) and in no tree; a PENDING block has
 * event_count > 0 entries in the device's event queues.
 *
 *   segment: | blk ALLOCATED | blk FREE | blk PENDING | blk FREE |
 *            ^seg->ptr, head            (next -->, <-- prev)      ^ seg->ptr + seg->size
 */
typedef struct cl_block {
  uintptr_t ptr;
  size_t size;
  size_t requested;          /* the size the program asked for (while ALLOCATED or PENDING) */
  cl_segment *seg;
  struct cl_block *prev, *next;
  struct cl_block *left, *right; /* free-index treap links (FREE only) */
  uint32_t prio;             /* treap priority, a hash of ptr: the tree shape is deterministic */
  uint8_t state;             /* cl_block_state */
  uint32_t event_count;      /* outstanding events (PENDING) */
  uint64_t gc_base;          /* the pool's lookup counter when the block became free (its age base) */
  cachalot_stream *uses;     /* record_stream streams other than seg->stream (heap array) */
  uint32_t n_uses, cap_uses;
  UT_hash_handle hh;         /* device pointer map, key ptr */
} cl_block;

/* A segment: one device allocation of `size` bytes at `ptr`, served to requests on `stream` from
 * `pool`'s `small` or large index. Its blocks tile [ptr, ptr + size) exactly, starting at `head`.
 * A `releasing` segment is being given back with the device lock dropped: it is still in the list and
 * in the stats, its single FREE block is in no index, and it leaves the books only once the device
 * free succeeded (or goes back to its index if the free failed). */
struct cl_segment {
  uintptr_t ptr;
  size_t size;
  cl_pool *pool;
  cachalot_stream stream;
  bool small;
  bool releasing;
  bool device_freed; /* while releasing: the device free succeeded (written with the lock dropped, read
                        after it is retaken, by the releasing thread only) */
  cl_block *head;
  cl_segment *prev, *next;  /* the device's segment list */
  cl_segment *release_next; /* a release list, while releasing */
};

/* The free blocks of one (pool, stream): a treap per kind ordered by (size, ptr), so the lower bound of
 * (size, 0) is the best fit with the lowest address among equals. */
typedef struct cl_bins {
  cachalot_stream stream;
  cl_block *root[2]; /* [0] large, [1] small */
  size_t count[2];
  UT_hash_handle hh;
} cl_bins;

/* A pool: the default pool of a device ({0,0}) or a private one (SPEC.md §5). `lookups[kind]` counts
 * free-block searches (only while garbage collection is on): a free block's age is lookups - gc_base.
 * A private pool lives in its device's `pools` table from its first begin_allocate_to_pool until it is
 * freeable (use_count 0) and has no segment left; n_segments counts its segments (any state). */
struct cl_pool {
  cachalot_mempool_id id;
  cl_bins *bins; /* hash by stream */
  cl_bins *last_bins; /* the last bins looked up: most requests repeat their stream */
  uint64_t lookups[2];
  int use_count;
  size_t n_segments;
  UT_hash_handle hh; /* the device's private pool table, key id */
};

/* An active begin_allocate_to_pool: requests whose stream passes `filter` go to `pool`. */
typedef struct cl_route {
  cl_pool *pool;
  cachalot_stream_filter filter;
  void *ctx;
} cl_route;

/* One event waiting on a stream, for a PENDING block. */
typedef struct cl_pending_event {
  cl_event *ev;
  cl_block *blk;
  struct cl_pending_event *next;
} cl_pending_event;

/* Outstanding events of one stream, oldest first: they complete in order, so polling stops at the
 * first one not done. */
typedef struct cl_stream_events {
  cachalot_stream stream;
  cl_pending_event *head, *tail;
  UT_hash_handle hh;
} cl_stream_events;

/* Memory history (SPEC.md §7): what happened, in a ring buffer per device. */
typedef enum {
  CL_TRACE_ALLOC,
  CL_TRACE_FREE_REQUESTED,
  CL_TRACE_FREE_COMPLETED,
  CL_TRACE_SEGMENT_ALLOC,
  CL_TRACE_SEGMENT_FREE,
  CL_TRACE_SEGMENT_MAP,
  CL_TRACE_SEGMENT_UNMAP,
  CL_TRACE_OOM,
  CL_TRACE_SNAPSHOT,
  CL_TRACE_USER_DEFINED,
} cl_trace_action;
enum { CL_TRACE_MAX_FRAMES = 16 };

typedef struct {
  uint8_t action;   /* cl_trace_action */
  uint8_t n_frames; /* return addresses kept in the device's trace_frames row (stacks on) */
  uint64_t addr;    /* device_free for oom */
  uint64_t size;    /* requested size for alloc/free entries, as PyTorch records them */
  uintptr_t stream;
  int64_t time_us;  /* since the epoch */
} cl_trace_entry;

/* The ring buffer: trace_cap entries, the oldest at trace_head, trace_count of them valid. A cap of 0
 * means history is off, and recording is one untaken branch. */
typedef struct {
  cl_trace_entry *entries;
  void **frames; /* trace_cap x CL_TRACE_MAX_FRAMES, or NULL without stacks */
  size_t cap, head, count;
} cl_trace;

/* Everything cachalot keeps for one device, guarded by `lock`. */
typedef struct cl_device {
  pthread_mutex_t lock;
  int index;
  struct cachalot_allocator *owner;
  cl_config cfg;               /* this device's copy, replaced by set_settings under the lock */
  cl_pool default_pool;
  cl_block *active;            /* pointer map: ALLOCATED and PENDING blocks, plus `sentinel` */
  cl_block sentinel;           /* key 0 (never a device address), always in the map: uthash frees its table
                                  when the map empties, and the next add would allocate it again */
  cl_segment *segments;        /* all segments of this device, any pool */
  size_t n_segments;
  cl_stream_events *events;    /* outstanding events by stream */
  size_t n_pending_events;
  cl_block *spare_blocks;      /* block metadata free list (linked through next) */
  cl_pending_event *spare_events;
  void **chunks;               /* host chunks the spares were carved from */
  size_t n_chunks, cap_chunks;
  cl_pool *pools;              /* private pools by id */
  cl_route *routes;            /* active routings, most recent last */
  int n_routes, cap_routes;    /* n_routes > 0 means a capture is underway: no event query or record */
  cl_block **deferred;         /* freed during a capture with stream uses: events recorded after it */
  size_t n_deferred, cap_deferred;
  size_t inflight;             /* bytes being allocated on the device with the lock dropped */
  double fraction;             /* memory fraction, < 0 when not set */
  size_t allowed_max;          /* fraction x total, valid when total_known */
  bool total_known;
  cachalot_device_stats stats;
  cl_trace trace;
} cl_device;

typedef struct cl_observer {
  cachalot_oom_observer fn;
  void *ctx;
} cl_observer;

struct cachalot_allocator {
  cachalot_backend *backend;
  _Atomic uint64_t next_capture_pool, next_pool_handle; /* the two MempoolId counters, from 1 */
  int device_count;
  cl_device *devices;
  pthread_mutex_t meta_lock; /* observers and the raw config string */
  cl_observer *observers;
  size_t n_observers, cap_observers;
  char *conf_raw;
  bool trace_stacks; /* record C call stacks with alloc/free entries (under meta_lock) */
};

/* --- export (src/stats/export.c): snapshots driven by environment variables --- */
void cl_export_register(cachalot_allocator *a);
void cl_export_unregister(cachalot_allocator *a);
/* Writes the CACHALOT_SNAPSHOT_ON_OOM snapshot, if asked for (no lock held; keeps the OOM message). */
void cl_export_on_oom(cachalot_allocator *a);

/* --- trace (src/stats/trace.c) --- */
void cl_trace_record_slow_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                 cachalot_stream stream);
/* Records an entry when history is on; otherwise costs one branch. */
static inline void cl_trace_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                   cachalot_stream stream) {
  if (CL_UNLIKELY(d->trace.cap != 0))
    cl_trace_record_slow_locked(d, action, addr, size, stream);
}
void cl_trace_free_locked(cl_device *d);

/* --- pool.c --- */
/* A fresh id {n, 0} for a graph capture given no pool (the first counter; from 1, never reused). */
cachalot_mempool_id cl_capture_pool_id(cachalot_allocator *a);
static inline bool cl_capturing(const cl_device *d) { return d->n_routes > 0; }
static inline bool cl_pool_is_default(const cl_device *d, const cl_pool *p) { return p == &d->default_pool; }
/* The pool a request on `s` goes to: the first route, most recent first, whose filter takes `s`. */
cl_pool *cl_route_pool_locked(cl_device *d, cachalot_stream s);
/* Frees the private pools that are freeable and have no segment left. */
void cl_pools_collect_locked(cl_device *d);
/* Frees every private pool (destroy). */
void cl_pools_destroy_locked(cl_device *d);
/* Bytes of free blocks held in private pools (for the OOM message). */
uint64_t cl_private_pool_free_bytes_locked(const cl_device *d);
/* Calls fn on every pool of the device, default first. */
void cl_pools_for_each_locked(cl_device *d, void (*fn)(cl_pool *p, void *ctx), void *ctx);

/* --- allocator.c --- */
cachalot_status cl_check_device_arg(const cachalot_allocator *a, int device, const char *fn);
/* Finds the ALLOCATED block at exactly `ptr` and returns with its device locked; else INVALID_POINTER
 * and nothing locked. */
cachalot_status cl_find_block_locked(cachalot_allocator *a, void *ptr, const char *fn, cl_device **dev,
                                     cl_block **blk);
/* Metadata free lists. NULL on host OOM. */
cl_block *cl_block_new_locked(cl_device *d);
void cl_block_delete_locked(cl_device *d, cl_block *b);
cl_pending_event *cl_pending_new_locked(cl_device *d);
void cl_pending_delete_locked(cl_device *d, cl_pending_event *e);
/* Memory fraction: makes sure allowed_max is known (asks the backend once). */
void cl_fraction_resolve_locked(cl_device *d);

/* --- free_index.c --- */
cl_bins *cl_bins_get_locked(cl_pool *p, cachalot_stream s, bool create);
void cl_tree_insert(cl_bins *bins, bool small, cl_block *b);
void cl_tree_remove(cl_bins *bins, bool small, cl_block *b);
cl_block *cl_tree_lower_bound(cl_block *root, size_t size);        /* smallest (size, ptr) >= (size, 0) */
cl_block *cl_tree_prev(cl_block *root, const cl_block *b);         /* largest key < b's key */
cl_block *cl_tree_max(cl_block *root);
bool cl_tree_contains(cl_block *root, const cl_block *b);
/* Inserts a FREE block into its index and stamps its age base. */
void cl_free_index_insert_locked(cl_device *d, cl_block *b);
void cl_free_index_remove_locked(cl_device *d, cl_block *b);

/* --- events.c --- */
/* Records an event per stream use of `b` and makes it PENDING; all or nothing (free.c). */
cachalot_status cl_insert_events_locked(cl_device *d, cl_block *b);
/* Records the events of blocks freed during a capture, once no capture is underway. */
void cl_insert_deferred_events_locked(cl_device *d);
/* Polls outstanding events in order per stream and frees the blocks whose events all completed. */
void cl_process_events_locked(cl_device *d);
/* Waits for every outstanding event (num_sync_all_streams + 1) and frees their blocks. */
cachalot_status cl_sync_all_events_locked(cl_device *d);
/* Returns a block to its free index, merging with free neighbours (SPEC.md §2 free). */
void cl_free_block_locked(cl_device *d, cl_block *b);

/* --- release.c --- */
/* Whole free segments marked `releasing`, waiting to be given back to the device. */
typedef struct cl_release_list {
  cl_segment *head;
} cl_release_list;
/* Takes a whole free segment out of its free index and adds it to `out`. */
void cl_mark_release_locked(cl_device *d, cl_segment *s, cl_release_list *out);
/* Gives a release list back to the device, dropping the lock meanwhile when the config allows. A
 * segment leaves the books when its device free succeeded; one whose free failed goes back to its free
 * index, so nothing is lost (the first failure is returned). */
cachalot_status cl_release_flush_locked(cl_device *d, cl_release_list *list);
/* empty_cache and the out-of-memory retry: waits for every outstanding event, gives back every whole free
 * segment of the default pool and of freeable private pools, and drops the pools left empty. Returns the
 * first failure (of the wait or of a device free); what could not be freed stays cached. */
cachalot_status cl_release_all_locked(cl_device *d);
/* malloc step 4: garbage collection of aged whole free large segments of the default pool. */
void cl_garbage_collect_locked(cl_device *d, cl_release_list *out);
/* malloc step 6: frees oversize cached blocks of (pool, stream, kind). True when enough was marked. */
bool cl_release_oversize_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                cl_release_list *out);

/* --- stats (src/stats/stats.c) --- */
static inline void cl_stat_inc(cachalot_stat *s, int64_t n) {
  s->current += n;
  s->allocated += n;
  if (s->current > s->peak)
    s->peak = s->current;
}
static inline void cl_stat_dec(cachalot_stat *s, int64_t n) {
  s->current -= n;
  s->freed += n;
}
/* Updates all and the kind's entry of a stat array. */
static inline void cl_stat_array_add(cachalot_stat *arr, bool small, int64_t n) {
  int k = small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
  if (n >= 0) {
    cl_stat_inc(&arr[CACHALOT_STAT_ALL], n);
    cl_stat_inc(&arr[k], n);
  } else {
    cl_stat_dec(&arr[CACHALOT_STAT_ALL], -n);
    cl_stat_dec(&arr[k], -n);
  }
}
/* A block of `requested` bytes handed out (ALLOCATED): allocation, active and requested stats. */
static inline void cl_stats_hand_out(cachalot_device_stats *st, const cl_config *c, bool small, size_t size,
                                     size_t requested) {
  cl_stat_array_add(st->allocation, small, 1);
  cl_stat_array_add(st->allocated_bytes, small, (int64_t)size);
  cl_stat_array_add(st->active, small, 1);
  cl_stat_array_add(st->active_bytes, small, (int64_t)size);
  cl_stat_array_add(st->requested_bytes, small, (int64_t)requested);
  if (size >= c->max_split_size)
    cl_stat_inc(&st->oversize_allocations, 1);
}
/* free() of a block: the allocation stats drop at once (active ones only when it is really free). */
static inline void cl_stats_free_called(cachalot_device_stats *st, const cl_config *c, bool small, size_t size) {
  cl_stat_array_add(st->allocation, small, -1);
  cl_stat_array_add(st->allocated_bytes, small, -(int64_t)size);
  if (size >= c->max_split_size)
    cl_stat_dec(&st->oversize_allocations, 1);
}
/* Recounts oversize_allocations / oversize_segments after max_split_size changed. */
void cl_stats_recount_oversize_locked(cl_device *d);

/* --- oom.c --- */
/* Formats `n` bytes as SPEC.md §3 does ("N bytes", "%.2f KiB", "%.2f MiB", "%.2f GiB"). */
void cl_format_size(char *buf, size_t cap, uint64_t n);
/* The out-of-memory path: counts, calls observers (lock dropped), sets the message. Called with the
 * device locked; returns with it unlocked. */
cachalot_status cl_out_of_memory_unlock(cl_device *d, size_t alloc_size);

#endif
