/* The free index (free_index.c): size classes of treaps per (pool, stream, kind), and putting FREE
 * blocks in and out of them. */
#ifndef CACHALOT_ALLOCATOR_FIT_H
#define CACHALOT_ALLOCATOR_FIT_H

#include "types.h"

cl_bins *cl_bins_get_locked(cl_device *d, cl_pool *p, cachalot_stream s, bool create);

/* The treap of one size class. Priorities are a hash of a block's address when it entered the tree (a
 * node updated in place keeps its priority), so the shape is a function of the operations alone.
 * Expected O(log n) in the class's blocks; no allocation. */
static inline bool cl_key_less(const cl_block *a, const cl_block *b) {
  return a->size < b->size || (a->size == b->size && a->ptr < b->ptr);
}
/* Treap insertion at `root` without recursion: walk down while the nodes outrank b, then split the
 * subtree there around b's key into b's two children. Gives the shape insert-at-leaf-and-rotate-up
 * would. */
CL_INLINE void cl_tree_insert(cl_block **root, cl_block *b) {
  b->prio = (uint32_t)(((uint64_t)(b->ptr >> 9) * 0x9E3779B97F4A7C15ull) >> 32);
  if (!*root) { /* the common case of a class holding one block at a time */
    b->left = b->right = NULL;
    *root = b;
    return;
  }
  cl_block **link = root;
  while (*link && (*link)->prio >= b->prio)
    link = cl_key_less(b, *link) ? &(*link)->left : &(*link)->right;
  cl_block *t = *link, **l = &b->left, **r = &b->right;
  while (t) {
    if (cl_key_less(t, b)) {
      *l = t;
      l = &t->right;
      t = t->right;
    } else {
      *r = t;
      r = &t->left;
      t = t->left;
    }
  }
  *l = *r = NULL;
  *link = b;
}
/* The link (&root or a parent's child pointer) that points at b, a node of the tree. *succ is b's
 * nearest ancestor with a larger key: b's successor in the tree when b has no right child. */
CL_INLINE cl_block **cl_tree_link(cl_block **root, const cl_block *b, cl_block **succ) {
  cl_block **link = root;
  *succ = NULL;
  while (*link != b) {
    if (cl_key_less(b, *link)) {
      *succ = *link;
      link = &(*link)->left;
    } else {
      link = &(*link)->right;
    }
  }
  return link;
}
/* Treap removal of b at `link` without recursion: b's place goes to the join of its children. Reads
 * no key, so b's size may already have changed. */
CL_INLINE void cl_tree_remove_at(cl_block **link, cl_block *b) {
  cl_block *l = b->left, *r = b->right;
  while (l && r) {
    if (l->prio > r->prio) {
      *link = l;
      link = &l->right;
      l = l->right;
    } else {
      *link = r;
      link = &r->left;
      r = r->left;
    }
  }
  *link = l ? l : r;
  b->left = b->right = NULL;
}
/* The smallest (size, ptr) >= (size, 0) in one tree, with its link (see cl_tree_link) and its
 * predecessor in that tree (the last node the walk passed on the right). */
CL_INLINE cl_block *cl_tree_lower_bound_at(cl_block **root, size_t size, cl_block ***best_link, cl_block **pred) {
  cl_block *best = NULL;
  *best_link = NULL;
  *pred = NULL;
  for (cl_block **link = root; *link;) {
    cl_block *t = *link;
    if (t->size >= size) {
      best = t;
      *best_link = link;
      link = &t->left;
    } else {
      *pred = t;
      link = &t->right;
    }
  }
  return best;
}

/* Class arithmetic (see CL_FIT_M_SMALL) for a constant m, so that each kind's is a handful of
 * instructions. */
CL_INLINE size_t cl_fit_raw_class(size_t u, unsigned m) {
  const unsigned s = cl_log2_floor(u | ((size_t)1 << m)) - m;
  return ((size_t)s << m) + (u >> s);
}
/* The size class of `size` in a kind. */
CL_INLINE unsigned cl_fit_class(bool small, size_t size) {
  const size_t u = (size >> 9) - 1;
  if (small) {
    const size_t c = cl_fit_raw_class(u, CL_FIT_M_SMALL);
    return (unsigned)(c < CL_FIT_N_SMALL ? c : CL_FIT_N_SMALL - 1);
  }
  const size_t c = cl_fit_raw_class(u, CL_FIT_M_LARGE);
  if (c < CL_FIT_LARGE_BASE)
    return 0;
  return (unsigned)(c - CL_FIT_LARGE_BASE < CL_FIT_N_LARGE ? c - CL_FIT_LARGE_BASE : CL_FIT_N_LARGE - 1);
}
static inline unsigned cl_fit_n_classes(bool small) { return small ? CL_FIT_N_SMALL : CL_FIT_N_LARGE; }
/* The lowest non-empty class above c, or -1. */
CL_INLINE int cl_fit_next_class(const cl_fit *f, unsigned c) {
  unsigned w = c >> 6;
  uint64_t bits = f->map[w] & (~(uint64_t)1 << (c & 63)); /* the bits above c */
  if (!bits) {
    const uint64_t words = f->summary & (~(uint64_t)1 << w);
    if (!words)
      return -1;
    w = (unsigned)__builtin_ctzll(words);
    bits = f->map[w];
  }
  return (int)(w * 64 + (unsigned)__builtin_ctzll(bits));
}

