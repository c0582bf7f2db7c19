/* The allocator's core structures, shared by src/allocator/ and src/stats/.
 *
 * Glossary
 *   segment   one device allocation, tiled in address order by blocks.
 *   block     a run of a segment: FREE (cached, in a free index), ALLOCATED (handed out) or PENDING
 *             (freed by the program, waiting for events on the streams that used it).
 *   kind      small (segments of 2 MiB for rounded sizes <= 1 MiB) or large.
 *   pool      where a request is served from: a device's default pool, or a private pool (pool.c). A pool
 *             owns free indexes per (stream, kind); requests on stream S only see S's index.
 *   bins      the free index of one (pool, stream): per kind, size classes of treaps (struct cl_bins).
 *   vrange    with expandable_segments: the address space reserved for one (pool, stream, kind), backed
 *             by pages mapped on demand (expandable.c). Each contiguous mapped run of it is a segment
 *             (`expandable` set) like any other, so that blocks, free indexes, lanes and the warm paths
 *             need not know.
 *
 *   lane      the per-stream part of a device (lane.c): its lock, spare block metadata and a share of
 *             the stats, so that threads on different streams never touch the same cache line on the
 *             warm path.
 *
 * Locking, two levels:
 *   - a lane's `lock` guards its blocks (the blocks and handed-out tables of segments on its
 *     stream, in any pool), its spares and stats share. The warm paths of malloc and free take only that.
 *   - exclusive mode, cl_lock(d): the device's `lock` and then every lane's lock in order. Names ending
 *     in _locked expect it. So anything written only in exclusive mode may be read under any one lane
 *     lock: the config, the device flags, the pools and routes.
 * Exclusive mode is dropped around device allocations and frees unless the config's
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
#include <string.h>

#include "../common/error.h"
#include "backend/ops.h"
#include "config.h"
#include "sizes.h"

/* For the few helpers the warm paths must not pay a call for. */
#define CL_INLINE static inline __attribute__((always_inline))

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
typedef struct cl_lane cl_lane;
typedef struct cl_bins cl_bins;
typedef struct cl_device cl_device;
typedef struct cl_autocap cl_autocap;
typedef struct cl_vrange cl_vrange;

/* A block. Invariants: ptr and size are multiples of 512, size > 0; prev/next are the address
 * neighbours inside the same segment (prev->ptr + prev->size == ptr); two FREE neighbours never stand
 * side by side; a FREE block is in exactly one tree: that of its size class in the index of (seg->pool,
 * seg->stream), kind seg->small; an ALLOCATED or PENDING block is in its segment's handed-out table (`at`) and
 * in no tree; a PENDING block has event_count > 0 entries in the device's event queues.
 *
 *   segment: | blk ALLOCATED | blk FREE | blk PENDING | blk FREE |
 *            ^seg->ptr, head            (next -->, <-- prev)      ^ seg->ptr + seg->size
 */
typedef struct cl_block {
  /* The first cache line holds what is read of blocks other than the one being freed or handed out:
   * tree walks of best fit and of the free index, and the neighbours a merge looks at. */
  uintptr_t ptr;
  size_t size;
  cl_segment *seg;
  struct cl_block *prev, *next;
  struct cl_block *left, *right; /* free-index treap links (FREE only) */
  uint32_t prio;             /* treap priority, a hash of ptr when it entered its tree: deterministic shapes */
  uint8_t state;             /* cl_block_state */
  uint16_t cls;              /* the class of its free index tree (FREE only): removal needs no size */
  /* The second line: what only the block's own malloc and free touch. */
  _Alignas(64) size_t requested; /* the size the program asked for (while ALLOCATED or PENDING) */
  uint32_t event_count;      /* outstanding events (PENDING) */
  uint64_t gc_base;          /* the pool's lookup counter when the block became free (its age base) */
  cachalot_stream *uses;     /* record_stream streams other than seg->stream (heap array) */
  uint32_t n_uses, cap_uses;
} cl_block;
_Static_assert(offsetof(cl_block, requested) == 64, "the fields walks read fill the first cache line");

/* A segment: one device allocation of `size` bytes at `ptr`, served to requests on `stream` from
 * `pool`'s `small` or large index. Its blocks tile [ptr, ptr + size) exactly, from `head` to `tail`.
 * A `releasing` segment is being given back with the device lock dropped: it is still in the list and
 * in the stats, its single FREE block is in no index, and it leaves the books only once the device
 * free succeeded (or goes back to its index if the free failed).
 * An `expandable` segment is instead one contiguous mapped run of the vrange `vr` (of its pool, stream
 * and kind): it grows, shrinks, merges with the run it comes to touch and splits around pages unmapped
 * in its middle, all in exclusive mode; its blocks split by the small kind's rule whatever its kind. */
struct cl_segment {
  /* The first cache line: what the warm paths read. */
  _Alignas(64) uintptr_t ptr;
  size_t size;
  cl_lane *lane;  /* the lane of `stream`: its lock guards the blocks */
  cl_bins *bins;  /* the free index of (pool, stream); it outlives the segment */
  cl_block *head;
  /* The handed-out blocks by address: at[(b->ptr - ptr) >> at_shift] == b for every ALLOCATED or
   * PENDING block b, NULL everywhere else. One entry per 512 B in a small segment (blocks start 512 B
   * apart) and per 1 MiB in a large one (handed-out large blocks are larger than 1 MiB, so no two start
   * in one MiB). free() finds its block with one load; a spare segment keeps its table for reuse (a
   * spared run of an expandable segment frees it: runs change size). */
  cl_block **at;
  unsigned at_shift;
  bool small;
  bool releasing;
  bool device_freed; /* while releasing: the device free succeeded (written with the lock dropped, read
                        after it is retaken, by the releasing thread only) */
  bool expandable;
  cl_block *tail;
  cl_pool *pool;
  cachalot_stream stream;
  cl_segment *prev, *next;  /* the device's segment list */
  cl_segment *release_next; /* a release list, while releasing; the spare list once forgotten */
  cl_vrange *vr;                 /* expandable: its reservation */
  size_t at_cap;                 /* expandable: entries allocated for `at` (it grows with the run) */
  cl_segment *run_prev, *run_next; /* expandable: the runs of vr, in address order */
};
_Static_assert(offsetof(cl_segment, expandable) < 64, "the warm paths' fields fill the first cache line");

