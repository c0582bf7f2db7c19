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

/* Verifies every invariant of every device: blocks tile their segments in address order, no two
 * free neighbours, free lists hold exactly the free blocks, the pointer map exactly the allocated
 * ones, and every current stat equals the value recomputed from the blocks. CACHALOT_ERROR_INVALID_STATE
 * with the first violation in cachalot_last_error() otherwise. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_check(cachalot_allocator *a);

#ifdef __cplusplus
}
#endif
#endif
