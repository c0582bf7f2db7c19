/* alloc_snapshot summary: one row per snapshot file of a multi-rank job (CACHALOT_SNAPSHOT paths with
 * %r leave one file per rank), the skew between the ranks, and the worst rank. */
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json_writer.h" /* src/common/ */
#include "../common/snapshot_reader.h"
#include "../common/trace_walk.h"

static const char help[] =
    "usage: alloc_snapshot summary FILE... [--bytes] [--json]\n"
    "\n"
    "One row per snapshot file (one per rank of a job), then the skew between them and the worst rank.\n"
    "\n"
    "  rank            the trailing digits of the file's name once .gz and then .json, .pickle or .pkl\n"
    "                  are taken off (snap_rank3.json.gz: 3); else that name. Rows are in rank order,\n"
    "                  files without a number after those with one, in the order given\n"
    "  peak_allocated  the most bytes allocated at once over the trace (each alloc entry rounded up to\n"
    "                  a multiple of 512 B, the block size both allocators round a request to)\n"
    "  peak_reserved   the most bytes held from the device at once (segment_alloc - segment_free,\n"
    "                  segment_map - segment_unmap)\n"
    "  peak_requested  the most bytes the program had asked for at once (the alloc entries' sizes)\n"
    "  ratio           peak_reserved / peak_requested\n"
    "  allocated, reserved, segments   the snapshot's own values, at its end\n"
    "  ooms            the trace's oom entries\n"
    "  peaks           'trace', or 'current' when the file has no trace entries: the peaks are then\n"
    "                  the snapshot's current values\n"
    "The three peaks may fall at different times. A trace that began while memory was already held\n"
    "(a ring buffer that wrapped) starts from what the snapshot holds at its end less what the trace\n"
    "added, so its peaks count that memory too; every sum is over all devices of the file.\n"
    "Skew: per peak, the smallest and the largest (and their ranks), max - min and max / min. The worst\n"
    "rank has the highest peak_reserved (the first such); its excess over the median of peak_reserved\n"
    "(the mean of the two middle values for an even count) says how far it stands out.\n"
    "\n"
    "options:\n"
    "  --bytes     exact byte counts instead of KiB/MiB/GiB with two decimals\n"
    "  --json      the same as one JSON object (bytes exact)\n"
    "  -h, --help  this text\n"
    "\n"
    "A file that cannot be read is reported on stderr and left out; the others are still summarised,\n"
    "and the exit status is then 1. Exit status: 0 success, 1 a file unreadable or malformed, 2 usage\n"
    "error.\n";

typedef struct {
  const char *path;
  char name[64]; /* the rank as printed */
  bool numbered;
  uint64_t rank;
  size_t order; /* its place on the command line */
  bool from_trace;
  uint64_t peak[3]; /* allocated, reserved, requested */
  uint64_t cur[3];
  size_t segments, ooms;
} rank_row;

enum { P_ALLOC, P_RESERVED, P_REQUESTED };
static const char *const peak_names[] = {"peak_allocated", "peak_reserved", "peak_requested"};

static void rank_of(rank_row *r) {
  const char *base = strrchr(r->path, '/');
  base = base ? base + 1 : r->path;
  if (strcmp(r->path, "-") == 0)
    base = "<stdin>";
  size_t len;
  (void)as_snapshot_name(base, &len);
  size_t d = len;
  while (d > 0 && isdigit((unsigned char)base[d - 1]) && len - d < 9)
    d--;
  r->numbered = d < len;
  if (r->numbered) {
    r->rank = strtoull(base + d, NULL, 10);
    snprintf(r->name, sizeof r->name, "%" PRIu64, r->rank);
  } else {
    snprintf(r->name, sizeof r->name, "%.*s", len > 60 ? 60 : (int)len, base);
  }
}

/* A running total that may start below zero (frees of what was allocated before the trace began): the
 * lowest and highest it reaches, saturating in int64 so that a hostile file cannot overflow it. */
typedef struct {
  int64_t cur, lo, hi;
} running;

static void run_add(running *r, uint64_t v, bool up) {
  int64_t d = v > INT64_MAX ? INT64_MAX : (int64_t)v;
  if (up)
    r->cur = r->cur > INT64_MAX - d ? INT64_MAX : r->cur + d;
  else
    r->cur = r->cur < INT64_MIN + d ? INT64_MIN : r->cur - d;
  if (r->cur < r->lo)
    r->lo = r->cur;
  if (r->cur > r->hi)
    r->hi = r->cur;
}

/* The peak: the start is what the snapshot holds at the end less what the trace added, and at least
 * enough that the total never went below zero. */
