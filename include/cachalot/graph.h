/* cachalot: CUDA graphs on private pools (torch.cuda.CUDAGraph): capture, instantiate, replay, reset.
 *
 * Allocations made on the capturing stream, and on side streams joined into the capture, during a
 * capture come from the graph's private pool, so the memory a graph uses is never handed to anyone else
 * while the graph may replay. Sharing one pool between graphs is allowed: the caller promises to replay
 * them in capture order and never concurrently.
 */
#ifndef CACHALOT_GRAPH_H
#define CACHALOT_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cachalot_graph cachalot_graph;

/* A graph object on device `device` of `a`. keep_graph: keep the raw captured graph after capture_end
 * (then instantiate() is the caller's call, and raw() works). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_create(cachalot_allocator *a, int device,
                                                                      bool keep_graph, cachalot_graph **out);
/* Routes allocations to `pool` ({0,0}: a fresh {n,0} pool), then begins capturing `s` (not the legacy
 * default stream). Errors: the graph already holds a capture ("already owns a captured graph"); s NULL. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_capture_begin(cachalot_graph *g, cachalot_stream s,
                                                                             cachalot_mempool_id pool,
                                                                             cachalot_capture_mode mode);
/* Ends the capture (same stream as begin) and the routing; warns when the graph is empty; unless
 * keep_graph, instantiates it (with auto-free-on-launch) and drops the raw graph. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_capture_end(cachalot_graph *g);
/* keep_graph only: instantiates the kept graph. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_instantiate(cachalot_graph *g);
/* Launches the instantiated graph on `s`, after the registered state hooks' before_replay. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_replay(cachalot_graph *g, cachalot_stream s);
/* Releases the pool once and destroys the graph and its instance; the object can capture again. Safe to
 * call twice and after a failed capture. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_reset(cachalot_graph *g);
/* The graph's pool ({0,0} before a capture). */
CACHALOT_API cachalot_mempool_id cachalot_graph_pool(const cachalot_graph *g);
/* Debug mode keeps the raw graph for debug_dump. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_enable_debug_mode(cachalot_graph *g);
/* Writes the captured graph as a DOT file (needs debug mode or keep_graph). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_debug_dump(cachalot_graph *g, const char *path);
/* The raw captured graph (a cudaGraph_t on the CUDA backend; needs keep_graph). Owned by the graph. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_raw(cachalot_graph *g, void **out);
/* reset() then frees the object. NULL is a no-op. */
CACHALOT_API void cachalot_graph_destroy(cachalot_graph *g);

/* --- replay state hooks (PyTorch's register_generator_state) ---
 * Stateful inputs such as a counter-based RNG's seed and offset kept in device memory: at capture begin
 * the state switches to reading them from device memory; capture end returns how much the state advances
 * per replay; before every replay, before_replay writes the current value where the graph reads it (on
 * stream s, in stream order) and advances the host value by that increment. */
typedef struct {
  void (*capture_begin)(void *ctx);
  uint64_t (*capture_end)(void *ctx);
  cachalot_status (*before_replay)(void *ctx, uint64_t increment, cachalot_stream s);
  void *ctx;
} cachalot_graph_state_hooks;

/* Registers a state object (before capture_begin). Up to 16 per graph. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graph_register_state(cachalot_graph *g,
                                                                              const cachalot_graph_state_hooks *h);

/* --- the common pattern (PyTorch's make_graphed_callables) --- */

/* Enqueues the work to capture on stream `s`, reading the static inputs and writing the static outputs. */
typedef cachalot_status (*cachalot_graph_body)(cachalot_stream s, void *ctx);

typedef struct {
  void *ptr; /* device memory the body reads */
  size_t bytes;
} cachalot_buffer;

typedef struct cachalot_graphed cachalot_graphed;

/* Runs `body` `warmup` times on a side stream (so lazy initialisation is not captured), then captures it
 * into a graph on that stream (in `pool`, or a fresh one for {0,0}) and instantiates it. `inputs` are
 * the static input buffers (copied; the buffers themselves must stay valid). `s` is the caller's stream
 * that the side stream waits for first. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graphed_create(cachalot_allocator *a, int device,
                                                                        cachalot_graph_body body, void *ctx,
                                                                        const cachalot_buffer *inputs, size_t n_inputs,
                                                                        cachalot_mempool_id pool, int warmup,
                                                                        cachalot_stream s, cachalot_graphed **out);
/* Copies new_inputs[i] (device memory of inputs[i].bytes; NULL keeps that input) into the static inputs
 * on `s`, then replays the graph on `s`. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_graphed_replay(cachalot_graphed *h,
                                                                        const void *const *new_inputs,
                                                                        cachalot_stream s);
CACHALOT_API cachalot_graph *cachalot_graphed_graph(cachalot_graphed *h);
CACHALOT_API void cachalot_graphed_destroy(cachalot_graphed *h);

#ifdef __cplusplus
}
#endif
#endif
