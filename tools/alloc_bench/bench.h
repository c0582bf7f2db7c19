/* alloc_bench: the benchmark harness (docs/benchmarks.md).
 *
 * Every workload is turned into one pre-generated sequence of operations (ab_seq) before anything is
 * timed, and every allocator runs exactly that sequence: the random numbers, the trace parsing and the
 * bookkeeping of which slot is live are not part of any timing. An allocator is a table of functions
 * (ab_allocator); its `run` is the timed loop, with direct calls to the allocator inside, so the only
 * indirect call is the one per timed pass.
 *
 * Errors: functions return 0 on success and -1 with a message in err[AB_ERR_LEN].
 */
#ifndef ALLOC_BENCH_BENCH_H
#define ALLOC_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

enum { AB_EXIT_OK = 0, AB_EXIT_FAILURE = 1, AB_EXIT_USAGE = 2 };
enum { AB_ERR_LEN = 512 };

/* ---- operation sequences (sequence.c) ---- */

/* One operation: size != 0 allocates `size` bytes on streams[stream] and stores the pointer in
 * slots[slot]; size == 0 frees slots[slot] (stream is then the stream it was allocated on), after
 * marking it used on streams[record - 1] when record != 0 (PyTorch's record_stream: the cross workload,
 * which only the allocators' run_rec runs). */
typedef struct {
  uint64_t size;
  uint32_t slot;
  uint16_t stream;
  uint16_t record;
} ab_op;
enum { AB_MAX_STREAMS = 65535 };

/* A sequence starts and ends with nothing live (the last operations free whatever is still live). */
typedef struct {
  ab_op *ops;
  size_t n;
  size_t cap;
  uint32_t n_slots;        /* slots used: 0 .. n_slots-1 */
  size_t n_allocs;         /* how many of the ops allocate */
  uint64_t peak_requested; /* the most requested bytes live at once */
} ab_seq;

typedef struct {
  uint64_t state;
} ab_rng;

void ab_rng_seed(ab_rng *r, uint64_t seed);
uint64_t ab_rng_next(ab_rng *r);
/* Uniform in [0, n). */
uint64_t ab_rng_below(ab_rng *r, uint64_t n);

/* `pairs` x (allocate `size` into slot 0, free slot 0). */
int ab_seq_pair(ab_seq *s, uint64_t size, size_t pairs, char err[AB_ERR_LEN]);
/* The pairs of ab_seq_pair on stream 0, where every `every`-th block is used on stream 1 before its free
 * (record = 2): the side-stream pattern of a data prefetcher. */
int ab_seq_cross(ab_seq *s, uint64_t size, size_t pairs, uint32_t every, char err[AB_ERR_LEN]);
/* `requests` requests, request i on stream i: allocate `small` and `large` bytes, free both. */
int ab_seq_streams(ab_seq *s, uint32_t requests, uint64_t small, uint64_t large, char err[AB_ERR_LEN]);
/* `pairs` x (allocate a size drawn log-uniformly from [min, max] into slot 0, free slot 0): the host
 * workload's pinned blocks. */
int ab_seq_host(ab_seq *s, uint64_t min, uint64_t max, size_t pairs, uint64_t seed, char err[AB_ERR_LEN]);
/* RMM's random_allocations: `steps` steps; at each, when nothing is live, or fewer than `cap` are live
 * and a 73 % coin says so, allocate a size drawn log-uniformly from [min, max] (any byte count); else
 * free a live allocation picked uniformly. Then free what is still live, in random order. An
 * allocation's stream is its slot % n_streams. */
int ab_seq_random(ab_seq *s, uint64_t min, uint64_t max, size_t steps, uint32_t cap, uint32_t n_streams,
                  uint64_t seed, char err[AB_ERR_LEN]);
/* Appends one operation (used by the generators and the trace conversion); stream < AB_MAX_STREAMS. */
int ab_seq_push(ab_seq *s, uint64_t size, uint32_t slot, uint32_t stream, char err[AB_ERR_LEN]);
/* Fills n_slots, n_allocs and peak_requested from the ops, and checks the sequence's shape: every free
 * frees a live slot, every alloc fills a free one, nothing is live at the end. */
int ab_seq_finish(ab_seq *s, char err[AB_ERR_LEN]);
void ab_seq_free(ab_seq *s);
/* The frees that undo ops[0 .. done) (for the cleanup after a failed pass): a sequence of free ops,
 * one per slot left live. */
