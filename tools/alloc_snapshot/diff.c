/* alloc_snapshot diff: what changed between two snapshots: totals per (device, pool, type, stream)
 * before and after, then the segments added, removed and changed (segments are paired by address or
 * by history, match.h; blocks within a pair by their offset in the segment). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../common/snapshot_reader.h"
#include "match.h"
#include "summary.h"

static const char help[] =
    "usage: alloc_snapshot diff A B [--match address|history|auto] [--bytes]\n"
    "\n"
    "Compares two memory snapshots (cachalot's or PyTorch's JSON, gzip'ed or not) and prints:\n"
    "  - per device, pool id, segment type and stream: segments, reserved, allocated, active and free\n"
    "    bytes in A -> in B (with the change), and the totals;\n"
    "  - how the segments were paired (see --match), then the segments only in B (added) and only in A\n"
    "    (removed);\n"
    "  - for each pair that differs: its size, pool, stream or type if they changed, and its\n"
    "    blocks (by offset in the segment) that changed state, size or requested size, appeared (a\n"
    "    split) or disappeared (a merge).\n"
    "Prints 'no differences' when the segments are the same. The traces are not compared.\n"
    "\n"
    "options:\n"
    "  --match M   how a segment of A is paired with one of B:\n"
    "                address: the same device and address (two snapshots of one process);\n"
    "                history: the same device and size, in order of creation: the segment_alloc entries\n"
    "                of the trace order them (the last one at a segment's address), and segments\n"
    "                whose creation is not in the trace follow in address order (a recording and a\n"
    "                replay of one trace, whose addresses differ);\n"
    "                auto (default): address when more than half of the smaller snapshot's segments\n"
    "                have a partner at the same address, else history\n"
    "  --bytes     exact byte counts instead of KiB/MiB/GiB with two decimals\n"
    "  -h, --help  this text\n"
    "\n"
    "Exit status: 0 success (whether or not they differ), 1 unreadable or malformed file, 2 usage error.\n";

/* "X" when unchanged, else "X -> Y (+D)". */
static char *change_cell(char buf[3 * AS_SIZE_BUF + 16], uint64_t a, uint64_t b, bool exact, bool bytes) {
  char x[AS_SIZE_BUF], y[AS_SIZE_BUF], d[AS_SIZE_BUF];
  if (!bytes) {
    if (a == b)
      snprintf(buf, 3 * AS_SIZE_BUF + 16, "%" PRIu64, a);
    else
      snprintf(buf, 3 * AS_SIZE_BUF + 16, "%" PRIu64 " -> %" PRIu64, a, b);
  } else if (a == b) {
    snprintf(buf, 3 * AS_SIZE_BUF + 16, "%s", as_fmt_size(x, a, exact));
  } else {
    snprintf(buf, 3 * AS_SIZE_BUF + 16, "%s -> %s (%s)", as_fmt_size(x, a, exact), as_fmt_size(y, b, exact),
             as_fmt_delta(d, a, b, exact));
  }
  return buf;
}

static void group_pair_row(as_table *t, const char *dev, const char *pool, const char *type, const char *stream,
                           const as_group *a, const as_group *b, bool exact) {
  char segs[3 * AS_SIZE_BUF + 16], res[3 * AS_SIZE_BUF + 16], alloc[3 * AS_SIZE_BUF + 16],
      act[3 * AS_SIZE_BUF + 16], fr[3 * AS_SIZE_BUF + 16];
  const char *row[] = {dev,
                       pool,
                       type,
                       stream,
                       change_cell(segs, a->segments, b->segments, exact, false),
                       change_cell(res, a->reserved, b->reserved, exact, true),
                       change_cell(alloc, a->allocated, b->allocated, exact, true),
                       change_cell(act, a->active, b->active, exact, true),
                       change_cell(fr, a->free, b->free, exact, true)};
  as_table_row(t, row);
}

static void group_sum(as_group *sum, const as_group *g) {
  sum->segments = as_sat_add(sum->segments, g->segments);
  sum->reserved = as_sat_add(sum->reserved, g->reserved);
  sum->allocated = as_sat_add(sum->allocated, g->allocated);
  sum->active = as_sat_add(sum->active, g->active);
  sum->free = as_sat_add(sum->free, g->free);
}

