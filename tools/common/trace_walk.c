/* The trace walker of trace_walk.h: its (device, key) map and the time-merged walk over the devices. */
#include "trace_walk.h"

#include <stdlib.h>

/* The slot a key hashes to. Device addresses share their low bits (alignment) and their high bits, so
 * the key is mixed (murmur3's finaliser) before it is masked. alloc_bench's sequence frees what is
 * live at the end in slot order: changing this hash changes its operations. */
static size_t home(const tw_map *m, int device, uint64_t key) {
  uint64_t h = key ^ ((uint64_t)(unsigned)device << 52);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (size_t)h & (m->cap - 1);
}

bool tw_map_init(tw_map *m, size_t cap) {
  m->cap = cap;
  m->count = 0;
  m->slots = malloc(cap * sizeof *m->slots);
  if (m->slots == NULL)
    return false;
  for (size_t i = 0; i < cap; i++)
    m->slots[i].device = -1;
  return true;
}

void tw_map_free(tw_map *m) {
  free(m->slots);
  m->slots = NULL;
  m->cap = m->count = 0;
}

tw_live *tw_map_find(tw_map *m, int device, uint64_t key) {
  for (size_t i = home(m, device, key);; i = (i + 1) & (m->cap - 1)) {
    tw_live *s = &m->slots[i];
    if (s->device < 0)
      return NULL;
    if (s->device == device && s->key == key)
      return s;
  }
}

tw_live *tw_map_insert(tw_map *m, tw_live v) {
  if ((m->count + 1) * 2 > m->cap) {
    tw_map bigger;
    if (m->cap > SIZE_MAX / 2 / sizeof(tw_live) || !tw_map_init(&bigger, m->cap * 2))
      return NULL;
    for (size_t i = 0; i < m->cap; i++)
      if (m->slots[i].device >= 0)
        tw_map_insert(&bigger, m->slots[i]); /* cannot grow again: half empty */
    free(m->slots);
    *m = bigger;
  }
  size_t i = home(m, v.device, v.key);
  while (m->slots[i].device >= 0)
    i = (i + 1) & (m->cap - 1);
  m->slots[i] = v;
  m->count++;
  return &m->slots[i];
}

void tw_map_remove(tw_map *m, tw_live *v) {
  size_t hole = (size_t)(v - m->slots), mask = m->cap - 1;
  m->slots[hole].device = -1;
  m->count--;
  /* Shift back the entries after the hole whose home slot is at or before it. */
  for (size_t j = (hole + 1) & mask; m->slots[j].device >= 0; j = (j + 1) & mask) {
    size_t h = home(m, m->slots[j].device, m->slots[j].key);
    bool stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
    if (!stays) {
      m->slots[hole] = m->slots[j];
      m->slots[j].device = -1;
      hole = j;
    }
  }
}

const tw_live *tw_map_next(const tw_map *m, size_t *pos) {
  for (; *pos < m->cap; (*pos)++)
    if (m->slots[*pos].device >= 0)
      return &m->slots[(*pos)++];
  return NULL;
}

int tw_begin(tw_walk *w, const as_device_trace *traces, size_t n_devices) {
  *w = (tw_walk){.traces = traces, .n_devices = n_devices};
  w->next = calloc(n_devices ? n_devices : 1, sizeof *w->next);
  if (w->next == NULL || !tw_map_init(&w->live, 1024)) {
    tw_end(w);
    return -1;
  }
  return 0;
}

void tw_end(tw_walk *w) {
  free(w->next);
  w->next = NULL;
  tw_map_free(&w->live);
}

/* The device whose next entry comes first, or SIZE_MAX when every trace is done. */
static size_t first_device(const tw_walk *w) {
  size_t best = SIZE_MAX;
  for (size_t d = 0; d < w->n_devices; d++)
    if (w->next[d] < w->traces[d].n &&
        (best == SIZE_MAX ||
         w->traces[d].entries[w->next[d]].time_us < w->traces[best].entries[w->next[best]].time_us))
      best = d;
  return best;
}

/* Takes the record of cur's (device, addr) out of the map into w->gone; false when it is not live. */
static bool take_live(tw_walk *w) {
  tw_live *v = tw_map_find(&w->live, w->cur.device, w->cur.e->addr);
  if (v == NULL)
    return false;
  w->gone = *v;
  tw_map_remove(&w->live, v);
  w->cur.live = &w->gone;
  return true;
}

static int alloc_step(tw_walk *w, tw_step *step) {
  w->cur.kind = TW_ALLOC;
  w->cur.live = tw_map_insert(&w->live, (tw_live){.key = w->cur.e->addr, .device = w->cur.device,
                                                  .size = w->cur.e->size});
  if (w->cur.live == NULL)
    return -1;
  *step = w->cur;
  return 1;
}

int tw_next(tw_walk *w, tw_step *step) {
  if (w->alloc_pending) {
    w->alloc_pending = false;
    return alloc_step(w, step);
  }
  size_t d = first_device(w);
  if (d == SIZE_MAX)
    return 0;
  size_t i = w->next[d]++;
  w->cur = (tw_step){.kind = TW_OTHER, .device = (int)d, .index = i, .e = &w->traces[d].entries[i]};
  if (w->cur.e->action == AS_FREE_REQUESTED) {
    w->cur.kind = take_live(w) ? TW_FREE : TW_UNKNOWN_FREE;
  } else if (w->cur.e->action == AS_ALLOC) {
    if (!take_live(w))
      return alloc_step(w, step);
    w->cur.kind = TW_IMPLICIT_FREE;
    w->alloc_pending = true;
  }
  *step = w->cur;
  return 1;
}
