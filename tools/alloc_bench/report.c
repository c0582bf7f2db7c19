/* alloc_bench: the results as a table, CSV and JSON, and the CSV read back (for `alloc_bench svg`). */
#include "bench.h"

#include "../common/outfile.h"
#include "json_writer.h" /* src/common/: its string escaper */
#include "text.h"        /* src/common/: the byte formatter */

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

ab_row *ab_results_add(ab_results *r) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 64;
    ab_row *rows = realloc(r->rows, cap * sizeof *rows);
    if (rows == NULL)
      return NULL;
    r->rows = rows;
    r->cap = cap;
  }
  ab_row *row = &r->rows[r->n++];
  memset(row, 0, sizeof *row);
  /* no peak measured yet: -1 is "unknown" (a negative peak's cell stays "-") */
  row->peak_reserved = row->peak_allocated = row->peak_requested = row->device_allocs = row->first_reserved = -1;
  return row;
}

void ab_results_free(ab_results *r) {
  free(r->rows);
  memset(r, 0, sizeof *r);
}

static const char *const status_names[] = {"ok", "skipped", "n/a", "error"};

const char *ab_status_name(ab_row_status s) { return (unsigned)s < 4 ? status_names[s] : "?"; }

static char *fmt_ns(char buf[32], double ns) {
  snprintf(buf, 32, ns < 10 ? "%.2f" : ns < 100 ? "%.1f" : "%.0f", ns);
  return buf;
}

/* ---- the table ---- */

enum { COLS = 11, CELL = AB_ERR_LEN + 160 };

static const char *const headers[COLS] = {"workload",     "allocator",      "unit",    "median", "[min-max]",
                                          "peak reserved", "peak allocated", "peak requested", "res/req",
                                          "dev allocs",   "note"};
static const bool right[COLS] = {false, false, false, true, false, true, true, true, true, true, false};

static void row_cells(const ab_row *r, char cells[COLS][CELL]) {
  for (int i = 0; i < COLS; i++)
    snprintf(cells[i], CELL, "-");
  snprintf(cells[0], CELL, "%s", r->workload);
  snprintf(cells[1], CELL, "%s", r->allocator);
  snprintf(cells[2], CELL, "%s", r->unit);
  cells[10][0] = '\0';
  if (r->status != AB_ROW_OK) {
    snprintf(cells[3], CELL, "%s", ab_status_name(r->status));
    cells[4][0] = '\0';
    if (r->status != AB_ROW_SKIPPED)
      snprintf(cells[10], CELL, "%s", r->note);
    return;
  }
  char a[32], b[32];
  fmt_ns(cells[3], r->median_ns);
  snprintf(cells[4], CELL, "[%s-%s]", fmt_ns(a, r->min_ns), fmt_ns(b, r->max_ns));
  const int64_t peaks[3] = {r->peak_reserved, r->peak_allocated, r->peak_requested};
  for (int i = 0; i < 3; i++) /* a negative peak was not measured: its cell stays "-" */
    if (peaks[i] >= 0)
      cl_format_bytes(cells[5 + i], (uint64_t)peaks[i], CL_BYTES_BINARY);
  if (r->peak_reserved >= 0 && r->peak_requested > 0 && r->first_reserved >= 0)
    snprintf(cells[8], CELL, "%.3f (first pass %.3f)", (double)r->peak_reserved / (double)r->peak_requested,
             (double)r->first_reserved / (double)r->peak_requested);
  else if (r->peak_reserved >= 0 && r->peak_requested > 0)
    snprintf(cells[8], CELL, "%.3f", (double)r->peak_reserved / (double)r->peak_requested);
  if (r->device_allocs >= 0)
    snprintf(cells[9], CELL, "%" PRId64, r->device_allocs);
}

/* The family of a row name: "pair-4KiB" -> "pair". */
static size_t family_len(const char *name) {
  const char *dash = strchr(name, '-');
  return dash ? (size_t)(dash - name) : strlen(name);
}

