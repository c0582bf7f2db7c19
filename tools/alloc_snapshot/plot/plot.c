/* alloc_snapshot plot: the command, and its static page (--static): one self-contained HTML page of a
 * snapshot, per device a summary, the memory over time from the device trace (chart.c) and the segment
 * map (segmap.c). The default page, the explorer, is explorer.c's.
 *
 * The page needs nothing else: inline CSS, inline SVG, no script, no font or image files, no link to
 * anything; tooltips are SVG <title> elements. Every text that comes from the input (the file name, the
 * allocator's config string) is escaped. OUT is written as common/outfile.h says: a regular file is
 * replaced atomically, anything else written through. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/outfile.h"
#include "../cli.h"
#include "../summary.h"
#include "plot.h"
#include "text.h" /* src/common/: the HTML escaper */

static const char help[] =
    "usage: alloc_snapshot plot FILE -o OUT.html [--device N] [--static]\n"
    "\n"
    "Draws a memory snapshot (cachalot's or PyTorch's JSON, gzip'ed or not; '-' is stdin) as one\n"
    "self-contained HTML page (inline script and CSS, no library, nothing fetched; works from file://):\n"
    "  - allocated and reserved bytes over the trace, by entry order or (a toggle) wall time, with\n"
    "    user_defined annotations, external_annotations ranges and OOMs marked;\n"
    "  - the active memory: every allocation a band from its alloc to its free, stacked, coloured by\n"
    "    stream, pool or annotation; the 1500 largest in view are bands, the rest one summed band;\n"
    "  - zoom (wheel, buttons, +/-) and pan (drag, arrow keys) over both;\n"
    "  - hover or click an allocation: its size, requested size, address, stream, pool, alloc and\n"
    "    free entries and its frames (the alloc entry's, and the block's in the snapshot);\n"
    "  - the segment map after any entry (click the timeline or move the slider): segments and their\n"
    "    blocks as they were then, reconstructed from the snapshot and the trace, in a scrolling panel.\n"
    "The view is in the URL hash (#t=ENTRY|end&sel=ENTRY&x0=X&x1=X&axis=time&color=pool&dev=N).\n"
    "With --static, the page of earlier versions: no script; per device a summary, the memory over\n"
    "time as SVG (peaks marked, downsampled keeping every pixel column's extremes) and the segment map\n"
    "(at most the 2000 largest segments; hovering a block shows its address, size and requested size).\n"
    "\n"
    "options:\n"
    "  -o OUT.html   where to write the page (required; '-' is standard output); a regular file\n"
    "                is replaced atomically (written beside it, then renamed), anything else (a\n"
    "                device, a FIFO) is written through; a symbolic link stays a link\n"
    "  --device N    only device N (default: every device with segments or trace entries)\n"
    "  --static      the static page (inline SVG, no script) instead of the explorer\n"
    "  -h, --help    this text\n"
    "\n"
    "Exit status: 0 success, 1 unreadable or malformed file, nothing on the device, or OUT cannot be\n"
    "written, 2 usage error.\n";

/* --- one device --- */

static void summary_table(page *p, const as_segment *const *segs, size_t n, const as_device_trace *t,
                          const series *s) {
  uint64_t reserved = 0, by_state[3] = {0, 0, 0}, requested = 0, blocks = 0;
  for (size_t i = 0; i < n; i++) {
    reserved = as_sat_add(reserved, segs[i]->total_size);
    requested = as_sat_add(requested, segs[i]->requested_size);
    blocks = as_sat_add(blocks, segs[i]->n_blocks);
    for (size_t k = 0; k < segs[i]->n_blocks; k++)
      by_state[segs[i]->blocks[k].state] = as_sat_add(by_state[segs[i]->blocks[k].state], segs[i]->blocks[k].size);
  }
  as_out(p, "<table class=\"sum\"><tr><th>segments</th><th>blocks</th><th>reserved</th><th>active_allocated</th>"
            "<th>active_pending_free</th><th>inactive</th><th>requested</th><th>trace entries</th>"
            "<th>trace peak allocated</th><th>trace peak reserved</th></tr>\n<tr>");
  as_out(p, "<td>%zu</td><td>%" PRIu64 "</td><td>", n, blocks);
  as_size_text(p, reserved);
  for (int st = 0; st < 3; st++) {
    as_out(p, "</td><td>");
    as_size_text(p, by_state[st]);
  }
  as_out(p, "</td><td>");
  as_size_text(p, requested);
  as_out(p, "</td><td>%zu</td><td>", t != NULL ? t->n : 0);
  if (s->empty)
    as_out(p, "-</td><td>-");
  else {
    as_size_text(p, s->peak_alloc);
    as_out(p, "</td><td>");
    as_size_text(p, s->peak_reserved);
  }
  as_out(p, "</td></tr></table>\n");
}

