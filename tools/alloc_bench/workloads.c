/* alloc_bench: the workloads: each one's sequences, and its rows run on every selected allocator (one
 * thread, several threads released together, or captured into a graph), timed pass by pass. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

bool ab_failed;

bool ab_pin_thread(const config *c, int k) {
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
  return r;
}

static void row_error(ab_row *r, const char *what, const char *err) {
  r->status = AB_ROW_ERROR;
  snprintf(r->note, sizeof r->note, "%.100s%s%.*s", what, what[0] ? ": " : "", AB_ERR_LEN, err);
  fprintf(stderr, "alloc_bench: FAILED: %s on %s: %s\n", r->workload, r->allocator, r->note);
  ab_failed = true;
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

typedef enum { KIND_DEVICE, KIND_GRAPH, KIND_HOST } row_kind;

/* After a row's passes: statistics, the allocator's self-check, and the instance closed. */
static void finish(ab_alloc *a, row_kind kind, ab_row **rows, int n_rows) {
  char err[AB_ERR_LEN];
  ab_stats st = {-1, -1, -1};
  int rc = kind == KIND_HOST ? a->vt->host_stats(a, &st, err) : a->vt->stats(a, kind == KIND_GRAPH, &st, err);
  if (rc != 0) {
    for (int i = 0; i < n_rows; i++)
      row_error(rows[i], "statistics", err);
  } else if (a->vt->check != NULL && a->vt->check(a, err) != 0) {
    for (int i = 0; i < n_rows; i++)
      row_error(rows[i], "CHECK FAILED after the workload", err);
  }
  for (int i = 0; i < n_rows; i++) {
    ab_row *r = rows[i];
    r->peak_reserved = st.peak_reserved == AB_PEAK_REQUESTED ? r->peak_requested : st.peak_reserved;
    r->peak_allocated = st.peak_allocated == AB_PEAK_REQUESTED ? r->peak_requested : st.peak_allocated;
    r->device_allocs = st.device_allocs;
  }
  a->vt->close(a);
}

/* Frees what ops[0..done) left live (after a failed pass), so the device is clean for the next rows;
 * streams NULL: the host workload's pinned memory. */
static void undo(ab_alloc *a, void *const *streams, const ab_seq *s, size_t done, void **slots) {
  ab_seq u;
  char err[AB_ERR_LEN];
  size_t d;
  uint64_t ns;
  if (ab_seq_undo(s, done, &u, err) == 0 && u.n > 0) {
    if (streams != NULL)
      (void)a->vt->run(a, streams, u.ops, u.n, slots, &d, err);
    else
      (void)a->vt->host_run(a, u.ops, u.n, slots, &d, &ns, err);
  }
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

/* How a one-thread row runs: its streams (the sequence's, stream 0 the one synchronized), whether its
 * frees record (run_rec), history off (0), on (1) or with stacks (2), and whether the reserved peak of
 * its first pass is kept apart (a replay: one replay's figure beside the steady state's). */
typedef struct {
  int n_streams;
  bool rec;
  int history;
  bool first_pass;
} single_how;
static const single_how PLAIN = {1, false, 0, false};

/* One thread: the pair, cross, history, streams, random and replay workloads. */
static void run_single_how(ab_results *res, const config *c, int idx, const char *name, const char *unit,
                           const ab_seq *s, uint64_t units, const char *note, single_how how) {
  const ab_allocator *vt = c->alloc[idx];
  ab_row *r = new_row(res, name, vt, unit, units, c);
  r->peak_requested = (int64_t)s->peak_requested;
  r->streams = how.n_streams;
  if (note != NULL)
    snprintf(r->note, sizeof r->note, "%s", note);
  const char *na = how.rec && !vt->run_rec ? "cannot mark a block used on another stream"
                   : how.history && !vt->history ? (vt->history_na ? vt->history_na : "keeps no history")
                                                 : NULL;
  if (na != NULL && c->skip[idx][0] == '\0') {
    r->status = AB_ROW_NA;
    snprintf(r->note, sizeof r->note, "%s", na);
    return;
  }
  ab_alloc *a;
  if (!open_row(c, idx, vt, how.n_streams, &r, 1, &a))
    return;
  if (r->note[0] == '\0')
    snprintf(r->note, sizeof r->note, "%s", a->note);
  char err[AB_ERR_LEN];
  if (how.history && vt->history(a, true, how.history == 2, err) != 0) {
    row_error(r, "turning history on", err);
    vt->close(a);
    return;
  }
  int (*const run)(ab_alloc *, void *const *, const ab_op *, size_t, void **, size_t *, char *) =
      how.rec ? vt->run_rec : vt->run;
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
    a->pass_ns = 0;
    uint64_t t0 = ab_now_ns();
    int rc = run(a, a->streams, s->ops, s->n, slots, &done, err);
    if (rc == 0)
      rc = vt->sync(a, a->streams, 1, err);
    uint64_t t1 = ab_now_ns();
    if (a->pass_ns != 0)
      t1 = t0 + a->pass_ns;
    if (rc != 0) {
      row_error(r, pass == 0 ? "warm-up pass" : "timed pass", err);
      undo(a, a->streams, s, done, slots);
      break;
    }
    if (pass > 0)
      t[pass - 1] = (double)(t1 - t0) / (double)units;
    ab_stats first = {-1, -1, -1};
    if (pass == 0 && how.first_pass && vt->stats(a, false, &first, err) == 0 && first.peak_reserved >= 0)
      r->first_reserved = first.peak_reserved;
  }
  if (r->status == AB_ROW_OK && how.history && vt->history(a, false, false, err) != 0)
    row_error(r, "turning history off", err);
  if (r->status == AB_ROW_OK)
    set_times(r, t, c->repeat);
  if (r->status == AB_ROW_OK)
    finish(a, KIND_DEVICE, &r, 1);
  else
    vt->close(a);
  free(slots);
  free(t);
}