/* One line of the table, without trailing blanks. */
static void print_line(FILE *out, const size_t width[COLS], char cells[COLS][CELL]) {
  char line[COLS * (CELL + 2) + 1];
  size_t k = 0;
  for (int i = 0; i < COLS; i++) {
    int w = right[i] ? (int)width[i] : -(int)(i == COLS - 1 ? 0 : width[i]);
    int n = snprintf(line + k, sizeof line - k, "%s%*s", i ? "  " : "", w, cells[i]);
    k = n < 0 ? k : k + (size_t)n < sizeof line ? k + (size_t)n : sizeof line - 1;
  }
  while (k > 0 && line[k - 1] == ' ')
    k--;
  line[k] = '\0';
  fprintf(out, "%s\n", line);
}

void ab_print_table(FILE *out, const ab_results *res, const char *why_none) {
  size_t width[COLS];
  char cells[COLS][CELL];
  for (int i = 0; i < COLS; i++)
    width[i] = strlen(headers[i]);
  for (size_t k = 0; k < res->n; k++) {
    if (res->rows[k].status == AB_ROW_SKIPPED)
      continue;
    row_cells(&res->rows[k], cells);
    for (int i = 0; i < COLS; i++)
      width[i] = strlen(cells[i]) > width[i] ? strlen(cells[i]) : width[i];
  }
  for (int i = 0; i < COLS; i++)
    snprintf(cells[i], CELL, "%s", headers[i]);
  print_line(out, width, cells);
  const char *prev = NULL;
  size_t shown = 0;
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    if (r->status == AB_ROW_SKIPPED)
      continue;
    if (prev != NULL &&
        (family_len(prev) != family_len(r->workload) || strncmp(prev, r->workload, family_len(prev)) != 0))
      fputc('\n', out);
    prev = r->workload;
    row_cells(r, cells);
    print_line(out, width, cells);
    shown++;
  }
  if (shown == 0)
    fprintf(out, "(no row ran: %s)\n", why_none);
}

/* ---- CSV ---- */

static const char csv_header[] = "workload,allocator,status,unit,units_per_repeat,repeats,threads,streams,median_ns,"
                                 "min_ns,max_ns,peak_reserved_bytes,peak_allocated_bytes,peak_requested_bytes,"
                                 "device_allocs,note";

static void csv_field(FILE *f, const char *s) {
  if (strpbrk(s, ",\"\n\r") == NULL) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static void csv_i64(FILE *f, int64_t v) {
  if (v >= 0)
    fprintf(f, "%" PRId64, v);
}

/* The outputs are written as common/outfile.h says: "-" to standard output, a regular file atomically,
 * anything else through. */
static FILE *open_output(tool_out *o, const char *path, char err[AB_ERR_LEN]) {
  char why[256];
  if (tool_out_open(o, path, why, sizeof why) != 0) {
    snprintf(err, AB_ERR_LEN, "cannot write %s: %s", tool_out_name(path), why);
    return NULL;
  }
  return o->f;
}

static int close_output(tool_out *o, const char *path, char err[AB_ERR_LEN]) {
  char why[256];
  if (tool_out_close(o, true, why, sizeof why) != 0) {
    snprintf(err, AB_ERR_LEN, "cannot write %s: %s", tool_out_name(path), why);
    return -1;
  }
  return 0;
}

int ab_write_csv(const char *path, const ab_results *res, char err[AB_ERR_LEN]) {
  tool_out o;
  FILE *f = open_output(&o, path, err);
  if (f == NULL)
    return -1;
  fprintf(f, "%s\n", csv_header);
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    csv_field(f, r->workload);
    fputc(',', f);
    csv_field(f, r->allocator);
    fprintf(f, ",%s,%s,%" PRIu64 ",%d,%d,%d,", ab_status_name(r->status), r->unit, r->units, r->repeats, r->threads,
            r->streams);
    if (r->status == AB_ROW_OK)
      fprintf(f, "%.3f,%.3f,%.3f,", r->median_ns, r->min_ns, r->max_ns);
    else
      fputs(",,,", f);
    csv_i64(f, r->peak_reserved);
    fputc(',', f);
    csv_i64(f, r->peak_allocated);
    fputc(',', f);
    csv_i64(f, r->peak_requested);
    fputc(',', f);
    csv_i64(f, r->device_allocs);
    fputc(',', f);
    csv_field(f, r->note);
    fputc('\n', f);
  }
  return close_output(&o, path, err);
}

