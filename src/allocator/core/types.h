/* The allocator core's structures and their invariants; the functions over them are in the headers
 * that internal.h includes (fit.h, lanes.h, lookup.h, history.h) and in internal.h itself.
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
 *   - an armed lane's `lock` guards its blocks (the blocks and handed-out tables of segments on its
 *     stream, in any pool), its spares and stats share. The warm paths of malloc and free take only that,
 *     and read the lane's `warm` first: on a cold or dormant lane (cl_lane) it is 0 and they touch nothing.
 *   - exclusive mode, cl_enter_exclusive(d) to cl_leave_exclusive(d): the device's `lock` and then every
 *     armed lane's lock. Names ending in _locked expect it, and mean nothing else: debug builds assert it
 *     at their first line (CL_ASSERT_EXCLUSIVE, below). A function that runs under another lock says
 *     so with _held: the own mutex of the object it works on (the simulator's `mu`, the CUDA backend's
 *     event words, the host cache's, the interposer's list of deferred frees).
 *     So anything written only in exclusive mode may be read under an armed lane's lock once its `warm`
 *     allows a warm path: the config, the device flags, the pools and routes.
 * Exclusive mode is dropped around device allocations and frees unless the config's
 * release_lock_on_cudamalloc is False; `inflight` counts the bytes of device allocations in transit
 * meanwhile, so memory fraction checks stay honest (segments being freed still count as reserved).
 */
#ifndef CACHALOT_ALLOCATOR_TYPES_H
#define CACHALOT_ALLOCATOR_TYPES_H

#include <cachalot/cachalot.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../common/error.h"
#include "../backend/ops.h"
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
typedef struct cl_step cl_step;
typedef struct cl_plan cl_plan;

/* A block. Invariants: ptr and size are multiples of 512, size > 0; prev/next are the address
 * neighbours inside the same segment (prev->ptr + prev->size == ptr); two FREE neighbours never stand
 * side by side; a FREE block is in exactly one tree: that of its size class in the index of (seg->pool,
 * seg->stream), kind seg->small; an ALLOCATED or PENDING block is in its segment's handed-out table (`at`)
 * and in no tree (but for a lane's freed memo, in neither: see cl_lane); a PENDING block has
 * event_count > 0 entries in the device's event queues.
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
  uint32_t prio;             /* treap priority, a hash of ptr when it entered its tree: deterministic shapes
  * */
  uint8_t state;             /* cl_block_state */
  uint16_t cls;              /* the class of its free index tree (FREE only): removal needs no size */
  /* The second line: what only the block's own malloc and free touch. */
  _Alignas(64) size_t requested; /* the size the program asked for (while ALLOCATED or PENDING) */
  uint32_t event_count;      /* outstanding events (PENDING) */
  uint64_t gc_base;          /* the pool's lookup counter when the block became free (its age base) */
  cachalot_stream *uses;     /* record_stream streams other than seg->stream (heap array) */
  uint32_t n_uses, cap_uses;
  uint64_t step_seq;         /* the step tracker's number for it (expandable_plan, default pool), else 0 */
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
  bool from_source;              /* its memory came from its pool's source (cachalot_pool_set_source), which
                                    takes it back; else from the backend */
  void *ctx;                     /* the context of the malloc that made it, while history keeps contexts:
                                    its segment_free entry's (not kept for expandable runs) */
};
_Static_assert(offsetof(cl_segment, expandable) < 64, "the warm paths' fields fill the first cache line");

