/* alloc_snapshot folded: who held the memory at its peak, as the folded stacks that flame-graph tools
 * read (flamegraph.pl, inferno, speedscope): one line per distinct call stack, "outer;...;inner BYTES".
 *
 * The peak is found by walking the trace as replay and summary do (trace_walk.h), then the walk is run
 * again to that step to see what was live. Memory allocated before the trace began (a ring buffer that
 * wrapped) counts as well, so that the lines add up to everything the program held then: it is the
 * allocations whose frees come after the peak without their allocs, and the blocks allocated at the
 * snapshot's end that the trace never allocated. Only the first have no place in time of their own;
 * both are live through the whole trace up to their frees, so they do not move the peak. Unlike
 * summary, a damaged trace's second free of such an address is ignored: the block was held once. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plot/intern.h"
#include "../common/bytes.h"
#include "../common/snapshot_reader.h"
#include "../common/trace_walk.h"

static const char help[] =
    "usage: alloc_snapshot folded FILE [-o OUT] [--device N]\n"
    "\n"
    "Who held the memory at its peak, as folded stacks: one line per call stack,\n"
    "'outermost;...;innermost BYTES', the text that flame-graph tools read (flamegraph.pl,\n"
    "inferno-flamegraph, speedscope). Equal stacks are summed; lines are sorted.\n"
    "\n"
    "The peak is the first moment of the trace (its entries in time order, as replay walks them)\n"
    "at which the most bytes were live: the sizes the program asked for, over the devices counted.\n"
    "Live then, and so in the lines, which add up to the peak:\n"
    "  - each allocation the trace made and had not freed, under its alloc entry's frames\n"
    "    ('[no stack]' when it has none: history recorded without stacks);\n"
    "  - each allocation made before the trace began (a ring buffer that wrapped) and freed after\n"
    "    the peak, under '[allocated before the trace]';\n"
    "  - each block allocated at the snapshot's end that the trace never allocated, under its own\n"
    "    frames (else the same placeholder).\n"
    "A snapshot without trace entries gives the blocks allocated at its end.\n"
    "A frame is 'name (file:line)', 'name (file)' without a line, 'name' without a file. A ';' in\n"
    "it becomes ':' and a control character a space, so that each line stays one stack. Without\n"
    "--device each stack begins with a 'device N' frame.\n"
    "One line says where the peak is and what it holds: on standard error when OUT is standard\n"
    "output, else on standard output.\n"
    "\n"
    "options:\n"
    "  -o, --output OUT  where to write (default '-', standard output); a regular file is replaced\n"
    "                    atomically, anything else written through\n"
    "  --device N        only device N's allocations, and its own peak\n"
    "  -h, --help        this text\n"
    "\n"
    "Example: alloc_snapshot folded snap.json -o snap.folded && flamegraph.pl --countname bytes\n"
    "         snap.folded >snap.svg\n"
    "\n"
    "Exit status: 0 success, 1 unreadable or malformed file, or --device names a device with nothing\n"
    "on it, 2 usage error.\n";

/* The distinct stacks and the bytes live under each. A host allocation failure sets oom and makes the
 * rest inert. */
typedef struct {
  as_intern frames; /* each frame's text as printed */
  as_intern stacks; /* each stack as its frames' indices, outermost first */
  uint64_t *bytes;  /* per stack */
  size_t cap_bytes;
  uint64_t total;
  size_t allocations;
  bool device_frame; /* each stack begins with "device N" */
  bool oom;
  as_bytes text;  /* scratch: the frame being named */
  uint64_t *path; /* scratch: the stack being built */
  size_t cap_path;
} stack_table;

/* Appends `s` with ';' made ':' (as flamegraph's stackcollapse scripts do) and control characters made
 * spaces: either would split a line. */
static void put_clean(as_bytes *b, const char *s) {
  for (; *s; s++) {
    char c = *s == ';' ? ':' : ((unsigned char)*s < 0x20 || *s == 0x7f) ? ' ' : *s;
    as_bytes_put(b, &c, 1);
  }
}

/* Frames are interned by their printed text, so that a stack is a short array of indices and equal
 * stacks meet in one entry of t->stacks however many allocations share them. -1 on host OOM. */
static long frame_index(stack_table *t, const char *name, const char *file, uint64_t line) {
  t->text.len = 0;
  put_clean(&t->text, name[0] ? name : "??");
  if (file != NULL && file[0]) {
    char num[32] = "";
    if (line > 0)
      snprintf(num, sizeof num, ":%" PRIu64, line);
    as_bytes_put(&t->text, " (", 2);
    put_clean(&t->text, file);
    as_bytes_put(&t->text, num, strlen(num));
    as_bytes_put(&t->text, ")", 2); /* with the NUL */
  } else {
    as_bytes_put(&t->text, "", 1);
  }
  return t->text.oom ? -1 : as_intern_string(&t->frames, (const char *)t->text.buf);
}