/* Splits one CSV record (RFC 4180 quoting; no newlines inside fields) in place into at most max fields. */
static size_t csv_split(char *line, char **fields, size_t max) {
  size_t n = 0;
  char *p = line;
  for (;;) {
    if (n == max)
      return n;
    char *out = p;
    fields[n++] = p;
    if (*p == '"') {
      p++;
      for (;;) {
        if (*p == '\0')
          break;
        if (*p == '"' && p[1] == '"') {
          *out++ = '"';
          p += 2;
        } else if (*p == '"') {
          p++;
          break;
        } else {
          *out++ = *p++;
        }
      }
      while (*p != ',' && *p != '\0')
        p++;
    } else {
      while (*p != ',' && *p != '\0')
        *out++ = *p++;
    }
    bool more = *p == ',';
    *out = '\0';
    if (!more)
      return n;
    p++;
  }
}

/* The columns the chart needs, found by their header names (note may be missing). */
enum { F_WORKLOAD, F_ALLOCATOR, F_STATUS, F_UNIT, F_MEDIAN, F_MIN, F_MAX, F_NOTE, F_COUNT };

/* col[] from the header's n fields: 0, or -1 when a column other than note is missing. */
static int find_columns(char **fields, size_t n, int col[F_COUNT], const char *path, char err[AB_ERR_LEN]) {
  static const char *const want[F_COUNT] = {"workload", "allocator", "status", "unit",
                                            "median_ns", "min_ns",   "max_ns", "note"};
  for (int i = 0; i < F_COUNT; i++) {
    col[i] = -1;
    for (size_t k = 0; k < n; k++)
      if (strcmp(fields[k], want[i]) == 0)
        col[i] = (int)k;
    if (col[i] < 0 && i != F_NOTE) {
      snprintf(err, AB_ERR_LEN, "%s: no '%s' column in the header (not an alloc_bench CSV?)", path, want[i]);
      return -1;
    }
  }
  return 0;
}

/* One record of n fields, line `lineno`, as a row of res. 0, or -1 with a message. */
static int read_row(char **fields, size_t n, const int col[F_COUNT], ab_results *res, const char *path,
                    size_t lineno, char err[AB_ERR_LEN]) {
  for (int i = 0; i < F_COUNT; i++)
    if (col[i] >= 0 && (size_t)col[i] >= n) {
      snprintf(err, AB_ERR_LEN, "%s:%zu: %zu fields, expected at least %d", path, lineno, n, col[i] + 1);
      return -1;
    }
  ab_row *r = ab_results_add(res);
  if (r == NULL) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  snprintf(r->workload, sizeof r->workload, "%s", fields[col[F_WORKLOAD]]);
  snprintf(r->allocator, sizeof r->allocator, "%s", fields[col[F_ALLOCATOR]]);
  snprintf(r->unit, sizeof r->unit, "%s", fields[col[F_UNIT]]);
  if (col[F_NOTE] >= 0)
    snprintf(r->note, sizeof r->note, "%s", fields[col[F_NOTE]]);
  r->status = AB_ROW_ERROR;
  for (int s = 0; s < 4; s++)
    if (strcmp(fields[col[F_STATUS]], status_names[s]) == 0)
      r->status = (ab_row_status)s;
  if (r->status != AB_ROW_OK)
    return 0;
  char *end1, *end2, *end3;
  r->median_ns = strtod(fields[col[F_MEDIAN]], &end1);
  r->min_ns = strtod(fields[col[F_MIN]], &end2);
  r->max_ns = strtod(fields[col[F_MAX]], &end3);
  if (*end1 || *end2 || *end3 || end1 == fields[col[F_MEDIAN]] || !(r->median_ns >= 0) || !(r->min_ns >= 0) ||
      !(r->max_ns >= 0)) {
    snprintf(err, AB_ERR_LEN, "%s:%zu: median_ns, min_ns and max_ns must be non-negative numbers", path, lineno);
    return -1;
  }
  return 0;
}