static int cmp_segments(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  as_group_key ka = as_segment_key(a), kb = as_segment_key(b);
  int c = as_key_cmp(&ka, &kb);
  return c ? c : a->address < b->address ? -1 : a->address > b->address;
}

static int cmp_largest_first(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  if (a->total_size != b->total_size)
    return a->total_size > b->total_size ? -1 : 1;
  return cmp_segments(pa, pb);
}

/* 0, or -1 on host OOM. */
static int device_section(page *p, const as_snapshot *snap, int device) {
  size_t n = 0;
  for (size_t i = 0; i < snap->n_segments; i++)
    n += snap->segments[i].device == device;
  const as_segment **segs = malloc((n ? n : 1) * sizeof *segs);
  if (segs == NULL)
    return -1;
  n = 0;
  for (size_t i = 0; i < snap->n_segments; i++)
    if (snap->segments[i].device == device)
      segs[n++] = &snap->segments[i];
  qsort(segs, n, sizeof *segs, cmp_segments);
  const as_device_trace *t = (size_t)device < snap->n_devices ? &snap->traces[device] : NULL;
  series s;
  if (as_build_series(t, &s) != 0) {
    as_series_free(&s);
    free(segs);
    return -1;
  }
  as_out(p, "<section>\n<h2>Device %d</h2>\n", device);
  summary_table(p, segs, n, t, &s);
  as_out(p, "<h3>Memory over time</h3>\n");
  if (s.empty) {
    if (t == NULL)
      as_out(p, "<p class=\"empty\">The snapshot has no trace for device %d (its device_traces list has %zu entr%s).",
             device, snap->n_devices, snap->n_devices == 1 ? "y" : "ies");
    else
      as_out(p, "<p class=\"empty\">The trace of device %d is empty: memory history was not being recorded when the "
                "snapshot was taken.",
             device);
    as_out(p, " Record it with <code>torch.cuda.memory._record_memory_history()</code> in PyTorch or "
              "<code>cachalot_record_history()</code> in cachalot before taking the snapshot.</p>\n");
  } else {
    as_chart_legend(p);
    as_chart(p, t, &s, device);
    as_trace_notes(p, t, &s, segs, n);
  }
  as_out(p, "<h3>Segment map</h3>\n");
  size_t n_shown = n;
  uint64_t omitted = 0;
  if (n > MAX_MAP_SEGMENTS) {
    /* The largest MAX_MAP_SEGMENTS, back in map order. */
    qsort(segs, n, sizeof *segs, cmp_largest_first);
    for (size_t i = MAX_MAP_SEGMENTS; i < n; i++)
      omitted = as_sat_add(omitted, segs[i]->total_size);
    n_shown = MAX_MAP_SEGMENTS;
    qsort(segs, n_shown, sizeof *segs, cmp_segments);
  }
  as_segment_map(p, segs, n_shown, n, omitted, device);
  as_out(p, "</section>\n");
  as_series_free(&s);
  free(segs);
  return 0;
}

