/* alloc_snapshot plot: one self-contained HTML page of a snapshot, per device: a summary, the memory
 * over time from the device trace (allocated and reserved, as SVG polylines) and the segment map (every
 * segment a bar, every block in it coloured by state).
 *
 * The page needs nothing else: inline CSS, inline SVG, no script, no font or image files, no link to
 * anything; tooltips are SVG <title> elements. Every text that comes from the input (the file name, the
 * allocator's config string) is escaped. The polylines are downsampled to at most 4 points per pixel
 * column (first, lowest, highest and last value of the column), so a trace of millions of entries stays
 * a page a browser draws at once and every peak is still drawn at its height. OUT is written as
 * common/outfile.h says: a regular file is replaced atomically, anything else written through. */
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/outfile.h"
#include "../cli.h"
#include "../../common/snapshot_reader.h"
#include "../../common/trace_walk.h"
#include "../summary.h"

static const char help[] =
    "usage: alloc_snapshot plot FILE -o OUT.html [--device N]\n"
    "\n"
    "Draws a memory snapshot (cachalot's or PyTorch's JSON, gzip'ed or not; '-' is stdin) as one\n"
    "self-contained HTML page (inline SVG and CSS; no script, no network), one section per device:\n"
    "  - a summary: segments, blocks, reserved, allocated, pending free and inactive bytes;\n"
    "  - memory over time from the device trace: allocated (the live sizes of alloc entries, until\n"
    "    their free_requested) and reserved (segment_alloc - segment_free, segment_map - segment_unmap),\n"
    "    over time_us (or over the entry index where time_us is absent or out of order), with the peaks\n"
    "    marked; long traces are downsampled keeping every pixel column's lowest and highest value;\n"
    "  - the segment map: a bar per segment, grouped by pool id, segment type and stream, its blocks\n"
    "    coloured by state (active_allocated, active_pending_free, inactive); a bar's length is\n"
    "    proportional to its size, and a segment longer than one row wraps onto the next rows (the\n"
    "    row's length, chosen per device so that small and large segments both show, is on the page);\n"
    "    at most the 2000 largest segments of a device are drawn, and blocks too narrow to see are\n"
    "    drawn merged (their tooltip counts them).\n"
    "Hovering a block shows its address, size and requested size.\n"
    "\n"
    "options:\n"
    "  -o OUT.html   where to write the page (required; '-' is standard output); a regular file\n"
    "                is replaced atomically (written beside it, then renamed), anything else (a\n"
    "                device, a FIFO) is written through; a symbolic link stays a link\n"
    "  --device N    only device N (default: every device with segments or trace entries)\n"
    "  -h, --help    this text\n"
    "\n"
    "Exit status: 0 success, 1 unreadable or malformed file, nothing on the device, or OUT cannot be\n"
    "written, 2 usage error.\n";

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
#define MAP_W ((double)(PAGE_W - MAP_LABEL - 10))
#define MIN_SEG_PX 2.0

static const char *const state_color[] = {"#2f6fd0", "#f29d38", "#d3d8df"};
static const char *const state_meaning[] = {
    "in use by the program",
    "freed by the program, waiting for its streams' events before reuse",
    "free: cached in the segment, reusable",
};
#define COLOR_RESERVED "#5b6470"
#define COLOR_ALLOCATED "#2f6fd0"

/* --- output with a sticky error (checked once at the end) --- */
typedef struct {
  FILE *f;
} page;

static void w(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w(page *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->f, fmt, ap);
  va_end(ap);
}

/* Text escaped for HTML element content and attribute values; control characters become U+FFFD, so
 * the page stays valid whatever bytes a file name holds. */
static void esc(page *p, const char *s) {
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    switch (*c) {
    case '&':
      fputs("&amp;", p->f);
      break;
    case '<':
      fputs("&lt;", p->f);
      break;
    case '>':
      fputs("&gt;", p->f);
      break;
    case '"':
      fputs("&quot;", p->f);
      break;
    case '\'':
      fputs("&#39;", p->f);
      break;
    default:
      if (*c < 0x20 || *c == 0x7f)
        fputs("&#xFFFD;", p->f);
      else
        fputc(*c, p->f);
    }
  }
}

static void size_text(page *p, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  w(p, "%s", as_fmt_size(buf, bytes, false));
}

/* The same without a ".00" ("50 MiB"), for rulers. */
static void size_short(page *p, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  as_fmt_size(buf, bytes, false);
  char *dot = strstr(buf, ".00 ");
  if (dot != NULL)
    memmove(dot, dot + 3, strlen(dot + 3) + 1);
  w(p, "%s", buf);
}

/* "4.00 MiB (4194304 B)", for tooltips. */
static void size_exact(page *p, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  if (bytes < 1024)
    w(p, "%" PRIu64 " B", bytes);
  else
    w(p, "%s (%" PRIu64 " B)", as_fmt_size(buf, bytes, false), bytes);
}

/* --- nice axis ticks, without libm --- */
static double nice_step(double range, int target) {
  if (!(range > 0))
    return 1.0;
  double raw = range / target, mag = 1.0;
  while (mag * 10.0 <= raw)
    mag *= 10.0;
  while (mag > raw)
    mag /= 10.0;
  double f = raw / mag;
  double step = (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 2.5 ? 2.5 : f <= 5.0 ? 5.0 : 10.0) * mag;
  return step > 0 && step >= range / 100 ? step : range; /* never 0: the tick loops end */
}

/* Decimals that print every multiple of `step` exactly enough. */
static int step_decimals(double step) {
  int d = 0;
  for (double s = step; d < 6; d++, s *= 10.0) {
    double frac = s - (double)(long long)s;
    if (frac < 1e-6 || frac > 1.0 - 1e-6)
      break;
  }
  return d;
}