/* Size classes of the free index (cl_fit). On units u = (size >> 9) - 1 (>= 0), with M mantissa
 * bits, the class is
 *   s = floor_log2(u | 2^M) - M,  class = (s << M) + (u >> s)
 * that is u itself for u < 2^(M+1) (exact classes) and ((L - M + 1) << M) | ((u >> (L - M)) & (2^M - 1))
 * for L = floor_log2(u) >= M: 2^M classes per power of two, each 1/2^M of it wide. Monotone in size.
 * Classing size - 512 rather than size makes every class end on, rather than start at, a round size.
 *   small kind: M = 5 up to 1 MiB: classes 0..223, exact up to 32 KiB, then 32 per power of two
 *     (16 KiB wide between 512 KiB and 1 MiB); every size above 1 MiB is class 224. Those are free
 *     blocks only (requests of the small kind are at most 1 MiB): whole 2 MiB segments and the rests
 *     of their first split, so a whole segment split for any small request keeps its rest in its class
 *     (and the larger free blocks of expandable runs).
 *   large kind: M = 2 from just above 1 MiB (smaller large blocks occur only in expandable runs, which
 *     split like small segments; they share class 0, which costs speed only) up to 2^60 bytes (the largest
 * segment): 4 classes per power of two, 161 in all; a whole 20 MiB
 *     segment shares its class with every rest above 16 MiB.
 * Either way a pair of malloc and free carved from a whole segment updates the rest's node in place
 * instead of moving it between classes. Coarser classes mean larger class trees: on the replayed
 * traces and the random workloads that cost 1-10% more mispredicted branches and ~1% more
 * instructions, against 20% fewer instructions for such pairs. Both kinds get room for 225 classes:
 * about 3.7 KiB per (pool, stream). The small kind had M = 7 (641 classes, 10.3 KiB per (pool, stream))
 * until a program with a stream per request showed the cost: 10,000 streams' indexes spanned 105 MiB and
 * every request's lookups missed the caches; with M = 5 callgrind counts as many instructions or fewer on
 * the random and replay workloads, up to 11% fewer first-level data misses and 23% fewer last-level
 * ones on 10,000 streams. Sharing a class never breaks best fit (class trees are ordered by size): the
 * clamps at both ends cost only speed. */
enum {
  CL_FIT_M_SMALL = 5,
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
  uintptr_t plan_lo, plan_hi; /* the range the step plan in force keeps here (expandable/plan.c), else empty:
                                 online placement and growth keep out of it */
};

/* A pool: the default pool of a device ({0,0}) or a private one (PyTorch's private pools). `lookups[kind]`
 * counts free-block searches (only while garbage collection is on): a free block's age is lookups - gc_base.
 * The warm mallocs of the default pool count theirs with atomic adds (CL_WARM_GC), so that every lookup of
 * every lane counts once, in one order.
 * A private pool lives in its device's `pools` table from its first begin_allocate_to_pool until it is
 * freeable (use_count 0) and has no segment left; n_segments counts its segments (any state). */
struct cl_pool {
  cachalot_mempool_id id;
  cl_bins *bins; /* hash by stream */
  cl_bins *last_bins; /* the last bins looked up: most requests repeat their stream */
  uint64_t lookups[2];
  int use_count;
  /* in use_count's padding: cl_device holds the default pool, and its size is the warm path's business */
  bool no_split;   /* its blocks are never split (MemPool(no_split=True)) */
  bool use_on_oom; /* a default-pool malloc about to fail takes a free block of it (MemPool(use_on_oom)) */
  size_t n_segments;
  UT_hash_handle hh; /* the device's private pool table, key id */
};

/* A block freed during a capture while other streams use it (PENDING, no events): it waits for the
 * capture's end, or, with graph_capture_record_stream_reuse, until the captured work of the stream that
 * wants it depends on every node of `wait` (the frontiers of its streams at the free). */
typedef struct cl_capture_wait {
  uint64_t capture_id;
  size_t n_nodes;
  uintptr_t nodes[]; /* the capture graph's nodes the block's uses ended at */
} cl_capture_wait;

typedef struct cl_deferred {
  cl_block *b;
  cl_capture_wait *wait; /* NULL: until the capture's end */
} cl_deferred;

/* A private pool: a pool and what only private pools have. The default pool, which cl_device holds, is a
 * bare cl_pool (its size is the warm path's business). */
