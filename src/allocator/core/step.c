/* The step tracker: see step.h. */
#include "step.h"

#include <stdlib.h>
#include <string.h>

enum { GRAMS_BITS = 16 };

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

static uint64_t malloc_sym(size_t size, cachalot_stream stream) {
  return mix((uint64_t)size * 0x9e3779b97f4a7c15ULL ^ mix((uint64_t)(uintptr_t)stream) ^ 1);
}

static uint64_t free_sym(uint64_t ago) { return mix(ago * 0x9e3779b97f4a7c15ULL ^ 2); }

static uint64_t fold(uint64_t h, uint64_t sym) { return (h ^ sym) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL; }

static cl_step_event *at(const cl_step *st, uint64_t i) { return &st->ring[i % CL_STEP_RING]; }

/* The hash of the W events ending at event i (i + 1 >= W). */
static uint64_t gram_ring(const cl_step *st, uint64_t i) {
  uint64_t h = 0;
  for (uint64_t k = i + 1 - CL_STEP_W; k <= i; k++)
    h = fold(h, at(st, k)->sym);
  return mix(h);
}

/* The hash of the W events of the period ending at position q, the period taken as a circle. */
static uint64_t gram_period(const cl_step *st, uint64_t q) {
  uint64_t h = 0;
  for (uint64_t k = 0; k < CL_STEP_W; k++)
    h = fold(h, st->sym[(q + st->period * CL_STEP_W + 1 - CL_STEP_W + k) % st->period]);
  return mix(h);
}

cl_step *cl_step_new(void) {
  cl_step *st = calloc(1, sizeof *st);
  if (!st)
    return NULL;
  st->ring = calloc(CL_STEP_RING, sizeof *st->ring);
  st->grams_mask = ((size_t)1 << GRAMS_BITS) - 1;
  st->grams = calloc(st->grams_mask + 1, sizeof *st->grams);
  if (!st->ring || !st->grams) {
    cl_step_delete(st);
    return NULL;
  }
  return st;
}

void cl_step_forget(cl_step *st) {
  free(st->sym);
  free(st->pgrams);
  st->sym = NULL;
  st->pgrams = NULL;
  st->period = st->start = st->pos = st->lap = st->lost = st->matched = 0;
  st->synced = false;
  st->n_cand = 0;
}

void cl_step_delete(cl_step *st) {
  if (!st)
    return;
  cl_step_forget(st);
  free(st->ring);
  free(st->grams);
  free(st);
}

bool cl_step_found(const cl_step *st) { return st->period && !st->sym; }

/* Looking for a period: the candidates checked against event i, then new ones from its chain. */
static void detect(cl_step *st, uint64_t i) {
  const cl_step_event *e = at(st, i);
  size_t kept = 0;
  for (size_t c = 0; c < st->n_cand; c++) {
    const uint64_t d = st->cand[c].d;
    const cl_step_event *o = at(st, i - d);
    if (o->sym != e->sym)
      continue;
    if (++st->cand[c].run >= d && o->live == e->live) {
      st->period = d;
      st->start = i + 1 - d;
      st->n_cand = 0;
      st->found++;
      return;
    }
    st->cand[kept++] = st->cand[c];
  }
  st->n_cand = kept;
  /* (a walk of CL_STEP_CHAIN at most: a layer's pattern repeating inside the step makes a long chain) */
  uint64_t at1 = e->prev;
  for (int k = 0; k < CL_STEP_CHAIN && at1 && st->n_cand < CL_STEP_CANDIDATES; k++) {
    const uint64_t j = at1 - 1, d = i - j;
    if (d > CL_STEP_MAX_PERIOD)
      break;
    if (d < CL_STEP_MIN_PERIOD) {
      at1 = at(st, j)->prev;
      continue;
    }
    bool known = false;
    for (size_t c = 0; c < st->n_cand && !known; c++)
      known = st->cand[c].d == d;
    if (!known && st->n_cand < CL_STEP_CANDIDATES)
      st->cand[st->n_cand++] = (struct cl_step_cand){d, 0};
    at1 = at(st, j)->prev;
  }
}

/* Following the period: event i (whose W events hash to h, when i + 1 >= W) is the expected one, or
 * the tracker looks for where it is in the period again. */
