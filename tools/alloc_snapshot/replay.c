/* alloc_snapshot replay: runs the alloc / free_requested entries of a snapshot's trace through cachalot
 * and reports how much the allocator reserved at its peak against what the program had live at its
 * peak: the fragmentation figure of docs/benchmarks.md (reserved peak / requested peak). */
#include <cachalot/cachalot.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "cli.h"
#include "../common/cuda_hint.h"
#include "../common/snapshot_reader.h"
#include "../common/trace_walk.h"

static const char help[] =
    "usage: alloc_snapshot replay TRACE [--backend sim|cuda] [--conf STR] [--capacity BYTES]\n"
    "                             [--passes N] [-o SNAPSHOT] [--stats-json]\n"
    "\n"
    "Replays the trace of a snapshot (device_traces; cachalot's or PyTorch's JSON, gzip'ed or not)\n"
    "through cachalot, in time order over all devices: each 'alloc' entry allocates its size on its\n"
    "device and stream, and the pointer is remembered for its addr; each 'free_requested' entry frees\n"
    "the pointer remembered for its addr. Other entries (free_completed, segment_*, oom, ...) are what\n"
    "the recording allocator did itself and are skipped. Stream 0 is the default stream (NULL); other\n"
    "stream ids get a simulated stream each, made on first use (on the cuda backend they run on the\n"
    "default stream, with a warning).\n"
    "\n"
    "A free of an addr never allocated in the trace (recorded before the trace began) is counted and\n"
    "skipped. An allocation that fails as out of memory is counted, and its free later skipped; the\n"
    "replay goes on. Any other allocator error stops it (exit status 1).\n"
    "\n"
    "Prints a summary: operations, unknown frees, OOMs, and per device the peak requested bytes (the\n"
    "most the trace had live), the peak reserved bytes (the most cachalot held from the device), their\n"
    "ratio, the page floor (the most 2 MiB pages the trace's live blocks need at once, those of 1 MiB\n"
    "or less apart from the larger, as PyTorch's pools keep them: no allocator that maps 2 MiB pages\n"
    "for each kind apart can reserve less) and how far the peak reserved is from it, device\n"
    "allocations and frees, and the recording allocator's own reserved peak when the\n"
    "trace has its segment_alloc/segment_free entries; then the replay's wall time.\n"
    "\n"
    "With --passes N the trace is replayed N times in a row on the same allocator, as a program runs the\n"
    "same step again: what a pass leaves live (allocated in the trace, never freed in it) is freed before\n"
    "the next pass. The summary then gives each device's figures over all N passes, and those of the\n"
    "first pass alone (its reserved peak, its ratio, its device allocations and frees) beside them: the\n"
    "steady state against a single replay. The counts above the devices are over all passes.\n"
    "\n"
    "options:\n"
    "  --backend sim|cuda  the simulated device (default) or the GPUs through CUDA\n"
    "  --conf STR          a CACHALOT_ALLOC_CONF string (default \"\": the defaults; the environment is\n"
    "                      not read, so a replay is reproducible)\n"
    "  --capacity BYTES    memory of each simulated device (default 80G; suffixes K, M, G, T are powers\n"
    "                      of 1024); sim backend only\n"
    "  --passes N          replays the trace N times in a row (default 1; at most 1000)\n"
    "  -o SNAPSHOT         writes cachalot's snapshot after the replay (with the replay's own trace);\n"
    "                      gzip'ed when the name ends in .gz; '-' is standard output\n"
    "  --stats-json        prints cachalot's memory_stats JSON after the replay to standard output (one\n"
    "                      object; an array of one object per device when the trace has several)\n"
    "  -h, --help          this text\n"
    "When standard output carries JSON (--stats-json or -o -), the summary goes to standard error.\n"
    "\n"
    "Exit status: 0 replay done (OOMs included), 1 unreadable or malformed trace, no trace entries,\n"
    "no device (cuda), allocator error, cannot write SNAPSHOT; 2 usage error (bad config string too).\n";