typedef struct cl_private_pool {
  cl_pool base; /* first: a private pool's cl_pool * is its cl_private_pool * */
  cachalot_segment_source source; /* alloc NULL: segments from the backend */
  int holds; /* mallocs for it under way in exclusive mode, which may drop the lock (the device call, a
                release flush): the pool is not freed while one holds it */
} cl_private_pool;

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
  bool watched; /* given to completion_watch: the word moves once it completes */
  struct cl_pending_event *next;
} cl_pending_event;

/* Outstanding events of one stream, oldest first: they complete in order, so polling stops at the
 * first one not done.
 * Watching (events.c): a watched event makes the backend's completion word move once it completes. A head
 * event not watched is polled by every malloc instead; after CL_POLLS_BEFORE_WATCH polls found it not
 * done, it is watched and the stream is `slow`: its next events are watched as they are recorded, but
 * for every CL_SLOW_PROBE-th, which, done before it needed a watch, makes the stream fast again. */
typedef struct cl_stream_events {
  cachalot_stream stream;
  cl_pending_event *head, *tail;
  unsigned misses;   /* polls that found the head not done */
  unsigned probe;    /* events recorded while slow */
  bool slow;
  UT_hash_handle hh;
} cl_stream_events;
/* A watch is a stream wait and write on CUDA, ~1.2 us of CPU or more (H200); a poll in exclusive mode
 * ~1.1 us. So an event is watched only once it has stayed undone for two polls, and a slow stream tries
 * unwatched every 8th event. */
enum { CL_POLLS_BEFORE_WATCH = 2, CL_SLOW_PROBE = 8 };

/* Memory history (torch.cuda.memory._snapshot()): what happened, in a ring buffer per device. */
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
enum { CL_ANNOTATION_MAX = 1023 }; /* bytes of a cachalot_annotate text kept (the rest is cut) */

typedef struct {
  uint8_t action;   /* cl_trace_action */
  uint8_t n_frames; /* return addresses kept in the device's trace_frames row (stacks on) */
  uint64_t addr;    /* device_free for oom */
  uint64_t size;    /* requested size for alloc/free entries, as PyTorch records them */
  uintptr_t stream;
  int64_t time_us;  /* since the epoch */
  void *ctx;        /* the caller's context (cachalot_malloc_with_context), one reference held; or NULL */
  char *text;       /* user_defined (cachalot_annotate): the text, owned by the entry; else NULL */
} cl_trace_entry;

/* The ring buffer: at most cap entries, the oldest at head, count of them valid. A cap of 0 means history
 * is off, and recording is one untaken branch. Rows are allocated as entries come (4096 at first, doubled
 * when full: the device's trace_grown), so that a limit of sys.maxsize costs only what is recorded.
 * Invariant: count <= rows <= cap, and rows < cap only while head is 0 (the ring has not wrapped yet), so
 * (head + k) % cap is a row. */
typedef struct {
  cl_trace_entry *entries;
  void **frames; /* rows x CL_TRACE_MAX_FRAMES, or NULL without stacks */
  size_t cap, head, count;
} cl_trace;

/* A device's history clock (history.c): the real clock read `us` when the time stamp counter read `tsc`,
 * and the latest time an entry was given, so that the device's entries never go back in time by the
 * counter's interpolation. Written under trace_lock or in exclusive mode. */
typedef struct {
  uint64_t tsc;
  int64_t us, last;
} cl_trace_clock;


/* --- lanes (lane.c) --- */

/* A test-and-test-and-set lock: the lanes' locks are held for tens of nanoseconds, where a futex-based
 * mutex costs more than the work; contended waiters spin briefly, then yield. */