/* Size classes of the free index (cl_fit). On units u = (size >> 9) - 1 (>= 0), with M mantissa
 * bits, the class is
 *   s = floor_log2(u | 2^M) - M,  class = (s << M) + (u >> s)
 * that is u itself for u < 2^(M+1) (exact classes) and ((L - M + 1) << M) | ((u >> (L - M)) & (2^M - 1))
 * for L = floor_log2(u) >= M: 2^M classes per power of two, each 1/2^M of it wide. Monotone in size.
 * Classing size - 512 rather than size makes every class end on, rather than start at, a round size.
 *   small kind: M = 7 up to 1 MiB: classes 0..639, exact up to 128 KiB, then 128 per power of two
 *     (4 KiB wide between 512 KiB and 1 MiB); every size above 1 MiB is class 640. Those are free
 *     blocks only (requests of the small kind are at most 1 MiB): whole 2 MiB segments and the rests
 *     of their first split, so a whole segment split for any small request keeps its rest in its class
 *     (and the larger free blocks of expandable runs).
 *   large kind: M = 2 from just above 1 MiB (smaller large blocks occur only in expandable runs, which
 *     split like small segments; they share class 0, which costs speed only) up to 2^60 bytes (the largest segment): 4 classes per power of two, 161 in all; a whole 20 MiB
 *     segment shares its class with every rest above 16 MiB.
 * Either way a pair of malloc and free carved from a whole segment updates the rest's node in place
 * instead of moving it between classes. Coarser classes mean larger class trees: on the replayed
 * traces and the random workloads that cost 1-10% more mispredicted branches and ~1% more
 * instructions, against 20% fewer instructions for such pairs. Both kinds get room for 641 classes:
 * about 10 KiB per (pool, stream). Sharing a class never breaks best fit (class trees are ordered by
 * size): the clamps at both ends cost only speed. */
enum {
  CL_FIT_M_SMALL = 7,
  CL_FIT_M_LARGE = 2,
  CL_FIT_N_SMALL = ((11 - CL_FIT_M_SMALL + 1) << CL_FIT_M_SMALL) + 1,  /* up to the class of u = 2^11 */
  CL_FIT_LARGE_BASE = (11 - CL_FIT_M_LARGE + 1) << CL_FIT_M_LARGE,     /* the class of u = 2^11 */
  CL_FIT_N_LARGE = ((51 - CL_FIT_M_LARGE + 1) << CL_FIT_M_LARGE) - CL_FIT_LARGE_BASE + 1,
  CL_FIT_CLASSES = CL_FIT_N_SMALL > CL_FIT_N_LARGE ? CL_FIT_N_SMALL : CL_FIT_N_LARGE,
  CL_FIT_WORDS = (CL_FIT_CLASSES + 63) / 64,
};
_Static_assert(CL_FIT_WORDS < 64, "a summary word covers the bitmap words");
_Static_assert(CL_FIT_CLASSES <= UINT16_MAX, "a block records its class in 16 bits");

/* One kind of a free index: segregated fit, TLSF-style. FREE blocks are spread over size classes
 * (cl_fit_class); each class is a treap ordered by (size, ptr), and a two-level bitmap says which
 * classes are non-empty.
 *
 * Why: one treap per kind holding every free block is ~2 ln n levels deep on average, and every malloc
 * walked it with a data-dependent branch and a likely cache miss per level (with ~1000 live allocations
 * that cost more than the rest of the warm path). Classes cut a walk to the few blocks of one class,
 * and the bitmaps find the next non-empty class with two ffs instead of a walk. The price: a split or
 * merge that moves a block to another class is a remove and an insert with bitmap updates, where one
 * tree let the new block take the old one's place.
 *
 * Best fit is unchanged: classes are monotone in size (every block of a lower class is smaller than
 * every block of a higher one), so the lower bound of (size, 0) over the kind is the lower bound inside
 * the class of `size`, else the minimum of the next non-empty class.
 *
 * Invariants:
 *   - every block of root[c] is a FREE block of this index's (pool, stream) and kind with class c, and
 *     the tree is a treap: keys strictly increase in order, priorities form a max-heap;
 *   - bit c % 64 of map[c / 64] is set iff root[c] != NULL (so no bit at or past the kind's class
 *     count);
 *   - bit w of summary is set iff map[w] != 0.
 * Fixed arrays: no allocation on insert, remove or lookup. */
typedef struct {
  uint64_t summary;
  uint64_t map[CL_FIT_WORDS];
  cl_block *root[CL_FIT_CLASSES];
} cl_fit;

/* The free index of one (pool, stream): kind[0] large, kind[1] small; and, with expandable segments,
 * the reservation of each kind (made on its first growth, released with the bins). */
struct cl_bins {
  cachalot_stream stream;
  UT_hash_handle hh;
  cl_vrange *vr[2];
  cl_fit kind[2];
};

