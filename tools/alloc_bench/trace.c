/* alloc_bench: a snapshot's trace (PyTorch's or cachalot's device_traces) as an operation sequence,
 * read with the checked snapshot reader of tools/common.
 *
 * The entries of every device are taken in time order (ties: the lower device; within a device the
 * file's order), as `alloc_snapshot replay` does, and all run on the benchmark's one device and stream:
 * an `alloc` allocates its size into a fresh slot remembered for its (device, addr); a `free_requested`
 * frees the slot of its (device, addr). Other entries are what the recording allocator did itself and are
 * skipped. A free of an addr the trace never allocated (allocated before recording began) is skipped; an
 * addr allocated again while live is freed first (its free is missing from the trace); an allocation of 0
 * bytes (NULL for every allocator) and its free are skipped; what is live at the end is freed. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

#include "../common/snapshot_reader.h"

/* (device, addr) -> slot, open addressing with linear probing; deletion by backward shift. */
typedef struct {
  uint64_t addr;
  int device; /* -1: empty */
  uint32_t slot; /* UINT32_MAX: an allocation of 0 bytes (nothing to free) */
} entry;

typedef struct {
  entry *e;
  size_t cap, count;
} map;

static size_t home(const map *m, int device, uint64_t addr) {
  uint64_t h = addr ^ ((uint64_t)(unsigned)device << 52);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (size_t)h & (m->cap - 1);
}

static int map_init(map *m, size_t cap) {
  m->e = malloc(cap * sizeof *m->e);
  m->cap = cap;
  m->count = 0;
  if (m->e == NULL)
    return -1;
  for (size_t i = 0; i < cap; i++)
    m->e[i].device = -1;
  return 0;
}

static entry *map_find(map *m, int device, uint64_t addr) {
  for (size_t i = home(m, device, addr);; i = (i + 1) & (m->cap - 1)) {
    if (m->e[i].device < 0)
      return NULL;
    if (m->e[i].device == device && m->e[i].addr == addr)
      return &m->e[i];
  }
}

static int map_put(map *m, entry v) {
  if ((m->count + 1) * 2 > m->cap) {
    map big;
    if (map_init(&big, m->cap * 2) != 0)
      return -1;
    for (size_t i = 0; i < m->cap; i++)
      if (m->e[i].device >= 0)
        map_put(&big, m->e[i]);
    free(m->e);
    *m = big;
  }
  size_t i = home(m, v.device, v.addr);
  while (m->e[i].device >= 0)
    i = (i + 1) & (m->cap - 1);
  m->e[i] = v;
  m->count++;
  return 0;
}

static void map_del(map *m, entry *v) {
  size_t hole = (size_t)(v - m->e), mask = m->cap - 1;
  m->e[hole].device = -1;
  m->count--;
  for (size_t j = (hole + 1) & mask; m->e[j].device >= 0; j = (j + 1) & mask) {
    size_t h = home(m, m->e[j].device, m->e[j].addr);
    bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
    if (!stays) {
      m->e[hole] = m->e[j];
      m->e[j].device = -1;
      hole = j;
    }
  }
}

typedef struct {
  ab_seq *seq;
  map live;
  uint32_t *spare; /* free slots, a stack */
  uint32_t n_spare, n_slots, cap_spare;
  size_t unknown_frees, implicit_frees, zero_allocs;
} conv;

static int free_slot(conv *c, uint32_t slot, char err[AB_ERR_LEN]) {
  if (slot == UINT32_MAX)
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

static int do_entry(conv *c, int device, const as_trace_entry *e, char err[AB_ERR_LEN]) {
  if (e->action == AS_FREE_REQUESTED) {
    entry *v = map_find(&c->live, device, e->addr);
    if (v == NULL) {
      c->unknown_frees++;
      return 0;
    }
    uint32_t slot = v->slot;
    map_del(&c->live, v);
    return free_slot(c, slot, err);
  }
  if (e->action != AS_ALLOC)
    return 0;
  entry *old = map_find(&c->live, device, e->addr);
  if (old != NULL) {
    uint32_t slot = old->slot;
    map_del(&c->live, old);
    c->implicit_frees++;
    if (free_slot(c, slot, err) != 0)
      return -1;
  }
  uint32_t slot = UINT32_MAX;
  if (e->size == 0) {
    c->zero_allocs++;
  } else {
    if (e->size > SIZE_MAX / 2) {
      snprintf(err, AB_ERR_LEN, "an allocation of %llu bytes does not fit this machine", (unsigned long long)e->size);
      return -1;
    }
    slot = c->n_spare > 0 ? c->spare[--c->n_spare] : c->n_slots++;
    if (ab_seq_push(c->seq, e->size, slot, 0, err) != 0)
      return -1;
  }
  if (map_put(&c->live, (entry){.addr = e->addr, .device = device, .slot = slot}) != 0) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  return 0;
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
  size_t *next = calloc(snap.n_devices ? snap.n_devices : 1, sizeof *next);
  int rc = 0;
  if (next == NULL || map_init(&c.live, 1024) != 0) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    rc = -1;
  }
  int devices_used = 0;
  bool other_streams = false;
  for (size_t d = 0; d < snap.n_devices; d++) {
    devices_used += snap.traces[d].n > 0;
    for (size_t i = 0; i < snap.traces[d].n; i++)
      other_streams |= snap.traces[d].entries[i].stream != 0 && snap.traces[d].entries[i].action == AS_ALLOC;
  }
  while (rc == 0) {
    size_t best = SIZE_MAX;
    for (size_t d = 0; d < snap.n_devices; d++)
      if (next[d] < snap.traces[d].n &&
          (best == SIZE_MAX ||
           snap.traces[d].entries[next[d]].time_us < snap.traces[best].entries[next[best]].time_us))
        best = d;
    if (best == SIZE_MAX)
      break;
    rc = do_entry(&c, (int)best, &snap.traces[best].entries[next[best]++], err);
  }
  /* What is still live at the end: freed, in slot order. */
  for (size_t i = 0; rc == 0 && i < c.live.cap; i++)
    if (c.live.e[i].device >= 0)
      rc = free_slot(&c, c.live.e[i].slot, err);
  size_t drained = c.live.count;
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
  free(next);
  free(c.live.e);
  free(c.spare);
  as_snapshot_free(&snap);
  if (rc != 0)
    ab_seq_free(s);
  return rc;
}