typedef struct {
  _Atomic int held;
} cl_spin;


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
 * `all_lanes` array and lane index from creation until destroy, and in `lanes` (at `pos`) unless it
 * is `dormant`; `bins` is the default pool's free index of `stream` once it exists (NULL while dormant or cold);
 * `spare` holds block metadata (linked through next) owned by nobody else.
 * Dormant: at empty_cache, a lane no segment refers to (its stream has nothing cached or allocated) leaves
 * `lanes`, gives its spares, its default-pool bins and their reservations back, and is skipped by
 * exclusive mode, so that what exclusive mode costs does not grow with the streams ever seen. Its warm
 * paths find `warm` 0 and go to exclusive mode, which wakes it (cl_lane_get_locked).
 * Armed: a lane that is not dormant is armed or cold. Only armed lanes are taken by exclusive mode and
 * run warm paths; a cold one has no bins pointer, no stats share and `warm` 0, so its warm paths touch
 * nothing but `warm` and go to the slow path, which arms it again under the device mutex alone
 * (cl_lane_arm_quick; past CL_LANE_ARMED_MIN armed, another lane goes cold then) or in exclusive mode
 * (cl_lane_arm_locked). A lane goes cold
 * when neither a warm path changed its share nor a slow path of its stream armed it through
 * CL_LANE_IDLE_MAX exclusive sections (any: a stats read or a check counts too), while more than
 * CL_LANE_ARMED_MIN lanes are armed: what exclusive mode costs follows the streams in use, not the
 * streams with memory. */
struct cl_lane {
  _Alignas(64) cl_spin lock;
  /* CL_WARM_* bits, read by the warm paths under the lock: which of them may run here (set for an armed
   * lane on leaving exclusive mode: MALLOC only where `bins` is there; 0 while cold or dormant) and
   * CL_WARM_STOP, set on an armed lane by a thread entering exclusive mode before it takes the lock */
  _Atomic unsigned char warm;
  cachalot_stream stream;
  cl_device *dev;
  cl_bins *bins; /* its stream's default-pool free index once it has one; NULL while dormant (a cold
                    lane keeps it: arming then needs no lookup, which with many streams missed the caches) */
  cl_block *spare;
  size_t n_spare;
  bool dormant; /* written in exclusive mode, with the lane's lock held */
  bool armed;   /* written in exclusive mode, with the lane's lock held */
  bool busy;    /* scratch of cl_lanes_rest_locked */
  /* The deferred return (free.c). `memo`: the block the warm malloc handed out last here (malloc_warm), with the
   * split stat changes that hand-out made and its request rounded; NULL once anything else changed the lane's
   * blocks. `memo_freed`: the program has freed it since, the stats have counted the free (the split ones
   * included) and history has its entries, and only its return to the free index waits: the index lacks just that
   * one merge, and the block is ALLOCATED, in no tree and out of its segment's table. The lane's next call either
   * hands it out again (a warm malloc of the same rounded size: best fit would find that very block) or makes the
   * return first (cl_lane_settle); so does every entry into exclusive mode, and cooling the lane. `memo_gc`: the
   * pool's lookup count at the free, the age base the return gives the merged block. */
  bool memo_freed;
  int32_t memo_split_blocks;
  int64_t memo_split_bytes;
  size_t memo_rounded;
  cl_block *memo;
  uint64_t memo_gc;
  cl_lane_stat st[2][CL_LS_N]; /* [small][id]: large blocks' shares, then small blocks' */
  cl_lane_stat oversize;       /* oversize_allocations (large blocks only) */
  unsigned idle;               /* exclusive sections since its shares last changed (exclusive mode) */
  size_t pos;                  /* its index in its device's `lanes` while not dormant */
  /* A warm path found too little room in the pools (cl_lane_refill): the slow path gathers the other
   * lanes' room first (cl_lane_gather_room). Read without the lock, as a hint. */
  _Atomic bool short_of_room;
};

/* The lane lookup: an open-addressing table of lane pointers read without a lock; it only grows (in
 * exclusive mode, by publishing a larger copy); older copies stay until destroy for readers still in
 * them. */
typedef struct cl_lane_index {
  size_t mask;
  struct cl_lane_index *older;
  _Atomic(cl_lane *) slot[];
} cl_lane_index;