static uint64_t run_peak(const running *r, uint64_t end) {
  uint64_t start = r->lo < 0 ? (uint64_t)0 - (uint64_t)r->lo : 0;
  if (r->cur < 0 ? true : end > (uint64_t)r->cur) {
    uint64_t from_end = r->cur < 0 ? as_sat_add(end, (uint64_t)0 - (uint64_t)r->cur) : end - (uint64_t)r->cur;
    if (from_end > start)
      start = from_end;
  }
  return as_sat_add(start, (uint64_t)r->hi);
}

static uint64_t round_block(uint64_t size) {
  if (size < 512)
    return 512;
  return size > UINT64_MAX - 511 ? UINT64_MAX : (size + 511) / 512 * 512;
}

/* The peaks over the trace into r; 0, or -1 on host OOM. */
static int walk_peaks(const as_snapshot *s, rank_row *r) {
  running run[3] = {{0}};
  tw_walk w;
  if (tw_begin(&w, s->traces, s->n_devices) != 0)
    return -1;
  tw_step st;
  int more;
  size_t entries = 0;
  while ((more = tw_next(&w, &st)) > 0) {
    const as_trace_entry *e = st.e;
    entries += st.kind != TW_IMPLICIT_FREE;
    switch (st.kind) {
    case TW_ALLOC:
      run_add(&run[P_ALLOC], round_block(e->size), true);
      run_add(&run[P_REQUESTED], e->size, true);
      break;
    case TW_IMPLICIT_FREE:
    case TW_FREE:
      run_add(&run[P_ALLOC], round_block(st.live->size), false);
      run_add(&run[P_REQUESTED], st.live->size, false);
      break;
    case TW_UNKNOWN_FREE: /* allocated before the trace began: the start makes up for it */
      run_add(&run[P_ALLOC], round_block(e->size), false);
      run_add(&run[P_REQUESTED], e->size, false);
      break;
    case TW_OTHER:
      if (e->action == AS_SEGMENT_ALLOC || e->action == AS_SEGMENT_MAP)
        run_add(&run[P_RESERVED], e->size, true);
      else if (e->action == AS_SEGMENT_FREE || e->action == AS_SEGMENT_UNMAP)
        run_add(&run[P_RESERVED], e->size, false);
      else if (e->action == AS_OOM)
        r->ooms++;
      break;
    }
  }
  tw_end(&w);
  if (more < 0)
    return -1;
  r->from_trace = entries > 0;
  for (int p = 0; p < 3; p++)
    r->peak[p] = r->from_trace ? run_peak(&run[p], r->cur[p]) : r->cur[p];
  return 0;
}

/* Reads one file into r; AS_EXIT_OK, or AS_EXIT_FAILURE after a message naming it. */
static int load_row(rank_row *r) {
  as_snapshot s;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(r->path, &s, err) != 0)
    return as_failure("summary", "%s", err);
  for (size_t i = 0; i < s.n_segments; i++) {
    r->cur[P_ALLOC] = as_sat_add(r->cur[P_ALLOC], s.segments[i].allocated_size);
    r->cur[P_RESERVED] = as_sat_add(r->cur[P_RESERVED], s.segments[i].total_size);
    r->cur[P_REQUESTED] = as_sat_add(r->cur[P_REQUESTED], s.segments[i].requested_size);
  }
  r->segments = s.n_segments;
  int rc = walk_peaks(&s, r);
  as_snapshot_free(&s);
  return rc == 0 ? AS_EXIT_OK : as_failure("summary", "%s: out of host memory", r->path);
}

static int cmp_rows(const void *pa, const void *pb) {
  const rank_row *a = pa, *b = pb;
  if (a->numbered != b->numbered)
    return a->numbered ? -1 : 1;
  if (a->numbered && a->rank != b->rank)
    return a->rank < b->rank ? -1 : 1;
  return a->order < b->order ? -1 : a->order > b->order ? 1 : 0;
}

static void ratio_text(char buf[AS_SIZE_BUF], uint64_t num, uint64_t den) {
  if (den == 0)
    snprintf(buf, AS_SIZE_BUF, "-");
  else
    snprintf(buf, AS_SIZE_BUF, "%.3f", (double)num / (double)den);
}

