#include "c_locale.h"

#include <locale.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static locale_t c_locale;

static void make_c_locale(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

/* The "C" locale, or (locale_t)0 if it could not be made (the program's locale is used then). */
static locale_t get_c_locale(void) {
  pthread_once(&once, make_c_locale);
  return c_locale;
}

double cl_strtod_c(const char *s, char **end) {
  locale_t c = get_c_locale();
  return c ? strtod_l(s, end, c) : strtod(s, end);
}

int cl_snprintf_c(char *buf, size_t cap, const char *fmt, ...) {
  locale_t c = get_c_locale();
  locale_t old = c ? uselocale(c) : (locale_t)0; /* this thread only, for this call */
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  if (c)
    uselocale(old);
  return n;
}
