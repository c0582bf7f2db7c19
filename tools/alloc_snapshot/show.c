/* alloc_snapshot show: where the memory of a snapshot is, per device, pool and stream, and which
 * segments are the largest. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../common/snapshot_reader.h"
#include "summary.h"

static const char help[] =
    "usage: alloc_snapshot show FILE [--top N] [--bytes]\n"
    "       alloc_snapshot show FILE FILE... [--bytes]   (several ranks: summary's table)\n"
    "\n"
    "Summarises a memory snapshot (cachalot's or PyTorch's JSON or pickle, gzip'ed or not; '-' is stdin).\n"
    "\n"
    "One row per device, pool id, segment type and stream (a device with several rows gets an 'all' row):\n"
    "  segments        how many segments (device allocations)\n"
    "  reserved        their total size\n"
    "  allocated       bytes in active_allocated blocks\n"
    "  active          allocated + bytes of blocks pending free (active_pending_free)\n"
    "  requested       bytes the program asked for in its allocated blocks (before rounding)\n"
    "  free            bytes in inactive blocks\n"
    "  inactive_split  free bytes in segments split into several blocks (a segment's free tail\n"
    "                  or hole, which cannot be given back to the device)\n"
    "  largest_free    the largest inactive block\n"
    "  frag            1 - largest_free / free: 0 when the free memory is one block, towards 1 when it\n"
    "                  is scattered over many; '-' when nothing is free\n"
    "Then the N largest segments (address order breaks ties), and the trace's entries per action.\n"
    "\n"
    "options:\n"
    "  --top N     how many of the largest segments to list (default 10; 0: none)\n"
    "  --bytes     exact byte counts instead of KiB/MiB/GiB with two decimals\n"
    "  -h, --help  this text\n"
    "\n"
    "Exit status: 0 success, 1 unreadable or malformed file, 2 usage error.\n";

static void frag_cell(char buf[AS_SIZE_BUF], const as_group *g) {
  double f = as_fragmentation(g);
  if (f < 0)
    snprintf(buf, AS_SIZE_BUF, "-");
  else
    snprintf(buf, AS_SIZE_BUF, "%.3f", f);
}

static void group_row(as_table *t, const as_group *g, const char *device, const char *pool, const char *type,
                      const char *stream, bool exact) {
  char segs[24], res[AS_SIZE_BUF], alloc[AS_SIZE_BUF], act[AS_SIZE_BUF], req[AS_SIZE_BUF], fr[AS_SIZE_BUF],
      split[AS_SIZE_BUF], lf[AS_SIZE_BUF], frag[AS_SIZE_BUF];
  snprintf(segs, sizeof segs, "%" PRIu64, g->segments);
  frag_cell(frag, g);
  const char *row[] = {device,
                       pool,
                       type,
                       stream,
                       segs,
                       as_fmt_size(res, g->reserved, exact),
                       as_fmt_size(alloc, g->allocated, exact),
                       as_fmt_size(act, g->active, exact),
                       as_fmt_size(req, g->requested, exact),
                       as_fmt_size(fr, g->free, exact),
                       as_fmt_size(split, g->inactive_split, exact),
                       as_fmt_size(lf, g->largest_free, exact),
                       frag};
  as_table_row(t, row);
}

/* Adds b's totals into a (largest_free is a maximum, not a sum). */
static void group_merge(as_group *a, const as_group *b) {
  a->segments = as_sat_add(a->segments, b->segments);
  a->blocks = as_sat_add(a->blocks, b->blocks);
  a->reserved = as_sat_add(a->reserved, b->reserved);
  a->allocated = as_sat_add(a->allocated, b->allocated);
  a->active = as_sat_add(a->active, b->active);
  a->requested = as_sat_add(a->requested, b->requested);
  a->free = as_sat_add(a->free, b->free);
  a->inactive_split = as_sat_add(a->inactive_split, b->inactive_split);
  if (b->largest_free > a->largest_free)
    a->largest_free = b->largest_free;
}

static bool print_groups(const as_group *groups, size_t n, bool exact) {
  as_table t;
  as_table_init(&t, 13, "lllrrrrrrrrrr");
  const char *head[] = {"device", "pool", "type",  "stream",         "segments",     "reserved", "allocated",
                        "active", "requested", "free", "inactive_split", "largest_free", "frag"};
  as_table_row(&t, head);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    as_group all = {0};
    for (; j < n && groups[j].key.device == groups[i].key.device; j++) {
      const as_group *g = &groups[j];
      char dev[16], pool[AS_POOL_BUF], stream[24];
      snprintf(dev, sizeof dev, "%d", g->key.device);
      snprintf(stream, sizeof stream, "%" PRIu64, g->key.stream);
      group_row(&t, g, dev, as_fmt_pool(pool, g->key.pool_id), g->key.small ? "small" : "large", stream, exact);
      group_merge(&all, g);
    }
    if (j - i > 1) {
      char dev[16];
      snprintf(dev, sizeof dev, "%d", groups[i].key.device);
      group_row(&t, &all, dev, "all", "", "", exact);
    }
    i = j;
  }
  bool ok = as_table_print(&t, 2);
  as_table_free(&t);
  return ok;
}

static int cmp_size_desc(const void *pa, const void *pb) {
  const as_segment *a = *(const as_segment *const *)pa, *b = *(const as_segment *const *)pb;
  if (a->total_size != b->total_size)
    return a->total_size > b->total_size ? -1 : 1;
  if (a->device != b->device)
    return a->device < b->device ? -1 : 1;
  return a->address < b->address ? -1 : a->address > b->address ? 1 : 0;
}

