/* The merges of a block going back to its free index, shared by free()'s warm path (free.c, which inlines
 * them) and exclusive mode (merge.c): which free neighbours it joins, the free index's trees kept in order
 * with the fewest changes, the metadata a merge frees, the split stats. */
#ifndef CACHALOT_ALLOCATOR_MERGE_H
#define CACHALOT_ALLOCATOR_MERGE_H

#include "core.h"

/* Block metadata a merge made unused: back to the warm path's lane, or to the device's spares. */
CL_INLINE void drop_block(cl_device *d, cl_mode mode, cl_lane *ln, cl_block *b) {
  if (mode == CL_WARM) {
    b->state = CL_FREE;
    b->seg = NULL;
    b->next = ln->spare;
    ln->spare = b;
    ln->n_spare++;
  } else {
    cl_block_delete_locked(d, b);
  }
}

/* The leftmost node of a subtree. */
CL_INLINE cl_block *tree_min(cl_block *t) {
  while (t->left)
    t = t->left;
  return t;
}

/* What freeing b does: which neighbours merge, and the change of the split stats (free neighbours are
 * inactive split blocks that disappear into the merged one, which is one itself unless it is then a
 * whole segment). Computed once: the warm path checks its room before anything changes. */
typedef struct {
  cl_block *p, *n;
  bool merge_prev, merge_next;
  int64_t split_blocks, split_bytes;
} merge_plan;

CL_INLINE merge_plan plan_merge(const cl_block *b) {
  merge_plan m;
  m.p = b->prev;
  m.n = b->next;
  m.merge_prev = m.p && m.p->state == CL_FREE;
  m.merge_next = m.n && m.n->state == CL_FREE;
  const size_t p_size = m.merge_prev ? m.p->size : 0, n_size = m.merge_next ? m.n->size : 0;
  const bool split_after = (m.merge_prev ? m.p->prev : m.p) || (m.merge_next ? m.n->next : m.n);
  m.split_blocks = (int64_t)split_after - m.merge_prev - m.merge_next;
  m.split_bytes = (split_after ? (int64_t)(b->size + p_size + n_size) : 0) - (int64_t)(p_size + n_size);
  return m;
}

/* Puts b (out of its segment's table, its stats counted) into its free index, merged with its free
 * neighbours as planned, but for the split stats. As in PyTorch, a free neighbour absorbs b (the lower one
 * when both are free) and keeps its node: its key only grows, so when it stays in its class and still
 * sorts before its successor there the class tree is not touched at all. b's metadata, or the upper
 * neighbour's, becomes a spare. Returns the node that stays. */
CL_INLINE cl_block *return_block(cl_device *d, cl_mode mode, cl_block *b, bool small, const merge_plan *m) {
  cl_segment *seg = b->seg;
  cl_lane *ln = seg->lane;
  cl_fit *f = &seg->bins->kind[small];
  cl_block *p = m->p, *n = m->n;
  cl_block *keep = m->merge_prev ? p : m->merge_next ? n : b; /* the node that stays */
  if (m->merge_prev && m->merge_next)
    cl_fit_remove(f, n);
  /* keep's place in its class tree and its successor there, found while its key is still the old one */
  cl_block **link = NULL, *succ = NULL;
  if (keep != b) {
    link = cl_tree_link(&f->root[keep->cls], keep, &succ);
    if (keep->right)
      succ = tree_min(keep->right);
  }
  if (m->merge_prev) {
    cl_block *after = m->merge_next ? n->next : n;
    p->size += b->size + (m->merge_next ? n->size : 0);
    p->next = after;
    if (after)
      after->prev = p;
    else
      seg->tail = p;
  } else if (m->merge_next) {
    n->ptr = b->ptr;
    n->size += b->size;
    n->prev = p;
    if (p)
      p->next = n;
    else
      seg->head = n;
  }
  const unsigned cls = cl_fit_class(small, keep->size);
  if (keep == b) {
    cl_block_becomes_free(b);
    cl_fit_insert(f, cls, b);
  } else {
    /* keep's key grew: it keeps its place if it keeps its class and still sorts before succ */
    const unsigned old = keep->cls;
    cl_block_becomes_free(keep);
    if (cls != old || (succ && !cl_key_less(keep, succ))) {
      cl_fit_remove_at(f, old, link, keep);
      cl_fit_insert(f, cls, keep);
    }
    drop_block(d, mode, ln, b);
    if (m->merge_prev && m->merge_next)
      drop_block(d, mode, ln, n);
  }
  return keep;
}

/* Returns b (ALLOCATED or PENDING, out of its segment's table) to its free index as planned, with the
 * split stats and, in exclusive mode, the rest of its stats (a warm caller counts those into its lane's
 * share after: free.c's free_stats_warm). */
CL_INLINE void free_block(cl_device *d, cl_mode mode, cl_block *b, bool small, const merge_plan *m) {
  cl_segment *seg = b->seg;
  cl_lane *ln = seg->lane;
  const size_t orig_size = b->size;
  const size_t requested = b->requested;

  if (mode == CL_EXCLUSIVE) /* the warm path records its own (cl_trace_warm, in free_fast) */
    cl_trace_locked(d, CL_TRACE_FREE_COMPLETED, b->ptr, requested, seg->stream);
  b->n_uses = 0;
  b->requested = 0;
  return_block(d, mode, b, small, m);
  cl_count_split(d, ln, mode, small, m->split_blocks, m->split_bytes);
  if (mode == CL_WARM)
    return;
  cachalot_device_stats *st = &d->stats;
  cl_stat_array_add(st->active, small, -1);
  cl_stat_array_add(st->active_bytes, small, -(int64_t)orig_size);
  cl_stat_array_add(st->requested_bytes, small, -(int64_t)requested);
}

#endif
