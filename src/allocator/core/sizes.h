/* Size arithmetic as PyTorch does it: rounding, pool choice, segment size and the split rule. Pure functions,
 * inlined into the malloc path. */
#ifndef CACHALOT_ALLOCATOR_SIZES_H
#define CACHALOT_ALLOCATOR_SIZES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define CL_MIN_BLOCK ((size_t)512)                 /* every block size is a multiple of this */
#define CL_SMALL_SIZE ((size_t)1 << 20)            /* rounded sizes <= this go to the small pool */
#define CL_SMALL_BUFFER ((size_t)2 << 20)          /* small-pool segment size */
#define CL_LARGE_BUFFER ((size_t)20 << 20)         /* segment size for rounded sizes in (1 MiB, 10 MiB) */
#define CL_MIN_LARGE_ALLOC ((size_t)10 << 20)      /* from here segments are the size rounded to 2 MiB */
#define CL_ROUND_LARGE ((size_t)2 << 20)
#define CL_MAX_REQUEST ((size_t)1 << 60)           /* requests of at least this fail ("more than 1EB") */

static inline unsigned cl_log2_floor(size_t x) { return 63u - (unsigned)__builtin_clzll((unsigned long long)x); }

static inline size_t cl_round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* The roundup_power2_divisions entry for s's power-of-two interval (index 0 = below 2 MiB). */
static inline unsigned cl_divisions_for(const cl_config *c, size_t s) {
  int idx = (int)cl_log2_floor(s) - 20;
  if (idx < 0)
    idx = 0;
  if (idx > CL_ROUNDUP_INTERVALS - 1)
    idx = CL_ROUNDUP_INTERVALS - 1;
  return c->roundup_divisions[idx];
}

/* PyTorch's round_size. s < CL_MAX_REQUEST, so nothing here can overflow. */
static inline size_t cl_round_size(const cl_config *c, size_t s) {
  if (s < CL_MIN_BLOCK)
    return CL_MIN_BLOCK;
  if (c->plain_rounding)
    return cl_round_up(s, CL_MIN_BLOCK);
  unsigned d = cl_divisions_for(c, s);
  if (d > 1 && s > CL_MIN_BLOCK * d) {
    if ((s & (s - 1)) == 0)
      return s;
    size_t floor2 = (size_t)1 << cl_log2_floor(s);
    size_t step = floor2 >> cl_log2_floor(d); /* >= 512: s > 512 d and d is a power of two */
    size_t low = s & ~(step - 1);
    return low == s ? s : low + step;
  }
  return cl_round_up(s, CL_MIN_BLOCK);
}

static inline bool cl_is_small(size_t rounded) { return rounded <= CL_SMALL_SIZE; }

/* Size of the device allocation made for a rounded request that no cached block serves. */
static inline size_t cl_segment_size(size_t rounded) {
  if (rounded <= CL_SMALL_SIZE)
    return CL_SMALL_BUFFER;
  if (rounded < CL_MIN_LARGE_ALLOC)
    return CL_LARGE_BUFFER;
  return cl_round_up(rounded, CL_ROUND_LARGE);
}

/* Whether carving `size` out of a free block of `block_size` leaves the rest as a separate free block.
 * `small_rule`: the block is of the small kind or in an expandable segment (PyTorch's size rules). */
static inline bool cl_should_split(const cl_config *c, bool small_rule, size_t block_size, size_t size) {
  size_t rest = block_size - size;
  if (small_rule)
    return rest >= CL_MIN_BLOCK;
  return size < c->max_split_size && rest > CL_SMALL_SIZE;
}

#endif
