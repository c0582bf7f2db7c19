/* Memory history: a ring buffer of trace entries per device (torch.cuda.memory._snapshot()), with optional C
 * call stacks and the caller's contexts. Recording happens under the device lock, at the places the allocator
 * changes state; reading happens in snapshot.c and snapshot_info.c; history_control.c turns it on and off. */
#include "core.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Thread_local void *cl_tls_alloc_ctx, *cl_tls_free_ctx;
_Atomic int cl_ctx_calls;

/* What is kept with a handed-out block, by the block's address: the caller's context and the C stack of
 * its alloc entry (either may be missing, not both). */
typedef struct cl_block_ctx {
  uintptr_t ptr;
  void *ctx;
  UT_hash_handle hh;
  uint8_t n_frames;
  void *frames[]; /* n_frames return addresses, innermost first */
} cl_block_ctx;

void cl_ctx_retain(cachalot_allocator *a, void *ctx) {
  a->ctx_ops.retain(ctx);
  atomic_fetch_add_explicit(&a->n_ctx, 1, memory_order_relaxed);
}

void cl_ctx_release(cachalot_allocator *a, void *ctx) {
  /* released before the count drops: until then cachalot_set_context_ops cannot change the ops (a
   * snapshot's contexts are released with no lock held) */
  a->ctx_ops.release(ctx);
  atomic_fetch_sub_explicit(&a->n_ctx, 1, memory_order_release);
}

/* The stack of the alloc entry just recorded for ptr (hand_out records it right before attaching), so
 * the block shares that walk instead of taking a second one. */
static int last_alloc_frames(const cl_trace *t, uintptr_t ptr, void *const **frames) {
  if (!t->frames || !t->count)
    return 0;
  const size_t slot = (t->head + t->count - 1) % t->cap;
  const cl_trace_entry *e = &t->entries[slot];
  if (e->action != CL_TRACE_ALLOC || e->addr != ptr)
    return 0;
  *frames = &t->frames[slot * CL_TRACE_MAX_FRAMES];
  return e->n_frames;
}

void cl_ctx_attach_locked(cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->trace.cap == 0)
    return;
  void *ctx = d->owner->ctx_ops.retain ? cl_tls_alloc_ctx : NULL;
  void *const *frames = NULL;
  const int n = last_alloc_frames(&d->trace, ptr, &frames);
  if (!ctx && n == 0)
    return;
  cl_block_ctx *e = malloc(sizeof *e + (size_t)n * sizeof(void *));
  if (!e) /* the block goes without: history loses a detail, nothing else */
    return;
  e->ptr = ptr;
  e->ctx = ctx;
  e->n_frames = (uint8_t)n;
  if (n)
    memcpy(e->frames, frames, (size_t)n * sizeof(void *));
  bool hash_oom = false;
  HASH_ADD(hh, d->block_ctx, ptr, sizeof e->ptr, e);
  if (hash_oom) {
    free(e);
    return;
  }
  if (ctx)
    cl_ctx_retain(d->owner, ctx);
}

static void drop_entry(cl_device *d, cl_block_ctx *e) {
  HASH_DEL(d->block_ctx, e);
  if (e->ctx)
    cl_ctx_release(d->owner, e->ctx);
  free(e);
}

void cl_ctx_detach_locked(cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e;
  HASH_FIND(hh, d->block_ctx, &ptr, sizeof ptr, e);
  if (e)
    drop_entry(d, e);
}

void *cl_ctx_of_locked(const cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e;
  HASH_FIND(hh, d->block_ctx, &ptr, sizeof ptr, e);
  return e ? e->ctx : NULL;
}

int cl_block_frames_locked(const cl_device *d, uintptr_t ptr, void *const **frames) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e;
  HASH_FIND(hh, d->block_ctx, &ptr, sizeof ptr, e);
  if (!e)
    return 0;
  *frames = e->frames;
  return e->n_frames;
}

size_t cl_trace_frames_locked(const cl_device *d, size_t *from, void **out, size_t max) {
  CL_ASSERT_EXCLUSIVE(d);
  const cl_trace *t = &d->trace;
  size_t n = 0, k = *from;
  for (; t->frames && k < t->count; k++) {
    const size_t slot = (t->head + k) % t->cap;
    const size_t m = t->entries[slot].n_frames;
    if (m > max - n)
      break;
    memcpy(out + n, &t->frames[slot * CL_TRACE_MAX_FRAMES], m * sizeof *out);
    n += m;
  }
  *from = t->frames ? k : t->count;
  return n;
}

