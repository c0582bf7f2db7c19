/* The caching pinned-host allocator (include/cachalot/host.h): blocks of power-of-two sizes, each one
 * pinning, cached in a free list per size, reused only after the streams that used them are done. */
#include "host_cache.h"

#include "host_pin.h"
#include "../core/core.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BINS = 64 }; /* one per power of two a size_t holds */

/* A stream that used a block: `s`, or device's default stream where s is NULL. */
typedef struct {
  int device;
  cachalot_stream s;
} host_use;

/* One pinning of `size` bytes (a power of two), handed out whole.
 * Invariant: in the cache's `blocks` hash (by ptr) from its pinning until it is given back, and in
 * exactly one of four states: allocated (n_events == 0, in no bin); waiting (freed, n_events > 0
 * entries of the cache's `pend` name it, in no bin); free (n_events == 0, in bins[log2 size]); kept
 * (freed, `kept`, n_events == 0, in no bin: never reused, given back only by destroy).
 * uses[0..n_uses) are the distinct streams record_event named since it was handed out, only while
 * allocated. */
typedef struct host_block {
  void *ptr;
  size_t size;
  bool allocated;
  bool registered; /* pinned by cudaHostRegister (host_pin.c), not cudaHostAlloc */
  bool kept;       /* freed while a marked stream was being captured: a graph may read it at any replay */
  unsigned n_events;
  host_use *uses;
  unsigned n_uses, cap_uses;
  struct host_block *prev_free, *next_free; /* in its bin, most recently freed first */
  UT_hash_handle hh;
} host_block;

typedef struct {
  cl_event *ev;
  host_block *blk;
} host_pending;

/* Everything is guarded by `lock`; no lock is held across a pinning or unpinning (they take milliseconds
 * and may synchronize the device). Invariant: the stats' current values are what the blocks say (see
 * cl_host_check). */
struct cl_host {
  pthread_mutex_t lock;
  cachalot_backend *backend;
  int device_count;
  bool use_register;
  unsigned register_threads;
  host_block *blocks;
  host_block *bins[BINS];
  host_pending *pend;
  size_t n_pend, cap_pend;
  cachalot_host_stats stats;
};

static unsigned log2_of(size_t pow2) { return (unsigned)__builtin_ctzll((unsigned long long)pow2); }

static void duration_add(cachalot_duration_stat *d, int64_t us) {
  d->total += us;
  if (us > d->max)
    d->max = us;
  if (d->min == 0 || us < d->min) /* 0: none since the last reset */
    d->min = us;
  d->count++;
}

static int64_t now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void bin_push(cl_host *h, host_block *b) {
  host_block **bin = &h->bins[log2_of(b->size)];
  b->prev_free = NULL;
  b->next_free = *bin;
  if (*bin)
    (*bin)->prev_free = b;
  *bin = b;
}

static void bin_remove(cl_host *h, host_block *b) {
  if (b->prev_free)
    b->prev_free->next_free = b->next_free;
  else
    h->bins[log2_of(b->size)] = b->next_free;
  if (b->next_free)
    b->next_free->prev_free = b->prev_free;
  b->prev_free = b->next_free = NULL;
}

/* Moves the blocks whose events have all completed to their bins. An event the backend cannot query
 * stays pending: its block is never reused rather than reused too early. */
static void process_events_held(cl_host *h) {
  cachalot_backend *be = h->backend;
  size_t kept = 0;
  for (size_t i = 0; i < h->n_pend; i++) {
    host_pending p = h->pend[i];
    bool done = false;
    if (be->ops->event_query(be, p.ev, &done) != CACHALOT_OK || !done) {
      h->pend[kept++] = p;
      continue;
    }
    be->ops->event_release(be, p.ev);
    if (--p.blk->n_events == 0)
      bin_push(h, p.blk);
  }
  h->n_pend = kept;
}

cachalot_status cl_host_create(cachalot_backend *b, cl_host **out) {
  cl_host *h = calloc(1, sizeof *h);
  *out = h;
  if (!h)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_create: host out of memory");
  pthread_mutex_init(&h->lock, NULL);
  h->backend = b;
  h->device_count = b->device_count;
  h->register_threads = 1;
  return CACHALOT_OK;
}

void cl_host_configure(cl_host *h, bool use_register, unsigned register_threads) {
  pthread_mutex_lock(&h->lock);
  h->use_register = use_register;
  h->register_threads = register_threads;
  pthread_mutex_unlock(&h->lock);
}