/* TRACE: history is on; the warm paths run (without stacks or contexts only) and record their entries
 * through cl_trace_warm.
 * POLL: some block of the device is PENDING, so every malloc polls first (SPEC), and the warm malloc may
 * skip the poll only where it could change nothing: with WATCH as well (the backend keeps a completion
 * word, every stream's oldest event is watched, and no block waits for a capture's end), while the word
 * is unchanged since the last poll began, so no watched event has completed since; a changed word, or no
 * WATCH, sends the call to exclusive mode, which polls: a block comes back once the word tells of its
 * event (soon after it is done: ops.h completion_watch says what may delay that), and every stat and peak
 * moves as when every malloc polls and the event completed that much later. (Skipping elsewhere is not
 * exact: a block a poll frees raises the split stats, whose peaks then depend on whether the poll came
 * first.) */
/* GC: garbage collection is set; the warm malloc counts its lookup in the pool (the ages of free blocks).
 * SOLO: with TRACE, this lane is the device's only armed lane, so no other warm path can race for the ring
 * and its entries skip the ring's lock (an uncontended lock costs ~10 ns on the GPU hosts, two a pair).
 * Given where one lane is armed (cl_leave_exclusive, cl_lane_arm_quick from none) and taken back, under
 * that lane's lock, before a second lane is armed outside exclusive mode (cl_lane_arm_quick). So a lane
 * with SOLO is lanes[0] and the only armed one. */
enum {
  CL_WARM_MALLOC = 1,
  CL_WARM_FREE = 2,
  CL_WARM_STOP = 4,
  CL_WARM_TRACE = 8,
  CL_WARM_POLL = 16,
  CL_WARM_WATCH = 32,
  CL_WARM_GC = 64,
  CL_WARM_SOLO = 128
};
/* Everything cachalot keeps for one device, guarded by `lock`. The fields the warm paths read come
 * first, on lines that exclusive mode writes only on entry and exit (the mutex is kept off them). */
struct cl_device {
  /* CL_WARM_STOP alone (which warm paths may run is each lane's `warm`), set while a thread enters or
   * holds exclusive mode. A warm path that sees STOP on its lane lets go of it and waits for the device's
   * to clear (cl_lane_wait_stop), so that cl_enter_exclusive does not have to win each lane lock against
   * its owner's next call; a hint for speed only: the lane locks are what make exclusive mode exclusive.
   * Atomic because STOP is written before the lanes are held. */
  _Atomic unsigned char warm;
  _Atomic bool detect;         /* cfg.detect_captures, for malloc to read before any lock */
  _Atomic int n_auto;          /* captures detected and being routed (autocapture.c) */
  int index;
  struct cachalot_allocator *owner;
  cl_config cfg;               /* this device's copy, replaced by set_settings under the lock */
  size_t n_armed;              /* lanes[0, n_armed) are armed (exclusive mode; here, in the padding before
                                  `lock`, so that the device's size, which malloc multiplies by, is kept) */
  /* The backend's completion word (ops.h) and its value when the last poll began (or the first event was
   * recorded with none pending), for CL_WARM_WATCH: while the word still holds done_seen no event has
   * completed since, so a poll would free nothing (exclusive mode writes both; in the padding too). */
  const uint32_t *done_word;
  uint32_t done_seen;
  /* n_armed for the warm paths, which size their share of room by it: written with n_armed (which a
   * quick arm changes outside exclusive mode, cl_lane_arm_quick), read without a lock. Padding too. */
  _Atomic uint32_t armed_hint;
  /* Streams whose head event is not watched (events.c): WATCH waits for none. In the padding too. */
  uint32_t n_unwatched;
  _Alignas(64) pthread_mutex_t lock;
  cl_pool default_pool;
  cl_lane **lanes;             /* every lane that is not dormant: the n_armed armed ones first */
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
  struct cl_deferred *deferred; /* freed during a capture with stream uses: events recorded after it, or
                                  reused within it (capture_reuse.c) */
  size_t n_deferred, cap_deferred;
  size_t inflight;             /* bytes being allocated on the device with the lock dropped */
  /* Which thread holds exclusive mode (kept by debug builds only, for CL_ASSERT_EXCLUSIVE; the fields are
   * there in every build so that all builds agree on the layout). */
  pthread_t excl_owner;
  bool excl_held;
  /* trace has min(cap, 4096 << trace_grown) rows (see cl_trace). A shift in a byte of padding, not a
   * size_t: a larger cl_device turns the warm paths' devices[i] from one multiply into three. */
  uint8_t trace_grown;
  /* The CL_WARM_* flags cl_leave_exclusive last gave the armed lanes, for a lane armed in between
   * (cl_lane_arm_quick; under `lock`). In padding too. */
  uint8_t warm_flags;
  /* Orders the warm paths' trace entries (CL_WARM_TRACE: history on without stacks or contexts): exclusive
   * mode records with no warm path running, so only warm paths race for the ring. In padding too. */
  cl_spin trace_lock;
  double fraction;             /* memory fraction, < 0 when not set */
  size_t allowed_max;          /* fraction x total, valid when total_known */
  bool total_known;
  cachalot_device_stats stats; /* exact in exclusive mode (the lanes' shares are folded in) */
  cl_trace trace;
  struct cl_block_ctx *block_ctx; /* contexts and alloc call stacks of handed-out blocks, by address
                                     (history.c); while any is held the warm paths stay off, so every
                                     free passes history.c */
  pthread_mutex_t auto_lock;   /* guards autos; taken outside exclusive mode */
  cl_autocap *autos;           /* detected captures, routing or done (autocapture.c) */
  /* In the cache line before room, which nothing else uses: the warm paths that record history write it
   * with every entry. */
  cl_trace_clock trace_clock;
  /* With expandable_plan, the step tracker (core/step.c) and the plan made from what it finds
   * (expandable/plan.c); NULL without. Read in exclusive mode only: here, in that line's padding, so that
   * the device's size, which the warm paths multiply by, stays what it was. */
  cl_step *step;
  cl_plan *plan;
  /* The room pools (see cl_lane_stat), apart from the fields the warm paths read: lanes take from and
   * give back to them under their own lock alone, exclusive mode sets them anew. */
  char pad_[64 - sizeof(cl_trace_clock) - 2 * sizeof(void *)];
  _Atomic int64_t room[CL_LS_N][CACHALOT_STAT_TYPES]; /* [id][all, small, large] */
  _Atomic int64_t room_oversize;
};


