/* The pools room's face: private pools and the routing of requests to them (pool.c), checkpoints
 * (pool_state.c), captures detected at malloc (autocapture.c) and blocks reused within a capture
 * (capture_reuse.c). The policy files above include it. */
#ifndef CACHALOT_ALLOCATOR_POOLS_H
#define CACHALOT_ALLOCATOR_POOLS_H

#include "../core/core.h"
#include "../expandable/expandable.h"

/* A pool id in messages: "{first, second}". */
#define CL_POOL_ID_FMT "{%llu, %llu}"
#define CL_POOL_ID_ARGS(id) (unsigned long long)(id).first, (unsigned long long)(id).second

/* --- capture_reuse.c (graph_capture_record_stream_reuse) --- */
/* The nodes where the captured work of b's stream and of every stream that used it ends, for a block
 * freed during a capture; NULL when that cannot be told (a stream not in the same capture, a backend
 * without capture frontiers, host out of memory): the block then waits for the capture's end. */
cl_capture_wait *cl_capture_wait_make_locked(cl_device *d, cl_block *b);
/* Frees the deferred blocks whose uses the captured work of stream s now depends on (a malloc on s during
 * its capture is about to look for a block). */
void cl_capture_reuse_locked(cl_device *d, cachalot_stream s);

/* --- pool.c --- */
/* A fresh id {n, 0} for a graph capture given no pool (the first counter; from 1, never reused). */
cachalot_mempool_id cl_capture_pool_id(cachalot_allocator *a);
/* A malloc's hold on its private pool while it may drop the device lock (released meanwhile, the pool
 * stays until the hold goes); the default pool needs none. cl_pool_unhold_locked collects it if freeable. */
static inline void cl_pool_hold_locked(cl_device *d, cl_pool *p) {
  CL_ASSERT_EXCLUSIVE(d);
  if (!cl_pool_is_default(d, p))
    ((cl_private_pool *)p)->holds++;
}
void cl_pool_unhold_locked(cl_device *d, cl_pool *p);
/* The pool a request on `s` goes to: the first route, most recent first, whose filter takes `s`. */
cl_pool *cl_route_pool_locked(cl_device *d, cachalot_stream s);
/* Private pool `id` of d, or NULL. */
cl_pool *cl_find_pool_locked(cl_device *d, cachalot_mempool_id id);
/* INVALID_ARGUMENT naming `who` unless id is a private pool's (exactly one half non-zero). */
cachalot_status cl_check_private_id(cachalot_mempool_id id, const char *who);
/* cachalot_begin_allocate_to_pool's work once its arguments are checked (the id a private one): `who`'s
 * errors, nothing changed on one. */
cachalot_status cl_route_begin_locked(cl_device *d, cachalot_mempool_id id, cachalot_stream_filter filter, void *ctx,
                                      const char *who);
/* cachalot_end_allocate_to_pool's and cachalot_release_pool's work, on an entered device. */
cachalot_status cl_route_end_locked(cl_device *d, cachalot_mempool_id id);
cachalot_status cl_pool_release_use_locked(cl_device *d, cachalot_mempool_id id);
/* cachalot_begin_allocate_to_pool, _end_allocate_to_pool and cachalot_release_pool (shells over these),
 * for the rooms above that act on a pool with the same checks and messages (graph.c). */
cachalot_status cl_route_begin(cachalot_allocator *a, int device, cachalot_mempool_id id, cachalot_stream_filter filter,
                               void *ctx);
cachalot_status cl_route_end(cachalot_allocator *a, int device, cachalot_mempool_id id);
cachalot_status cl_pool_release_use(cachalot_allocator *a, int device, cachalot_mempool_id id);
/* Frees the private pools that are freeable and have no segment left. */
void cl_pools_collect_locked(cl_device *d);
/* Frees every private pool (destroy). */
void cl_pools_destroy_locked(cl_device *d);
/* Bytes of free blocks held in private pools (for the OOM message). */
uint64_t cl_private_pool_free_bytes_locked(const cl_device *d);

/* --- autocapture.c (config key detect_captures) --- */
/* Before a malloc on `s`: if `s` is being captured, makes sure the capture routes to a private pool of
 * its own; ends the routing of captures that are over. A status only when the backend cannot say. */
cachalot_status cl_autocapture_malloc(cachalot_allocator *a, cl_device *d, cachalot_stream s);
/* Ends the routing of detected captures that are over (free calls it while any is routed). */
void cl_autocapture_poll(cachalot_allocator *a);
/* Frees the device's records (cachalot_destroy). */
void cl_autocapture_destroy(cl_device *d);

#endif
