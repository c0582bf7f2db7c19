/* cachalot: device backends.
 *
 * A backend is how an allocator reaches devices: the CUDA runtime, or the simulated device, a
 * first-class backend with fake device addresses, streams and events whose completion the caller
 * controls, simulated stream capture and fault injection. A backend may serve several allocators;
 * it must outlive every allocator created on it. All backend calls are thread-safe.
 */
#ifndef CACHALOT_BACKEND_H
#define CACHALOT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as cudaStream_t, so no CUDA header is needed; NULL is the legacy default stream. */
typedef struct CUstream_st *cachalot_stream;

typedef struct cachalot_backend cachalot_backend;

typedef struct {
  int device_count;          /* simulated devices, 1..64 */
  size_t capacity_bytes;     /* capacity of each simulated device */
  bool complete_immediately; /* events complete as soon as they are recorded */
} cachalot_sim_options;      /* NULL: 1 device, 80 GiB, false */

typedef enum {
  CACHALOT_CAPTURE_GLOBAL,
  CACHALOT_CAPTURE_THREAD_LOCAL,
  CACHALOT_CAPTURE_RELAXED
} cachalot_capture_mode;

/* The CUDA backend on the current process's GPUs. Fails with CACHALOT_ERROR_DEVICE when there is no
 * driver or no GPU, and with CACHALOT_ERROR_NOT_SUPPORTED in a build without CUDA. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_backend_cuda(cachalot_backend **out);

/* A simulated backend (opt may be NULL for the defaults above). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_backend_sim(const cachalot_sim_options *opt,
                                                                     cachalot_backend **out);

/* Destroys a backend. Every allocator created on it must have been destroyed first. NULL is a no-op. */
CACHALOT_API void cachalot_backend_destroy(cachalot_backend *b);

/* Number of devices the backend serves. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_backend_device_count(cachalot_backend *b, int *out);

/* --- simulated-device controls (CACHALOT_ERROR_INVALID_ARGUMENT on a non-simulated backend) --- */

/* A new simulated stream on `device`. Streams live until the backend is destroyed. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_stream_create(cachalot_backend *b, int device,
                                                                           cachalot_stream *out);
/* All work enqueued on `s` so far is done: every event recorded on it completes. NULL means the
 * default stream of every device. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_stream_complete(cachalot_backend *b,
                                                                             cachalot_stream s);
/* The next `count` device allocations fail as out of memory (0 cancels). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_fail_device_allocs(cachalot_backend *b,
                                                                                int count);
/* Every k-th device allocation from now on fails as out of memory (0 turns this off). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_fail_every(cachalot_backend *b, int k);
/* The next `count` event records fail with a device error (0 cancels). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_fail_events(cachalot_backend *b, int count);
/* Whether the backend keeps a word that moves when a watched event completes (on by default), which lets an
 * allocator's warm malloc run while blocks wait for events; off, it acts as a backend without one
 * (CUDA's, where stream memory operations are missing), and allocators poll as they did before. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_completion_word(cachalot_backend *b, bool keep);
/* The next `count` host pinnings (host allocations and registrations) fail as out of memory (0 cancels). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_fail_host_pins(cachalot_backend *b, int count);
/* Pinned host bytes the backend holds now: allocated by it (cudaHostAlloc's part) and registered memory of
 * its callers (cudaHostRegister's). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_host_pinned(cachalot_backend *b, size_t *allocated,
                                                                         size_t *registered);
/* Bytes currently allocated on a simulated device (the device's own view, cachalot aside). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_device_used(cachalot_backend *b, int device,
                                                                         size_t *out);
/* Begin / end a simulated stream capture on `s` (not NULL). While a GLOBAL capture is underway
 * anywhere, or a THREAD_LOCAL one in the calling thread, a device allocation from a thread whose
 * capture mode is not RELAXED fails, as cudaMalloc does. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_capture_begin(cachalot_backend *b,
                                                                           cachalot_stream s,
                                                                           cachalot_capture_mode mode);
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_capture_end(cachalot_backend *b,
                                                                         cachalot_stream s);

/* Enqueues one simulated kernel on `s` (NULL: device 0's default stream): outside a capture it is work
 * the stream must complete, taking the stream's next number, so an event recorded after it completes only
 * once the stream is completed (unless complete_immediately); inside a capture it becomes a node of the
 * captured graph (replaying the graph enqueues its nodes as work). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_launch(cachalot_backend *b, cachalot_stream s);
/* How many numbers `s` (NULL: device 0's default stream) has submitted so far: one per work item enqueued
 * outside a capture (a launch, a copy, each node of a replayed graph) and one per event recorded outside
 * a capture. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_sim_stream_submitted(cachalot_backend *b,
                                                                              cachalot_stream s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
