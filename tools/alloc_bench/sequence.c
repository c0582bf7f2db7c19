/* alloc_bench: the pre-generated operation sequences (see bench.h). */
#include "bench.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: tiny, fast, and good enough to pick sizes and victims reproducibly. */
void ab_rng_seed(ab_rng *r, uint64_t seed) { r->state = seed; }

uint64_t ab_rng_next(ab_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t ab_rng_below(ab_rng *r, uint64_t n) {
  return ab_rng_next(r) % n; /* the bias (< n / 2^64) is irrelevant here */
}

/* A double in [0, 1). */
static double rng_unit(ab_rng *r) { return (double)(ab_rng_next(r) >> 11) * 0x1.0p-53; }

/* A byte count drawn log-uniformly from [min, max] (lmin, lmax their logarithms). */
static uint64_t log_uniform(ab_rng *r, double lmin, double lmax, uint64_t min, uint64_t max) {
  uint64_t size = (uint64_t)exp(lmin + (lmax - lmin) * rng_unit(r));
  return size < min ? min : size > max ? max : size;
}

int ab_seq_push(ab_seq *s, uint64_t size, uint32_t slot, uint32_t stream, char err[AB_ERR_LEN]) {
  if (stream >= AB_MAX_STREAMS) {
    snprintf(err, AB_ERR_LEN, "stream %" PRIu32 ": a sequence has at most %d streams", stream, AB_MAX_STREAMS);
    return -1;
  }
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    ab_op *ops = realloc(s->ops, cap * sizeof *ops);
    if (ops == NULL) {
      snprintf(err, AB_ERR_LEN, "out of host memory for %zu operations", cap);
      return -1;
    }
    s->ops = ops;
    s->cap = cap;
  }
  s->ops[s->n++] = (ab_op){.size = size, .slot = slot, .stream = (uint16_t)stream};
  return 0;
}

void ab_seq_free(ab_seq *s) {
  free(s->ops);
  memset(s, 0, sizeof *s);
}

int ab_seq_finish(ab_seq *s, char err[AB_ERR_LEN]) {
  uint32_t n_slots = 0;
  for (size_t i = 0; i < s->n; i++)
    if (s->ops[i].slot >= n_slots)
      n_slots = s->ops[i].slot + 1;
  uint64_t *live = calloc(n_slots ? n_slots : 1, sizeof *live); /* size + 1 while live, 0 when free */
  if (live == NULL) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  uint64_t cur = 0, peak = 0;
  size_t allocs = 0, n_live = 0;
  int rc = 0;
  for (size_t i = 0; i < s->n && rc == 0; i++) {
    const ab_op *o = &s->ops[i];
    if (o->size != 0) {
      if (live[o->slot] != 0) {
        snprintf(err, AB_ERR_LEN, "internal error: op %zu allocates into live slot %u", i, o->slot);
        rc = -1;
        break;
      }
      live[o->slot] = o->size + 1;
      cur += o->size;
      peak = cur > peak ? cur : peak;
      allocs++;
      n_live++;
    } else {
      if (live[o->slot] == 0) {
        snprintf(err, AB_ERR_LEN, "internal error: op %zu frees free slot %u", i, o->slot);
        rc = -1;
        break;
      }
      cur -= live[o->slot] - 1;
      live[o->slot] = 0;
      n_live--;
    }
  }
  if (rc == 0 && n_live != 0) {
    snprintf(err, AB_ERR_LEN, "internal error: %zu allocations live at the end of a sequence", n_live);
    rc = -1;
  }
  free(live);
  s->n_slots = n_slots;
  s->n_allocs = allocs;
  s->peak_requested = peak;
  return rc == 0 ? 0 : -1;
}

int ab_seq_undo(const ab_seq *s, size_t done, ab_seq *out, char err[AB_ERR_LEN]) {
  memset(out, 0, sizeof *out);
  uint32_t *stream = malloc((s->n_slots ? s->n_slots : 1) * sizeof *stream);
  bool *live = calloc(s->n_slots ? s->n_slots : 1, sizeof *live);
  int rc = 0;
  if (stream == NULL || live == NULL) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    rc = -1;
  }
  for (size_t i = 0; rc == 0 && i < done && i < s->n; i++) {
    live[s->ops[i].slot] = s->ops[i].size != 0;
    stream[s->ops[i].slot] = s->ops[i].stream;
  }
  for (uint32_t k = 0; rc == 0 && k < s->n_slots; k++)
    if (live[k])
      rc = ab_seq_push(out, 0, k, stream[k], err);
  free(stream);
  free(live);
  return rc;
}