size_t cl_block_frames_copy_locked(const cl_device *d, void **out, size_t max) {
  CL_ASSERT_EXCLUSIVE(d);
  size_t n = 0;
  const cl_block_ctx *e, *tmp;
  HASH_ITER(hh, d->block_ctx, e, tmp) {
    if (e->n_frames > max - n)
      break;
    memcpy(out + n, e->frames, e->n_frames * sizeof *out);
    n += e->n_frames;
  }
  return n;
}

/* The segment keeps the context of the malloc that made it, for its segment_free entry. */
void cl_segment_ctx_attach_locked(cl_device *d, cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->trace.cap == 0 || !cl_tls_alloc_ctx || !d->owner->ctx_ops.retain || s->ctx)
    return;
  cl_ctx_retain(d->owner, cl_tls_alloc_ctx);
  s->ctx = cl_tls_alloc_ctx;
}

void cl_segment_ctx_drop_locked(cl_device *d, cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  if (s->ctx) {
    cl_ctx_release(d->owner, s->ctx);
    s->ctx = NULL;
  }
}

/* Lets go of every block's and segment's context (destroy). */
void cl_ctx_detach_all_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e, *tmp;
  HASH_ITER(hh, d->block_ctx, e, tmp)
    drop_entry(d, e);
  for (cl_segment *s = d->segments; s; s = s->next)
    cl_segment_ctx_drop_locked(d, s);
}

cachalot_status cl_ctx_check_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e, *tmp;
  HASH_ITER(hh, d->block_ctx, e, tmp) {
    const cl_segment *s = cl_page_get(&d->owner->pages, e->ptr);
    if (!s || s == CL_PAGE_SHARED || e->ptr - s->ptr >= s->size) /* off the page map: the list */
      for (s = d->segments; s && e->ptr - s->ptr >= s->size; s = s->next)
        ;
    const cl_block *b = s ? *cl_seg_slot(s, e->ptr) : NULL;
    if (!b || b->ptr != e->ptr || b->state == CL_FREE)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_check: device %d: a context or stack is kept for 0x%llx, which is no handed-out block",
                     d->index, (unsigned long long)e->ptr);
    if (!e->ctx && !e->n_frames)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_check: device %d: an empty block record at 0x%llx",
                     d->index, (unsigned long long)e->ptr);
  }
  return CACHALOT_OK;
}

/* Doubles the ring's rows (not past cap). It has not wrapped (rows < cap), so the rows keep their order.
 * Where the host has no memory for more, the ring keeps the rows it has and wraps there: history loses
 * its oldest entries sooner, nothing else. */
__attribute__((noinline, cold)) static void grow_trace(cl_device *d) {
  cl_trace *t = &d->trace;
  const size_t had = cl_trace_rows(d);
  d->trace_grown++;
  const size_t rows = cl_trace_rows(d);
  cl_trace_entry *entries = rows <= SIZE_MAX / sizeof *entries ? realloc(t->entries, rows * sizeof *entries) : NULL;
  if (entries) {
    t->entries = entries;
    memset(entries + had, 0, (rows - had) * sizeof *entries);
  }
  const size_t row = CL_TRACE_MAX_FRAMES * sizeof(void *);
  void **frames = NULL;
  if (entries && t->frames && rows <= SIZE_MAX / row && (frames = realloc(t->frames, rows * row)) != NULL)
    t->frames = frames;
  if (!entries || (t->frames && !frames)) {
    cl_warn("memory history of device %d: host out of memory for %zu entries; keeping the last %zu", d->index,
            rows, had);
    t->cap = had; /* trace_rows is cap from now on */
  }
}

/* The context a trace entry keeps, as PyTorch's allocator gives its entries one: the call's (the malloc's
 * for the block and the segment it makes, and for its failure; the free's for the block it frees; either's
 * for the pages it unmaps), else, for the free events of a block, the context its allocation left with it
 * (a free without one, an event completing later). A segment_free entry is given its segment's by its
 * caller. */
