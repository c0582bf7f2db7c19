/* The one walk over a snapshot's device traces that alloc_snapshot replay, alloc_snapshot plot and
 * alloc_bench's replay workload share, so that they agree on what a trace means:
 *
 * - Order: the entries of all devices merged by time_us, always the smallest next (ties: the lower
 *   device); within a device the file's order is kept whatever its times say.
 * - Liveness: an `alloc` entry makes its (device, addr) live with its size; a `free_requested` of a live
 *   (device, addr) ends it (TW_FREE).
 * - Unknown frees: a `free_requested` of an addr that is not live was allocated before recording began;
 *   it is reported as TW_UNKNOWN_FREE, for the caller to count and skip.
 * - Implicit frees: an addr allocated again while live lost its free (a damaged or merged trace); the
 *   memory was free in the recording, so the old allocation is reported freed (TW_IMPLICIT_FREE) right
 *   before the new one (TW_ALLOC of the same entry).
 * - 0-byte allocations are live like any other; what they mean is the caller's (alloc_bench skips them,
 *   as every allocator returns NULL for them; replay hands them to cachalot).
 * - Every other entry (free_completed, segment_*, oom, ...) is TW_OTHER: what the recording allocator
 *   did itself.
 */
#ifndef TOOLS_COMMON_TRACE_WALK_H
#define TOOLS_COMMON_TRACE_WALK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot_reader.h"

/* One entry of a tw_map. The walker keys its map by (device, addr); a caller may key its own by
 * anything (replay keys its streams by (device, stream id)). */
typedef struct {
  uint64_t key;
  int device;    /* -1: an empty slot */
  uint64_t size; /* the walker's: the alloc entry's size */
  void *ptr;     /* the caller's: what it made of the allocation (a pointer, a stream) */
  uint64_t tag;  /* the caller's: a number of its own (a slot, a flag) */
} tw_live;

/* (device, key) -> tw_live: open addressing with linear probing, at most half full. Deletion shifts the
 * entries after the hole back instead of leaving tombstones, so a long trace does not slow down as
 * allocations come and go. */
typedef struct {
  tw_live *slots;
  size_t cap, count; /* cap is a power of two */
} tw_map;

/* False on host OOM. */
bool tw_map_init(tw_map *m, size_t cap);
void tw_map_free(tw_map *m);
tw_live *tw_map_find(tw_map *m, int device, uint64_t key);
/* Inserts a key that is not present; its slot, or NULL on host OOM. */
tw_live *tw_map_insert(tw_map *m, tw_live v);
void tw_map_remove(tw_map *m, tw_live *v);
/* The entries in slot order: the first at or after *pos (which moves past it), NULL after the last. */
const tw_live *tw_map_next(const tw_map *m, size_t *pos);

typedef enum {
  TW_ALLOC,         /* an alloc entry: `live` is its new record, for the caller to fill in (ptr, tag) */
  TW_IMPLICIT_FREE, /* the live record of an alloc entry's addr, removed; the entry's TW_ALLOC follows */
  TW_FREE,          /* a free_requested of a live addr: `live` is its record, removed */
  TW_UNKNOWN_FREE,  /* a free_requested of an addr that is not live */
  TW_OTHER,         /* any other entry */
} tw_kind;

typedef struct {
  tw_kind kind;
  int device;               /* the index of its trace */
  size_t index;             /* its index in that trace */
  const as_trace_entry *e;
  tw_live *live;            /* TW_ALLOC: the map's slot; the frees: a copy; valid until the next step */
} tw_step;

typedef struct {
  const as_device_trace *traces;
  size_t n_devices;
  size_t *next; /* per device, the index of its next entry */
  tw_map live;  /* what the trace has live: (device, addr) -> its record */
  tw_live gone; /* the record the last free removed */
  tw_step cur;  /* the entry being walked */
  bool alloc_pending; /* cur is an alloc whose TW_IMPLICIT_FREE was the last step */
} tw_walk;

/* Walks traces[0 .. n_devices): device d is traces[d]. 0, or -1 on host OOM. */
int tw_begin(tw_walk *w, const as_device_trace *traces, size_t n_devices);
/* The next step into *step: 1, or 0 when every entry was walked, or -1 on host OOM. */
int tw_next(tw_walk *w, tw_step *step);
/* What is still live stays in w->live until tw_end. */
void tw_end(tw_walk *w);

#endif
