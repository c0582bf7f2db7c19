/* The host cache as the allocator object sees it (host_cache.c): made with it, configured with it,
 * checked and destroyed with it. */
#ifndef CACHALOT_ALLOCATOR_HOST_CACHE_H
#define CACHALOT_ALLOCATOR_HOST_CACHE_H

#include <cachalot/host.h>

#include <stdbool.h>

typedef struct cl_host cl_host;

/* An empty cache pinning through backend b. */
cachalot_status cl_host_create(cachalot_backend *b, cl_host **out);
/* The config's pinned_use_cuda_host_register and pinned_num_register_threads, for the next pinnings. */
void cl_host_configure(cl_host *h, bool use_register, unsigned register_threads);
/* Waits for every pending event, then gives back every block, allocated ones included. NULL: no-op. */
void cl_host_destroy(cl_host *h);
/* cachalot_check's part: CACHALOT_ERROR_INVALID_STATE with the first invariant that does not hold. */
cachalot_status cl_host_check(cl_host *h);

#endif