static bool push_frame(stack_table *t, size_t *n, long index) {
  if (index < 0)
    return false;
  if (*n == t->cap_path) {
    size_t cap = t->cap_path ? t->cap_path * 2 : 64;
    uint64_t *p = realloc(t->path, cap * sizeof *p);
    if (p == NULL)
      return false;
    t->path = p;
    t->cap_path = cap;
  }
  t->path[(*n)++] = (uint64_t)index;
  return true;
}

/* Snapshots list frames innermost first and folded lines read outermost first, hence the reversed walk;
 * an allocation without frames still takes its place in the total, under `placeholder`. */
static void add_allocation(stack_table *t, int device, const cJSON *frames, const char *placeholder,
                           uint64_t bytes) {
  if (t->oom || bytes == 0)
    return;
  size_t n = 0;
  bool ok = true;
  if (t->device_frame) {
    char dev[32];
    snprintf(dev, sizeof dev, "device %d", device);
    ok = push_frame(t, &n, frame_index(t, dev, NULL, 0));
  }
  const int n_frames = frames ? cJSON_GetArraySize(frames) : 0;
  for (int i = n_frames - 1; ok && i >= 0; i--) {
    const as_frame f = as_frame_get(cJSON_GetArrayItem(frames, i));
    ok = push_frame(t, &n, frame_index(t, f.name, f.filename, f.line));
  }
  if (ok && n_frames == 0)
    ok = push_frame(t, &n, frame_index(t, placeholder, NULL, 0));
  const long k = ok ? as_intern_words(&t->stacks, t->path, n) : -1;
  if (k >= 0 && (size_t)k >= t->cap_bytes) {
    size_t cap = t->cap_bytes ? t->cap_bytes * 2 : 256;
    uint64_t *b = realloc(t->bytes, cap * sizeof *b);
    if (b != NULL) {
      memset(b + t->cap_bytes, 0, (cap - t->cap_bytes) * sizeof *b);
      t->bytes = b;
      t->cap_bytes = cap;
    }
  }
  if (k < 0 || (size_t)k >= t->cap_bytes) {
    t->oom = true;
    return;
  }
  t->bytes[k] = as_sat_add(t->bytes[k], bytes);
  t->total = as_sat_add(t->total, bytes);
  t->allocations++;
}

typedef struct {
  const as_snapshot *snap;
  bool by_device;
  int device;
  size_t entries;    /* trace entries of the devices counted */
  size_t peak_steps; /* walk steps taken when the peak was reached; 0: before the first */
  tw_step at;        /* the step that reached it */
} peak_walk;

static bool counted(const peak_walk *p, int device) { return !p->by_device || device == p->device; }

/* The live bytes as the walk goes: allocations before the trace are not known yet, so frees of them
 * take it below zero (the peak is the same moment either way). Saturates, for hostile files. */
static int64_t move(int64_t live, uint64_t size, bool up) {
  const int64_t d = size > INT64_MAX ? INT64_MAX : (int64_t)size;
  if (up)
    return live > INT64_MAX - d ? INT64_MAX : live + d;
  return live < INT64_MIN + d ? INT64_MIN : live - d;
}

/* Whether an unknown free is the first of its (device, addr) in the walk, recording it in *seen: a
 * block from before the trace is freed once, so a damaged trace's second free of it is no memory of
 * its own, and counting it again would move the peak and count the block twice. 1 or 0, or -1 on host
 * OOM. */
static int first_unknown_free(tw_map *seen, const tw_step *st) {
  if (tw_map_find(seen, st->device, st->e->addr) != NULL)
    return 0;
  return tw_map_insert(seen, (tw_live){.key = st->e->addr, .device = st->device}) != NULL ? 1 : -1;
}

/* The first pass only finds the peak: what was live there is known only once the walk has reached it,
 * and copying the live set at each new high would cost a copy per high. 0, or -1 on host OOM. */
