/* The page map (see cl_page_node in internal.h): which segment covers a 2 MiB page of device address
 * space. free() reads it without a lock to find the lane of a pointer; it is written in exclusive mode
 * when segments come and go. Interior nodes are published with a compare-and-swap, so two devices adding
 * segments at once never lose a node, and are freed only at destroy, so a reader never follows a
 * dangling one. */
#include "internal.h"

#include <stdlib.h>

enum { PM_SLOTS = 1 << CL_PM_BITS };

static inline size_t slot_at(uint64_t page, int lvl) {
  return (size_t)(page >> (lvl * CL_PM_BITS)) & (PM_SLOTS - 1);
}

/* The leaf node for `page`, made on the way if `create`. NULL on host OOM or when absent. */
static cl_page_node *leaf_of(cl_page_node *root, uint64_t page, bool create) {
  cl_page_node *n = root;
  for (int lvl = CL_PM_LEVELS - 1; lvl > 0; lvl--) {
    _Atomic(void *) *slot = &n->slot[slot_at(page, lvl)];
    cl_page_node *next = atomic_load_explicit(slot, memory_order_acquire);
    if (!next) {
      if (!create)
        return NULL;
      cl_page_node *fresh = calloc(1, sizeof *fresh);
      if (!fresh)
        return NULL;
      void *expected = NULL;
      if (atomic_compare_exchange_strong_explicit(slot, &expected, fresh, memory_order_acq_rel,
                                                  memory_order_acquire)) {
        next = fresh;
      } else {
        free(fresh);
        next = expected;
      }
    }
    n = next;
  }
  return n;
}

static void pages_of(const cl_segment *s, uint64_t *first, uint64_t *last) {
  *first = (uint64_t)s->ptr >> CL_PAGE_SHIFT;
  *last = (uint64_t)(s->ptr + s->size - 1) >> CL_PAGE_SHIFT;
}

bool cl_page_map_add(cl_page_node *root, cl_segment *s) {
  uint64_t first, last;
  pages_of(s, &first, &last);
  /* Make every leaf first, so that a host OOM leaves nothing half done. */
  for (uint64_t pg = first; pg <= last; pg++)
    if (!leaf_of(root, pg, true))
      return false;
  for (uint64_t pg = first; pg <= last; pg++) {
    _Atomic(void *) *slot = &leaf_of(root, pg, false)->slot[slot_at(pg, 0)];
    void *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, s, memory_order_release, memory_order_relaxed))
      atomic_store_explicit(slot, CL_PAGE_SHARED, memory_order_release);
  }
  return true;
}

void cl_page_map_remove(cl_page_node *root, const cl_segment *s) {
  uint64_t first, last;
  pages_of(s, &first, &last);
  for (uint64_t pg = first; pg <= last; pg++) {
    cl_page_node *leaf = leaf_of(root, pg, false);
    if (!leaf)
      continue;
    void *expected = (void *)s;
    /* A shared page stays shared: lookups there search the lanes, which is always right. */
    atomic_compare_exchange_strong_explicit(&leaf->slot[slot_at(pg, 0)], &expected, NULL, memory_order_release,
                                            memory_order_relaxed);
  }
}

static void destroy_rec(cl_page_node *n, int lvl) {
  for (size_t i = 0; i < PM_SLOTS; i++) {
    cl_page_node *c = atomic_load_explicit(&n->slot[i], memory_order_relaxed);
    if (c) {
      if (lvl > 1)
        destroy_rec(c, lvl - 1);
      free(c);
    }
  }
}

void cl_page_map_destroy(cl_page_node *root) {
  destroy_rec(root, CL_PM_LEVELS - 1);
  for (size_t i = 0; i < PM_SLOTS; i++)
    atomic_store_explicit(&root->slot[i], NULL, memory_order_relaxed);
}
