/* Checkpoint and restore of a private pool (cachalot_checkpoint_pool, cachalot_restore_pool): the pool's
 * segments and blocks as plain data, and the re-carving of the same segments into those blocks later.
 * The pools themselves are in pool.c. */
#include "pools.h"

#include <stdlib.h>


/* The pool's segments (not being released), in address order, in a malloc'ed array. */
static cachalot_status pool_segments_locked(cl_device *d, cl_pool *p, cl_segment ***out, size_t *n) {
  CL_ASSERT_EXCLUSIVE(d);
  *out = NULL;
  *n = 0;
  if (!p->n_segments)
    return CACHALOT_OK;
  cl_segment **v = malloc(p->n_segments * sizeof *v);
  if (!v)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
  size_t k = 0;
  for (cl_segment *s = d->segments; s; s = s->next)
    if (s->pool == p && !s->releasing)
      v[k++] = s;
  qsort(v, k, sizeof *v, cl_segment_cmp_addr);
  *out = v;
  *n = k;
  return CACHALOT_OK;
}

static void state_free(cachalot_pool_state *st) {
  if (!st)
    return;
  for (size_t i = 0; i < st->n_segments; i++)
    free(st->segments[i].blocks);
  free(st->segments);
  free(st);
}

void cachalot_pool_state_free(cachalot_pool_state *st) { state_free(st); }

cachalot_status cachalot_checkpoint_pool(cachalot_allocator *a, int device, cachalot_mempool_id id,
                                         cachalot_pool_state **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_checkpoint_pool: out is NULL");
  *out = NULL;
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_checkpoint_pool", &d);
  if (rc != CACHALOT_OK)
    return rc;
  cl_pool *p = cl_find_pool_locked(d, id);
  cl_segment **segs = NULL;
  size_t n = 0;
  cachalot_pool_state *st = NULL;
  if (!p) {
    rc = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_checkpoint_pool: no such pool " CL_POOL_ID_FMT, CL_POOL_ID_ARGS(id));
    goto out;
  }
  if ((rc = pool_segments_locked(d, p, &segs, &n)) != CACHALOT_OK)
    goto out;
  st = calloc(1, sizeof *st);
  if (!st || (n && !(st->segments = calloc(n, sizeof *st->segments)))) {
    rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_checkpoint_pool: host out of memory");
    goto out;
  }
  st->device = device;
  st->pool = id;
  for (size_t i = 0; i < n; i++) {
    cachalot_segment_state *ss = &st->segments[i];
    st->n_segments = i + 1; /* so that a failure below frees what was filled */
    ss->address = segs[i]->ptr;
    ss->size = segs[i]->size;
    ss->stream = segs[i]->stream;
    ss->small = segs[i]->small;
    for (cl_block *b = segs[i]->head; b; b = b->next)
      ss->n_blocks++;
    if (!(ss->blocks = calloc(ss->n_blocks, sizeof *ss->blocks))) {
      rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_checkpoint_pool: host out of memory");
      goto out;
    }
    size_t k = 0;
    for (cl_block *b = segs[i]->head; b; b = b->next, k++)
      ss->blocks[k] = (cachalot_block_state){b->ptr - segs[i]->ptr, b->size, b->state == CL_FREE ? 0 : b->requested,
                                             b->state != CL_FREE};
  }
out:
  cl_leave_exclusive(d);
  free(segs);
  if (rc == CACHALOT_OK)
    *out = st;
  else
    state_free(st);
  return rc;
}

/* Whether checkpointed segment `ss` can be re-carved into `s`: same place, size, stream and kind, and
 * blocks that tile it. */
static bool segment_matches(const cl_segment *s, const cachalot_segment_state *ss) {
  if (s->size != ss->size || s->stream != ss->stream || s->small != ss->small || !ss->n_blocks || !ss->blocks)
    return false;
  uintptr_t off = 0;
  for (size_t k = 0; k < ss->n_blocks; k++) {
    const cachalot_block_state *bs = &ss->blocks[k];
    if (bs->offset != off || bs->size == 0 || bs->size % CL_MIN_BLOCK || bs->size > s->size - off ||
        (bs->allocated && (bs->requested == 0 || bs->requested > bs->size)) || (k && !bs->allocated &&
                                                                                  !ss->blocks[k - 1].allocated))
      return false;
    off += bs->size;
  }
  return off == s->size;
}

/* Gives an ALLOCATED block back as free() would with no stream uses. */
static void free_allocated_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_stats_free_called(d, b->seg->small, b->size);
  cl_trace_locked(d, CL_TRACE_FREE_REQUESTED, b->ptr, b->requested, b->seg->stream);
  b->n_uses = 0;
  cl_free_block_locked(d, b);
}

/* Gives unused block metadata back. */
static void drop_spares_locked(cl_device *d, cl_block *spare) {
  CL_ASSERT_EXCLUSIVE(d);
  while (spare) {
    cl_block *b = spare;
    spare = b->next;
    cl_block_delete_locked(d, b);
  }
}