int ab_read_csv(const char *path, ab_results *res, char err[AB_ERR_LEN]) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    snprintf(err, AB_ERR_LEN, "cannot read %s: %s", path, strerror(errno));
    return -1;
  }
  int col[F_COUNT];
  char line[4096];
  char *fields[32];
  int rc = 0;
  size_t lineno = 0;
  while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
    lineno++;
    size_t len = strlen(line);
    if (len > 0 && line[len - 1] != '\n' && !feof(f)) {
      snprintf(err, AB_ERR_LEN, "%s:%zu: line too long", path, lineno);
      rc = -1;
      break;
    }
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      line[--len] = '\0';
    if (len == 0)
      continue;
    size_t n = csv_split(line, fields, 32);
    rc = lineno == 1 ? find_columns(fields, n, col, path, err) : read_row(fields, n, col, res, path, lineno, err);
  }
  if (rc == 0 && ferror(f)) {
    snprintf(err, AB_ERR_LEN, "cannot read %s: %s", path, strerror(errno));
    rc = -1;
  }
  if (rc == 0 && lineno == 0) {
    snprintf(err, AB_ERR_LEN, "%s: empty file", path);
    rc = -1;
  }
  fclose(f);
  return rc;
}

/* ---- JSON ---- */

static void json_i64(FILE *f, const char *key, int64_t v) {
  if (v >= 0)
    fprintf(f, ", \"%s\": %" PRId64, key, v);
  else
    fprintf(f, ", \"%s\": null", key);
}

int ab_write_json(const char *path, const ab_results *res, const char *config, char err[AB_ERR_LEN]) {
  tool_out o;
  FILE *f = open_output(&o, path, err);
  if (f == NULL)
    return -1;
  fprintf(f, "{\"tool\": \"alloc_bench\", \"config\": %s, \"rows\": [", config);
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    fprintf(f, "%s\n  {\"workload\": ", k ? "," : "");
    cl_json_fput_string(f, r->workload);
    fputs(", \"allocator\": ", f);
    cl_json_fput_string(f, r->allocator);
    fprintf(f, ", \"status\": \"%s\", \"unit\": \"%s\", \"units_per_repeat\": %" PRIu64
               ", \"repeats\": %d, \"threads\": %d, \"streams\": %d",
            ab_status_name(r->status), r->unit, r->units, r->repeats, r->threads, r->streams);
    if (r->status == AB_ROW_OK)
      fprintf(f, ", \"median_ns\": %.3f, \"min_ns\": %.3f, \"max_ns\": %.3f", r->median_ns, r->min_ns, r->max_ns);
    else
      fputs(", \"median_ns\": null, \"min_ns\": null, \"max_ns\": null", f);
    json_i64(f, "peak_reserved_bytes", r->peak_reserved);
    json_i64(f, "peak_allocated_bytes", r->peak_allocated);
    json_i64(f, "peak_requested_bytes", r->peak_requested);
    json_i64(f, "device_allocs", r->device_allocs);
    json_i64(f, "first_pass_peak_reserved_bytes", r->first_reserved);
    fputs(", \"note\": ", f);
    cl_json_fput_string(f, r->note);
    fputc('}', f);
  }
  fputs("\n]}\n", f);
  return close_output(&o, path, err);
}
