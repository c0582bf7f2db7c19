/* Lanes: the per-stream part of a device, and exclusive mode over the armed ones.
 *
 * The warm paths (malloc.c, free.c) lock one lane. Everything else runs in exclusive mode, which takes the device
 * lock and then every armed lane (cl_lane: the lanes of the streams in use); the warm paths never wait for
 * anything while holding a lane, so no order of lanes can deadlock.
 *
 * Stats: a lane keeps a share of the stats its warm path changes, per kind (cl_lane_stat). Entering
 * exclusive mode folds every share into d->stats, so all code there sees exact numbers; leaving it puts
 * the room of each stat (peak - current) into the device's pools and hands each lane a part. A warm
 * path that needs more room takes it from the pools with atomic operations (cl_lane_refill), never
 * past what is there, and gives a surplus back; only when a pool is dry does it go to exclusive mode.
 * So the sum over lanes never passes a peak unseen: currents, totals and peaks are exact at every fold,
 * with any number of threads.
 */
#include "core.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void cl_lane_wait_stop(cl_device *d) {
  for (unsigned round = 0; atomic_load_explicit(&d->warm, memory_order_relaxed) & CL_WARM_STOP; round++)
    cl_backoff(round);
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

/* Adds a lane entry's changes since the last fold (net change `net`, increases `inc`) to a device stat. */
static void fold_into(cachalot_stat *s, int64_t net, int64_t inc) {
  s->current += net;
  s->allocated += inc;
  s->freed += inc - net;
}

/* Folds an entry into the `all` and `kind` parts of the stats it serves, and empties it: its room is
 * back in the books, and cl_leave_exclusive shares it out anew. Whether a warm path changed it. */
static bool fold_entry(cl_lane_stat *e, cachalot_stat *arr[2], int n, int kind) {
  const int64_t net = e->got - e->rem;
  for (int j = 0; j < n; j++) {
    fold_into(&arr[j][CACHALOT_STAT_ALL], net, e->inc);
    if (kind != CACHALOT_STAT_ALL)
      fold_into(&arr[j][kind], net, e->inc);
  }
  const bool changed = net != 0 || e->inc != 0;
  e->rem = e->got = e->inc = 0;
  return changed;
}

/* Folds every share of an armed lane into the device's stats. Whether any had changed. */
static bool fold_shares(cl_device *d, cl_lane *ln) {
  bool changed = false;
  for (int small = 0; small < 2; small++) {
    for (int id = 0; id < CL_LS_N; id++) {
      cachalot_stat *arr[2];
      const int n = shared_stats(&d->stats, id, arr);
      changed |= fold_entry(&ln->st[small][id], arr, n, small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL);
    }
  }
  cachalot_stat *ov[2] = {&d->stats.oversize_allocations, NULL};
  changed |= fold_entry(&ln->oversize, ov, 1, CACHALOT_STAT_ALL); /* it has only an `all` part */
  return changed;
}

/* Entering exclusive mode: every warm path changes a share, so a lane whose shares did not change was idle. */
static void fold_lane(cl_device *d, cl_lane *ln) { ln->idle = fold_shares(d, ln) ? 0 : ln->idle + 1; }

static void raise_peak(cachalot_stat *s) {
  if (s->current > s->peak)
    s->peak = s->current;
}