static void follow(cl_step *st, uint64_t i, uint64_t h) {
  const cl_step_event *e = at(st, i);
  st->lost++;
  if (st->synced && st->sym[st->pos] == e->sym) {
    if (++st->pos == st->period) {
      st->pos = 0;
      st->lap++;
    }
    if (e->size) /* a malloc: frees alone can match a step whose sizes all changed */
      st->lost = 0;
    st->matched++;
    return;
  }
  st->matched = 0;
  if (st->synced)
    st->lost_since++;
  st->synced = false;
  if (i + 1 < CL_STEP_W)
    return;
  const struct cl_step_gram *g = &st->pgrams[h & st->pgrams_mask];
  if (g->hash == h && g->at1) { /* a place in the period that these W events end at, and no other */
    st->pos = g->at1 % st->period;
    if (st->pos == 0)
      st->lap++;
    st->synced = true;
    st->matched = CL_STEP_W;
  }
}

static void record(cl_step *st, uint64_t sym, size_t size, cachalot_stream stream) {
  const uint64_t i = st->n++;
  cl_step_event *e = at(st, i);
  *e = (cl_step_event){sym, st->live, size, stream, 0, 0};
  uint64_t h = 0;
  if (i + 1 >= CL_STEP_W) {
    h = gram_ring(st, i);
    struct cl_step_gram *g = &st->grams[h & st->grams_mask];
    if (g->hash == h && g->at1 && i - (g->at1 - 1) < CL_STEP_RING)
      e->prev = g->at1;
    *g = (struct cl_step_gram){h, i + 1};
  }
  if (st->sym)
    follow(st, i, h);
  else if (!st->period)
    detect(st, i);
}

uint64_t cl_step_malloc(cl_step *st, size_t size, size_t held, cachalot_stream stream) {
  st->live += (int64_t)held;
  record(st, malloc_sym(size, stream), size, stream);
  return st->n;
}

bool cl_step_position(const cl_step *st, size_t size, cachalot_stream stream, uint64_t *pos, uint64_t *lap) {
  /* after a loss, a whole period must match again first: a program that left its step (a first step after
   * a restart, an evaluation) may make the step's sizes for blocks of other lives */
  if (!cl_step_following(st) || st->sym[st->pos] != malloc_sym(size, stream))
    return false;
  *pos = st->pos;
  *lap = st->lap;
  return true;
}

void cl_step_free(cl_step *st, uint64_t seq, size_t size) {
  const uint64_t i = st->n, j = seq - 1;
  if (seq == 0 || j >= i) /* numbered by an earlier tracker (the config changed meanwhile) */
    return;
  if (i - j < CL_STEP_RING)
    at(st, j)->life = i - j;
  st->live -= (int64_t)size;
  record(st, free_sym(i - j), 0, NULL);
}

const cl_step_event *cl_step_window(const cl_step *st, uint64_t k) { return at(st, st->start + k); }

bool cl_step_life(const cl_step *st, uint64_t k, uint64_t *life) {
  const uint64_t m = st->start + k;
  if (at(st, m)->life) {
    *life = at(st, m)->life;
    return true;
  }
  if (m < st->period || st->n - (m - st->period) >= CL_STEP_RING)
    return false;
  const cl_step_event *o = at(st, m - st->period);
  if (!o->life || o->sym != at(st, m)->sym)
    return false;
  *life = o->life;
  return true;
}

bool cl_step_follow(cl_step *st) {
  const uint64_t P = st->period;
  size_t cap = 1;
  while (cap < 4 * P)
    cap *= 2;
  st->sym = malloc(P * sizeof *st->sym);
  st->pgrams = calloc(cap, sizeof *st->pgrams);
  if (!st->sym || !st->pgrams) {
    cl_step_forget(st);
    return false;
  }
  for (uint64_t k = 0; k < P; k++)
    st->sym[k] = at(st, st->start + k)->sym;
  st->pgrams_mask = cap - 1;
  for (uint64_t q = 0; q < P; q++) {
    const uint64_t h = gram_period(st, q);
    struct cl_step_gram *g = &st->pgrams[h & st->pgrams_mask];
    if (g->hash == h && g->at1) /* W events that end at two places: no place */
      g->at1 = 0;
    else if (!g->at1 && g->hash != h)
      *g = (struct cl_step_gram){h, q + 1};
    /* (a slot taken by other W events keeps them: those events resync, these do not) */
  }
  st->pos = (st->n - st->start) % P;
  st->lap = (st->n - st->start) / P;
  st->synced = true;
  st->lost = 0;
  st->matched = P; /* the period just matched */
  return true;
}