static bool print_groups(const as_group *ga, size_t na, const as_group *gb, size_t nb, bool exact) {
  as_table t;
  as_table_init(&t, 9, "lllrrrrrr");
  const char *head[] = {"device", "pool", "type", "stream", "segments", "reserved", "allocated", "active", "free"};
  as_table_row(&t, head);
  as_group sum_a = {0}, sum_b = {0};
  size_t i = 0, j = 0, rows = 0;
  while (i < na || j < nb) {
    /* A merge of the two sorted group lists: a group only on one side is compared with zeros. */
    static const as_group none = {0};
    int c = i >= na ? 1 : j >= nb ? -1 : as_key_cmp(&ga[i].key, &gb[j].key);
    const as_group *a = c <= 0 ? &ga[i] : &none, *b = c >= 0 ? &gb[j] : &none;
    const as_group_key *k = c <= 0 ? &ga[i].key : &gb[j].key;
    char dev[16], pool[AS_POOL_BUF], stream[24];
    snprintf(dev, sizeof dev, "%d", k->device);
    snprintf(stream, sizeof stream, "%" PRIu64, k->stream);
    group_pair_row(&t, dev, as_fmt_pool(pool, k->pool_id), k->small ? "small" : "large", stream, a, b, exact);
    group_sum(&sum_a, a);
    group_sum(&sum_b, b);
    rows++;
    if (c <= 0)
      i++;
    if (c >= 0)
      j++;
  }
  if (rows > 1)
    group_pair_row(&t, "all", "", "", "", &sum_a, &sum_b, exact);
  bool ok = as_table_print(&t, 2);
  as_table_free(&t);
  return ok;
}

static void print_segment_head(const char *mark, const as_segment *s, bool exact) {
  char size[AS_SIZE_BUF], pool[AS_POOL_BUF];
  printf("  %sdevice %d 0x%" PRIx64 " (pool %s, %s, stream %" PRIu64 ", %s, %zu block%s)", mark, s->device,
         s->address, as_fmt_pool(pool, s->pool_id), s->small ? "small" : "large", s->stream,
         as_fmt_size(size, s->total_size, exact), s->n_blocks, s->n_blocks == 1 ? "" : "s");
}

static void block_desc(char buf[96], const as_block *b, bool exact) {
  char size[AS_SIZE_BUF], req[AS_SIZE_BUF];
  if (b->state == AS_INACTIVE)
    snprintf(buf, 96, "%s %s", as_block_state_name(b->state), as_fmt_size(size, b->size, exact));
  else
    snprintf(buf, 96, "%s %s (requested %s)", as_block_state_name(b->state), as_fmt_size(size, b->size, exact),
             as_fmt_size(req, b->requested_size, exact));
}

static void block_where(char buf[40], const as_segment *s, const as_block *b) {
  if (b->address >= s->address)
    snprintf(buf, 40, "+0x%" PRIx64, b->address - s->address);
  else /* a malformed file's block before its segment: its absolute address */
    snprintf(buf, 40, "@0x%" PRIx64, b->address);
}

static int cmp_block_address(const void *pa, const void *pb) {
  const as_block *a = pa, *b = pb;
  return a->address < b->address ? -1 : a->address > b->address ? 1 : 0;
}

/* An inactive block's requested_size is not compared: PyTorch leaves its last allocation's there. */
static bool same_block(const as_block *a, const as_block *b) {
  return a->size == b->size && a->state == b->state &&
         (a->state == AS_INACTIVE || a->requested_size == b->requested_size);
}

static bool same_segment_head(const as_segment *a, const as_segment *b) {
  return a->total_size == b->total_size && a->pool_id[0] == b->pool_id[0] && a->pool_id[1] == b->pool_id[1] &&
         a->small == b->small && a->stream == b->stream && a->is_expandable == b->is_expandable;
}

/* Blocks of a segment sorted by address (a copy: the file's order is kept for `segments`). */
static as_block *sorted_blocks(const as_segment *s) {
  as_block *v = malloc((s->n_blocks ? s->n_blocks : 1) * sizeof *v);
  if (v != NULL) {
    if (s->n_blocks)
      memcpy(v, s->blocks, s->n_blocks * sizeof *v);
    qsort(v, s->n_blocks, sizeof *v, cmp_block_address);
  }
  return v;
}

