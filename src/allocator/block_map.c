/* A lane's pointer map (see cl_block_map in internal.h): address -> ALLOCATED or PENDING block.
 *
 * Open addressing keeps a lookup to one or two cache lines and needs no allocation per entry, unlike a
 * chained hash; the table only grows, so the warm path allocates nothing once it has seen its working
 * set. Deletion shifts the following run back instead of leaving tombstones, so lookups never slow
 * down as blocks come and go. The operations themselves are inline, in internal.h. */
#include "internal.h"

#include <stdlib.h>

enum { MAP_INITIAL_LOG2 = 6 };

static bool map_alloc(cl_block_map *m, unsigned log2) {
  cl_map_slot *slots = calloc((size_t)1 << log2, sizeof *slots);
  if (!slots)
    return false;
  m->slots = slots;
  m->mask = ((size_t)1 << log2) - 1;
  m->shift = 64 - log2;
  m->count = 0;
  return true;
}

bool cl_map_init(cl_block_map *m) { return map_alloc(m, MAP_INITIAL_LOG2); }

void cl_map_destroy(cl_block_map *m) {
  free(m->slots);
  m->slots = NULL;
  m->count = 0;
}

bool cl_map_grow(cl_block_map *m) {
  cl_block_map bigger;
  if (!map_alloc(&bigger, 64 - m->shift + 1))
    return false;
  for (size_t i = 0; i <= m->mask; i++)
    if (m->slots[i].key)
      cl_map_put(&bigger, m->slots[i].key, m->slots[i].blk);
  free(m->slots);
  *m = bigger;
  return true;
}