/* ---- the replay ---- */

enum { MAX_STREAMS = 4096 }; /* simulated streams live as long as the backend: a bound for bad traces */
enum { MAX_PASSES = 1000 };

/* The tag of a live allocation whose cachalot_malloc failed as out of memory: its free is skipped. */
enum { FAILED_ALLOC = 1 };

typedef struct {
  cachalot_backend *b;
  cachalot_allocator *a;
  bool sim;
  tw_map streams; /* (device, stream id) -> cachalot_stream */
  bool warned_streams;
  /* per device */
  int n_devices;
  /* what the trace has live of each kind (small blocks, of 1 MiB or less, and large), the most of both at
   * once (the requested peak), and the page floor: the most pages of 2 MiB the two need at once, kept
   * apart as PyTorch's pools keep them */
  struct live { uint64_t small, large, peak, floor; } *live;
  /* counts */
  uint64_t allocs, frees, unknown_frees, failed_frees, implicit_frees, ooms, skipped;
  /* --passes: how many, what the passes' ends freed, and each device's figures after the first */
  unsigned passes;
  uint64_t pass_end_frees;
  struct first_pass {
    uint64_t reserved_peak, requested_peak;
    int64_t device_allocs, device_frees;
  } *first;
} replay;

static int get_stream(replay *r, int device, uint64_t id, cachalot_stream *out) {
  *out = NULL;
  if (id == 0)
    return 0;
  if (!r->sim) {
    if (!r->warned_streams)
      fprintf(stderr, "alloc_snapshot replay: warning: the trace uses streams other than 0; on the cuda backend "
                      "they are replayed on the default stream\n");
    r->warned_streams = true;
    return 0;
  }
  tw_live *s = tw_map_find(&r->streams, device, id);
  if (s != NULL) {
    *out = s->ptr;
    return 0;
  }
  if (r->streams.count >= MAX_STREAMS)
    return as_failure("replay", "the trace uses more than %d streams", MAX_STREAMS);
  cachalot_stream made = NULL;
  cachalot_status st = cachalot_sim_stream_create(r->b, device, &made);
  if (st != CACHALOT_OK)
    return as_failure("replay", "cannot create a simulated stream on device %d: %s", device, cachalot_last_error());
  if (tw_map_insert(&r->streams, (tw_live){.key = id, .device = device, .ptr = made}) == NULL)
    return as_failure("replay", "out of host memory");
  *out = made;
  return 0;
}

enum { FLOOR_PAGE = 2 << 20, SMALL_MAX = 1 << 20 };

static uint64_t pages(uint64_t bytes) { return (bytes + FLOOR_PAGE - 1) / FLOOR_PAGE; }

/* What the trace has live on `device` changed by `size` (up when up), and the peaks after it. */
static void note_live(replay *r, int device, uint64_t size, bool up) {
  struct live *l = &r->live[device];
  uint64_t *kind = size <= SMALL_MAX ? &l->small : &l->large;
  *kind = up ? *kind + size : *kind - size;
  if (l->small + l->large > l->peak)
    l->peak = l->small + l->large;
  const uint64_t floor = (pages(l->small) + pages(l->large)) * FLOOR_PAGE;
  if (floor > l->floor)
    l->floor = floor;
}

/* Frees the allocation of a live record the walk removed. */
static int do_free(replay *r, const tw_live *s) {
  if (s->tag == FAILED_ALLOC) {
    r->failed_frees++;
    return 0;
  }
  cachalot_status st = cachalot_free(r->a, s->ptr);
  if (st != CACHALOT_OK)
    return as_failure("replay", "device %d: freeing the allocation of addr 0x%" PRIx64 " failed: %s: %s", s->device,
                      s->key, cachalot_status_name(st), cachalot_last_error());
  note_live(r, s->device, s->size, false);
  r->frees++;
  return 0;
}

