/* From a pointer to its segment and block: the page map (lookup.c), a segment's handed-out table,
 * and the slow lookups for error paths (lookup.c). */
#ifndef CACHALOT_ALLOCATOR_LOOKUP_H
#define CACHALOT_ALLOCATOR_LOOKUP_H

#include "types.h"

/* A segment's lane is read before any lock by free() through the page map, which may hold a segment that
 * is being given back or reused; it is written in exclusive mode and never NULL again once set. */
CL_INLINE cl_lane *cl_seg_lane(const cl_segment *s) { return __atomic_load_n(&s->lane, __ATOMIC_ACQUIRE); }
CL_INLINE void cl_seg_set_lane(cl_segment *s, cl_lane *ln) { __atomic_store_n(&s->lane, ln, __ATOMIC_RELEASE); }

/* The entry of `ptr` in the handed-out table of `s` (ptr inside s). */
CL_INLINE cl_block **cl_seg_slot(const cl_segment *s, uintptr_t ptr) { return &s->at[(ptr - s->ptr) >> s->at_shift]; }

/* Whether `ptr` lies where the page map can hold it. */
static inline bool cl_page_mappable(uintptr_t ptr) { return ((uint64_t)ptr >> CL_PM_VA_BITS) == 0; }
static inline cl_segment *cl_page_get(cl_page_node *root, uintptr_t ptr) {
  const uint64_t k = (uint64_t)ptr >> CL_PAGE_SHIFT;
  if (CL_UNLIKELY(!cl_page_mappable(ptr)))
    return NULL;
  cl_page_leaf *leaf = atomic_load_explicit(&root->slot[k >> CL_PM_LEAF_BITS], memory_order_acquire);
  if (!leaf)
    return NULL;
  return atomic_load_explicit(&leaf->slot[k & ((1u << CL_PM_LEAF_BITS) - 1)], memory_order_acquire);
}
/* Points the pages of `s` at it. False on host OOM (nothing changed). */
bool cl_page_map_add(cl_page_node *root, cl_segment *s);
void cl_page_map_remove(cl_page_node *root, const cl_segment *s);
/* Points the pages of [ptr, ptr + size) at `s` (NULL: at nothing), whatever they held: for expandable
 * segments, whose runs start and end on page boundaries (2 MiB multiples, so no page is shared). False on
 * host OOM (nothing changed). */
bool cl_page_map_point(cl_page_node *root, uintptr_t ptr, size_t size, cl_segment *s);
void cl_page_map_destroy(cl_page_node *root);

/* free()'s warm path reads the page map (cl_page_get) before any lock; the segment it finds may be stale (a
 * racing release gives segments back and reuses their metadata). */
/* Once lane `ln` (read from seg) is locked: segments do not change under any lane lock, so seg is checked
 * again. Whether seg is still ln's and holds `key` (its handed-out table entry is then cl_seg_slot). */
CL_INLINE bool cl_lookup_holds(const cl_segment *seg, const cl_lane *ln, uintptr_t key) {
  return cl_seg_lane(seg) == ln && key - seg->ptr < seg->size;
}

/* The ALLOCATED or PENDING block at `key` among device d's segments, or NULL. */
cl_block *cl_block_at_locked(cachalot_allocator *a, cl_device *d, uintptr_t key);

#endif
