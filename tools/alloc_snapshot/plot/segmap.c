/* alloc_snapshot plot: the segment map of a device (plot.h): a bar per segment, grouped by pool id,
 * segment type and stream, every block in it coloured by state. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../cli.h"
#include "../summary.h"
#include "plot.h"

#define MAP_W ((double)(PAGE_W - MAP_LABEL - 10))
#define MIN_SEG_PX 2.0

static const char *const state_color[] = {"#2f6fd0", "#f29d38", "#d3d8df"};
static const char *const state_meaning[] = {
    "in use by the program",
    "freed by the program, waiting for its streams' events before reuse",
    "free: cached in the segment, reusable",
};

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
  as_out(p, "%s", as_fmt_pool(buf, pool_id));
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
    as_out(p, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\">%s%s%s</rect>\n", cls,
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
  as_out(p, "<g><title>segment 0x%" PRIx64 "\nsize ", s->address);
  as_size_exact(p, s->total_size);
  as_out(p, "\nallocated ");
  as_size_exact(p, s->allocated_size);
  as_out(p, ", active ");
  as_size_exact(p, s->active_size);
  as_out(p, ", requested ");
  as_size_exact(p, s->requested_size);
  as_out(p, "\n%zu block%s, pool ", s->n_blocks, s->n_blocks == 1 ? "" : "s");
  pool_text(p, s->pool_id);
  as_out(p, ", %s, stream %" PRIu64 "%s</title>", s->small ? "small" : "large", s->stream,
         s->is_expandable ? ", expandable" : "");
  as_out(p, "<text class=\"mono\" x=\"4\" y=\"%.1f\" font-size=\"11\" fill=\"#333\">0x%" PRIx64 "</text>",
         y + ROW_H - 2, s->address);
  as_out(p, "<text class=\"mono\" x=\"%d\" y=\"%.1f\" font-size=\"11\" fill=\"#333\" text-anchor=\"end\">",
         MAP_LABEL - 8, y + ROW_H - 2);
  as_size_text(p, s->total_size);
  as_out(p, "%s</text></g>\n", s->is_expandable ? " (exp)" : "");
  if (rows > 1) /* a bracket joins the rows of one segment */
    as_out(p, "<path d=\"M%d %.1fh-4v%.1fh4\" fill=\"none\" stroke=\"#8a919c\"/>\n", MAP_LABEL - 2, y + 1,
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
    as_out(p, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"none\" stroke=\"#5f6672\" "
              "stroke-width=\"0.8\" pointer-events=\"none\"/>\n",
           x0, y + r * (ROW_H + ROW_GAP), wr, ROW_H);
  }
  return rows * (ROW_H + ROW_GAP) - ROW_GAP + SEG_GAP;
}

