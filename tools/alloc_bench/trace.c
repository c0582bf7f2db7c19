/* alloc_bench: a snapshot's trace (PyTorch's or cachalot's device_traces) as an operation sequence,
 * read with the checked snapshot reader and walked with the trace walker of tools/common.
 *
 * The entries come in the walk's order (tools/common/trace_walk.h: time order over the devices), as in
 * `alloc_snapshot replay`, and all run on the benchmark's one device and stream: an `alloc` allocates
 * its size into a fresh slot; a `free_requested` frees its allocation's slot. Unknown frees are skipped,
 * implicit frees freed, other entries skipped, as the walker says. An allocation of 0 bytes (NULL for
 * every allocator) and its free are skipped; what is live at the end is freed. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

#include "../common/snapshot_reader.h"
#include "../common/trace_walk.h"

/* The tag of an allocation of 0 bytes: it has no slot (there is nothing to free). */
#define NO_SLOT UINT32_MAX

typedef struct {
  ab_seq *seq;
  uint32_t *spare; /* free slots, a stack */
  uint32_t n_spare, n_slots, cap_spare;
  size_t unknown_frees, implicit_frees, zero_allocs;
} conv;

static int free_slot(conv *c, uint32_t slot, char err[AB_ERR_LEN]) {
  if (slot == NO_SLOT)
    return 0;
  if (c->n_spare == c->cap_spare) {
    uint32_t cap = c->cap_spare ? c->cap_spare * 2 : 1024;
    uint32_t *p = realloc(c->spare, cap * sizeof *p);
    if (p == NULL) {
      snprintf(err, AB_ERR_LEN, "out of host memory");
      return -1;
    }
    c->spare = p;
    c->cap_spare = cap;
  }
  c->spare[c->n_spare++] = slot;
  return ab_seq_push(c->seq, 0, slot, 0, err);
}

/* An alloc entry: a fresh slot, remembered in the walk's record of its (device, addr). */
static int do_alloc(conv *c, const tw_step *step, char err[AB_ERR_LEN]) {
  uint64_t size = step->e->size;
  uint32_t slot = NO_SLOT;
  if (size == 0) {
    c->zero_allocs++;
  } else {
    if (size > SIZE_MAX / 2) {
      snprintf(err, AB_ERR_LEN, "an allocation of %llu bytes does not fit this machine", (unsigned long long)size);
      return -1;
    }
    slot = c->n_spare > 0 ? c->spare[--c->n_spare] : c->n_slots++;
    if (ab_seq_push(c->seq, size, slot, 0, err) != 0)
      return -1;
  }
  step->live->tag = slot;
  return 0;
}

static int do_step(conv *c, const tw_step *step, char err[AB_ERR_LEN]) {
  switch (step->kind) {
  case TW_ALLOC:
    return do_alloc(c, step, err);
  case TW_IMPLICIT_FREE:
    c->implicit_frees++;
    return free_slot(c, (uint32_t)step->live->tag, err);
  case TW_FREE:
    return free_slot(c, (uint32_t)step->live->tag, err);
  case TW_UNKNOWN_FREE:
    c->unknown_frees++;
    return 0;
  case TW_OTHER:
    break;
  }
  return 0;
}

/* Walks the whole trace into c->seq, then frees what is still live, in the walk's slot order. */
static int convert(conv *c, const as_snapshot *snap, size_t *drained, char err[AB_ERR_LEN]) {
  tw_walk w;
  if (tw_begin(&w, snap->traces, snap->n_devices) != 0) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  int rc = 0, more;
  tw_step step;
  while (rc == 0 && (more = tw_next(&w, &step)) != 0) {
    if (more < 0) {
      snprintf(err, AB_ERR_LEN, "out of host memory");
      rc = -1;
    } else {
      rc = do_step(c, &step, err);
    }
  }
  size_t pos = 0;
  for (const tw_live *v; rc == 0 && (v = tw_map_next(&w.live, &pos)) != NULL;)
    rc = free_slot(c, (uint32_t)v->tag, err);
  *drained = w.live.count;
  tw_end(&w);
  return rc;
}

int ab_seq_from_trace(ab_seq *s, const char *path, char *note, size_t note_len, char err[AB_ERR_LEN]) {
  memset(s, 0, sizeof *s);
  note[0] = '\0';
  as_snapshot snap;
  char rerr[AS_ERR_LEN];
  if (as_snapshot_load(path, &snap, rerr) != 0) {
    snprintf(err, AB_ERR_LEN, "%s", rerr);
    return -1;
  }
  conv c = {.seq = s};
  int devices_used = 0;
  bool other_streams = false;
  for (size_t d = 0; d < snap.n_devices; d++) {
    devices_used += snap.traces[d].n > 0;
    for (size_t i = 0; i < snap.traces[d].n; i++)
      other_streams |= snap.traces[d].entries[i].stream != 0 && snap.traces[d].entries[i].action == AS_ALLOC;
  }
  size_t drained = 0;
  int rc = convert(&c, &snap, &drained, err);
  if (rc == 0 && s->n == 0) {
    snprintf(err, AB_ERR_LEN, "%s: no alloc entries in device_traces (was history recorded?)", path);
    rc = -1;
  }
  if (rc == 0)
    rc = ab_seq_finish(s, err);
  if (rc == 0)
    snprintf(note, note_len, "%zu trace allocs; %zu unknown frees skipped; %zu freed at the end%s%s%s", s->n_allocs,
             c.unknown_frees, drained, c.zero_allocs ? "; 0-byte allocs skipped" : "",
             devices_used > 1 ? "; devices merged onto one" : "",
             other_streams ? "; all streams replayed on one" : "");
  free(c.spare);
  as_snapshot_free(&snap);
  if (rc != 0)
    ab_seq_free(s);
  return rc;
}
