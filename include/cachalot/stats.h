/* cachalot: memory statistics (PyTorch's torch.cuda.memory_stats() fields) and the self-check. */
#ifndef CACHALOT_STATS_H
#define CACHALOT_STATS_H

#include <stdint.h>

#include "allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* current, peak (highest current since the last reset_peak), allocated (sum of increases) and
 * freed (sum of decreases) since the last reset_accumulated. */
typedef struct {
  int64_t current, peak, allocated, freed;
} cachalot_stat;

enum { CACHALOT_STAT_ALL, CACHALOT_STAT_SMALL_POOL, CACHALOT_STAT_LARGE_POOL, CACHALOT_STAT_TYPES };

typedef struct {
  cachalot_stat allocation[3], segment[3], active[3], inactive_split[3], allocated_bytes[3],
      reserved_bytes[3], active_bytes[3], inactive_split_bytes[3], requested_bytes[3];
  cachalot_stat oversize_allocations, oversize_segments;
  int64_t num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc, num_device_free;
  int64_t max_split_size; /* -1 when unlimited */
} cachalot_device_stats;

/* A copy of `device`'s stats (torch.cuda.memory_stats()). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_memory_stats(cachalot_allocator *a, int device,
                                                                      cachalot_device_stats *out);
/* Every peak := current. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_reset_peak_stats(cachalot_allocator *a, int device);
/* allocated := freed := 0 for every stat, and the five counters := 0. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_reset_accumulated_stats(cachalot_allocator *a,
                                                                                 int device);

/* What the step plan of expandable_plan (preset:low_fragmentation) has done on a device: cachalot's own,
 * no PyTorch counterpart. A period is a repeating step found in the default pool's mallocs and frees; a
 * plan places one period's blocks in one range per (stream, kind) and serves the next periods from it. */
typedef struct {
  int64_t periods_found;  /* periods found, each planned or not */
  int64_t plans_formed;   /* plans made from them */
  int64_t plans_dropped;  /* plans dropped after a whole period of events that did not follow them */
  int64_t served;         /* mallocs handed the planned address */
  int64_t missed;         /* mallocs a plan expected whose planned range was not free: the online policy served them */
  int64_t unplanned;      /* mallocs a plan followed but left to the online policy (a block that outlives two
                             periods, or a plan too large to pack) */
  int64_t laps_clean;     /* whole periods served with no miss and no page mapped */
  int64_t device_calls_in_force; /* pages mapped and unmapped while a plan was in force (after its first
                                    clean lap, until it was dropped) */
  int64_t period;         /* the events (mallocs and frees) of the plan in force, 0 when none */
  int64_t footprint;      /* the bytes its ranges span, 0 when none */
  int in_force;           /* 1 while a plan is in force */
} cachalot_plan_stats;

/* A copy of `device`'s plan stats (all 0 without expandable_plan). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_plan_stats_get(cachalot_allocator *a, int device,
                                                                       cachalot_plan_stats *out);

/* Verifies every invariant of every device: blocks tile their segments in address order, no two
 * free neighbours, free lists hold exactly the free blocks, the pointer map exactly the allocated
 * ones, and every current stat equals the value recomputed from the blocks. CACHALOT_ERROR_INVALID_STATE
 * with the first violation in cachalot_last_error() otherwise. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_check(cachalot_allocator *a);

#ifdef __cplusplus
}
#endif
#endif