void cl_host_destroy(cl_host *h) {
  if (!h)
    return;
  cachalot_backend *be = h->backend;
  for (size_t i = 0; i < h->n_pend; i++) {
    (void)be->ops->event_sync(be, h->pend[i].ev);
    be->ops->event_release(be, h->pend[i].ev);
  }
  host_block *b, *tmp;
  HASH_ITER(hh, h->blocks, b, tmp) {
    /* a block still handed out may still be copied from by the streams it was marked with */
    for (unsigned i = 0; i < b->n_uses; i++)
      (void)be->ops->stream_sync(be, b->uses[i].device, b->uses[i].s);
    HASH_DEL(h->blocks, b);
    (void)cl_host_unpin(be, b->ptr, b->registered);
    free(b->uses);
    free(b);
  }
  free(h->pend);
  pthread_mutex_destroy(&h->lock);
  free(h);
}

/* The cache of `a`, after the checks every entry point makes. */
static cachalot_status enter(cachalot_allocator *a, const char *fn, cl_host **h) {
  *h = NULL;
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: allocator is NULL", fn);
  if (cl_forked(a))
    return cl_forked_fail(fn);
  *h = a->host;
  return CACHALOT_OK;
}

/* Pins a new block of `size` bytes with no lock held; NULL with the error set on failure. */
static host_block *pin_block(cl_host *h, size_t size, cachalot_status *rc) {
  pthread_mutex_lock(&h->lock);
  const bool use_register = h->use_register;
  const unsigned threads = h->register_threads;
  pthread_mutex_unlock(&h->lock);
  host_block *b = calloc(1, sizeof *b);
  if (!b) {
    *rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_host_malloc: host out of memory");
    return NULL;
  }
  const int64_t t0 = now_us();
  *rc = cl_host_pin(h->backend, size, use_register, threads, &b->ptr);
  const int64_t t1 = now_us();
  if (*rc != CACHALOT_OK) {
    free(b);
    return NULL;
  }
  b->size = size;
  b->registered = use_register;
  pthread_mutex_lock(&h->lock);
  duration_add(&h->stats.host_alloc_time, t1 - t0);
  h->stats.num_host_alloc++;
  pthread_mutex_unlock(&h->lock);
  return b;
}

/* Gives back one block taken out of the cache (in no hash or bin); on failure puts it back as free. */
static cachalot_status unpin_block(cl_host *h, host_block *b) {
  const int64_t t0 = now_us();
  cachalot_status rc = cl_host_unpin(h->backend, b->ptr, b->registered);
  const int64_t t1 = now_us();
  pthread_mutex_lock(&h->lock);
  if (rc == CACHALOT_OK) {
    duration_add(&h->stats.host_free_time, t1 - t0);
    h->stats.num_host_free++;
  } else { /* still pinned: back to the cache, free */
    bool hash_oom = false;
    HASH_ADD_PTR(h->blocks, ptr, b);
    if (!hash_oom) { /* take_free_held's decrease undone: nothing was pinned again */
      bin_push(h, b);
      h->stats.allocations.current++;
      h->stats.allocations.freed--;
      h->stats.allocated_bytes.current += (int64_t)b->size;
      h->stats.allocated_bytes.freed -= (int64_t)b->size;
    } /* else the host cannot even track it: it stays pinned, forgotten, rather than freed pinned */
  }
  pthread_mutex_unlock(&h->lock);
  if (rc == CACHALOT_OK) {
    free(b->uses);
    free(b);
  }
  return rc;
}

/* Takes every free block out of the cache, as a list through next_free (lock held). */
static host_block *take_free_held(cl_host *h) {
  process_events_held(h);
  host_block *list = NULL;
  for (int k = 0; k < BINS; k++) {
    while (h->bins[k]) {
      host_block *b = h->bins[k];
      bin_remove(h, b);
      HASH_DEL(h->blocks, b);
      cl_stat_add(&h->stats.allocations, -1);
      cl_stat_add(&h->stats.allocated_bytes, -(int64_t)b->size);
      b->next_free = list;
      list = b;
    }
  }
  return list;
}

static cachalot_status release_list(cl_host *h, host_block *list) {
  cachalot_status first = CACHALOT_OK;
  while (list) {
    host_block *next = list->next_free;
    list->next_free = NULL;
    cachalot_status rc = unpin_block(h, list);
    if (rc != CACHALOT_OK && first == CACHALOT_OK)
      first = rc;
    list = next;
  }
  return first;
}