static void run_single(ab_results *res, const config *c, int idx, const char *name, const char *unit,
                       const ab_seq *s, uint64_t units, const char *note) {
  run_single_how(res, c, idx, name, unit, s, units, note, PLAIN);
}

/* ---- host: pinned host memory, one thread; the allocator times its loop itself ---- */

static void run_host(ab_results *res, const config *c, int idx, const char *name, const ab_seq *s) {
  const ab_allocator *vt = c->alloc[idx];
  ab_row *r = new_row(res, name, vt, "ns/pair", s->n_allocs, c);
  r->peak_requested = (int64_t)s->peak_requested;
  ab_alloc *a;
  if (!open_row(c, idx, vt, 1, &r, 1, &a))
    return;
  snprintf(r->note, sizeof r->note, "%s", a->note);
  char err[AB_ERR_LEN];
  void **slots = calloc(s->n_slots ? s->n_slots : 1, sizeof *slots);
  double *t = calloc((size_t)c->repeat, sizeof *t);
  if (slots == NULL || t == NULL)
    row_error(r, "", "out of host memory");
  for (int pass = 0; r->status == AB_ROW_OK && pass <= c->repeat; pass++) {
    size_t done = 0;
    uint64_t ns = 0;
    if (vt->host_run(a, s->ops, s->n, slots, &done, &ns, err) != 0) {
      row_error(r, pass == 0 ? "warm-up pass" : "timed pass", err);
      undo(a, NULL, s, done, slots);
    } else if (pass > 0) {
      t[pass - 1] = (double)ns / (double)s->n_allocs;
    }
  }
  if (r->status == AB_ROW_OK) {
    set_times(r, t, c->repeat);
    finish(a, KIND_HOST, &r, 1);
  } else {
    vt->close(a);
  }
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
  (void)ab_pin_thread(w->c, w->index); /* the main thread reported a refusal already */
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
  if (vt->mt_na != NULL && c->skip[idx][0] == '\0') {
    r->status = AB_ROW_NA;
    snprintf(r->note, sizeof r->note, "%s", vt->mt_na);
    return;
  }
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
    finish(a, KIND_DEVICE, &r, 1);
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
    finish(a, KIND_GRAPH, rows, 2);
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

/* Side-stream frees (docs/benchmarks.md): 4 KiB pairs on stream 0, every N-th block used on stream 1
 * (record_stream; cudaMallocAsync frees it on stream 1) before its free; rows cross-4 and cross-64. */
static void workload_cross(ab_results *res, const config *c) {
  static const struct {
    uint32_t every;
    const char *name;
  } kinds[] = {{4, "cross-4"}, {64, "cross-64"}};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    ab_seq s;
    char err[AB_ERR_LEN];
    seq_or_die(ab_seq_cross(&s, 4 << 10, c->ops, kinds[k].every, err), kinds[k].name, err);
    for (int i = 0; i < c->n_alloc; i++)
      run_single_how(res, c, i, kinds[k].name, "ns/pair", &s, c->ops, NULL, (single_how){2, true, 0, false});
    ab_seq_free(&s);
  }
}

/* History recorded (without and with the call stacks of each allocation): the 4 KiB pairs. */
static void workload_history(ab_results *res, const config *c) {
  ab_seq s;
  char err[AB_ERR_LEN];
  seq_or_die(ab_seq_pair(&s, 4 << 10, c->ops, err), "history", err);
  for (int h = 1; h <= 2; h++)
    for (int i = 0; i < c->n_alloc; i++)
      run_single_how(res, c, i, h == 1 ? "history-4KiB" : "history-stacks-4KiB", "ns/pair", &s, c->ops, NULL,
                     (single_how){1, false, h, false});
  ab_seq_free(&s);
}

/* A stream per request: --stream-requests requests, each on a stream of its own, allocate 4 KiB and
 * 64 KiB and free both; ns per request (4 calls). The passes after the warm-up find every stream's
 * memory cached: what it costs that many streams hold some. */
