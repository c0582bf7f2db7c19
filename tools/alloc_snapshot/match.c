/* alloc_snapshot: pairing the segments of two snapshots by address or by history (see match.h). */
#include "match.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "../common/trace_walk.h"

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b) ? 1 : 0)

/* A segment with what history matching sorts it by. */
typedef struct {
  const as_segment *s;
  bool created;   /* its segment_alloc entry is in the trace */
  uint64_t order; /* that entry's index in its device's trace */
} hist_seg;

static int cmp_address(const void *pa, const void *pb) {
  const hist_seg *a = pa, *b = pb;
  int c = CMP(a->s->device, b->s->device);
  return c ? c : CMP(a->s->address, b->s->address);
}

/* Device and size first: the class a segment can be paired within. */
static int cmp_class(const hist_seg *a, const hist_seg *b) {
  int c = CMP(a->s->device, b->s->device);
  return c ? c : CMP(a->s->total_size, b->s->total_size);
}

static int cmp_history(const void *pa, const void *pb) {
  const hist_seg *a = pa, *b = pb;
  int c = cmp_class(a, b);
  if (c == 0)
    c = CMP(!a->created, !b->created);
  if (c == 0 && a->created)
    c = CMP(a->order, b->order);
  return c ? c : CMP(a->s->address, b->s->address);
}

/* The snapshot's segments, with their creation entries when `history`; NULL on host OOM. */
static hist_seg *segments_of(const as_snapshot *s, bool history) {
  hist_seg *v = calloc(s->n_segments ? s->n_segments : 1, sizeof *v);
  if (v == NULL)
    return NULL;
  for (size_t i = 0; i < s->n_segments; i++)
    v[i].s = &s->segments[i];
  if (!history)
    return v;
  /* The last segment_alloc at an address is the one that made the segment there now (an earlier one
   * was freed, or the trace is damaged). */
  tw_map created;
  if (!tw_map_init(&created, 64)) {
    free(v);
    return NULL;
  }
  for (size_t d = 0; d < s->n_devices; d++)
    for (size_t i = 0; i < s->traces[d].n; i++) {
      const as_trace_entry *e = &s->traces[d].entries[i];
      if (e->action != AS_SEGMENT_ALLOC)
        continue;
      tw_live *l = tw_map_find(&created, (int)d, e->addr);
      if (l == NULL && (l = tw_map_insert(&created, (tw_live){.key = e->addr, .device = (int)d})) == NULL) {
        tw_map_free(&created);
        free(v);
        return NULL;
      }
      l->tag = i;
    }
  for (size_t i = 0; i < s->n_segments; i++) {
    const tw_live *l = tw_map_find(&created, v[i].s->device, v[i].s->address);
    v[i].created = l != NULL;
    v[i].order = l != NULL ? l->tag : 0;
  }
  tw_map_free(&created);
  return v;
}

/* Pairs two sorted lists: elements that compare equal (by `same`) are paired one to one in order. */
static size_t pair_sorted(const hist_seg *a, size_t na, const hist_seg *b, size_t nb,
                          int (*same)(const hist_seg *, const hist_seg *), as_seg_pair *out) {
  size_t n = 0;
  for (size_t i = 0, j = 0; i < na || j < nb;) {
    int c = i >= na ? 1 : j >= nb ? -1 : same(&a[i], &b[j]);
    out[n++] = (as_seg_pair){.a = c <= 0 ? a[i].s : NULL, .b = c >= 0 ? b[j].s : NULL};
    i += c <= 0;
    j += c >= 0;
  }
  return n;
}

static int same_address(const hist_seg *a, const hist_seg *b) { return cmp_address(a, b); }

static int cmp_pair(const void *pa, const void *pb) {
  const as_seg_pair *x = pa, *y = pb;
  const as_segment *a = x->a ? x->a : x->b, *b = y->a ? y->a : y->b;
  int c = CMP(a->device, b->device);
  if (c == 0)
    c = CMP(a->address, b->address);
  return c ? c : CMP(x->a == NULL, y->a == NULL); /* history: A's segment before B's lone one there */
}

static size_t count_matched(const as_seg_pair *p, size_t n) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    m += p[i].a != NULL && p[i].b != NULL;
  return m;
}

int as_match_segments(const as_snapshot *sa, const as_snapshot *sb, as_match_mode mode, as_matching *out) {
  *out = (as_matching){0};
  size_t na = sa->n_segments, nb = sb->n_segments;
  hist_seg *a = segments_of(sa, mode != AS_MATCH_ADDRESS), *b = segments_of(sb, mode != AS_MATCH_ADDRESS);
  as_seg_pair *pairs = calloc(na + nb ? na + nb : 1, sizeof *pairs);
  if (a == NULL || b == NULL || pairs == NULL) {
    free(a);
    free(b);
    free(pairs);
    return -1;
  }
  qsort(a, na, sizeof *a, cmp_address);
  qsort(b, nb, sizeof *b, cmp_address);
  size_t n = pair_sorted(a, na, b, nb, same_address, pairs);
  out->by_address = count_matched(pairs, n);
  size_t smaller = na < nb ? na : nb;
  bool history = mode == AS_MATCH_HISTORY || (mode == AS_MATCH_AUTO && smaller > 0 && 2 * out->by_address <= smaller);
  if (history) {
    qsort(a, na, sizeof *a, cmp_history);
    qsort(b, nb, sizeof *b, cmp_history);
    n = pair_sorted(a, na, b, nb, cmp_class, pairs);
    qsort(pairs, n, sizeof *pairs, cmp_pair);
  }
  free(a);
  free(b);
  out->pairs = pairs;
  out->n = n;
  out->matched = count_matched(pairs, n);
  out->used = history ? AS_MATCH_HISTORY : AS_MATCH_ADDRESS;
  return 0;
}

void as_matching_free(as_matching *m) {
  free(m->pairs);
  *m = (as_matching){0};
}
