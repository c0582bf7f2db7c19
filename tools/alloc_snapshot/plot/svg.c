/* alloc_snapshot plot: writing the page's HTML and SVG text (plot.h): formatted output, escaping of
 * the texts that come from the input (src/common/text.h), and byte counts. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "../cli.h"
#include "plot.h"
#include "text.h" /* src/common/: the HTML escaper */

void as_out(page *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->f, fmt, ap);
  va_end(ap);
}

void as_out_settings(page *p, const as_snapshot *snap) {
  if (snap->conf != NULL) {
    as_out(p, "<code>\"");
    cl_html_fput(p->f, snap->conf);
    as_out(p, "\"</code>");
  } else {
    as_out(p, "none in the file");
  }
}

void as_size_text(page *p, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  as_out(p, "%s", as_fmt_size(buf, bytes, false));
}

/* The same without a ".00" ("50 MiB"), for rulers. */
void as_size_short(page *p, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  as_fmt_size(buf, bytes, false);
  char *dot = strstr(buf, ".00 ");
  if (dot != NULL)
    memmove(dot, dot + 3, strlen(dot + 3) + 1);
  as_out(p, "%s", buf);
}

/* "4.00 MiB (4194304 B)", for tooltips. */
void as_size_exact(page *p, uint64_t bytes) {
  char buf[AS_SIZE_BUF];
  if (bytes < 1024)
    as_out(p, "%" PRIu64 " B", bytes);
  else
    as_out(p, "%s (%" PRIu64 " B)", as_fmt_size(buf, bytes, false), bytes);
}