/* Re-carves segment `s` (a single FREE block, in its index) into the blocks of `ss`, taking block
 * metadata from `spare` (linked through next). Allocated blocks are appended to ptrs. */
static void recarve_locked(cl_device *d, cl_segment *s, const cachalot_segment_state *ss, cl_block **spare,
                           void **ptrs, size_t *n_ptrs) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_device_stats *st = &d->stats;
  const bool small = s->small;
  const bool split = ss->n_blocks > 1;
  cl_block *head = s->head;
  cl_free_index_remove_locked(d, head);
  cl_block *prev = NULL;
  for (size_t k = 0; k < ss->n_blocks; k++) {
    const cachalot_block_state *bs = &ss->blocks[k];
    cl_block *b = k == 0 ? head : *spare;
    if (k)
      *spare = b->next;
    b->ptr = s->ptr + bs->offset;
    b->size = bs->size;
    b->seg = s;
    b->prev = prev;
    b->next = NULL;
    if (prev)
      prev->next = b;
    prev = b;
  }
  s->tail = prev;
  size_t k = 0;
  for (cl_block *b = head; b; b = b->next, k++) {
    const cachalot_block_state *bs = &ss->blocks[k];
    cl_block **slot = cl_seg_slot(s, b->ptr);
    const bool taken = bs->allocated && *slot; /* two handed-out large blocks in one MiB: not a real state */
    if (bs->allocated && !taken)
      *slot = b;
    if (!bs->allocated || taken) {
      /* a block the handed-out table cannot take stays free rather than be lost */
      cl_free_index_insert_locked(d, b);
      if (split) {
        cl_stat_array_add(st->inactive_split, small, 1);
        cl_stat_array_add(st->inactive_split_bytes, small, (int64_t)b->size);
      }
      continue;
    }
    b->state = CL_ALLOCATED;
    b->requested = bs->requested;
    b->n_uses = 0;
    b->event_count = 0;
    cl_stats_hand_out_locked(d, small, b->size, b->requested);
    cl_trace_locked(d, CL_TRACE_ALLOC, b->ptr, b->requested, s->stream);
    if (CL_UNLIKELY(cl_tls_alloc_ctx != NULL || d->trace.frames != NULL)) /* as hand_out keeps a malloc's */
      cl_ctx_attach_locked(d, b->ptr);
    ptrs[(*n_ptrs)++] = (void *)b->ptr;
  }
}

/* A checkpoint whose arrays cannot be walked safely is refused before the device is touched. */
static cachalot_status check_state_shape(const cachalot_pool_state *state) {
  if (state->n_segments && !state->segments)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_restore_pool: %zu segments but no array",
                   state->n_segments);
  /* Address order, each segment once (a segment named twice was re-carved twice: a crash) */
  for (size_t i = 1; i < state->n_segments; i++)
    if (state->segments[i].address <= state->segments[i - 1].address)
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_restore_pool: segment %zu (0x%llx) does not follow segment %zu (0x%llx) in address "
                     "order", i, (unsigned long long)state->segments[i].address, i - 1,
                     (unsigned long long)state->segments[i - 1].address);
  return CACHALOT_OK;
}

/* What the output and the block metadata are sized by: the checkpoint's allocated blocks, and all of them. */
static void count_blocks(const cachalot_pool_state *state, size_t *n_alloc, size_t *n_blocks) {
  *n_alloc = *n_blocks = 0;
  for (size_t i = 0; i < state->n_segments; i++) {
    *n_blocks += state->segments[i].n_blocks;
    for (size_t k = 0; k < state->segments[i].n_blocks; k++)
      *n_alloc += state->segments[i].blocks[k].allocated;
  }
}

/* Each checkpointed segment must still be a segment of p, the same as then: targets[i] is segment i's. */
static cachalot_status find_targets_locked(cl_device *d, const cl_pool *p, const cachalot_pool_state *state,
                                           cl_segment **targets) {
  CL_ASSERT_EXCLUSIVE(d);
  for (size_t i = 0; i < state->n_segments; i++) {
    targets[i] = NULL;
    for (cl_segment *s = d->segments; s; s = s->next)
      if (s->pool == p && !s->releasing && s->ptr == state->segments[i].address)
        targets[i] = s;
    if (!targets[i] || !segment_matches(targets[i], &state->segments[i]))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_restore_pool: segment 0x%llx of the checkpoint is %s", (unsigned long long)
                     state->segments[i].address, targets[i] ? "not the same segment any more" : "no longer in the pool");
  }
  return CACHALOT_OK;
}

/* Whether blocks of p wait for events: restore must wait for them, which a capture forbids. */
static bool pool_pending_locked(cl_device *d, const cl_pool *p) {
  CL_ASSERT_EXCLUSIVE(d);
  bool pending = false;
  for (cl_segment *s = d->segments; s; s = s->next)
    for (cl_block *b = s->head; b && s->pool == p; b = b->next)
      pending |= b->state == CL_PENDING;
  return pending;
}

