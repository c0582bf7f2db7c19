/* cachalot: a caching CUDA device-memory allocator. The umbrella header: it declares the whole API.
 *
 * Conventions (every header):
 * - every call returns a cachalot_status (0 = CACHALOT_OK); on failure cachalot_last_error() says why;
 * - out-parameters are cleared before anything can fail;
 * - every function may be called from any thread;
 * - a device index is 0 .. device_count-1 of the allocator's backend.
 */
#ifndef CACHALOT_CACHALOT_H
#define CACHALOT_CACHALOT_H

#include "status.h"
#include "backend.h"
#include "allocator.h"
#include "stats.h"
#include "pool.h"
#include "graph.h"
#include "snapshot.h"
#include "host.h"

#endif
