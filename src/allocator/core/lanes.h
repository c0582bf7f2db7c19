/* Lanes (lane.c): the per-stream spin locks and stats shares of a device, exclusive mode over all of
 * them, and the stat changes the warm paths make into their lane's share. */
#ifndef CACHALOT_ALLOCATOR_LANES_H
#define CACHALOT_ALLOCATOR_LANES_H

#include "types.h"

#include <stdio.h>
#include <stdlib.h>

void cl_spin_lock_slow(cl_spin *l);
static inline void cl_spin_lock(cl_spin *l) {
  if (CL_LIKELY(!atomic_exchange_explicit(&l->held, 1, memory_order_acquire)))
    return;
  cl_spin_lock_slow(l);
}
static inline void cl_spin_unlock(cl_spin *l) { atomic_store_explicit(&l->held, 0, memory_order_release); }
/* One round of waiting on something another thread holds: pause, then yield, then sleep, by `round`. */
void cl_backoff(unsigned round);

static inline size_t cl_lane_hash(cachalot_stream s) {
  return (size_t)(((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 32);
}

/* Counting a stat up or down, keeping its peak and its accumulated totals. */
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
static inline void cl_stat_add(cachalot_stat *s, int64_t n) {
  if (n >= 0)
    cl_stat_inc(s, n);
  else
    cl_stat_dec(s, -n);
}
/* Updates all and the kind's entry of a stat array. */
static inline void cl_stat_array_add(cachalot_stat *arr, bool small, int64_t n) {
  cl_stat_add(&arr[CACHALOT_STAT_ALL], n);
  cl_stat_add(&arr[small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL], n);
}
/* Every stat array of cachalot_device_stats (CACHALOT_STAT_TYPES entries each), in PyTorch's key order: the
 * one list of them, which the stats resets, the stats JSON and cachalot_check expand with X(name). */
#define CL_STAT_ARRAYS(X)                                                                                      \
  X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes) X(reserved_bytes) X(active_bytes)      \
  X(inactive_split_bytes) X(requested_bytes)

/* The device lock alone, for a reader of what only exclusive mode writes (the config, the memory
 * fraction): exclusive mode's first step is that lock, so the reader sees no write half done, and no warm
 * path stops for it. */
static inline void cl_lock_device(cl_device *d) { pthread_mutex_lock(&d->lock); }
static inline void cl_unlock_device(cl_device *d) { pthread_mutex_unlock(&d->lock); }

/* Exclusive mode: the device lock, then every armed lane; their stats shares are folded into d->stats. */
void cl_enter_exclusive(cl_device *d);
/* Leaves exclusive mode: shares out room for the peaks again and sets the warm-path flags. */
void cl_leave_exclusive(cl_device *d);
/* The lane of `s`, made on first use, armed (exclusive mode). NULL on host OOM. */
cl_lane *cl_lane_get_locked(cl_device *d, cachalot_stream s);
/* Lanes go cold after this many exclusive sections without a warm path, while more than
 * CL_LANE_ARMED_MIN are armed (cl_lane): keeping an idle lane armed costs every section a lock and a fold,
 * arming it again costs its next call one slow path. */
enum { CL_LANE_IDLE_MAX = 16, CL_LANE_ARMED_MIN = 8 };
/* Marks a lane in use by this section's call: armed again if it was cold (exclusive mode). */
void cl_lane_arm_locked(cl_device *d, cl_lane *ln);
/* A cold lane's call, outside exclusive mode: arms the lane under the device mutex alone (the armed lanes
 * are not taken: nothing of theirs is touched but one lane cooled when more than CL_LANE_ARMED_MIN are
 * armed, the one idle longest, else the one armed last before), so that a stream whose lane went cold gets
 * its warm paths back for the price of a mutex, not of an exclusive section, and exclusive mode keeps
 * costing what the streams in use cost. True when it armed the lane: the warm path is to be tried again. */
bool cl_lane_arm_quick(cl_device *d, cl_lane *ln);
/* A warm path of lane ln found the pools short of room (ln->short_of_room): the device mutex taken, every
 * other armed lane gives its room back to the pools (each lane's lock for a moment), so that ln's warm path
 * can take it. True when it did: the warm path is to be tried again. */
bool cl_lane_gather_room(cl_device *d, cl_lane *ln);
/* Whether a lane may be cold (its flags 0: cold, dormant, or no warm path allowed), read without a lock:
 * only a hint for which way to go, cl_lane_arm_quick looks again under the mutex. */
CL_INLINE bool cl_lane_looks_cold(cl_lane *ln) { return atomic_load_explicit(&ln->warm, memory_order_relaxed) == 0; }
void cl_lanes_destroy_locked(cl_device *d);
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

/* Tops the spares of lane `ln` up from the device's, so its warm path can split (exclusive mode). */
void cl_lane_refill_spares_locked(cl_device *d, cl_lane *ln);

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

/* Who makes a change: the warm path of a lane (its lock alone, room in its stats shares checked first)
 * or exclusive mode. Passed to the inline steps both share, always as a constant, so each folds. */
typedef enum { CL_EXCLUSIVE, CL_WARM } cl_mode;

/* Split stat changes: in exclusive mode into the device's stats; on the warm path into lane ln's share. */
CL_INLINE void cl_count_split_locked(cl_device *d, bool small, int64_t blocks, int64_t bytes) {
  CL_ASSERT_EXCLUSIVE(d);
  if (blocks)
    cl_stat_array_add(d->stats.inactive_split, small, blocks);
  if (bytes)
    cl_stat_array_add(d->stats.inactive_split_bytes, small, bytes);
}
CL_INLINE void cl_count_split_warm(cl_lane *ln, bool small, int64_t blocks, int64_t bytes) {
  cl_lane_stat *e = ln->st[small];
  cl_share_add(&e[CL_LS_SPLIT], blocks);
  cl_share_add(&e[CL_LS_SPLIT_BYTES], bytes);
}
/* Either, by `mode`, for the steps the two share (the block's lane is ln). */
CL_INLINE void cl_count_split(cl_device *d, cl_lane *ln, cl_mode mode, bool small, int64_t blocks, int64_t bytes) {
  if (mode == CL_WARM)
    cl_count_split_warm(ln, small, blocks, bytes);
  else
    cl_count_split_locked(d, small, blocks, bytes);
}
/* Whether the warm path may make these split stat changes (taking room from the pools if need be). */
CL_INLINE bool cl_split_room(cl_lane *ln, bool small, int64_t blocks, int64_t bytes) {
  const cl_lane_stat *e = ln->st[small];
  if (CL_LIKELY((e[CL_LS_SPLIT].rem >= blocks) & (e[CL_LS_SPLIT_BYTES].rem >= bytes)))
    return true;
  const int64_t need[CL_LS_N] = {[CL_LS_SPLIT] = blocks, [CL_LS_SPLIT_BYTES] = bytes};
  return cl_lane_refill(ln, small, need, 0);
}

/* A block of `requested` bytes handed out (ALLOCATED): allocation, active and requested stats, in
 * exclusive mode into the device's stats, on the warm path into lane ln's share. */
CL_INLINE void cl_stats_hand_out_locked(cl_device *d, bool small, size_t size, size_t requested) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->allocation, small, 1);
  cl_stat_array_add(st->allocated_bytes, small, (int64_t)size);
  cl_stat_array_add(st->active, small, 1);
  cl_stat_array_add(st->active_bytes, small, (int64_t)size);
  cl_stat_array_add(st->requested_bytes, small, (int64_t)requested);
  if (CL_UNLIKELY(size >= d->cfg.max_split_size))
    cl_stat_inc(&st->oversize_allocations, 1);
}
CL_INLINE void cl_stats_hand_out_warm(const cl_device *d, cl_lane *ln, bool small, size_t size, size_t requested) {
  cl_lane_stat *e = ln->st[small];
  cl_share_up(&e[CL_LS_COUNT], 1);
  cl_share_up(&e[CL_LS_BYTES], (int64_t)size);
  cl_share_up(&e[CL_LS_REQUESTED], (int64_t)requested);
  if (CL_UNLIKELY(size >= d->cfg.max_split_size))
    cl_share_up(&ln->oversize, 1);
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

#endif