cachalot_status cachalot_host_malloc(cachalot_allocator *a, size_t size, void **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_host_malloc: out is NULL");
  *out = NULL; /* cleared first, as every out-parameter: also on a NULL or forked allocator */
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_malloc", &h);
  if (rc != CACHALOT_OK)
    return rc;
  if (size == 0)
    return CACHALOT_OK;
  if (size > ((size_t)1 << (BINS - 1)))
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY,
                   "cachalot_host_malloc: %zu bytes cannot be rounded up to a power of two", size);
  const size_t round = size == 1 ? 1 : (size_t)1 << (64 - __builtin_clzll((unsigned long long)(size - 1)));
  pthread_mutex_lock(&h->lock);
  process_events_held(h);
  host_block *b = h->bins[log2_of(round)];
  if (b) {
    bin_remove(h, b);
    b->allocated = true;
    cl_stat_add(&h->stats.active_requests, 1);
    cl_stat_add(&h->stats.active_bytes, (int64_t)round);
    pthread_mutex_unlock(&h->lock);
    *out = b->ptr;
    return CACHALOT_OK;
  }
  pthread_mutex_unlock(&h->lock);
  b = pin_block(h, round, &rc);
  if (!b && rc == CACHALOT_ERROR_OUT_OF_MEMORY) {
    /* the free blocks of other sizes hold pinned memory the host may need: give them back, once */
    pthread_mutex_lock(&h->lock);
    host_block *list = take_free_held(h);
    pthread_mutex_unlock(&h->lock);
    if (list) {
      (void)release_list(h, list);
      b = pin_block(h, round, &rc);
    }
  }
  if (!b) {
    cl_error_prefix("cachalot_host_malloc: pinning %zu bytes: ", round);
    return rc;
  }
  pthread_mutex_lock(&h->lock);
  bool hash_oom = false;
  HASH_ADD_PTR(h->blocks, ptr, b);
  if (hash_oom) {
    h->stats.num_host_free++; /* the pinning counted, so does its undoing */
    pthread_mutex_unlock(&h->lock);
    (void)cl_host_unpin(h->backend, b->ptr, b->registered);
    free(b);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_host_malloc: host out of memory");
  }
  b->allocated = true;
  cl_stat_add(&h->stats.allocations, 1);
  cl_stat_add(&h->stats.allocated_bytes, (int64_t)round);
  cl_stat_add(&h->stats.active_requests, 1);
  cl_stat_add(&h->stats.active_bytes, (int64_t)round);
  pthread_mutex_unlock(&h->lock);
  *out = b->ptr;
  return CACHALOT_OK;
}

/* The allocated block at ptr (lock held); NULL after setting the error. */
static host_block *find_allocated_held(cl_host *h, void *ptr, const char *fn) {
  host_block *b = NULL;
  HASH_FIND_PTR(h->blocks, &ptr, b);
  if (!b || !b->allocated) {
    (void)cl_fail(CACHALOT_ERROR_INVALID_POINTER, "%s: %p is %s", fn, ptr,
                  b ? "a pinned block that is not allocated (freed already?)"
                    : "not a pinned block from cachalot_host_malloc");
    return NULL;
  }
  return b;
}

cachalot_status cachalot_host_free(cachalot_allocator *a, void *ptr) {
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_free", &h);
  if (rc != CACHALOT_OK || !ptr)
    return rc;
  cachalot_backend *be = h->backend;
  pthread_mutex_lock(&h->lock);
  host_block *b = find_allocated_held(h, ptr, "cachalot_host_free");
  if (!b) {
    pthread_mutex_unlock(&h->lock);
    return CACHALOT_ERROR_INVALID_POINTER;
  }
  if (b->n_uses > h->cap_pend - h->n_pend) {
    size_t cap = h->cap_pend ? h->cap_pend : 16;
    while (cap - h->n_pend < b->n_uses)
      cap *= 2;
    host_pending *p = realloc(h->pend, cap * sizeof *p);
    if (!p) {
      pthread_mutex_unlock(&h->lock);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_host_free: host out of memory");
    }
    h->pend = p;
    h->cap_pend = cap;
  }
  /* An event recorded on a stream being captured stands for the graph, not for work, and CUDA refuses to
   * query it: such a block is kept for good, as the graph may copy from it at any replay. */
  bool captured = false;
  for (unsigned i = 0; i < b->n_uses && !captured; i++) {
    bool capturing = false;
    uint64_t id = 0;
    captured = be->ops->stream_capture_info(be, b->uses[i].device, b->uses[i].s, &capturing, &id) != CACHALOT_OK ||
               capturing; /* a stream that cannot say (the legacy one beside a blocking capture) counts */
  }
  if (captured) {
    b->kept = true;
    b->n_uses = 0;
    b->allocated = false;
    cl_stat_add(&h->stats.active_requests, -1);
    cl_stat_add(&h->stats.active_bytes, -(int64_t)b->size);
    pthread_mutex_unlock(&h->lock);
    return CACHALOT_OK;
  }
  unsigned n = 0;
  for (; n < b->n_uses; n++) {
    host_pending *p = &h->pend[h->n_pend + n];
    rc = be->ops->event_record(be, b->uses[n].device, b->uses[n].s, &p->ev);
    if (rc != CACHALOT_OK) {
      cl_error_prefix("cachalot_host_free: recording an event on stream %p: ", (void *)b->uses[n].s);
      while (n-- > 0)
        be->ops->event_release(be, h->pend[h->n_pend + n].ev);
      pthread_mutex_unlock(&h->lock);
      return rc;
    }
    p->blk = b;
  }
  h->n_pend += n;
  b->n_events = n;
  b->n_uses = 0;
  b->allocated = false;
  cl_stat_add(&h->stats.active_requests, -1);
  cl_stat_add(&h->stats.active_bytes, -(int64_t)b->size);
  if (n == 0)
    bin_push(h, b);
  pthread_mutex_unlock(&h->lock);
  return CACHALOT_OK;
}

