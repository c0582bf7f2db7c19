/* The common graph pattern, PyTorch's make_graphed_callables for one body: warm up on a side stream,
 * capture once, then replay with fresh inputs copied into the static input buffers.
 *
 * The side stream keeps the warm-up (lazy initialisation, first-touch allocations) and the capture off
 * the caller's stream, as PyTorch does; stream waits keep everything in the caller's stream order.
 */
#include "../allocator/internal.h"
#include "graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Invariants: graph holds a successful, instantiated capture of `body` on `side` (a stream this object
 * created and destroys); inputs is a copy of the caller's n_inputs buffers (NULL when n_inputs == 0). */
struct cachalot_graphed {
  cachalot_allocator *allocator;
  int device;
  cachalot_stream side;
  cachalot_graph *graph;
  cachalot_buffer *inputs;
  size_t n_inputs;
};

/* Frees what create got so far. The side stream is synchronized first: work still queued on it may use
 * blocks cached for it, and a destroyed stream's handle may be handed out again. */
static void graphed_free(cachalot_graphed *h) {
  cachalot_backend *b = h->allocator->backend;
  cl_graph_destroy(h->graph);
  if (h->side) {
    if (b->ops->stream_sync(b, h->device, h->side) != CACHALOT_OK)
      cl_warn("cachalot_graphed: synchronizing the side stream before destroying it failed: %s",
              cl_error_message());
    b->ops->stream_destroy(b, h->side);
  }
  free(h->inputs);
  free(h);
}

/* Keeps the failing call's message across the clean-up, prefixed with what was being done. */
static cachalot_status fail_cleanup(cachalot_graphed *h, cachalot_status rc, const char *doing) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", cl_error_message());
  graphed_free(h);
  return cl_fail(rc, "cachalot_graphed_create: %s: %s", doing, msg);
}

cachalot_status cachalot_graphed_create(cachalot_allocator *a, int device, cachalot_graph_body body, void *ctx,
                                        const cachalot_buffer *inputs, size_t n_inputs, cachalot_mempool_id pool,
                                        int warmup, cachalot_stream s, cachalot_graphed **out) {
  if (out)
    *out = NULL;
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_graphed_create");
  if (rc != CACHALOT_OK)
    return rc;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graphed_create: out is NULL");
  if (!body)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graphed_create: body is NULL");
  if (warmup < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graphed_create: warmup is negative (%d)", warmup);
  if (n_inputs > 0 && !inputs)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graphed_create: inputs is NULL but n_inputs is %zu",
                   n_inputs);
  for (size_t i = 0; i < n_inputs; i++)
    if (!inputs[i].ptr && inputs[i].bytes > 0)
      return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                     "cachalot_graphed_create: input %zu has %zu bytes but a NULL pointer", i, inputs[i].bytes);

  /* Host memory first: after this, every failure has device objects to undo, and graphed_free does it. */
  cachalot_graphed *h = calloc(1, sizeof *h);
  if (!h)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_graphed_create: host out of memory");
  h->allocator = a;
  h->device = device;
  if (n_inputs > 0) {
    h->inputs = malloc(n_inputs * sizeof *h->inputs);
    if (!h->inputs) {
      free(h);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_graphed_create: host out of memory");
    }
    memcpy(h->inputs, inputs, n_inputs * sizeof *h->inputs);
    h->n_inputs = n_inputs;
  }

  cachalot_backend *b = a->backend;
  rc = b->ops->stream_create(b, device, &h->side);
  if (rc != CACHALOT_OK) {
    h->side = NULL;
    return fail_cleanup(h, rc, "creating the side stream");
  }
  /* The warm-up reads what the caller's stream produced so far. */
  rc = b->ops->stream_wait(b, device, h->side, s);
  if (rc != CACHALOT_OK)
    return fail_cleanup(h, rc, "making the side stream wait for the caller's stream");
  for (int i = 0; i < warmup; i++) {
    rc = body(h->side, ctx);
    if (rc != CACHALOT_OK)
      return fail_cleanup(h, rc, "warm-up run of the body");
  }

  rc = cl_graph_create(a, device, false, &h->graph);
  if (rc != CACHALOT_OK)
    return fail_cleanup(h, rc, "creating the graph");
  rc = cl_graph_capture_begin(h->graph, h->side, pool, CACHALOT_CAPTURE_GLOBAL);
  if (rc != CACHALOT_OK)
    return fail_cleanup(h, rc, "beginning the capture");
  /* A failing body leaves the capture open; graphed_free's graph destroy (a reset) closes it. */
  rc = body(h->side, ctx);
  if (rc != CACHALOT_OK)
    return fail_cleanup(h, rc, "captured run of the body");
  rc = cl_graph_capture_end(h->graph);
  if (rc != CACHALOT_OK)
    return fail_cleanup(h, rc, "ending the capture");
  /* The caller's later work (and the replays on s) come after the warm-up enqueued on the side stream. */
  rc = b->ops->stream_wait(b, device, s, h->side);
  if (rc != CACHALOT_OK)
    return fail_cleanup(h, rc, "making the caller's stream wait for the side stream");
  *out = h;
  return CACHALOT_OK;
}

cachalot_status cachalot_graphed_replay(cachalot_graphed *h, const void *const *new_inputs, cachalot_stream s) {
  if (!h)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_graphed_replay: handle is NULL");
  cachalot_backend *b = h->allocator->backend;
  if (new_inputs)
    for (size_t i = 0; i < h->n_inputs; i++) {
      if (!new_inputs[i] || h->inputs[i].bytes == 0)
        continue;
      cachalot_status rc = b->ops->memcpy_async(b, h->device, h->inputs[i].ptr, new_inputs[i], h->inputs[i].bytes, s);
      if (rc != CACHALOT_OK) {
        cl_error_prefix("cachalot_graphed_replay: copying input %zu: ", i);
        return rc;
      }
    }
  cachalot_status rc = cl_graph_replay(h->graph, s);
  if (rc != CACHALOT_OK)
    cl_error_prefix("cachalot_graphed_replay: ");
  return rc;
}

cachalot_graph *cachalot_graphed_graph(cachalot_graphed *h) { return h ? h->graph : NULL; }

void cachalot_graphed_destroy(cachalot_graphed *h) {
  if (h)
    graphed_free(h);
}
