/* alloc_bench: the chart. A grouped horizontal bar chart of the medians, one group per row name
 * (pair-4KiB, random-1MiB, ...), one bar per allocator, on a log scale with a grid line per decade, a
 * whisker from min to max over each bar, and the median written after it. Rows that did not run (n/a,
 * error) are named in their group; skipped rows (the allocator cannot run on this machine) are left out.
 * Plain SVG 1.1 with no script, no font or anything else fetched. */
#include "bench.h"

#include "../common/outfile.h"
#include "text.h" /* src/common/: the XML escaper */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { LABEL_W = 190, PLOT_W = 560, VALUE_W = 140, BAR_H = 14, BAR_GAP = 3, GROUP_GAP = 14, TOP = 100 };

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2",
                                      "#7f7f7f"};
/* The usual allocators keep their colour whatever else is in the file. */
static const char *const known[] = {"cachalot", "cudaMallocAsync", "cudaMalloc", "cachalot-sim"};

static void fmt_time(char buf[32], double ns) {
  if (ns < 1e4)
    snprintf(buf, 32, ns < 10 ? "%.2f ns" : ns < 100 ? "%.1f ns" : "%.0f ns", ns);
  else if (ns < 1e7)
    snprintf(buf, 32, "%.1f \xc2\xb5s", ns / 1e3);
  else
    snprintf(buf, 32, "%.1f ms", ns / 1e6);
}

static const char *decade_label(char buf[32], int e) {
  static const char *const units[] = {"ns", "\xc2\xb5s", "ms", "s"};
  if (e < 0) {
    snprintf(buf, 32, "1e%d ns", e);
  } else {
    int u = e / 3 < 3 ? e / 3 : 3;
    int rest = e - 3 * u;
    snprintf(buf, 32, "%d %s", rest == 0 ? 1 : rest == 1 ? 10 : rest == 2 ? 100 : (int)pow(10, rest), units[u]);
  }
  return buf;
}

typedef struct {
  const char **names;
  size_t n;
} name_list;

static int index_of(name_list *l, const char *name, bool add) {
  for (size_t i = 0; i < l->n; i++)
    if (strcmp(l->names[i], name) == 0)
      return (int)i;
  if (!add)
    return -1;
  l->names[l->n] = name;
  return (int)l->n++;
}

static const char *colour(const char *allocator, int index) {
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(allocator, known[i]) == 0)
      return palette[i];
  return palette[(4 + index) % (int)(sizeof palette / sizeof palette[0])];
}

/* What the chart's parts share: its groups (row names) and allocators in order of appearance, the log
 * scale (decades e_lo .. e_hi), and its size. */
typedef struct {
  name_list groups, allocs;
  int e_lo, e_hi;
  double l_lo, l_span;
  int width, height;
} layout;

/* The names, the scale over every median, min and max, and the size. 0, or -1 on host OOM. */
static int lay_out(const ab_results *res, layout *c) {
  c->groups = (name_list){calloc(res->n + 1, sizeof(char *)), 0};
  c->allocs = (name_list){calloc(res->n + 1, sizeof(char *)), 0};
  if (c->groups.names == NULL || c->allocs.names == NULL)
    return -1;
  double lo = INFINITY, hi = 0;
  size_t lines = 0; /* every non-skipped row is a line of its group */
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    if (r->status == AB_ROW_SKIPPED)
      continue;
    lines++;
    index_of(&c->groups, r->workload, true);
    index_of(&c->allocs, r->allocator, true);
    if (r->status == AB_ROW_OK) {
      double a = r->min_ns < r->median_ns ? r->min_ns : r->median_ns;
      double b = r->max_ns > r->median_ns ? r->max_ns : r->median_ns;
      lo = a > 0 && a < lo ? a : lo;
      hi = b > hi ? b : hi;
    }
  }
  if (!(lo < INFINITY)) {
    lo = 1;
    hi = 10;
  }
  c->e_lo = (int)floor(log10(lo));
  c->e_hi = (int)ceil(log10(hi > lo ? hi : lo));
  if (c->e_hi <= c->e_lo)
    c->e_hi = c->e_lo + 1;
  c->l_lo = c->e_lo;
  c->l_span = c->e_hi - c->e_lo;
  c->height = TOP + (int)lines * (BAR_H + BAR_GAP) + (int)c->groups.n * GROUP_GAP + 40;
  c->width = LABEL_W + PLOT_W + VALUE_W;
  return 0;
}

/* The x of log10 value lv. */
static double x_at(const layout *c, double lv) { return LABEL_W + PLOT_W * (lv - c->l_lo) / c->l_span; }

/* The document's start, the title and the legend of the allocators' colours. */
static void chart_head(FILE *f, const layout *c, const char *title) {
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
          "font-family=\"sans-serif\" font-size=\"11\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          c->width, c->height, c->width, c->height);
  fputs("<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">alloc_bench: median time per unit "
        "(log scale; whiskers: min-max)</text>\n<text x=\"10\" y=\"38\" fill=\"#555\">",
        f);
  cl_html_fput(f, title);
  fputs(" \xe2\x80\x94 pair: ns per alloc+free pair; others: ns per alloc or free call; graph-replay: ns per "
        "launch</text>\n",
        f);
  int lx = 10;
  for (size_t i = 0; i < c->allocs.n; i++) {
    fprintf(f, "<rect x=\"%d\" y=\"50\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"60\">", lx,
            colour(c->allocs.names[i], (int)i), lx + 16);
    cl_html_fput(f, c->allocs.names[i]);
    fputs("</text>\n", f);
    lx += 16 + 7 * (int)strlen(c->allocs.names[i]) + 20;
  }
}