void cl_enter_exclusive(cl_device *d) {
  pthread_mutex_lock(&d->lock);
  atomic_fetch_or_explicit(&d->warm, CL_WARM_STOP, memory_order_relaxed);
  const size_t armed = d->n_armed;
  /* The lanes' lines are on their owners' cores: ask for them all at once, not one miss after another. */
  for (size_t i = 0; i < armed; i++)
    for (size_t off = 0; off < sizeof(cl_lane); off += 64)
      __builtin_prefetch((const char *)d->lanes[i] + off, 1);
  for (size_t i = 0; i < armed; i++) {
    atomic_store_explicit(&d->lanes[i]->warm, CL_WARM_STOP, memory_order_relaxed);
    cl_spin_lock(&d->lanes[i]->lock);
  }
#ifdef CL_DEBUG_LOCKS
  d->excl_owner = pthread_self();
  d->excl_held = true;
#endif
  if (!armed)
    return;
  for (size_t i = 0; i < armed; i++) {
    cl_lane_settle_memo(d, d->lanes[i]); /* every block where the rules put it, for what runs here */
    fold_lane(d, d->lanes[i]);
  }
  /* The room rule keeps every current at or below its peak; this only makes sure of it. */
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

/* A lane that gives room back keeps at least this much of a share, so that alloc/free pairs at the peak
 * do not send every free to the pools. */
static int64_t cap_for(size_t n_lanes, int64_t share) {
  if (n_lanes == 1)
    return INT64_MAX / 4; /* nobody to give it to */
  return 2 * share;
}

/* Hands a lane entry `t` of room straight from the pools (exclusive mode: no other thread looks). */
static void hand_room(cl_lane_stat *e, int64_t t, size_t n_lanes) {
  e->rem = e->got = t;
  e->cap = cap_for(n_lanes, t);
}

static void swap_lanes(cl_device *d, size_t i, size_t j) {
  cl_lane *t = d->lanes[i];
  d->lanes[i] = d->lanes[j];
  d->lanes[j] = t;
  d->lanes[i]->pos = i;
  d->lanes[j]->pos = j;
}

void cl_lane_arm_locked(cl_device *d, cl_lane *ln) {
  CL_ASSERT_EXCLUSIVE(d);
  /* (with the step tracker no warm path runs: an armed lane would only cost every exclusive mode its
   * lock and its shares) */
  if (ln->dormant || d->step)
    return;
  ln->idle = 0;
  if (ln->armed)
    return;
  cl_spin_lock(&ln->lock); /* a warm path may hold it for a moment: it finds the lane cold and lets go */
  atomic_store_explicit(&ln->warm, CL_WARM_STOP, memory_order_relaxed); /* until cl_leave_exclusive */
  ln->armed = true;
  if (!ln->bins)
    ln->bins = cl_bins_get_locked(d, &d->default_pool, ln->stream, false);
  swap_lanes(d, ln->pos, d->n_armed++);
}

/* A lane new to `lanes` (made, or woken), locked: armed, at the end of the armed ones (room reserved). */
static void join_armed(cl_device *d, cl_lane *ln) {
  ln->armed = true;
  ln->idle = 0;
  ln->pos = d->n_lanes;
  d->lanes[d->n_lanes++] = ln;
  swap_lanes(d, ln->pos, d->n_armed++);
}

/* Armed lane ln (locked, its shares folded) goes cold: out of the armed ones, no warm path. */
static void go_cold(cl_device *d, cl_lane *ln) {
  ln->armed = false;
  atomic_store_explicit(&ln->warm, 0, memory_order_relaxed);
  swap_lanes(d, ln->pos, --d->n_armed);
}

/* Lanes idle through CL_LANE_IDLE_MAX sections go cold (see cl_lane), down to CL_LANE_ARMED_MIN armed.
 * Their shares are empty: entering exclusive mode folded them, and nothing has changed them since. */
static size_t armed_min(const cl_device *d) { return d->step ? 0 : CL_LANE_ARMED_MIN; }
static void cool_idle_lanes(cl_device *d) {
  /* (with the step tracker every lane goes: no warm path runs) */
  for (size_t i = d->n_armed; i-- > 0 && d->n_armed > armed_min(d);) {
    cl_lane *ln = d->lanes[i];
    if (ln->idle < CL_LANE_IDLE_MAX && !d->step)
      continue;
    go_cold(d, ln); /* the lane moved to i was looked at already: the loop goes down */
    cl_spin_unlock(&ln->lock);
  }
}

/* Leaving exclusive mode: the room of every stat (peak - current) goes into its pools, and each armed
 * lane is handed a part at once, so that a lane's next warm paths need no atomic operation: of kind k it
 * gets min(room_k, room_all / 2) / lanes, which leaves the pools non-negative (two kinds draw on
 * room_all). */
void cl_leave_exclusive(cl_device *d) {
  if (d->n_armed > armed_min(d))
    cool_idle_lanes(d);
  const size_t L = d->n_armed;
  if (L) {
    for (int id = 0; id < CL_LS_N; id++) {
      cachalot_stat *arr[2];
      const int n = shared_stats(&d->stats, id, arr);
      int64_t room[CACHALOT_STAT_TYPES];
      for (int k = 0; k < CACHALOT_STAT_TYPES; k++)
        room[k] = room_of(arr, n, k);
      for (int small = 0; small < 2; small++) {
        const int kind = small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
        int64_t each = room[kind] < room[CACHALOT_STAT_ALL] / 2 ? room[kind] : room[CACHALOT_STAT_ALL] / 2;
        each /= (int64_t)L;
        for (size_t i = 0; i < L; i++)
          hand_room(&d->lanes[i]->st[small][id], each, L);
        room[kind] -= each * (int64_t)L;
        room[CACHALOT_STAT_ALL] -= each * (int64_t)L;
      }
      for (int k = 0; k < CACHALOT_STAT_TYPES; k++)
        atomic_store_explicit(&d->room[id][k], room[k], memory_order_relaxed);
    }
    cachalot_stat *ov[2] = {&d->stats.oversize_allocations, NULL};
    int64_t room = room_of(ov, 1, 0);
    const int64_t each = room / (int64_t)L;
    for (size_t i = 0; i < L; i++)
      hand_room(&d->lanes[i]->oversize, each, L);
    atomic_store_explicit(&d->room_oversize, room - each * (int64_t)L, memory_order_relaxed);
  }
  const bool gc = d->fraction >= 0 && d->cfg.gc_threshold > 0;
  const bool traced = d->trace.cap != 0; /* the warm paths record then, but no stacks and no contexts */
  /* the step tracker (expandable_plan) sees every malloc and free of the default pool: in exclusive mode */
  const bool fast_free = (!traced || (!d->trace.frames && !d->owner->ctx_ops.retain)) && !d->block_ctx && !d->step;
  /* a route is asked per call (its filter) which pool a stream's malloc goes to */
  const bool fast_malloc = fast_free && d->n_routes == 0;
  const bool poll = d->n_pending_events != 0 || d->n_deferred != 0;
  /* (deferred blocks: the next poll inserts them; an unwatched event: the next poll asks for it) */
  const bool watch = poll && d->n_deferred == 0 && d->done_word && d->n_unwatched == 0;
  const unsigned char warm = (fast_malloc ? CL_WARM_MALLOC : 0) | (fast_free ? CL_WARM_FREE : 0) |
                             (traced ? CL_WARM_TRACE : 0) | (poll ? CL_WARM_POLL : 0) | (watch ? CL_WARM_WATCH : 0) |
                             (gc ? CL_WARM_GC : 0);
  d->warm_flags = warm;
  atomic_store_explicit(&d->armed_hint, (uint32_t)d->n_armed, memory_order_relaxed);
  atomic_store_explicit(&d->warm, 0, memory_order_relaxed); /* STOP off; the flags go to the lanes below */
#ifdef CL_DEBUG_LOCKS
  d->excl_held = false;
#endif
  const unsigned char solo = L == 1 && traced ? CL_WARM_SOLO : 0;
  for (size_t i = L; i-- > 0;) {
    cl_lane *ln = d->lanes[i];
    /* malloc's warm path needs the stream's free index: without one, it is not even tried */
    const unsigned char w = (unsigned char)(ln->bins ? warm : warm & ~CL_WARM_MALLOC);
    atomic_store_explicit(&ln->warm, (unsigned char)(w | solo), memory_order_relaxed);
    cl_spin_unlock(&ln->lock);
  }
  pthread_mutex_unlock(&d->lock);
}

/* Takes `t` from one pool or two (`b` may be NULL): all or nothing. A pool may dip below zero for a
 * moment when two lanes race; the loser puts its part back and goes to exclusive mode, which is safe. */
static bool take_room(_Atomic int64_t *a, _Atomic int64_t *b, int64_t t) {
  if (atomic_fetch_sub_explicit(a, t, memory_order_relaxed) < t) {
    atomic_fetch_add_explicit(a, t, memory_order_relaxed);
    return false;
  }
  if (b && atomic_fetch_sub_explicit(b, t, memory_order_relaxed) < t) {
    atomic_fetch_add_explicit(b, t, memory_order_relaxed);
    atomic_fetch_add_explicit(a, t, memory_order_relaxed);
    return false;
  }
  return true;
}

/* Tops entry e up to at least `need` from pool `a` (and `b`): a fair part of what is there, so that the
 * lanes do not come back for every call, and never less than what is missing. */
static bool top_up(cl_lane_stat *e, int64_t need, _Atomic int64_t *a, _Atomic int64_t *b, size_t n_lanes) {
  if (e->rem >= need)
    return true;
  int64_t avail = atomic_load_explicit(a, memory_order_relaxed);
  if (b) {
    const int64_t vb = atomic_load_explicit(b, memory_order_relaxed);
    avail = vb < avail ? vb : avail;
  }
  const int64_t missing = need - e->rem;
  int64_t t = avail / (2 * (int64_t)n_lanes);
  if (t < missing)
    t = missing;
  if (t > avail || !take_room(a, b, t))
    return false;
  e->rem += t;
  e->got += t;
  if (e->cap < 2 * e->rem)
    e->cap = 2 * e->rem;
  return true;
}

/* Gives `g` of entry e's rem back to pool `a` (and `b`): take_room's counterpart. */
static void return_room(cl_lane_stat *e, _Atomic int64_t *a, _Atomic int64_t *b, int64_t g) {
  e->rem -= g;
  e->got -= g;
  atomic_fetch_add_explicit(a, g, memory_order_relaxed);
  if (b)
    atomic_fetch_add_explicit(b, g, memory_order_relaxed);
}

static bool refill(cl_lane *ln, bool small, const int64_t need[CL_LS_N], int64_t need_ov) {
  cl_device *d = ln->dev;
  const uint32_t hint = atomic_load_explicit(&d->armed_hint, memory_order_relaxed);
  const size_t n_lanes = hint ? hint : 1;
  const int kind = small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
  for (int id = 0; id < CL_LS_N; id++) {
    cl_lane_stat *e = &ln->st[small][id];
    if (top_up(e, need[id], &d->room[id][kind], &d->room[id][CACHALOT_STAT_ALL], n_lanes))
      continue;
    /* The all pool may be dry only because this lane's entry of the other kind holds the room (a large
     * block freed, a small one wanted): that room goes back first. */
    cl_lane_stat *other = &ln->st[!small][id];
    if (other->rem <= 0)
      return false;
    return_room(other, &d->room[id][small ? CACHALOT_STAT_LARGE_POOL : CACHALOT_STAT_SMALL_POOL],
                &d->room[id][CACHALOT_STAT_ALL], other->rem);
    if (!top_up(e, need[id], &d->room[id][kind], &d->room[id][CACHALOT_STAT_ALL], n_lanes))
      return false;
  }
  return top_up(&ln->oversize, need_ov, &d->room_oversize, NULL, n_lanes);
}

bool cl_lane_refill(cl_lane *ln, bool small, const int64_t need[CL_LS_N], int64_t need_ov) {
  if (refill(ln, small, need, need_ov))
    return true;
  atomic_store_explicit(&ln->short_of_room, true, memory_order_relaxed);
  return false;
}

/* Every entry's room back to its pools (its lane locked). */
static void return_all_room(cl_device *d, cl_lane *v) {
  for (int small = 0; small < 2; small++) {
    const int kind = small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
    for (int id = 0; id < CL_LS_N; id++)
      if (v->st[small][id].rem > 0)
        return_room(&v->st[small][id], &d->room[id][kind], &d->room[id][CACHALOT_STAT_ALL], v->st[small][id].rem);
  }
  if (v->oversize.rem > 0)
    return_room(&v->oversize, &d->room_oversize, NULL, v->oversize.rem);
}

bool cl_lane_gather_room(cl_device *d, cl_lane *ln) {
  if (!atomic_load_explicit(&ln->short_of_room, memory_order_relaxed) ||
      (atomic_load_explicit(&d->warm, memory_order_relaxed) & CL_WARM_STOP))
    return false;
  pthread_mutex_lock(&d->lock); /* no exclusive mode meanwhile, and one gatherer at a time */
  const bool gather = ln->armed;
  if (gather) {
    for (size_t i = 0; i < d->n_armed; i++) {
      cl_lane *v = d->lanes[i];
      if (v == ln)
        continue;
      cl_spin_lock(&v->lock); /* its warm path may be running: after it */
      return_all_room(d, v);
      cl_spin_unlock(&v->lock);
    }
    atomic_store_explicit(&ln->short_of_room, false, memory_order_relaxed);
  }
  pthread_mutex_unlock(&d->lock);
  return gather;
}

/* Gives the part of e's rem above half its cap back to pool `a` (and `b`). */
static void give_back(cl_lane_stat *e, _Atomic int64_t *a, _Atomic int64_t *b) {
  if (e->rem > e->cap) /* cap >= 0: what goes back is positive */
    return_room(e, a, b, e->rem - e->cap / 2);
}

void cl_lane_trim(cl_lane *ln, bool small) {
  cl_device *d = ln->dev;
  const int kind = small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
  for (int id = 0; id < CL_LS_N; id++)
    give_back(&ln->st[small][id], &d->room[id][kind], &d->room[id][CACHALOT_STAT_ALL]);
  give_back(&ln->oversize, &d->room_oversize, NULL);
}

/* Cools armed lane `v` outside exclusive mode (cl_lane_arm_quick: the device mutex held): what its
 * shares changed goes into the device's stats and the room they hold back to the pools, as entering and
 * leaving exclusive mode would have done. */
static void cool_quick(cl_device *d, cl_lane *v) {
  cl_spin_lock(&v->lock); /* its warm path may be running: after it */
  cl_lane_settle_memo(d, v);
  return_all_room(d, v);
  (void)fold_shares(d, v);
  go_cold(d, v);
  atomic_store_explicit(&d->armed_hint, (uint32_t)d->n_armed, memory_order_relaxed);
  cl_spin_unlock(&v->lock);
}

/* The one armed lane `v` (the device mutex held) records under the ring's lock from its next call on. */
static void take_solo_back(cl_lane *v) {
  cl_spin_lock(&v->lock); /* its warm path may be recording: after it */
  const unsigned char w = atomic_load_explicit(&v->warm, memory_order_relaxed);
  atomic_store_explicit(&v->warm, (unsigned char)(w & ~CL_WARM_SOLO), memory_order_relaxed);
  cl_spin_unlock(&v->lock);
}

bool cl_lane_arm_quick(cl_device *d, cl_lane *ln) {
  if (atomic_load_explicit(&d->warm, memory_order_relaxed) & CL_WARM_STOP)
    return false; /* a thread enters exclusive mode: the call goes there too */
  pthread_mutex_lock(&d->lock);
  const bool arm = !ln->armed && !ln->dormant && !d->step;
  if (arm) {
#ifdef CL_DEBUG_LOCKS
    /* The books this reads (the default pool's free indexes) are the mutex holder's. */
    d->excl_owner = pthread_self();
    d->excl_held = true;
#endif
    if (d->n_armed == 1) /* before ln records too: the one armed lane's entries take the ring's lock again */
      take_solo_back(d->lanes[0]);
    cl_spin_lock(&ln->lock); /* a warm path may hold it for a moment: it finds the lane cold and lets go */
    assert(!ln->memo); /* settled where it went cold */
    ln->armed = true;
    ln->idle = 0;
    if (!ln->bins)
      ln->bins = cl_bins_get_locked(d, &d->default_pool, ln->stream, false);
    swap_lanes(d, ln->pos, d->n_armed++);
    atomic_store_explicit(&d->armed_hint, (uint32_t)d->n_armed, memory_order_relaxed);
    unsigned char w = d->warm_flags;
    if (d->n_armed == 1 && (w & CL_WARM_TRACE))
      w |= CL_WARM_SOLO;
    atomic_store_explicit(&ln->warm, ln->bins ? w : (unsigned char)(w & ~CL_WARM_MALLOC), memory_order_relaxed);
    cl_spin_unlock(&ln->lock);
    if (d->n_armed > CL_LANE_ARMED_MIN) { /* the lane idle longest goes (the latest armed before this one on a tie) */
      size_t victim = d->n_armed - 2;
      for (size_t i = 0; i + 1 < d->n_armed; i++)
        if (d->lanes[i]->idle > d->lanes[victim]->idle)
          victim = i;
      cool_quick(d, d->lanes[victim]);
    }
#ifdef CL_DEBUG_LOCKS
    d->excl_held = false;
#endif
  }
  pthread_mutex_unlock(&d->lock);
  return arm;
}

/* Adds `ln` to the lock-free index, growing it (a new copy) at half full. False on host OOM. */
static bool index_add_locked(cl_device *d, cl_lane *ln) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_lane_index *t = atomic_load_explicit(&d->lane_index, memory_order_relaxed);
  if (!t || (d->n_all_lanes + 1) * 2 > t->mask + 1) {
    size_t cap = t ? (t->mask + 1) * 2 : LANE_INDEX_INITIAL;
    cl_lane_index *bigger = calloc(1, sizeof *bigger + cap * sizeof bigger->slot[0]);
    if (!bigger)
      return false;
    bigger->mask = cap - 1;
    bigger->older = t;
    for (size_t i = 0; i < d->n_all_lanes; i++) { /* dormant lanes too: their streams find them again */
      size_t j = cl_lane_hash(d->all_lanes[i]->stream) & bigger->mask;
      while (atomic_load_explicit(&bigger->slot[j], memory_order_relaxed))
        j = (j + 1) & bigger->mask;
      atomic_store_explicit(&bigger->slot[j], d->all_lanes[i], memory_order_relaxed);
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

/* Room for one more entry in an array of lane pointers. */
static bool lanes_reserve(cl_lane ***v, size_t n, size_t *cap) {
  if (n < *cap)
    return true;
  size_t c = *cap ? *cap * 2 : 8;
  cl_lane **nv = realloc(*v, c * sizeof *nv);
  if (!nv)
    return false;
  *v = nv;
  *cap = c;
  return true;
}

cl_lane *cl_lane_get_locked(cl_device *d, cachalot_stream s) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_lane *ln = cl_lane_find(d, s);
  if (ln && !ln->dormant) {
    cl_lane_arm_locked(d, ln);
    return ln;
  }
  if (!lanes_reserve(&d->lanes, d->n_lanes, &d->cap_lanes))
    return NULL;
  if (ln) {
    /* Wake it, armed: locked as exclusive mode holds every armed lane (a warm path may hold it for a
     * moment: it finds `warm` 0 and lets go). Its stats shares were folded before it slept. */
    cl_spin_lock(&ln->lock);
    ln->dormant = false;
    join_armed(d, ln);
    return ln;
  }
  if (!lanes_reserve(&d->all_lanes, d->n_all_lanes, &d->cap_all_lanes))
    return NULL;
  ln = aligned_alloc(_Alignof(cl_lane), sizeof *ln);
  if (!ln)
    return NULL;
  memset(ln, 0, sizeof *ln);
  ln->stream = s;
  ln->dev = d;
  /* Exclusive mode holds every armed lane: the new one is born locked, and cl_leave_exclusive releases it
   * and hands it its first room. */
  atomic_store_explicit(&ln->lock.held, 1, memory_order_relaxed);
  if (!index_add_locked(d, ln)) {
    free(ln);
    return NULL;
  }
  join_armed(d, ln);
  d->all_lanes[d->n_all_lanes++] = ln;
  return ln;
}

void cl_lane_refill_spares_locked(cl_device *d, cl_lane *ln) {
  CL_ASSERT_EXCLUSIVE(d);
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
  CL_ASSERT_EXCLUSIVE(d);
  for (size_t i = 0; i < d->n_all_lanes; i++) {
    cl_lane *ln = d->all_lanes[i];
    for (cl_block *b = ln->spare; b; b = b->next)
      free(b->uses);
    free(ln);
  }
  free(d->lanes);
  free(d->all_lanes);
  d->lanes = d->all_lanes = NULL;
  d->n_lanes = d->cap_lanes = d->n_all_lanes = d->cap_all_lanes = 0;
  cl_lane_index *t = atomic_load_explicit(&d->lane_index, memory_order_relaxed);
  while (t) {
    cl_lane_index *older = t->older;
    free(t);
    t = older;
  }
  atomic_store_explicit(&d->lane_index, NULL, memory_order_relaxed);
}