/* --- the trace, reduced to two step lines --- */
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

static double entry_x(const as_device_trace *t, size_t i, bool by_time) {
  return by_time ? (double)(t->entries[i].time_us - t->entries[0].time_us) / 1e6 : (double)i;
}

/* The x axis: seconds since the first entry where time_us rises through the trace, else the entry
 * index (time_us absent, constant or out of order). */
static void series_axis(const as_device_trace *t, series *s) {
  s->by_time = t->entries[t->n - 1].time_us > t->entries[0].time_us;
  for (size_t i = 1; s->by_time && i < t->n; i++)
    if (t->entries[i].time_us < t->entries[i - 1].time_us)
      s->by_time = false;
  s->x_max = entry_x(t, t->n - 1, s->by_time);
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
static int build_series(const as_device_trace *t, series *s) {
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
    double x = entry_x(t, st.index, s->by_time);
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

static void series_free(series *s) {
  free(s->alloc.out);
  free(s->reserved.out);
}

/* --- the chart --- */
typedef struct {
  double x_span, y_max; /* data ranges: [0, x_span] x [0, y_max] */
  double px0, py0, pw, ph;
} frame;

static double fx(const frame *f, double x) { return f->px0 + (f->x_span > 0 ? x / f->x_span : 0) * f->pw; }
static double fy(const frame *f, double y) { return f->py0 + f->ph - (f->y_max > 0 ? y / f->y_max : 0) * f->ph; }

static void polyline(page *p, const frame *f, const decimator *d, const char *color, bool fill) {
  if (fill) {
    w(p, "<polygon fill=\"%s\" fill-opacity=\"0.13\" stroke=\"none\" points=\"", color);
    for (size_t i = 0; i < d->n; i++)
      w(p, "%.1f,%.1f ", fx(f, d->out[i].x), fy(f, d->out[i].y));
    w(p, "%.1f,%.1f %.1f,%.1f\"/>\n", fx(f, d->out[d->n - 1].x), fy(f, 0), fx(f, d->out[0].x), fy(f, 0));
  }
  w(p, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"", color);
  for (size_t i = 0; i < d->n; i++)
    w(p, "%s%.1f,%.1f", i ? " " : "", fx(f, d->out[i].x), fy(f, d->out[i].y));
  w(p, "\"/>\n");
}

static void x_value(page *p, const series *s, double x, int decimals) {
  if (s->by_time)
    w(p, "%.*f %s", decimals, x * s->x_scale, s->x_unit);
  else
    w(p, "entry %.0f", x);
}

static void peak_marker(page *p, const frame *f, const series *s, double x, uint64_t y, const char *what,
                        const char *color, int line, int decimals) {
  double cx = fx(f, x), cy = fy(f, (double)y);
  w(p, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"1.5\"/>\n", cx, cy, color);
  /* The label sits above the plot area's top edge line by line, anchored towards the middle. */
  bool right_half = cx > f->px0 + f->pw * 0.6;
  double ty = f->py0 - 6 - 15.0 * line;
  w(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"2,2\"/>\n", cx, cy - 5,
    cx, ty + 3, color);
  w(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"12\" fill=\"%s\">%s ", right_half ? cx - 4 : cx + 4,
    ty, right_half ? "end" : "start", color, what);
  size_text(p, y);
  w(p, " at ");
  x_value(p, s, x, decimals);
  w(p, "</text>\n");
}

static void chart(page *p, const as_device_trace *t, const series *s, int device) {
  uint64_t top = s->peak_reserved > s->peak_alloc ? s->peak_reserved : s->peak_alloc;
  /* The y unit: MiB or GiB for what a program holds, others only for tiny or absurd traces. */
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 2;
  while (u > 0 && top < (uint64_t)1 << (10 * u))
    u--;
  while (u < 6 && top >= (uint64_t)1 << (10 * (u + 1)))
    u++;
  double unit = (double)((uint64_t)1 << (10 * u));
  const char *uname = units[u];
  double y_step = nice_step(top > 0 ? (double)top / unit : 1.0, 6);
  if (u == 0 && y_step < 1.0) /* no fractions of a byte */
    y_step = 1.0;
  double y_max = y_step;
  while (y_max * unit < (double)top * 1.0001)
    y_max += y_step;
  double x_scale = s->x_scale;
  double x_span = s->x_max > 0 ? s->x_max : 1.0;
  double x_step = nice_step(x_span * x_scale, 10) / x_scale;
  frame f = {.x_span = x_span,
             .y_max = y_max * unit,
             .px0 = CHART_L,
             .py0 = CHART_T,
             .pw = PAGE_W - CHART_L - CHART_R,
             .ph = CHART_H - CHART_T - CHART_B};

  w(p, "<svg class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
       "aria-label=\"memory over time, device %d\">\n",
    PAGE_W, CHART_H, PAGE_W, CHART_H, device);
  w(p, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fbfbfc\" stroke=\"#c8ccd2\"/>\n", f.px0,
    f.py0, f.pw, f.ph);
  /* y grid and labels */
  int yd = step_decimals(y_step);
  for (double v = 0; v <= y_max + y_step * 1e-6 && v / y_step < 100; v += y_step) {
    double y = fy(&f, v * unit);
    if (v > 0)
      w(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e6ea\"/>\n", f.px0, y, f.px0 + f.pw, y);
    w(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\" fill=\"#444\">%.*f %s</text>\n", f.px0 - 6,
      y + 4, yd, v, uname);
  }
  /* x grid and labels */
  int xd = step_decimals(x_step * x_scale);
  for (double v = 0; v <= x_span + x_step * 1e-6 && v / x_step < 100; v += x_step) {
    double x = fx(&f, v);
    w(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", x, f.py0 + f.ph, x,
      v > 0 ? f.py0 : f.py0 + f.ph + 4, v > 0 ? "#eef0f3" : "#c8ccd2");
    w(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\" fill=\"#444\">%.*f</text>\n", x,
      f.py0 + f.ph + 17, xd, v * x_scale);
  }
  w(p, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222\">%s</text>\n", f.px0 + f.pw / 2,
    CHART_H - 8,
    !s->by_time ? "trace entry (index; time_us is absent, constant or out of order)"
    : x_scale == 1.0 ? "time since the first trace entry (s)"
    : x_scale == 1e3 ? "time since the first trace entry (ms)"
                     : "time since the first trace entry (&#181;s)");
  w(p, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" "
       "fill=\"#222\">memory (%s)</text>\n",
    f.py0 + f.ph / 2, uname);

  /* OOMs: red vertical lines */
  for (size_t i = 0; i < t->n; i++) {
    if (t->entries[i].action != AS_OOM)
      continue;
    double x = fx(&f, entry_x(t, i, s->by_time));
    w(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1.5\" "
         "stroke-dasharray=\"4,3\"><title>oom (entry %zu): asked for ",
      x, f.py0, x, f.py0 + f.ph, i);
    size_exact(p, t->entries[i].size);
    w(p, ", device free ");
    size_exact(p, t->entries[i].addr);
    w(p, "</title></line>\n");
  }

  polyline(p, &f, &s->reserved, COLOR_RESERVED, true);
  polyline(p, &f, &s->alloc, COLOR_ALLOCATED, true);
  if (s->peak_alloc > 0)
    peak_marker(p, &f, s, s->peak_alloc_x, s->peak_alloc, "peak allocated", COLOR_ALLOCATED, 0, xd + 1);
  if (s->peak_reserved > 0)
    peak_marker(p, &f, s, s->peak_reserved_x, s->peak_reserved, "peak reserved", COLOR_RESERVED, 1, xd + 1);
  w(p, "</svg>\n");
}

/* --- the segment map --- */

/* The row lengths a segment map may use: 1, 2, 2.5 and 5 times a power of ten, in bytes below 4 KiB,
 * in KiB below 4 MiB, else in MiB, so that the ruler reads "50 MiB, 100 MiB, ...". Index k of the
 * sequence; 0 once it is too large for 64 bits. */
static uint64_t nice_row(int k, uint64_t unit) {
  static const uint64_t mant[] = {10, 20, 25, 50}; /* tenths */
  uint64_t pow10 = 1;
  for (int e = 0; e < k / 4; e++) {
    if (pow10 > UINT64_MAX / 10)
      return 0;
    pow10 *= 10;
  }
  if (pow10 > UINT64_MAX / unit / 50)
    return 0;
  return mant[k % 4] * pow10 * unit / 10;
}

/* Bytes per full row: the smallest "nice" length (nice_row) that fits the largest segment in one row,
 * shortened (down to a quarter of the largest, which then takes four rows) only while the smallest
 * segment would be narrower than 40 px, so that one-size snapshots keep one row per segment and mixed
 * ones show both their largest and smallest segments. */
static uint64_t row_bytes(const as_segment *const *segs, size_t n) {
  uint64_t largest = 0, smallest = UINT64_MAX;
  for (size_t i = 0; i < n; i++) {
    if (segs[i]->total_size > largest)
      largest = segs[i]->total_size;
    if (segs[i]->total_size < smallest)
      smallest = segs[i]->total_size;
  }
  uint64_t unit = largest >= ((uint64_t)4 << 20) ? (uint64_t)1 << 20 : largest >= 4096 ? 1024 : 1;
  uint64_t quarter = largest / MAX_ROWS_PER_SEGMENT + (largest % MAX_ROWS_PER_SEGMENT != 0);
  int k = 0;
  while (nice_row(k + 1, unit) != 0 && nice_row(k, unit) < largest)
    k++;
  if (nice_row(k, unit) < largest) /* beyond the sequence (only a hostile file): the largest is one row */
    return largest;
  while (k > 0 && nice_row(k - 1, unit) >= quarter && (double)smallest / (double)nice_row(k, unit) * MAP_W < 40.0)
    k--;
  return nice_row(k, unit);
}

static double segment_px(const as_segment *s, uint64_t row) {
  double px = (double)s->total_size / (double)row * MAP_W;
  return px < MIN_SEG_PX ? MIN_SEG_PX : px;
}

static int segment_rows(double px) {
  int rows = 1;
  while (rows < MAX_ROWS_PER_SEGMENT && px > MAP_W * rows + 0.01)
    rows++;
  return rows;
}

static void pool_text(page *p, const uint64_t pool_id[2]) {
  char buf[AS_POOL_BUF];
  w(p, "%s", as_fmt_pool(buf, pool_id));
}

/* A tooltip's text, built up with snprintf (it holds only numbers and fixed words: no escaping). */
typedef struct {
  char s[640];
  size_t n;
} tip;

static void tcat(tip *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tcat(tip *t, const char *fmt, ...) {
  if (t->n >= sizeof t->s - 1)
    return;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(t->s + t->n, sizeof t->s - t->n, fmt, ap);
  va_end(ap);
  if (m > 0)
    t->n = t->n + (size_t)m < sizeof t->s ? t->n + (size_t)m : sizeof t->s - 1;
}

static void tsize(tip *t, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  if (bytes < 1024)
    tcat(t, "%" PRIu64 " B", bytes);
  else
    tcat(t, "%s (%" PRIu64 " B)", as_fmt_size(buf, bytes, false), bytes);
}

static void tsegment(tip *t, const as_segment *seg) {
  char pool[AS_POOL_BUF];
  tcat(t, "\nin segment 0x%" PRIx64 " (pool %s, stream %" PRIu64 ")", seg->address, as_fmt_pool(pool, seg->pool_id),
       seg->stream);
}

/* Draws [a, b) px of a segment laid out from (x0, y0), wrapped at MAP_W, as rects of `fill` with the
 * tooltip `title` (none when NULL). */
static void wrapped_rects(page *p, double x0, double y0, double a, double b, const char *fill, const char *cls,
                          const tip *title) {
  for (int row = (int)(a / MAP_W); row < MAX_ROWS_PER_SEGMENT && a < b; row++) {
    double row_start = row * MAP_W, row_end = row_start + MAP_W;
    if (a >= row_end)
      continue;
    double e = b < row_end ? b : row_end;
    w(p, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\">%s%s%s</rect>\n", cls,
      x0 + a - row_start, y0 + row * (ROW_H + ROW_GAP), e - a, ROW_H, fill, title ? "<title>" : "",
      title ? title->s : "", title ? "</title>" : "");
    a = e;
  }
}

/* Blocks narrower than `min_px` (a pixel, more on a huge map: see merge_px) are drawn merged into runs
 * of at least twice that, coloured by the state holding most of the run's bytes, so that a segment of a
 * million small blocks is a few hundred rects; the run's tooltip says how many blocks of each state it
 * holds. */
typedef struct {
  size_t count;
  double a, b;                  /* px */
  uint64_t first, last_end;     /* addresses */
  uint64_t bytes[3], blocks[3]; /* per state */
} run;

static void run_flush(page *p, run *r, double x0, double y, const as_segment *seg) {
  if (r->count == 0)
    return;
  int major = 0;
  for (int st = 1; st < 3; st++)
    if (r->bytes[st] > r->bytes[major])
      major = st;
  tip t = {.n = 0};
  tcat(&t, "%zu blocks 0x%" PRIx64 "..0x%" PRIx64 ", too narrow to draw one by one, drawn as one in the colour "
           "of the state with most bytes:",
       r->count, r->first, r->last_end);
  for (int st = 0; st < 3; st++)
    if (r->blocks[st] > 0) {
      tcat(&t, "\n%" PRIu64 " %s, ", r->blocks[st], as_block_state_name((as_block_state)st));
      tsize(&t, r->bytes[st]);
    }
  tsegment(&t, seg);
  wrapped_rects(p, x0, y, r->a, r->b, state_color[major], "b", &t);
  memset(r, 0, sizeof *r);
}

/* One segment from y; returns its height. */
static double draw_segment(page *p, const as_segment *s, uint64_t row, double y, double min_px) {
  double px = segment_px(s, row);
  int rows = segment_rows(px);
  double x0 = MAP_LABEL;
  /* label: address left, size right, the details as a tooltip */
  w(p, "<g><title>segment 0x%" PRIx64 "\nsize ", s->address);
  size_exact(p, s->total_size);
  w(p, "\nallocated ");
  size_exact(p, s->allocated_size);
  w(p, ", active ");
  size_exact(p, s->active_size);
  w(p, ", requested ");
  size_exact(p, s->requested_size);
  w(p, "\n%zu block%s, pool ", s->n_blocks, s->n_blocks == 1 ? "" : "s");
  pool_text(p, s->pool_id);
  w(p, ", %s, stream %" PRIu64 "%s</title>", s->small ? "small" : "large", s->stream,
    s->is_expandable ? ", expandable" : "");
  w(p, "<text class=\"mono\" x=\"4\" y=\"%.1f\" font-size=\"11\" fill=\"#333\">0x%" PRIx64 "</text>", y + ROW_H - 2,
    s->address);
  w(p, "<text class=\"mono\" x=\"%d\" y=\"%.1f\" font-size=\"11\" fill=\"#333\" text-anchor=\"end\">", MAP_LABEL - 8,
    y + ROW_H - 2);
  size_text(p, s->total_size);
  w(p, "%s</text></g>\n", s->is_expandable ? " (exp)" : "");
  if (rows > 1) /* a bracket joins the rows of one segment */
    w(p, "<path d=\"M%d %.1fh-4v%.1fh4\" fill=\"none\" stroke=\"#8a919c\"/>\n", MAP_LABEL - 2, y + 1,
      (double)(rows * (ROW_H + ROW_GAP) - ROW_GAP - 2));
  /* background (white: gaps no block covers), blocks, outline */
  wrapped_rects(p, x0, y, 0, px, "#ffffff", "s", NULL);
  double k = s->total_size > 0 ? px / (double)s->total_size : 0;
  run r = {.count = 0};
  for (size_t i = 0; i < s->n_blocks; i++) {
    const as_block *b = &s->blocks[i];
    if (b->address < s->address || b->address - s->address >= s->total_size || b->size == 0)
      continue; /* outside the segment: nothing to draw */
    uint64_t off = b->address - s->address;
    uint64_t end = b->size > s->total_size - off ? s->total_size : off + b->size;
    double a = (double)off * k, e = (double)end * k;
    if (e - a >= min_px || (r.count > 0 && (a < r.a || a > r.b + 0.5))) /* wide, or not next to the run */
      run_flush(p, &r, x0, y, s);
    if (e - a >= min_px) {
      tip t = {.n = 0};
      tcat(&t, "%s block 0x%" PRIx64 "\nsize ", as_block_state_name(b->state), b->address);
      tsize(&t, b->size);
      tcat(&t, "\nrequested ");
      tsize(&t, b->requested_size);
      tsegment(&t, s);
      wrapped_rects(p, x0, y, a, e, state_color[b->state], "b", &t);
      continue;
    }
    if (r.count++ == 0) {
      r.a = a;
      r.first = b->address;
    }
    r.b = e > r.b ? e : r.b;
    r.last_end = b->address + (end - off);
    r.bytes[b->state] = as_sat_add(r.bytes[b->state], end - off);
    r.blocks[b->state]++;
    if (r.b - r.a >= 2 * min_px)
      run_flush(p, &r, x0, y, s);
  }
  run_flush(p, &r, x0, y, s);
  for (int r = 0; r < rows; r++) {
    double wr = px - r * MAP_W;
    if (wr > MAP_W)
      wr = MAP_W;
    w(p, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"none\" stroke=\"#5f6672\" "
         "stroke-width=\"0.8\" pointer-events=\"none\"/>\n",
      x0, y + r * (ROW_H + ROW_GAP), wr, ROW_H);
  }
  return rows * (ROW_H + ROW_GAP) - ROW_GAP + SEG_GAP;
}

static void legend_states(page *p) {
  w(p, "<ul class=\"legend\">\n");
  for (int st = AS_ACTIVE_ALLOCATED; st <= AS_INACTIVE; st++)
    w(p, "<li><span class=\"sw\" style=\"background:%s\"></span><b>%s</b>: %s</li>\n", state_color[st],
      as_block_state_name((as_block_state)st), state_meaning[st]);
  w(p, "</ul>\n");
}

/* The width under which blocks are merged into runs: a pixel, doubled until the map holds at most about
 * MAX_RECTS block rects (a long page of tiny blocks would otherwise be hundreds of MB of SVG). */
static double merge_px(const as_segment *const *segs, size_t n, uint64_t row) {
  double min_px = 1.0;
  for (int pass = 0; pass < 40; pass++, min_px *= 2) {
    double rects = 0;
    for (size_t i = 0; i < n; i++) {
      const as_segment *s = segs[i];
      double k = s->total_size > 0 ? segment_px(s, row) / (double)s->total_size : 0, narrow = 0;
      for (size_t j = 0; j < s->n_blocks; j++) {
        double bpx = (double)s->blocks[j].size * k;
        if (bpx >= min_px)
          rects += 1;
        else
          narrow += bpx;
      }
      rects += 1 + narrow / min_px;
    }
    if (rects <= MAX_RECTS)
      break;
  }
  return min_px;
}

/* segs: the segments to draw, sorted by (pool, type, stream, address); n_all: the device's segments,
 * of which those not drawn hold omitted_bytes. */
static void segment_map(page *p, const as_segment *const *segs, size_t n, size_t n_all, uint64_t omitted_bytes,
                        int device) {
  if (n == 0) {
    w(p, "<p class=\"empty\">Device %d has no segments in this snapshot (nothing reserved).</p>\n", device);
    return;
  }
  uint64_t row = row_bytes(segs, n);
  double min_px = merge_px(segs, n, row);
  w(p, "<p class=\"note\">One bar per segment (one device allocation), grouped by pool id, segment type and "
       "stream, in address order. A bar's length is proportional to the segment's size: a full row is ");
  size_text(p, row);
  w(p, ", and a longer segment wraps onto the next rows (one narrower than %.0f px is drawn %.0f px wide). "
       "Blocks are drawn at their offsets in the segment; hover over one for its address, size and requested "
       "size, over a label for the segment's.",
    MIN_SEG_PX, MIN_SEG_PX);
  if (min_px > 1.0)
    w(p, " Blocks narrower than %.0f px are drawn merged, in the colour of the state with most bytes (their "
         "tooltip counts them).",
      min_px);
  else
    w(p, " Blocks narrower than a pixel are drawn merged, in the colour of the state with most bytes (their "
         "tooltip counts them).");
  if (n < n_all) {
    w(p, " <b>Only the %zu largest of the device's %zu segments are drawn</b>; the other %zu hold ", n, n_all,
      n_all - n);
    size_text(p, omitted_bytes);
    w(p, " (<code>alloc_snapshot segments FILE --device %d</code> lists them all).", device);
  }
  w(p, "</p>\n");
  legend_states(p);
  /* The height first, then the drawing. */
  double height = 22;
  for (size_t i = 0; i < n; i++) {
    as_group_key ki = as_segment_key(segs[i]), kp = i > 0 ? as_segment_key(segs[i - 1]) : ki;
    if (i == 0 || as_key_cmp(&ki, &kp) != 0)
      height += GROUP_H;
    height += segment_rows(segment_px(segs[i], row)) * (ROW_H + ROW_GAP) - ROW_GAP + SEG_GAP;
  }
  w(p, "<svg class=\"map\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\" role=\"img\" "
       "aria-label=\"segment map, device %d\">\n",
    PAGE_W, height, PAGE_W, height, device);
  /* the scale: a ruler over one full row */
  w(p, "<line x1=\"%d\" y1=\"14\" x2=\"%.1f\" y2=\"14\" stroke=\"#888\"/>\n", MAP_LABEL, MAP_LABEL + MAP_W);
  /* Five divisions where they are whole units (40 MiB of 200 MiB), else four. */
  int divs = row % 5 == 0 && (row / 5) % (row >= ((uint64_t)4 << 20) ? (uint64_t)1 << 20 : row >= 4096 ? 1024 : 1) == 0
                 ? 5
                 : 4;
  for (int q = 0; q <= divs; q++) {
    double x = MAP_LABEL + MAP_W * q / divs;
    w(p, "<line x1=\"%.1f\" y1=\"10\" x2=\"%.1f\" y2=\"18\" stroke=\"#888\"/>", x, x);
    w(p, "<text x=\"%.1f\" y=\"8\" font-size=\"11\" fill=\"#555\" text-anchor=\"%s\">", x,
      q == 0 ? "start" : q == divs ? "end" : "middle");
    size_short(p, q == divs ? row : row / (uint64_t)divs * (uint64_t)q);
    w(p, "</text>\n");
  }
  double y = 22;
  for (size_t i = 0; i < n;) {
    /* one group: [i, j) */
    size_t j = i + 1;
    as_group g = {.key = as_segment_key(segs[i])};
    as_group_add(&g, segs[i]);
    for (; j < n; j++) {
      as_group_key kj = as_segment_key(segs[j]);
      if (as_key_cmp(&g.key, &kj) != 0)
        break;
      as_group_add(&g, segs[j]);
    }
    w(p, "<text x=\"4\" y=\"%.1f\" font-size=\"13\" fill=\"#111\"><tspan font-weight=\"bold\">pool ", y + 17);
    pool_text(p, g.key.pool_id);
    w(p, "%s · %s · stream %" PRIu64 "</tspan>", g.key.pool_id[0] == 0 && g.key.pool_id[1] == 0 ? " (default)" : "",
      g.key.small ? "small" : "large", g.key.stream);
    w(p, "<tspan fill=\"#555\"> — %" PRIu64 " segment%s, ", g.segments, g.segments == 1 ? "" : "s");
    size_text(p, g.reserved);
    w(p, " reserved, ");
    size_text(p, g.allocated);
    w(p, " allocated, ");
    size_text(p, g.active - (g.active >= g.allocated ? g.allocated : g.active));
    w(p, " pending free, ");
    size_text(p, g.free);
    w(p, " inactive</tspan></text>\n");
    y += GROUP_H;
    for (; i < j; i++)
      y += draw_segment(p, segs[i], row, y, min_px);
  }
  w(p, "</svg>\n");
}

/* --- one device, the page, the command --- */

static void summary_table(page *p, const as_segment *const *segs, size_t n, const as_device_trace *t,
                          const series *s) {
  uint64_t reserved = 0, by_state[3] = {0, 0, 0}, requested = 0, blocks = 0;
  for (size_t i = 0; i < n; i++) {
    reserved = as_sat_add(reserved, segs[i]->total_size);
    requested = as_sat_add(requested, segs[i]->requested_size);
    blocks = as_sat_add(blocks, segs[i]->n_blocks);
    for (size_t k = 0; k < segs[i]->n_blocks; k++)
      by_state[segs[i]->blocks[k].state] = as_sat_add(by_state[segs[i]->blocks[k].state], segs[i]->blocks[k].size);
  }
  w(p, "<table class=\"sum\"><tr><th>segments</th><th>blocks</th><th>reserved</th><th>active_allocated</th>"
       "<th>active_pending_free</th><th>inactive</th><th>requested</th><th>trace entries</th>"
       "<th>trace peak allocated</th><th>trace peak reserved</th></tr>\n<tr>");
  w(p, "<td>%zu</td><td>%" PRIu64 "</td><td>", n, blocks);
  size_text(p, reserved);
  for (int st = 0; st < 3; st++) {
    w(p, "</td><td>");
    size_text(p, by_state[st]);
  }
  w(p, "</td><td>");
  size_text(p, requested);
  w(p, "</td><td>%zu</td><td>", t != NULL ? t->n : 0);
  if (s->empty)
    w(p, "-</td><td>-");
  else {
    size_text(p, s->peak_alloc);
    w(p, "</td><td>");
    size_text(p, s->peak_reserved);
  }
  w(p, "</td></tr></table>\n");
}

static void trace_notes(page *p, const as_device_trace *t, const series *s, const as_segment *const *segs, size_t n) {
  size_t counts[AS_ACTION_OTHER + 1] = {0};
  for (size_t i = 0; i < t->n; i++)
    counts[t->entries[i].action]++;
  w(p, "<p class=\"note\">%zu trace entries (", t->n);
  bool first = true;
  for (int a = 0; a <= AS_ACTION_OTHER; a++)
    if (counts[a] > 0) {
      w(p, "%s%zu %s", first ? "" : ", ", counts[a], a == AS_ACTION_OTHER ? "of other actions" : as_action_name(a));
      first = false;
    }
  w(p, ") over ");
  if (s->by_time)
    w(p, "%.2f %s", s->x_max * s->x_scale, s->x_unit);
  else
    w(p, "%zu entries", t->n);
  w(p, "; each line is drawn with at most %zu points (%zu and %zu here: of every pixel column the first, lowest, "
       "highest and last value are kept, so the peaks are exact). The trace starts empty: memory that was live "
       "before recording began is not in these lines. At the trace's end: ",
    (size_t)4 * BUCKETS, s->alloc.n, s->reserved.n);
  size_text(p, s->end_alloc);
  w(p, " allocated, ");
  size_text(p, s->end_reserved);
  w(p, " reserved");
  if (n > 0) {
    uint64_t reserved = 0, allocated = 0;
    for (size_t i = 0; i < n; i++) {
      reserved = as_sat_add(reserved, segs[i]->total_size);
      for (size_t k = 0; k < segs[i]->n_blocks; k++)
        if (segs[i]->blocks[k].state != AS_INACTIVE)
          allocated = as_sat_add(allocated, segs[i]->blocks[k].size);
    }
    w(p, " (the snapshot's segments: ");
    size_text(p, allocated);
    w(p, " in active blocks, ");
    size_text(p, reserved);
    w(p, " reserved)");
  }
  w(p, ".");
  if (s->unknown_frees > 0)
    w(p, " %zu free_requested entr%s free addresses the trace never allocated (allocated before it began); they "
         "are not counted.",
      s->unknown_frees, s->unknown_frees == 1 ? "y" : "ies");
  if (s->n_oom > 0)
    w(p, " <b style=\"color:#d62728\">%zu OOM%s</b> (dashed red lines).", s->n_oom, s->n_oom == 1 ? "" : "s");
  w(p, "</p>\n");
}

static void chart_legend(page *p) {
  w(p, "<ul class=\"legend\">\n"
       "<li><span class=\"ln\" style=\"background:%s\"></span><b>reserved</b>: segment_alloc &#8722; segment_free, "
       "segment_map &#8722; segment_unmap (what the allocator holds of the device)</li>\n"
       "<li><span class=\"ln\" style=\"background:%s\"></span><b>allocated</b>: the sizes of live alloc entries, "
       "until their free_requested (what the program holds)</li>\n"
       "</ul>\n",
    COLOR_RESERVED, COLOR_ALLOCATED);
}

static int cmp_segments(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  as_group_key ka = as_segment_key(a), kb = as_segment_key(b);
  int c = as_key_cmp(&ka, &kb);
  return c ? c : a->address < b->address ? -1 : a->address > b->address;
}

static int cmp_largest_first(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  if (a->total_size != b->total_size)
    return a->total_size > b->total_size ? -1 : 1;
  return cmp_segments(pa, pb);
}

/* 0, or -1 on host OOM. */
static int device_section(page *p, const as_snapshot *snap, int device) {
  size_t n = 0;
  for (size_t i = 0; i < snap->n_segments; i++)
    n += snap->segments[i].device == device;
  const as_segment **segs = malloc((n ? n : 1) * sizeof *segs);
  if (segs == NULL)
    return -1;
  n = 0;
  for (size_t i = 0; i < snap->n_segments; i++)
    if (snap->segments[i].device == device)
      segs[n++] = &snap->segments[i];
  qsort(segs, n, sizeof *segs, cmp_segments);
  const as_device_trace *t = (size_t)device < snap->n_devices ? &snap->traces[device] : NULL;
  series s;
  if (build_series(t, &s) != 0) {
    series_free(&s);
    free(segs);
    return -1;
  }
  w(p, "<section>\n<h2>Device %d</h2>\n", device);
  summary_table(p, segs, n, t, &s);
  w(p, "<h3>Memory over time</h3>\n");
  if (s.empty) {
    if (t == NULL)
      w(p, "<p class=\"empty\">The snapshot has no trace for device %d (its device_traces list has %zu entr%s).",
        device, snap->n_devices, snap->n_devices == 1 ? "y" : "ies");
    else
      w(p, "<p class=\"empty\">The trace of device %d is empty: memory history was not being recorded when the "
           "snapshot was taken.",
        device);
    w(p, " Record it with <code>torch.cuda.memory._record_memory_history()</code> in PyTorch or "
         "<code>cachalot_record_history()</code> in cachalot before taking the snapshot.</p>\n");
  } else {
    chart_legend(p);
    chart(p, t, &s, device);
    trace_notes(p, t, &s, segs, n);
  }
  w(p, "<h3>Segment map</h3>\n");
  size_t n_shown = n;
  uint64_t omitted = 0;
  if (n > MAX_MAP_SEGMENTS) {
    /* The largest MAX_MAP_SEGMENTS, back in map order. */
    qsort(segs, n, sizeof *segs, cmp_largest_first);
    for (size_t i = MAX_MAP_SEGMENTS; i < n; i++)
      omitted = as_sat_add(omitted, segs[i]->total_size);
    n_shown = MAX_MAP_SEGMENTS;
    qsort(segs, n_shown, sizeof *segs, cmp_segments);
  }
  segment_map(p, segs, n_shown, n, omitted, device);
  w(p, "</section>\n");
  series_free(&s);
  free(segs);
  return 0;
}

static const char css[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:18px 24px;"
    "color:#1d2126;background:#fff}\n"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:18px;margin:26px 0 8px;padding-bottom:3px;"
    "border-bottom:2px solid #d5d9df}h3{font-size:15px;margin:18px 0 4px}\n"
    "p{margin:4px 0;max-width:1320px}.meta,.note{color:#4b5360;font-size:13px}\n"
    "code,.mono{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace}code{font-size:12.5px}\n"
    "table.sum{border-collapse:collapse;font-size:13px;margin:6px 0}table.sum th{font-weight:600;color:#4b5360;"
    "text-align:right;padding:2px 10px;border-bottom:1px solid #d5d9df}table.sum td{text-align:right;"
    "padding:2px 10px;font-variant-numeric:tabular-nums}\n"
    ".legend{list-style:none;padding:0;margin:6px 0;display:flex;flex-wrap:wrap;gap:6px 22px;font-size:13px}\n"
    ".sw{display:inline-block;width:14px;height:12px;border:1px solid #5f6672;vertical-align:-2px;margin-right:6px}\n"
    ".ln{display:inline-block;width:22px;height:3px;vertical-align:3px;margin-right:6px}\n"
    ".empty{padding:12px 14px;background:#f6f7f9;border:1px dashed #b9bfc8;color:#333}\n"
    "svg{display:block;margin:4px 0}svg text{font-family:system-ui,-apple-system,'Segoe UI',Roboto,"
    "'DejaVu Sans',sans-serif}svg text.mono{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace}\n"
    "svg rect.b:hover{stroke:#000;stroke-width:1.5}\n"
    "footer{margin-top:28px;color:#6b7380;font-size:12px}\n";

static int write_page(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices) {
  w(p, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>memory snapshot: ");
  esc(p, input);
  w(p, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>Memory snapshot: <span class=\"mono\">", css);
  esc(p, input);
  size_t blocks = 0, entries = 0;
  for (size_t i = 0; i < snap->n_segments; i++)
    blocks += snap->segments[i].n_blocks;
  for (size_t d = 0; d < snap->n_devices; d++)
    entries += snap->traces[d].n;
  w(p, "</span></h1>\n<p class=\"meta\">%zu segment%s, %zu block%s, %zu trace entr%s; allocator settings: ",
    snap->n_segments, snap->n_segments == 1 ? "" : "s", blocks, blocks == 1 ? "" : "s", entries,
    entries == 1 ? "y" : "ies");
  if (snap->conf != NULL) {
    w(p, "<code>\"");
    esc(p, snap->conf);
    w(p, "\"</code>");
  } else {
    w(p, "none in the file");
  }
  if (n_devices > 1 || (n_devices == 1 && snap->n_segments + entries > 0))
    w(p, "; device%s shown: ", n_devices == 1 ? "" : "s");
  for (size_t i = 0; i < n_devices; i++)
    w(p, "%s%d", i ? ", " : "", devices[i]);
  w(p, ".</p>\n");
  if (n_devices == 0)
    w(p, "<p class=\"empty\">The snapshot holds no segments and no trace entries: nothing to draw.</p>\n");
  for (size_t i = 0; i < n_devices; i++)
    if (device_section(p, snap, devices[i]) != 0)
      return -1;
  w(p, "<footer>Made by <code>alloc_snapshot plot</code>. This page is self-contained: inline SVG and CSS, "
       "no script, nothing fetched.</footer>\n</body>\n</html>\n");
  return 0;
}

int as_cmd_plot(int argc, char **argv) {
  static const struct option longopts[] = {{"output", required_argument, NULL, 'o'},
                                           {"device", required_argument, NULL, 'd'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  const char *out = NULL;
  bool by_device = false;
  uint64_t device = 0;
  for (int c; (c = as_getopt("plot", argc, argv, ":ho:", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("plot", AS_EXIT_OK);
    case 'o':
      if (optarg[0] == '\0')
        return as_usage_error("plot", "-o wants a file name, not an empty string");
      out = optarg;
      break;
    case 'd':
      if (!as_parse_u64(optarg, AS_MAX_DEVICE, &device))
        return as_usage_error("plot", "--device wants a device index from 0 to %d, not '%s'", AS_MAX_DEVICE, optarg);
      by_device = true;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  if (argc == optind)
    return as_usage_error("plot", "no FILE given");
  if (argc - optind > 1)
    return as_usage_error("plot", "one FILE expected, got %d arguments", argc - optind);
  if (out == NULL)
    return as_usage_error("plot", "no output given: -o OUT.html");
  const char *input = argv[optind];
  const char *input_name = strcmp(input, "-") == 0 ? "<stdin>" : input;
  bool to_stdout = strcmp(out, "-") == 0;
  struct stat in_st, out_st;
  if (!to_stdout && strcmp(input, "-") != 0 && stat(input, &in_st) == 0 && stat(out, &out_st) == 0 &&
      in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
    return as_usage_error("plot", "-o %s is the input file: it would be overwritten", out);

  if (!to_stdout && stat(out, &out_st) == 0 && S_ISDIR(out_st.st_mode))
    return as_failure("plot", "%s: cannot write the output: it is a directory", out);

  as_snapshot snap;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(input, &snap, err) != 0)
    return as_failure("plot", "%s", err);

  /* The devices with segments or trace entries, in order. */
  static bool present[AS_MAX_DEVICE + 1];
  memset(present, 0, sizeof present);
  for (size_t i = 0; i < snap.n_segments; i++)
    present[snap.segments[i].device] = true;
  for (size_t d = 0; d < snap.n_devices && d <= AS_MAX_DEVICE; d++)
    if (snap.traces[d].n > 0)
      present[d] = true;
  int devices[AS_MAX_DEVICE + 1];
  size_t n_devices = 0;
  for (int d = 0; d <= AS_MAX_DEVICE; d++)
    if (present[d] && (!by_device || (uint64_t)d == device))
      devices[n_devices++] = d;
  if (by_device && n_devices == 0) {
    char list[256] = "";
    size_t len = 0;
    for (int d = 0; d <= AS_MAX_DEVICE && len + 16 < sizeof list; d++)
      if (present[d])
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", d);
    as_snapshot_free(&snap);
    return as_failure("plot", "%s: device %" PRIu64 " has no segments and no trace entries (%s%s)",
                      input_name, device, len ? "devices in the file: " : "",
                      len ? list : "the file holds nothing on any device");
  }

  tool_out o = {0};
  char why[256];
  if (!to_stdout && tool_out_open(&o, out, why, sizeof why) != 0) {
    as_snapshot_free(&snap);
    return as_failure("plot", "%s: cannot create the output: %s", out, why);
  }
  page p = {to_stdout ? stdout : o.f};
  int status = AS_EXIT_OK;
  if (write_page(&p, input_name, &snap, devices, n_devices) != 0)
    status = as_failure("plot", "out of host memory");
  as_snapshot_free(&snap);
  if (to_stdout)
    return as_finish_stdout("plot", status);
  if (tool_out_close(&o, status == AS_EXIT_OK, why, sizeof why) != 0)
    return status != AS_EXIT_OK ? status : as_failure("plot", "%s: cannot write the output: %s", out, why);
  printf("wrote %s (", out);
  if (n_devices == 0)
    printf("nothing on any device");
  for (size_t i = 0; i < n_devices; i++)
    printf("%s%d", i ? ", " : n_devices == 1 ? "device " : "devices ", devices[i]);
  printf(")\n");
  return as_finish_stdout("plot", AS_EXIT_OK);
}