static void *entry_ctx(const cl_device *d, cl_trace_action action, uint64_t addr) {
  switch (action) {
  case CL_TRACE_ALLOC:
  case CL_TRACE_SEGMENT_ALLOC:
  case CL_TRACE_SEGMENT_MAP:
  case CL_TRACE_OOM: /* the failing malloc's */
    return cl_tls_alloc_ctx;
  case CL_TRACE_SEGMENT_UNMAP:
    return cl_tls_free_ctx ? cl_tls_free_ctx : cl_tls_alloc_ctx;
  case CL_TRACE_FREE_REQUESTED:
  case CL_TRACE_FREE_COMPLETED:
    if (cl_tls_free_ctx)
      return cl_tls_free_ctx;
    return d->block_ctx ? cl_ctx_of_locked(d, (uintptr_t)addr) : NULL;
  default:
    return NULL;
  }
}

/* One row of the ring taken for a new entry, growing it first when it must (see cl_trace). */
CL_INLINE cl_trace_entry *next_entry(cl_device *d, size_t *slot_out) {
  cl_trace *t = &d->trace;
  if (CL_UNLIKELY(t->count < t->cap) && t->count == cl_trace_rows(d))
    grow_trace(d);
  /* head < cap and count <= cap: a subtraction wraps, where a division (two a pair of calls, on the warm
   * paths) cost more than the rest of the entry */
  size_t slot;
  if (CL_LIKELY(t->count == t->cap)) { /* full: the oldest entry makes room */
    slot = t->head;
    if (++t->head == t->cap)
      t->head = 0;
    /* The rows ahead are old and cold (a ring of up to 100,000 rows is several MiB), and fill_entry reads
     * each one's text: ask for them now, so that the warm paths do not wait a memory load per entry (a
     * ring of 8 rows or fewer is in the cache, and its row 8 ahead would lie outside it). */
    if (t->cap > 8)
      __builtin_prefetch(&t->entries[slot + 8 < t->cap ? slot + 8 : slot + 8 - t->cap], 1);
  } else {
    slot = t->head + t->count;
    if (slot >= t->cap)
      slot -= t->cap;
    t->count++;
  }
  *slot_out = slot;
  return &t->entries[slot];
}

/* Writes entry e anew, without frames or a context. A reused row's text goes; its context must be gone
 * already (released by exclusive mode; the warm paths record only without context ops). */
static void fill_entry(cl_trace_entry *e, cl_trace_action action, uint64_t addr, uint64_t size,
                       cachalot_stream stream, int64_t time_us) {
  if (CL_UNLIKELY(e->text != NULL)) { /* a reused row of an annotation's */
    free(e->text);
    e->text = NULL;
  }
  e->ctx = NULL;
  e->action = (uint8_t)action;
  e->n_frames = 0;
  e->addr = addr;
  e->size = size;
  e->stream = (uintptr_t)stream;
  e->time_us = time_us;
}

/* Where the real clock of a device's history goes on from `real` (its reading): an interpolation that ran
 * ahead stays put until the clock passes it, so that a lead never outlasts one anchor and times do not go
 * back; a real step back of ANCHOR_US or more (the clock was set back) is followed. */
enum { ANCHOR_US = 1000 };
static int64_t settle(cl_trace_clock *c, int64_t real) {
  c->us = real;
  if (real > c->last || c->last - real >= ANCHOR_US)
    c->last = real;
  return c->last;
}

uint64_t cl_clock_rate_q32(uint64_t ticks, int64_t ns) {
  /* (ns << 32) fits 64 bits below 2^32 ns; callers pair readings at most CL_CLOCK_PAIR_MAX_NS apart */
  if (ticks == 0 || ns <= 0 || ns > CL_CLOCK_PAIR_MAX_NS)
    return 0;
  const uint64_t rate = ((uint64_t)ns << 32) / 1000 / ticks;
  /* counters run at 0.2 to 10 GHz: 5,000 down to 100 ps a tick */
  if (rate < ((uint64_t)1 << 32) / 10000 || rate > ((uint64_t)1 << 32) / 200)
    return 0;
  return rate;
}