cachalot_status cachalot_host_record_event(cachalot_allocator *a, void *ptr, int device, cachalot_stream s) {
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_record_event", &h);
  if (rc != CACHALOT_OK)
    return rc;
  if (device < 0 || device >= h->device_count)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_host_record_event: device %d out of range (0..%d)",
                   device, h->device_count - 1);
  /* A stream no event can be recorded on would make the block's free fail: refuse it now. */
  if (h->backend->ops->stream_check(h->backend, s) != CACHALOT_OK) {
    cl_error_prefix("cachalot_host_record_event: ");
    return CACHALOT_ERROR_INVALID_ARGUMENT;
  }
  pthread_mutex_lock(&h->lock);
  host_block *b = find_allocated_held(h, ptr, "cachalot_host_record_event");
  if (!b) {
    pthread_mutex_unlock(&h->lock);
    return CACHALOT_ERROR_INVALID_POINTER;
  }
  for (unsigned i = 0; i < b->n_uses; i++) {
    if (b->uses[i].s == s && (s || b->uses[i].device == device)) {
      pthread_mutex_unlock(&h->lock);
      return CACHALOT_OK;
    }
  }
  if (b->n_uses == b->cap_uses) {
    unsigned cap = b->cap_uses ? 2 * b->cap_uses : 4;
    host_use *u = realloc(b->uses, cap * sizeof *u);
    if (!u) {
      pthread_mutex_unlock(&h->lock);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_host_record_event: host out of memory");
    }
    b->uses = u;
    b->cap_uses = cap;
  }
  b->uses[b->n_uses++] = (host_use){device, s};
  pthread_mutex_unlock(&h->lock);
  return CACHALOT_OK;
}

cachalot_status cachalot_host_empty_cache(cachalot_allocator *a) {
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_empty_cache", &h);
  if (rc != CACHALOT_OK)
    return rc;
  pthread_mutex_lock(&h->lock);
  host_block *list = take_free_held(h);
  pthread_mutex_unlock(&h->lock);
  rc = release_list(h, list);
  if (rc != CACHALOT_OK)
    cl_error_prefix("cachalot_host_empty_cache: ");
  return rc;
}

cachalot_status cachalot_host_memory_stats(cachalot_allocator *a, cachalot_host_stats *out) {
  if (out)
    memset(out, 0, sizeof *out);
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_memory_stats", &h);
  if (rc != CACHALOT_OK)
    return rc;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_host_memory_stats: out is NULL");
  pthread_mutex_lock(&h->lock);
  *out = h->stats;
  pthread_mutex_unlock(&h->lock);
  return CACHALOT_OK;
}

/* The four counted stats, for the resets. */
static void stats_of(cl_host *h, cachalot_stat *s[4]) {
  s[0] = &h->stats.allocations;
  s[1] = &h->stats.allocated_bytes;
  s[2] = &h->stats.active_requests;
  s[3] = &h->stats.active_bytes;
}

cachalot_status cachalot_host_reset_peak_stats(cachalot_allocator *a) {
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_reset_peak_stats", &h);
  if (rc != CACHALOT_OK)
    return rc;
  pthread_mutex_lock(&h->lock);
  cachalot_stat *s[4];
  stats_of(h, s);
  for (int i = 0; i < 4; i++)
    s[i]->peak = s[i]->current;
  cachalot_duration_stat *d[] = {&h->stats.host_alloc_time, &h->stats.host_free_time};
  for (size_t i = 0; i < 2; i++) /* PyTorch's: the extremes start again too (0: none since) */
    d[i]->max = d[i]->min = 0;
  pthread_mutex_unlock(&h->lock);
  return CACHALOT_OK;
}

