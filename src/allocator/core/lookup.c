/* From a pointer to its segment and block. The page map (see cl_page_node in types.h) says which segment
 * covers a 2 MiB page of device address space. free() reads it without a lock to find the lane of a
 * pointer (its inline part is in lookup.h); it is written in exclusive mode when segments come and go. Leaves are published with a compare-and-swap, so two devices adding
 * segments at once never lose one, and are freed only at destroy, so a reader never follows a dangling
 * one. */
#include "core.h"

#include <inttypes.h>
#include <stdlib.h>

enum { LEAF_MASK = (1u << CL_PM_LEAF_BITS) - 1 };

/* The leaf of page `pg`, made on the way if `create`. NULL on host OOM or when absent. */
static cl_page_leaf *leaf_of(cl_page_node *root, uint64_t pg, bool create) {
  _Atomic(cl_page_leaf *) *slot = &root->slot[pg >> CL_PM_LEAF_BITS];
  cl_page_leaf *leaf = atomic_load_explicit(slot, memory_order_acquire);
  if (leaf || !create)
    return leaf;
  cl_page_leaf *fresh = calloc(1, sizeof *fresh);
  if (!fresh)
    return NULL;
  cl_page_leaf *expected = NULL;
  if (atomic_compare_exchange_strong_explicit(slot, &expected, fresh, memory_order_acq_rel, memory_order_acquire))
    return fresh;
  free(fresh);
  return expected;
}

/* The pages of `s`; false when it lies (partly) above what the map holds. */
static bool pages_of(const cl_segment *s, uint64_t *first, uint64_t *last) {
  *first = (uint64_t)s->ptr >> CL_PAGE_SHIFT;
  *last = (uint64_t)(s->ptr + s->size - 1) >> CL_PAGE_SHIFT;
  return cl_page_mappable(s->ptr + s->size - 1) && s->ptr + s->size > s->ptr;
}

bool cl_page_map_add(cl_page_node *root, cl_segment *s) {
  uint64_t first, last;
  if (!pages_of(s, &first, &last))
    return true; /* not mapped: the slow paths scan the segment list for it */
  /* Make every leaf first, so that a host OOM leaves nothing half done. */
  for (uint64_t pg = first; pg <= last; pg++)
    if (!leaf_of(root, pg, true))
      return false;
  for (uint64_t pg = first; pg <= last; pg++) {
    _Atomic(cl_segment *) *slot = &leaf_of(root, pg, false)->slot[pg & LEAF_MASK];
    cl_segment *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, s, memory_order_release, memory_order_relaxed))
      atomic_store_explicit(slot, CL_PAGE_SHARED, memory_order_release);
  }
  return true;
}

void cl_page_map_remove(cl_page_node *root, const cl_segment *s) {
  uint64_t first, last;
  if (!pages_of(s, &first, &last))
    return;
  for (uint64_t pg = first; pg <= last; pg++) {
    cl_page_leaf *leaf = leaf_of(root, pg, false);
    if (!leaf)
      continue;
    cl_segment *expected = (cl_segment *)s;
    /* A shared page stays shared: lookups there scan the segments, which is always right. */
    atomic_compare_exchange_strong_explicit(&leaf->slot[pg & LEAF_MASK], &expected, NULL, memory_order_release,
                                            memory_order_relaxed);
  }
}

bool cl_page_map_point(cl_page_node *root, uintptr_t ptr, size_t size, cl_segment *s) {
  if (!size || !cl_page_mappable(ptr + size - 1) || ptr + size < ptr)
    return true; /* not mapped: the slow paths scan the segment list */
  const uint64_t first = (uint64_t)ptr >> CL_PAGE_SHIFT, last = (uint64_t)(ptr + size - 1) >> CL_PAGE_SHIFT;
  for (uint64_t pg = first; pg <= last; pg++)
    if (!leaf_of(root, pg, s != NULL) && s)
      return false;
  for (uint64_t pg = first; pg <= last; pg++) {
    cl_page_leaf *leaf = leaf_of(root, pg, false);
    if (leaf)
      atomic_store_explicit(&leaf->slot[pg & LEAF_MASK], s, memory_order_release);
  }
  return true;
}

void cl_page_map_destroy(cl_page_node *root) {
  for (size_t i = 0; i < (size_t)1 << CL_PM_ROOT_BITS; i++) {
    free(atomic_load_explicit(&root->slot[i], memory_order_relaxed));
    atomic_store_explicit(&root->slot[i], NULL, memory_order_relaxed);
  }
}

/* The handed-out block at `key` in segment s, or NULL. */
static cl_block *find_in_segment(const cl_segment *s, uintptr_t key) {
  if (key - s->ptr >= s->size)
    return NULL;
  cl_block *b = *cl_seg_slot(s, key);
  return b && b->ptr == key ? b : NULL;
}

cl_block *cl_block_at_locked(cachalot_allocator *a, cl_device *d, uintptr_t key) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_segment *seg = cl_page_get(&a->pages, key);
  /* a shared page, or an address above what the page map holds: scan */
  if (seg == CL_PAGE_SHARED || (!seg && !cl_page_mappable(key))) {
    for (const cl_segment *s = d->segments; s; s = s->next) {
      cl_block *b = find_in_segment(s, key);
      if (b)
        return b;
    }
    return NULL;
  }
  /* the page map is only written in the exclusive mode of the segment's device: stable here */
  const cl_lane *ln = seg ? cl_seg_lane(seg) : NULL; /* seg may be another device's, changing meanwhile */
  if (!ln || ln->dev != d)
    return NULL;
  return find_in_segment(seg, key);
}
