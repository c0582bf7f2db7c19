/* alloc_bench: the command line: its help, its options and lists, into the run's settings (config.h),
 * and the traces to replay. */
#include "config.h"

#include <cachalot/status.h>

#include <errno.h>
#include <getopt.h>
#include <glob.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The traces/ folder of the source tree alloc_bench was built from, which holds the traces the project
 * ships. */
#ifndef ALLOC_BENCH_TRACE_DIR
#error "ALLOC_BENCH_TRACE_DIR is set by the build (tools/meson.build)"
#endif

static const char help[] =
    "usage: alloc_bench [--workload W,...|all] [--allocators A,...|all] [--threads N] [--streams N]\n"
    "                   [--repeat R] [--ops N] [--graph-ops N] [--replays K] [--host-ops N]\n"
    "                   [--stream-requests N]\n"
    "                   [--trace FILE]... [--trace-dir DIR] [--pin CPU] [--seed S] [--conf STRING]\n"
    "                   [--csv FILE] [--json FILE] [--svg FILE] [-v]\n"
    "       alloc_bench svg IN.csv OUT.svg\n"
    "       alloc_bench --help | --version\n"
    "\n"
    "Benchmarks device-memory allocators (and pinned host memory, the host workload) on the same\n"
    "pre-generated operation sequences, side by side.\n"
    "Every (workload, allocator) row gets a fresh allocator, one untimed warm-up pass, then R timed\n"
    "passes; device work is synchronized before a pass's clock (CLOCK_MONOTONIC) is read. Afterwards\n"
    "everything is freed and cachalot's rows run cachalot_check() and verify that nothing is allocated.\n"
    "\n"
    "Workloads (--workload, comma-separated; default all):\n"
    "  pair     alloc + free of one size, N times, for 256 B, 4 KiB, 512 KiB, 2 MiB and 32 MiB\n"
    "           (rows pair-256B ... pair-32MiB); timed PER PAIR (ns/pair), not per call\n"
    "  cross    4 KiB pairs on one stream, every 4th (row cross-4) or 64th (cross-64) block used on a\n"
    "           second stream before its free (record_stream; cudaMallocAsync frees it on that\n"
    "           stream, cudaMalloc frees it); ns/pair\n"
    "  history  4 KiB pairs with the allocator's history recorded: history-4KiB without call stacks,\n"
    "           history-stacks-4KiB with them (cachalot_record_history[_stacks]; PyTorch's\n"
    "           _record_memory_history with context None, then 'all' and Python stacks); ns/pair;\n"
    "           n/a for the CUDA runtime's allocators, which keep none\n"
    "  streams  a stream per request: --stream-requests requests, each on a stream of its own,\n"
    "           allocate 4 KiB and 64 KiB and free both (row streams-N, ns per request of 4 calls)\n"
    "  random   RMM-style: N steps, each allocates (73 %, while fewer than the cap are live) a\n"
    "           log-uniform size, or frees a random live allocation; then frees the rest. Rows\n"
    "           random-1MiB (256 B-1 MiB, at most 1000 live) and random-64MiB (256 B-64 MiB, at most\n"
    "           500 live: ~2.5 GiB live on average, 32 GiB at the very most); ns per alloc or free call\n"
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
    "  host     pinned host memory: --host-ops alloc + free pairs, sizes log-uniform from 4 KiB to\n"
    "           64 MiB (one seeded sequence, the same for every allocator); row host-4KiB-64MiB, timed\n"
    "           PER PAIR (ns/pair). Rows of cachalot's host cache (cachalot_host_malloc / _free),\n"
    "           cudaHostAlloc and PyTorch; the device allocators have none (nor these in the others)\n"
    "\n"
    "Allocators (--allocators, comma-separated; default all; those that cannot run here are skipped):\n"
    "  cachalot         cachalot on the CUDA backend (default config)\n"
    "  cudaMallocAsync  a cudaMemPoolCreate pool of its own, release threshold UINT64_MAX\n"
    "  cudaMalloc       plain cudaMalloc / cudaFree\n"
    "  cudaHostAlloc    host workload: plain cudaHostAlloc / cudaFreeHost, no cache\n"
    "  PyTorch          PyTorch's CUDA caching allocator (one thread: no mt rows; no graph rows) and\n"
    "                   its caching host allocator (what pin_memory=True uses), timed in C++ in a python3\n"
    "                   child (torch_host.py beside alloc_bench's sources; needs torch with CUDA and the\n"
    "                   cachalot package with its PyTorch backend, whose library holds the loops)\n"
    "  cachalot-sim     cachalot on the simulated device (events complete at once; no GPU needed)\n"
    "\n"
    "Columns: median [min-max] over the timed passes; peak reserved and peak allocated bytes (cachalot:\n"
    "memory_stats reserved_bytes / allocated_bytes peaks; cudaMallocAsync: the pool's ReservedMemHigh /\n"
    "UsedMemHigh, the graph memory's in the graph rows; cudaMalloc: the requested bytes); peak requested\n"
    "(the most bytes the sequence has live; mt: the sum of the threads' peaks); res/req, their ratio;\n"
    "device allocs: cudaMalloc-like calls over the warm-up and the timed passes together (cachalot:\n"
    "num_device_alloc; cudaMalloc: every allocation; cudaMallocAsync: unknown, '-'). Host rows: peak\n"
    "reserved is the most pinned bytes held, cached or handed out, peak allocated the most handed out\n"
    "(cachalot and PyTorch: host_memory_stats allocated_bytes / active_bytes peaks, blocks rounded up\n"
    "to powers of two, PyTorch's '-' where torch's own count misses frees; cudaHostAlloc: the requested\n"
    "bytes), dev allocs the pinnings (num_host_alloc; cudaHostAlloc: every allocation).\n"
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
    "      --host-ops N        alloc + free pairs per pass of the host workload (default 1000: pinning\n"
    "                          costs milliseconds, and cudaHostAlloc's row pins every time)\n"
    "      --stream-requests N requests (and streams) of the streams workload (default 10000, at most\n"
    "                          65535)\n"
    "      --trace FILE        a snapshot to replay (repeatable; replaces the default traces); a FILE\n"
    "                          that does not exist and has no '/' is a trace's NAME in --trace-dir\n"
    "                          (kv_generate: kv_generate.snapshot.json.gz there)\n"
    "      --trace-dir DIR     where the default traces are (default " ALLOC_BENCH_TRACE_DIR ",\n"
    "                          the traces shipped with cachalot)\n"
    "      --seed S            the seed of the random sequences (default 1)\n"
    "      --pin CPU           run on CPU number CPU, and mt's thread i on the i-th CPU after it that the\n"
    "                          process may use: on a shared host, timings move far less between runs\n"
    "      --conf STRING       CACHALOT_ALLOC_CONF for the cachalot rows (default: none, the defaults);\n"
    "                          checked before anything runs\n"
    "      --csv FILE          also write the results as CSV\n"
    "      --json FILE         also write the results as JSON\n"
    "      --svg FILE          also draw the medians as an SVG bar chart (as `alloc_bench svg` does)\n"
    "                          (a regular FILE is replaced atomically; a device or a FIFO is written\n"
    "                          through, and a symbolic link stays a link; '-' is standard output, for\n"
    "                          one of the three: the lines and the table then go to standard error)\n"
    "  -v, --verbose           progress on standard error\n"
    "  -h, --help              this text\n"
    "      --version           alloc_bench's version (the cachalot library's)\n"
    "`alloc_bench svg IN.csv OUT.svg` draws the chart of a CSV written by --csv: one group of bars per\n"
    "row name, one bar per allocator, log scale, whiskers from min to max ('-' for OUT: standard output).\n"
    "\n"
    "Exit status: 0 done (skipped and n/a rows included), 1 a row failed or a check found a problem, or\n"
    "a file could not be read or written (a --trace that is not there: nothing runs), 2 usage error (an\n"
    "empty list, a bad --conf string, an allocator named for workloads it has no rows in too, two\n"
    "outputs to '-').\n";