static bool print_rows(const rank_row *rows, size_t n, bool exact) {
  as_table t;
  as_table_init(&t, 11, "lrrrrrrrrll");
  const char *head[] = {"rank",     "peak_allocated", "peak_reserved", "peak_requested", "ratio", "allocated",
                        "reserved", "segments",       "ooms",          "peaks",          "file"};
  as_table_row(&t, head);
  for (size_t i = 0; i < n; i++) {
    const rank_row *r = &rows[i];
    char pa[AS_SIZE_BUF], pr[AS_SIZE_BUF], pq[AS_SIZE_BUF], ratio[AS_SIZE_BUF], ca[AS_SIZE_BUF], cr[AS_SIZE_BUF],
        segs[24], ooms[24];
    ratio_text(ratio, r->peak[P_RESERVED], r->peak[P_REQUESTED]);
    snprintf(segs, sizeof segs, "%zu", r->segments);
    snprintf(ooms, sizeof ooms, "%zu", r->ooms);
    const char *row[] = {r->name,
                         as_fmt_size(pa, r->peak[P_ALLOC], exact),
                         as_fmt_size(pr, r->peak[P_RESERVED], exact),
                         as_fmt_size(pq, r->peak[P_REQUESTED], exact),
                         ratio,
                         as_fmt_size(ca, r->cur[P_ALLOC], exact),
                         as_fmt_size(cr, r->cur[P_RESERVED], exact),
                         segs,
                         ooms,
                         r->from_trace ? "trace" : "current",
                         strcmp(r->path, "-") == 0 ? "<stdin>" : r->path};
    as_table_row(&t, row);
  }
  bool ok = as_table_print(&t, 2);
  as_table_free(&t);
  return ok;
}

/* The first row with the smallest and the largest value of peak p. */
static void extremes(const rank_row *rows, size_t n, int p, size_t *lo, size_t *hi) {
  *lo = *hi = 0;
  for (size_t i = 1; i < n; i++) {
    if (rows[i].peak[p] < rows[*lo].peak[p])
      *lo = i;
    if (rows[i].peak[p] > rows[*hi].peak[p])
      *hi = i;
  }
}

static int cmp_u64(const void *pa, const void *pb) {
  uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
  return a < b ? -1 : a > b ? 1 : 0;
}

/* The median of peak_reserved; false on host OOM. */
static bool median_reserved(const rank_row *rows, size_t n, double *out) {
  uint64_t *v = malloc(n * sizeof *v);
  if (v == NULL)
    return false;
  for (size_t i = 0; i < n; i++)
    v[i] = rows[i].peak[P_RESERVED];
  qsort(v, n, sizeof *v, cmp_u64);
  *out = n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2.0;
  free(v);
  return true;
}

static bool print_skew(const rank_row *rows, size_t n, bool exact) {
  printf("\nskew over %zu ranks:\n", n);
  as_table t;
  as_table_init(&t, 7, "lrlrlrr");
  const char *head[] = {"", "min", "rank", "max", "rank", "max-min", "max/min"};
  as_table_row(&t, head);
  for (int p = 0; p < 3; p++) {
    size_t lo, hi;
    extremes(rows, n, p, &lo, &hi);
    char mn[AS_SIZE_BUF], mx[AS_SIZE_BUF], d[AS_SIZE_BUF], ratio[AS_SIZE_BUF];
    ratio_text(ratio, rows[hi].peak[p], rows[lo].peak[p]);
    const char *row[] = {peak_names[p],
                         as_fmt_size(mn, rows[lo].peak[p], exact),
                         rows[lo].name,
                         as_fmt_size(mx, rows[hi].peak[p], exact),
                         rows[hi].name,
                         as_fmt_size(d, rows[hi].peak[p] - rows[lo].peak[p], exact),
                         ratio};
    as_table_row(&t, row);
  }
  bool ok = as_table_print(&t, 2);
  as_table_free(&t);
  double median;
  if (!ok || !median_reserved(rows, n, &median))
    return false;
  size_t lo, hi;
  extremes(rows, n, P_RESERVED, &lo, &hi);
  char pr[AS_SIZE_BUF], med[AS_SIZE_BUF];
  as_fmt_size(pr, rows[hi].peak[P_RESERVED], exact);
  /* The median of integers is an integer or half of one: the half is dropped in the text. */
  as_fmt_size(med, (uint64_t)median, exact);
  printf("worst rank: %s (%s): peak reserved %s", rows[hi].name, rows[hi].path, pr);
  if (median > 0)
    printf(", %+.1f%% over the median %s\n", ((double)rows[hi].peak[P_RESERVED] / median - 1.0) * 100.0, med);
  else
    printf(", the median is %s\n", med);
  return true;
}

/* A rank in JSON: its number, or the file's name where it has none. */
static void put_rank(cl_json *j, const char *key, const rank_row *r) {
  cl_json_key(j, key);
  if (r->numbered)
    cl_json_uint(j, r->rank);
  else
    cl_json_string(j, r->name);
}

static void put_uint(cl_json *j, const char *key, uint64_t v) {
  cl_json_key(j, key);
  cl_json_uint(j, v);
}

static void put_file(cl_json *j, const rank_row *r) {
  cl_json_key(j, "file");
  cl_json_string(j, strcmp(r->path, "-") == 0 ? "<stdin>" : r->path);
}

