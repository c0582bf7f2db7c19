/* cachalot: the caching pinned-host allocator (PyTorch's caching host allocator, what pin_memory() and
 * asynchronous host<->device copies use).
 *
 * Pinning host memory costs milliseconds and giving it back synchronizes the device, so freed blocks are
 * cached and reused. A request is rounded up to a power of two and served by a free block of exactly that
 * size, else by a new pinning of that size; blocks are never split or merged. A block that
 * cachalot_host_record_event marked as used by streams is reused only after an event recorded on each of
 * those streams at free time has completed; one freed without such marks is reusable at once.
 *
 * The host cache belongs to an allocator (cachalot_create) and shares its config: the keys
 * pinned_use_cuda_host_register and pinned_num_register_threads (docs/config.md) choose how blocks are
 * pinned. All functions are thread-safe.
 */
#ifndef CACHALOT_HOST_H
#define CACHALOT_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "allocator.h"
#include "stats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Time spent in pinning calls (cudaHostAlloc or registering) or unpinning ones, in microseconds: total,
 * longest, shortest and count since the last reset_accumulated (max and min start again at 0 with
 * reset_peak). */
typedef struct {
  int64_t total, max, min, count;
} cachalot_duration_stat;

/* torch.cuda.host_memory_stats(): `allocations` counts the blocks the cache holds pinned (handed out or
 * cached) and `allocated_bytes` their bytes; `active_requests` and `active_bytes` the blocks handed out;
 * num_host_alloc and num_host_free the pinnings and unpinnings, host_alloc_time and host_free_time
 * their time. Sizes are the blocks' (rounded up). */
typedef struct {
  cachalot_stat allocations, allocated_bytes, active_requests, active_bytes;
  cachalot_duration_stat host_alloc_time, host_free_time;
  int64_t num_host_alloc, num_host_free;
} cachalot_host_stats;

/* Allocates at least `size` bytes of pinned host memory (a block of the next power of two). size 0
 * gives *out = NULL and succeeds. CACHALOT_ERROR_OUT_OF_MEMORY when no free block fits and the memory
 * cannot be pinned, also after giving the cache's free blocks back and trying once more. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_malloc(cachalot_allocator *a, size_t size, void **out);

/* Frees a pointer from cachalot_host_malloc. NULL is a no-op. A pointer that is not the start of an
 * allocated block of this cache is CACHALOT_ERROR_INVALID_POINTER and changes nothing. When recording an
 * event on a marked stream fails, the block stays allocated and the error is returned. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_free(cachalot_allocator *a, void *ptr);

/* Marks the allocated block `ptr` as used by stream `s` (NULL: the default stream of `device`; a
 * non-NULL stream may be of any device): after its free, it is reused only once the work enqueued on `s`
 * before that free has completed. PyTorch's CachingHostAllocator_recordEvent. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_record_event(cachalot_allocator *a, void *ptr,
                                                                           int device, cachalot_stream s);

/* Gives every free block back (cudaFreeHost / cudaHostUnregister). Blocks still allocated, and freed
 * blocks whose streams have not finished with them, stay. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_empty_cache(cachalot_allocator *a);

/* A copy of the host cache's stats. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_memory_stats(cachalot_allocator *a,
                                                                           cachalot_host_stats *out);
/* Every peak := current; the durations' max and min := 0. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_reset_peak_stats(cachalot_allocator *a);
/* allocated := freed := 0 for the four stats; the two durations and the two counters := 0. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_host_reset_accumulated_stats(cachalot_allocator *a);

#ifdef __cplusplus
}
#endif
#endif