const char *const ab_workload_names[WL_COUNT] = {"pair",   "cross", "history", "streams", "random",
                                                 "mt",     "replay", "graph",  "host"};

static const ab_allocator *const all_allocators[] = {&ab_cachalot,        &ab_cuda_async, &ab_cuda_malloc,
                                                     &ab_cuda_host_alloc, &ab_torch,      &ab_cachalot_sim};
_Static_assert(sizeof all_allocators / sizeof all_allocators[0] == N_ALLOCATORS, "N_ALLOCATORS counts them");

int ab_usage_error(const char *fmt, ...) {
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

/* Splits a comma-separated list of names out of names[0..n); calls pick(c, index) for each, in order
 * ("all" alone picks every index). A name not in the table is a usage error: "unknown WHAT 'NAME'
 * (CHOICES)"; a list
 * that names nothing ("", ",,") is the usage error `none`: running nothing and exiting 0 would pass for a
 * benchmark that ran. */
static int parse_names(const char *list, const char *const *names, int n, const char *what, const char *choices,
                       const char *none, void (*pick)(config *, int), config *c) {
  int picked = 0;
  if (strcmp(list, "all") == 0) {
    for (int i = 0; i < n; i++)
      pick(c, i);
    return 0;
  }
  char *copy = strdup(list);
  if (copy == NULL)
    return ab_usage_error("out of host memory");
  int rc = 0;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok != NULL && rc == 0; tok = strtok_r(NULL, ",", &save)) {
    int i = 0;
    while (i < n && strcmp(tok, names[i]) != 0)
      i++;
    if (i == n) {
      rc = ab_usage_error("unknown %s '%s' (%s)", what, tok, choices);
    } else {
      pick(c, i);
      picked++;
    }
  }
  free(copy);
  if (rc == 0 && picked == 0)
    rc = ab_usage_error("%s", none);
  return rc;
}

