/* cachalot: private memory pools (PyTorch's private pools), the memory of CUDA graphs.
 *
 * A private pool has its own free blocks and segments, apart from the device's default pools. While a
 * begin_allocate_to_pool routing is active, every malloc on that device asks the routing filters, most
 * recent first, whether its stream belongs to them; the first that says yes serves the request from its
 * pool. Filters are called with the device's lock held: they must be quick and must not call cachalot.
 */
#ifndef CACHALOT_POOL_H
#define CACHALOT_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A pool id: at most one half non-zero. {0,0} names the default pools; graph captures without a given
 * pool use {n,0}; cachalot_graph_pool_handle hands out {0,n}. */
typedef struct {
  uint64_t first, second;
} cachalot_mempool_id;

typedef bool (*cachalot_stream_filter)(cachalot_stream s, void *ctx);

/* A new id {0, n} for a pool to be shared by several graphs (counter from 1, never reused). {0,0} when
 * `a` is NULL. */
CACHALOT_API cachalot_mempool_id cachalot_graph_pool_handle(cachalot_allocator *a);

/* Starts routing mallocs on `device` whose stream passes `filter` to pool `id` (made with use count 1, or
 * given one more use). Errors: {0,0}; `id` already being allocated to; `id` a pool released to use count 0.
 * */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_begin_allocate_to_pool(cachalot_allocator *a, int device,
                                                                                cachalot_mempool_id id,
                                                                                cachalot_stream_filter filter,
                                                                                void *ctx);
/* Stops routing to `id` (error if it is not routed to). The use count is unchanged. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_end_allocate_to_pool(cachalot_allocator *a, int device,
                                                                              cachalot_mempool_id id);
/* One use fewer. At 0 the pool is freeable: its whole free segments go back to the device at the next
 * empty_cache or out-of-memory retry, and it disappears once it has no segment. Blocks still allocated
 * from it stay valid and return to it when freed. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_release_pool(cachalot_allocator *a, int device,
                                                                      cachalot_mempool_id id);

/* Makes pool `id` with use count 1, or gives it one more use, without routing anything to it (PyTorch's
 * createOrIncrefPool: a MemPool made before it is allocated to). The errors of begin_allocate_to_pool
 * about ids. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_pool_incref(cachalot_allocator *a, int device,
                                                                     cachalot_mempool_id id);
/* PyTorch's MemPool(no_split=True): blocks of pool `id` on `device` are never split, each handed out
 * whole (a new segment's only block, or a cached block as it is). For a pool in use (use count > 0). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_pool_set_no_split(cachalot_allocator *a, int device,
                                                                           cachalot_mempool_id id);
/* PyTorch's MemPool(use_on_oom=True): when a malloc of `device`'s default pool finds no memory (after
 * its retry), it takes a cached free block of pool `id` on its stream, if one fits, before failing; the
 * block then belongs to `id`. Off with on = false (a MemPool's destructor). For a pool in use. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_pool_set_use_on_oom(cachalot_allocator *a, int device,
                                                                             cachalot_mempool_id id, bool on);
/* Where a private pool's segments come from instead of the backend (PyTorch's MemPool(allocator=...)):
 * alloc returns `size` bytes of device memory on `device` for `stream`, or NULL when it has none (the
 * malloc then goes on as after a failed device allocation); free gives a segment back; release, if not
 * NULL, is called once when the pool is gone and none of its segments is left (or at destroy), after
 * which ctx is not used. alloc and free run with the device's lock dropped, as device calls do, except
 * with release_lock_on_cudamalloc:False, on a host out-of-memory path and at destroy; release runs with it
 * held. None of them may call cachalot on the same device. Such a pool never uses expandable segments;
 * the memory fraction applies to it. */
typedef struct {
  void *(*alloc)(size_t size, int device, cachalot_stream stream, void *ctx);
  void (*free)(void *ptr, size_t size, int device, cachalot_stream stream, void *ctx);
  void (*release)(void *ctx);
  void *ctx;
} cachalot_segment_source;

