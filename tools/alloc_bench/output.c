/* alloc_bench: what a run prints and writes: the lines before the table, the table, and the --csv,
 * --json and --svg files (the run's settings go into the JSON as its "config"). The lines and the table
 * go to standard error when one of the files goes to standard output. */
#include "config.h"
#include "json_writer.h" /* src/common/: its string escaper */

#include <inttypes.h>
#include <stdarg.h>
#include <string.h>


/* Whether row r was skipped because its allocator cannot run here (its note is the allocator's reason). */
static bool skipped_for_allocator(const config *c, const ab_row *r) {
  for (int i = 0; i < c->n_alloc; i++)
    if (c->skip[i][0] != '\0' && strcmp(c->alloc[i]->name, r->allocator) == 0 && strcmp(c->skip[i], r->note) == 0)
      return true;
  return false;
}

/* What the table says when no row ran: the one reason that is not an allocator's (`-w replay` without a
 * trace said every allocator was skipped), else that the allocators were. */
static const char *why_none_ran(const config *c, const ab_results *res) {
  const char *other = NULL;
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    if (r->status != AB_ROW_SKIPPED || skipped_for_allocator(c, r))
      continue;
    if (other != NULL && strcmp(other, r->note) != 0)
      return "every row was skipped, for the reasons above";
    other = r->note;
  }
  return other != NULL ? other : "every selected allocator was skipped";
}

/* A JSON string's contents into buf[0..len), cut before the character whose escape might not fit. */
typedef struct {
  char *buf;
  size_t len, k;
} bounded;

static void put_bounded(void *ctx, const char *bytes, size_t n) {
  bounded *b = ctx;
  if (b->k + 7 >= b->len) /* the longest escape (6) and the NUL */
    return;
  memcpy(b->buf + b->k, bytes, n);
  b->k += n;
}

static void json_contents(char *buf, size_t len, const char *s) {
  bounded b = {buf, len, 0};
  cl_json_escape(s, put_bounded, &b);
  buf[b.k] = '\0';
}

/* Appends to buf[0..len) at *k; stops quietly at the end of the buffer. */
static void append(char *buf, size_t len, size_t *k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t len, size_t *k, const char *fmt, ...) {
  if (*k >= len)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *k, len - *k, fmt, ap);
  va_end(ap);
  *k = n < 0 ? len : *k + (size_t)n;
}

static void config_json(const config *c, char *buf, size_t len, const char *device) {
  size_t k = 0;
  char tmp[1024];
  json_contents(tmp, sizeof tmp, device);
  append(buf, len, &k,
         "{\"device\": \"%s\", \"repeat\": %d, \"ops\": %zu, \"graph_ops\": %zu, \"replays\": %d, "
         "\"host_ops\": %zu, \"threads\": %d, \"streams\": %d, \"seed\": %" PRIu64 ", \"workloads\": [",
         tmp, c->repeat, c->ops, c->graph_ops, c->replays, c->host_ops, c->threads, c->streams, c->seed);
  bool first = true;
  for (int i = 0; i < WL_COUNT; i++)
    if (c->workload[i]) {
      append(buf, len, &k, "%s\"%s\"", first ? "" : ", ", ab_workload_names[i]);
      first = false;
    }
  append(buf, len, &k, "], \"traces\": [");
  for (size_t i = 0; i < c->n_traces; i++) {
    json_contents(tmp, sizeof tmp, c->traces[i]);
    append(buf, len, &k, "%s\"%s\"", i ? ", " : "", tmp);
  }
  append(buf, len, &k, "], \"skipped\": {");
  first = true;
  for (int i = 0; i < c->n_alloc; i++)
    if (c->skip[i][0] != '\0') {
      json_contents(tmp, sizeof tmp, c->skip[i]);
      append(buf, len, &k, "%s\"%s\": \"%s\"", first ? "" : ", ", c->alloc[i]->name, tmp);
      first = false;
    }
  append(buf, len, &k, "}}");
  if (k >= len) /* cut: keep it valid JSON */
    snprintf(buf, len, "{\"truncated\": true}");
}

/* The lines before the table: the units, the device, and what was left out of the table. */
static void print_preamble(FILE *out, const config *c, const ab_results *res, const char *device) {
  fprintf(out,
          "alloc_bench: %d timed passes per row after one warm-up; median [min-max] in ns per unit:\n"
          "ns/pair = per alloc+free PAIR; ns/op = per single alloc or free call (mt: wall time / all threads'\n"
          "calls); ns/replay = per graph launch. Device: %s.\n",
          c->repeat, device[0] ? device : "none used (simulated only)");
  if (c->pin >= 0)
    fprintf(out,
            "Pinned: single-thread rows on CPU %d, mt's thread i on the i-th CPU after it that the process may use.\n",
            c->pin);
  for (int i = 0; i < c->n_alloc; i++)
    if (c->skip[i][0] != '\0')
      fprintf(out, "skipped (left out of the table): %s: %s\n", c->alloc[i]->name, c->skip[i]);
  /* Rows skipped for another reason than their allocator (replay without a trace), even where the
   * allocator cannot run either: once per workload. */
  for (size_t k = 0; k < res->n; k++) {
    const ab_row *r = &res->rows[k];
    bool seen = false;
    for (const ab_row *o = res->rows; o < r && !seen; o++)
      seen = o->status == AB_ROW_SKIPPED && strcmp(o->workload, r->workload) == 0 && strcmp(o->note, r->note) == 0;
    if (r->status == AB_ROW_SKIPPED && !skipped_for_allocator(c, r) && !seen)
      fprintf(out, "skipped (left out of the table): %s: %s\n", r->workload, r->note);
  }
}

void ab_report(const config *c, const ab_results *res, const char *device) {
  /* A file written to standard output ("-") keeps it to itself, for the program reading the pipe. */
  FILE *out = ab_output_to_stdout(c) ? stderr : stdout;
  print_preamble(out, c, res, device);
  fputc('\n', out);
  ab_print_table(out, res, why_none_ran(c, res));
  char err[AB_ERR_LEN];
  if (c->csv != NULL && ab_write_csv(c->csv, res, err) != 0) {
    fprintf(stderr, "alloc_bench: %s\n", err);
    ab_failed = true;
  }
  if (c->json != NULL) {
    char cfg[8192];
    config_json(c, cfg, sizeof cfg, device);
    if (ab_write_json(c->json, res, cfg, err) != 0) {
      fprintf(stderr, "alloc_bench: %s\n", err);
      ab_failed = true;
    }
  }
  if (c->svg != NULL && ab_write_svg(c->svg, res, device[0] ? device : "simulated device", err) != 0) {
    fprintf(stderr, "alloc_bench: %s\n", err);
    ab_failed = true;
  }
}
