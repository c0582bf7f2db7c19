/* alloc_snapshot plot: the trace reduced to two step lines, allocated and reserved bytes over time
 * (plot.h), walked with tools/common/trace_walk. The lines are downsampled to at most 4 points per
 * pixel column (its first, lowest, highest and last value), so a trace of millions of entries stays a
 * page a browser draws at once and every peak is still drawn at its height. */
#include <stdlib.h>
#include <string.h>

#include "../../common/trace_walk.h"
#include "../cli.h"
#include "plot.h"

static void dec_flush(decimator *d) {
  if (d->count == 0)
    return;
  /* Up to four distinct points, emitted in the order they came. */
  struct {
    size_t s;
    pt p;
  } k[4] = {{d->s_first, d->first}, {d->s_lo, d->lo}, {d->s_hi, d->hi}, {d->s_last, d->last}};
  for (int i = 1; i < 4; i++)
    for (int j = i; j > 0 && k[j].s < k[j - 1].s; j--) {
      __typeof__(k[0]) t = k[j];
      k[j] = k[j - 1];
      k[j - 1] = t;
    }
  /* x never goes back, so each bucket is flushed once: at most 4 * BUCKETS points (the check is a guard). */
  for (int i = 0; i < 4 && d->n < DEC_CAP; i++)
    if (i == 0 || k[i].s != k[i - 1].s)
      d->out[d->n++] = k[i].p;
  d->count = 0;
}

static void dec_push(decimator *d, double x, double y) {
  long b = d->span > 0 ? (long)((x - d->x0) / d->span * BUCKETS) : 0;
  if (b < 0)
    b = 0;
  if (b >= BUCKETS)
    b = BUCKETS - 1;
  if (b != d->cur)
    dec_flush(d);
  d->cur = b;
  pt p = {x, y};
  size_t s = d->seq++;
  if (d->count++ == 0) {
    d->first = d->lo = d->hi = p;
    d->s_first = d->s_lo = d->s_hi = s;
  } else if (y < d->lo.y) {
    d->lo = p;
    d->s_lo = s;
  } else if (y > d->hi.y) {
    d->hi = p;
    d->s_hi = s;
  }
  d->last = p;
  d->s_last = s;
}

double as_entry_x(const as_device_trace *t, size_t i, bool by_time) {
  return by_time ? (double)(t->entries[i].time_us - t->entries[0].time_us) / 1e6 : (double)i;
}

/* The x axis: seconds since the first entry where time_us rises through the trace, else the entry
 * index (time_us absent, constant or out of order). */
static void series_axis(const as_device_trace *t, series *s) {
  s->by_time = t->entries[t->n - 1].time_us > t->entries[0].time_us;
  for (size_t i = 1; s->by_time && i < t->n; i++)
    if (t->entries[i].time_us < t->entries[i - 1].time_us)
      s->by_time = false;
  s->x_max = as_entry_x(t, t->n - 1, s->by_time);
  s->x_scale = !s->by_time || s->x_max >= 1.0 ? 1.0 : s->x_max >= 1e-3 ? 1e3 : 1e6;
  s->x_unit = !s->by_time ? "" : s->x_max >= 1.0 ? "s" : s->x_max >= 1e-3 ? "ms" : "&#181;s";
}

/* What one step of the walk does to the allocated (*a) and reserved (*r) bytes. */
static void apply_step(const tw_step *st, uint64_t *a, uint64_t *r, series *s) {
  const as_trace_entry *e = st->e;
  switch (st->kind) {
  case TW_IMPLICIT_FREE: /* allocated twice without a free in between: the later one counts */
  case TW_FREE:
    *a = *a >= st->live->size ? *a - st->live->size : 0;
    return;
  case TW_ALLOC:
    *a = as_sat_add(*a, e->size);
    return;
  case TW_UNKNOWN_FREE:
    s->unknown_frees++;
    return;
  case TW_OTHER:
    break;
  }
  if (e->action == AS_SEGMENT_ALLOC || e->action == AS_SEGMENT_MAP)
    *r = as_sat_add(*r, e->size);
  else if (e->action == AS_SEGMENT_FREE || e->action == AS_SEGMENT_UNMAP)
    *r = *r >= e->size ? *r - e->size : 0;
  else if (e->action == AS_OOM)
    s->n_oom++;
}

/* A line's step at x from *cur to v (vertical, so the line is a staircase), and its peak. */
static void step_to(decimator *d, double x, uint64_t *cur, uint64_t v, uint64_t *peak, double *peak_x) {
  if (v == *cur)
    return;
  dec_push(d, x, (double)*cur);
  dec_push(d, x, (double)v);
  *cur = v;
  if (v > *peak) {
    *peak = v;
    *peak_x = x;
  }
}

/* 0, or -1 on host OOM. */
int as_build_series(const as_device_trace *t, series *s) {
  memset(s, 0, sizeof *s);
  if (t == NULL || t->n == 0) {
    s->empty = true;
    return 0;
  }
  series_axis(t, s);
  s->alloc.out = malloc(DEC_CAP * sizeof(pt));
  s->reserved.out = malloc(DEC_CAP * sizeof(pt));
  tw_walk w;
  if (s->alloc.out == NULL || s->reserved.out == NULL || tw_begin(&w, t, 1) != 0)
    return -1;
  decimator *da = &s->alloc, *dr = &s->reserved;
  da->x0 = dr->x0 = 0;
  da->span = dr->span = s->x_max;
  da->cur = dr->cur = -1;
  uint64_t alloc = 0, reserved = 0, a = 0, r = 0;
  dec_push(da, 0, 0);
  dec_push(dr, 0, 0);
  tw_step st;
  int more;
  while ((more = tw_next(&w, &st)) > 0) {
    apply_step(&st, &a, &r, s);
    if (st.kind == TW_IMPLICIT_FREE)
      continue; /* its entry's TW_ALLOC comes next: the two are one step of the line */
    double x = as_entry_x(t, st.index, s->by_time);
    step_to(da, x, &alloc, a, &s->peak_alloc, &s->peak_alloc_x);
    step_to(dr, x, &reserved, r, &s->peak_reserved, &s->peak_reserved_x);
  }
  tw_end(&w);
  if (more < 0)
    return -1;
  dec_push(da, s->x_max, (double)alloc);
  dec_push(dr, s->x_max, (double)reserved);
  dec_flush(da);
  dec_flush(dr);
  s->end_alloc = alloc;
  s->end_reserved = reserved;
  return 0;
}

void as_series_free(series *s) {
  free(s->alloc.out);
  free(s->reserved.out);
}
