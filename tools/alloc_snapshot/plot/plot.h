/* alloc_snapshot plot: what the files of plot/ share: the page's geometry, the page being written
 * (svg.c), the trace reduced to two lines (series.c), the chart (chart.c) and the segment map
 * (segmap.c); plot.c lays out the page and holds the command. */
#ifndef ALLOC_SNAPSHOT_PLOT_H
#define ALLOC_SNAPSHOT_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../../common/snapshot_reader.h"

/* --- page geometry (CSS pixels) --- */
enum {
  PAGE_W = 1320,   /* width of both SVGs */
  CHART_H = 380,   /* the memory-over-time chart */
  CHART_L = 84,    /* its left margin (y labels) */
  CHART_R = 24,    /* right margin */
  CHART_T = 44,    /* top margin (the peaks' labels) */
  CHART_B = 46,    /* bottom margin (x labels) */
  BUCKETS = 800,   /* columns of the downsampling (1.5 px each): at most 4 points each per line */
  MAP_LABEL = 300, /* the segment map's label column */
  ROW_H = 12,      /* one row of a segment bar */
  ROW_GAP = 2,     /* between the rows of one segment */
  SEG_GAP = 5,     /* between segments */
  GROUP_H = 26,    /* a group's heading */
  MAX_ROWS_PER_SEGMENT = 4,
  MAX_MAP_SEGMENTS = 2000, /* per device; the largest are drawn */
  MAX_RECTS = 100000,      /* block rects per device, about (merge_px) */
};

/* --- the page: output with a sticky error (checked once at the end) --- */
typedef struct {
  FILE *f;
} page;

void as_out(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The snapshot's allocator settings string, quoted and escaped, or "none in the file" (both pages' headers). */
void as_out_settings(page *p, const as_snapshot *snap);
/* A byte count in binary units ("4.00 MiB"). */
void as_size_text(page *p, uint64_t bytes);
/* The same without a ".00" ("50 MiB"), for rulers. */
void as_size_short(page *p, uint64_t bytes);
/* "4.00 MiB (4194304 B)", for tooltips. */
void as_size_exact(page *p, uint64_t bytes);

/* --- the trace, reduced to two step lines (series.c) --- */
typedef struct {
  double x, y;
} pt;

#define DEC_CAP (4 * (size_t)BUCKETS + 4)

/* Min/max downsampling: the points of one bucket (pixel column) collapse to its first, lowest, highest
 * and last point, in their order. */
typedef struct {
  pt *out;
  size_t n;
  double x0, span;
  long cur;
  size_t count, seq;
  pt first, lo, hi, last;
  size_t s_first, s_lo, s_hi, s_last;
} decimator;

typedef struct {
  bool empty;         /* no entries at all */
  bool by_time;       /* x is seconds since the first entry; else the entry index */
  double x_max;       /* x of the last entry */
  double x_scale;     /* x * x_scale is in x_unit: s, ms or us for time, 1 for the index */
  const char *x_unit;
  decimator alloc, reserved;
  uint64_t peak_alloc, peak_reserved, end_alloc, end_reserved;
  double peak_alloc_x, peak_reserved_x;
  size_t n_oom;
  size_t unknown_frees; /* free_requested of addresses the trace never allocated (trace_walk.h) */
} series;

/* The x of entry i of t: seconds since the first entry by time, else i. */
double as_entry_x(const as_device_trace *t, size_t i, bool by_time);
/* The allocated and reserved lines of trace t (NULL: none; s->empty then). 0, or -1 on host OOM; either
 * way as_series_free frees what it holds. */
int as_build_series(const as_device_trace *t, series *s);
void as_series_free(series *s);

/* --- what is drawn of the trace (chart.c) --- */

/* The colours of the two lines, named. */
void as_chart_legend(page *p);
/* The memory-over-time chart of device `device`'s trace t, reduced to s. */
void as_chart(page *p, const as_device_trace *t, const series *s, int device);
/* The paragraph under the chart: what the trace holds, and how it was drawn; segs[0 .. n) are the
 * device's segments, for the snapshot's own figures. */
void as_trace_notes(page *p, const as_device_trace *t, const series *s, const as_segment *const *segs, size_t n);

/* --- the segment map (segmap.c) --- */

/* segs: the segments to draw, sorted by (pool, type, stream, address); n_all: the device's segments,
 * of which those not drawn hold omitted_bytes. */
void as_segment_map(page *p, const as_segment *const *segs, size_t n, size_t n_all, uint64_t omitted_bytes,
                    int device);

/* --- the explorer page (explorer.c, explorer_data.c) --- */

/* The whole explorer page of devices[0 .. n_devices). 0, or -1 on host OOM. */
int as_write_explorer(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices);
/* The snapshot's data as the page's JSON document (explorer_data.c describes it). 0, or -1 on host OOM. */
int as_explorer_data(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices);

#endif