#if defined(__x86_64__) || defined(__i386__)
/* The history clock. Reading the real one cost the warm paths more than the rest of an entry (a system
 * call where the host's clock source has no vDSO, as on some virtual machines), so a device reads it once
 * per ANCHOR_US and takes the microseconds in between from the time stamp counter, at a rate measured
 * once per process against CLOCK_MONOTONIC (which is not stepped) between two readings CALIBRATE_US to
 * CL_CLOCK_PAIR_MAX_NS apart (a try at most every CALIBRATE_TICKS, so that a rate that cannot be had costs
 * little). Each reading's counter is the middle of two, one before and one after the clock, from the
 * cleanest of up to READ_TRIES tries; a reading is clean when its two lie within READ_TICKS plus twice the
 * cleanest spread seen in the process (where the clock itself costs that much), else the thread was
 * stopped in between. So an anchor is off by half that (2 us at 1 GHz with a fast clock) and the rate by
 * under that in CALIBRATE_US (0.02%: 0.2 us an interpolated millisecond). Until the rate is known, an
 * entry within TICKS_FRESH ticks of the last reading takes that reading (wrong by under 2 us at 1 GHz).
 * A counter that went backwards (another core's, where cores' counters differ) or too far reads the clock
 * again, and so does the entry after a reading none of whose tries was clean. */
enum { TICKS_FRESH = 2000, READ_TICKS = 4000, READ_TRIES = 8, CALIBRATE_US = 20000 };
#define CALIBRATE_TICKS ((uint64_t)1 << 21)
static _Atomic uint64_t us_per_tick_q32;  /* microseconds per tick, 32.32 fixed point; 0 until measured */
static _Atomic uint64_t ticks_per_anchor; /* ANCHOR_US in ticks, stored before the rate */
static _Atomic uint64_t read_floor = UINT64_MAX; /* the cleanest spread of a reading seen */
static pthread_mutex_t calibration_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uint64_t tsc, tried;
  int64_t ns;
} calibration; /* the first reading of the pair, and the counter at the last try (under calibration_lock) */

uint64_t cl_clock_rate(void) { return atomic_load_explicit(&us_per_tick_q32, memory_order_acquire); }

/* Clock `id` and the counter's middle around it, from the cleanest try; whether that try was clean. */
static bool read_pair(clockid_t id, uint64_t *tsc, int64_t *ns) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < READ_TRIES; i++) {
    const uint64_t before = __rdtsc();
    struct timespec ts;
    clock_gettime(id, &ts);
    const uint64_t spread = __rdtsc() - before;
    if (spread < best) {
      best = spread;
      *tsc = before + spread / 2;
      *ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    uint64_t floor = atomic_load_explicit(&read_floor, memory_order_relaxed);
    if (spread < floor)
      atomic_store_explicit(&read_floor, floor = spread, memory_order_relaxed);
    if (spread < READ_TICKS + 2 * floor)
      return true;
  }
  return false;
}

__attribute__((noinline, cold)) static void calibrate(uint64_t now) {
  if (pthread_mutex_trylock(&calibration_lock) != 0) /* another device's reading is doing it */
    return;
  uint64_t tsc = 0;
  int64_t ns = 0;
  if (atomic_load_explicit(&us_per_tick_q32, memory_order_relaxed) == 0 &&
      (calibration.tried == 0 || now - calibration.tried >= CALIBRATE_TICKS)) {
    calibration.tried = now;
    if (read_pair(CLOCK_MONOTONIC, &tsc, &ns)) {
      const int64_t gap = ns - calibration.ns;
      const bool paired = calibration.ns != 0 && tsc > calibration.tsc && gap >= 0;
      if (!paired || gap >= (int64_t)CALIBRATE_US * 1000) { /* (else too short yet: the first reading stays) */
        const uint64_t rate = paired ? cl_clock_rate_q32(tsc - calibration.tsc, gap) : 0;
        if (rate != 0) {
          atomic_store_explicit(&ticks_per_anchor, ((uint64_t)ANCHOR_US << 32) / rate, memory_order_relaxed);
          atomic_store_explicit(&us_per_tick_q32, rate, memory_order_release);
        } else { /* no pair, too long a one, or a rate no counter runs at: a fresh pair from here */
          calibration.tsc = tsc;
          calibration.ns = ns;
        }
      }
    }
  }
  pthread_mutex_unlock(&calibration_lock);
}