static const char css[] =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:18px 24px;"
    "color:#1d2126;background:#fff}\n"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:18px;margin:26px 0 8px;padding-bottom:3px;"
    "border-bottom:2px solid #d5d9df}h3{font-size:15px;margin:18px 0 4px}\n"
    "p{margin:4px 0;max-width:1320px}.meta,.note{color:#4b5360;font-size:13px}\n"
    "code,.mono{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace}code{font-size:12.5px}\n"
    "table.sum{border-collapse:collapse;font-size:13px;margin:6px 0}table.sum th{font-weight:600;color:#4b5360;"
    "text-align:right;padding:2px 10px;border-bottom:1px solid #d5d9df}table.sum td{text-align:right;"
    "padding:2px 10px;font-variant-numeric:tabular-nums}\n"
    ".legend{list-style:none;padding:0;margin:6px 0;display:flex;flex-wrap:wrap;gap:6px 22px;font-size:13px}\n"
    ".sw{display:inline-block;width:14px;height:12px;border:1px solid #5f6672;vertical-align:-2px;margin-right:6px}\n"
    ".ln{display:inline-block;width:22px;height:3px;vertical-align:3px;margin-right:6px}\n"
    ".empty{padding:12px 14px;background:#f6f7f9;border:1px dashed #b9bfc8;color:#333}\n"
    "svg{display:block;margin:4px 0}svg text{font-family:system-ui,-apple-system,'Segoe UI',Roboto,"
    "'DejaVu Sans',sans-serif}svg text.mono{font-family:ui-monospace,'DejaVu Sans Mono',Menlo,Consolas,monospace}\n"
    "svg rect.b:hover{stroke:#000;stroke-width:1.5}\n"
    "footer{margin-top:28px;color:#6b7380;font-size:12px}\n";