static void pick_workload(config *c, int i) { c->workload[i] = true; }

static int parse_workloads(const char *list, config *c) {
  memset(c->workload, 0, sizeof c->workload);
  return parse_names(list, ab_workload_names, WL_COUNT, "workload",
                     "pair, cross, history, streams, random, mt, replay, graph, host or all",
                     "--workload names no workload (pair, cross, history, streams, random, mt, replay, graph, host "
                     "or all)",
                     pick_workload, c);
}

/* An allocator named twice runs once. */
static void pick_allocator(config *c, int i) {
  for (int k = 0; k < c->n_alloc; k++)
    if (c->alloc[k] == all_allocators[i])
      return;
  c->alloc[c->n_alloc++] = all_allocators[i];
}

static int parse_allocators(const char *list, config *c) {
  c->n_alloc = 0;
  const char *names[N_ALLOCATORS];
  for (int i = 0; i < N_ALLOCATORS; i++)
    names[i] = all_allocators[i]->name;
  c->allocators_named = strcmp(list, "all") != 0;
  return parse_names(list, names, N_ALLOCATORS, "allocator",
                     "cachalot, cudaMallocAsync, cudaMalloc, cudaHostAlloc, PyTorch, cachalot-sim or all",
                     "--allocators names no allocator", pick_allocator, c);
}

/* Leaves out the allocators that have no row in the selected workloads (device ones in host alone, host
 * ones in device workloads), so that they are neither probed nor reported as skipped. One named in
 * --allocators is a usage error instead: running nothing for it would pass for a row that ran. */