/* Whether the two paired segments differ; prints how when `print`. -1 on OOM. */
static int segment_changes(const as_segment *sa, const as_segment *sb, bool exact, bool print) {
  as_block *a = sorted_blocks(sa), *b = sorted_blocks(sb);
  int changed = 0;
  if (a == NULL || b == NULL) {
    changed = -1;
    goto done;
  }
  changed = !same_segment_head(sa, sb);
  for (size_t i = 0, j = 0; i < sa->n_blocks || j < sb->n_blocks;) {
    /* By offset in the segment: segments paired by history lie at different addresses. */
    uint64_t oa = i < sa->n_blocks ? a[i].address - sa->address : 0;
    uint64_t ob = j < sb->n_blocks ? b[j].address - sb->address : 0;
    int c = i >= sa->n_blocks ? 1 : j >= sb->n_blocks ? -1 : oa < ob ? -1 : oa > ob ? 1 : 0;
    if (c == 0 && same_block(&a[i], &b[j])) {
      i++, j++;
      continue;
    }
    changed = 1;
    if (!print)
      break;
    char where[40], da[96], db[96];
    if (c == 0) {
      block_where(where, sb, &b[j]);
      block_desc(da, &a[i], exact);
      block_desc(db, &b[j], exact);
      printf("      %s: %s -> %s\n", where, da, db);
      i++, j++;
    } else if (c < 0) {
      block_where(where, sa, &a[i]);
      block_desc(da, &a[i], exact);
      printf("      %s: gone (was %s)\n", where, da);
      i++;
    } else {
      block_where(where, sb, &b[j]);
      block_desc(db, &b[j], exact);
      printf("      %s: new %s\n", where, db);
      j++;
    }
  }
done:
  free(a);
  free(b);
  return changed;
}

static void print_head_changes(const as_segment *a, const as_segment *b, bool exact) {
  char x[AS_SIZE_BUF], y[AS_SIZE_BUF], pa[AS_POOL_BUF], pb[AS_POOL_BUF];
  if (a->total_size != b->total_size)
    printf("      size: %s -> %s\n", as_fmt_size(x, a->total_size, exact), as_fmt_size(y, b->total_size, exact));
  if (a->pool_id[0] != b->pool_id[0] || a->pool_id[1] != b->pool_id[1])
    printf("      pool: %s -> %s\n", as_fmt_pool(pa, a->pool_id), as_fmt_pool(pb, b->pool_id));
  if (a->small != b->small)
    printf("      type: %s -> %s\n", a->small ? "small" : "large", b->small ? "small" : "large");
  if (a->stream != b->stream)
    printf("      stream: %" PRIu64 " -> %" PRIu64 "\n", a->stream, b->stream);
  if (a->is_expandable != b->is_expandable)
    printf("      is_expandable: %s -> %s\n", a->is_expandable ? "true" : "false", b->is_expandable ? "true" : "false");
}

/* Lists segments only in A, only in B, and changed. -1 on host OOM, else whether anything differs. */
static int print_segments(const as_matching *m, bool exact) {
  size_t added = 0, removed = 0, changed = 0;
  /* First pass counts, so each list can be headed with its length. */
  for (size_t i = 0; i < m->n; i++) {
    const as_seg_pair *p = &m->pairs[i];
    if (p->a == NULL) {
      added++;
    } else if (p->b == NULL) {
      removed++;
    } else {
      int r = segment_changes(p->a, p->b, exact, false);
      if (r < 0)
        return -1;
      changed += (size_t)r;
    }
  }
  printf("segments added: %zu\n", added);
  for (size_t i = 0; i < m->n; i++)
    if (m->pairs[i].a == NULL) {
      print_segment_head("+ ", m->pairs[i].b, exact);
      putchar('\n');
    }
  printf("segments removed: %zu\n", removed);
  for (size_t i = 0; i < m->n; i++)
    if (m->pairs[i].b == NULL) {
      print_segment_head("- ", m->pairs[i].a, exact);
      putchar('\n');
    }
  printf("segments changed: %zu\n", changed);
  for (size_t i = 0; i < m->n; i++) {
    const as_seg_pair *p = &m->pairs[i];
    if (p->a == NULL || p->b == NULL)
      continue;
    int r = segment_changes(p->a, p->b, exact, false);
    if (r < 0)
      return -1;
    if (r) {
      print_segment_head("~ ", p->a, exact);
      if (p->a->address != p->b->address)
        printf(" -> 0x%" PRIx64 " in B", p->b->address);
      printf(":\n");
      print_head_changes(p->a, p->b, exact);
      if (segment_changes(p->a, p->b, exact, true) < 0)
        return -1;
    }
  }
  return added + removed + changed > 0;
}

