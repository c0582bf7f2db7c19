/* alloc_snapshot plot: the memory-over-time chart of a device's trace (plot.h), its legend and the
 * notes under it. */
#include <inttypes.h>
#include <stdint.h>

#include "../cli.h"
#include "plot.h"

#define COLOR_RESERVED "#5b6470"
#define COLOR_ALLOCATED "#2f6fd0"

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

/* --- the chart --- */
typedef struct {
  double x_span, y_max; /* data ranges: [0, x_span] x [0, y_max] */
  double px0, py0, pw, ph;
} frame;

static double fx(const frame *f, double x) { return f->px0 + (f->x_span > 0 ? x / f->x_span : 0) * f->pw; }
static double fy(const frame *f, double y) { return f->py0 + f->ph - (f->y_max > 0 ? y / f->y_max : 0) * f->ph; }

static void polyline(page *p, const frame *f, const decimator *d, const char *color, bool fill) {
  if (fill) {
    as_out(p, "<polygon fill=\"%s\" fill-opacity=\"0.13\" stroke=\"none\" points=\"", color);
    for (size_t i = 0; i < d->n; i++)
      as_out(p, "%.1f,%.1f ", fx(f, d->out[i].x), fy(f, d->out[i].y));
    as_out(p, "%.1f,%.1f %.1f,%.1f\"/>\n", fx(f, d->out[d->n - 1].x), fy(f, 0), fx(f, d->out[0].x), fy(f, 0));
  }
  as_out(p, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"", color);
  for (size_t i = 0; i < d->n; i++)
    as_out(p, "%s%.1f,%.1f", i ? " " : "", fx(f, d->out[i].x), fy(f, d->out[i].y));
  as_out(p, "\"/>\n");
}

static void x_value(page *p, const series *s, double x, int decimals) {
  if (s->by_time)
    as_out(p, "%.*f %s", decimals, x * s->x_scale, s->x_unit);
  else
    as_out(p, "entry %.0f", x);
}

static void peak_marker(page *p, const frame *f, const series *s, double x, uint64_t y, const char *what,
                        const char *color, int line, int decimals) {
  double cx = fx(f, x), cy = fy(f, (double)y);
  as_out(p, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"1.5\"/>\n", cx, cy,
         color);
  /* The label sits above the plot area's top edge line by line, anchored towards the middle. */
  bool right_half = cx > f->px0 + f->pw * 0.6;
  double ty = f->py0 - 6 - 15.0 * line;
  as_out(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"2,2\"/>\n", cx,
         cy - 5, cx, ty + 3, color);
  as_out(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"12\" fill=\"%s\">%s ",
         right_half ? cx - 4 : cx + 4, ty, right_half ? "end" : "start", color, what);
  as_size_text(p, y);
  as_out(p, " at ");
  x_value(p, s, x, decimals);
  as_out(p, "</text>\n");
}

/* The y axis: a binary unit (MiB or GiB for what a program holds, others only for tiny or absurd
 * traces), a nice step in that unit, and the axis' top, the first step at or above `top` bytes. */
typedef struct {
  double unit, step, max; /* step and max in units */
  const char *name;
} y_axis;

static y_axis make_y_axis(uint64_t top) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 2;
  while (u > 0 && top < (uint64_t)1 << (10 * u))
    u--;
  while (u < 6 && top >= (uint64_t)1 << (10 * (u + 1)))
    u++;
  y_axis y = {.unit = (double)((uint64_t)1 << (10 * u)), .name = units[u]};
  y.step = nice_step(top > 0 ? (double)top / y.unit : 1.0, 6);
  if (u == 0 && y.step < 1.0) /* no fractions of a byte */
    y.step = 1.0;
  y.max = y.step;
  while (y.max * y.unit < (double)top * 1.0001)
    y.max += y.step;
  return y;
}

static void y_grid(page *p, const frame *f, const y_axis *ya) {
  int yd = step_decimals(ya->step);
  for (double v = 0; v <= ya->max + ya->step * 1e-6 && v / ya->step < 100; v += ya->step) {
    double y = fy(f, v * ya->unit);
    if (v > 0)
      as_out(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e6ea\"/>\n", f->px0, y,
             f->px0 + f->pw, y);
    as_out(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"12\" fill=\"#444\">%.*f %s</text>\n",
           f->px0 - 6, y + 4, yd, v, ya->name);
  }
}

/* The x grid every x_step (in x's own unit); returns the decimals its labels were printed with. */
static int x_grid(page *p, const frame *f, double x_step, double x_scale) {
  int xd = step_decimals(x_step * x_scale);
  for (double v = 0; v <= f->x_span + x_step * 1e-6 && v / x_step < 100; v += x_step) {
    double x = fx(f, v);
    as_out(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", x, f->py0 + f->ph, x,
           v > 0 ? f->py0 : f->py0 + f->ph + 4, v > 0 ? "#eef0f3" : "#c8ccd2");
    as_out(p, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\" fill=\"#444\">%.*f</text>\n", x,
           f->py0 + f->ph + 17, xd, v * x_scale);
  }
  return xd;
}

static void axis_titles(page *p, const frame *f, const series *s, const char *y_unit) {
  as_out(p, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222\">%s</text>\n",
         f->px0 + f->pw / 2, CHART_H - 8,
         !s->by_time ? "trace entry (index; time_us is absent, constant or out of order)"
         : s->x_scale == 1.0 ? "time since the first trace entry (s)"
         : s->x_scale == 1e3 ? "time since the first trace entry (ms)"
                             : "time since the first trace entry (&#181;s)");
  as_out(p, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" "
            "fill=\"#222\">memory (%s)</text>\n",
         f->py0 + f->ph / 2, y_unit);
}