/* Allocates for an alloc entry, into the record the walk made for it. */
static int do_alloc(replay *r, const tw_step *step) {
  int device = step->device;
  const as_trace_entry *e = step->e;
  cachalot_stream stream;
  if (get_stream(r, device, e->stream, &stream) != 0)
    return AS_EXIT_FAILURE;
  if (e->size > SIZE_MAX)
    return as_failure("replay", "device %d entry %zu: size %" PRIu64 " does not fit this machine", device, step->index,
                      e->size);
  void *p = NULL;
  cachalot_status st = cachalot_malloc(r->a, device, (size_t)e->size, stream, &p);
  step->live->ptr = p;
  if (st == CACHALOT_ERROR_OUT_OF_MEMORY) {
    r->ooms++;
    step->live->tag = FAILED_ALLOC;
  } else if (st != CACHALOT_OK) {
    return as_failure("replay", "device %d entry %zu: allocating %" PRIu64 " bytes failed: %s: %s", device,
                      step->index, e->size, cachalot_status_name(st), cachalot_last_error());
  } else {
    r->allocs++;
    note_live(r, device, e->size, true);
  }
  return 0;
}

static int do_step(replay *r, const tw_step *step) {
  switch (step->kind) {
  case TW_ALLOC:
    return do_alloc(r, step);
  case TW_IMPLICIT_FREE:
    r->implicit_frees++;
    return do_free(r, step->live) != 0 ? AS_EXIT_FAILURE : 0;
  case TW_FREE:
    return do_free(r, step->live);
  case TW_UNKNOWN_FREE:
    r->unknown_frees++;
    return 0;
  case TW_OTHER:
    break;
  }
  r->skipped++;
  return 0;
}

/* Frees what a pass left live, before the next pass: the program's next step allocates it again. */
static int end_pass(replay *r, tw_walk *w) {
  size_t pos = 0;
  for (const tw_live *l; (l = tw_map_next(&w->live, &pos)) != NULL;) {
    if (l->tag == FAILED_ALLOC)
      continue;
    cachalot_status st = cachalot_free(r->a, l->ptr);
    if (st != CACHALOT_OK)
      return as_failure("replay", "device %d: freeing addr 0x%" PRIx64 " at the end of a pass failed: %s: %s",
                        l->device, l->key, cachalot_status_name(st), cachalot_last_error());
    note_live(r, l->device, l->size, false);
    r->pass_end_frees++;
  }
  return 0;
}

/* The first pass's figures of each device, for the summary of a replay of several. */
static void note_first_pass(replay *r) {
  for (int d = 0; d < r->n_devices; d++) {
    cachalot_device_stats st;
    if (cachalot_memory_stats(r->a, d, &st) != CACHALOT_OK)
      continue;
    r->first[d] = (struct first_pass){(uint64_t)st.reserved_bytes[CACHALOT_STAT_ALL].peak, r->live[d].peak,
                                      st.num_device_alloc, st.num_device_free};
  }
}

/* Runs every device's trace in the walk's order (trace_walk.h), r->passes times. */
static int run_traces(replay *r, const as_snapshot *s) {
  int rc = 0;
  for (unsigned pass = 0; rc == 0 && pass < r->passes; pass++) {
    tw_walk w;
    if (tw_begin(&w, s->traces, (size_t)r->n_devices) != 0)
      return as_failure("replay", "out of host memory");
    int more;
    tw_step step;
    while (rc == 0 && (more = tw_next(&w, &step)) != 0)
      rc = more < 0 ? as_failure("replay", "out of host memory") : do_step(r, &step);
    if (rc == 0 && pass == 0 && r->passes > 1)
      note_first_pass(r);
    if (rc == 0 && pass + 1 < r->passes)
      rc = end_pass(r, &w);
    tw_end(&w);
  }
  return rc;
}

/* The recording allocator's own reserved peak, from its segment entries (PyTorch: segment_alloc/free,
 * and segment_map/unmap with expandable segments). False when the trace has none or its running total
 * goes below zero (the trace began while segments were already held: no meaningful peak). */
