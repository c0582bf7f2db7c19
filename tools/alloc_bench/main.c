/* alloc_bench: the command line, the workloads and the timed passes. */
#include "bench.h"
#include "json_writer.h" /* src/common/: its string escaper */

#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifndef ALLOC_BENCH_TRACE_DIR
#define ALLOC_BENCH_TRACE_DIR ""
#endif

static const char help[] =
    "usage: alloc_bench [--workload W,...|all] [--allocators A,...|all] [--threads N] [--streams N]\n"
    "                   [--repeat R] [--ops N] [--graph-ops N] [--replays K] [--trace FILE]...\n"
    "                   [--trace-dir DIR] [--pin CPU] [--seed S] [--conf STRING] [--csv FILE] [--json FILE]\n"
    "                   [--svg FILE] [-v]\n"
    "       alloc_bench svg IN.csv OUT.svg\n"
    "\n"
    "Benchmarks device-memory allocators on the same pre-generated operation sequences, side by side.\n"
    "Every (workload, allocator) row gets a fresh allocator, one untimed warm-up pass, then R timed\n"
    "passes; device work is synchronized before a pass's clock (CLOCK_MONOTONIC) is read. Afterwards\n"
    "everything is freed and cachalot's rows run cachalot_check() and verify that nothing is allocated.\n"
    "\n"
    "Workloads (--workload, comma-separated; default all):\n"
    "  pair     alloc + free of one size, N times, for 256 B, 4 KiB, 512 KiB, 2 MiB and 32 MiB\n"
    "           (rows pair-256B ... pair-32MiB); timed PER PAIR (ns/pair), not per call\n"
    "  random   RMM-style: N steps, each allocates (73 %, while fewer than the cap are live) a\n"
    "           log-uniform size, or frees a random live allocation; then frees the rest. Rows\n"
    "           random-1MiB (256 B-1 MiB, at most 1000 live) and random-64MiB (256 B-64 MiB, at most\n"
    "           500 live: ~2.7 GB live on average, 32 GiB at the very most); ns per alloc or free call\n"
    "  mt       the random-1MiB sequence in 1, 2, 4, 8 ... threads (up to --threads; each its own\n"
    "           seed, its own cap of 1000 live and --streams streams of its own); threads start\n"
    "           together; ns/op = wall time from start to the last thread's end / all threads' ops\n"
    "  replay   the alloc / free_requested entries of PyTorch memory snapshot traces (--trace FILE,\n"
    "           repeatable; default the *.json.gz and *.json of --trace-dir); rows replay-NAME\n"
    "  graph    a random-1MiB sequence of --graph-ops calls (at most 100 live) captured into a CUDA\n"
    "           graph (cachalot: cachalot_graph on a pool shared by the row's captures;\n"
    "           cudaMallocAsync: stream capture of cudaMallocFromPoolAsync / cudaFreeAsync), then\n"
    "           launched --replays times; rows graph-capture (ns per captured call) and graph-replay\n"
    "           (ns per launch); cudaMalloc cannot be captured (n/a)\n"
    "\n"
    "Allocators (--allocators, comma-separated; default all; those that cannot run here are skipped):\n"
    "  cachalot         cachalot on the CUDA backend (default config)\n"
    "  cudaMallocAsync  a cudaMemPoolCreate pool of its own, release threshold UINT64_MAX\n"
    "  cudaMalloc       plain cudaMalloc / cudaFree\n"
    "  cachalot-sim     cachalot on the simulated device (events complete at once; no GPU needed)\n"
    "\n"
    "Columns: median [min-max] over the timed passes; peak reserved and peak allocated bytes (cachalot:\n"
    "memory_stats reserved_bytes / allocated_bytes peaks; cudaMallocAsync: the pool's ReservedMemHigh /\n"
    "UsedMemHigh, the graph memory's in the graph rows; cudaMalloc: the requested bytes); peak requested\n"
    "(the most bytes the sequence has live; mt: the sum of the threads' peaks); res/req, their ratio;\n"
    "device allocs: cudaMalloc-like calls over the warm-up and the timed passes together (cachalot:\n"
    "num_device_alloc; cudaMalloc: every allocation; cudaMallocAsync: unknown, '-').\n"
    "\n"
    "options:\n"
    "  -w, --workload LIST     workloads (above), or all\n"
    "  -a, --allocators LIST   allocators (above), or all\n"
    "  -t, --threads N         the most threads of the mt workload (default 8)\n"
    "  -s, --streams N         streams per thread in the mt workload (default 1)\n"
    "  -r, --repeat R          timed passes per row (default 5)\n"
    "  -n, --ops N             pairs per pass (pair), steps per pass (random) and per thread (mt)\n"
    "                          (default 20000)\n"
    "      --graph-ops N       allocator calls captured per graph (default 1000)\n"
    "      --replays K         graph launches per timed pass (default 100)\n"
    "      --trace FILE        a snapshot to replay (repeatable; replaces the default traces)\n"
    "      --trace-dir DIR     where the default traces are (default ../shared/traces, else the source\n"
    "                          tree's sibling shared/traces)\n"
    "      --seed S            the seed of the random sequences (default 1)\n"
    "      --pin CPU           run on CPU number CPU, and mt's thread i on the i-th CPU after it that the\n"
    "                          process may use: on a shared host, timings move far less between runs\n"
    "      --conf STRING       CACHALOT_ALLOC_CONF for the cachalot rows (default: none, the defaults);\n"
    "                          checked before anything runs\n"
    "      --csv FILE          also write the results as CSV\n"
    "      --json FILE         also write the results as JSON\n"
    "      --svg FILE          also draw the medians as an SVG bar chart (as `alloc_bench svg` does)\n"
    "                          (a regular FILE is replaced atomically; a device or a FIFO is written\n"
    "                          through, and a symbolic link stays a link)\n"
    "  -v, --verbose           progress on standard error\n"
    "  -h, --help              this text\n"
    "`alloc_bench svg IN.csv OUT.svg` draws the chart of a CSV written by --csv: one group of bars per\n"
    "row name, one bar per allocator, log scale, whiskers from min to max.\n"
    "\n"
    "Exit status: 0 done (skipped and n/a rows included), 1 a row failed or a check found a problem, or\n"
    "a file could not be read or written, 2 usage error (an empty list, a bad --conf string too).\n";

