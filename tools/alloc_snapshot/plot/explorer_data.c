/* alloc_snapshot plot: the snapshot as the explorer's data (plot.h), one JSON document in the page,
 * read by explorer_model.js. Compact: numeric columns are arrays with one number per trace entry or
 * block, and every string, frame, stack, address and stream is written once, in a table, and referred
 * to by its index there (intern.h). Addresses and streams are hex and decimal strings in their tables,
 * so values past 2^53 (what a JavaScript number holds exactly) are still shown to the digit.
 *
 * The document (docs/tools.md describes what the page shows of it):
 *   file, conf: the input's name and the allocator's config string (null when absent)
 *   str: strings; fr: frames as [name, filename, line] triples (str indices) in one flat array;
 *   st: stacks, each an array of fr indices (frame i is fr[3i .. 3i+3)), st[0] the empty stack;
 *   addrs: hex addresses; streams: decimal stream handles;
 *   ann: external_annotations as flat [device, time_us, start (1/0), name (str)] quadruples;
 *   dev: per device drawn {d, n, act, addr, size, stream, t0, dt, stk, nm, oom, segs}: its trace's
 *     actions (as_action numbers), addrs / streams indices, sizes, first time_us and the time deltas
 *     after it, stacks (st indices), user_defined names as [entry, str] pairs, oom entries as
 *     [entry, device_free] pairs, and its segments, each {a, n, s, p, sm, x, b}: address (addrs),
 *     total size, stream (streams), pool id pair, small, expandable, and blocks as flat
 *     [address (addrs), size, requested size, state (as_block_state), stack (st)] quintuples. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "intern.h"
#include "json_writer.h" /* src/common/: the JSON string escaper */
#include "plot.h"

typedef struct {
  page *p;
  as_intern str, frames, stacks, addrs, streams;
  bool oom; /* host memory ran out: the page is abandoned */
} tables;

/* The escaper's characters (json_writer.h) into the page, '<', '>' and '&' as \u escapes: inside a
 * <script> element no text from the input may spell "</script" or "<!--". */
static void script_sink(void *f, const char *s, size_t n) {
  if (n == 1 && (*s == '<' || *s == '>' || *s == '&'))
    fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
  else
    fwrite(s, 1, n, f);
}

static void jstr(page *p, const char *s) {
  fputc('"', p->f);
  cl_json_escape(s, script_sink, p->f);
  fputc('"', p->f);
}

static long intern1(tables *tb, as_intern *t, uint64_t v) {
  long i = as_intern_words(t, &v, 1);
  tb->oom |= i < 0;
  return i < 0 ? 0 : i;
}

static long str_id(tables *tb, const char *s) {
  long i = as_intern_string(&tb->str, s);
  tb->oom |= i < 0;
  return i < 0 ? 0 : i;
}

/* The st index of a checked frames array (NULL or empty: 0, the empty stack). */
static long stack_id(tables *tb, const cJSON *frames) {
  size_t n = 0;
  for (const cJSON *f = frames ? frames->child : NULL; f != NULL; f = f->next)
    n++;
  if (n == 0)
    return 0;
  uint64_t *ids = malloc(n * sizeof *ids);
  if (ids == NULL) {
    tb->oom = true;
    return 0;
  }
  n = 0;
  for (const cJSON *f = frames->child; f != NULL; f = f->next) {
    as_frame fr = as_frame_get(f);
    uint64_t key[3] = {(uint64_t)str_id(tb, fr.name), (uint64_t)str_id(tb, fr.filename), fr.line};
    long id = as_intern_words(&tb->frames, key, 3);
    tb->oom |= id < 0;
    ids[n++] = id < 0 ? 0 : (uint64_t)id;
  }
  long s = as_intern_words(&tb->stacks, ids, n);
  free(ids);
  tb->oom |= s < 0;
  return s < 0 ? 0 : s;
}

typedef enum { COL_ACT, COL_ADDR, COL_SIZE, COL_STREAM, COL_DT, COL_STK } column;

/* One column of the trace as a JSON array. */
static void trace_column(tables *tb, const as_device_trace *t, column col) {
  page *p = tb->p;
  fputc('[', p->f);
  for (size_t i = 0; i < t->n; i++) {
    const as_trace_entry *e = &t->entries[i];
    if (i)
      fputc(',', p->f);
    switch (col) {
    case COL_ACT:
      fprintf(p->f, "%d", (int)e->action);
      break;
    case COL_ADDR:
      fprintf(p->f, "%ld", intern1(tb, &tb->addrs, e->addr));
      break;
    case COL_SIZE:
      fprintf(p->f, "%" PRIu64, e->size);
      break;
    case COL_STREAM:
      fprintf(p->f, "%ld", intern1(tb, &tb->streams, e->stream));
      break;
    case COL_DT: /* signed: a trace whose times go back still round-trips */
      fprintf(p->f, "%" PRId64, i ? (int64_t)(e->time_us - t->entries[i - 1].time_us) : (int64_t)0);
      break;
    case COL_STK:
      fprintf(p->f, "%ld", stack_id(tb, e->frames));
      break;
    }
  }
  fputc(']', p->f);
}

