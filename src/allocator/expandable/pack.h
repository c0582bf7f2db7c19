/* Packing a repeating step's blocks into one range (pack.c): where each block of the plan goes. */
#ifndef CACHALOT_ALLOCATOR_PACK_H
#define CACHALOT_ALLOCATOR_PACK_H

#include <stddef.h>
#include <stdint.h>

enum { CL_PACK_MAX_ITEMS = 1u << 14 };

/* A block to place: `size` bytes, live from `start` for `len` on a circle of time (len < the circle: a
 * block of a step that repeats, ended by the step after). `off` is the result. */
typedef struct {
  size_t size;
  uint64_t start, len;
  size_t off;
} cl_pack_item;

/* Gives each of the n items an offset, a multiple of `align` when the sizes are, so that no two items
 * live at the same time overlap in [off, off + size): the largest first, each at the lowest offset free
 * for its whole life (first fit by decreasing size, which reaches the live-bytes bound on the steps of
 * the traces we have). Returns the bytes the placement spans (the highest end), or SIZE_MAX on host OOM
 * or more than CL_PACK_MAX_ITEMS items. */
size_t cl_pack(cl_pack_item *v, size_t n, uint64_t circle);

#endif