enum { WL_PAIR, WL_RANDOM, WL_MT, WL_REPLAY, WL_GRAPH, WL_COUNT };
static const char *const wl_names[WL_COUNT] = {"pair", "random", "mt", "replay", "graph"};

static const ab_allocator *const all_allocators[] = {&ab_cachalot, &ab_cuda_async, &ab_cuda_malloc, &ab_cachalot_sim};
enum { N_ALLOCATORS = sizeof all_allocators / sizeof all_allocators[0] };

typedef struct {
  bool workload[WL_COUNT];
  const ab_allocator *alloc[N_ALLOCATORS];
  char skip[N_ALLOCATORS][AB_ERR_LEN]; /* why alloc[i] cannot run ("" when it can) */
  int n_alloc;
  int threads, streams, repeat, replays;
  size_t ops, graph_ops;
  uint64_t seed;
  char **traces;
  size_t n_traces;
  bool traces_given, verbose;
  const char *trace_dir; /* --trace-dir; NULL: the default places */
  int pin; /* the first CPU to run on, -1 when not pinned */
  const char *csv, *json, *svg;
} config;

/* Pins the calling thread to CPU c->pin, or for k > 0 to the k-th CPU after it among those the process
 * may use (wrapping around). False when c->pin is not one of those, or the system refuses. */
static bool pin_thread(const config *c, int k) {
  static int cpus[CPU_SETSIZE], n_cpus = -1, first = -1;
  if (c->pin < 0)
    return true;
  if (n_cpus < 0) { /* read once, by the main thread, before any worker starts */
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
      return false;
    n_cpus = 0;
    for (int i = 0; i < CPU_SETSIZE; i++)
      if (CPU_ISSET(i, &allowed)) {
        if (i == c->pin)
          first = n_cpus;
        cpus[n_cpus++] = i;
      }
  }
  if (first < 0) {
    errno = EINVAL;
    return false;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[(first + k) % n_cpus], &one);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof one, &one);
  errno = rc;
  return rc == 0;
}

static bool failed; /* a row failed or a check found a problem: exit status 1 */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("alloc_bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs(" (alloc_bench --help for usage)\n", stderr);
  va_end(ap);
  return AB_EXIT_USAGE;
}

static bool parse_count(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
  if (text[0] < '0' || text[0] > '9')
    return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return false;
  *out = v;
  return true;
}

/* Splits a comma-separated list; calls pick(name) for each; "all" alone picks everything. */
static int parse_workloads(const char *list, config *c) {
  memset(c->workload, 0, sizeof c->workload);
  if (strcmp(list, "all") == 0) {
    for (int i = 0; i < WL_COUNT; i++)
      c->workload[i] = true;
    return 0;
  }
  char *copy = strdup(list);
  if (copy == NULL)
    return usage_error("out of host memory");
  int rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok != NULL && rc == 0; tok = strtok_r(NULL, ",", &save)) {
    int i = 0;
    while (i < WL_COUNT && strcmp(tok, wl_names[i]) != 0)
      i++;
    if (i == WL_COUNT)
      rc = usage_error("unknown workload '%s' (pair, random, mt, replay, graph or all)", tok);
    else
      c->workload[i] = true;
  }
  free(copy);
  /* "" and ",," name nothing: running nothing and exiting 0 would pass for a benchmark that ran. */
  bool any = false;
  for (int i = 0; i < WL_COUNT; i++)
    any |= c->workload[i];
  if (rc == 0 && !any)
    rc = usage_error("--workload names no workload (pair, random, mt, replay, graph or all)");
  return rc;
}

static int parse_allocators(const char *list, config *c) {
  c->n_alloc = 0;
  if (strcmp(list, "all") == 0) {
    for (int i = 0; i < N_ALLOCATORS; i++)
      c->alloc[c->n_alloc++] = all_allocators[i];
    return 0;
  }
  char *copy = strdup(list);
  if (copy == NULL)
    return usage_error("out of host memory");
  int rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok != NULL && rc == 0; tok = strtok_r(NULL, ",", &save)) {
    int i = 0;
    while (i < N_ALLOCATORS && strcmp(tok, all_allocators[i]->name) != 0)
      i++;
    if (i == N_ALLOCATORS) {
      rc = usage_error("unknown allocator '%s' (cachalot, cudaMallocAsync, cudaMalloc, cachalot-sim or all)", tok);
      break;
    }
    bool dup = false;
    for (int k = 0; k < c->n_alloc; k++)
      dup |= c->alloc[k] == all_allocators[i];
    if (!dup)
      c->alloc[c->n_alloc++] = all_allocators[i];
  }
  free(copy);
  if (rc == 0 && c->n_alloc == 0)
    rc = usage_error("--allocators names no allocator");
  return rc;
}