static bool trace_reserved_peak(const as_device_trace *t, uint64_t *peak) {
  int64_t cur = 0, top = 0;
  bool any = false;
  for (size_t i = 0; i < t->n; i++) {
    const as_trace_entry *e = &t->entries[i];
    int64_t size = e->size > INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)e->size;
    if (e->action == AS_SEGMENT_ALLOC || e->action == AS_SEGMENT_MAP) {
      cur = cur > INT64_MAX / 2 ? cur : cur + size;
      any = true;
    } else if (e->action == AS_SEGMENT_FREE || e->action == AS_SEGMENT_UNMAP) {
      cur -= size;
      any = true;
      if (cur < 0)
        return false;
    }
    if (cur > top)
      top = cur;
  }
  *peak = (uint64_t)top;
  return any;
}

static void print_ratio(FILE *out, const char *label, uint64_t num, uint64_t den) {
  if (den == 0)
    fprintf(out, "%s n/a (nothing requested)\n", label);
  else
    fprintf(out, "%s %.3f\n", label, (double)num / (double)den);
}

static void print_summary(FILE *out, const replay *r, const as_snapshot *s, const char *path, const char *backend,
                          uint64_t capacity, const char *conf, double seconds) {
  char cap[AS_SIZE_BUF], sz[AS_SIZE_BUF];
  size_t entries = 0;
  for (size_t d = 0; d < s->n_devices; d++)
    entries += s->traces[d].n;
  fprintf(out, "trace:            %s (%zu entries on %d device%s)\n", path, entries, r->n_devices,
          r->n_devices == 1 ? "" : "s");
  if (r->sim)
    fprintf(out, "backend:          sim, %s per device\n", as_fmt_size(cap, capacity, false));
  else
    fprintf(out, "backend:          %s\n", backend);
  fprintf(out, "config:           \"%s\"\n", conf);
  fprintf(out, "ops:              %" PRIu64 " (%" PRIu64 " allocs, %" PRIu64 " frees)\n", r->allocs + r->frees,
          r->allocs, r->frees);
  fprintf(out, "skipped entries:  %" PRIu64 " (not alloc or free_requested)\n", r->skipped);
  fprintf(out, "unknown frees:    %" PRIu64 "\n", r->unknown_frees);
  if (r->implicit_frees)
    fprintf(out, "implicit frees:   %" PRIu64 " (addr allocated again while live)\n", r->implicit_frees);
  fprintf(out, "OOMs:             %" PRIu64 " (their frees skipped: %" PRIu64 ")\n", r->ooms, r->failed_frees);
  if (r->passes > 1)
    fprintf(out, "passes:           %u (frees of what a pass left live, before the next: %" PRIu64 ")\n", r->passes,
            r->pass_end_frees);
  for (int d = 0; d < r->n_devices; d++) {
    cachalot_device_stats st;
    if (cachalot_memory_stats(r->a, d, &st) != CACHALOT_OK)
      continue;
    uint64_t reserved = (uint64_t)st.reserved_bytes[CACHALOT_STAT_ALL].peak, requested = r->live[d].peak;
    fprintf(out, "device %d:\n", d);
    fprintf(out, "  peak requested:   %s (%" PRIu64 " B)\n", as_fmt_size(sz, requested, false), requested);
    fprintf(out, "  peak reserved:    %s (%" PRIu64 " B)\n", as_fmt_size(sz, reserved, false), reserved);
    if (r->passes > 1) {
      const struct first_pass *f = &r->first[d];
      char label[64];
      snprintf(label, sizeof label, "  reserved/requested peak ratio, %u passes:", r->passes);
      print_ratio(out, label, reserved, requested);
      print_ratio(out, "  reserved/requested peak ratio, first pass:", f->reserved_peak, f->requested_peak);
      fprintf(out, "  first pass:       peak reserved %s (%" PRIu64 " B), %" PRId64 " device allocs, %" PRId64
                   " device frees\n",
              as_fmt_size(sz, f->reserved_peak, false), f->reserved_peak, f->device_allocs, f->device_frees);
    } else {
      print_ratio(out, "  reserved/requested peak ratio:", reserved, requested);
    }
    const uint64_t floor = r->live[d].floor;
    fprintf(out,
            "  page floor:       %s (%" PRIu64 " pages of 2 MiB, small and large blocks apart); "
            "peak reserved %s%.1f pages from it\n",
            as_fmt_size(sz, floor, false), floor / FLOOR_PAGE, reserved >= floor ? "+" : "-",
            (double)(reserved >= floor ? reserved - floor : floor - reserved) / FLOOR_PAGE);
    fprintf(out, "  device allocs:    %" PRId64 "\n", st.num_device_alloc);
    fprintf(out, "  device frees:     %" PRId64 "\n", st.num_device_free);
    fprintf(out, "  alloc retries:    %" PRId64 "\n", st.num_alloc_retries);
    cachalot_plan_stats ps;
    if (cachalot_plan_stats_get(r->a, d, &ps) == CACHALOT_OK && ps.periods_found)
      fprintf(out,
              "  step plan:        %" PRId64 " periods found, %" PRId64 " plans formed, %" PRId64 " dropped; %" PRId64
              " mallocs served, %" PRId64 " missed, %" PRId64 " unplanned; %" PRId64 " clean laps, %" PRId64
              " device calls in force; footprint %" PRId64 " B\n",
              ps.periods_found, ps.plans_formed, ps.plans_dropped, ps.served, ps.missed, ps.unplanned, ps.laps_clean,
              ps.device_calls_in_force, ps.footprint);
    uint64_t recorded;
    if ((size_t)d < s->n_devices && trace_reserved_peak(&s->traces[d], &recorded)) {
      fprintf(out, "  recorded allocator's reserved peak (segment entries): %s (%" PRIu64 " B)\n",
              as_fmt_size(sz, recorded, false), recorded);
      print_ratio(out, "  recorded allocator's ratio:", recorded, requested);
    }
  }
  fprintf(out, "wall time:        %.3f s\n", seconds);
}

