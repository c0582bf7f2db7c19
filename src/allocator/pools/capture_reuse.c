/* graph_capture_record_stream_reuse: a block freed during a CUDA graph capture while other streams use it
 * gets no event (one recorded now would be captured), so it normally waits for the capture's end. With
 * this key, as in PyTorch, it is reused within the capture once that is safe in the graph being built:
 * the free remembers the nodes where the captured work of each stream that used it ends (their capture
 * frontiers), and a later malloc during the capture takes the block when the captured work of the stream
 * that asks depends on every one of those nodes, so that at every replay the block's old uses come
 * before its new one. */
#include "pools.h"

#include <stdlib.h>
#include <string.h>

/* The frontier of stream s: a new array of its *n nodes (NULL with *n 0 when it has none), in capture
 * *id. False when s is not capturing, or on a backend error or host out of memory. */
static bool frontier(cl_device *d, cachalot_stream s, uint64_t *id, uintptr_t **nodes, size_t *n) {
  cachalot_backend *be = d->owner->backend;
  *nodes = NULL;
  *n = 0;
  if (!be->ops->capture_frontier || be->ops->capture_frontier(be, d->index, s, id, NULL, 0, n) != CACHALOT_OK ||
      *id == 0)
    return false;
  if (*n == 0)
    return true;
  size_t got = 0;
  if (!(*nodes = malloc(*n * sizeof **nodes)) ||
      be->ops->capture_frontier(be, d->index, s, id, *nodes, *n, &got) != CACHALOT_OK || got != *n || *id == 0) {
    free(*nodes);
    *nodes = NULL;
    return false;
  }
  return true;
}

/* Appends the frontier of stream s to *w, whose capture s must share. False as frontier() is, or when s
 * is in another capture. */
static bool add_frontier(cl_device *d, cachalot_stream s, cl_capture_wait **w) {
  uint64_t id = 0;
  uintptr_t *nodes = NULL;
  size_t n = 0;
  bool ok = frontier(d, s, &id, &nodes, &n) && (!(*w)->capture_id || id == (*w)->capture_id);
  cl_capture_wait *q = ok && n ? realloc(*w, sizeof **w + ((*w)->n_nodes + n) * sizeof q->nodes[0]) : *w;
  if (ok && q) {
    if (n)
      memcpy(q->nodes + q->n_nodes, nodes, n * sizeof *nodes);
    q->capture_id = id;
    q->n_nodes += n;
    *w = q;
  }
  free(nodes);
  return ok && q;
}

cl_capture_wait *cl_capture_wait_make_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_capture_wait *w = malloc(sizeof *w);
  if (!w)
    return NULL; /* it waits for the capture's end: always safe */
  w->capture_id = 0;
  w->n_nodes = 0;
  bool ok = add_frontier(d, b->seg->stream, &w);
  for (uint32_t i = 0; ok && i < b->n_uses; i++)
    ok = add_frontier(d, b->uses[i], &w);
  if (!ok) {
    free(w);
    return NULL;
  }
  return w;
}

void cl_capture_reuse_locked(cl_device *d, cachalot_stream s) {
  CL_ASSERT_EXCLUSIVE(d);
  bool any = false;
  for (size_t i = 0; i < d->n_deferred && !any; i++)
    any = d->deferred[i].wait != NULL;
  cachalot_backend *be = d->owner->backend;
  uint64_t id = 0;
  uintptr_t *f = NULL;
  size_t n = 0;
  if (!any || !be->ops->capture_reaches || !frontier(d, s, &id, &f, &n))
    return;
  size_t kept = 0;
  for (size_t i = 0; i < d->n_deferred; i++) {
    cl_deferred x = d->deferred[i];
    bool all = false;
    if (x.wait && x.wait->capture_id == id &&
        be->ops->capture_reaches(be, d->index, s, f, n, x.wait->nodes, x.wait->n_nodes, &all) == CACHALOT_OK && all) {
      free(x.wait);
      cl_free_block_locked(d, x.b); /* free in its pool now: this malloc may take it */
    } else {
      d->deferred[kept++] = x;
    }
  }
  d->n_deferred = kept;
  free(f);
}