/* ---- rows ---- */

static ab_row *new_row(ab_results *res, const char *workload, const ab_allocator *vt, const char *unit,
                       uint64_t units, const config *c) {
  ab_row *r = ab_results_add(res);
  if (r == NULL) {
    fprintf(stderr, "alloc_bench: out of host memory\n");
    exit(AB_EXIT_FAILURE);
  }
  snprintf(r->workload, sizeof r->workload, "%s", workload);
  snprintf(r->allocator, sizeof r->allocator, "%s", vt->name);
  snprintf(r->unit, sizeof r->unit, "%s", unit);
  r->units = units;
  r->repeats = c->repeat;
  r->threads = 1;
  r->streams = 1;
  r->peak_reserved = r->peak_allocated = r->peak_requested = r->device_allocs = -1;
  return r;
}

static void row_error(ab_row *r, const char *what, const char *err) {
  r->status = AB_ROW_ERROR;
  snprintf(r->note, sizeof r->note, "%.100s%s%.*s", what, what[0] ? ": " : "", AB_ERR_LEN, err);
  fprintf(stderr, "alloc_bench: FAILED: %s on %s: %s\n", r->workload, r->allocator, r->note);
  failed = true;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void set_times(ab_row *r, double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  r->min_ns = t[0];
  r->max_ns = t[n - 1];
  r->median_ns = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* After a row's passes: statistics, the allocator's self-check, and the instance closed. */
static void finish(ab_alloc *a, bool graph, ab_row **rows, int n_rows) {
  char err[AB_ERR_LEN];
  ab_stats st = {-1, -1, -1};
  if (a->vt->stats(a, graph, &st, err) != 0) {
    for (int i = 0; i < n_rows; i++)
      row_error(rows[i], "statistics", err);
  } else if (a->vt->check != NULL && a->vt->check(a, err) != 0) {
    for (int i = 0; i < n_rows; i++)
      row_error(rows[i], "CHECK FAILED after the workload", err);
  }
  for (int i = 0; i < n_rows; i++) {
    ab_row *r = rows[i];
    r->peak_reserved = st.peak_reserved >= 0 ? st.peak_reserved : r->peak_requested;
    r->peak_allocated = st.peak_allocated >= 0 ? st.peak_allocated : r->peak_requested;
    r->device_allocs = st.device_allocs;
  }
  a->vt->close(a);
}

/* Frees what ops[0..done) left live (after a failed pass), so the device is clean for the next rows. */
static void undo(ab_alloc *a, void *const *streams, const ab_seq *s, size_t done, void **slots) {
  ab_seq u;
  char err[AB_ERR_LEN];
  size_t d;
  if (ab_seq_undo(s, done, &u, err) == 0)
    (void)a->vt->run(a, streams, u.ops, u.n, slots, &d, err);
  ab_seq_free(&u);
}

static bool open_row(const config *c, int idx, const ab_allocator *vt, int n_streams, ab_row **rows, int n_rows,
                     ab_alloc **a) {
  char err[AB_ERR_LEN];
  *a = NULL;
  if (c->skip[idx][0] != '\0') {
    for (int i = 0; i < n_rows; i++) {
      rows[i]->status = AB_ROW_SKIPPED;
      snprintf(rows[i]->note, sizeof rows[i]->note, "%s", c->skip[idx]);
    }
    return false;
  }
  if (c->verbose)
    fprintf(stderr, "alloc_bench: %s on %s\n", rows[0]->workload, vt->name);
  if (vt->open(a, n_streams, err) != 0) {
    for (int i = 0; i < n_rows; i++)
      row_error(rows[i], "opening the allocator", err);
    return false;
  }
  return true;
}

/* One thread, one stream: the pair, random and replay workloads. */
static void run_single(ab_results *res, const config *c, int idx, const char *name, const char *unit,
                       const ab_seq *s, uint64_t units, const char *note) {
  const ab_allocator *vt = c->alloc[idx];
  ab_row *r = new_row(res, name, vt, unit, units, c);
  r->peak_requested = (int64_t)s->peak_requested;
  if (note != NULL)
    snprintf(r->note, sizeof r->note, "%s", note);
  ab_alloc *a;
  if (!open_row(c, idx, vt, 1, &r, 1, &a))
    return;
  char err[AB_ERR_LEN];
  void **slots = calloc(s->n_slots ? s->n_slots : 1, sizeof *slots);
  double *t = calloc((size_t)c->repeat, sizeof *t);
  if (slots == NULL || t == NULL) {
    row_error(r, "", "out of host memory");
    vt->close(a);
    free(slots);
    free(t);
    return;
  }
  for (int pass = 0; pass <= c->repeat; pass++) {
    size_t done = 0;
    if (vt->sync(a, a->streams, 1, err) != 0) {
      row_error(r, "", err);
      break;
    }
    uint64_t t0 = ab_now_ns();
    int rc = vt->run(a, a->streams, s->ops, s->n, slots, &done, err);
    if (rc == 0)
      rc = vt->sync(a, a->streams, 1, err);
    uint64_t t1 = ab_now_ns();
    if (rc != 0) {
      row_error(r, pass == 0 ? "warm-up pass" : "timed pass", err);
      undo(a, a->streams, s, done, slots);
      break;
    }
    if (pass > 0)
      t[pass - 1] = (double)(t1 - t0) / (double)units;
  }
  if (r->status == AB_ROW_OK)
    set_times(r, t, c->repeat);
  if (r->status == AB_ROW_OK)
    finish(a, false, &r, 1);
  else
    vt->close(a);
  free(slots);
  free(t);
}

/* ---- mt: threads released together by a barrier each pass ---- */

typedef struct {
  const ab_allocator *vt;
  const config *c;
  int index;
  ab_alloc *a;
  const ab_seq *seq;
  void **slots;
  void *const *streams; /* this thread's */
  int n_streams, passes;
  pthread_barrier_t *start;
  uint64_t *t_start, *t_end; /* per pass */
  bool failed;
  char err[AB_ERR_LEN];
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  (void)pin_thread(w->c, w->index); /* the main thread reported a refusal already */
  for (int pass = 0; pass < w->passes; pass++) {
    pthread_barrier_wait(w->start);
    if (w->failed)
      continue; /* keeps meeting the others at the barrier */
    size_t done = 0;
    uint64_t t0 = ab_now_ns();
    int rc = w->vt->run(w->a, w->streams, w->seq->ops, w->seq->n, w->slots, &done, w->err);
    if (rc == 0)
      rc = w->vt->sync(w->a, w->streams, w->n_streams, w->err);
    uint64_t t1 = ab_now_ns();
    if (rc != 0) {
      w->failed = true;
      undo(w->a, w->streams, w->seq, done, w->slots);
    }
    w->t_start[pass] = t0;
    w->t_end[pass] = t1;
  }
  return NULL;
}

static void run_mt(ab_results *res, const config *c, int idx, int threads, const ab_seq *seqs) {
  const ab_allocator *vt = c->alloc[idx];
  char name[32];
  snprintf(name, sizeof name, "mt-%d", threads);
  uint64_t total = 0, requested = 0;
  for (int i = 0; i < threads; i++) {
    total += seqs[i].n;
    requested += seqs[i].peak_requested;
  }
  ab_row *r = new_row(res, name, vt, "ns/op", total, c);
  r->threads = threads;
  r->streams = c->streams;
  r->peak_requested = (int64_t)requested;
  ab_alloc *a;
  if (!open_row(c, idx, vt, threads * c->streams, &r, 1, &a))
    return;
  int passes = c->repeat + 1;
  worker *w = calloc((size_t)threads, sizeof *w);
  pthread_t *tid = calloc((size_t)threads, sizeof *tid);
  uint64_t *ts = calloc((size_t)(threads * passes) * 2, sizeof *ts);
  double *t = calloc((size_t)c->repeat, sizeof *t);
  pthread_barrier_t start;
  bool ok = w != NULL && tid != NULL && ts != NULL && t != NULL;
  for (int i = 0; ok && i < threads; i++) {
    w[i] = (worker){.vt = vt, .c = c, .index = i, .a = a, .seq = &seqs[i], .streams = a->streams + (size_t)i * (size_t)c->streams,
                    .n_streams = c->streams, .passes = passes, .start = &start,
                    .t_start = ts + (size_t)(2 * i * passes), .t_end = ts + (size_t)((2 * i + 1) * passes)};
    ok = (w[i].slots = calloc(seqs[i].n_slots ? seqs[i].n_slots : 1, sizeof(void *))) != NULL;
  }
  if (!ok) {
    row_error(r, "", "out of host memory");
  } else {
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    int started = 0;
    for (; started < threads; started++)
      if (pthread_create(&tid[started], NULL, worker_main, &w[started]) != 0)
        break;
    if (started < threads) {
      /* Cannot happen in practice; the started ones would wait at the barrier forever. */
      fprintf(stderr, "alloc_bench: cannot start %d threads\n", threads);
      exit(AB_EXIT_FAILURE);
    }
    for (int i = 0; i < threads; i++)
      pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < threads; i++)
      if (w[i].failed && r->status == AB_ROW_OK)
        row_error(r, "thread", w[i].err);
    for (int pass = 1; r->status == AB_ROW_OK && pass < passes; pass++) {
      uint64_t t0 = UINT64_MAX, t1 = 0;
      for (int i = 0; i < threads; i++) {
        t0 = w[i].t_start[pass] < t0 ? w[i].t_start[pass] : t0;
        t1 = w[i].t_end[pass] > t1 ? w[i].t_end[pass] : t1;
      }
      t[pass - 1] = (double)(t1 - t0) / (double)total;
    }
  }
  if (r->status == AB_ROW_OK) {
    set_times(r, t, c->repeat);
    finish(a, false, &r, 1);
  } else {
    vt->close(a);
  }
  for (int i = 0; w != NULL && i < threads; i++)
    free(w[i].slots);
  free(w);
  free(tid);
  free(ts);
  free(t);
}

/* ---- graph ---- */

static void run_graph(ab_results *res, const config *c, int idx, const ab_seq *s) {
  const ab_allocator *vt = c->alloc[idx];
  ab_row *rows[2] = {new_row(res, "graph-capture", vt, "ns/op", s->n, c), NULL};
  rows[1] = new_row(res, "graph-replay", vt, "ns/replay", (uint64_t)c->replays, c);
  rows[0] = &res->rows[res->n - 2]; /* the second add may have moved the array */
  for (int i = 0; i < 2; i++)
    rows[i]->peak_requested = (int64_t)s->peak_requested;
  if (c->skip[idx][0] == '\0' && vt->graph_capture == NULL) {
    for (int i = 0; i < 2; i++) {
      rows[i]->status = AB_ROW_NA;
      snprintf(rows[i]->note, sizeof rows[i]->note, "%s", vt->graph_na ? vt->graph_na : "cannot be captured");
      rows[i]->peak_requested = -1;
    }
    return;
  }
  ab_alloc *a;
  if (!open_row(c, idx, vt, 1, rows, 2, &a))
    return;
  char err[AB_ERR_LEN];
  void **slots = calloc(s->n_slots ? s->n_slots : 1, sizeof *slots);
  double *tc = calloc((size_t)c->repeat, sizeof *tc), *tr = calloc((size_t)c->repeat, sizeof *tr);
  bool ok = slots != NULL && tc != NULL && tr != NULL;
  if (!ok)
    for (int i = 0; i < 2; i++)
      row_error(rows[i], "", "out of host memory");
  for (int pass = 0; ok && pass <= c->repeat; pass++) {
    uint64_t capture_ns = 0;
    const char *what = "capture";
    int rc = vt->graph_capture(a, a->streams[0], s->ops, s->n, slots, &capture_ns, err);
    uint64_t t0 = 0, t1 = 0;
    if (rc == 0 && (rc = vt->sync(a, a->streams, 1, err)) == 0) {
      what = "replay";
      t0 = ab_now_ns();
      rc = vt->graph_replay(a, a->streams[0], c->replays, err);
      if (rc == 0)
        rc = vt->sync(a, a->streams, 1, err);
      t1 = ab_now_ns();
    }
    char err2[AB_ERR_LEN];
    if (vt->graph_reset(a, err2) != 0 && rc == 0) {
      what = "reset";
      memcpy(err, err2, sizeof err2);
      rc = -1;
    }
    if (rc != 0) {
      for (int i = 0; i < 2; i++)
        row_error(rows[i], what, err);
      ok = false;
      break;
    }
    if (pass > 0) {
      tc[pass - 1] = (double)capture_ns / (double)s->n;
      tr[pass - 1] = (double)(t1 - t0) / (double)c->replays;
    }
  }
  if (ok) {
    set_times(rows[0], tc, c->repeat);
    set_times(rows[1], tr, c->repeat);
    finish(a, true, rows, 2);
  } else {
    vt->close(a);
  }
  free(slots);
  free(tc);
  free(tr);
}

/* ---- the workloads ---- */

static void seq_or_die(int rc, const char *what, const char *err) {
  if (rc != 0) {
    fprintf(stderr, "alloc_bench: %s: %s\n", what, err);
    exit(AB_EXIT_FAILURE);
  }
}

static void workload_pair(ab_results *res, const config *c) {
  static const struct {
    uint64_t size;
    const char *name;
  } sizes[] = {{256, "pair-256B"}, {4 << 10, "pair-4KiB"}, {512 << 10, "pair-512KiB"}, {2 << 20, "pair-2MiB"},
               {32 << 20, "pair-32MiB"}};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    ab_seq s;
    char err[AB_ERR_LEN];
    seq_or_die(ab_seq_pair(&s, sizes[k].size, c->ops, err), sizes[k].name, err);
    for (int i = 0; i < c->n_alloc; i++)
      run_single(res, c, i, sizes[k].name, "ns/pair", &s, c->ops, NULL);
    ab_seq_free(&s);
  }
}