/* The address space of one (pool, stream, kind) for expandable segments: [base, base + size) reserved
 * once, `page` bytes mapped or unmapped at a time (2 MiB for the small kind, 20 MiB for the large, at
 * least the device's granularity). Invariants: `runs` are this vrange's expandable segments in address
 * order; each starts and ends on a page boundary inside the reservation; two runs never touch (they
 * would be one); every page inside a run is mapped (one va_map each) and no page outside one is. */
struct cl_vrange {
  uintptr_t base;
  size_t size, page;
  cl_segment *runs;
  cl_bins *bins;   /* whose vr[small] this is */
  bool small;
  cl_vrange *next; /* the device's vranges */
};

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
  void *ctx;        /* the caller's context (cachalot_malloc_with_context), one reference held; or NULL */
} cl_trace_entry;

/* The ring buffer: trace_cap entries, the oldest at trace_head, trace_count of them valid. A cap of 0
 * means history is off, and recording is one untaken branch. */
typedef struct {
  cl_trace_entry *entries;
  void **frames; /* trace_cap x CL_TRACE_MAX_FRAMES, or NULL without stacks */
  size_t cap, head, count;
} cl_trace;


/* --- lanes (lane.c) --- */

/* A test-and-test-and-set lock: the lanes' locks are held for tens of nanoseconds, where a futex-based
 * mutex costs more than the work; contended waiters spin briefly, then yield. */
typedef struct {
  _Atomic int held;
} cl_spin;
void cl_spin_lock_slow(cl_spin *l);
static inline void cl_spin_lock(cl_spin *l) {
  if (CL_LIKELY(!atomic_exchange_explicit(&l->held, 1, memory_order_acquire)))
    return;
  cl_spin_lock_slow(l);
}
static inline void cl_spin_unlock(cl_spin *l) { atomic_store_explicit(&l->held, 0, memory_order_release); }
/* One round of waiting on something another thread holds: pause, then yield, then sleep, by `round`. */
void cl_backoff(unsigned round);

/* A segment's lane is read before any lock by free() through the page map, which may hold a segment that
 * is being given back or reused; it is written in exclusive mode and never NULL again once set. */
CL_INLINE cl_lane *cl_seg_lane(const cl_segment *s) { return __atomic_load_n(&s->lane, __ATOMIC_ACQUIRE); }
CL_INLINE void cl_seg_set_lane(cl_segment *s, cl_lane *ln) { __atomic_store_n(&s->lane, ln, __ATOMIC_RELEASE); }
/* Zeroes every field of s but its lane (see cl_seg_lane), for metadata taken from the spares. */
static inline void cl_segment_clear(cl_segment *s) {
  const size_t lane_at = offsetof(cl_segment, lane), lane_end = lane_at + sizeof s->lane;
  memset(s, 0, lane_at);
  memset((char *)s + lane_end, 0, sizeof *s - lane_end);
}

/* The entry of `ptr` in the handed-out table of `s` (ptr inside s). */
CL_INLINE cl_block **cl_seg_slot(const cl_segment *s, uintptr_t ptr) { return &s->at[(ptr - s->ptr) >> s->at_shift]; }
static inline unsigned cl_seg_shift(bool small) { return small ? 9 : 20; }
/* The entries of s's table (a spare segment keeps its last size, shift and table; a spared run has size
 * 0 and no table). */
static inline size_t cl_seg_entries(const cl_segment *s) { return s->size >> s->at_shift; }

/* The stats a lane keeps a share of: those the warm path changes, each for all / small / large. On the
 * warm path a block goes from FREE to ALLOCATED and back, never PENDING, so allocation and active move
 * together, and so do allocated_bytes and active_bytes: one share serves each pair (its room is the
 * smaller of the two). */
enum {
  CL_LS_COUNT,       /* allocation and active */
  CL_LS_BYTES,       /* allocated_bytes and active_bytes */
  CL_LS_REQUESTED,   /* requested_bytes */
  CL_LS_SPLIT,       /* inactive_split */
  CL_LS_SPLIT_BYTES, /* inactive_split_bytes */
  CL_LS_N
};

/* A lane's share of one stat of one kind (small or large; the `all` entry of a stat is never kept per
 * lane). Room is what keeps peaks exact without a shared write: the device holds, per stat and type
 * (all, small, large), a pool of room, and a lane takes room for its kind from both the kind's pool and
 * the all pool at once (cl_lane_refill). At all times
 *     the pool of type T + the rem of every lane entry counted in T  <=  peak_T - current_T,
 * so while every lane stays within its rem the sum of all lanes cannot pass a peak unseen. A warm path
 * checks rem before it changes anything; when a pool runs dry the operation goes to exclusive mode,
 * where the stats are exact and a new peak is simply recorded, however many threads run.
 *   rem   room left: how much this entry may still grow
 *   got   room taken from the pools since the last fold, less what went back: got - rem is the net
 *         change since the fold
 *   inc   increases since the fold (the stat's `allocated` part)
 *   cap   a rem above this goes partly back to the pools, so that a lane that frees much does not sit
 *         on room the others need (a speed matter only) */
typedef struct {
  int64_t rem, got, inc, cap;
} cl_lane_stat;

/* The per-stream part of a device. Invariants: `stream` never changes; the lane is in its device's
 * `all_lanes` array and lane index from creation until destroy, and in `lanes` (the lock order) unless it
 * is `dormant`; `bins` is the default pool's free index of `stream` once it exists (NULL while dormant);
 * `spare` holds block metadata (linked through next) owned by nobody else.
 * Dormant: at empty_cache, a lane no segment refers to (its stream has nothing cached or allocated) leaves
 * the lock order, gives its spares, its default-pool bins and their reservations back, and is skipped by
 * exclusive mode, so that what exclusive mode costs does not grow with the streams ever seen. Its warm
 * paths find no bins and go to exclusive mode, which wakes it (cl_lane_get_locked). */
