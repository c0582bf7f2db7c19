/* alloc_snapshot plot: intern tables for the explorer's data (explorer_data.c). The page names each
 * distinct string, frame, stack and address once, in a table, and refers to it by index: a trace of
 * half a million entries repeats the same few hundred stacks and a few thousand addresses. */
#ifndef ALLOC_SNAPSHOT_PLOT_INTERN_H
#define ALLOC_SNAPSHOT_PLOT_INTERN_H

#include <stddef.h>
#include <stdint.h>

/* Sequences of 64-bit words -> their index, in first-seen order. A string is interned as its bytes
 * (packed into words, its length first), a frame as (name, filename, line), a stack as its frame
 * indices, an address as itself. */
typedef struct {
  uint64_t *words; /* every key, one after another */
  size_t n_words, cap_words;
  size_t *start; /* start[i]: where key i begins in words; start[n] is n_words */
  size_t n, cap_keys;
  uint32_t *slots; /* hash slots: key index + 1, 0 is empty */
  size_t n_slots;  /* a power of two, at most half full */
} as_intern;

void as_intern_init(as_intern *t);
void as_intern_free(as_intern *t);
/* The index of the key words[0 .. n), added when new; -1 on host OOM. */
long as_intern_words(as_intern *t, const uint64_t *words, size_t n);
/* A NUL-terminated string's index; -1 on host OOM. */
long as_intern_string(as_intern *t, const char *s);
/* Key i's words, and how many. */
const uint64_t *as_intern_key(const as_intern *t, size_t i, size_t *n);

#endif