/* The random workloads' caps (README.md, "alloc_bench"): 1000 live of 256 B-1 MiB (~126 KB each on average);
 * 500 live of 256 B-64 MiB (~5.4 MB each on average: ~2.7 GB live, 32 GiB if all were 64 MiB, which fits
 * an 80 GB GPU with every allocator's slack). */
enum { CAP_1MIB = 1000, CAP_64MIB = 500, CAP_GRAPH = 100 };

static void workload_random(ab_results *res, const config *c) {
  static const struct {
    uint64_t max;
    uint32_t cap;
    const char *name;
  } kinds[] = {{1 << 20, CAP_1MIB, "random-1MiB"}, {64 << 20, CAP_64MIB, "random-64MiB"}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    ab_seq s;
    char err[AB_ERR_LEN];
    seq_or_die(ab_seq_random(&s, 256, kinds[k].max, c->ops, kinds[k].cap, 1, c->seed, err), kinds[k].name, err);
    for (int i = 0; i < c->n_alloc; i++)
      run_single(res, c, i, kinds[k].name, "ns/op", &s, s.n, NULL);
    ab_seq_free(&s);
  }
}

static void workload_mt(ab_results *res, const config *c) {
  ab_seq *seqs = calloc((size_t)c->threads, sizeof *seqs);
  if (seqs == NULL)
    seq_or_die(-1, "mt", "out of host memory");
  for (int i = 0; i < c->threads; i++) {
    char err[AB_ERR_LEN];
    seq_or_die(ab_seq_random(&seqs[i], 256, 1 << 20, c->ops, CAP_1MIB, (uint32_t)c->streams,
                             c->seed + 1000003u * (uint64_t)(i + 1), err),
               "mt", err);
  }
  for (int n = 1;; n = n * 2 > c->threads && n < c->threads ? c->threads : n * 2) {
    for (int i = 0; i < c->n_alloc; i++)
      run_mt(res, c, i, n, seqs);
    if (n >= c->threads)
      break;
  }
  for (int i = 0; i < c->threads; i++)
    ab_seq_free(&seqs[i]);
  free(seqs);
}

