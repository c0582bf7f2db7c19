/* The free-block index: per (pool, stream, kind), a treap of FREE blocks ordered by (size, ptr).
 *
 * Best fit is a lower bound on (size, 0): the smallest block that fits, the lowest address among equal
 * sizes (SPEC.md §2). Treap priorities are a hash of the block's address, so the shape, and every
 * decision made from it, is deterministic. Expected O(log n) per operation; no allocation. The operations
 * the warm paths use are inline, in internal.h. */
#include "internal.h"

cl_block *cl_tree_prev(cl_block *t, const cl_block *b) {
  cl_block *best = NULL;
  while (t) {
    if (cl_key_less(t, b)) {
      best = t;
      t = t->right;
    } else {
      t = t->left;
    }
  }
  return best;
}

cl_block *cl_tree_max(cl_block *t) {
  while (t && t->right)
    t = t->right;
  return t;
}

bool cl_tree_contains(cl_block *t, const cl_block *b) {
  while (t) {
    if (t == b)
      return true;
    t = cl_key_less(b, t) ? t->left : t->right;
  }
  return false;
}

cl_bins *cl_bins_get_locked(cl_pool *p, cachalot_stream s, bool create) {
  cl_bins *bins = p->last_bins;
  if (bins && bins->stream == s)
    return bins;
  bins = NULL;
  HASH_FIND_PTR(p->bins, &s, bins);
  if (bins)
    p->last_bins = bins;
  if (bins || !create)
    return bins;
  bins = calloc(1, sizeof *bins);
  if (!bins)
    return NULL;
  bins->stream = s;
  bool hash_oom = false;
  HASH_ADD_PTR(p->bins, stream, bins);
  if (hash_oom) {
    free(bins);
    return NULL;
  }
  return bins;
}