static void put_row(cl_json *j, const rank_row *r) {
  cl_json_begin_object(j);
  put_rank(j, "rank", r);
  put_file(j, r);
  cl_json_key(j, "peaks");
  cl_json_string(j, r->from_trace ? "trace" : "current");
  for (int p = 0; p < 3; p++)
    put_uint(j, peak_names[p], r->peak[p]);
  put_uint(j, "allocated", r->cur[P_ALLOC]);
  put_uint(j, "reserved", r->cur[P_RESERVED]);
  put_uint(j, "segments", r->segments);
  put_uint(j, "ooms", r->ooms);
  cl_json_end_object(j);
}

/* The skew and the worst rank, members of the object j is in; false on host OOM. */
static bool put_skew(cl_json *j, const rank_row *rows, size_t n) {
  double median;
  if (!median_reserved(rows, n, &median))
    return false;
  cl_json_key(j, "skew");
  cl_json_begin_object(j);
  for (int p = 0; p < 3; p++) {
    size_t lo, hi;
    extremes(rows, n, p, &lo, &hi);
    cl_json_key(j, peak_names[p]);
    cl_json_begin_object(j);
    put_uint(j, "min", rows[lo].peak[p]);
    put_rank(j, "min_rank", &rows[lo]);
    put_uint(j, "max", rows[hi].peak[p]);
    put_rank(j, "max_rank", &rows[hi]);
    cl_json_end_object(j);
  }
  cl_json_end_object(j);
  size_t lo, hi;
  extremes(rows, n, P_RESERVED, &lo, &hi);
  cl_json_key(j, "worst");
  cl_json_begin_object(j);
  put_rank(j, "rank", &rows[hi]);
  put_file(j, &rows[hi]);
  put_uint(j, "peak_reserved", rows[hi].peak[P_RESERVED]);
  cl_json_key(j, "median_peak_reserved"); /* an integer or half of one: written as such */
  cl_json_double(j, median);
  cl_json_end_object(j);
  return true;
}

/* --json: the rows, the skew and the worst rank as one object on one line (bytes exact); false on host
 * OOM. */
static bool print_json(const rank_row *rows, size_t n) {
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_object(&j);
  cl_json_key(&j, "ranks");
  cl_json_begin_array(&j);
  for (size_t i = 0; i < n; i++)
    put_row(&j, &rows[i]);
  cl_json_end_array(&j);
  if (n > 0 && !put_skew(&j, rows, n)) {
    cl_json_discard(&j);
    return false;
  }
  cl_json_end_object(&j);
  char *text = cl_json_finish(&j);
  if (text != NULL)
    puts(text);
  free(text);
  return text != NULL;
}

int as_cmd_summary(int argc, char **argv) {
  static const struct option longopts[] = {
      {"bytes", no_argument, NULL, 'b'}, {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
  bool exact = false, json = false;
  for (int c; (c = as_getopt("summary", argc, argv, ":h", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("summary", AS_EXIT_OK);
    case 'b':
      exact = true;
      break;
    case 'j':
      json = true;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  if (argc == optind)
    return as_usage_error("summary", "no FILE given");
  return as_summarize_ranks("summary", argv + optind, (size_t)(argc - optind), exact, json);
}

int as_summarize_ranks(const char *cmd, char **files, size_t n_files, bool exact, bool json) {
  size_t n_stdin = 0;
  for (size_t i = 0; i < n_files; i++)
    n_stdin += strcmp(files[i], "-") == 0;
  if (n_stdin > 1)
    return as_usage_error(cmd, "standard input ('-') can be only one of the files");
  size_t n = 0;
  rank_row *rows = calloc(n_files, sizeof *rows);
  if (rows == NULL)
    return as_failure(cmd, "out of host memory");
  int status = AS_EXIT_OK;
  for (size_t i = 0; i < n_files; i++) {
    rank_row *r = &rows[n];
    *r = (rank_row){.path = files[i], .order = i};
    rank_of(r);
    if (load_row(r) == AS_EXIT_OK)
      n++;
    else
      status = AS_EXIT_FAILURE; /* the rest are still summarised */
  }
  qsort(rows, n, sizeof *rows, cmp_rows);
  bool ok = true;
  if (json) {
    ok = print_json(rows, n);
  } else if (n > 0) {
    printf("%zu of %zu file%s read\n", n, n_files, n_files == 1 ? "" : "s");
    ok = print_rows(rows, n, exact) && (n < 2 || print_skew(rows, n, exact));
  }
  if (!ok)
    status = as_failure(cmd, "out of host memory");
  free(rows);
  return as_finish_stdout(cmd, status);
}