static void trace_name(const char *path, char *out, size_t len) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%s", base);
  static const char *const suffixes[] = {".gz", ".json", ".snapshot"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    size_t n = strlen(tmp), m = strlen(suffixes[i]);
    if (n > m && strcmp(tmp + n - m, suffixes[i]) == 0)
      tmp[n - m] = '\0';
  }
  snprintf(out, len, "replay-%s", tmp);
}

static const char source_traces[] = ALLOC_BENCH_TRACE_DIR;

static void workload_replay(ab_results *res, const config *c) {
  if (c->n_traces == 0) {
    for (int i = 0; i < c->n_alloc; i++) {
      ab_row *r = new_row(res, "replay", c->alloc[i], "ns/op", 0, c);
      r->status = AB_ROW_SKIPPED;
      snprintf(r->note, sizeof r->note, "no trace found in %s%s%s: give --trace FILE or --trace-dir DIR",
               c->trace_dir != NULL ? c->trace_dir : "../shared/traces",
               c->trace_dir == NULL && source_traces[0] != '\0' ? " or " : "",
               c->trace_dir == NULL ? source_traces : "");
    }
    return;
  }
  for (size_t k = 0; k < c->n_traces; k++) {
    char name[64];
    trace_name(c->traces[k], name, sizeof name);
#ifdef ALLOC_BENCH_HAVE_REPLAY
    ab_seq s;
    char err[AB_ERR_LEN], note[256];
    if (c->verbose)
      fprintf(stderr, "alloc_bench: reading %s\n", c->traces[k]);
    if (ab_seq_from_trace(&s, c->traces[k], note, sizeof note, err) != 0) {
      fprintf(stderr, "alloc_bench: FAILED: %s: %s\n", name, err);
      failed = true;
      for (int i = 0; i < c->n_alloc; i++) {
        ab_row *r = new_row(res, name, c->alloc[i], "ns/op", 0, c);
        r->status = c->skip[i][0] != '\0' ? AB_ROW_SKIPPED : AB_ROW_ERROR;
        snprintf(r->note, sizeof r->note, "%s%.*s", c->skip[i][0] ? "" : "reading the trace: ", AB_ERR_LEN,
                 c->skip[i][0] ? c->skip[i] : err);
      }
      continue;
    }
    for (int i = 0; i < c->n_alloc; i++)
      run_single(res, c, i, name, "ns/op", &s, s.n, note);
    ab_seq_free(&s);
#else
    for (int i = 0; i < c->n_alloc; i++) {
      ab_row *r = new_row(res, name, c->alloc[i], "ns/op", 0, c);
      r->status = AB_ROW_SKIPPED;
      snprintf(r->note, sizeof r->note, "replay unavailable: alloc_bench was built without cJSON and zlib");
    }
#endif
  }
}