/* Metadata for every block of the checkpoint, taken while nothing has changed yet (added to *spare). */
static cachalot_status take_spares_locked(cl_device *d, size_t n_blocks, cl_block **spare) {
  CL_ASSERT_EXCLUSIVE(d);
  for (size_t k = 0; k < n_blocks; k++) {
    cl_block *b = cl_block_new_locked(d);
    if (!b)
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_restore_pool: host out of memory");
    b->next = *spare;
    *spare = b;
  }
  return CACHALOT_OK;
}

/* Free what is allocated now: every segment of the pool becomes one free block. */
static void free_pool_blocks_locked(cl_device *d, const cl_pool *p) {
  CL_ASSERT_EXCLUSIVE(d);
  for (cl_segment *s = d->segments; s; s = s->next) {
    if (s->pool != p)
      continue;
    for (cl_block *b = s->head, *next; b; b = next) {
      next = b->next;
      if (b->state == CL_ALLOCATED) {
        free_allocated_locked(d, b);
        next = s->head; /* merging may have removed `next`: walk the segment again */
      }
    }
  }
}

/* A pending block whose wait failed (a device error) still holds part of a target segment: the restore
 * fails then, before anything of the pool has changed. (Once no target holds a pending block, freeing the
 * pool's allocated blocks leaves each target one free block, which recarve_locked expects.) */
static cachalot_status check_targets_settled(const cachalot_pool_state *state, cl_segment *const *targets) {
  for (size_t i = 0; i < state->n_segments; i++)
    for (const cl_block *b = targets[i]->head; b; b = b->next)
      if (b->state == CL_PENDING)
        return cl_fail(CACHALOT_ERROR_DEVICE, "cachalot_restore_pool: a pending block of segment 0x%llx could not be "
                       "waited for", (unsigned long long)targets[i]->ptr);
  return CACHALOT_OK;
}

/* cachalot_restore_pool, with or without a context (the entry points are shells over it). */
static cachalot_status restore_pool(cachalot_allocator *a, const cachalot_pool_state *state, void ***ptrs,
                                    size_t *n_ptrs) {
  if (!ptrs || !n_ptrs)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_restore_pool: ptrs or n_ptrs is NULL");
  *ptrs = NULL;
  *n_ptrs = 0;
  if (!state)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_restore_pool: state is NULL");
  cachalot_status rc = cl_check_device_arg(a, state->device, "cachalot_restore_pool");
  if (rc != CACHALOT_OK)
    return rc;
  if ((rc = check_state_shape(state)) != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[state->device];
  size_t n_alloc, n_blocks;
  count_blocks(state, &n_alloc, &n_blocks);
  void **out = malloc((n_alloc ? n_alloc : 1) * sizeof *out);
  cl_segment **targets = malloc((state->n_segments ? state->n_segments : 1) * sizeof *targets);
  if (!out || !targets) {
    free(out);
    free(targets);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_restore_pool: host out of memory");
  }
  cl_enter_exclusive(d);
  cl_pool *p = cl_find_pool_locked(d, state->pool);
  cl_block *spare = NULL;
  if (!p) {
    rc = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_restore_pool: no such pool " CL_POOL_ID_FMT,
                 CL_POOL_ID_ARGS(state->pool));
    goto fail;
  }
  /* Validate everything before changing anything. */
  if ((rc = find_targets_locked(d, p, state, targets)) != CACHALOT_OK)
    goto fail;
  bool pending = pool_pending_locked(d, p);
  if (pending && cl_capturing(d)) {
    rc = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "cachalot_restore_pool: blocks of the pool are pending free and a capture is underway");
    goto fail;
  }
  if ((rc = take_spares_locked(d, n_blocks, &spare)) != CACHALOT_OK)
    goto fail;
  if (pending)
    (void)cl_sync_all_events_locked(d);
  if ((rc = check_targets_settled(state, targets)) != CACHALOT_OK)
    goto fail;
  free_pool_blocks_locked(d, p);
  size_t n_out = 0;
  for (size_t i = 0; i < state->n_segments; i++)
    recarve_locked(d, targets[i], &state->segments[i], &spare, out, &n_out);
  drop_spares_locked(d, spare);
  cl_leave_exclusive(d);
  free(targets);
  if (n_out == 0) {
    free(out);
    out = NULL;
  }
  *ptrs = out;
  *n_ptrs = n_out;
  return CACHALOT_OK;
fail:
  drop_spares_locked(d, spare);
  cl_leave_exclusive(d);
  free(out);
  free(targets);
  return rc;
}

cachalot_status cachalot_restore_pool(cachalot_allocator *a, const cachalot_pool_state *state, void ***ptrs,
                                      size_t *n_ptrs) {
  return restore_pool(a, state, ptrs, n_ptrs);
}

cachalot_status cachalot_restore_pool_with_context(cachalot_allocator *a, const cachalot_pool_state *state,
                                                   void *ctx, void ***ptrs, size_t *n_ptrs) {
  void *const saved = cl_ctx_push(&cl_tls_alloc_ctx, ctx);
  const cachalot_status rc = restore_pool(a, state, ptrs, n_ptrs);
  cl_ctx_pop(&cl_tls_alloc_ctx, saved);
  return rc;
}
