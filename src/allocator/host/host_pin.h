/* Pinning and unpinning the host cache's blocks (host_pin.c), below the cache (host_cache.c). */
#ifndef CACHALOT_ALLOCATOR_HOST_PIN_H
#define CACHALOT_ALLOCATOR_HOST_PIN_H

#include "../backend/ops.h"
#include "../core/config.h"

#include <stdbool.h>
#include <stddef.h>

/* Pins `size` bytes: with the backend's host_alloc, or, when use_register, memory of this process's heap
 * whose pages `threads` threads touch before host_register locks it. Nothing is left behind on failure. */
cachalot_status cl_host_pin(cachalot_backend *b, size_t size, bool use_register, unsigned threads, void **ptr);
/* Undoes cl_host_pin (registered: whether it registered). On failure the memory stays pinned. */
cachalot_status cl_host_unpin(cachalot_backend *b, void *ptr, bool registered);

#endif
