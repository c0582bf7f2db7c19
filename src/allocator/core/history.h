/* Memory history (history.c): the trace ring of each device, C call stacks, and the callers' contexts
 * kept with blocks and entries. Recording happens under exclusive mode where the core changes state;
 * reading happens in stats/ (snapshots). */
#ifndef CACHALOT_ALLOCATOR_HISTORY_H
#define CACHALOT_ALLOCATOR_HISTORY_H

#include "types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

/* The rows a ring starts with: enough for a short recording, little for a long limit. */
enum { CL_TRACE_FIRST_ROOM = 4096 };

/* The rows of a ring of cap entries grown `grown` times: min(cap, CL_TRACE_FIRST_ROOM << grown). */
static inline size_t cl_trace_rows_of(size_t cap, unsigned grown) {
  if (grown >= sizeof(size_t) * 8 - 13) /* CL_TRACE_FIRST_ROOM << grown would overflow */
    return cap;
  const size_t rows = (size_t)CL_TRACE_FIRST_ROOM << grown;
  return rows < cap ? rows : cap;
}

static inline size_t cl_trace_rows(const cl_device *d) { return cl_trace_rows_of(d->trace.cap, d->trace_grown); }

/* The entry recorded (the caller may add to it: cachalot_annotate's text). ctx: the context it keeps; NULL:
 * the rule of its action (history.c's entry_ctx). */
cl_trace_entry *cl_trace_record_slow_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                            cachalot_stream stream, void *ctx);
/* Records an entry when history is on; otherwise costs one branch. */
static inline void cl_trace_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                   cachalot_stream stream) {
  CL_ASSERT_EXCLUSIVE(d);
  if (CL_UNLIKELY(d->trace.cap != 0))
    (void)cl_trace_record_slow_locked(d, action, addr, size, stream, NULL);
}
/* A warm path's entries (its lane locked, CL_WARM_TRACE set: history without stacks or contexts, so no
 * entry holds a context): `action` alone, or with free_completed after it when `action` is free_requested
 * (a warm free is both at once), at one time: that of `stamp`, a cl_trace_stamp the call took before its
 * lane lock (0: none, the time is read now). `solo`: the lane's flags have CL_WARM_SOLO (no other warm
 * path can record meanwhile: the ring's lock is not taken). */
void cl_trace_warm(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size, cachalot_stream stream,
                   uint64_t stamp, bool solo);
/* The time stamp counter when history is on for lane flags `warm` (read without the lane's lock: a hint),
 * else 0. A warm call takes it before its lane lock: the counter's read is slow on some hosts (~50 ns
 * where the lock's atomic exchange and the entry's store wait for it), and issued first it overlaps the
 * lock and the call's work. */
static inline uint64_t cl_trace_stamp(unsigned warm) {
#if defined(__x86_64__) || defined(__i386__)
  if (CL_UNLIKELY(warm & CL_WARM_TRACE))
    return __rdtsc();
#else
  (void)warm;
#endif
  return 0;
}
/* The same with the context the entry keeps given (a segment's, for its segment_free entry). */
static inline void cl_trace_ctx_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                       cachalot_stream stream, void *ctx) {
  CL_ASSERT_EXCLUSIVE(d);
  if (CL_UNLIKELY(d->trace.cap != 0))
    (void)cl_trace_record_slow_locked(d, action, addr, size, stream, ctx);
}
/* Keeps the context of the malloc in progress with segment s, which it just made (history on), for the
 * segment's segment_free entry, as PyTorch keeps context_when_segment_allocated. */
void cl_segment_ctx_attach_locked(cl_device *d, cl_segment *s);
/* Lets go of the context kept with segment s, if any. */
void cl_segment_ctx_drop_locked(cl_device *d, cl_segment *s);
void cl_trace_free_locked(cl_device *d);
/* The contexts of the call in progress on this thread (cachalot_malloc_with_context,
 * cachalot_free_with_context): NULL outside such a call. */