static void workload_streams(ab_results *res, const config *c) {
  ab_seq s;
  char err[AB_ERR_LEN];
  seq_or_die(ab_seq_streams(&s, c->stream_requests, 4 << 10, 64 << 10, err), "streams", err);
  char name[32];
  snprintf(name, sizeof name, "streams-%" PRIu32, c->stream_requests);
  for (int i = 0; i < c->n_alloc; i++)
    run_single_how(res, c, i, name, "ns/req", &s, c->stream_requests, NULL,
                   (single_how){(int)c->stream_requests, false, 0, false});
  ab_seq_free(&s);
}

/* The random workloads' caps (docs/benchmarks.md): 1000 live of 256 B-1 MiB (~123 KiB each on average);
 * 500 live of 256 B-64 MiB (~5.1 MiB each on average: ~2.5 GiB live, 32 GiB if all were 64 MiB, which fits
 * an H100's 79.6 GiB with every allocator's slack). */
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

static void workload_replay(ab_results *res, const config *c) {
  if (c->n_traces == 0) {
    for (int i = 0; i < c->n_alloc; i++) {
      ab_row *r = new_row(res, "replay", c->alloc[i], "ns/op", 0, c);
      r->status = AB_ROW_SKIPPED;
      snprintf(r->note, sizeof r->note, "no trace found in %s: give --trace FILE or --trace-dir DIR", c->trace_dir);
    }
    return;
  }
  for (size_t k = 0; k < c->n_traces; k++) {
    char name[64] = "replay-";
    ab_trace_name(c->traces[k], name + strlen(name), sizeof name - strlen(name));
#ifdef ALLOC_BENCH_HAVE_REPLAY
    ab_seq s;
    char err[AB_ERR_LEN], note[256];
    if (c->verbose)
      fprintf(stderr, "alloc_bench: reading %s\n", c->traces[k]);
    if (ab_seq_from_trace(&s, c->traces[k], note, sizeof note, err) != 0) {
      fprintf(stderr, "alloc_bench: FAILED: %s: %s\n", name, err);
      ab_failed = true;
      for (int i = 0; i < c->n_alloc; i++) {
        ab_row *r = new_row(res, name, c->alloc[i], "ns/op", 0, c);
        r->status = c->skip[i][0] != '\0' ? AB_ROW_SKIPPED : AB_ROW_ERROR;
        snprintf(r->note, sizeof r->note, "%s%.*s", c->skip[i][0] ? "" : "reading the trace: ", AB_ERR_LEN,
                 c->skip[i][0] ? c->skip[i] : err);
      }
      continue;
    }
    for (int i = 0; i < c->n_alloc; i++)
      run_single_how(res, c, i, name, "ns/op", &s, s.n, note, (single_how){1, false, 0, true});
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

/* The host workload's sizes: pinned blocks from one 4 KiB page to 64 MiB, the range that pin_memory() and
 * the staging buffers of host<->device copies ask for. Pairs, as in the pair workload, each block freed
 * before the next is asked for: after the warm-up pass a caching allocator serves every request from its
 * cache, so its rows are its warm path, and cudaHostAlloc's row what each request costs without a cache. */
static void workload_host(ab_results *res, const config *c) {
  ab_seq s;
  char err[AB_ERR_LEN];
  seq_or_die(ab_seq_host(&s, 4 << 10, 64 << 20, c->host_ops, c->seed, err), "host", err);
  for (int i = 0; i < c->n_alloc; i++)
    run_host(res, c, i, "host-4KiB-64MiB", &s);
  ab_seq_free(&s);
}

/* c with only the allocators that have rows in the workloads of `kind` (their skip reasons with them). */
static config only(const config *c, unsigned kind) {
  config v = *c;
  v.n_alloc = 0;
  for (int i = 0; i < c->n_alloc; i++)
    if (c->alloc[i]->kinds & kind) {
      v.alloc[v.n_alloc] = c->alloc[i];
      memcpy(v.skip[v.n_alloc], c->skip[i], sizeof v.skip[0]);
      v.n_alloc++;
    }
  return v;
}

void ab_run_workloads(ab_results *res, const config *all) {
  const config dev = only(all, AB_DEVICE), host = only(all, AB_HOST);
  const config *c = &dev;
  if (c->workload[WL_PAIR])
    workload_pair(res, c);
  if (c->workload[WL_CROSS])
    workload_cross(res, c);
  if (c->workload[WL_HISTORY])
    workload_history(res, c);
  if (c->workload[WL_STREAMS])
    workload_streams(res, c);
  if (c->workload[WL_RANDOM])
    workload_random(res, c);
  if (c->workload[WL_MT])
    workload_mt(res, c);
  if (c->workload[WL_REPLAY])
    workload_replay(res, c);
  if (c->workload[WL_GRAPH])
    workload_graph(res, c);
  if (host.workload[WL_HOST])
    workload_host(res, &host);
}