static void workload_graph(ab_results *res, const config *c) {
  ab_seq s;
  char err[AB_ERR_LEN];
  seq_or_die(ab_seq_random(&s, 256, 1 << 20, c->graph_ops, CAP_GRAPH, 1, c->seed + 7, err), "graph", err);
  /* Rows in two blocks, graph-capture then graph-replay, each with every allocator. */
  ab_results tmp = {0};
  for (int i = 0; i < c->n_alloc; i++)
    run_graph(&tmp, c, i, &s);
  for (int pass = 0; pass < 2; pass++)
    for (size_t k = 0; k < tmp.n; k++)
      if ((strcmp(tmp.rows[k].workload, "graph-capture") == 0) == (pass == 0)) {
        ab_row *r = ab_results_add(res);
        if (r == NULL)
          seq_or_die(-1, "graph", "out of host memory");
        *r = tmp.rows[k];
      }
  ab_results_free(&tmp);
  ab_seq_free(&s);
}

/* ---- traces ---- */

static int add_trace(config *c, const char *path) {
  char **t = realloc(c->traces, (c->n_traces + 1) * sizeof *t);
  if (t == NULL)
    return -1;
  c->traces = t;
  if ((t[c->n_traces] = strdup(path)) == NULL)
    return -1;
  c->n_traces++;
  return 0;
}

/* The default traces: *.json.gz and *.json of --trace-dir, else of ../shared/traces (from the current
 * directory, else from the source tree's sibling folder). */
static void default_traces(config *c) {
  const char *dirs[] = {c->trace_dir != NULL ? c->trace_dir : "../shared/traces",
                        c->trace_dir != NULL ? "" : source_traces};
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0] && c->n_traces == 0; d++) {
    if (dirs[d][0] == '\0')
      continue;
    const char *pats[] = {"*.json.gz", "*.json"};
    for (size_t p = 0; p < 2; p++) {
      char pat[4096];
      snprintf(pat, sizeof pat, "%s/%s", dirs[d], pats[p]);
      glob_t g;
      if (glob(pat, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++)
          if (add_trace(c, g.gl_pathv[i]) != 0)
            seq_or_die(-1, "traces", "out of host memory");
      globfree(&g);
    }
  }
}

