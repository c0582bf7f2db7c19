/* Numbers read and written the same way whatever the program's locale: a program that called
 * setlocale(LC_ALL, "") with a decimal comma must still have "0.8" accepted in a config string and get
 * JSON (and PyTorch-style messages) with decimal points. */
#ifndef CACHALOT_COMMON_C_LOCALE_H
#define CACHALOT_COMMON_C_LOCALE_H

#include <stddef.h>

#include "error.h"

/* strtod in the "C" locale. */
double cl_strtod_c(const char *s, char **end);

/* snprintf in the "C" locale (for formats with floating-point conversions). */
int cl_snprintf_c(char *buf, size_t cap, const char *fmt, ...) CL_PRINTF(3, 4);

#endif