static int write_snapshot(replay *r, const char *path) {
  char *json = NULL;
  cachalot_status st = cachalot_snapshot_json(r->a, &json);
  if (st != CACHALOT_OK)
    return as_failure("replay", "cachalot_snapshot_json failed: %s: %s", cachalot_status_name(st),
                      cachalot_last_error());
  int rc = as_write_output("replay", path, json, strlen(json));
  free(json);
  return rc;
}

static int print_stats_json(replay *r) {
  if (r->n_devices > 1)
    fputs("[", stdout);
  for (int d = 0; d < r->n_devices; d++) {
    char *json = NULL;
    cachalot_status st = cachalot_memory_stats_json(r->a, d, &json);
    if (st != CACHALOT_OK)
      return as_failure("replay", "cachalot_memory_stats_json failed: %s: %s", cachalot_status_name(st),
                        cachalot_last_error());
    printf("%s%s", d ? ",\n" : "", json);
    free(json);
  }
  fputs(r->n_devices > 1 ? "]\n" : "\n", stdout);
  return 0;
}

/* ---- the command ---- */

enum { GO_ON = -1 }; /* what the steps below return when the command goes on */

typedef struct {
  const char *backend, *conf, *out_path, *path;
  uint64_t capacity;
  unsigned passes;
  bool sim, stats_json, snapshot_to_stdout;
} replay_args;