__attribute__((noinline)) static int64_t read_clock(cl_trace_clock *c, uint64_t tsc) {
  if (atomic_load_explicit(&us_per_tick_q32, memory_order_relaxed) == 0)
    calibrate(tsc);
  uint64_t at = tsc;
  int64_t ns = 0;
  /* A reading that was not clean is not an anchor: its counter is set far back, so the next entry reads
   * again. */
  c->tsc = read_pair(CLOCK_REALTIME, &at, &ns) ? at : at - ((uint64_t)1 << 62);
  return settle(c, ns / 1000);
}

/* The time of counter reading `tsc` (0: read now). A reading older than the anchor (taken before another
 * thread's entry moved it) reads the clock anew, and an entry is never earlier than the one before it. */
CL_INLINE int64_t clock_us(cl_trace_clock *c, uint64_t stamp) {
  const uint64_t tsc = stamp ? stamp : __rdtsc();
  const uint64_t dt = tsc - c->tsc; /* huge when the counter went backwards */
  const uint64_t rate = atomic_load_explicit(&us_per_tick_q32, memory_order_acquire);
  if (CL_LIKELY(rate != 0) && dt < atomic_load_explicit(&ticks_per_anchor, memory_order_relaxed)) {
    const int64_t us = c->us + (int64_t)((dt * rate) >> 32);
    if (us > c->last)
      c->last = us;
    return c->last;
  }
  if (dt < TICKS_FRESH)
    return c->last;
  return read_clock(c, tsc);
}
#else
uint64_t cl_clock_rate(void) { return 0; }
static int64_t clock_us(cl_trace_clock *c, uint64_t stamp) {
  (void)stamp;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return settle(c, (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000);
}
#endif

void cl_trace_warm(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size, cachalot_stream stream,
                   uint64_t stamp, bool solo) {
  size_t slot;
  if (!solo)
    cl_spin_lock(&d->trace_lock);
  const int64_t time_us = clock_us(&d->trace_clock, stamp);
  fill_entry(next_entry(d, &slot), action, addr, size, stream, time_us);
  if (action == CL_TRACE_FREE_REQUESTED)
    fill_entry(next_entry(d, &slot), CL_TRACE_FREE_COMPLETED, addr, size, stream, time_us);
  if (!solo)
    cl_spin_unlock(&d->trace_lock);
}

cl_trace_entry *cl_trace_record_slow_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                            cachalot_stream stream, void *given) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_trace *t = &d->trace;
  size_t slot;
  cl_trace_entry *e = next_entry(d, &slot);
  if (e->ctx) /* a reused slot */
    cl_ctx_release(d->owner, e->ctx);
  fill_entry(e, action, addr, size, stream, clock_us(&d->trace_clock, 0)); /* no warm path runs */
  void *ctx = given ? given : entry_ctx(d, action, addr);
  if (ctx && d->owner->ctx_ops.retain) {
    cl_ctx_retain(d->owner, ctx);
    e->ctx = ctx;
  }
  if (t->frames && (action == CL_TRACE_ALLOC || action == CL_TRACE_FREE_REQUESTED || action == CL_TRACE_USER_DEFINED)) {
    /* Inlining makes the number of cachalot's own frames vary; snapshot.c drops them when writing. */
    void *buf[CL_TRACE_MAX_FRAMES + 8];
    int n = backtrace(buf, CL_TRACE_MAX_FRAMES + 8);
    int skip = n > 1 ? 1 : n; /* this function */
    int keep = n - skip > CL_TRACE_MAX_FRAMES ? CL_TRACE_MAX_FRAMES : n - skip;
    memcpy(&t->frames[slot * CL_TRACE_MAX_FRAMES], buf + skip, (size_t)keep * sizeof(void *));
    e->n_frames = (uint8_t)keep;
  }
  return e;
}

void cl_trace_free_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_trace *t = &d->trace;
  for (size_t i = 0; i < t->count; i++) {
    cl_trace_entry *e = &t->entries[(t->head + i) % t->cap];
    if (e->ctx)
      cl_ctx_release(d->owner, e->ctx);
    free(e->text);
  }
  free(d->trace.entries);
  free(d->trace.frames);
  memset(&d->trace, 0, sizeof d->trace);
}
