/* src/common/text.c: the one byte formatter (the OOM message's PyTorch style, the tools' binary units and
 * exact counts) and the one HTML/XML escaper of the library and its tools.
 *
 * The PyTorch style is checked against the OOM path's own formatter as it was before it moved here
 * (torch_reference below, copied from oom.c at 2973e9b), at every power of two and its neighbours and at
 * a million random sizes, so that the message stays byte-identical; the binary style likewise against
 * alloc_snapshot's as_fmt_size of then. Exact strings pin the boundaries; the explorer page's fmtSize
 * (JavaScript, tools/alloc_snapshot/plot/explorer_view.js) is pinned to the same binary-style strings by
 * tests/explorer/driver.js. */
#include "helpers.h"

#include "common/text.h"

#include <inttypes.h>
#include <locale.h>

/* oom.c's format_size before this file existed. */
static void torch_reference(char *buf, size_t cap, uint64_t n) {
  if (n <= 1024)
    snprintf(buf, cap, "%llu bytes", (unsigned long long)n);
  else if (n <= 1048576)
    snprintf(buf, cap, "%.2f KiB", (double)n / 1024.0);
  else if (n <= 1073741824ull)
    snprintf(buf, cap, "%.2f MiB", (double)n / 1048576.0);
  else
    snprintf(buf, cap, "%.2f GiB", (double)n / 1073741824.0);
}

/* alloc_snapshot's as_fmt_size (not exact) before this file existed. */
static void binary_reference(char *buf, size_t cap, uint64_t n) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) {
    snprintf(buf, cap, "%" PRIu64 " B", n);
    return;
  }
  double v = (double)n / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < 6) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, cap, "%.2f %s", v, units[u]);
}

static void same_as_references(uint64_t n) {
  char got[CL_BYTES_BUF], want[64];
  torch_reference(want, sizeof want, n);
  STR_EQ(cl_format_bytes(got, n, CL_BYTES_TORCH), want);
  binary_reference(want, sizeof want, n);
  STR_EQ(cl_format_bytes(got, n, CL_BYTES_BINARY), want);
  snprintf(want, sizeof want, "%" PRIu64, n);
  STR_EQ(cl_format_bytes(got, n, CL_BYTES_EXACT), want);
}

static void test_bytes_match_the_old_formatters(void **state) {
  (void)state;
  for (int e = 0; e < 64; e++)
    for (int d = -2; d <= 2; d++)
      same_as_references(((uint64_t)1 << e) + (uint64_t)(int64_t)d);
  same_as_references(0);
  same_as_references(UINT64_MAX);
  uint64_t x = 0x9E3779B97F4A7C15ull; /* xorshift: sizes of every magnitude */
  for (int i = 0; i < 1000000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    same_as_references(x >> (x & 63));
  }
}

static void test_bytes_boundaries(void **state) {
  (void)state;
  char b[CL_BYTES_BUF];
  static const struct {
    uint64_t n;
    cl_bytes_style style;
    const char *text;
  } cases[] = {
      {0, CL_BYTES_TORCH, "0 bytes"},
      {1024, CL_BYTES_TORCH, "1024 bytes"},
      {1025, CL_BYTES_TORCH, "1.00 KiB"},
      {1048576, CL_BYTES_TORCH, "1024.00 KiB"},
      {1048577, CL_BYTES_TORCH, "1.00 MiB"},
      {50 * MiB, CL_BYTES_TORCH, "50.00 MiB"},
      {GiB, CL_BYTES_TORCH, "1024.00 MiB"},
      {(uint64_t)GiB << 30, CL_BYTES_TORCH, "1073741824.00 GiB"}, /* no TiB in PyTorch's message */
      {UINT64_MAX, CL_BYTES_TORCH, "17179869184.00 GiB"},
      {0, CL_BYTES_BINARY, "0 B"},
      {1023, CL_BYTES_BINARY, "1023 B"},
      {1024, CL_BYTES_BINARY, "1.00 KiB"},
      {1000000, CL_BYTES_BINARY, "976.56 KiB"},
      {1048575, CL_BYTES_BINARY, "1024.00 KiB"}, /* rounded up, but below a MiB */
      {1152, CL_BYTES_BINARY, "1.12 KiB"},       /* exact ties (1.125, 1.375, 1.625): half to even */
      {1408, CL_BYTES_BINARY, "1.38 KiB"},
      {1664, CL_BYTES_BINARY, "1.62 KiB"},
      {1048576, CL_BYTES_BINARY, "1.00 MiB"},
      {7 * (uint64_t)GiB + GiB / 2, CL_BYTES_BINARY, "7.50 GiB"},
      {(uint64_t)GiB << 30, CL_BYTES_BINARY, "1.00 EiB"},
      {UINT64_MAX, CL_BYTES_BINARY, "16.00 EiB"},
      {UINT64_MAX, CL_BYTES_EXACT, "18446744073709551615"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    STR_EQ(cl_format_bytes(b, cases[i].n, cases[i].style), cases[i].text);
}

/* A program with a decimal comma still gets PyTorch's message with a point, and so do the tools. */
static void test_bytes_in_a_comma_locale(void **state) {
  (void)state;
  const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"};
  const char *set = NULL;
  for (size_t i = 0; i < 4 && !set; i++)
    set = setlocale(LC_NUMERIC, names[i]);
  if (!set) {
    print_message("no decimal-comma locale installed: the locale case is not run\n");
    return;
  }
  char b[CL_BYTES_BUF];
  STR_EQ(cl_format_bytes(b, 1536, CL_BYTES_TORCH), "1.50 KiB");
  STR_EQ(cl_format_bytes(b, 1536, CL_BYTES_BINARY), "1.50 KiB");
  setlocale(LC_NUMERIC, "C");
}

static char *html(const char *s) {
  char *out = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&out, &len);
  assert_non_null(f);
  cl_html_fput(f, s);
  fclose(f);
  return out;
}

#define HTML_EQ(in, want)                                                                                        \
  do {                                                                                                           \
    char *got_ = html(in);                                                                                       \
    STR_EQ(got_, want);                                                                                          \
    free(got_);                                                                                                  \
  } while (0)

static void test_html_escaping(void **state) {
  (void)state;
  HTML_EQ("", "");
  HTML_EQ("plain text 0.5", "plain text 0.5");
  HTML_EQ("x<b>&\"'.json", "x&lt;b&gt;&amp;&quot;&#39;.json");
  HTML_EQ("</script><!--", "&lt;/script&gt;&lt;!--");
  /* control characters, DEL too: XML 1.0 forbids them in a document */
  HTML_EQ("a\nb\tc\x01\x7f", "a&#xFFFD;b&#xFFFD;c&#xFFFD;&#xFFFD;");
  /* UTF-8 as it is; a byte that starts no character replaced, so the SVG stays well-formed */
  HTML_EQ("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\x8b", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\x8b");
  HTML_EQ("\xff", "&#xFFFD;");
  HTML_EQ("\xc0\xaf", "&#xFFFD;&#xFFFD;");         /* an overlong '/' */
  HTML_EQ("\xed\xa0\x80", "&#xFFFD;&#xFFFD;&#xFFFD;"); /* a surrogate */
  HTML_EQ("a\xe2\x82", "a&#xFFFD;&#xFFFD;");         /* cut short by the end */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bytes_match_the_old_formatters),
      cmocka_unit_test(test_bytes_boundaries),
      cmocka_unit_test(test_bytes_in_a_comma_locale),
      cmocka_unit_test(test_html_escaping),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
