/* alloc_snapshot plot: the command. It writes the explorer (explorer.c), one self-contained HTML page of
 * a snapshot. OUT is written as common/outfile.h says: a regular file is replaced atomically, anything
 * else written through.
 *
 * --static, the script-free page of earlier versions, was removed when the explorer gained what only it
 * had (both peaks marked, the legends): it is refused with a message naming the explorer, so that a
 * script that passes it learns why instead of getting a page it did not ask for. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../common/outfile.h"
#include "../cli.h"
#include "plot.h"

static const char help[] =
    "usage: alloc_snapshot plot FILE -o OUT.html [--device N]\n"
    "\n"
    "Draws a memory snapshot (cachalot's or PyTorch's JSON, gzip'ed or not; '-' is stdin) as one\n"
    "self-contained HTML page (inline script and CSS, no library, nothing fetched; works from file://):\n"
    "  - allocated and reserved bytes over the trace, by entry order or (a toggle) wall time, with\n"
    "    both peaks, user_defined annotations, external_annotations ranges and OOMs marked, and a\n"
    "    legend of what each line and marker means;\n"
    "  - the active memory: every allocation a band from its alloc to its free, stacked, coloured by\n"
    "    stream, pool or annotation; the 1500 largest in view are bands, the rest one summed band;\n"
    "  - zoom (wheel, buttons, +/-) and pan (drag, arrow keys) over both;\n"
    "  - hover or click an allocation: its size, requested size, address, stream, pool, alloc and\n"
    "    free entries and its frames (the alloc entry's, and the block's in the snapshot);\n"
    "  - the segment map after any entry (click the timeline or move the slider): segments and their\n"
    "    blocks as they were then, reconstructed from the snapshot and the trace, in a scrolling panel,\n"
    "    with a legend of the block states.\n"
    "The view is in the URL hash (#t=ENTRY|end&sel=ENTRY&x0=X&x1=X&axis=time&color=pool&dev=N).\n"
    "--static, the script-free page of earlier versions, was removed: its peak markers and legends\n"
    "are in this page, and 'alloc_snapshot show FILE' prints the figures as text.\n"
    "\n"
    "options:\n"
    "  -o OUT.html   where to write the page (required; '-' is standard output); a regular file\n"
    "                is replaced atomically (written beside it, then renamed), anything else (a\n"
    "                device, a FIFO) is written through; a symbolic link stays a link\n"
    "  --device N    only device N (default: every device with segments or trace entries)\n"
    "  -h, --help    this text\n"
    "\n"
    "Exit status: 0 success, 1 unreadable or malformed file, nothing on the device, or OUT cannot be\n"
    "written, 2 usage error (--static among them).\n";

/* --- the command --- */

enum { GO_ON = -1 }; /* what parse_args returns when the command goes on */

typedef struct {
  const char *input, *input_name, *out;
  bool to_stdout, by_device;
  uint64_t device;
} plot_args;

/* GO_ON, or the exit status (--help, a usage error). */
static int parse_args(int argc, char **argv, plot_args *a) {
  static const struct option longopts[] = {{"output", required_argument, NULL, 'o'},
                                           {"device", required_argument, NULL, 'd'},
                                           {"help", no_argument, NULL, 'h'},
                                           {"static", no_argument, NULL, 's'}, /* removed: refused, with why */
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
      return as_usage_error("plot", "--static was removed: the page is the explorer, which now has the static "
                                    "page's peak markers and legends (drop --static; 'alloc_snapshot show FILE' "
                                    "prints the figures as text)");
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
  if (as_write_explorer(&p, a->input_name, snap, devices, n_devices) != 0)
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
  plot_args a = {NULL, NULL, NULL, false, false, 0};
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
