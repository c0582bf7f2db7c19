/* The free-block index: per (pool, stream, kind), size classes of treaps of FREE blocks ordered by
 * (size, ptr), with a two-level bitmap of the non-empty classes (cl_fit in types.h).
 *
 * Best fit is a lower bound on (size, 0): the smallest block that fits, the lowest address among equal
 * sizes (PyTorch's free rules). Treap priorities are a hash of a block's address when it entered its tree, so
 * the shape is a function of the operations alone. No allocation. The operations the warm paths use are
 * inline, in fit.h; the cold walks, the byte counts and the index's lookup by stream are here. */
#include "core.h"

/* The largest key below b's in treap t, or NULL. */
static cl_block *tree_prev(cl_block *t, const cl_block *b) {
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

/* The largest key of treap t, or NULL. */
static cl_block *tree_max(cl_block *t) {
  while (t && t->right)
    t = t->right;
  return t;
}

/* Whether node b is in treap t (found by its key). */
static bool tree_contains(cl_block *t, const cl_block *b) {
  while (t) {
    if (t == b)
      return true;
    t = cl_key_less(b, t) ? t->left : t->right;
  }
  return false;
}

/* The highest non-empty class below c (c may be CL_FIT_CLASSES), or -1. */
static int prev_class(const cl_fit *f, unsigned c) {
  unsigned w = c >> 6;
  uint64_t bits = w < CL_FIT_WORDS ? f->map[w] & (((uint64_t)1 << (c & 63)) - 1) : 0;
  if (!bits) {
    const uint64_t words = f->summary & (((uint64_t)1 << w) - 1); /* w < 64: CL_FIT_WORDS < 64 */
    if (!words)
      return -1;
    w = 63u - (unsigned)__builtin_clzll(words);
    bits = f->map[w];
  }
  return (int)(w * 64 + 63u - (unsigned)__builtin_clzll(bits));
}

cl_block *cl_fit_prev(cl_fit *f, bool small, const cl_block *b) {
  const unsigned c = cl_fit_class(small, b->size);
  cl_block *p = tree_prev(f->root[c], b);
  if (p)
    return p;
  const int below = prev_class(f, c);
  return below < 0 ? NULL : tree_max(f->root[below]);
}

cl_block *cl_fit_max(cl_fit *f) {
  const int top = prev_class(f, CL_FIT_CLASSES);
  return top < 0 ? NULL : tree_max(f->root[top]);
}

bool cl_fit_contains(cl_fit *f, bool small, const cl_block *b) {
  return tree_contains(f->root[cl_fit_class(small, b->size)], b);
}

static uint64_t tree_bytes(const cl_block *t) {
  uint64_t sum = 0;
  for (; t; t = t->right)
    sum += t->size + tree_bytes(t->left);
  return sum;
}

uint64_t cl_bins_free_bytes(const cl_bins *bins) {
  uint64_t sum = 0;
  for (int k = 0; k < 2; k++) {
    const cl_fit *f = &bins->kind[k];
    for (uint64_t words = f->summary; words; words &= words - 1) {
      const unsigned w = (unsigned)__builtin_ctzll(words);
      for (uint64_t bits = f->map[w]; bits; bits &= bits - 1)
        sum += tree_bytes(f->root[w * 64 + (unsigned)__builtin_ctzll(bits)]);
    }
  }
  return sum;
}

cl_bins *cl_bins_get_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool create) {
  CL_ASSERT_EXCLUSIVE(d);
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