typedef struct cl_observer {
  cachalot_oom_observer fn;
  void *ctx;
} cl_observer;

/* The page map (lookup.c): device address >> 21 -> the segment covering that 2 MiB page, read
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
  struct cl_host *host; /* the caching pinned-host allocator (host_cache.c), its own lock */
  bool trace_stacks; /* record C call stacks with alloc/free entries (under meta_lock) */
  _Atomic bool forked;          /* this is a child forked after the allocator was made: every call fails */
  cachalot_context_ops ctx_ops; /* how contexts are kept and let go (under meta_lock to change) */
  _Atomic size_t n_ctx;         /* context references held, in blocks, trace entries and snapshots */
  /* Called after an allocation failed as out of memory, with no lock held and the OOM message set; the
   * hook keeps the message. Set by a room above the core (src/process/) before the allocator is handed
   * out, never changed after: the core does not know who listens. NULL: nobody. */
  void (*on_oom)(cachalot_allocator *a);
};

/* Debug builds (CL_DEBUG_LOCKS, meson's debug option) check that a function named _locked runs in
 * exclusive mode entered by the calling thread; other builds pay nothing. */
#ifdef CL_DEBUG_LOCKS
#define CL_ASSERT_EXCLUSIVE(d) cl_assert_exclusive((d), __func__)
/* (inline, here: every header of the core asserts it, and the files below lane.c would otherwise call up into it) */
static inline void cl_assert_exclusive(const cl_device *d, const char *fn) {
  if (d->excl_held && pthread_equal(d->excl_owner, pthread_self()))
    return;
  fprintf(stderr, "cachalot: %s called outside exclusive mode of device %d (a bug in cachalot)\n", fn, d->index);
  abort();
}
#else
#define CL_ASSERT_EXCLUSIVE(d) ((void)(d))
#endif

#endif
