/* The byte counts and HTML text of text.h. */
#include "text.h"

#include "c_locale.h"
#include "json_writer.h"

#include <inttypes.h>

char *cl_format_bytes(char buf[CL_BYTES_BUF], uint64_t n, cl_bytes_style style) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (style == CL_BYTES_EXACT || (style == CL_BYTES_BINARY && n < 1024)) {
    snprintf(buf, CL_BYTES_BUF, "%" PRIu64 "%s", n, style == CL_BYTES_EXACT ? "" : " B");
    return buf;
  }
  if (style == CL_BYTES_TORCH && n <= 1024) {
    snprintf(buf, CL_BYTES_BUF, "%" PRIu64 " bytes", n);
    return buf;
  }
  /* PyTorch's message moves up a unit only past a whole one (1 MiB is "1024.00 KiB") and stops at GiB */
  const int last = style == CL_BYTES_TORCH ? 2 : 5;
  double v = (double)n / 1024.0;
  int u = 0;
  while (u < last && (style == CL_BYTES_TORCH ? v > 1024.0 : v >= 1024.0)) {
    v /= 1024.0;
    u++;
  }
  cl_snprintf_c(buf, CL_BYTES_BUF, "%.2f %s", v, units[u]);
  return buf;
}

void cl_html_fput(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p >= 0x80) {
      const size_t len = cl_utf8_len(p, 4);
      if (len) {
        fwrite(p, 1, len, f);
        p += len - 1;
      } else {
        fputs("&#xFFFD;", f);
      }
      continue;
    }
    switch (*p) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default:
      if (*p < 0x20 || *p == 0x7f)
        fputs("&#xFFFD;", f);
      else
        fputc(*p, f);
    }
  }
}
