/* cachalot: stats as JSON, memory history, and snapshots in PyTorch's schema (SPEC.md §4 JSON, §7).
 * JSON strings are malloc'ed; the caller frees them with free(). */
#ifndef CACHALOT_SNAPSHOT_H
#define CACHALOT_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>

#include "allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `device`'s memory_stats as one flat JSON object with torch.cuda.memory_stats()'s sorted, dot-joined
 * keys ("active.all.current", ..., "requested_bytes.small_pool.peak"). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_memory_stats_json(cachalot_allocator *a, int device,
                                                                           char **json);

/* Starts (enabled) or stops recording trace entries (alloc, free_requested, free_completed, segment_alloc,
 * segment_free, segment_map, segment_unmap, oom, snapshot) into a ring buffer of max_entries per device (oldest dropped first). Turning
 * it on again clears the buffer. Off by default; costs nothing when off. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_record_history(cachalot_allocator *a, bool enabled,
                                                                        size_t max_entries);

/* Records C call stacks ("frames": name, filename, line) with alloc and free entries while history is on.
 * Off by default. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_record_history_stacks(cachalot_allocator *a, bool enabled);

/* The snapshot of every device: {"segments": [...], "device_traces": [[...] per device],
 * "allocator_settings": {...}} in torch.cuda.memory._snapshot()'s schema, plus pool ids. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_snapshot_json(cachalot_allocator *a, char **json);

#ifdef __cplusplus
}
#endif
#endif