static int write_page(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices) {
  as_out(p, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>memory snapshot: ");
  cl_html_fput(p->f, input);
  as_out(p, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>Memory snapshot: <span class=\"mono\">", css);
  cl_html_fput(p->f, input);
  size_t blocks = 0, entries = 0;
  for (size_t i = 0; i < snap->n_segments; i++)
    blocks += snap->segments[i].n_blocks;
  for (size_t d = 0; d < snap->n_devices; d++)
    entries += snap->traces[d].n;
  as_out(p, "</span></h1>\n<p class=\"meta\">%zu segment%s, %zu block%s, %zu trace entr%s; allocator settings: ",
         snap->n_segments, snap->n_segments == 1 ? "" : "s", blocks, blocks == 1 ? "" : "s", entries,
         entries == 1 ? "y" : "ies");
  as_out_settings(p, snap);
  if (n_devices > 1 || (n_devices == 1 && snap->n_segments + entries > 0))
    as_out(p, "; device%s shown: ", n_devices == 1 ? "" : "s");
  for (size_t i = 0; i < n_devices; i++)
    as_out(p, "%s%d", i ? ", " : "", devices[i]);
  as_out(p, ".</p>\n");
  if (n_devices == 0)
    as_out(p, "<p class=\"empty\">The snapshot holds no segments and no trace entries: nothing to draw.</p>\n");
  for (size_t i = 0; i < n_devices; i++)
    if (device_section(p, snap, devices[i]) != 0)
      return -1;
  as_out(p, "<footer>Made by <code>alloc_snapshot plot</code>. This page is self-contained: inline SVG and CSS, "
            "no script, nothing fetched.</footer>\n</body>\n</html>\n");
  return 0;
}

/* --- the command --- */

enum { GO_ON = -1 }; /* what parse_args returns when the command goes on */

typedef struct {
  const char *input, *input_name, *out;
  bool to_stdout, by_device, static_page;
  uint64_t device;
} plot_args;

/* GO_ON, or the exit status (--help, a usage error). */
static int parse_args(int argc, char **argv, plot_args *a) {
  static const struct option longopts[] = {{"output", required_argument, NULL, 'o'},
                                           {"device", required_argument, NULL, 'd'},
                                           {"help", no_argument, NULL, 'h'},
                                           {"static", no_argument, NULL, 's'},
                                           {0}};
  for (int c; (c = as_getopt("plot", argc, argv, ":ho:", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("plot", AS_EXIT_OK);
    case 'o':
      if (optarg[0] == '\0')
        return as_usage_error("plot", "-o wants a file name, not an empty string");
      a->out = optarg;
      break;
    case 's':
      a->static_page = true;
      break;
    case 'd':
      if (!as_parse_u64(optarg, AS_MAX_DEVICE, &a->device))
        return as_usage_error("plot", "--device wants a device index from 0 to %d, not '%s'", AS_MAX_DEVICE, optarg);
      a->by_device = true;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  int rc = as_one_operand("plot", "FILE", argc, optind);
  if (rc != AS_EXIT_OK)
    return rc;
  if (a->out == NULL)
    return as_usage_error("plot", "no output given: -o OUT.html");
  a->input = argv[optind];
  a->input_name = strcmp(a->input, "-") == 0 ? "<stdin>" : a->input;
  a->to_stdout = strcmp(a->out, "-") == 0;
  return GO_ON;
}

/* GO_ON, or the exit status when OUT is the input file or a directory. */
static int check_output(const plot_args *a) {
  struct stat in_st, out_st;
  if (!a->to_stdout && strcmp(a->input, "-") != 0 && stat(a->input, &in_st) == 0 && stat(a->out, &out_st) == 0 &&
      in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
    return as_usage_error("plot", "-o %s is the input file: it would be overwritten", a->out);
  if (!a->to_stdout && stat(a->out, &out_st) == 0 && S_ISDIR(out_st.st_mode))
    return as_failure("plot", "%s: cannot write the output: it is a directory", a->out);
  return GO_ON;
}

/* The devices to draw into devices[], in order: those with segments or trace entries (only --device's
 * when given). GO_ON, or the exit status when --device names one with neither. */
static int pick_devices(const as_snapshot *snap, const plot_args *a, int devices[AS_MAX_DEVICE + 1], size_t *n) {
  static bool present[AS_MAX_DEVICE + 1];
  memset(present, 0, sizeof present);
  for (size_t i = 0; i < snap->n_segments; i++)
    present[snap->segments[i].device] = true;
  for (size_t d = 0; d < snap->n_devices && d <= AS_MAX_DEVICE; d++)
    if (snap->traces[d].n > 0)
      present[d] = true;
  *n = 0;
  for (int d = 0; d <= AS_MAX_DEVICE; d++)
    if (present[d] && (!a->by_device || (uint64_t)d == a->device))
      devices[(*n)++] = d;
  if (!a->by_device || *n > 0)
    return GO_ON;
  char list[256] = "";
  size_t len = 0;
  for (int d = 0; d <= AS_MAX_DEVICE && len + 16 < sizeof list; d++)
    if (present[d])
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", d);
  return as_failure("plot", "%s: device %" PRIu64 " has no segments and no trace entries (%s%s)", a->input_name,
                    a->device, len ? "devices in the file: " : "", len ? list : "the file holds nothing on any device");
}

/* Writes the page to OUT and says so; the exit status. */
static int write_output(const plot_args *a, const as_snapshot *snap, const int *devices, size_t n_devices) {
  tool_out o = {0};
  char why[256];
  if (!a->to_stdout && tool_out_open(&o, a->out, why, sizeof why) != 0)
    return as_failure("plot", "%s: cannot create the output: %s", a->out, why);
  page p = {a->to_stdout ? stdout : o.f};
  int status = AS_EXIT_OK;
  if ((a->static_page ? write_page(&p, a->input_name, snap, devices, n_devices)
                      : as_write_explorer(&p, a->input_name, snap, devices, n_devices)) != 0)
    status = as_failure("plot", "out of host memory");
  if (a->to_stdout)
    return as_finish_stdout("plot", status);
  if (tool_out_close(&o, status == AS_EXIT_OK, why, sizeof why) != 0)
    return status != AS_EXIT_OK ? status : as_failure("plot", "%s: cannot write the output: %s", a->out, why);
  printf("wrote %s (", a->out);
  if (n_devices == 0)
    printf("nothing on any device");
  for (size_t i = 0; i < n_devices; i++)
    printf("%s%d", i ? ", " : n_devices == 1 ? "device " : "devices ", devices[i]);
  printf(")\n");
  return as_finish_stdout("plot", AS_EXIT_OK);
}

int as_cmd_plot(int argc, char **argv) {
  plot_args a = {NULL, NULL, NULL, false, false, false, 0};
  int rc = parse_args(argc, argv, &a);
  if (rc == GO_ON)
    rc = check_output(&a);
  if (rc != GO_ON)
    return rc;
  as_snapshot snap;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(a.input, &snap, err) != 0)
    return as_failure("plot", "%s", err);
  int devices[AS_MAX_DEVICE + 1];
  size_t n_devices = 0;
  rc = pick_devices(&snap, &a, devices, &n_devices);
  if (rc == GO_ON)
    rc = write_output(&a, &snap, devices, n_devices);
  as_snapshot_free(&snap);
  return rc;
}
