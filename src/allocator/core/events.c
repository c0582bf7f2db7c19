/* Cross-stream safety: a freed block that other streams used waits for an event on each of them
 * (PENDING) before it returns to its free index (PyTorch's free rules). Events of one stream complete in the
 * order they were recorded, so polling a stream stops at its first event not yet done. */
#include "core.h"

#include <stdlib.h>

/* The event queue of stream `s`, made on first use. NULL on host OOM. */
static cl_stream_events *stream_events_locked(cl_device *d, cachalot_stream s) {
  CL_ASSERT_EXCLUSIVE(d);
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

/* The backend's completion word and its value now, for the warm mallocs (CL_WARM_WATCH): read before the
 * events it is to stand for are queried or watched, so that any completion after it moves the word. The
 * word is asked for again after the read: a backend that turns its word off moves it first, so a reading
 * taken as it went off is dropped here rather than trusted. */
static void watch_word_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_backend *b = d->owner->backend;
  d->done_word = b->ops->completion_word && b->ops->completion_watch ? b->ops->completion_word(b, d->index) : NULL;
  if (!d->done_word)
    return;
  d->done_seen = __atomic_load_n(d->done_word, __ATOMIC_ACQUIRE);
  if (!b->ops->completion_word(b, d->index))
    d->done_word = NULL;
}

/* Whether stream `se`'s oldest event is outstanding and not watched (struct cl_stream_events). */
static bool head_unwatched(const cl_stream_events *se) { return se->head && !se->head->watched; }

static void watch_event_locked(cl_device *d, cl_pending_event *e) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_backend *b = d->owner->backend;
  b->ops->completion_watch(b, d->index, e->ev);
  e->watched = true;
}

size_t cl_count_unwatched_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  size_t n = 0;
  cl_stream_events *se, *tmp;
  HASH_ITER(hh, d->events, se, tmp) {
    n += head_unwatched(se);
  }
  return n;
}

/* Whether a stream that used b is being captured now (core.h). */
bool cl_uses_capturing_locked(cl_device *d, const cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  cachalot_backend *be = d->owner->backend;
  for (uint32_t i = 0; i < b->n_uses; i++) {
    bool capturing = false;
    uint64_t id = 0;
    /* a query that fails counts as not capturing: the event record then reports what is wrong */
    if (be->ops->stream_capture_info(be, d->index, b->uses[i], &capturing, &id) == CACHALOT_OK && capturing)
      return true;
  }
  return false;
}

/* Records one event per stream use of `b` and makes it PENDING. All or nothing: if any event or
 * bookkeeping cannot be had, the block stays ALLOCATED and the recorded events are returned. */
cachalot_status cl_insert_events_locked(cl_device *d, cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  enum { INLINE = 8 };
  cl_pending_event *inline_buf[INLINE];
  cl_pending_event **pend = inline_buf;
  if (b->n_uses > INLINE && !(pend = malloc(b->n_uses * sizeof *pend)))
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_free: host out of memory");
  cachalot_backend *be = d->owner->backend;
  if (!d->n_pending_events && !d->n_deferred) /* nothing unpolled: the word read now is the one to watch */
    watch_word_locked(d);
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
      const bool unwatched_before = head_unwatched(se);
      pend[i]->blk = b;
      pend[i]->watched = false;
      pend[i]->next = NULL;
      if (se->tail)
        se->tail->next = pend[i];
      else
        se->head = pend[i];
      se->tail = pend[i];
      if (se->slow && d->done_word && ++se->probe % CL_SLOW_PROBE != 0)
        watch_event_locked(d, pend[i]);
      d->n_unwatched += (uint32_t)head_unwatched(se);
      d->n_unwatched -= (uint32_t)unwatched_before;
    }
    d->n_pending_events += b->n_uses;
    b->event_count = b->n_uses;
    b->state = CL_PENDING;
  }
  if (pend != inline_buf)
    free(pend);
  return rc;
}

/* Pops the oldest event of `se` and frees its block when it was the block's last. */
static void complete_head_locked(cl_device *d, cl_stream_events *se) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pending_event *e = se->head;
  se->head = e->next;
  se->misses = 0;
  if (!se->head)
    se->tail = NULL;
  d->n_pending_events--;
  cachalot_backend *b = d->owner->backend;
  b->ops->event_release(b, e->ev);
  cl_block *blk = e->blk;
  cl_pending_delete_locked(d, e);
  if (--blk->event_count == 0)
    cl_free_block_locked(d, blk);
}

/* Records the events of blocks freed during a capture, once no capture is underway. */
static void insert_deferred_events_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  size_t kept = 0;
  for (size_t i = 0; i < d->n_deferred; i++) {
    cl_block *b = d->deferred[i].b;
    /* a block whose events cannot be had now stays deferred: never reused early; nor can they while a
     * stream that used it is being captured (on another device: this one is not capturing) */
    if (cl_uses_capturing_locked(d, b) || cl_insert_events_locked(d, b) != CACHALOT_OK) {
      d->deferred[kept++] = d->deferred[i];
    } else {
      free(d->deferred[i].wait); /* its capture is over */
    }
  }
  d->n_deferred = kept;
}

void cl_process_events_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  if (d->n_deferred)
    insert_deferred_events_locked(d);
  if (!d->n_pending_events)
    return;
  cachalot_backend *b = d->owner->backend;
  watch_word_locked(d); /* before the queries and watches: a watched completion after it moves the word */
  uint32_t unwatched = 0;
  cl_stream_events *se, *tmp;
  HASH_ITER(hh, d->events, se, tmp) {
    while (se->head) {
      bool done = false;
      /* A query that fails counts as not done: the block stays PENDING, which is always safe. */
      if (b->ops->event_query(b, se->head->ev, &done) != CACHALOT_OK || !done)
        break;
      if (!se->head->watched) /* done before it needed a watch: the stream keeps up */
        se->slow = false;
      complete_head_locked(d, se);
    }
    if (head_unwatched(se) && ++se->misses >= CL_POLLS_BEFORE_WATCH && d->done_word) {
      watch_event_locked(d, se->head);
      se->slow = true;
    }
    unwatched += head_unwatched(se);
  }
  d->n_unwatched = unwatched;
}

cachalot_status cl_sync_all_events_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  d->stats.num_sync_all_streams++;
  if (d->n_deferred)
    insert_deferred_events_locked(d);
  if (!d->n_pending_events)
    return CACHALOT_OK;
  cachalot_backend *b = d->owner->backend;
  cachalot_status result = CACHALOT_OK;
  cl_stream_events *se, *tmp;
  HASH_ITER(hh, d->events, se, tmp) {
    while (se->head) {
      cachalot_status st = b->ops->event_sync(b, se->head->ev);
      if (st != CACHALOT_OK) {
        result = st;
        break;
      }
      complete_head_locked(d, se);
    }
  }
  d->n_unwatched = (uint32_t)cl_count_unwatched_locked(d);
  return result;
}