/* A dashed red line at every OOM entry, its tooltip what was asked and what was free. */
static void oom_lines(page *p, const frame *f, const as_device_trace *t, const series *s) {
  for (size_t i = 0; i < t->n; i++) {
    if (t->entries[i].action != AS_OOM)
      continue;
    double x = fx(f, as_entry_x(t, i, s->by_time));
    as_out(p, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" stroke-width=\"1.5\" "
              "stroke-dasharray=\"4,3\"><title>oom (entry %zu): asked for ",
           x, f->py0, x, f->py0 + f->ph, i);
    as_size_exact(p, t->entries[i].size);
    as_out(p, ", device free ");
    as_size_exact(p, t->entries[i].addr);
    as_out(p, "</title></line>\n");
  }
}

void as_chart(page *p, const as_device_trace *t, const series *s, int device) {
  uint64_t top = s->peak_reserved > s->peak_alloc ? s->peak_reserved : s->peak_alloc;
  y_axis ya = make_y_axis(top);
  double x_span = s->x_max > 0 ? s->x_max : 1.0;
  double x_step = nice_step(x_span * s->x_scale, 10) / s->x_scale;
  frame f = {.x_span = x_span,
             .y_max = ya.max * ya.unit,
             .px0 = CHART_L,
             .py0 = CHART_T,
             .pw = PAGE_W - CHART_L - CHART_R,
             .ph = CHART_H - CHART_T - CHART_B};

  as_out(p, "<svg class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" "
            "aria-label=\"memory over time, device %d\">\n",
         PAGE_W, CHART_H, PAGE_W, CHART_H, device);
  as_out(p, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fbfbfc\" stroke=\"#c8ccd2\"/>\n",
         f.px0, f.py0, f.pw, f.ph);
  y_grid(p, &f, &ya);
  int xd = x_grid(p, &f, x_step, s->x_scale);
  axis_titles(p, &f, s, ya.name);
  oom_lines(p, &f, t, s);
  polyline(p, &f, &s->reserved, COLOR_RESERVED, true);
  polyline(p, &f, &s->alloc, COLOR_ALLOCATED, true);
  if (s->peak_alloc > 0)
    peak_marker(p, &f, s, s->peak_alloc_x, s->peak_alloc, "peak allocated", COLOR_ALLOCATED, 0, xd + 1);
  if (s->peak_reserved > 0)
    peak_marker(p, &f, s, s->peak_reserved_x, s->peak_reserved, "peak reserved", COLOR_RESERVED, 1, xd + 1);
  as_out(p, "</svg>\n");
}

void as_trace_notes(page *p, const as_device_trace *t, const series *s, const as_segment *const *segs, size_t n) {
  size_t counts[AS_ACTION_OTHER + 1] = {0};
  for (size_t i = 0; i < t->n; i++)
    counts[t->entries[i].action]++;
  as_out(p, "<p class=\"note\">%zu trace entries (", t->n);
  bool first = true;
  for (int a = 0; a <= AS_ACTION_OTHER; a++)
    if (counts[a] > 0) {
      as_out(p, "%s%zu %s", first ? "" : ", ", counts[a],
             a == AS_ACTION_OTHER ? "of other actions" : as_action_name(a));
      first = false;
    }
  as_out(p, ") over ");
  if (s->by_time)
    as_out(p, "%.2f %s", s->x_max * s->x_scale, s->x_unit);
  else
    as_out(p, "%zu entries", t->n);
  as_out(p, "; each line is drawn with at most %zu points (%zu and %zu here: of every pixel column the first, lowest, "
            "highest and last value are kept, so the peaks are exact). The trace starts empty: memory that was live "
            "before recording began is not in these lines. At the trace's end: ",
         (size_t)4 * BUCKETS, s->alloc.n, s->reserved.n);
  as_size_text(p, s->end_alloc);
  as_out(p, " allocated, ");
  as_size_text(p, s->end_reserved);
  as_out(p, " reserved");
  if (n > 0) {
    uint64_t reserved = 0, allocated = 0;
    for (size_t i = 0; i < n; i++) {
      reserved = as_sat_add(reserved, segs[i]->total_size);
      for (size_t k = 0; k < segs[i]->n_blocks; k++)
        if (segs[i]->blocks[k].state != AS_INACTIVE)
          allocated = as_sat_add(allocated, segs[i]->blocks[k].size);
    }
    as_out(p, " (the snapshot's segments: ");
    as_size_text(p, allocated);
    as_out(p, " in active blocks, ");
    as_size_text(p, reserved);
    as_out(p, " reserved)");
  }
  as_out(p, ".");
  if (s->unknown_frees > 0)
    as_out(p, " %zu free_requested entr%s free addresses the trace never allocated (allocated before it began); they "
              "are not counted.",
           s->unknown_frees, s->unknown_frees == 1 ? "y" : "ies");
  if (s->n_oom > 0)
    as_out(p, " <b style=\"color:#d62728\">%zu OOM%s</b> (dashed red lines).", s->n_oom, s->n_oom == 1 ? "" : "s");
  as_out(p, "</p>\n");
}

void as_chart_legend(page *p) {
  as_out(p, "<ul class=\"legend\">\n"
            "<li><span class=\"ln\" style=\"background:%s\"></span><b>reserved</b>: segment_alloc &#8722; "
            "segment_free, segment_map &#8722; segment_unmap (what the allocator holds of the device)</li>\n"
            "<li><span class=\"ln\" style=\"background:%s\"></span><b>allocated</b>: the sizes of live alloc entries, "
            "until their free_requested (what the program holds)</li>\n"
            "</ul>\n",
         COLOR_RESERVED, COLOR_ALLOCATED);
}