static void segment(tables *tb, const as_segment *s) {
  page *p = tb->p;
  fprintf(p->f, "{\"a\":%ld,\"n\":%" PRIu64 ",\"s\":%ld,\"p\":[%" PRIu64 ",%" PRIu64 "],\"sm\":%d,\"x\":%d,\"b\":[",
          intern1(tb, &tb->addrs, s->address), s->total_size, intern1(tb, &tb->streams, s->stream), s->pool_id[0],
          s->pool_id[1], s->small, s->is_expandable);
  for (size_t k = 0; k < s->n_blocks; k++) {
    const as_block *b = &s->blocks[k];
    fprintf(p->f, "%s%ld,%" PRIu64 ",%" PRIu64 ",%d,%ld", k ? "," : "", intern1(tb, &tb->addrs, b->address), b->size,
            b->requested_size, (int)b->state, stack_id(tb, b->frames));
  }
  fputs("]}", p->f);
}

static void device(tables *tb, const as_snapshot *snap, int d) {
  page *p = tb->p;
  static const as_device_trace none = {0, NULL};
  const as_device_trace *t = (size_t)d < snap->n_devices ? &snap->traces[d] : &none;
  fprintf(p->f, "{\"d\":%d,\"n\":%zu,\"t0\":%" PRIu64, d, t->n, t->n ? t->entries[0].time_us : 0);
  static const char *const names[] = {"act", "addr", "size", "stream", "dt", "stk"};
  for (int c = COL_ACT; c <= COL_STK; c++) {
    fprintf(p->f, ",\"%s\":", names[c]);
    trace_column(tb, t, (column)c);
  }
  fputs(",\"nm\":[", p->f);
  bool first = true;
  for (size_t i = 0; i < t->n; i++)
    if (t->entries[i].name != NULL) {
      fprintf(p->f, "%s%zu,%ld", first ? "" : ",", i, str_id(tb, t->entries[i].name));
      first = false;
    }
  fputs("],\"oom\":[", p->f);
  first = true;
  for (size_t i = 0; i < t->n; i++)
    if (t->entries[i].action == AS_OOM) {
      fprintf(p->f, "%s%zu,%" PRIu64, first ? "" : ",", i, t->entries[i].addr);
      first = false;
    }
  fputs("],\"segs\":[", p->f);
  first = true;
  for (size_t i = 0; i < snap->n_segments; i++)
    if (snap->segments[i].device == d) {
      fputs(first ? "" : ",", p->f);
      segment(tb, &snap->segments[i]);
      first = false;
    }
  fputs("]}", p->f);
}

static void tables_out(tables *tb) {
  page *p = tb->p;
  size_t n;
  fputs(",\"str\":[", p->f);
  for (size_t i = 0; i < tb->str.n; i++) {
    const uint64_t *w = as_intern_key(&tb->str, i, &n);
    char *s = calloc(w[0] + 1, 1);
    if (s == NULL) {
      tb->oom = true;
      return;
    }
    memcpy(s, w + 1, w[0]);
    fputs(i ? "," : "", p->f);
    jstr(p, s);
    free(s);
  }
  fputs("],\"fr\":[", p->f);
  for (size_t i = 0; i < tb->frames.n; i++) {
    const uint64_t *w = as_intern_key(&tb->frames, i, &n);
    fprintf(p->f, "%s%" PRIu64 ",%" PRIu64 ",%" PRIu64, i ? "," : "", w[0], w[1], w[2]);
  }
  fputs("],\"st\":[", p->f);
  for (size_t i = 0; i < tb->stacks.n; i++) {
    const uint64_t *w = as_intern_key(&tb->stacks, i, &n);
    fputs(i ? ",[" : "[", p->f);
    for (size_t k = 0; k < n; k++)
      fprintf(p->f, "%s%" PRIu64, k ? "," : "", w[k]);
    fputc(']', p->f);
  }
  fputs("],\"addrs\":[", p->f);
  for (size_t i = 0; i < tb->addrs.n; i++)
    fprintf(p->f, "%s\"%" PRIx64 "\"", i ? "," : "", as_intern_key(&tb->addrs, i, &n)[0]);
  fputs("],\"streams\":[", p->f);
  for (size_t i = 0; i < tb->streams.n; i++)
    fprintf(p->f, "%s\"%" PRIu64 "\"", i ? "," : "", as_intern_key(&tb->streams, i, &n)[0]);
  fputc(']', p->f);
}

int as_explorer_data(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices) {
  tables tb = {.p = p};
  as_intern *all[] = {&tb.str, &tb.frames, &tb.stacks, &tb.addrs, &tb.streams};
  for (size_t i = 0; i < 5; i++)
    as_intern_init(all[i]);
  tb.oom |= as_intern_words(&tb.stacks, NULL, 0) != 0; /* st[0]: the empty stack */
  fputs("{\"v\":1,\"file\":", p->f);
  jstr(p, input);
  fputs(",\"conf\":", p->f);
  if (snap->conf != NULL)
    jstr(p, snap->conf);
  else
    fputs("null", p->f);
  fputs(",\"ann\":[", p->f);
  for (size_t i = 0; i < snap->n_annotations; i++) {
    const as_annotation *a = &snap->annotations[i];
    fprintf(p->f, "%s%d,%" PRIu64 ",%d,%ld", i ? "," : "", a->device, a->time_us, a->start, str_id(&tb, a->name));
  }
  fputs("],\"dev\":[", p->f);
  for (size_t i = 0; i < n_devices && !tb.oom; i++) {
    fputs(i ? "," : "", p->f);
    device(&tb, snap, devices[i]);
  }
  fputc(']', p->f);
  if (!tb.oom)
    tables_out(&tb);
  fputc('}', p->f);
  for (size_t i = 0; i < 5; i++)
    as_intern_free(all[i]);
  return tb.oom ? -1 : 0;
}
