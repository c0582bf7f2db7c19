/* alloc_snapshot: helpers shared by the subcommands (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int as_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "alloc_snapshot %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see 'alloc_snapshot %s --help')\n", cmd);
  va_end(ap);
  return AS_EXIT_USAGE;
}

int as_one_operand(const char *cmd, const char *what, int argc, int optind) {
  if (argc == optind)
    return as_usage_error(cmd, "no %s given", what);
  if (argc - optind > 1)
    return as_usage_error(cmd, "one %s expected, got %d arguments", what, argc - optind);
  return AS_EXIT_OK;
}

int as_failure(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "alloc_snapshot %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return AS_EXIT_FAILURE;
}

int as_getopt(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *longopts) {
  opterr = 0; /* our messages, not getopt's */
  int c = getopt_long(argc, argv, shortopts, longopts, NULL);
  if (c == '?' || c == ':') {
    /* The offending argument is the last one getopt looked at; for a short option in a group
     * ("-xb") only the letter, optopt, names it. */
    const char *arg = optind >= 1 && optind - 1 < argc ? argv[optind - 1] : "";
    bool long_opt = strncmp(arg, "--", 2) == 0;
    if (c == '?' && long_opt)
      as_usage_error(cmd, "unknown option or unexpected value '%s'", arg);
    else if (c == '?')
      as_usage_error(cmd, "unknown option '-%c'", optopt);
    else if (long_opt)
      as_usage_error(cmd, "option '%s' needs a value", arg);
    else
      as_usage_error(cmd, "option '-%c' needs a value", optopt);
    return '?';
  }
  return c;
}

bool as_parse_u64(const char *text, uint64_t max, uint64_t *out) {
  /* strtoull accepts a sign and leading spaces ("-1" becomes UINT64_MAX): digits only are allowed. */
  if (text == NULL || text[0] < '0' || text[0] > '9')
    return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || v > max)
    return false;
  *out = (uint64_t)v;
  return true;
}

bool as_parse_bytes(const char *text, uint64_t *out) {
  if (text == NULL || text[0] < '0' || text[0] > '9')
    return false;
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0)
    return false;
  static const struct {
    const char *a, *b;
    int shift;
  } units[] = {{"", "B", 0}, {"K", "KiB", 10}, {"M", "MiB", 20}, {"G", "GiB", 30}, {"T", "TiB", 40}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].a) == 0 || strcmp(end, units[i].b) == 0) {
      if (v > (UINT64_MAX >> units[i].shift))
        return false;
      *out = (uint64_t)v << units[i].shift;
      return true;
    }
  }
  return false;
}

char *as_fmt_delta(char buf[AS_SIZE_BUF], uint64_t before, uint64_t after, bool exact) {
  char tmp[AS_SIZE_BUF];
  if (after == before)
    snprintf(buf, AS_SIZE_BUF, "%s", exact ? "0" : "0 B");
  else if (snprintf(buf, AS_SIZE_BUF, "%c%s", after > before ? '+' : '-',
                    as_fmt_size(tmp, after > before ? after - before : before - after, exact)) >= AS_SIZE_BUF)
    buf[AS_SIZE_BUF - 1] = '\0'; /* cannot happen: a size is at most 26 characters */
  return buf;
}

void as_table_init(as_table *t, size_t n_cols, const char *align) {
  memset(t, 0, sizeof *t);
  t->n_cols = n_cols;
  t->align = align;
}

void as_table_row(as_table *t, const char *const *cells) {
  if (t->oom)
    return;
  if (t->n_rows == t->cap_rows) {
    size_t cap = t->cap_rows ? t->cap_rows * 2 : 16;
    char **grown = realloc(t->cells, cap * t->n_cols * sizeof *grown);
    if (grown == NULL) {
      t->oom = true;
      return;
    }
    t->cells = grown;
    t->cap_rows = cap;
  }
  char **row = t->cells + t->n_rows * t->n_cols;
  for (size_t c = 0; c < t->n_cols; c++) {
    row[c] = strdup(cells[c] ? cells[c] : "");
    if (row[c] == NULL) {
      for (size_t k = 0; k < c; k++)
        free(row[k]);
      t->oom = true;
      return;
    }
  }
  t->n_rows++;
}

bool as_table_print(const as_table *t, int indent) {
  if (t->oom)
    return false;
  size_t *width = calloc(t->n_cols ? t->n_cols : 1, sizeof *width);
  if (width == NULL)
    return false;
  for (size_t r = 0; r < t->n_rows; r++)
    for (size_t c = 0; c < t->n_cols; c++) {
      size_t len = strlen(t->cells[r * t->n_cols + c]);
      if (len > width[c])
        width[c] = len;
    }
  for (size_t r = 0; r < t->n_rows; r++) {
    printf("%*s", indent, "");
    for (size_t c = 0; c < t->n_cols; c++) {
      const char *cell = t->cells[r * t->n_cols + c];
      bool right = t->align != NULL && t->align[c] == 'r';
      bool last = c + 1 == t->n_cols;
      /* Widths come from strlen of our own cells, so they fit an int. */
      if (right)
        printf("%*s", (int)width[c], cell);
      else if (last)
        fputs(cell, stdout); /* no trailing blanks on a left-aligned last column */
      else
        printf("%-*s", (int)width[c], cell);
      if (!last)
        fputs("  ", stdout);
    }
    fputc('\n', stdout);
  }
  free(width);
  return true;
}

void as_table_free(as_table *t) {
  for (size_t i = 0; i < t->n_rows * t->n_cols; i++)
    free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
}

int as_finish_stdout(const char *cmd, int status) {
  if (fflush(stdout) != 0 || ferror(stdout))
    return as_failure(cmd, "cannot write to standard output: %s", strerror(errno));
  return status;
}

int as_snapshot_name(const char *name, size_t *stem) {
  size_t len = strlen(name);
  if (len > 3 && strcmp(name + len - 3, ".gz") == 0)
    len -= 3;
  static const struct {
    const char *ext;
    int pickle;
  } exts[] = {{".pickle", 1}, {".pkl", 1}, {".json", 0}};
  for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
    size_t m = strlen(exts[i].ext);
    if (len > m && strncmp(name + len - m, exts[i].ext, m) == 0) {
      *stem = len - m;
      return exts[i].pickle;
    }
  }
  *stem = len;
  return -1;
}
