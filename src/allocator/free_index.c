/* The free-block index: per (pool, stream, kind), a treap of FREE blocks ordered by (size, ptr).
 *
 * Best fit is a lower bound on (size, 0): the smallest block that fits, the lowest address among equal
 * sizes (SPEC.md §2). Treap priorities are a hash of the block's address, so the shape, and every
 * decision made from it, is deterministic. Expected O(log n) per operation; no allocation. */
#include "internal.h"

static inline bool key_less(const cl_block *a, const cl_block *b) {
  return a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
}

static inline uint32_t prio_of(uintptr_t ptr) {
  return (uint32_t)(((uint64_t)(ptr >> 9) * 0x9E3779B97F4A7C15ull) >> 32);
}

static cl_block *rotate_right(cl_block *t) {
  cl_block *l = t->left;
  t->left = l->right;
  l->right = t;
  return l;
}

static cl_block *rotate_left(cl_block *t) {
  cl_block *r = t->right;
  t->right = r->left;
  r->left = t;
  return r;
}

static cl_block *insert_rec(cl_block *t, cl_block *b) {
  if (!t)
    return b;
  if (key_less(b, t)) {
    t->left = insert_rec(t->left, b);
    if (t->left->prio > t->prio)
      t = rotate_right(t);
  } else {
    t->right = insert_rec(t->right, b);
    if (t->right->prio > t->prio)
      t = rotate_left(t);
  }
  return t;
}

/* Joins two treaps where every key of l is below every key of r. */
static cl_block *join(cl_block *l, cl_block *r) {
  if (!l)
    return r;
  if (!r)
    return l;
  if (l->prio > r->prio) {
    l->right = join(l->right, r);
    return l;
  }
  r->left = join(l, r->left);
  return r;
}

static cl_block *remove_rec(cl_block *t, cl_block *b) {
  if (!t)
    return NULL;
  if (t == b)
    return join(t->left, t->right);
  if (key_less(b, t))
    t->left = remove_rec(t->left, b);
  else
    t->right = remove_rec(t->right, b);
  return t;
}

void cl_tree_insert(cl_bins *bins, bool small, cl_block *b) {
  b->left = b->right = NULL;
  b->prio = prio_of(b->ptr);
  bins->root[small] = insert_rec(bins->root[small], b);
  bins->count[small]++;
}

void cl_tree_remove(cl_bins *bins, bool small, cl_block *b) {
  bins->root[small] = remove_rec(bins->root[small], b);
  bins->count[small]--;
  b->left = b->right = NULL;
}

cl_block *cl_tree_lower_bound(cl_block *t, size_t size) {
  cl_block *best = NULL;
  while (t) {
    if (t->size >= size) {
      best = t;
      t = t->left;
    } else {
      t = t->right;
    }
  }
  return best;
}

cl_block *cl_tree_prev(cl_block *t, const cl_block *b) {
  cl_block *best = NULL;
  while (t) {
    if (key_less(t, b)) {
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
    t = key_less(b, t) ? t->left : t->right;
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

void cl_free_index_insert_locked(cl_device *d, cl_block *b) {
  (void)d;
  cl_segment *seg = b->seg;
  /* The bins of a segment's stream are made with the segment and outlive it, so this cannot fail. */
  cl_bins *bins = cl_bins_get_locked(seg->pool, seg->stream, false);
  b->state = CL_FREE;
  b->gc_base = seg->pool->lookups[seg->small];
  cl_tree_insert(bins, seg->small, b);
}

void cl_free_index_remove_locked(cl_device *d, cl_block *b) {
  (void)d;
  cl_segment *seg = b->seg;
  cl_bins *bins = cl_bins_get_locked(seg->pool, seg->stream, false);
  cl_tree_remove(bins, seg->small, b);
}