extern _Thread_local void *cl_tls_alloc_ctx, *cl_tls_free_ctx;
/* Threads inside one of those calls, of any allocator. While none is, no thread has a context set, and
 * the warm paths skip reading theirs (a thread-local read in a shared library is a call). A thread sees
 * its own increments, so relaxed order is enough. */
extern _Atomic int cl_ctx_calls;
/* A *_with_context call's context in `slot` (cl_tls_alloc_ctx or cl_tls_free_ctx) while the call runs;
 * what was there comes back after, not NULL: an out-of-memory observer runs inside the call and may
 * allocate (through any allocator) itself. */
static inline void *cl_ctx_push(void **slot, void *ctx) {
  void *const saved = *slot;
  atomic_fetch_add_explicit(&cl_ctx_calls, 1, memory_order_relaxed);
  *slot = ctx;
  return saved;
}
static inline void cl_ctx_pop(void **slot, void *saved) {
  *slot = saved;
  atomic_fetch_sub_explicit(&cl_ctx_calls, 1, memory_order_relaxed);
}
static inline void *cl_alloc_ctx(void) {
  return atomic_load_explicit(&cl_ctx_calls, memory_order_relaxed) ? cl_tls_alloc_ctx : NULL;
}
static inline void *cl_free_ctx(void) {
  return atomic_load_explicit(&cl_ctx_calls, memory_order_relaxed) ? cl_tls_free_ctx : NULL;
}
/* Keeps this thread's alloc context, and the C stack of the alloc entry just recorded (stacks on), with
 * the block at ptr (history on; hand_out's exclusive path). */
void cl_ctx_attach_locked(cl_device *d, uintptr_t ptr);
/* Lets go of the context kept with the block at ptr, if any (every free of a handed-out block). */
void cl_ctx_detach_locked(cl_device *d, uintptr_t ptr);
static inline void cl_ctx_drop_locked(cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  if (CL_UNLIKELY(d->block_ctx != NULL))
    cl_ctx_detach_locked(d, ptr);
}
/* Lets go of every block's context (destroy). */
void cl_ctx_detach_all_locked(cl_device *d);
/* The context kept with the block at ptr, or NULL. */
void *cl_ctx_of_locked(const cl_device *d, uintptr_t ptr);
/* The C stack kept with the block at ptr: its frame count (0: none), *frames pointed at them. */
int cl_block_frames_locked(const cl_device *d, uintptr_t ptr, void *const **frames);
/* The return addresses the device keeps, copied out in pieces so that the snapshot writer can name them
 * with the lock released (symbolizing never stalls the allocator): the trace entries' stacks from entry
 * *from on (oldest first; repeats included), as many whole stacks as fit in max, *from advanced past
 * them (to the entry count when done); and the handed-out blocks' stacks, as many as fit. The count
 * copied. */
size_t cl_trace_frames_locked(const cl_device *d, size_t *from, void **out, size_t max);
size_t cl_block_frames_copy_locked(const cl_device *d, void **out, size_t max);
/* cachalot_check's part: every record names a handed-out block of d and holds something. */
cachalot_status cl_ctx_check_locked(cl_device *d);
/* One more reference to ctx (not NULL), and one fewer. */
void cl_ctx_retain(cachalot_allocator *a, void *ctx);
void cl_ctx_release(cachalot_allocator *a, void *ctx);
/* The history clock's rate (history.c), for tests: microseconds per time stamp counter tick, 32.32
 * fixed point, from `ticks` counted over `ns` nanoseconds; 0 for a pair further apart than
 * CL_CLOCK_PAIR_MAX_NS or a rate no counter runs at (outside 0.2 to 10 GHz). And the rate measured in
 * this process: 0 until measured, always on other machines than x86. */
enum { CL_CLOCK_PAIR_MAX_NS = 1000000000 };
uint64_t cl_clock_rate_q32(uint64_t ticks, int64_t ns);
uint64_t cl_clock_rate(void);

#endif