static void print_matching(const as_matching *m, as_match_mode asked, size_t na, size_t nb) {
  if (m->used == AS_MATCH_ADDRESS)
    printf("\nsegments matched by address: %zu", m->matched);
  else
    printf("\nsegments matched by history (size, order of creation): %zu", m->matched);
  if (na == nb)
    printf(" of %zu", na);
  else
    printf(" (A has %zu, B has %zu)", na, nb);
  if (asked == AS_MATCH_AUTO && m->used == AS_MATCH_HISTORY)
    printf("; auto: only %zu matched by address", m->by_address);
  putchar('\n');
}

int as_cmd_diff(int argc, char **argv) {
  static const struct option longopts[] = {{"bytes", no_argument, NULL, 'b'},
                                           {"match", required_argument, NULL, 'm'},
                                           {"help", no_argument, NULL, 'h'},
                                           {0}};
  bool exact = false;
  as_match_mode mode = AS_MATCH_AUTO;
  for (int c; (c = as_getopt("diff", argc, argv, ":h", longopts)) != -1;) {
    switch (c) {
    case 'h':
      fputs(help, stdout);
      return as_finish_stdout("diff", AS_EXIT_OK);
    case 'b':
      exact = true;
      break;
    case 'm':
      if (strcmp(optarg, "address") == 0)
        mode = AS_MATCH_ADDRESS;
      else if (strcmp(optarg, "history") == 0)
        mode = AS_MATCH_HISTORY;
      else if (strcmp(optarg, "auto") == 0)
        mode = AS_MATCH_AUTO;
      else
        return as_usage_error("diff", "--match wants address, history or auto, not '%s'", optarg);
      break;
    default:
      return AS_EXIT_USAGE;
    }
  }
  if (argc - optind != 2)
    return as_usage_error("diff", "two files expected (A B), got %d", argc - optind);
  const char *pa = argv[optind], *pb = argv[optind + 1];
  if (strcmp(pa, "-") == 0 && strcmp(pb, "-") == 0)
    return as_usage_error("diff", "standard input ('-') can be only one of the two files");
  as_snapshot a, b;
  char err[AS_ERR_LEN];
  if (as_snapshot_load(pa, &a, err) != 0)
    return as_failure("diff", "%s", err);
  if (as_snapshot_load(pb, &b, err) != 0) {
    as_snapshot_free(&a);
    return as_failure("diff", "%s", err);
  }
  int status = AS_EXIT_OK;
  as_group *ga = NULL, *gb = NULL;
  size_t na = 0, nb = 0;
  as_matching m = {0};
  if (as_group_segments(&a, &ga, &na) != 0 || as_group_segments(&b, &gb, &nb) != 0 ||
      as_match_segments(&a, &b, mode, &m) != 0) {
    status = as_failure("diff", "out of host memory");
    goto done;
  }
  printf("A: %s (%zu segments)\nB: %s (%zu segments)\n", strcmp(pa, "-") == 0 ? "<stdin>" : pa, a.n_segments,
         strcmp(pb, "-") == 0 ? "<stdin>" : pb, b.n_segments);
  if (na + nb > 0) {
    printf("\nper device, pool and stream (A -> B):\n");
    if (!print_groups(ga, na, gb, nb, exact)) {
      status = as_failure("diff", "out of host memory");
      goto done;
    }
  }
  print_matching(&m, mode, a.n_segments, b.n_segments);
  int r = print_segments(&m, exact);
  if (r < 0)
    status = as_failure("diff", "out of host memory");
  else if (r == 0)
    printf("no differences\n");
done:
  as_matching_free(&m);
  free(ga);
  free(gb);
  as_snapshot_free(&a);
  as_snapshot_free(&b);
  return as_finish_stdout("diff", status);
}