static void legend_states(page *p) {
  as_out(p, "<ul class=\"legend\">\n");
  for (int st = AS_ACTIVE_ALLOCATED; st <= AS_INACTIVE; st++)
    as_out(p, "<li><span class=\"sw\" style=\"background:%s\"></span><b>%s</b>: %s</li>\n", state_color[st],
           as_block_state_name((as_block_state)st), state_meaning[st]);
  as_out(p, "</ul>\n");
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

/* The paragraph over the map: its scale, how blocks are drawn, and what was left out. */
static void map_note(page *p, uint64_t row, double min_px, size_t n, size_t n_all, uint64_t omitted_bytes,
                     int device) {
  as_out(p, "<p class=\"note\">One bar per segment (one device allocation), grouped by pool id, segment type and "
            "stream, in address order. A bar's length is proportional to the segment's size: a full row is ");
  as_size_text(p, row);
  as_out(p, ", and a longer segment wraps onto the next rows (one narrower than %.0f px is drawn %.0f px wide). "
            "Blocks are drawn at their offsets in the segment; hover over one for its address, size and requested "
            "size, over a label for the segment's.",
         MIN_SEG_PX, MIN_SEG_PX);
  if (min_px > 1.0)
    as_out(p, " Blocks narrower than %.0f px are drawn merged, in the colour of the state with most bytes (their "
              "tooltip counts them).",
           min_px);
  else
    as_out(p, " Blocks narrower than a pixel are drawn merged, in the colour of the state with most bytes (their "
              "tooltip counts them).");
  if (n < n_all) {
    as_out(p, " <b>Only the %zu largest of the device's %zu segments are drawn</b>; the other %zu hold ", n, n_all,
           n_all - n);
    as_size_text(p, omitted_bytes);
    as_out(p, " (<code>alloc_snapshot segments FILE --device %d</code> lists them all).", device);
  }
  as_out(p, "</p>\n");
}

/* The map's height: every group's heading and every segment's rows. */
static double map_height(const as_segment *const *segs, size_t n, uint64_t row) {
  double height = 22;
  for (size_t i = 0; i < n; i++) {
    as_group_key ki = as_segment_key(segs[i]), kp = i > 0 ? as_segment_key(segs[i - 1]) : ki;
    if (i == 0 || as_key_cmp(&ki, &kp) != 0)
      height += GROUP_H;
    height += segment_rows(segment_px(segs[i], row)) * (ROW_H + ROW_GAP) - ROW_GAP + SEG_GAP;
  }
  return height;
}

/* The scale: a ruler over one full row of `row` bytes. */
static void ruler(page *p, uint64_t row) {
  as_out(p, "<line x1=\"%d\" y1=\"14\" x2=\"%.1f\" y2=\"14\" stroke=\"#888\"/>\n", MAP_LABEL, MAP_LABEL + MAP_W);
  /* Five divisions where they are whole units (40 MiB of 200 MiB), else four. */
  int divs = row % 5 == 0 && (row / 5) % (row >= ((uint64_t)4 << 20) ? (uint64_t)1 << 20 : row >= 4096 ? 1024 : 1) == 0
                 ? 5
                 : 4;
  for (int q = 0; q <= divs; q++) {
    double x = MAP_LABEL + MAP_W * q / divs;
    as_out(p, "<line x1=\"%.1f\" y1=\"10\" x2=\"%.1f\" y2=\"18\" stroke=\"#888\"/>", x, x);
    as_out(p, "<text x=\"%.1f\" y=\"8\" font-size=\"11\" fill=\"#555\" text-anchor=\"%s\">", x,
           q == 0 ? "start" : q == divs ? "end" : "middle");
    as_size_short(p, q == divs ? row : row / (uint64_t)divs * (uint64_t)q);
    as_out(p, "</text>\n");
  }
}

/* A group's heading at y: its key and what its segments hold together. */
static void group_heading(page *p, const as_group *g, double y) {
  as_out(p, "<text x=\"4\" y=\"%.1f\" font-size=\"13\" fill=\"#111\"><tspan font-weight=\"bold\">pool ", y + 17);
  pool_text(p, g->key.pool_id);
  as_out(p, "%s · %s · stream %" PRIu64 "</tspan>",
         g->key.pool_id[0] == 0 && g->key.pool_id[1] == 0 ? " (default)" : "", g->key.small ? "small" : "large",
         g->key.stream);
  as_out(p, "<tspan fill=\"#555\"> — %" PRIu64 " segment%s, ", g->segments, g->segments == 1 ? "" : "s");
  as_size_text(p, g->reserved);
  as_out(p, " reserved, ");
  as_size_text(p, g->allocated);
  as_out(p, " allocated, ");
  as_size_text(p, g->active - (g->active >= g->allocated ? g->allocated : g->active));
  as_out(p, " pending free, ");
  as_size_text(p, g->free);
  as_out(p, " inactive</tspan></text>\n");
}

void as_segment_map(page *p, const as_segment *const *segs, size_t n, size_t n_all, uint64_t omitted_bytes,
                    int device) {
  if (n == 0) {
    as_out(p, "<p class=\"empty\">Device %d has no segments in this snapshot (nothing reserved).</p>\n", device);
    return;
  }
  uint64_t row = row_bytes(segs, n);
  double min_px = merge_px(segs, n, row);
  map_note(p, row, min_px, n, n_all, omitted_bytes, device);
  legend_states(p);
  double height = map_height(segs, n, row);
  as_out(p, "<svg class=\"map\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\" role=\"img\" "
            "aria-label=\"segment map, device %d\">\n",
         PAGE_W, height, PAGE_W, height, device);
  ruler(p, row);
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
    group_heading(p, &g, y);
    y += GROUP_H;
    for (; i < j; i++)
      y += draw_segment(p, segs[i], row, y, min_px);
  }
  as_out(p, "</svg>\n");
}