int ab_seq_pair(ab_seq *s, uint64_t size, size_t pairs, char err[AB_ERR_LEN]) {
  memset(s, 0, sizeof *s);
  for (size_t i = 0; i < pairs; i++)
    if (ab_seq_push(s, size, 0, 0, err) || ab_seq_push(s, 0, 0, 0, err))
      return -1;
  return ab_seq_finish(s, err);
}

int ab_seq_cross(ab_seq *s, uint64_t size, size_t pairs, uint32_t every, char err[AB_ERR_LEN]) {
  memset(s, 0, sizeof *s);
  for (size_t i = 0; i < pairs; i++) {
    if (ab_seq_push(s, size, 0, 0, err) || ab_seq_push(s, 0, 0, 0, err))
      return -1;
    if (every != 0 && i % every == every - 1)
      s->ops[s->n - 1].record = 2; /* streams[1] */
  }
  return ab_seq_finish(s, err);
}

int ab_seq_streams(ab_seq *s, uint32_t requests, uint64_t small, uint64_t large, char err[AB_ERR_LEN]) {
  memset(s, 0, sizeof *s);
  for (uint32_t i = 0; i < requests; i++)
    if (ab_seq_push(s, small, 0, i, err) || ab_seq_push(s, large, 1, i, err) || ab_seq_push(s, 0, 0, i, err) ||
        ab_seq_push(s, 0, 1, i, err))
      return -1;
  return ab_seq_finish(s, err);
}

int ab_seq_random(ab_seq *s, uint64_t min, uint64_t max, size_t steps, uint32_t cap, uint32_t n_streams,
                  uint64_t seed, char err[AB_ERR_LEN]) {
  memset(s, 0, sizeof *s);
  /* live[0 .. n_live) are the live slots; free slots are reused lowest-first from a stack. */
  uint32_t *live = malloc((size_t)cap * sizeof *live), *spare = malloc((size_t)cap * sizeof *spare);
  if (live == NULL || spare == NULL || cap == 0 || n_streams == 0) {
    free(live);
    free(spare);
    snprintf(err, AB_ERR_LEN, cap == 0 || n_streams == 0 ? "internal error: empty cap" : "out of host memory");
    return -1;
  }
  uint32_t n_live = 0, n_spare = cap;
  for (uint32_t i = 0; i < cap; i++)
    spare[i] = cap - 1 - i;
  ab_rng rng;
  ab_rng_seed(&rng, seed);
  double lmin = log((double)min), lmax = log((double)max);
  int rc = 0;
  for (size_t step = 0; rc == 0 && step < steps; step++) {
    bool alloc = n_live == 0 || (n_live < cap && ab_rng_below(&rng, 100) < 73);
    if (alloc) {
      uint64_t size = log_uniform(&rng, lmin, lmax, min, max);
      uint32_t slot = spare[--n_spare];
      live[n_live++] = slot;
      rc = ab_seq_push(s, size, slot, slot % n_streams, err);
    } else {
      uint32_t i = (uint32_t)ab_rng_below(&rng, n_live), slot = live[i];
      live[i] = live[--n_live];
      spare[n_spare++] = slot;
      rc = ab_seq_push(s, 0, slot, slot % n_streams, err);
    }
  }
  while (rc == 0 && n_live > 0) {
    uint32_t i = (uint32_t)ab_rng_below(&rng, n_live), slot = live[i];
    live[i] = live[--n_live];
    rc = ab_seq_push(s, 0, slot, slot % n_streams, err);
  }
  free(live);
  free(spare);
  return rc ? rc : ab_seq_finish(s, err);
}

int ab_seq_host(ab_seq *s, uint64_t min, uint64_t max, size_t pairs, uint64_t seed, char err[AB_ERR_LEN]) {
  memset(s, 0, sizeof *s);
  ab_rng rng;
  ab_rng_seed(&rng, seed);
  double lmin = log((double)min), lmax = log((double)max);
  for (size_t i = 0; i < pairs; i++)
    if (ab_seq_push(s, log_uniform(&rng, lmin, lmax, min, max), 0, 0, err) || ab_seq_push(s, 0, 0, 0, err))
      return -1;
  return ab_seq_finish(s, err);
}