cachalot_status cachalot_host_reset_accumulated_stats(cachalot_allocator *a) {
  cl_host *h;
  cachalot_status rc = enter(a, "cachalot_host_reset_accumulated_stats", &h);
  if (rc != CACHALOT_OK)
    return rc;
  pthread_mutex_lock(&h->lock);
  cachalot_stat *s[4];
  stats_of(h, s);
  for (int i = 0; i < 4; i++)
    s[i]->allocated = s[i]->freed = 0;
  memset(&h->stats.host_alloc_time, 0, sizeof h->stats.host_alloc_time);
  memset(&h->stats.host_free_time, 0, sizeof h->stats.host_free_time);
  h->stats.num_host_alloc = h->stats.num_host_free = 0;
  pthread_mutex_unlock(&h->lock);
  return CACHALOT_OK;
}

cachalot_status cl_host_check(cl_host *h) {
  pthread_mutex_lock(&h->lock);
  cachalot_status rc = CACHALOT_OK;
  int64_t allocs = 0, alloc_bytes = 0, segs = 0, bytes = 0, waiting = 0, in_bins = 0, free_blocks = 0;
  for (int k = 0; k < BINS; k++) {
    for (host_block *b = h->bins[k]; b; b = b->next_free) {
      host_block *found = NULL;
      HASH_FIND_PTR(h->blocks, &b->ptr, found);
      if (found != b || b->allocated || b->n_events || b->kept || log2_of(b->size) != (unsigned)k ||
          (b->next_free && b->next_free->prev_free != b)) {
        rc = cl_fail(CACHALOT_ERROR_INVALID_STATE, "host cache: free list %d holds a block %p that is not a free "
                                                   "block of its size in the cache", k, b->ptr);
        goto out;
      }
      in_bins++;
    }
  }
  host_block *b, *tmp;
  HASH_ITER(hh, h->blocks, b, tmp) {
    if (!b->size || (b->size & (b->size - 1))) {
      rc = cl_fail(CACHALOT_ERROR_INVALID_STATE, "host cache: block %p has size %zu, not a power of two", b->ptr,
                   b->size);
      goto out;
    }
    if ((b->allocated && (b->n_events || b->kept)) || (!b->allocated && b->n_uses) || (b->kept && b->n_events)) {
      rc = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "host cache: block %p is %s with %u pending events and %u streams marked", b->ptr,
                   b->allocated ? "allocated" : "free", b->n_events, b->n_uses);
      goto out;
    }
    segs++;
    bytes += (int64_t)b->size;
    if (b->allocated) {
      allocs++;
      alloc_bytes += (int64_t)b->size;
    }
    waiting += b->n_events;
    if (!b->allocated && !b->n_events && !b->kept)
      free_blocks++;
  }
  if (in_bins != free_blocks || (size_t)waiting != h->n_pend) {
    rc = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "host cache: %" PRId64 " blocks in the free lists and %zu pending events, but %" PRId64
                 " free blocks and %" PRId64 " events expected",
                 in_bins, h->n_pend, free_blocks, waiting);
    goto out;
  }
  for (size_t i = 0; i < h->n_pend; i++) {
    host_block *f = NULL;
    HASH_FIND_PTR(h->blocks, &h->pend[i].blk->ptr, f);
    if (f != h->pend[i].blk || f->allocated || !f->n_events) {
      rc = cl_fail(CACHALOT_ERROR_INVALID_STATE, "host cache: pending event %zu names a block not waiting", i);
      goto out;
    }
  }
  const cachalot_host_stats *st = &h->stats;
  if (st->active_requests.current != allocs || st->active_bytes.current != alloc_bytes ||
      st->allocations.current != segs || st->allocated_bytes.current != bytes)
    rc = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "host cache: stats say %" PRId64 " active requests (%" PRId64 " bytes) of %" PRId64 " blocks (%" PRId64
                 " bytes), the blocks %" PRId64 " (%" PRId64 ") of %" PRId64 " (%" PRId64 ")",
                 st->active_requests.current, st->active_bytes.current, st->allocations.current,
                 st->allocated_bytes.current, allocs, alloc_bytes, segs, bytes);
out:
  pthread_mutex_unlock(&h->lock);
  return rc;
}