static bool print_largest(const as_snapshot *s, uint64_t top, bool exact) {
  const as_segment **v = as_sorted_segments(s);
  if (v == NULL)
    return false;
  qsort(v, s->n_segments, sizeof *v, cmp_size_desc);
  size_t n = top < s->n_segments ? (size_t)top : s->n_segments;
  printf("\nlargest segments (%zu of %zu):\n", n, s->n_segments);
  as_table t;
  as_table_init(&t, 11, "lrllrrrrrrr");
  const char *head[] = {"device", "address", "pool",   "type",   "stream", "size",
                        "allocated", "active", "free", "blocks", "largest_free"};
  as_table_row(&t, head);
  for (size_t i = 0; i < n; i++) {
    const as_segment *seg = v[i];
    as_group g = {0};
    as_group_add(&g, seg);
    char dev[16], addr[24], pool[AS_POOL_BUF], stream[24], size[AS_SIZE_BUF], alloc[AS_SIZE_BUF],
        act[AS_SIZE_BUF], fr[AS_SIZE_BUF], blocks[24], lf[AS_SIZE_BUF];
    snprintf(dev, sizeof dev, "%d", seg->device);
    snprintf(addr, sizeof addr, "0x%" PRIx64, seg->address);
    snprintf(stream, sizeof stream, "%" PRIu64, seg->stream);
    snprintf(blocks, sizeof blocks, "%zu", seg->n_blocks);
    const char *row[] = {dev,
                         addr,
                         as_fmt_pool(pool, seg->pool_id),
                         seg->small ? "small" : "large",
                         stream,
                         as_fmt_size(size, seg->total_size, exact),
                         as_fmt_size(alloc, seg->allocated_size, exact),
                         as_fmt_size(act, seg->active_size, exact),
                         as_fmt_size(fr, g.free, exact),
                         blocks,
                         as_fmt_size(lf, g.largest_free, exact)};
    as_table_row(&t, row);
  }
  bool ok = as_table_print(&t, 2);
  as_table_free(&t);
  free(v);
  return ok;
}

static void print_traces(const as_snapshot *s) {
  for (size_t d = 0; d < s->n_devices; d++) {
    const as_device_trace *t = &s->traces[d];
    if (t->n == 0)
      continue;
    size_t count[AS_ACTION_OTHER + 1] = {0};
    for (size_t i = 0; i < t->n; i++)
      count[t->entries[i].action]++;
    printf("trace of device %zu: %zu entries (", d, t->n);
    const char *sep = "";
    for (int a = 0; a <= AS_ACTION_OTHER; a++)
      if (count[a] != 0) {
        printf("%s%zu %s", sep, count[a], as_action_name((as_action)a));
        sep = ", ";
      }
    printf(")\n");
  }
}

int as_cmd_show(int argc, char **argv) {
  static const struct option longopts[] = {
      {"top", required_argument, NULL, 't'}, {"bytes", no_argument, NULL, 'b'}, {"help", no_argument, NULL, 'h'}, {0}};
  uint64_t top = 10;
  bool exact = false, top_given = false;
  for (int c; (c = as_getopt("show", argc, argv, ":h", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("show", AS_EXIT_OK);
    case 't':
      if (!as_parse_u64(optarg, SIZE_MAX, &top))
        return as_usage_error("show", "--top wants a non-negative integer, not '%s'", optarg);
      top_given = true;
      break;
    case 'b':
      exact = true;
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  if (argc == optind)
    return as_usage_error("show", "no FILE given");
  if (argc - optind > 1 && top_given)
    return as_usage_error("show", "--top is for one FILE; with several, show prints summary's table");
  if (argc - optind > 1) /* a job's files, one per rank: the table of summary */
    return as_summarize_ranks("show", argv + optind, (size_t)(argc - optind), exact, false);
  const char *path = argv[optind];
  as_snapshot s;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(path, &s, err) != 0)
    return as_failure("show", "%s", err);

  as_group *groups = NULL;
  size_t n_groups = 0;
  int status = AS_EXIT_OK;
  if (as_group_segments(&s, &groups, &n_groups) != 0) {
    as_snapshot_free(&s);
    return as_failure("show", "out of host memory");
  }
  size_t devices = 0;
  for (size_t i = 0; i < n_groups; i++)
    if (i == 0 || groups[i].key.device != groups[i - 1].key.device)
      devices++;
  size_t blocks = 0;
  for (size_t i = 0; i < s.n_segments; i++)
    blocks += s.segments[i].n_blocks;
  printf("snapshot: %s\n", strcmp(path, "-") == 0 ? "<stdin>" : path);
  printf("%zu segments, %zu blocks on %zu device%s\n", s.n_segments, blocks, devices, devices == 1 ? "" : "s");
  if (s.conf != NULL) {
    /* The config string comes from the file: print it with anything unprintable replaced. */
    printf("allocator settings: \"");
    for (const char *p = s.conf; *p != '\0' && p - s.conf < 200; p++)
      putchar(*p >= 0x20 && *p < 0x7f && *p != '"' ? *p : '?');
    printf("\"\n");
  }
  print_traces(&s);
  if (n_groups > 0) {
    printf("\nper device, pool and stream:\n");
    if (!print_groups(groups, n_groups, exact))
      status = as_failure("show", "out of host memory");
    if (status == AS_EXIT_OK && top > 0 && !print_largest(&s, top, exact))
      status = as_failure("show", "out of host memory");
  }
  free(groups);
  as_snapshot_free(&s);
  return as_finish_stdout("show", status);
}
