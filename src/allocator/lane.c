/* Lanes: the per-stream part of a device, and exclusive mode over all of them.
 *
 * The warm paths (fast.c) lock one lane. Everything else runs in exclusive mode, which takes the device
 * lock and then every lane in creation order; the warm paths never wait for the device lock while
 * holding a lane, so the order cannot deadlock.
 *
 * Stats: a lane keeps a share of the stats its warm path changes (cl_lane_stat). Entering exclusive mode
 * folds every share into d->stats, so all code there sees exact numbers; leaving it shares out room
 * again: for each stat, peak - current is divided among the lanes (share_room). A warm path never grows a share past its room (it goes to
 * exclusive mode instead), so the sum over lanes never passes the peak unseen: currents, totals and
 * peaks are exact at every fold, with any number of threads.
 */
#include "internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

void cl_spin_lock_slow(cl_spin *l) {
  for (unsigned spins = 0;; spins++) {
    if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
        !atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
      return;
    if (spins < 128) {
      cpu_relax();
    } else if (spins < 1024) {
      sched_yield();
    } else {
      /* The holder may be in exclusive mode across a device call (release_lock_on_cudamalloc:False). */
      struct timespec ts = {0, 50 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

enum { LANE_INDEX_INITIAL = 16 };

/* The device stats a lane share stands for: one, or the two it serves (see CL_LS_COUNT). */
static int shared_stats(cachalot_device_stats *st, int id, cachalot_stat *out[2]) {
  switch (id) {
  case CL_LS_COUNT: out[0] = st->allocation; out[1] = st->active; return 2;
  case CL_LS_BYTES: out[0] = st->allocated_bytes; out[1] = st->active_bytes; return 2;
  case CL_LS_REQUESTED: out[0] = st->requested_bytes; return 1;
  case CL_LS_SPLIT: out[0] = st->inactive_split; return 1;
  default: out[0] = st->inactive_split_bytes; return 1;
  }
}

static void fold_stat(const cl_lane_stat *e, cachalot_stat *s) {
  const int64_t net = e->start - e->room;
  s->current += net;
  s->allocated += e->inc;
  s->freed += e->inc - net;
}

static void close_share(cl_lane_stat *e) {
  e->held += e->start - e->room;
  if (e->held > e->high)
    e->high = e->held;
  e->inc = 0;
  e->start = e->room; /* no net change until the room is shared out again */
}

static void fold_lane(cl_device *d, cl_lane *ln) {
  for (int id = 0; id < CL_LS_N; id++) {
    cachalot_stat *arr[2];
    const int n = shared_stats(&d->stats, id, arr);
    for (int k = 0; k < CACHALOT_STAT_TYPES; k++) {
      cl_lane_stat *e = &ln->st[id][k];
      for (int j = 0; j < n; j++)
        fold_stat(e, &arr[j][k]);
      close_share(e);
    }
  }
  fold_stat(&ln->oversize, &d->stats.oversize_allocations);
  close_share(&ln->oversize);
}

static void raise_peak(cachalot_stat *s) {
  if (s->current > s->peak)
    s->peak = s->current;
}

void cl_lock(cl_device *d) {
  pthread_mutex_lock(&d->lock);
  for (size_t i = 0; i < d->n_lanes; i++)
    cl_spin_lock(&d->lanes[i]->lock);
  if (!d->n_lanes)
    return;
  for (size_t i = 0; i < d->n_lanes; i++)
    fold_lane(d, d->lanes[i]);
  for (int id = 0; id < CL_LS_N; id++) {
    cachalot_stat *arr[2];
    const int n = shared_stats(&d->stats, id, arr);
    for (int j = 0; j < n; j++)
      for (int k = 0; k < CACHALOT_STAT_TYPES; k++)
        raise_peak(&arr[j][k]);
  }
  raise_peak(&d->stats.oversize_allocations);
}

/* The room of a stat: how far its current value may rise before its peak would, for the smaller of the
 * two stats a share may serve. */
static int64_t room_of(cachalot_stat *arr[2], int n, int type) {
  int64_t room = arr[0][type].peak - arr[0][type].current;
  if (n == 2 && arr[1][type].peak - arr[1][type].current < room)
    room = arr[1][type].peak - arr[1][type].current;
  return room > 0 ? room : 0;
}

/* Shares `room` among the lanes' entries at `off` within cl_lane. When it covers what every lane is
 * likely to grow back to (high - held: lanes taking turns, as alloc/free pairs on several streams do),
 * each gets that first; otherwise (lanes wandering independently) wants predict little and an even
 * split makes the fewest lanes run out. What is left is split evenly. */
static int64_t want_of(const cl_lane_stat *x) { return x->high - x->held > 0 ? x->high - x->held : 0; }

static void share_room(cl_device *d, size_t off, int64_t room) {
  int64_t wants = 0;
  for (size_t i = 0; i < d->n_lanes; i++)
    wants += want_of((const cl_lane_stat *)((const char *)d->lanes[i] + off));
  const bool by_want = wants <= room;
  const int64_t each = (room - (by_want ? wants : 0)) / (int64_t)d->n_lanes;
  for (size_t i = 0; i < d->n_lanes; i++) {
    cl_lane_stat *x = (cl_lane_stat *)((char *)d->lanes[i] + off);
    x->room = (by_want ? want_of(x) : 0) + each;
    x->start = x->room;
  }
}

void cl_unlock(cl_device *d) {
  if (d->n_lanes) {
    for (int id = 0; id < CL_LS_N; id++) {
      cachalot_stat *arr[2];
      const int n = shared_stats(&d->stats, id, arr);
      for (int k = 0; k < CACHALOT_STAT_TYPES; k++)
        share_room(d, offsetof(cl_lane, st) + ((size_t)id * CACHALOT_STAT_TYPES + (size_t)k) * sizeof(cl_lane_stat),
                   room_of(arr, n, k));
    }
    cachalot_stat *ov[2] = {&d->stats.oversize_allocations, NULL};
    share_room(d, offsetof(cl_lane, oversize), room_of(ov, 1, 0));
  }
  const bool gc = d->fraction >= 0 && d->cfg.gc_threshold > 0;
  d->fast_free = d->trace.cap == 0 && !gc;
  d->fast_malloc = d->fast_free && d->n_routes == 0 && d->n_pending_events == 0 && d->n_deferred == 0;
  for (size_t i = d->n_lanes; i-- > 0;)
    cl_spin_unlock(&d->lanes[i]->lock);
  pthread_mutex_unlock(&d->lock);
}

/* Adds `ln` to the lock-free index, growing it (a new copy) at half full. False on host OOM. */
static bool index_add_locked(cl_device *d, cl_lane *ln) {
  cl_lane_index *t = atomic_load_explicit(&d->lane_index, memory_order_relaxed);
  if (!t || (d->n_lanes + 1) * 2 > t->mask + 1) {
    size_t cap = t ? (t->mask + 1) * 2 : LANE_INDEX_INITIAL;
    cl_lane_index *bigger = calloc(1, sizeof *bigger + cap * sizeof bigger->slot[0]);
    if (!bigger)
      return false;
    bigger->mask = cap - 1;
    bigger->older = t;
    for (size_t i = 0; i < d->n_lanes; i++) {
      size_t j = cl_lane_hash(d->lanes[i]->stream) & bigger->mask;
      while (atomic_load_explicit(&bigger->slot[j], memory_order_relaxed))
        j = (j + 1) & bigger->mask;
      atomic_store_explicit(&bigger->slot[j], d->lanes[i], memory_order_relaxed);
    }
    atomic_store_explicit(&d->lane_index, bigger, memory_order_release);
    t = bigger;
  }
  size_t j = cl_lane_hash(ln->stream) & t->mask;
  while (atomic_load_explicit(&t->slot[j], memory_order_relaxed))
    j = (j + 1) & t->mask;
  atomic_store_explicit(&t->slot[j], ln, memory_order_release);
  return true;
}

cl_lane *cl_lane_get_locked(cl_device *d, cachalot_stream s) {
  cl_lane *ln = cl_lane_find(d, s);
  if (ln)
    return ln;
  if (d->n_lanes == d->cap_lanes) {
    size_t cap = d->cap_lanes ? d->cap_lanes * 2 : 8;
    cl_lane **lanes = realloc(d->lanes, cap * sizeof *lanes);
    if (!lanes)
      return NULL;
    d->lanes = lanes;
    d->cap_lanes = cap;
  }
  ln = aligned_alloc(_Alignof(cl_lane), sizeof *ln);
  if (!ln)
    return NULL;
  memset(ln, 0, sizeof *ln);
  ln->stream = s;
  ln->dev = d;
  if (!cl_map_init(&ln->map)) {
    free(ln);
    return NULL;
  }
  /* Exclusive mode holds every lane: the new one is born locked, and cl_unlock releases it. Its stats
   * share starts with no room: its first growth goes through exclusive mode. */
  atomic_store_explicit(&ln->lock.held, 1, memory_order_relaxed);
  d->lanes[d->n_lanes] = ln;
  if (!index_add_locked(d, ln)) {
    cl_map_destroy(&ln->map);
    free(ln);
    return NULL;
  }
  d->n_lanes++;
  return ln;
}

void cl_lane_refill_spares_locked(cl_device *d, cl_lane *ln) {
  enum { LOW = 4, TOP_UP = 16 };
  if (ln->n_spare >= LOW)
    return;
  while (ln->n_spare < TOP_UP) {
    cl_block *b = cl_block_new_locked(d);
    if (!b)
      return; /* the warm path falls back to exclusive mode, which reports the host OOM */
    b->next = ln->spare;
    ln->spare = b;
    ln->n_spare++;
  }
}

void cl_lanes_destroy_locked(cl_device *d) {
  for (size_t i = 0; i < d->n_lanes; i++) {
    cl_lane *ln = d->lanes[i];
    for (cl_block *b = ln->spare; b; b = b->next)
      free(b->uses);
    cl_map_destroy(&ln->map);
    free(ln);
  }
  free(d->lanes);
  d->lanes = NULL;
  d->n_lanes = d->cap_lanes = 0;
  cl_lane_index *t = atomic_load_explicit(&d->lane_index, memory_order_relaxed);
  while (t) {
    cl_lane_index *older = t->older;
    free(t);
    t = older;
  }
  atomic_store_explicit(&d->lane_index, NULL, memory_order_relaxed);
}