struct cl_lane {
  _Alignas(64) cl_spin lock;
  cachalot_stream stream;
  cl_device *dev;
  cl_bins *bins;
  cl_block *spare;
  size_t n_spare;
  bool dormant; /* written in exclusive mode, with the lane's lock held */
  bool busy;    /* scratch of cl_lanes_rest_locked */
  cl_lane_stat st[2][CL_LS_N]; /* [small][id]: large blocks' shares, then small blocks' */
  cl_lane_stat oversize;       /* oversize_allocations (large blocks only) */
};

/* The lane lookup: an open-addressing table of lane pointers read without a lock; it only grows (in
 * exclusive mode, by publishing a larger copy); older copies stay until destroy for readers still in
 * them. */
typedef struct cl_lane_index {
  size_t mask;
  struct cl_lane_index *older;
  _Atomic(cl_lane *) slot[];
} cl_lane_index;

static inline size_t cl_lane_hash(cachalot_stream s) {
  return (size_t)(((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 32);
}

enum { CL_WARM_MALLOC = 1, CL_WARM_FREE = 2, CL_WARM_STOP = 4 };
/* Everything cachalot keeps for one device, guarded by `lock`. The fields the warm paths read come
 * first, on lines that exclusive mode writes only on entry and exit (the mutex is kept off them). */
struct cl_device {
  /* CL_WARM_* bits, read by the warm paths under their lane lock alone: whether they may run (set on
   * leaving exclusive mode) and CL_WARM_STOP, set while a thread enters or holds exclusive mode. A warm
   * path that sees STOP lets go of its lane and waits (cl_lane_wait_stop), so that cl_lock does not have
   * to win each lane lock against its owner's next call; a hint for speed only: the lane locks are what
   * make exclusive mode exclusive. Atomic because STOP is written before the lanes are held. */
  _Atomic unsigned char warm;
  _Atomic bool detect;         /* cfg.detect_captures, for malloc to read before any lock */
  _Atomic int n_auto;          /* captures detected and being routed (autocapture.c) */
  int index;
  struct cachalot_allocator *owner;
  cl_config cfg;               /* this device's copy, replaced by set_settings under the lock */
  _Alignas(64) pthread_mutex_t lock;
  cl_pool default_pool;
  cl_lane **lanes;             /* every lane that is not dormant, in lock order */
  size_t n_lanes, cap_lanes;
  cl_lane **all_lanes;         /* every lane, dormant or not: freed at destroy */
  size_t n_all_lanes, cap_all_lanes;
  _Atomic(cl_lane_index *) lane_index;
  cl_segment *spare_segments;  /* segments given back, kept (linked through release_next): the page map
                                  may still be read through by a racing free of a stale pointer */
  cl_segment *segments;        /* all segments of this device, any pool */
  cl_vrange *vranges;          /* every reservation of expandable segments */
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
  cachalot_device_stats stats; /* exact in exclusive mode (the lanes' shares are folded in) */
  cl_trace trace;
  struct cl_block_ctx *block_ctx; /* contexts of handed-out blocks, by address (trace.c); while any is
                                     held the warm paths stay off, so every free passes trace.c */
  pthread_mutex_t auto_lock;   /* guards autos; taken outside exclusive mode */
  cl_autocap *autos;           /* detected captures, routing or done (autocapture.c) */
  /* The room pools (see cl_lane_stat), apart from the fields the warm paths read: lanes take from and
   * give back to them under their own lock alone, exclusive mode sets them anew. */
  char pad_[64];
  _Atomic int64_t room[CL_LS_N][CACHALOT_STAT_TYPES]; /* [id][all, small, large] */
  _Atomic int64_t room_oversize;
};

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

typedef struct cl_observer {
  cachalot_oom_observer fn;
  void *ctx;
} cl_observer;

/* The page map (page_map.c): device address >> 21 -> the segment covering that 2 MiB page, read
 * without locks: two levels (a root of 2^13 slots, leaves of 2^14 made on demand) over the low 48 bits
 * of the address space, where CUDA places device memory on every platform it supports, so that free()
 * finds a pointer's segment with two loads. Leaves are added, never removed, until destroy. A segment at
 * or above 2^48 is not mapped: lookups there return NULL and the slow paths scan the segment list.
 * A page two segments share (never seen: segments are 2 MiB multiples and CUDA aligns them) holds
 * CL_PAGE_SHARED, and lookups there scan the segment list too. */
enum { CL_PAGE_SHIFT = 21, CL_PM_LEAF_BITS = 14, CL_PM_ROOT_BITS = 13, CL_PM_VA_BITS = 48 };
_Static_assert(CL_PAGE_SHIFT + CL_PM_LEAF_BITS + CL_PM_ROOT_BITS == CL_PM_VA_BITS, "the two levels cover 48 bits");
#define CL_PAGE_SHARED ((cl_segment *)(uintptr_t)1)
typedef struct cl_page_leaf {
  _Atomic(cl_segment *) slot[1 << CL_PM_LEAF_BITS];
} cl_page_leaf;
typedef struct cl_page_node {
  _Atomic(cl_page_leaf *) slot[1 << CL_PM_ROOT_BITS];
} cl_page_node;

/* Whether `ptr` lies where the page map can hold it. */
static inline bool cl_page_mappable(uintptr_t ptr) { return ((uint64_t)ptr >> CL_PM_VA_BITS) == 0; }
static inline cl_segment *cl_page_get(cl_page_node *root, uintptr_t ptr) {
  const uint64_t k = (uint64_t)ptr >> CL_PAGE_SHIFT;
  if (CL_UNLIKELY(!cl_page_mappable(ptr)))
    return NULL;
  cl_page_leaf *leaf = atomic_load_explicit(&root->slot[k >> CL_PM_LEAF_BITS], memory_order_acquire);
  if (!leaf)
    return NULL;
  return atomic_load_explicit(&leaf->slot[k & ((1u << CL_PM_LEAF_BITS) - 1)], memory_order_acquire);
}
/* Points the pages of `s` at it. False on host OOM (nothing changed). */
bool cl_page_map_add(cl_page_node *root, cl_segment *s);
void cl_page_map_remove(cl_page_node *root, const cl_segment *s);
/* Points the pages of [ptr, ptr + size) at `s` (NULL: at nothing), whatever they held: for expandable
 * segments, whose runs start and end on page boundaries (2 MiB multiples, so no page is shared). False on
 * host OOM (nothing changed). */
bool cl_page_map_point(cl_page_node *root, uintptr_t ptr, size_t size, cl_segment *s);
void cl_page_map_destroy(cl_page_node *root);

struct cachalot_allocator {
  cachalot_backend *backend;
  cl_page_node pages; /* the page map of every device's segments */
  _Atomic uint64_t next_capture_pool, next_pool_handle; /* the two MempoolId counters, from 1 */
  _Atomic int n_auto; /* captures detected and being routed, all devices (free polls while > 0) */
  int device_count;
  cl_device *devices;
  pthread_mutex_t meta_lock; /* observers and the raw config string */
  cl_observer *observers;
  size_t n_observers, cap_observers;
  char *conf_raw;
  bool trace_stacks; /* record C call stacks with alloc/free entries (under meta_lock) */
  _Atomic bool forked;          /* this is a child forked after the allocator was made: every call fails */
  cachalot_context_ops ctx_ops; /* how contexts are kept and let go (under meta_lock to change) */
  _Atomic size_t n_ctx;         /* context references held, in blocks, trace entries and snapshots */
  /* Called after an allocation failed as out of memory, with no lock held and the OOM message set; the
   * hook keeps the message. Set by a room above the core (src/process/) before the allocator is handed
   * out, never changed after: the core does not know who listens. NULL: nobody. */
  void (*on_oom)(cachalot_allocator *a);
};

/* In a child forked after `a` was made: CACHALOT_ERROR_DEVICE with the message, for `who`. CUDA cannot be
 * used in a forked child, and the parent's locks and memory are not the child's (allocator.c). */
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
/* The contexts of the call in progress on this thread (cachalot_malloc_with_context,
 * cachalot_free_with_context): NULL outside such a call. */
extern _Thread_local void *cl_tls_alloc_ctx, *cl_tls_free_ctx;
/* Keeps this thread's alloc context with the block at ptr (history on; hand_out's slow path). */
void cl_ctx_attach_locked(cl_device *d, uintptr_t ptr);
/* Lets go of the context kept with the block at ptr, if any (every free of a handed-out block). */
void cl_ctx_detach_locked(cl_device *d, uintptr_t ptr);
static inline void cl_ctx_drop_locked(cl_device *d, uintptr_t ptr) {
  if (CL_UNLIKELY(d->block_ctx != NULL))
    cl_ctx_detach_locked(d, ptr);
}
/* Lets go of every block's context (destroy). */
void cl_ctx_detach_all_locked(cl_device *d);
/* The context kept with the block at ptr, or NULL. */
void *cl_ctx_of_locked(const cl_device *d, uintptr_t ptr);
/* One more reference to ctx (not NULL), and one fewer. */
void cl_ctx_retain(cachalot_allocator *a, void *ctx);
void cl_ctx_release(cachalot_allocator *a, void *ctx);

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

/* --- allocator.c --- */
cachalot_status cl_check_device_arg(const cachalot_allocator *a, int device, const char *fn);
/* Finds the ALLOCATED block at exactly `ptr` and returns with its device in exclusive mode; else
 * INVALID_POINTER and nothing locked. */
cachalot_status cl_find_block_locked(cachalot_allocator *a, void *ptr, const char *fn, cl_device **dev,
                                     cl_block **blk);
/* Metadata free lists. NULL on host OOM. */
cl_block *cl_block_new_locked(cl_device *d);
void cl_block_delete_locked(cl_device *d, cl_block *b);
/* Whether `ptr` lies in one of a's segments, handed out or not (a slow scan: for error paths, e.g. the
 * interposer telling a second free of cachalot's memory from a pointer of the runtime's). */
bool cl_address_is_ours(cachalot_allocator *a, const void *ptr);
/* Tops the spares of lane `ln` up from the device's, so its warm path can split (exclusive mode). */
void cl_lane_refill_spares_locked(cl_device *d, cl_lane *ln);
cl_pending_event *cl_pending_new_locked(cl_device *d);
void cl_pending_delete_locked(cl_device *d, cl_pending_event *e);
/* Memory fraction: makes sure allowed_max is known (asks the backend once). */
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

/* --- free_index.c --- */
cl_bins *cl_bins_get_locked(cl_pool *p, cachalot_stream s, bool create);

/* The treap of one size class. Priorities are a hash of a block's address when it entered the tree (a
 * node updated in place keeps its priority), so the shape is a function of the operations alone.
 * Expected O(log n) in the class's blocks; no allocation. */
cl_block *cl_tree_prev(cl_block *root, const cl_block *b); /* largest key < b's key */
cl_block *cl_tree_max(cl_block *root);
bool cl_tree_contains(cl_block *root, const cl_block *b);

static inline bool cl_key_less(const cl_block *a, const cl_block *b) {
  return a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
}
/* Treap insertion at `root` without recursion: walk down while the nodes outrank b, then split the
 * subtree there around b's key into b's two children. Gives the shape insert-at-leaf-and-rotate-up
 * would. */
CL_INLINE void cl_tree_insert(cl_block **root, cl_block *b) {
  b->prio = (uint32_t)(((uint64_t)(b->ptr >> 9) * 0x9E3779B97F4A7C15ull) >> 32);
  if (!*root) { /* the common case of a class holding one block at a time */
    b->left = b->right = NULL;
    *root = b;
    return;
  }
  cl_block **link = root;
  while (*link && (*link)->prio >= b->prio)
    link = cl_key_less(b, *link) ? &(*link)->left : &(*link)->right;
  cl_block *t = *link, **l = &b->left, **r = &b->right;
  while (t) {
    if (cl_key_less(t, b)) {
      *l = t;
      l = &t->right;
      t = t->right;
    } else {
      *r = t;
      r = &t->left;
      t = t->left;
    }
  }
  *l = *r = NULL;
  *link = b;
}
/* The link (&root or a parent's child pointer) that points at b, a node of the tree. *succ is b's
 * nearest ancestor with a larger key: b's successor in the tree when b has no right child. */
CL_INLINE cl_block **cl_tree_link(cl_block **root, const cl_block *b, cl_block **succ) {
  cl_block **link = root;
  *succ = NULL;
  while (*link != b) {
    if (cl_key_less(b, *link)) {
      *succ = *link;
      link = &(*link)->left;
    } else {
      link = &(*link)->right;
    }
  }
  return link;
}
/* Treap removal of b at `link` without recursion: b's place goes to the join of its children. Reads
 * no key, so b's size may already have changed. */
CL_INLINE void cl_tree_remove_at(cl_block **link, cl_block *b) {
  cl_block *l = b->left, *r = b->right;
  while (l && r) {
    if (l->prio > r->prio) {
      *link = l;
      link = &l->right;
      l = l->right;
    } else {
      *link = r;
      link = &r->left;
      r = r->left;
    }
  }
  *link = l ? l : r;
  b->left = b->right = NULL;
}
/* The smallest (size, ptr) >= (size, 0) in one tree, with its link (see cl_tree_link) and its
 * predecessor in that tree (the last node the walk passed on the right). */
CL_INLINE cl_block *cl_tree_lower_bound_at(cl_block **root, size_t size, cl_block ***best_link, cl_block **pred) {
  cl_block *best = NULL;
  *best_link = NULL;
  *pred = NULL;
  for (cl_block **link = root; *link;) {
    cl_block *t = *link;
    if (t->size >= size) {
      best = t;
      *best_link = link;
      link = &t->left;
    } else {
      *pred = t;
      link = &t->right;
    }
  }
  return best;
}

/* Class arithmetic (see CL_FIT_M_SMALL) for a constant m, so that each kind's is a handful of
 * instructions. */
CL_INLINE size_t cl_fit_raw_class(size_t u, unsigned m) {
  const unsigned s = cl_log2_floor(u | ((size_t)1 << m)) - m;
  return ((size_t)s << m) + (u >> s);
}
/* The size class of `size` in a kind. */
CL_INLINE unsigned cl_fit_class(bool small, size_t size) {
  const size_t u = (size >> 9) - 1;
  if (small) {
    const size_t c = cl_fit_raw_class(u, CL_FIT_M_SMALL);
    return (unsigned)(c < CL_FIT_N_SMALL ? c : CL_FIT_N_SMALL - 1);
  }
  const size_t c = cl_fit_raw_class(u, CL_FIT_M_LARGE);
  if (c < CL_FIT_LARGE_BASE)
    return 0;
  return (unsigned)(c - CL_FIT_LARGE_BASE < CL_FIT_N_LARGE ? c - CL_FIT_LARGE_BASE : CL_FIT_N_LARGE - 1);
}
static inline unsigned cl_fit_n_classes(bool small) { return small ? CL_FIT_N_SMALL : CL_FIT_N_LARGE; }
/* The lowest non-empty class above c, or -1. */
CL_INLINE int cl_fit_next_class(const cl_fit *f, unsigned c) {
  unsigned w = c >> 6;
  uint64_t bits = f->map[w] & (~(uint64_t)1 << (c & 63)); /* the bits above c */
  if (!bits) {
    const uint64_t words = f->summary & (~(uint64_t)1 << w);
    if (!words)
      return -1;
    w = (unsigned)__builtin_ctzll(words);
    bits = f->map[w];
  }
  return (int)(w * 64 + (unsigned)__builtin_ctzll(bits));
}

/* Inserts b, whose class is c. */
CL_INLINE void cl_fit_insert(cl_fit *f, unsigned c, cl_block *b) {
  b->cls = (uint16_t)c;
  cl_tree_insert(&f->root[c], b);
  f->map[c >> 6] |= (uint64_t)1 << (c & 63);
  f->summary |= (uint64_t)1 << (c >> 6);
}
/* Removes b, a node of class c's tree, at its link (b's size may already have changed). */
CL_INLINE void cl_fit_remove_at(cl_fit *f, unsigned c, cl_block **link, cl_block *b) {
  cl_tree_remove_at(link, b);
  if (!f->root[c]) {
    uint64_t *w = &f->map[c >> 6];
    *w &= ~((uint64_t)1 << (c & 63));
    if (!*w)
      f->summary &= ~((uint64_t)1 << (c >> 6));
  }
}
CL_INLINE void cl_fit_remove(cl_fit *f, cl_block *b) {
  const unsigned c = b->cls;
  cl_block *succ;
  cl_fit_remove_at(f, c, cl_tree_link(&f->root[c], b, &succ), b);
}
/* Best fit: the smallest (size, ptr) >= (size, 0) of the kind, the lowest address among equal sizes.
 * That is the lower bound inside the class of `size`, else the minimum (leftmost node) of the next
 * non-empty class. With its class, its link and its predecessor in its class tree (NULL when it is
 * that tree's minimum). */
CL_INLINE cl_block *cl_fit_lower_bound_at(cl_fit *f, bool small, size_t size, unsigned *cls, cl_block ***link,
                                          cl_block **pred) {
  const unsigned c = cl_fit_class(small, size);
  cl_block *b = cl_tree_lower_bound_at(&f->root[c], size, link, pred);
  *cls = c;
  if (b)
    return b;
  const int n = cl_fit_next_class(f, c);
  if (n < 0)
    return NULL;
  cl_block **l = &f->root[n];
  while ((*l)->left)
    l = &(*l)->left;
  *cls = (unsigned)n;
  *link = l;
  *pred = NULL;
  return *l;
}
CL_INLINE cl_block *cl_fit_lower_bound(cl_fit *f, bool small, size_t size) {
  unsigned c;
  cl_block **link, *pred;
  return cl_fit_lower_bound_at(f, small, size, &c, &link, &pred);
}
/* The block before b (by key) in the kind, or NULL: in b's class, else the maximum of the nearest
 * non-empty class below. b need not be in the index. */
cl_block *cl_fit_prev(cl_fit *f, bool small, const cl_block *b);
/* The largest block of the kind, or NULL. */
cl_block *cl_fit_max(cl_fit *f);
/* Whether b is in the tree of its class. */
bool cl_fit_contains(cl_fit *f, bool small, const cl_block *b);
/* Bytes of all free blocks of both kinds. */
uint64_t cl_bins_free_bytes(const cl_bins *bins);

/* Makes b FREE and stamps its age base, before it enters its free index. */
CL_INLINE void cl_block_becomes_free(cl_block *b) {
  b->state = CL_FREE;
  b->gc_base = b->seg->pool->lookups[b->seg->small];
}
/* Inserts a FREE block into its index and stamps its age base (exclusive mode or its lane locked). */
CL_INLINE void cl_free_index_insert_locked(cl_device *d, cl_block *b) {
  (void)d;
  cl_block_becomes_free(b);
  const bool small = b->seg->small;
  cl_fit_insert(&b->seg->bins->kind[small], cl_fit_class(small, b->size), b);
}
CL_INLINE void cl_free_index_remove_locked(cl_device *d, cl_block *b) {
  (void)d;
  cl_fit_remove(&b->seg->bins->kind[b->seg->small], b);
}

/* --- events.c --- */
/* Records an event per stream use of `b` and makes it PENDING; all or nothing. */
cachalot_status cl_insert_events_locked(cl_device *d, cl_block *b);
/* Whether a stream that used b (its record_stream streams, of any device) is being captured now: an event
 * recorded there would become part of the captured graph and never complete. */
bool cl_uses_capturing_locked(cl_device *d, const cl_block *b);
/* Records the events of blocks freed during a capture, once no capture is underway. */
void cl_insert_deferred_events_locked(cl_device *d);
/* Polls outstanding events in order per stream and frees the blocks whose events all completed. */
void cl_process_events_locked(cl_device *d);
/* Waits for every outstanding event (num_sync_all_streams + 1) and frees their blocks. */
cachalot_status cl_sync_all_events_locked(cl_device *d);

/* --- free.c --- */
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
/* empty_cache of one freeable private pool: its whole free segments (and the device's free pages). */
cachalot_status cl_release_pool_locked(cl_device *d, const cl_pool *p);
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
/* --- lane.c --- */
/* Exclusive mode: the device lock, then every lane; the lanes' stats shares are folded into d->stats. */
void cl_lock(cl_device *d);
/* Leaves exclusive mode: shares out room for the peaks again and sets the warm-path flags. */
void cl_unlock(cl_device *d);
/* The lane of `s`, made on first use (exclusive mode). NULL on host OOM. */
cl_lane *cl_lane_get_locked(cl_device *d, cachalot_stream s);
void cl_lanes_destroy_locked(cl_device *d);
/* empty_cache: lanes of streams with no segment left go dormant (see cl_lane), and empty per-stream event
 * queues go. */
void cl_lanes_rest_locked(cl_device *d);
/* The lane of `s` if it exists, without a lock. */
static inline cl_lane *cl_lane_find(cl_device *d, cachalot_stream s) {
  cl_lane_index *t = atomic_load_explicit(&d->lane_index, memory_order_acquire);
  if (!t)
    return NULL;
  for (size_t i = cl_lane_hash(s) & t->mask;; i = (i + 1) & t->mask) {
    cl_lane *ln = atomic_load_explicit(&t->slot[i], memory_order_acquire);
    if (!ln || ln->stream == s)
      return ln;
  }
}

/* Waits while a thread enters or holds exclusive mode on `d` (cl_device.warm). */
void cl_lane_wait_stop(cl_device *d);
/* What a warm path did: the call is done; it needs exclusive mode; or a thread was entering exclusive
 * mode (CL_WARM_STOP) and the call is to be tried again once that is over. Nothing changed unless DONE. */
typedef enum { CL_WARM_DONE, CL_WARM_SLOW, CL_WARM_STOPPED } cl_warm_result;
/* A warm path that did not finish (lane unlocked), having read flags `warm`: SLOW, or STOPPED once the
 * exclusive mode that stopped it is over. */
CL_INLINE cl_warm_result cl_warm_missed(cl_device *d, unsigned warm) {
  if (CL_LIKELY(!(warm & CL_WARM_STOP)))
    return CL_WARM_SLOW;
  cl_lane_wait_stop(d);
  return CL_WARM_STOPPED;
}

/* Takes room from the device's pools so that each ln->st[small][id].rem >= need[id] and oversize.rem >=
 * need_ov (entries already there are left alone). False when a pool has too little: exclusive mode then. */
bool cl_lane_refill(cl_lane *ln, bool small, const int64_t need[CL_LS_N], int64_t need_ov);

/* Share changes on the warm path (lane locked, room checked): a rise spends room and counts as an
 * increase; a drop gives room back to the share. Whether a share holds more than its cap is checked
 * once per free, on its bytes (cl_lane_trim): the counts move with them. */
CL_INLINE void cl_share_up(cl_lane_stat *e, int64_t n) {
  e->rem -= n;
  e->inc += n;
}
CL_INLINE void cl_share_down(cl_lane_stat *e, int64_t n) { e->rem += n; }
CL_INLINE void cl_share_add(cl_lane_stat *e, int64_t n) {
  if (n > 0)
    cl_share_up(e, n);
  else
    cl_share_down(e, -n);
}
/* Gives the part of every share of kind `small` above its cap back to the pools (cold). */
void cl_lane_trim(cl_lane *ln, bool small);

/* Split stat changes of a block of lane `ln`'s: on the warm path (`fast`, ln locked, room checked) into
 * ln's share, in exclusive mode into the device's stats. */
CL_INLINE void cl_count_split(cl_device *d, cl_lane *ln, bool fast, bool small, int64_t blocks, int64_t bytes) {
  if (fast) {
    cl_lane_stat *e = ln->st[small];
    cl_share_add(&e[CL_LS_SPLIT], blocks);
    cl_share_add(&e[CL_LS_SPLIT_BYTES], bytes);
    return;
  }
  if (blocks)
    cl_stat_array_add(d->stats.inactive_split, small, blocks);
  if (bytes)
    cl_stat_array_add(d->stats.inactive_split_bytes, small, bytes);
}
/* Whether the warm path may make these split stat changes (taking room from the pools if need be). */
CL_INLINE bool cl_split_room(cl_lane *ln, bool small, int64_t blocks, int64_t bytes) {
  const cl_lane_stat *e = ln->st[small];
  if (CL_LIKELY((e[CL_LS_SPLIT].rem >= blocks) & (e[CL_LS_SPLIT_BYTES].rem >= bytes)))
    return true;
  const int64_t need[CL_LS_N] = {[CL_LS_SPLIT] = blocks, [CL_LS_SPLIT_BYTES] = bytes};
  return cl_lane_refill(ln, small, need, 0);
}

/* A block of `requested` bytes handed out (ALLOCATED): allocation, active and requested stats. */
CL_INLINE void cl_stats_hand_out(cl_device *d, cl_lane *ln, bool fast, bool small, size_t size, size_t requested) {
  const bool oversize = CL_UNLIKELY(size >= d->cfg.max_split_size);
  if (fast) {
    cl_lane_stat *e = ln->st[small];
    cl_share_up(&e[CL_LS_COUNT], 1);
    cl_share_up(&e[CL_LS_BYTES], (int64_t)size);
    cl_share_up(&e[CL_LS_REQUESTED], (int64_t)requested);
    if (oversize)
      cl_share_up(&ln->oversize, 1);
    return;
  }
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->allocation, small, 1);
  cl_stat_array_add(st->allocated_bytes, small, (int64_t)size);
  cl_stat_array_add(st->active, small, 1);
  cl_stat_array_add(st->active_bytes, small, (int64_t)size);
  cl_stat_array_add(st->requested_bytes, small, (int64_t)requested);
  if (oversize)
    cl_stat_inc(&st->oversize_allocations, 1);
}
/* Whether the warm path may hand out a block of `size` for `requested` bytes, making `split_blocks` and
 * `split_bytes` split stat changes (taking room from the pools if need be). */
CL_INLINE bool cl_hand_out_room(const cl_device *d, cl_lane *ln, bool small, size_t size, size_t requested,
                                int64_t split_blocks, int64_t split_bytes) {
  const cl_lane_stat *e = ln->st[small];
  const bool oversize = CL_UNLIKELY(size >= d->cfg.max_split_size);
  if (CL_LIKELY((e[CL_LS_COUNT].rem >= 1) & (e[CL_LS_BYTES].rem >= (int64_t)size) &
                (e[CL_LS_REQUESTED].rem >= (int64_t)requested) & (e[CL_LS_SPLIT].rem >= split_blocks) &
                (e[CL_LS_SPLIT_BYTES].rem >= split_bytes) & (!oversize || ln->oversize.rem >= 1)))
    return true;
  const int64_t need[CL_LS_N] = {1, (int64_t)size, (int64_t)requested, split_blocks, split_bytes};
  return cl_lane_refill(ln, small, need, oversize);
}
/* free() of a block, in exclusive mode: the allocation stats drop at once (active ones only when it is
 * really free: cl_free_block_locked). The warm path does both at once in cl_free_fast. */
static inline void cl_stats_free_called(cl_device *d, bool small, size_t size) {
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->allocation, small, -1);
  cl_stat_array_add(st->allocated_bytes, small, -(int64_t)size);
  if (size >= d->cfg.max_split_size)
    cl_stat_dec(&st->oversize_allocations, 1);
}

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
/* Formats `n` bytes as SPEC.md §3 does ("N bytes", "%.2f KiB", "%.2f MiB", "%.2f GiB"). */
void cl_format_size(char *buf, size_t cap, uint64_t n);
/* The out-of-memory path: counts, calls observers (lock dropped), sets the message. Called with the
 * device locked; returns with it unlocked. */
cachalot_status cl_out_of_memory_unlock(cl_device *d, size_t alloc_size);

#endif