static int find_peak(peak_walk *p) {
  tw_walk w;
  tw_map seen;
  if (!tw_map_init(&seen, 64))
    return -1;
  if (tw_begin(&w, p->snap->traces, p->snap->n_devices) != 0) {
    tw_map_free(&seen);
    return -1;
  }
  int64_t live = 0, best = 0;
  size_t steps = 0;
  tw_step st;
  int more;
  while ((more = tw_next(&w, &st)) > 0) {
    steps++;
    if (!counted(p, st.device))
      continue;
    p->entries += st.kind != TW_IMPLICIT_FREE;
    if (st.kind == TW_ALLOC) {
      live = move(live, st.e->size, true);
    } else if (st.kind == TW_FREE || st.kind == TW_IMPLICIT_FREE) {
      live = move(live, st.live->size, false);
    } else if (st.kind == TW_UNKNOWN_FREE) {
      const int first = first_unknown_free(&seen, &st);
      if (first < 0) {
        more = -1;
        break;
      }
      if (first)
        live = move(live, st.e->size, false);
    }
    if (live > best) {
      best = live;
      p->peak_steps = steps;
      p->at = st;
    }
  }
  tw_end(&w);
  tw_map_free(&seen);
  return more < 0 ? -1 : 0;
}

/* The second pass walks to the peak again to see what was live there, into t; past it, the first
 * frees of blocks from before the trace tell what else was. The unknown frees before the peak are
 * recorded too, so that a second free of one of them after it is not counted. 0, or -1 on host OOM. */
static int collect(const peak_walk *p, stack_table *t) {
  const as_snapshot *s = p->snap;
  tw_walk w;
  tw_map seen;
  if (!tw_map_init(&seen, 64))
    return -1;
  if (tw_begin(&w, s->traces, s->n_devices) != 0) {
    tw_map_free(&seen);
    return -1;
  }
  size_t steps = 0;
  tw_step st;
  int more;
  while ((more = tw_next(&w, &st)) > 0) {
    steps++;
    if (st.kind == TW_ALLOC)
      st.live->tag = st.index; /* its alloc entry, for the frames */
    if (steps == p->peak_steps) {
      size_t pos = 0;
      for (const tw_live *v; (v = tw_map_next(&w.live, &pos)) != NULL;)
        if (counted(p, v->device))
          add_allocation(t, v->device, s->traces[v->device].entries[v->tag].frames, "[no stack]", v->size);
    } else if (st.kind == TW_UNKNOWN_FREE && counted(p, st.device)) {
      const int first = first_unknown_free(&seen, &st);
      if (first < 0) {
        more = -1;
        break;
      }
      if (first && steps > p->peak_steps)
        add_allocation(t, st.device, NULL, "[allocated before the trace]", st.e->size);
    }
  }
  /* The walk now holds what the trace left live: an allocated block it does not hold came before it. */
  for (size_t i = 0; more == 0 && i < s->n_segments; i++) {
    const as_segment *seg = &s->segments[i];
    for (size_t k = 0; counted(p, seg->device) && k < seg->n_blocks; k++) {
      const as_block *b = &seg->blocks[k];
      if (b->state == AS_ACTIVE_ALLOCATED && tw_map_find(&w.live, seg->device, b->address) == NULL)
        add_allocation(t, seg->device, b->frames, "[allocated before the trace]",
                       b->requested_size ? b->requested_size : b->size);
    }
  }
  tw_end(&w);
  tw_map_free(&seen);
  return more < 0 ? -1 : 0;
}

/* A line of fold()'s text, sorted as a record rather than as a string of its own: a buffer per line
 * would cost as_bytes' first 64 KiB each. */
typedef struct {
  const char *s;
  size_t len; /* with its '\n' */
} line_ref;

/* strcmp's order (flame-graph tools do not care, but the goldens and diffs of two runs do): no line
 * holds a NUL or an inner '\n', so a line that is a prefix of another is the same line. */
static int cmp_lines(const void *pa, const void *pb) {
  const line_ref *a = pa, *b = pb;
  const int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
  return c != 0 ? c : a->len < b->len ? -1 : a->len > b->len;
}

/* Appends stack k's line, "frame;frame BYTES\n", to *text. */
static void put_stack_line(const stack_table *t, size_t k, as_bytes *text) {
  size_t n;
  const uint64_t *path = as_intern_key(&t->stacks, k, &n);
  for (size_t i = 0; i < n; i++) {
    size_t m;
    const uint64_t *words = as_intern_key(&t->frames, (size_t)path[i], &m);
    if (i > 0)
      as_bytes_put(text, ";", 1);
    as_bytes_put(text, words + 1, (size_t)words[0]); /* an interned string: its length, then its bytes */
  }
  char count[32];
  snprintf(count, sizeof count, " %" PRIu64 "\n", t->bytes[k]);
  as_bytes_put(text, count, strlen(count));
}

/* The sorted lines into *out (free its buf). The lines are written once into one buffer and sorted as
 * (start, length) records, so that the memory is about twice the output's. False on host OOM. */
