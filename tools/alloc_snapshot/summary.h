/* alloc_snapshot: totals over segments, grouped by (device, pool id, segment type, stream): what `show`
 * prints and `diff` compares. */
#ifndef ALLOC_SNAPSHOT_SUMMARY_H
#define ALLOC_SNAPSHOT_SUMMARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/snapshot_reader.h"

typedef struct {
  int device;
  uint64_t pool_id[2];
  bool small;
  uint64_t stream;
} as_group_key;

/* Byte totals saturate at UINT64_MAX (only a hostile file gets there). */
typedef struct {
  as_group_key key;
  uint64_t segments, blocks;
  uint64_t reserved;       /* total_size */
  uint64_t allocated;      /* allocated_size: active_allocated blocks */
  uint64_t active;         /* active_size: allocated + pending free */
  uint64_t requested;      /* requested_size */
  uint64_t free;           /* inactive blocks */
  uint64_t inactive_split; /* inactive blocks of segments split into several blocks */
  uint64_t largest_free;   /* the largest inactive block */
} as_group;

int as_key_cmp(const as_group_key *a, const as_group_key *b);
/* Adds one segment to a group's totals. */
void as_group_add(as_group *g, const as_segment *s);
/* 1 - largest_free / free: 0 when all free memory is one block, near 1 when it is many small ones;
 * negative (no free memory) when free is 0. */
double as_fragmentation(const as_group *g);

/* The groups of a snapshot's segments, sorted by key. *out is malloc'ed (free() it); -1 on host OOM. */
int as_group_segments(const as_snapshot *s, as_group **out, size_t *n);
/* The segments sorted by (device, address): an array of pointers into s (free() it); NULL on host OOM. */
const as_segment **as_sorted_segments(const as_snapshot *s);

enum { AS_POOL_BUF = 48 };
/* "A,B", as --pool takes it. */
char *as_fmt_pool(char buf[AS_POOL_BUF], const uint64_t pool_id[2]);

#endif