static int keep_allocators_with_rows(config *c) {
  bool device = false;
  for (int w = 0; w < WL_COUNT; w++)
    device |= w != WL_HOST && c->workload[w];
  const unsigned kinds = (device ? AB_DEVICE : 0u) | (c->workload[WL_HOST] ? AB_HOST : 0u);
  int kept = 0;
  for (int i = 0; i < c->n_alloc; i++) {
    const ab_allocator *a = c->alloc[i];
    if (a->kinds & kinds)
      c->alloc[kept++] = a;
    else if (c->allocators_named)
      return ab_usage_error("%s has no rows in the selected workloads: %s", a->name,
                            a->kinds == AB_HOST ? "it serves pinned host memory, the host workload alone"
                                                : "it serves device memory, not the host workload (cudaHostAlloc "
                                                  "is the CUDA runtime's pinned-host row)");
  }
  c->n_alloc = kept;
  return AB_GO_ON;
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

void ab_trace_name(const char *path, char *out, size_t len) {
  const char *base = strrchr(path, '/');
  snprintf(out, len, "%s", base ? base + 1 : path);
  static const char *const suffixes[] = {".gz", ".json", ".snapshot"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    size_t n = strlen(out), m = strlen(suffixes[i]);
    if (n > m && strcmp(out + n - m, suffixes[i]) == 0)
      out[n - m] = '\0';
  }
}

/* The trace files of `dir`, *.json.gz then *.json, each in glob's (sorted) order, into g[2]: the
 * default traces, and the names a --trace NAME may take. */
static void glob_traces(const char *dir, glob_t g[2]) {
  const char *pats[] = {"*.json.gz", "*.json"};
  for (size_t p = 0; p < 2; p++) {
    char pat[4096];
    snprintf(pat, sizeof pat, "%s/%s", dir, pats[p]);
    if (glob(pat, 0, NULL, &g[p]) != 0)
      g[p] = (glob_t){0};
  }
}

static void default_traces(config *c) {
  glob_t g[2];
  glob_traces(c->trace_dir, g);
  for (size_t p = 0; p < 2; p++) {
    for (size_t i = 0; i < g[p].gl_pathc; i++)
      if (add_trace(c, g[p].gl_pathv[i]) != 0) {
        fprintf(stderr, "alloc_bench: traces: out of host memory\n");
        exit(AB_EXIT_FAILURE);
      }
    globfree(&g[p]);
  }
}

/* A --trace that is not there: a bare NAME is looked for in the trace folder (as NAME, then with the
 * suffixes the shipped traces have); else the error names the folder and the traces it does hold, so
 * that a trace the folder lacks is told apart from a typo, before a long run fails at its end.
 * AB_GO_ON, or AB_EXIT_FAILURE after the message. */
static int find_trace(config *c, size_t k) {
  const char *given = c->traces[k];
  if (access(given, F_OK) == 0)
    return AB_GO_ON;
  const int err = errno;
  if (strchr(given, '/') != NULL) {
    fprintf(stderr, "alloc_bench: --trace %s: %s\n", given, strerror(err));
    return AB_EXIT_FAILURE;
  }
  static const char *const suffixes[] = {"", ".snapshot.json.gz", ".snapshot.json", ".json.gz", ".json"};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s", c->trace_dir, given, suffixes[i]);
    if (access(path, F_OK) == 0) {
      char *found = strdup(path);
      if (found == NULL) {
        fprintf(stderr, "alloc_bench: traces: out of host memory\n");
        return AB_EXIT_FAILURE;
      }
      free(c->traces[k]);
      c->traces[k] = found;
      return AB_GO_ON;
    }
  }
  fprintf(stderr, "alloc_bench: --trace %s: no such file, nor a trace of that name in %s (", given, c->trace_dir);
  glob_t g[2];
  glob_traces(c->trace_dir, g);
  size_t shown = 0;
  for (size_t p = 0; p < 2; p++) {
    for (size_t i = 0; i < g[p].gl_pathc; i++) {
      char name[256];
      ab_trace_name(g[p].gl_pathv[i], name, sizeof name);
      fprintf(stderr, "%s%s", shown++ ? ", " : "the traces there: ", name);
    }
    globfree(&g[p]);
  }
  fprintf(stderr, "%s)\n", shown ? "" : "it holds no trace");
  return AB_EXIT_FAILURE;
}

/* How many of --csv, --json and --svg are "-". */
static int outputs_to_stdout(const config *c) {
  const char *outs[] = {c->csv, c->json, c->svg};
  int n = 0;
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
    n += outs[i] != NULL && strcmp(outs[i], "-") == 0;
  return n;
}

bool ab_output_to_stdout(const config *c) { return outputs_to_stdout(c) > 0; }

enum {
  OPT_GRAPH_OPS = 256,
  OPT_REPLAYS,
  OPT_HOST_OPS,
  OPT_STREAM_REQUESTS,
  OPT_TRACE,
  OPT_TRACE_DIR,
  OPT_SEED,
  OPT_CSV,
  OPT_JSON,
  OPT_SVG,
  OPT_PIN,
  OPT_CONF,
  OPT_VERSION
};

/* The options apply_option leaves: files, flags and getopt's errors. */
static int apply_other_option(config *c, int o, char **argv) {
  int rc = 0;
  switch (o) {
  case OPT_CONF: {
    char why[AB_ERR_LEN];
    if (ab_cachalot_set_conf(optarg, why) != 0)
      rc = ab_usage_error("--conf: %s", why);
    break;
  }
  case OPT_CSV:
    c->csv = optarg;
    break;
  case OPT_JSON:
    c->json = optarg;
    break;
  case OPT_SVG:
    c->svg = optarg;
    break;
  case 'v':
    c->verbose = true;
    break;
  case OPT_VERSION:
    printf("alloc_bench %s\n", cachalot_version());
    return fflush(stdout) == 0 && !ferror(stdout) ? AB_EXIT_OK : AB_EXIT_FAILURE;
  case ':':
    rc = ab_usage_error("%s needs a value", argv[optind - 1]);
    break;
  default:
    if (optopt != 0)
      rc = ab_usage_error("unknown option '-%c'", optopt);
    else
      rc = ab_usage_error("unknown option '%s'", argv[optind - 1]);
    break;
  }
  return rc != 0 ? rc : AB_GO_ON;
}

/* A count option's value, 1 to max: 0, or a usage error naming the option. */
static int count_arg(const char *name, uint64_t max, uint64_t *v) {
  if (parse_count(optarg, 1, max, v))
    return 0;
  return ab_usage_error("%s wants 1 to %" PRIu64 ", not '%s'", name, max, optarg);
}

