/* alloc_bench: the run's settings from the command line (args.c), which the workloads (workloads.c)
 * and the output (output.c) read, and the entry points of those files. */
#ifndef ALLOC_BENCH_CONFIG_H
#define ALLOC_BENCH_CONFIG_H

#include "bench.h"

enum { WL_PAIR, WL_CROSS, WL_HISTORY, WL_STREAMS, WL_RANDOM, WL_MT, WL_REPLAY, WL_GRAPH, WL_HOST, WL_COUNT };
extern const char *const ab_workload_names[WL_COUNT];

/* How many allocators alloc_bench knows (args.c lists them). */
enum { N_ALLOCATORS = 6 };

typedef struct {
  bool workload[WL_COUNT];
  const ab_allocator *alloc[N_ALLOCATORS];
  char skip[N_ALLOCATORS][AB_ERR_LEN]; /* why alloc[i] cannot run ("" when it can) */
  int n_alloc;
  int threads, streams, repeat, replays;
  size_t ops, graph_ops, host_ops;
  uint32_t stream_requests; /* the streams workload's requests (and streams) */
  uint64_t seed;
  char **traces;
  size_t n_traces;
  bool traces_given, verbose;
  bool allocators_named; /* --allocators named them (not all, nor the default) */
  const char *trace_dir; /* --trace-dir, else the source tree's traces/ */
  int pin; /* the first CPU to run on, -1 when not pinned */
  const char *csv, *json, *svg;
} config;

/* ---- args.c ---- */

enum { AB_GO_ON = -1 }; /* the run goes on (not an exit status) */

/* Prints "alloc_bench: MESSAGE (alloc_bench --help for usage)" to stderr; AB_EXIT_USAGE. */
int ab_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The settings of the command line into *c, with the default traces where replay has none given.
 * AB_GO_ON, or the exit status (--help, --version, a usage error, a --trace that is not there). */
int ab_parse_args(int argc, char **argv, config *c);
/* Frees what ab_parse_args allocated in *c (it does so itself when it returns other than AB_GO_ON). */
void ab_config_free(config *c);
/* Whether one of --csv, --json and --svg writes to standard output ("-"). */
bool ab_output_to_stdout(const config *c);
/* A trace's name, as its replay row and --trace NAME call it: the file's name without its directory and
 * without .gz, .json and .snapshot (traces/kv_generate.snapshot.json.gz: kv_generate). */
void ab_trace_name(const char *path, char *out, size_t len);

/* ---- workloads.c ---- */

/* Set when a row failed or a check found a problem: the exit status is then 1. */
extern bool ab_failed;
/* Pins the calling thread to CPU c->pin, or for k > 0 to the k-th CPU after it among those the process
 * may use (wrapping around). False when c->pin is not one of those, or the system refuses. */
bool ab_pin_thread(const config *c, int k);
/* Every selected workload's rows, in the order of the table. */
void ab_run_workloads(ab_results *res, const config *c);

/* ---- output.c ---- */

/* The lines before the table, the table, then the --csv, --json and --svg files; `device` is the GPU's
 * name ("" when none was used). */
void ab_report(const config *c, const ab_results *res, const char *device);

#endif
