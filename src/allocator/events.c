/* Cross-stream safety: a freed block that other streams used waits for an event on each of them
 * (PENDING) before it returns to its free index (SPEC.md §2). Events of one stream complete in the
 * order they were recorded, so polling a stream stops at its first event not yet done. */
#include "internal.h"

void cl_free_block_locked(cl_device *d, cl_block *b) {
  cl_segment *seg = b->seg;
  const size_t orig_size = b->size;
  const size_t requested = b->requested;
  int64_t net_blocks = 0, net_bytes = 0;

  cl_trace_locked(d, CL_TRACE_FREE_COMPLETED, b->ptr, requested, seg->stream);
  HASH_DEL(d->active, b);
  b->n_uses = 0;
  b->requested = 0;

  cl_block *p = b->prev;
  if (p && p->state == CL_FREE) {
    cl_free_index_remove_locked(d, p);
    b->ptr = p->ptr;
    b->size += p->size;
    b->prev = p->prev;
    if (b->prev)
      b->prev->next = b;
    else
      seg->head = b;
    net_blocks -= 1;
    net_bytes -= (int64_t)p->size;
    cl_block_delete_locked(d, p);
  }
  cl_block *n = b->next;
  if (n && n->state == CL_FREE) {
    cl_free_index_remove_locked(d, n);
    b->size += n->size;
    b->next = n->next;
    if (b->next)
      b->next->prev = b;
    net_blocks -= 1;
    net_bytes -= (int64_t)n->size;
    cl_block_delete_locked(d, n);
  }
  cl_free_index_insert_locked(d, b);
  if (b->prev || b->next) {
    net_blocks += 1;
    net_bytes += (int64_t)b->size;
  }

  cachalot_device_stats *st = &d->stats;
  if (net_blocks)
    cl_stat_array_add(st->inactive_split, seg->small, net_blocks);
  if (net_bytes)
    cl_stat_array_add(st->inactive_split_bytes, seg->small, net_bytes);
  cl_stat_array_add(st->active, seg->small, -1);
  cl_stat_array_add(st->active_bytes, seg->small, -(int64_t)orig_size);
  cl_stat_array_add(st->requested_bytes, seg->small, -(int64_t)requested);
}

/* Pops the oldest event of `se` and frees its block when it was the block's last. */
static void complete_head_locked(cl_device *d, cl_stream_events *se) {
  cl_pending_event *e = se->head;
  se->head = e->next;
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

void cl_insert_deferred_events_locked(cl_device *d) {
  size_t kept = 0;
  for (size_t i = 0; i < d->n_deferred; i++) {
    cl_block *b = d->deferred[i];
    /* a block whose events cannot be had now stays deferred: never reused early */
    if (cl_insert_events_locked(d, b) != CACHALOT_OK)
      d->deferred[kept++] = b;
  }
  d->n_deferred = kept;
}

void cl_process_events_locked(cl_device *d) {
  if (d->n_deferred)
    cl_insert_deferred_events_locked(d);
  if (!d->n_pending_events)
    return;
  cachalot_backend *b = d->owner->backend;
  cl_stream_events *se, *tmp;
  HASH_ITER(hh, d->events, se, tmp) {
    while (se->head) {
      bool done = false;
      /* A query that fails counts as not done: the block stays PENDING, which is always safe. */
      if (b->ops->event_query(b, se->head->ev, &done) != CACHALOT_OK || !done)
        break;
      complete_head_locked(d, se);
    }
  }
}

cachalot_status cl_sync_all_events_locked(cl_device *d) {
  d->stats.num_sync_all_streams++;
  if (d->n_deferred)
    cl_insert_deferred_events_locked(d);
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
  return result;
}