/* Inserts b, whose class is c. */
CL_INLINE void cl_fit_insert(cl_fit *f, unsigned c, cl_block *b) {
  b->cls = (uint16_t)c;
  cl_tree_insert(&f->root[c], b);
  f->map[c >> 6] |= (uint64_t)1 << (c & 63);
  f->summary |= (uint64_t)1 << (c >> 6);
}
/* Removes b, a node of class c's tree, at its link (b's size may already have changed). */
CL_INLINE void cl_fit_remove_at(cl_fit *f, unsigned c, cl_block **link, cl_block *b) {
  cl_tree_remove_at(link, b);
  if (!f->root[c]) {
    uint64_t *w = &f->map[c >> 6];
    *w &= ~((uint64_t)1 << (c & 63));
    if (!*w)
      f->summary &= ~((uint64_t)1 << (c >> 6));
  }
}
CL_INLINE void cl_fit_remove(cl_fit *f, cl_block *b) {
  const unsigned c = b->cls;
  cl_block *succ;
  cl_fit_remove_at(f, c, cl_tree_link(&f->root[c], b, &succ), b);
}
/* Best fit: the smallest (size, ptr) >= (size, 0) of the kind, the lowest address among equal sizes.
 * That is the lower bound inside the class of `size`, else the minimum (leftmost node) of the next
 * non-empty class. With its class, its link and its predecessor in its class tree (NULL when it is
 * that tree's minimum). */
CL_INLINE cl_block *cl_fit_lower_bound_at(cl_fit *f, bool small, size_t size, unsigned *cls, cl_block ***link,
                                          cl_block **pred) {
  const unsigned c = cl_fit_class(small, size);
  cl_block *b = cl_tree_lower_bound_at(&f->root[c], size, link, pred);
  *cls = c;
  if (b)
    return b;
  const int n = cl_fit_next_class(f, c);
  if (n < 0)
    return NULL;
  cl_block **l = &f->root[n];
  while ((*l)->left)
    l = &(*l)->left;
  *cls = (unsigned)n;
  *link = l;
  *pred = NULL;
  return *l;
}
CL_INLINE cl_block *cl_fit_lower_bound(cl_fit *f, bool small, size_t size) {
  unsigned c;
  cl_block **link, *pred;
  return cl_fit_lower_bound_at(f, small, size, &c, &link, &pred);
}
/* The block before b (by key) in the kind, or NULL: in b's class, else the maximum of the nearest
 * non-empty class below. b need not be in the index. */
cl_block *cl_fit_prev(cl_fit *f, bool small, const cl_block *b);
/* The largest block of the kind, or NULL. */
cl_block *cl_fit_max(cl_fit *f);
/* Whether b is in the tree of its class. */
bool cl_fit_contains(cl_fit *f, bool small, const cl_block *b);
/* Bytes of all free blocks of both kinds. */
uint64_t cl_bins_free_bytes(const cl_bins *bins);

/* Makes b FREE and stamps its age base, before it enters its free index. */
CL_INLINE void cl_block_becomes_free(cl_block *b) {
  b->state = CL_FREE;
  /* atomic: warm mallocs of other lanes count lookups meanwhile (CL_WARM_GC) */
  b->gc_base = __atomic_load_n(&b->seg->pool->lookups[b->seg->small], __ATOMIC_RELAXED);
}
/* Inserts a FREE block into its index and stamps its age base. */
CL_INLINE void cl_free_index_insert_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_becomes_free(b);
  const bool small = b->seg->small;
  cl_fit_insert(&b->seg->bins->kind[small], cl_fit_class(small, b->size), b);
}
CL_INLINE void cl_free_index_remove_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_fit_remove(&b->seg->bins->kind[b->seg->small], b);
}

#endif