/* GO_ON, or the exit status (--help, a usage error). */
static int parse_args(int argc, char **argv, replay_args *a) {
  static const struct option longopts[] = {{"backend", required_argument, NULL, 'B'},
                                           {"conf", required_argument, NULL, 'c'},
                                           {"capacity", required_argument, NULL, 'C'},
                                           {"stats-json", no_argument, NULL, 'j'},
                                           {"passes", required_argument, NULL, 'P'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  bool capacity_given = false;
  for (int c; (c = as_getopt("replay", argc, argv, ":ho:", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("replay", AS_EXIT_OK);
    case 'B':
      if (strcmp(optarg, "sim") != 0 && strcmp(optarg, "cuda") != 0)
        return as_usage_error("replay", "--backend is sim or cuda, not '%s'", optarg);
      a->backend = optarg;
      break;
    case 'c':
      a->conf = optarg;
      break;
    case 'C':
      if (!as_parse_bytes(optarg, &a->capacity) || a->capacity == 0 || a->capacity > SIZE_MAX)
        return as_usage_error("replay", "--capacity wants a positive byte count such as 80G or 1048576, not '%s'",
                              optarg);
      capacity_given = true;
      break;
    case 'o':
      a->out_path = optarg;
      break;
    case 'j':
      a->stats_json = true;
      break;
    case 'P': {
      char *end = NULL;
      errno = 0;
      unsigned long n = strtoul(optarg, &end, 10);
      if (optarg[0] < '0' || optarg[0] > '9' || *end || errno || n < 1 || n > MAX_PASSES)
        return as_usage_error("replay", "--passes wants a count from 1 to %d, not '%s'", MAX_PASSES, optarg);
      a->passes = (unsigned)n;
      break;
    }
    default:
      return AS_EXIT_USAGE;
    }
  }
  int rc = as_one_operand("replay", "TRACE", argc, optind);
  if (rc != AS_EXIT_OK)
    return rc;
  a->sim = strcmp(a->backend, "sim") == 0;
  if (capacity_given && !a->sim)
    return as_usage_error("replay", "--capacity applies to the sim backend only");
  a->snapshot_to_stdout = a->out_path != NULL && strcmp(a->out_path, "-") == 0;
  if (a->snapshot_to_stdout && a->stats_json)
    return as_usage_error("replay", "-o - and --stats-json would both write JSON to standard output");
  a->path = argv[optind];
  return GO_ON;
}

/* Whether the allocations of s name more than MAX_STREAMS streams (other than 0): counted before the
 * replay, which would otherwise stop at the first one past the bound, after the work before it. */
static bool too_many_streams(const as_snapshot *s) {
  tw_map seen;
  if (!tw_map_init(&seen, 16))
    return false; /* (out of host memory: the replay's own count still holds) */
  bool over = false;
  for (size_t d = 0; d < s->n_devices && !over; d++)
    for (size_t i = 0; i < s->traces[d].n && !over; i++) {
      const as_trace_entry *e = &s->traces[d].entries[i];
      if (e->action != AS_ALLOC || e->stream == 0 || tw_map_find(&seen, (int)d, e->stream) != NULL)
        continue;
      if (tw_map_insert(&seen, (tw_live){.key = e->stream, .device = (int)d}) == NULL)
        break;
      over = seen.count > MAX_STREAMS;
    }
  tw_map_free(&seen);
  return over;
}

/* The backend, with r->n_devices devices at least. GO_ON, or the exit status. */
static int open_backend(replay *r, const replay_args *a) {
  cachalot_status st;
  if (a->sim) {
    if (r->n_devices > 64)
      return as_failure("replay", "%s: the trace has %d devices; the simulated backend has at most 64", a->path,
                        r->n_devices);
    cachalot_sim_options opt = {.device_count = r->n_devices, .capacity_bytes = (size_t)a->capacity,
                                .complete_immediately = true};
    st = cachalot_backend_sim(&opt, &r->b);
  } else {
    st = cachalot_backend_cuda(&r->b);
  }
  if (st != CACHALOT_OK) {
    char msg[AS_ERR_LEN];
    if (a->sim)
      snprintf(msg, sizeof msg, "%s", cachalot_last_error());
    else
      tool_cuda_hint(msg, sizeof msg, cachalot_last_error(), "--backend sim replays on a simulated device");
    return as_failure("replay", "cannot use the %s backend: %s", a->backend, msg);
  }
  int count = 0;
  if (cachalot_backend_device_count(r->b, &count) != CACHALOT_OK || count < r->n_devices)
    return as_failure("replay", "the trace uses %d devices; the %s backend has %d", r->n_devices, a->backend, count);
  return GO_ON;
}

/* Everything the replay of s needs: its devices, the backend, the allocator (recording its history for
 * -o) and the bookkeeping. GO_ON, or the exit status. */
static int set_up(replay *r, const replay_args *a, const as_snapshot *s) {
  size_t entries = 0;
  int last_device = -1;
  for (size_t d = 0; d < s->n_devices; d++)
    if (s->traces[d].n > 0) {
      entries += s->traces[d].n;
      last_device = (int)d;
    }
  if (entries == 0)
    return as_failure("replay", "%s: no trace entries (device_traces is empty: was history recorded?)", a->path);
  if (a->sim && too_many_streams(s))
    return as_failure("replay", "%s: the trace uses more than %d streams: refused before replaying", a->path,
                      MAX_STREAMS);
  r->n_devices = last_device + 1;
  int rc = open_backend(r, a);
  if (rc != GO_ON)
    return rc;
  cachalot_status st = cachalot_create(r->b, a->conf, &r->a);
  if (st == CACHALOT_ERROR_CONFIG)
    return as_usage_error("replay", "--conf: %s", cachalot_last_error());
  if (st != CACHALOT_OK)
    return as_failure("replay", "cannot create the allocator: %s: %s", cachalot_status_name(st), cachalot_last_error());
  if (a->out_path != NULL) {
    /* Room for the replay's own entries (alloc, free_requested, free_completed, segment_*) so the written
     * snapshot holds its whole trace. */
    size_t max_entries = entries > (SIZE_MAX - 4096) / 2 / a->passes ? SIZE_MAX / 2 : entries * 2 * a->passes + 4096;
    if (cachalot_record_history(r->a, true, max_entries) != CACHALOT_OK)
      return as_failure("replay", "cannot record history: %s", cachalot_last_error());
  }
  r->passes = a->passes;
  r->live = calloc((size_t)r->n_devices, sizeof *r->live);
  r->first = calloc((size_t)r->n_devices, sizeof *r->first);
  if (r->live == NULL || r->first == NULL || !tw_map_init(&r->streams, 16))
    return as_failure("replay", "out of host memory");
  return GO_ON;
}

/* The replay, timed, checked, and what it reports and writes. The exit status. */
static int run_and_report(replay *r, const replay_args *a, const as_snapshot *s) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = run_traces(r, s);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc != 0)
    return rc;
  double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  if (cachalot_check(r->a) != CACHALOT_OK)
    return as_failure("replay", "cachalot_check after the replay: %s", cachalot_last_error());
  print_summary(a->stats_json || a->snapshot_to_stdout ? stderr : stdout, r, s,
                strcmp(a->path, "-") == 0 ? "<stdin>" : a->path, a->backend, a->capacity, a->conf, seconds);
  if (a->out_path != NULL && (rc = write_snapshot(r, a->out_path)) != 0)
    return rc;
  return a->stats_json ? print_stats_json(r) : AS_EXIT_OK;
}

int as_cmd_replay(int argc, char **argv) {
  replay_args a = {.backend = "sim", .conf = "", .capacity = (uint64_t)80 << 30, .passes = 1};
  int rc = parse_args(argc, argv, &a);
  if (rc != GO_ON)
    return rc;
  as_snapshot s;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(a.path, &s, err) != 0)
    return as_failure("replay", "%s", err);
  replay r = {.sim = a.sim};
  rc = set_up(&r, &a, &s);
  if (rc == GO_ON)
    rc = run_and_report(&r, &a, &s);
  cachalot_destroy(r.a);
  cachalot_backend_destroy(r.b);
  tw_map_free(&r.streams);
  free(r.live);
  free(r.first);
  as_snapshot_free(&s);
  return as_finish_stdout("replay", rc);
}
