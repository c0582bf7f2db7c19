/* Metadata free lists: block and pending-event records come from chunks a device keeps until destroy and
 * go back to per-device spare lists, so the hot paths never call the host allocator for them. */
#include "core.h"

#include <stdlib.h>

enum { CHUNK_BLOCKS = 64 };

/* Registers a host chunk for release at destroy. False on host OOM (the chunk is then freed). */
static bool keep_chunk_locked(cl_device *d, void *chunk) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->n_chunks == d->cap_chunks) {
    size_t cap = d->cap_chunks ? d->cap_chunks * 2 : 16;
    void **c = realloc(d->chunks, cap * sizeof *c);
    if (!c) {
      free(chunk);
      return false;
    }
    d->chunks = c;
    d->cap_chunks = cap;
  }
  d->chunks[d->n_chunks++] = chunk;
  return true;
}

cl_block *cl_block_new_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  if (!d->spare_blocks) {
    /* aligned, so that each block's first half is one cache line */
    cl_block *chunk = aligned_alloc(_Alignof(cl_block), CHUNK_BLOCKS * sizeof *chunk);
    if (!chunk || !keep_chunk_locked(d, chunk))
      return NULL;
    memset(chunk, 0, CHUNK_BLOCKS * sizeof *chunk);
    for (int i = 0; i < CHUNK_BLOCKS; i++) {
      chunk[i].next = d->spare_blocks;
      d->spare_blocks = &chunk[i];
    }
  }
  cl_block *b = d->spare_blocks;
  d->spare_blocks = b->next;
  cachalot_stream *uses = b->uses;
  uint32_t cap = b->cap_uses;
  memset(b, 0, sizeof *b);
  b->uses = uses; /* a recycled block keeps its record_stream array: no allocation next time */
  b->cap_uses = cap;
  return b;
}

void cl_block_delete_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  b->state = CL_FREE;
  b->seg = NULL;
  b->next = d->spare_blocks;
  d->spare_blocks = b;
}

cl_pending_event *cl_pending_new_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  if (!d->spare_events) {
    cl_pending_event *chunk = calloc(CHUNK_BLOCKS, sizeof *chunk);
    if (!chunk || !keep_chunk_locked(d, chunk))
      return NULL;
    for (int i = 0; i < CHUNK_BLOCKS; i++) {
      chunk[i].next = d->spare_events;
      d->spare_events = &chunk[i];
    }
  }
  cl_pending_event *e = d->spare_events;
  d->spare_events = e->next;
  memset(e, 0, sizeof *e);
  return e;
}

void cl_pending_delete_locked(cl_device *d, cl_pending_event *e) {
  CL_ASSERT_EXCLUSIVE(d);
  e->next = d->spare_events;
  d->spare_events = e;
}
