/* alloc_snapshot segments: the segments of a snapshot, filtered, as a JSON array of the file's own
 * segment objects (one per line, so grep and line-based tools work on the output too). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../common/json_copy.h"
#include "../common/snapshot_reader.h"

static const char help[] =
    "usage: alloc_snapshot segments FILE [--device N] [--pool A,B] [--stream S]\n"
    "\n"
    "Prints the segments of a snapshot (cachalot's or PyTorch's JSON, gzip'ed or not; '-' is stdin)\n"
    "as a JSON array, one segment object per line, in the file's order and exactly as the file has\n"
    "them (blocks, frames and any other keys included). The filters combine (all must match):\n"
    "\n"
    "  --device N    segments of device N\n"
    "  --pool A,B    segments of pool id [A, B] (segment_pool_id; 0,0 is the default pools)\n"
    "  --stream S    segments of stream S (the integer stream handle of the file; 0 the default stream)\n"
    "  -h, --help    this text\n"
    "\n"
    "Exit status: 0 success (also when nothing matches: the output is []), 1 unreadable or malformed\n"
    "file, 2 usage error.\n";

/* "A,B" with two non-negative integers. */
static bool parse_pool(const char *text, uint64_t pool[2]) {
  const char *comma = strchr(text, ',');
  if (comma == NULL || (size_t)(comma - text) >= 24)
    return false;
  char first[24];
  memcpy(first, text, (size_t)(comma - text));
  first[comma - text] = '\0';
  return as_parse_u64(first, UINT64_MAX, &pool[0]) && as_parse_u64(comma + 1, UINT64_MAX, &pool[1]);
}

int as_cmd_segments(int argc, char **argv) {
  static const struct option longopts[] = {{"device", required_argument, NULL, 'd'},
                                           {"pool", required_argument, NULL, 'p'},
                                           {"stream", required_argument, NULL, 's'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  bool by_device = false, by_pool = false, by_stream = false;
  uint64_t device = 0, pool[2] = {0, 0}, stream = 0;
  for (int c; (c = as_getopt("segments", argc, argv, ":h", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("segments", AS_EXIT_OK);
    case 'd':
      if (!as_parse_u64(optarg, AS_MAX_DEVICE, &device))
        return as_usage_error("segments", "--device wants a device index from 0 to %d, not '%s'", AS_MAX_DEVICE,
                              optarg);
      by_device = true;
      break;
    case 'p':
      if (!parse_pool(optarg, pool))
        return as_usage_error("segments", "--pool wants a pool id A,B (two non-negative integers), not '%s'",
                              optarg);
      by_pool = true;
      break;
    case 's':
      if (!as_parse_u64(optarg, UINT64_MAX, &stream))
        return as_usage_error("segments", "--stream wants a non-negative integer stream handle, not '%s'", optarg);
      by_stream = true;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  int rc = as_one_operand("segments", "FILE", argc, optind);
  if (rc != AS_EXIT_OK)
    return rc;
  as_snapshot s;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(argv[optind], &s, err) != 0)
    return as_failure("segments", "%s", err);
  int status = AS_EXIT_OK;
  size_t printed = 0;
  fputs("[", stdout);
  for (size_t i = 0; i < s.n_segments; i++) {
    const as_segment *seg = &s.segments[i];
    if ((by_device && (uint64_t)seg->device != device) || (by_stream && seg->stream != stream) ||
        (by_pool && (seg->pool_id[0] != pool[0] || seg->pool_id[1] != pool[1])))
      continue;
    cl_json j;
    cl_json_init(&j);
    if (!tool_json_copy(&j, seg->json)) {
      cl_json_discard(&j);
      status = as_failure("segments", "%s: segments[%zu]: nested deeper than the %d levels the JSON writer takes",
                          strcmp(argv[optind], "-") == 0 ? "<stdin>" : argv[optind], i, CL_JSON_MAX_DEPTH - 1);
      break;
    }
    char *text = cl_json_finish(&j);
    if (text == NULL) {
      status = as_failure("segments", "out of host memory");
      break;
    }
    printf("%s\n%s", printed ? "," : "", text);
    free(text);
    printed++;
  }
  fputs(printed ? "\n]\n" : "]\n", stdout);
  as_snapshot_free(&s);
  return as_finish_stdout("segments", status);
}
