/* Text for people, written by the library and by its tools (which compile this file in): byte counts in
 * binary units, and strings made safe inside HTML and XML. One implementation each, so that the OOM
 * message, alloc_snapshot's tables and pages and alloc_bench's report cannot drift apart. */
#ifndef CACHALOT_COMMON_TEXT_H
#define CACHALOT_COMMON_TEXT_H

#include <stdint.h>
#include <stdio.h>

/* How a byte count is written. The numbers are printed in the "C" locale (a decimal point whatever the
 * program's locale). */
typedef enum {
  /* "1023 B", then two decimals in the largest unit that keeps the value at or above 1: "1.00 KiB",
   * "4.50 MiB", up to EiB (alloc_snapshot, alloc_bench, and the explorer page's fmtSize in JavaScript) */
  CL_BYTES_BINARY,
  /* PyTorch's OOM message, kept to the byte because programs parse it: "1024 bytes" up to and including
   * 1 KiB, then "%.2f KiB" up to and including 1 MiB, MiB up to and including 1 GiB, GiB beyond (no TiB) */
  CL_BYTES_TORCH,
  /* the count alone, "4194304" (alloc_snapshot's --bytes) */
  CL_BYTES_EXACT,
} cl_bytes_style;

enum { CL_BYTES_BUF = 32 }; /* every style's longest text, with room to spare */

/* n as `style` says, into buf; returns buf. */
char *cl_format_bytes(char buf[CL_BYTES_BUF], uint64_t n, cl_bytes_style style);

/* s as text for HTML or XML, in element content or a quoted attribute value: '&', '<', '>', '"' and '\''
 * as references; a control character (DEL too) and a byte that starts no valid UTF-8 character as
 * &#xFFFD;, since XML forbids the first and an SVG with the second is not a document at all. */
void cl_html_fput(FILE *f, const char *s);

#endif