int ab_seq_undo(const ab_seq *s, size_t done, ab_seq *out, char err[AB_ERR_LEN]);

#ifdef ALLOC_BENCH_HAVE_REPLAY
/* The alloc / free_requested entries of a snapshot's trace (trace.c). `note` gets a line on what was
 * skipped or merged. */
int ab_seq_from_trace(ab_seq *s, const char *path, char *note, size_t note_len, char err[AB_ERR_LEN]);
#endif

/* ---- allocators (alloc_cachalot.c, alloc_cuda.c) ---- */

typedef struct ab_allocator ab_allocator;

/* An instance: made fresh for every result row, with its own streams. Implementations put it first in
 * their own struct. */
typedef struct {
  const ab_allocator *vt;
  int n_streams;
  void **streams; /* cudaStream_t / cachalot_stream handles */
  char note[128]; /* what its rows' note says ("" for nothing), e.g. the version of what it measures */
  /* Set by a run that times its loop itself (PyTorch's, in its driver process: the time around the call
   * would add the round trip), the sync included; 0: the harness's clock around run and sync counts. */
  uint64_t pass_ns;
} ab_alloc;

/* A peak that is the requested bytes themselves (an allocator that keeps nothing: cudaMalloc,
 * cudaHostAlloc), which the row fills in from its sequence. */
enum { AB_PEAK_REQUESTED = -2 };

typedef struct {
  int64_t peak_reserved, peak_allocated; /* -1: unknown; or AB_PEAK_REQUESTED */
  int64_t device_allocs;                 /* -1: unknown */
} ab_stats;

/* The memory an allocator serves, and so the workloads it has rows in: device memory (pair, random, mt,
 * replay, graph) and pinned host memory (host). An allocator has no row at all in the others' workloads:
 * an n/a row for every one of them would bury the rows that ran. */
enum { AB_DEVICE = 1, AB_HOST = 2 };

struct ab_allocator {
  const char *name;
  unsigned kinds; /* AB_DEVICE, AB_HOST or both */
  /* 0 when the allocator can run here; else -1 and why (no GPU, no driver, built without CUDA). */
  int (*probe)(char err[AB_ERR_LEN]);
  /* A fresh instance with n_streams streams; peak statistics start at zero. */
  int (*open)(ab_alloc **out, int n_streams, char err[AB_ERR_LEN]);
  /* run, sync and stats serve the device workloads (NULL where kinds lacks AB_DEVICE). The timed loop:
   * runs ops[0..n). On failure *done is the index of the failed op. Thread-safe for distinct slots and
   * streams. */
  int (*run)(ab_alloc *a, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
             char err[AB_ERR_LEN]);
  /* The same, honouring each free's `record` (NULL: the cross rows are n/a). A loop of its own, so that
   * run's, which the pair rows and callgrind's count time, has no test for it. */
  int (*run_rec)(ab_alloc *a, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
                 char err[AB_ERR_LEN]);
  /* History on (stacks: with the call stacks of each allocation) or off, before a history row's passes
   * (NULL, with history_na saying why: the history rows are n/a). */
  int (*history)(ab_alloc *a, bool on, bool stacks, char err[AB_ERR_LEN]);
  const char *history_na;
  /* Why the mt rows are n/a (NULL: they run). */
  const char *mt_na;
  /* Waits for the device work of the given streams. */
  int (*sync)(ab_alloc *a, void *const *streams, int n, char err[AB_ERR_LEN]);
  /* Statistics of the instance's whole life; graph: the graph workload ran (memory of graphs). */
  int (*stats)(ab_alloc *a, bool graph, ab_stats *out, char err[AB_ERR_LEN]);
  /* After everything was freed: the allocator's self-check (NULL: none). */
  int (*check)(ab_alloc *a, char err[AB_ERR_LEN]);
  /* The graph workload (NULL, with graph_na saying why, when the allocator cannot be captured): capture
   * ops into a graph on `stream`, *ns the time of the captured allocator calls alone; launch the graph k
   * times (no wait); drop the graph. */
  int (*graph_capture)(ab_alloc *a, void *stream, const ab_op *ops, size_t n, void **slots, uint64_t *ns,
                       char err[AB_ERR_LEN]);
  int (*graph_replay)(ab_alloc *a, void *stream, int k, char err[AB_ERR_LEN]);
  int (*graph_reset)(ab_alloc *a, char err[AB_ERR_LEN]);
  const char *graph_na;
  /* The host workload (NULL where kinds lacks AB_HOST): runs ops[0..n) as pinned allocations (size != 0)
   * and frees, *ns the time of that loop alone, measured by the allocator's side (the PyTorch row's loop
   * runs in a child process, so the time cannot be taken around the call); on failure *done is the index
   * of the failed op (what ops[0..*done) left live is still live). No device work is enqueued, so nothing
   * is synchronized. One loop, one indirect call per pass, as for `run`. */
  int (*host_run)(ab_alloc *a, const ab_op *ops, size_t n, void **slots, size_t *done, uint64_t *ns,
                  char err[AB_ERR_LEN]);
  /* The host rows' statistics: peak_reserved the most pinned bytes held (cached or handed out),
   * peak_allocated the most handed out (rounded sizes), device_allocs the pinning calls (-1 unknown,
   * AB_PEAK_REQUESTED as for stats). */
  int (*host_stats)(ab_alloc *a, ab_stats *out, char err[AB_ERR_LEN]);
  void (*close)(ab_alloc *a);
};

