/* alloc_snapshot: totals per (device, pool, type, stream) group (see summary.h). */
#include "summary.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

static as_group_key segment_key(const as_segment *s) {
  return (as_group_key){.device = s->device, .pool_id = {s->pool_id[0], s->pool_id[1]}, .small = s->small,
                        .stream = s->stream};
}

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b) ? 1 : 0)

int as_key_cmp(const as_group_key *a, const as_group_key *b) {
  int c = CMP(a->device, b->device);
  if (c == 0)
    c = CMP(a->pool_id[0], b->pool_id[0]);
  if (c == 0)
    c = CMP(a->pool_id[1], b->pool_id[1]);
  if (c == 0) /* small pool first, as PyTorch lists it */
    c = CMP(!a->small, !b->small);
  if (c == 0)
    c = CMP(a->stream, b->stream);
  return c;
}

void as_group_add(as_group *g, const as_segment *s) {
  g->segments++;
  g->blocks = as_sat_add(g->blocks, s->n_blocks);
  g->reserved = as_sat_add(g->reserved, s->total_size);
  g->allocated = as_sat_add(g->allocated, s->allocated_size);
  g->active = as_sat_add(g->active, s->active_size);
  g->requested = as_sat_add(g->requested, s->requested_size);
  for (size_t i = 0; i < s->n_blocks; i++) {
    const as_block *b = &s->blocks[i];
    if (b->state != AS_INACTIVE)
      continue;
    g->free = as_sat_add(g->free, b->size);
    if (s->n_blocks > 1)
      g->inactive_split = as_sat_add(g->inactive_split, b->size);
    if (b->size > g->largest_free)
      g->largest_free = b->size;
  }
}

double as_fragmentation(const as_group *g) {
  if (g->free == 0)
    return -1.0;
  return 1.0 - (double)g->largest_free / (double)g->free;
}

static int cmp_key_then_address(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  as_group_key ka = segment_key(a), kb = segment_key(b);
  int c = as_key_cmp(&ka, &kb);
  return c ? c : CMP(a->address, b->address);
}

static int cmp_device_address(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  int c = CMP(a->device, b->device);
  return c ? c : CMP(a->address, b->address);
}

static const as_segment **pointers(const as_snapshot *s) {
  const as_segment **v = malloc((s->n_segments ? s->n_segments : 1) * sizeof *v);
  if (v != NULL)
    for (size_t i = 0; i < s->n_segments; i++)
      v[i] = &s->segments[i];
  return v;
}

const as_segment **as_sorted_segments(const as_snapshot *s) {
  const as_segment **v = pointers(s);
  if (v != NULL)
    qsort(v, s->n_segments, sizeof *v, cmp_device_address);
  return v;
}

int as_group_segments(const as_snapshot *s, as_group **out, size_t *n) {
  *out = NULL;
  *n = 0;
  const as_segment **v = pointers(s);
  as_group *groups = calloc(s->n_segments ? s->n_segments : 1, sizeof *groups);
  if (v == NULL || groups == NULL) {
    free(v);
    free(groups);
    return -1;
  }
  /* Sorting first makes grouping one pass, O(n log n) however many distinct keys a file has. */
  qsort(v, s->n_segments, sizeof *v, cmp_key_then_address);
  size_t ng = 0;
  for (size_t i = 0; i < s->n_segments; i++) {
    as_group_key k = segment_key(v[i]);
    if (ng == 0 || as_key_cmp(&groups[ng - 1].key, &k) != 0)
      groups[ng++].key = k;
    as_group_add(&groups[ng - 1], v[i]);
  }
  free(v);
  *out = groups;
  *n = ng;
  return 0;
}

char *as_fmt_pool(char buf[AS_POOL_BUF], const uint64_t pool_id[2]) {
  snprintf(buf, AS_POOL_BUF, "%" PRIu64 ",%" PRIu64, pool_id[0], pool_id[1]);
  return buf;
}
