/* alloc_snapshot convert: a snapshot from JSON to a pickle (what PyTorch's viewer,
 * torch.cuda._memory_viz, reads) or back, either gzip'ed or not. The input is read and checked as
 * every subcommand reads it (JSON or pickle, found from its first byte), so only a snapshot is written. */
#include <getopt.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "cli.h"
#include "../common/bytes.h"
#include "../common/outfile.h"
#include "../common/snapshot_pickle.h"
#include "../common/snapshot_reader.h"
#include "c_locale.h"
#include "json_writer.h"

static const char help[] =
    "usage: alloc_snapshot convert IN OUT [--to json|pickle]\n"
    "\n"
    "Writes the snapshot IN (JSON or a PyTorch pickle, gzip'ed or not; '-' is stdin) to OUT as JSON or\n"
    "as a pickle (protocol 4, as torch.cuda.memory._dump_snapshot writes them, for\n"
    "'python3 -m torch.cuda._memory_viz'). IN is checked as a snapshot first: a malformed one is an\n"
    "error and OUT is left as it was. OUT's format comes from its name: .pickle or .pkl is a pickle,\n"
    ".json is JSON, and a further .gz gzips it; '-' is standard output and needs --to.\n"
    "JSON is written as cachalot writes snapshots (compact, a newline at the end), so cachalot's own\n"
    "files come back byte for byte from a round trip through a pickle.\n"
    "\n"
    "  --to FORMAT   json or pickle, whatever OUT is named\n"
    "  -h, --help    this text\n"
    "\n"
    "Exit status: 0 success, 1 unreadable or malformed IN or unwritable OUT, 2 usage error.\n";

typedef as_bytes text;

static void put(text *t, const char *s, size_t n) { as_bytes_put(t, s, n); }

static void put_sink(void *t, const char *s, size_t n) { put(t, s, n); }

static void put_quoted(text *t, const char *s) {
  put(t, "\"", 1);
  cl_json_escape(s, put_sink, t);
  put(t, "\"", 1);
}

/* Numbers as cachalot's writer prints them: whole ones in full (its integer fields), others with
 * "%.17g" (its doubles), which gives the same double back. */
static void put_number(text *t, double d) {
  char b[40];
  if (d >= 0 && d < 18446744073709551616.0 && (double)(uint64_t)d == d)
    snprintf(b, sizeof b, "%llu", (unsigned long long)d);
  else if (d < 0 && d >= -9223372036854775808.0 && (double)(int64_t)d == d)
    snprintf(b, sizeof b, "%lld", (long long)d);
  else
    cl_snprintf_c(b, sizeof b, "%.17g", d);
  put(t, b, strlen(b));
}

/* The tree as compact JSON (readers bound its depth to CJSON_NESTING_LIMIT). */
static void put_json(text *t, const cJSON *v) {
  if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
    bool obj = cJSON_IsObject(v);
    put(t, obj ? "{" : "[", 1);
    for (const cJSON *e = v->child; e != NULL; e = e->next) {
      if (e != v->child)
        put(t, ",", 1);
      if (obj) {
        put_quoted(t, e->string);
        put(t, ":", 1);
      }
      put_json(t, e);
    }
    put(t, obj ? "}" : "]", 1);
  } else if (cJSON_IsString(v)) {
    put_quoted(t, v->valuestring);
  } else if (cJSON_IsNumber(v)) {
    put_number(t, v->valuedouble);
  } else if (cJSON_IsBool(v)) {
    put(t, cJSON_IsTrue(v) ? "true" : "false", cJSON_IsTrue(v) ? 4 : 5);
  } else {
    put(t, "null", 4);
  }
}

int as_cmd_convert(int argc, char **argv) {
  static const struct option longopts[] = {
      {"to", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'}, {0}};
  int to = -1;
  for (int c; (c = as_getopt("convert", argc, argv, ":h", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("convert", AS_EXIT_OK);
    case 't':
      if (strcmp(optarg, "json") != 0 && strcmp(optarg, "pickle") != 0)
        return as_usage_error("convert", "--to wants json or pickle, not '%s'", optarg);
      to = strcmp(optarg, "pickle") == 0;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  if (argc - optind != 2)
    return as_usage_error("convert", "IN and OUT expected, got %d argument%s", argc - optind,
                          argc - optind == 1 ? "" : "s");
  const char *in = argv[optind], *out = argv[optind + 1];
  if (to < 0 && strcmp(out, "-") == 0)
    return as_usage_error("convert", "OUT '-' (standard output) needs --to json or --to pickle");
  size_t stem;
  if (to < 0 && (to = as_snapshot_name(out, &stem)) < 0)
    return as_usage_error("convert",
                          "cannot tell the format of '%s' from its name (.json, .pickle or .pkl, with .gz or "
                          "not): give --to json or --to pickle",
                          out);
  as_snapshot s;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(in, &s, err) != 0)
    return as_failure("convert", "%s", err);
  int status;
  if (to == 1) {
    unsigned char *bytes = NULL;
    size_t len = 0, not_utf8 = 0;
    if (as_pickle_write(s.root, &bytes, &len, &not_utf8) != 0)
      status = as_failure("convert", "out of host memory for the pickle");
    else
      status = as_write_file("convert", out, bytes, len, false);
    if (status == AS_EXIT_OK && not_utf8 > 0) /* Python would refuse the bytes; memory_viz shows the marks */
      fprintf(stderr, "alloc_snapshot convert: %s: %zu byte%s of text that %s not UTF-8 written as U+FFFD\n",
              in, not_utf8, not_utf8 == 1 ? "" : "s", not_utf8 == 1 ? "is" : "are");
    free(bytes);
  } else {
    text t = {0};
    put_json(&t, s.root);
    if (t.oom)
      status = as_failure("convert", "out of host memory for the JSON");
    else
      status = as_write_output("convert", out, (const char *)t.buf, t.len);
    free(t.buf);
  }
  as_snapshot_free(&s);
  return status;
}