static bool fold(const stack_table *t, as_bytes *out) {
  const size_t n = t->stacks.n;
  as_bytes text = {0};
  size_t *ends = malloc((n ? n : 1) * sizeof *ends); /* the buffer moves as it grows: offsets until done */
  line_ref *lines = malloc((n ? n : 1) * sizeof *lines);
  bool ok = ends != NULL && lines != NULL;
  for (size_t k = 0; ok && k < n; k++) {
    put_stack_line(t, k, &text);
    ends[k] = text.len;
    ok = !text.oom;
  }
  for (size_t k = 0; ok && k < n; k++) {
    const size_t start = k ? ends[k - 1] : 0;
    lines[k] = (line_ref){(const char *)text.buf + start, ends[k] - start};
  }
  if (ok)
    qsort(lines, n, sizeof *lines, cmp_lines);
  for (size_t k = 0; ok && k < n; k++)
    as_bytes_put(out, lines[k].s, lines[k].len);
  free(text.buf);
  free(ends);
  free(lines);
  return ok && !out->oom;
}

/* Where the peak is, so that a reader can find it in plot or replay, and what it holds, so that the
 * lines can be checked against it. */
static void say_peak(FILE *f, const peak_walk *p, const stack_table *t) {
  char size[AS_SIZE_BUF], exact[AS_SIZE_BUF + 8] = "";
  if (t->total >= 1024)
    snprintf(exact, sizeof exact, " (%" PRIu64 " B)", t->total);
  fprintf(f, "peak: %s%s live in %zu allocation%s, %zu stack%s; ", as_fmt_size(size, t->total, false), exact,
          t->allocations, t->allocations == 1 ? "" : "s", t->stacks.n, t->stacks.n == 1 ? "" : "s");
  if (p->entries == 0)
    fprintf(f, "no trace entries: the blocks allocated at the snapshot's end\n");
  else if (p->peak_steps == 0)
    fprintf(f, "before the first trace entry (the trace only frees what was allocated before it)\n");
  else
    fprintf(f, "after entry %zu of device %d (%s, time_us %" PRIu64 ")\n", p->at.index, p->at.device,
            as_action_name(p->at.e->action), p->at.e->time_us);
}

/* A --device with nothing on it is more likely a wrong number than an empty answer: run reports it. */
static bool device_present(const as_snapshot *s, int device) {
  for (size_t i = 0; i < s->n_segments; i++)
    if (s->segments[i].device == device)
      return true;
  return (size_t)device < s->n_devices && s->traces[device].n > 0;
}

static int run(const char *path, const char *out, bool by_device, int device) {
  as_snapshot s;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(path, &s, err) != 0)
    return as_failure("folded", "%s", err);
  const char *name = strcmp(path, "-") == 0 ? "<stdin>" : path;
  int status = AS_EXIT_OK;
  peak_walk p = {.snap = &s, .by_device = by_device, .device = device};
  stack_table t = {.device_frame = !by_device};
  as_bytes text = {0};
  if (by_device && !device_present(&s, device))
    status = as_failure("folded", "%s: device %d has no segments and no trace entries", name, device);
  else if (find_peak(&p) != 0 || collect(&p, &t) != 0 || t.oom || !fold(&t, &text))
    status = as_failure("folded", "%s: out of host memory", name);
  if (status == AS_EXIT_OK)
    status = as_write_file("folded", out, text.buf ? (const char *)text.buf : "", text.len, false);
  if (status == AS_EXIT_OK)
    say_peak(strcmp(out, "-") == 0 ? stderr : stdout, &p, &t);
  free(text.buf);
  free(t.text.buf);
  free(t.path);
  free(t.bytes);
  as_intern_free(&t.frames);
  as_intern_free(&t.stacks);
  as_snapshot_free(&s);
  return as_finish_stdout("folded", status);
}

int as_cmd_folded(int argc, char **argv) {
  static const struct option longopts[] = {{"output", required_argument, NULL, 'o'},
                                           {"device", required_argument, NULL, 'd'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  const char *out = "-";
  bool by_device = false;
  uint64_t device = 0;
  for (int c; (c = as_getopt("folded", argc, argv, ":ho:", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("folded", AS_EXIT_OK);
    case 'o':
      if (optarg[0] == '\0')
        return as_usage_error("folded", "-o wants a file name ('-' for standard output), not an empty string");
      out = optarg;
      break;
    case 'd':
      if (!as_parse_u64(optarg, AS_MAX_DEVICE, &device))
        return as_usage_error("folded", "--device wants a device index from 0 to %d, not '%s'", AS_MAX_DEVICE,
                              optarg);
      by_device = true;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  int rc = as_one_operand("folded", "FILE", argc, optind);
  if (rc != AS_EXIT_OK)
    return rc;
  return run(argv[optind], out, by_device, (int)device);
}
