/* alloc_snapshot plot: the intern tables of intern.h: open addressing over the keys' indices, the keys
 * themselves in one growing array of words. */
#include "intern.h"

#include <stdlib.h>
#include <string.h>

void as_intern_init(as_intern *t) { memset(t, 0, sizeof *t); }

void as_intern_free(as_intern *t) {
  free(t->words);
  free(t->start);
  free(t->slots);
  memset(t, 0, sizeof *t);
}

static uint64_t hash_words(const uint64_t *w, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
  for (size_t i = 0; i < n; i++) {
    h ^= w[i];
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 29;
  }
  return h;
}

const uint64_t *as_intern_key(const as_intern *t, size_t i, size_t *n) {
  *n = t->start[i + 1] - t->start[i];
  return t->words + t->start[i];
}

static int grow_slots(as_intern *t) {
  size_t cap = t->n_slots ? t->n_slots * 2 : 1024;
  uint32_t *slots = calloc(cap, sizeof *slots);
  if (slots == NULL)
    return -1;
  for (size_t k = 0; k < t->n; k++) {
    size_t n;
    const uint64_t *w = as_intern_key(t, k, &n);
    size_t i = (size_t)hash_words(w, n) & (cap - 1);
    while (slots[i] != 0)
      i = (i + 1) & (cap - 1);
    slots[i] = (uint32_t)(k + 1);
  }
  free(t->slots);
  t->slots = slots;
  t->n_slots = cap;
  return 0;
}

/* Room for one more key of n words. */
static int reserve(as_intern *t, size_t n) {
  if (t->n + 2 > t->cap_keys) {
    size_t cap = t->cap_keys ? t->cap_keys * 2 : 256;
    size_t *start = realloc(t->start, cap * sizeof *start);
    if (start == NULL)
      return -1;
    t->start = start;
    t->cap_keys = cap;
  }
  if (t->n_words + n > t->cap_words) {
    size_t cap = t->cap_words ? t->cap_words : 1024;
    while (cap < t->n_words + n)
      cap *= 2;
    uint64_t *words = realloc(t->words, cap * sizeof *words);
    if (words == NULL)
      return -1;
    t->words = words;
    t->cap_words = cap;
  }
  if ((t->n + 1) * 2 > t->n_slots && (t->n >= UINT32_MAX - 1 || grow_slots(t) != 0))
    return -1;
  return 0;
}

long as_intern_words(as_intern *t, const uint64_t *words, size_t n) {
  if (reserve(t, n) != 0)
    return -1;
  if (t->n == 0)
    t->start[0] = 0;
  size_t i = (size_t)hash_words(words, n) & (t->n_slots - 1);
  for (; t->slots[i] != 0; i = (i + 1) & (t->n_slots - 1)) {
    size_t k = t->slots[i] - 1, m;
    const uint64_t *w = as_intern_key(t, k, &m);
    if (m == n && (n == 0 || memcmp(w, words, n * sizeof *w) == 0))
      return (long)k;
  }
  if (n > 0)
    memcpy(t->words + t->n_words, words, n * sizeof *words);
  t->n_words += n;
  t->slots[i] = (uint32_t)(t->n + 1);
  t->start[++t->n] = t->n_words;
  return (long)(t->n - 1);
}

long as_intern_string(as_intern *t, const char *s) {
  size_t len = strlen(s), n = 1 + (len + 7) / 8;
  uint64_t stack[33], *w = n <= 33 ? stack : calloc(n, sizeof *w);
  if (w == NULL)
    return -1;
  memset(w, 0, n * sizeof *w);
  w[0] = len;
  memcpy(w + 1, s, len);
  long r = as_intern_words(t, w, n);
  if (w != stack)
    free(w);
  return r;
}
