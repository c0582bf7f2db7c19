/* The allocator's internal header, for its policy files (malloc.c, free.c, release.c, oom.c,
 * allocator.c, check.c, history_control.c, ipc.c) and the layers above (stats/, graph/, process/): every
 * room of the allocator (core/, expandable/, host/, pools/), then the policy files' own functions. */
#ifndef CACHALOT_ALLOCATOR_INTERNAL_H
#define CACHALOT_ALLOCATOR_INTERNAL_H

#include "core/core.h"
#include "expandable/expandable.h"
#include "host/host_cache.h"
#include "pools/pools.h"

/* --- allocator.c: the allocator's lifecycle (the public cachalot_create/destroy are in src/process/) --- */
/* A new allocator over `b` with `conf` (NULL: CACHALOT_ALLOC_CONF), with the errors cachalot_create
 * documents. */
cachalot_status cl_allocator_create(cachalot_backend *b, const char *conf, cachalot_allocator **out);
/* Frees `a` and everything it holds (a != NULL; no call in flight). */
void cl_allocator_destroy(cachalot_allocator *a);

/* --- history_control.c --- */
/* cachalot_record_history and cachalot_record_history_stacks (shells over these), for process/export.c's
 * environment variable and socket requests. */
cachalot_status cl_record_history(cachalot_allocator *a, bool enabled, size_t max_entries);
cachalot_status cl_record_history_stacks(cachalot_allocator *a, bool enabled);

/* --- release.c --- */
/* Whole free segments marked `releasing`, waiting to be given back to the device. */
typedef struct cl_release_list {
  cl_segment *head;
} cl_release_list;
/* Gives a release list back to the device, dropping the lock meanwhile when the config allows. A
 * segment leaves the books when its device free succeeded; one whose free failed goes back to its free
 * index, so nothing is lost (the first failure is returned). */
cachalot_status cl_release_flush_locked(cl_device *d, cl_release_list *list);
/* empty_cache and the out-of-memory retry: waits for every outstanding event, gives back every whole free
 * segment of the default pool and of freeable private pools, and drops the pools left empty. Returns the
 * first failure (of the wait or of a device free); what could not be freed stays cached. */
cachalot_status cl_release_all_locked(cl_device *d);
/* empty_cache: lanes of streams with no segment left go dormant (see cl_lane), and empty per-stream event
 * queues go. */
void cl_lanes_rest_locked(cl_device *d);
/* empty_cache of one freeable private pool: its whole free segments (and the device's free pages). */
cachalot_status cl_release_pool_locked(cl_device *d, const cl_pool *p);
/* malloc step 4: garbage collection of aged whole free large segments of the default pool. */
void cl_garbage_collect_locked(cl_device *d, cl_release_list *out);
/* malloc step 6: frees oversize cached blocks of (pool, stream, kind). True when enough was marked. */
bool cl_release_oversize_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool small, size_t size,
                                cl_release_list *out);

/* --- oom.c --- */
/* The out-of-memory path: counts, calls observers (lock dropped), sets the message. Called with the
 * device locked; returns with it unlocked. */
cachalot_status cl_out_of_memory_unlock(cl_device *d, size_t alloc_size);

#endif