/* One option o (getopt_long's return) with its optarg, into c: AB_GO_ON, or the exit status. */
static int apply_option(config *c, int o, char **argv) {
  uint64_t v = 0;
  int rc = 0;
  switch (o) {
  case 'h':
    fputs(help, stdout);
    return fflush(stdout) == 0 && !ferror(stdout) ? AB_EXIT_OK : AB_EXIT_FAILURE;
  case 'w':
    rc = parse_workloads(optarg, c);
    break;
  case 'a':
    rc = parse_allocators(optarg, c);
    break;
  case 't':
    rc = count_arg("--threads", 256, &v);
    c->threads = (int)v;
    break;
  case 's':
    rc = count_arg("--streams", 64, &v);
    c->streams = (int)v;
    break;
  case 'r':
    rc = count_arg("--repeat", 1000, &v);
    c->repeat = (int)v;
    break;
  case 'n':
    rc = count_arg("--ops", 100000000, &v);
    c->ops = (size_t)v;
    break;
  case OPT_GRAPH_OPS:
    rc = count_arg("--graph-ops", 1000000, &v);
    c->graph_ops = (size_t)v;
    break;
  case OPT_REPLAYS:
    rc = count_arg("--replays", 1000000, &v);
    c->replays = (int)v;
    break;
  case OPT_HOST_OPS:
    rc = count_arg("--host-ops", 100000000, &v);
    c->host_ops = (size_t)v;
    break;
  case OPT_STREAM_REQUESTS:
    rc = count_arg("--stream-requests", AB_MAX_STREAMS, &v);
    c->stream_requests = (uint32_t)v;
    break;
  case OPT_TRACE:
    if (add_trace(c, optarg) != 0)
      rc = ab_usage_error("out of host memory");
    c->traces_given = true;
    break;
  case OPT_TRACE_DIR:
    if (optarg[0] == '\0')
      rc = ab_usage_error("--trace-dir wants a directory, not an empty string");
    c->trace_dir = optarg;
    break;
  case OPT_SEED:
    if (!parse_count(optarg, 0, UINT64_MAX, &v))
      rc = ab_usage_error("--seed wants a non-negative integer, not '%s'", optarg);
    c->seed = v;
    break;
  case OPT_PIN:
    if (!parse_count(optarg, 0, CPU_SETSIZE - 1, &v))
      rc = ab_usage_error("--pin wants a CPU number from 0 to %d, not '%s'", CPU_SETSIZE - 1, optarg);
    c->pin = (int)v;
    break;
  default:
    return apply_other_option(c, o, argv);
  }
  return rc != 0 ? rc : AB_GO_ON;
}

int ab_parse_args(int argc, char **argv, config *c) {
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
                                           {"host-ops", required_argument, NULL, OPT_HOST_OPS},
                                           {"stream-requests", required_argument, NULL, OPT_STREAM_REQUESTS},
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
                                           {"version", no_argument, NULL, OPT_VERSION},
                                           {0}};
  *c = (config){.threads = 8, .streams = 1, .repeat = 5, .replays = 100, .ops = 20000, .graph_ops = 1000,
                .host_ops = 1000, .stream_requests = 10000, .seed = 1, .trace_dir = ALLOC_BENCH_TRACE_DIR, .pin = -1};
  parse_workloads("all", c);
  parse_allocators("all", c);
  opterr = 0;
  int rc = AB_GO_ON;
  for (int o; rc == AB_GO_ON && (o = getopt_long(argc, argv, ":w:a:t:s:r:n:vh", longopts, NULL)) != -1;)
    rc = apply_option(c, o, argv);
  if (rc == AB_GO_ON && optind < argc)
    rc = ab_usage_error("unexpected argument '%s'", argv[optind]);
  if (rc == AB_GO_ON)
    rc = keep_allocators_with_rows(c);
  if (rc == AB_GO_ON && outputs_to_stdout(c) > 1) /* they would interleave */
    rc = ab_usage_error("--csv, --json and --svg: only one of them may be '-' (standard output)");
  for (size_t k = 0; rc == AB_GO_ON && k < c->n_traces; k++)
    rc = find_trace(c, k);
  if (rc == AB_GO_ON && !c->traces_given && c->workload[WL_REPLAY])
    default_traces(c);
  if (rc != AB_GO_ON) /* the caller runs nothing, so frees nothing */
    ab_config_free(c);
  return rc;
}

void ab_config_free(config *c) {
  for (size_t i = 0; i < c->n_traces; i++)
    free(c->traces[i]);
  free(c->traces);
  c->traces = NULL;
  c->n_traces = 0;
}