/* Gives pool `id` (in use, never allocated from, without a source) the source *src, copied. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_pool_set_source(cachalot_allocator *a, int device,
                                                                         cachalot_mempool_id id,
                                                                         const cachalot_segment_source *src);
/* The use count of pool `id` (CACHALOT_ERROR_INVALID_ARGUMENT when there is no such pool). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_pool_use_count(cachalot_allocator *a, int device,
                                                                        cachalot_mempool_id id, int *out);
/* Gives the whole free segments of pool `id` back to the device if the pool is freeable (use count 0);
 * a pool in use, or one of a capture underway, keeps them; an id no pool has is nothing to do. {0,0} is
 * cachalot_empty_cache (of every device; `device` must still be one). With expandable segments the
 * device's free pages are all unmapped, as cachalot_empty_cache does. CACHALOT_ERROR_INVALID_ARGUMENT for
 * a device out of range or an id that is neither {0,0} nor a private pool id. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_empty_cache_pool(cachalot_allocator *a, int device,
                                                                          cachalot_mempool_id id);

/* With the config key detect_captures:True, a malloc on a stream that is being captured is served from a
 * private pool made for that capture, and that pool keeps its memory after the capture ends: the graph
 * may replay at any time. This gives up (release_pool) every such pool whose capture is over: call it
 * once the graphs made from those captures are destroyed. Captures still underway keep theirs. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_release_capture_pools(cachalot_allocator *a, int device);
/* With detect_captures, tells cachalot that stream `s` is about to be destroyed: to see whether a capture
 * is over, cachalot asks the stream of its first malloc, and asking CUDA about a destroyed stream may
 * crash. Call it before destroying a stream that allocated during a capture (the capture must be over).
 * Harmless for any other stream. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_forget_stream(cachalot_allocator *a, cachalot_stream s);

/* --- checkpoint / restore (for trees of graphs sharing a pool) --- */

typedef struct {
  uintptr_t offset;     /* from the segment's address */
  size_t size;
  size_t requested;     /* 0 when free */
  bool allocated;
} cachalot_block_state;

typedef struct {
  uintptr_t address;
  size_t size;
  cachalot_stream stream;
  bool small;
  size_t n_blocks;
  cachalot_block_state *blocks; /* address order */
} cachalot_segment_state;

typedef struct {
  int device;
  cachalot_mempool_id pool;
  size_t n_segments;
  cachalot_segment_state *segments; /* address order */
} cachalot_pool_state;

/* The state of every segment and block of a private pool (free it with cachalot_pool_state_free). A
 * block pending free counts as allocated. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_checkpoint_pool(cachalot_allocator *a, int device,
                                                                         cachalot_mempool_id id,
                                                                         cachalot_pool_state **out);
/* Frees every block now allocated in the pool, waits for pending ones, and re-carves each checkpointed
 * segment (which must still exist, unchanged in size and stream) into the checkpointed blocks. The blocks
 * allocated in the checkpoint are allocated again, and *ptrs (malloc'ed; free() it) lists their addresses
 * in checkpoint order. Segments of the pool not in the checkpoint are left free. On any failure every
 * block the program holds stays allocated: INVALID_STATE when the checkpoint no longer fits (or blocks are
 * pending during a capture), DEVICE when a pending block in a checkpointed segment could not be waited for. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_restore_pool(cachalot_allocator *a,
                                                                      const cachalot_pool_state *state,
                                                                      void ***ptrs, size_t *n_ptrs);
/* cachalot_restore_pool, keeping `ctx` (may be NULL) with each block it allocates again and its alloc trace
 * entry while history is on, as cachalot_malloc_with_context does (<cachalot/snapshot.h>): PyTorch gives
 * the re-carved blocks the context of the restore. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_restore_pool_with_context(cachalot_allocator *a,
                                                                                   const cachalot_pool_state *state,
                                                                                   void *ctx, void ***ptrs,
                                                                                   size_t *n_ptrs);
CACHALOT_API void cachalot_pool_state_free(cachalot_pool_state *state);

#ifdef __cplusplus
}
#endif
#endif
