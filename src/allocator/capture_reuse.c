/* graph_capture_record_stream_reuse: a block freed during a CUDA graph capture while other streams use it
 * gets no event (one recorded now would be captured), so it normally waits for the capture's end. With
 * this key, as in PyTorch, it is reused within the capture once that is safe in the graph being built:
 * the free remembers the nodes where the captured work of each stream that used it ends (their capture
 * frontiers), and a later malloc during the capture takes the block when the captured work of the stream
 * that asks depends on every one of those nodes, so that at every replay the block's old uses come
 * before its new one. */
#include "internal.h"

#include <stdlib.h>

/* Appends the frontier of stream s (in capture *capture_id, which it must share) to *w. False when s is
 * not capturing in that capture, or on a backend error or host out of memory. */
static bool add_frontier(cl_device *d, cachalot_stream s, cl_capture_wait **w, size_t *cap) {
  cachalot_backend *be = d->owner->backend;
  uint64_t id = 0;
  size_t n = 0;
  if (!be->ops->capture_frontier || be->ops->capture_frontier(be, d->index, s, &id, NULL, 0, &n) != CACHALOT_OK ||
      id == 0 || ((*w)->capture_id && id != (*w)->capture_id))
    return false;
  if ((*w)->n_nodes + n > *cap) {
    size_t want = (*w)->n_nodes + n;
    cl_capture_wait *q = realloc(*w, sizeof **w + want * sizeof q->nodes[0]);
    if (!q)
      return false;
    *w = q;
    *cap = want;
  }
  size_t got = 0;
  if (be->ops->capture_frontier(be, d->index, s, &id, (*w)->nodes + (*w)->n_nodes, n, &got) != CACHALOT_OK ||
      got != n || id == 0)
    return false;
  (*w)->capture_id = id;
  (*w)->n_nodes += n;
  return true;
}

cl_capture_wait *cl_capture_wait_make_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  size_t cap = 8;
  cl_capture_wait *w = malloc(sizeof *w + cap * sizeof w->nodes[0]);
  if (!w)
    return NULL; /* it waits for the capture's end: always safe */
  w->capture_id = 0;
  w->n_nodes = 0;
  bool ok = add_frontier(d, b->seg->stream, &w, &cap);
  for (uint32_t i = 0; ok && i < b->n_uses; i++)
    ok = add_frontier(d, b->uses[i], &w, &cap);
  if (!ok) {
    free(w);
    return NULL;
  }
  return w;
}

/* Whether every node of w is reached from the frontier f of stream s. */
static bool reached(cl_device *d, cachalot_stream s, const uintptr_t *f, size_t n_f, const cl_capture_wait *w) {
  cachalot_backend *be = d->owner->backend;
  for (size_t i = 0; i < w->n_nodes; i++) {
    bool r = false;
    if (be->ops->capture_reaches(be, d->index, s, f, n_f, w->nodes[i], &r) != CACHALOT_OK || !r)
      return false;
  }
  return true;
}

void cl_capture_reuse_locked(cl_device *d, cachalot_stream s) {
  CL_ASSERT_EXCLUSIVE(d);
  bool any = false;
  for (size_t i = 0; i < d->n_deferred && !any; i++)
    any = d->deferred[i].wait != NULL;
  cachalot_backend *be = d->owner->backend;
  if (!any || !be->ops->capture_reaches)
    return;
  uint64_t id = 0;
  size_t n = 0;
  if (be->ops->capture_frontier(be, d->index, s, &id, NULL, 0, &n) != CACHALOT_OK || id == 0)
    return;
  uintptr_t *f = malloc((n ? n : 1) * sizeof *f);
  size_t got = 0;
  if (!f || be->ops->capture_frontier(be, d->index, s, &id, f, n, &got) != CACHALOT_OK || got != n) {
    free(f);
    return;
  }
  size_t kept = 0;
  for (size_t i = 0; i < d->n_deferred; i++) {
    cl_deferred x = d->deferred[i];
    if (x.wait && x.wait->capture_id == id && reached(d, s, f, n, x.wait)) {
      free(x.wait);
      cl_free_block_locked(d, x.b); /* free in its pool now: this malloc may take it */
    } else {
      d->deferred[kept++] = x;
    }
  }
  d->n_deferred = kept;
  free(f);
}