extern const ab_allocator ab_cachalot, ab_cachalot_sim, ab_cuda_async, ab_cuda_malloc, ab_cuda_host_alloc, ab_torch;
/* The CACHALOT_ALLOC_CONF string the cachalot rows' allocators are made with (default ""): 0, or -1 with
 * the library's message in err when the string is not a valid config (conf is kept only when valid). */
int ab_cachalot_set_conf(const char *conf, char err[AB_ERR_LEN]);

#ifdef ALLOC_BENCH_HAVE_CUDA
/* CUDA helpers shared by the allocators (alloc_cuda.c). */
int ab_cuda_probe(char err[AB_ERR_LEN]);
int ab_cuda_streams_create(void **streams, int n, char err[AB_ERR_LEN]);
void ab_cuda_streams_destroy(void **streams, int n);
int ab_cuda_streams_sync(void *const *streams, int n, char err[AB_ERR_LEN]);
/* A small device buffer, and a 1-byte memset of it enqueued on `stream`: the one node a captured graph
 * needs so it is not empty. */
int ab_cuda_node_buffer(void **out, char err[AB_ERR_LEN]);
int ab_cuda_node(void *buffer, void *stream, char err[AB_ERR_LEN]);
void ab_cuda_free_buffer(void *buffer);
/* The GPU's name ("" when none). */
void ab_cuda_device_name(char *buf, size_t len);
#endif

/* ---- results (report.c, svg.c) ---- */

typedef enum { AB_ROW_OK, AB_ROW_SKIPPED, AB_ROW_NA, AB_ROW_ERROR } ab_row_status;

typedef struct {
  char workload[64];
  char allocator[24];
  ab_row_status status;
  char unit[16];             /* "ns/pair", "ns/op", "ns/replay" */
  uint64_t units;            /* pairs, ops or replays per timed repeat */
  int repeats, threads, streams;
  double median_ns, min_ns, max_ns; /* per unit; valid when status == AB_ROW_OK */
  int64_t peak_reserved, peak_allocated, peak_requested, device_allocs; /* -1: unknown */
  /* The reserved peak after the first pass (the warm-up) alone, beside the whole row's: one replay's
   * figure beside the steady state's (replay rows; -1: unknown or not a replay row). */
  int64_t first_reserved;
  char note[AB_ERR_LEN + 128];
} ab_row;

typedef struct {
  ab_row *rows;
  size_t n, cap;
} ab_results;

ab_row *ab_results_add(ab_results *r);
void ab_results_free(ab_results *r);

const char *ab_status_name(ab_row_status s);
/* The table on `out`; `why_none` ends it when no row ran. */
void ab_print_table(FILE *out, const ab_results *r, const char *why_none);
int ab_write_csv(const char *path, const ab_results *r, char err[AB_ERR_LEN]);
/* `config` is a JSON object's text (the run's settings), inserted as is. */
int ab_write_json(const char *path, const ab_results *r, const char *config, char err[AB_ERR_LEN]);
/* Reads a CSV written by ab_write_csv (the columns the chart needs, found by their header names). */
int ab_read_csv(const char *path, ab_results *out, char err[AB_ERR_LEN]);
/* The grouped horizontal bar chart of the medians. */
int ab_write_svg(const char *path, const ab_results *r, const char *title, char err[AB_ERR_LEN]);

static inline uint64_t ab_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

#endif
