/* First fit by decreasing size, on a circle of time: see pack.h. Quadratic in the items, run once per
 * plan formed. */
#include "pack.h"

#include <stdlib.h>

typedef struct {
  size_t lo, hi;
} span;

/* An item's place in the order: the largest first, then the earliest, then the first given. */
typedef struct {
  size_t size;
  uint64_t start;
  uint32_t i;
} key;

static int by_size(const void *x, const void *y) {
  const key *a = x, *b = y;
  if (a->size != b->size)
    return a->size > b->size ? -1 : 1;
  if (a->start != b->start)
    return a->start < b->start ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

static int by_lo(const void *x, const void *y) {
  const span *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Whether a and b are live at once on the circle. */
static int overlap(const cl_pack_item *a, const cl_pack_item *b, uint64_t circle) {
  const uint64_t ab = (b->start + circle - a->start) % circle, ba = (a->start + circle - b->start) % circle;
  return ab < a->len || ba < b->len;
}

size_t cl_pack(cl_pack_item *v, size_t n, uint64_t circle) {
  if (n > CL_PACK_MAX_ITEMS)
    return SIZE_MAX;
  key *order = malloc((n ? n : 1) * sizeof *order);
  uint32_t *placed = malloc((n ? n : 1) * sizeof *placed);
  span *sp = malloc((n ? n : 1) * sizeof *sp);
  if (!order || !placed || !sp) {
    free(order);
    free(placed);
    free(sp);
    return SIZE_MAX;
  }
  for (uint32_t i = 0; i < n; i++)
    order[i] = (key){v[i].size, v[i].start, i};
  qsort(order, n, sizeof *order, by_size);
  size_t top = 0, n_placed = 0;
  for (size_t k = 0; k < n; k++) {
    cl_pack_item *it = &v[order[k].i];
    size_t m = 0;
    for (size_t j = 0; j < n_placed; j++) {
      const cl_pack_item *o = &v[placed[j]];
      if (overlap(it, o, circle))
        sp[m++] = (span){o->off, o->off + o->size};
    }
    qsort(sp, m, sizeof *sp, by_lo);
    size_t off = 0;
    for (size_t j = 0; j < m && sp[j].lo < off + it->size; j++)
      if (sp[j].hi > off)
        off = sp[j].hi;
    it->off = off;
    if (off + it->size > top)
      top = off + it->size;
    placed[n_placed++] = order[k].i;
  }
  free(order);
  free(placed);
  free(sp);
  return top;
}
