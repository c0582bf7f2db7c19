/* alloc_snapshot: which segment of snapshot A is which segment of snapshot B, for `diff`.
 *
 * By address: the segments with the same device and address are one segment (a later snapshot of the
 * same process).
 * By history: segments of the same device and total size are paired in the order they were created,
 * the first created in A with the first created in B, and so on (a recording and a replay of one trace,
 * whose device handed out other addresses). A segment's creation is the last segment_alloc entry of
 * its device's trace at its address; segments with one come first, in trace order, then those whose
 * creation is not in the trace, in address order. What is left over in a (device, size) class is
 * added or removed.
 * Auto: by address when more than half of the smaller snapshot's segments have a partner at the same
 * address (or either has none), else by history. */
#ifndef ALLOC_SNAPSHOT_MATCH_H
#define ALLOC_SNAPSHOT_MATCH_H

#include <stddef.h>

#include "../common/snapshot_reader.h"

typedef enum { AS_MATCH_ADDRESS, AS_MATCH_HISTORY, AS_MATCH_AUTO } as_match_mode;

/* One segment of A and its partner in B; a is NULL for a segment only in B, b for one only in A. */
typedef struct {
  const as_segment *a, *b;
} as_seg_pair;

typedef struct {
  as_seg_pair *pairs; /* sorted by device, then the address of a (of b where a is NULL) */
  size_t n;
  size_t matched;    /* pairs with both segments */
  size_t by_address; /* how many pairs matching by address finds (what auto decided on) */
  as_match_mode used; /* address or history, never auto */
} as_matching;

/* 0, or -1 on host OOM. */
int as_match_segments(const as_snapshot *a, const as_snapshot *b, as_match_mode mode, as_matching *out);
void as_matching_free(as_matching *m);

#endif
