/* cachalot_free, cachalot_record_stream and cachalot_empty_cache (SPEC.md §2).
 *
 * free() finds the block through the page map (address -> segment -> lane) without a lock, then runs
 * under that lane's lock alone when the block has no other stream's uses; the rest (events, captures,
 * history, errors) goes through exclusive mode. */
#include "internal.h"

#include <stdlib.h>

cachalot_status cachalot_record_stream(cachalot_allocator *a, void *ptr, cachalot_stream s) {
  cl_device *d;
  cl_block *b;
  /* A stream no event can be recorded on would make every later free of the block fail: refuse it now. */
  if (a && a->backend->ops->stream_check(a->backend, s) != CACHALOT_OK) {
    cl_error_prefix("cachalot_record_stream: ");
    return CACHALOT_ERROR_INVALID_ARGUMENT;
  }
  cachalot_status rc = cl_find_block_locked(a, ptr, "cachalot_record_stream", &d, &b);
  if (rc != CACHALOT_OK)
    return rc;
  if (s != b->seg->stream) {
    for (uint32_t i = 0; i < b->n_uses; i++) {
      if (b->uses[i] == s) {
        cl_unlock(d);
        return CACHALOT_OK;
      }
    }
    if (b->n_uses == b->cap_uses) {
      uint32_t cap = b->cap_uses ? b->cap_uses * 2 : 4;
      cachalot_stream *u = realloc(b->uses, cap * sizeof *u);
      if (!u) {
        cl_unlock(d);
        return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_record_stream: host out of memory");
      }
      b->uses = u;
      b->cap_uses = cap;
    }
    b->uses[b->n_uses++] = s;
  }
  cl_unlock(d);
  return CACHALOT_OK;
}

/* The event queue of stream `s`, made on first use. NULL on host OOM. */
static cl_stream_events *stream_events_locked(cl_device *d, cachalot_stream s) {
  cl_stream_events *se = NULL;
  HASH_FIND_PTR(d->events, &s, se);
  if (se)
    return se;
  se = calloc(1, sizeof *se);
  if (!se)
    return NULL;
  se->stream = s;
  bool hash_oom = false;
  HASH_ADD_PTR(d->events, stream, se);
  if (hash_oom) {
    free(se);
    return NULL;
  }
  return se;
}

/* Records one event per stream use of `b` and makes it PENDING. All or nothing: if any event or
 * bookkeeping cannot be had, the block stays ALLOCATED and the recorded events are returned. */
cachalot_status cl_insert_events_locked(cl_device *d, cl_block *b) {
  enum { INLINE = 8 };
  cl_pending_event *inline_buf[INLINE];
  cl_pending_event **pend = inline_buf;
  if (b->n_uses > INLINE && !(pend = malloc(b->n_uses * sizeof *pend)))
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_free: host out of memory");
  cachalot_backend *be = d->owner->backend;
  cachalot_status rc = CACHALOT_OK;
  uint32_t n = 0;
  for (; n < b->n_uses; n++) {
    if (!stream_events_locked(d, b->uses[n]) || !(pend[n] = cl_pending_new_locked(d))) {
      rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_free: host out of memory");
      break;
    }
    rc = be->ops->event_record(be, d->index, b->uses[n], &pend[n]->ev);
    if (rc != CACHALOT_OK) {
      cl_pending_delete_locked(d, pend[n]);
      cl_error_prefix("cachalot_free: recording an event on stream %p: ", (void *)b->uses[n]);
      break;
    }
  }
  if (rc != CACHALOT_OK) {
    while (n-- > 0) {
      be->ops->event_release(be, pend[n]->ev);
      cl_pending_delete_locked(d, pend[n]);
    }
  } else {
    for (uint32_t i = 0; i < b->n_uses; i++) {
      cl_stream_events *se = stream_events_locked(d, b->uses[i]);
      pend[i]->blk = b;
      pend[i]->next = NULL;
      if (se->tail)
        se->tail->next = pend[i];
      else
        se->head = pend[i];
      se->tail = pend[i];
    }
    d->n_pending_events += b->n_uses;
    b->event_count = b->n_uses;
    b->state = CL_PENDING;
  }
  if (pend != inline_buf)
    free(pend);
  return rc;
}

cachalot_status cachalot_free(cachalot_allocator *a, void *ptr) {
  if (!ptr || !a) {
    if (!a)
      return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_free: allocator is NULL");
    return CACHALOT_OK;
  }
  if (CL_LIKELY(cl_free_fast(a, ptr)))
    return CACHALOT_OK;
  cl_device *d;
  cl_block *b;
  cachalot_status rc = cl_find_block_locked(a, ptr, "cachalot_free", &d, &b);
  if (rc != CACHALOT_OK)
    return rc;
  if (b->n_uses > 0 && cl_capturing(d)) {
    /* Recording an event now would be captured into the graph: the block waits, PENDING without events,
     * until no capture is underway (SPEC.md §5). */
    if (d->n_deferred == d->cap_deferred) {
      size_t cap = d->cap_deferred ? d->cap_deferred * 2 : 16;
      cl_block **nd = realloc(d->deferred, cap * sizeof *nd);
      if (!nd) {
        cl_unlock(d);
        return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_free: host out of memory");
      }
      d->deferred = nd;
      d->cap_deferred = cap;
    }
    d->deferred[d->n_deferred++] = b;
    b->state = CL_PENDING;
  } else if (b->n_uses > 0) {
    rc = cl_insert_events_locked(d, b);
    if (rc != CACHALOT_OK) {
      cl_unlock(d);
      return rc;
    }
  }
  cl_stats_free_called(d, b->seg->small, b->size);
  cl_trace_locked(d, CL_TRACE_FREE_REQUESTED, b->ptr, b->requested, b->seg->stream);
  if (b->state == CL_ALLOCATED)
    cl_free_block_locked(d, b);
  cl_unlock(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_empty_cache(cachalot_allocator *a) {
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_empty_cache: allocator is NULL");
  cachalot_status result = CACHALOT_OK;
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_lock(d);
    /* During a capture nothing is synchronized or freed: either would break the capture. */
    if (!cl_capturing(d)) {
      cachalot_status rc = cl_release_all_locked(d);
      if (rc != CACHALOT_OK && result == CACHALOT_OK)
        result = rc;
    }
    cl_unlock(d);
  }
  if (result != CACHALOT_OK)
    cl_error_prefix("cachalot_empty_cache: ");
  return result;
}
