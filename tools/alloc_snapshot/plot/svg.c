/* alloc_snapshot plot: writing the page's HTML and SVG text (plot.h): formatted output, escaping of
 * the texts that come from the input, and byte counts. */
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "../cli.h"
#include "plot.h"

void as_out(page *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->f, fmt, ap);
  va_end(ap);
}

/* Text escaped for HTML element content and attribute values; control characters become U+FFFD, so
 * the page stays valid whatever bytes a file name holds. */
void as_esc(page *p, const char *s) {
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

void as_out_settings(page *p, const as_snapshot *snap) {
  if (snap->conf != NULL) {
    as_out(p, "<code>\"");
    as_esc(p, snap->conf);
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
