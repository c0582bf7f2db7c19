/* alloc_snapshot plot: the explorer page (plot.h), one self-contained HTML file: the style and the
 * scripts (explorer.css, explorer_model.js, explorer_view.js, explorer_ui.js, embedded into the binary
 * at build time by embed.py) and the snapshot's data (explorer_data.c) as a JSON document in a
 * <script type="application/json"> element. No library, nothing fetched: it works from file://. */
#include <stdarg.h>

#include "plot.h"
#include "text.h" /* src/common/: the HTML escaper */

/* embed.py's output (explorer_assets.c) */
extern const char as_explorer_css[], as_explorer_model_js[], as_explorer_view_js[], as_explorer_ui_js[];

static void out(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(page *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->f, fmt, ap);
  va_end(ap);
}

/* The snapshot's allocator settings string, quoted and escaped, or "none in the file". */
static void settings(page *p, const as_snapshot *snap) {
  if (snap->conf == NULL) {
    out(p, "none in the file");
    return;
  }
  out(p, "<code>\"");
  cl_html_fput(p->f, snap->conf);
  out(p, "\"</code>");
}

int as_write_explorer(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices) {
  out(p, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>memory snapshot: ");
  cl_html_fput(p->f, input);
  out(p, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>Memory snapshot: <span class=\"mono\">", as_explorer_css);
  cl_html_fput(p->f, input);
  out(p, "</span></h1>\n<p class=\"meta\">allocator settings: ");
  settings(p, snap);
  out(p, "</p>\n<div id=\"app\"><p class=\"empty\">This page draws with JavaScript: enable it to explore the "
            "snapshot (<code>alloc_snapshot show FILE</code> prints its figures as text).</p></div>\n");
  out(p, "<footer>Made by <code>alloc_snapshot plot</code>: one self-contained page, nothing fetched. "
            "<span id=\"timing\"></span></footer>\n<script type=\"application/json\" id=\"snapshot-data\">");
  if (as_explorer_data(p, input, snap, devices, n_devices) != 0)
    return -1;
  out(p, "</script>\n<script>\n(function () {\n%s\n%s\n%s\n})();\n</script>\n", as_explorer_model_js,
         as_explorer_view_js, as_explorer_ui_js);
  out(p, "</body>\n</html>\n");
  return 0;
}