/* A line per decade, labelled, and fainter ones at 2 to 9 times it. */
static void decade_grid(FILE *f, const layout *c) {
  int plot_bottom = c->height - 30;
  for (int e = c->e_lo; e <= c->e_hi; e++) {
    double x = x_at(c, e);
    char lab[32];
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#bbb\"/>\n", x, TOP - 12, x, plot_bottom);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">%s</text>\n", x, TOP - 16,
            decade_label(lab, e));
    for (int m = 2; m <= 9 && e < c->e_hi; m++) {
      double xm = x_at(c, e + log10(m));
      fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n", xm, TOP - 6, xm, plot_bottom);
    }
  }
}

/* A row that ran: its median as a bar, min-max as a whisker, the median written after them. */
static void bar(FILE *f, const layout *c, const ab_row *r, int y, const char *col) {
  int cy = y + BAR_H / 2;
  double v[3] = {r->median_ns, r->min_ns, r->max_ns}, x[3];
  for (int i = 0; i < 3; i++) {
    x[i] = x_at(c, v[i] > 0 ? log10(v[i]) : c->l_lo);
    x[i] = x[i] < LABEL_W ? LABEL_W : x[i];
  }
  char med[32], mn[32], mx[32];
  fmt_time(med, r->median_ns);
  fmt_time(mn, r->min_ns);
  fmt_time(mx, r->max_ns);
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>", LABEL_W, y,
          x[0] - LABEL_W < 1 ? 1 : x[0] - LABEL_W, BAR_H, col);
  cl_html_fput(f, r->workload);
  fputs(", ", f);
  cl_html_fput(f, r->allocator);
  fprintf(f, ": median %s [%s - %s] %s</title></rect>\n", med, mn, mx, r->unit);
  fprintf(f,
          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>"
          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>"
          "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>\n",
          x[1], cy, x[2], cy, x[1], cy - 3, x[1], cy + 3, x[2], cy - 3, x[2], cy + 3);
  fprintf(f, "<text x=\"%.1f\" y=\"%d\">%s</text>\n", (x[2] > x[0] ? x[2] : x[0]) + 4, cy + 4, med);
}

/* A row that did not run: a stub and its status, the note as its tooltip. */
static void no_bar(FILE *f, const ab_row *r, int y, const char *col) {
  int cy = y + BAR_H / 2;
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"4\" height=\"%d\" fill=\"%s\"/>", LABEL_W, y, BAR_H, col);
  fprintf(f, "<text x=\"%d\" y=\"%d\" fill=\"#888\">", LABEL_W + 8, cy + 4);
  cl_html_fput(f, r->allocator);
  fprintf(f, ": %s<title>", ab_status_name(r->status));
  cl_html_fput(f, r->note);
  fputs("</title></text>\n", f);
}

/* Group g from y: a line per row of that name, then its label; returns the y after it. */
static int draw_group(FILE *f, layout *c, const ab_results *res, size_t g, int y) {
  int y0 = y, n_lines = 0;
  const char *unit = "";
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    if (r->status == AB_ROW_SKIPPED || strcmp(r->workload, c->groups.names[g]) != 0)
      continue;
    if (unit[0] == '\0')
      unit = r->unit;
    const char *col = colour(r->allocator, index_of(&c->allocs, r->allocator, false));
    if (r->status == AB_ROW_OK)
      bar(f, c, r, y, col);
    else
      no_bar(f, r, y, col);
    y += BAR_H + BAR_GAP;
    n_lines++;
  }
  int mid = y0 + (n_lines * (BAR_H + BAR_GAP)) / 2;
  fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-weight=\"bold\">", LABEL_W - 8, mid);
  cl_html_fput(f, c->groups.names[g]);
  fprintf(f, "</text><text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"#777\" font-size=\"10\">", LABEL_W - 8,
          mid + 12);
  cl_html_fput(f, unit);
  fputs("</text>\n", f);
  y += GROUP_GAP;
  if (g + 1 < c->groups.n)
    fprintf(f, "<line x1=\"10\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ddd\"/>\n", y - GROUP_GAP / 2 - 1,
            c->width - 10, y - GROUP_GAP / 2 - 1);
  return y;
}

int ab_write_svg(const char *path, const ab_results *res, const char *title, char err[AB_ERR_LEN]) {
  layout c;
  if (lay_out(res, &c) != 0) {
    free(c.groups.names);
    free(c.allocs.names);
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  /* As common/outfile.h says: "-" is standard output, a regular file is replaced atomically, anything
   * else written through. */
  tool_out o;
  char why[256];
  if (tool_out_open(&o, path, why, sizeof why) != 0) {
    snprintf(err, AB_ERR_LEN, "cannot write %s: %s", tool_out_name(path), why);
    free(c.groups.names);
    free(c.allocs.names);
    return -1;
  }
  chart_head(o.f, &c, title);
  decade_grid(o.f, &c);
  int y = TOP;
  for (size_t g = 0; g < c.groups.n; g++)
    y = draw_group(o.f, &c, res, g, y);
  if (c.groups.n == 0)
    fprintf(o.f, "<text x=\"%d\" y=\"%d\" fill=\"#888\">no results</text>\n", LABEL_W, TOP + 12);
  fputs("</svg>\n", o.f);
  free(c.groups.names);
  free(c.allocs.names);
  if (tool_out_close(&o, true, why, sizeof why) != 0) {
    snprintf(err, AB_ERR_LEN, "cannot write %s: %s", tool_out_name(path), why);
    return -1;
  }
  return 0;
}