/* ---- output ---- */

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
         "\"threads\": %d, \"streams\": %d, \"seed\": %" PRIu64 ", \"workloads\": [",
         tmp, c->repeat, c->ops, c->graph_ops, c->replays, c->threads, c->streams, c->seed);
  bool first = true;
  for (int i = 0; i < WL_COUNT; i++)
    if (c->workload[i]) {
      append(buf, len, &k, "%s\"%s\"", first ? "" : ", ", wl_names[i]);
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

static int cmd_svg(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    fputs("usage: alloc_bench svg IN.csv OUT.svg\n"
          "Draws the medians of a CSV written by alloc_bench --csv as a grouped horizontal bar chart (one\n"
          "group per row name, one bar per allocator, log scale, whiskers from min to max).\n",
          stdout);
    return AB_EXIT_OK;
  }
  if (argc != 3)
    return usage_error("svg wants IN.csv and OUT.svg");
  ab_results res = {0};
  char err[AB_ERR_LEN];
  int rc = AB_EXIT_OK;
  if (ab_read_csv(argv[1], &res, err) != 0 || ab_write_svg(argv[2], &res, argv[1], err) != 0) {
    fprintf(stderr, "alloc_bench svg: %s\n", err);
    rc = AB_EXIT_FAILURE;
  }
  ab_results_free(&res);
  return rc;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "svg") == 0)
    return cmd_svg(argc - 1, argv + 1);

  config c = {.threads = 8, .streams = 1, .repeat = 5, .replays = 100, .ops = 20000, .graph_ops = 1000, .seed = 1,
              .pin = -1};
  parse_workloads("all", &c);
  parse_allocators("all", &c);
  enum {
    OPT_GRAPH_OPS = 256,
    OPT_REPLAYS,
    OPT_TRACE,
    OPT_TRACE_DIR,
    OPT_SEED,
    OPT_CSV,
    OPT_JSON,
    OPT_SVG,
    OPT_PIN,
    OPT_CONF
  };
  static const struct option longopts[] = {{"workload", required_argument, NULL, 'w'},
                                           {"workloads", required_argument, NULL, 'w'},
                                           {"allocators", required_argument, NULL, 'a'},
                                           {"allocator", required_argument, NULL, 'a'},
                                           {"threads", required_argument, NULL, 't'},
                                           {"streams", required_argument, NULL, 's'},
                                           {"repeat", required_argument, NULL, 'r'},
                                           {"ops", required_argument, NULL, 'n'},
                                           {"graph-ops", required_argument, NULL, OPT_GRAPH_OPS},
                                           {"replays", required_argument, NULL, OPT_REPLAYS},
                                           {"trace", required_argument, NULL, OPT_TRACE},
                                           {"trace-dir", required_argument, NULL, OPT_TRACE_DIR},
                                           {"seed", required_argument, NULL, OPT_SEED},
                                           {"pin", required_argument, NULL, OPT_PIN},
                                           {"conf", required_argument, NULL, OPT_CONF},
                                           {"csv", required_argument, NULL, OPT_CSV},
                                           {"json", required_argument, NULL, OPT_JSON},
                                           {"svg", required_argument, NULL, OPT_SVG},
                                           {"verbose", no_argument, NULL, 'v'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  opterr = 0;
  int rc = 0;
  uint64_t v;
  for (int o; rc == 0 && (o = getopt_long(argc, argv, ":w:a:t:s:r:n:vh", longopts, NULL)) != -1;) {
    switch (o) {
    case 'h':
      fputs(help, stdout);
      return fflush(stdout) == 0 && !ferror(stdout) ? AB_EXIT_OK : AB_EXIT_FAILURE;
    case 'w':
      rc = parse_workloads(optarg, &c);
      break;
    case 'a':
      rc = parse_allocators(optarg, &c);
      break;
    case 't':
      if (!parse_count(optarg, 1, 256, &v))
        rc = usage_error("--threads wants 1 to 256, not '%s'", optarg);
      c.threads = (int)v;
      break;
    case 's':
      if (!parse_count(optarg, 1, 64, &v))
        rc = usage_error("--streams wants 1 to 64, not '%s'", optarg);
      c.streams = (int)v;
      break;
    case 'r':
      if (!parse_count(optarg, 1, 1000, &v))
        rc = usage_error("--repeat wants 1 to 1000, not '%s'", optarg);
      c.repeat = (int)v;
      break;
    case 'n':
      if (!parse_count(optarg, 1, 100000000, &v))
        rc = usage_error("--ops wants 1 to 100000000, not '%s'", optarg);
      c.ops = (size_t)v;
      break;
    case OPT_GRAPH_OPS:
      if (!parse_count(optarg, 1, 1000000, &v))
        rc = usage_error("--graph-ops wants 1 to 1000000, not '%s'", optarg);
      c.graph_ops = (size_t)v;
      break;
    case OPT_REPLAYS:
      if (!parse_count(optarg, 1, 1000000, &v))
        rc = usage_error("--replays wants 1 to 1000000, not '%s'", optarg);
      c.replays = (int)v;
      break;
    case OPT_TRACE:
      if (add_trace(&c, optarg) != 0)
        rc = usage_error("out of host memory");
      c.traces_given = true;
      break;
    case OPT_TRACE_DIR:
      if (optarg[0] == '\0')
        rc = usage_error("--trace-dir wants a directory, not an empty string");
      c.trace_dir = optarg;
      break;
    case OPT_SEED:
      if (!parse_count(optarg, 0, UINT64_MAX, &v))
        rc = usage_error("--seed wants a non-negative integer, not '%s'", optarg);
      c.seed = v;
      break;
    case OPT_PIN:
      if (!parse_count(optarg, 0, CPU_SETSIZE - 1, &v))
        rc = usage_error("--pin wants a CPU number from 0 to %d, not '%s'", CPU_SETSIZE - 1, optarg);
      c.pin = (int)v;
      break;
    case OPT_CONF: {
      char why[AB_ERR_LEN];
      if (ab_cachalot_set_conf(optarg, why) != 0)
        rc = usage_error("--conf: %s", why);
      break;
    }
    case OPT_CSV:
      c.csv = optarg;
      break;
    case OPT_JSON:
      c.json = optarg;
      break;
    case OPT_SVG:
      c.svg = optarg;
      break;
    case 'v':
      c.verbose = true;
      break;
    case ':':
      rc = usage_error("%s needs a value", argv[optind - 1]);
      break;
    default:
      if (optopt != 0)
        rc = usage_error("unknown option '-%c'", optopt);
      else
        rc = usage_error("unknown option '%s'", argv[optind - 1]);
      break;
    }
  }
  if (rc == 0 && optind < argc)
    rc = usage_error("unexpected argument '%s'", argv[optind]);
  if (rc != 0)
    return rc;
  if (!c.traces_given && c.workload[WL_REPLAY])
    default_traces(&c);
  if (c.pin >= 0 && !pin_thread(&c, 0)) {
    fprintf(stderr, "alloc_bench: warning: cannot pin to CPU %d (%s); running unpinned\n", c.pin, strerror(errno));
    c.pin = -1;
  }

  /* Which allocators can run here. */
  for (int i = 0; i < c.n_alloc; i++)
    if (c.alloc[i]->probe(c.skip[i]) != 0 && c.skip[i][0] == '\0')
      snprintf(c.skip[i], sizeof c.skip[i], "cannot run here");
  char device[256] = "";
#ifdef ALLOC_BENCH_HAVE_CUDA
  for (int i = 0; i < c.n_alloc; i++)
    if (c.skip[i][0] == '\0' && c.alloc[i] != &ab_cachalot_sim) {
      ab_cuda_device_name(device, sizeof device);
      break;
    }
#endif

  ab_results res = {0};
  if (c.workload[WL_PAIR])
    workload_pair(&res, &c);
  if (c.workload[WL_RANDOM])
    workload_random(&res, &c);
  if (c.workload[WL_MT])
    workload_mt(&res, &c);
  if (c.workload[WL_REPLAY])
    workload_replay(&res, &c);
  if (c.workload[WL_GRAPH])
    workload_graph(&res, &c);

  printf("alloc_bench: %d timed passes per row after one warm-up; median [min-max] in ns per unit:\n"
         "ns/pair = per alloc+free PAIR; ns/op = per single alloc or free call (mt: wall time / all threads'\n"
         "calls); ns/replay = per graph launch. Device: %s.\n",
         c.repeat, device[0] ? device : "none used (simulated only)");
  if (c.pin >= 0)
    printf("Pinned: single-thread rows on CPU %d, mt's thread i on the i-th CPU after it that the process may use.\n",
           c.pin);
  for (int i = 0; i < c.n_alloc; i++)
    if (c.skip[i][0] != '\0')
      printf("skipped (left out of the table): %s: %s\n", c.alloc[i]->name, c.skip[i]);
  /* Rows skipped for another reason than their allocator (replay without a trace), even where the
   * allocator cannot run either: once per workload. */
  for (size_t k = 0; k < res.n; k++) {
    const ab_row *r = &res.rows[k];
    bool seen = false;
    for (size_t j = 0; j < k; j++)
      seen |= res.rows[j].status == AB_ROW_SKIPPED && strcmp(res.rows[j].workload, r->workload) == 0 &&
              strcmp(res.rows[j].note, r->note) == 0;
    if (r->status == AB_ROW_SKIPPED && !skipped_for_allocator(&c, r) && !seen)
      printf("skipped (left out of the table): %s: %s\n", r->workload, r->note);
  }
  putchar('\n');
  ab_print_table(stdout, &res, why_none_ran(&c, &res));

  char err[AB_ERR_LEN];
  if (c.csv != NULL && ab_write_csv(c.csv, &res, err) != 0) {
    fprintf(stderr, "alloc_bench: %s\n", err);
    failed = true;
  }
  if (c.json != NULL) {
    char cfg[8192];
    config_json(&c, cfg, sizeof cfg, device);
    if (ab_write_json(c.json, &res, cfg, err) != 0) {
      fprintf(stderr, "alloc_bench: %s\n", err);
      failed = true;
    }
  }
  if (c.svg != NULL && ab_write_svg(c.svg, &res, device[0] ? device : "simulated device", err) != 0) {
    fprintf(stderr, "alloc_bench: %s\n", err);
    failed = true;
  }
  ab_results_free(&res);
  for (size_t i = 0; i < c.n_traces; i++)
    free(c.traces[i]);
  free(c.traces);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "alloc_bench: cannot write standard output\n");
    failed = true;
  }
  return failed ? AB_EXIT_FAILURE : AB_EXIT_OK;
}
