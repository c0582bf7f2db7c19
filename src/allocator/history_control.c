/* Turning memory history on and off, with or without C stacks and the callers' contexts, and the
 * caller's annotations: the entry points over history.c's ring. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* A fresh buffer for a device (all allocated before any device is touched, so a failure changes nothing). */
typedef struct {
  cl_trace_entry *entries;
  void **frames;
} trace_buffers;

cachalot_status cl_record_history(cachalot_allocator *a, bool enabled, size_t max_entries) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_record_history");
  if (arg != CACHALOT_OK)
    return arg;
  if (enabled && max_entries == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_record_history: max_entries must be at least 1");
  const size_t room = cl_trace_rows_of(max_entries, 0);
  pthread_mutex_lock(&a->meta_lock);
  const bool stacks = a->trace_stacks;
  trace_buffers *bufs = calloc((size_t)a->device_count, sizeof *bufs);
  bool oom = !bufs;
  for (int i = 0; enabled && !oom && i < a->device_count; i++) {
    bufs[i].entries = calloc(room, sizeof(cl_trace_entry));
    bufs[i].frames = stacks ? calloc(room * CL_TRACE_MAX_FRAMES, sizeof(void *)) : NULL;
    oom = !bufs[i].entries || (stacks && !bufs[i].frames);
  }
  if (oom) {
    for (int i = 0; bufs && i < a->device_count; i++) {
      free(bufs[i].entries);
      free(bufs[i].frames);
    }
    free(bufs);
    pthread_mutex_unlock(&a->meta_lock);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_record_history: host out of memory for %zu entries",
                   room);
  }
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    cl_trace_free_locked(d);
    if (!enabled) /* blocks let go of theirs too: the warm paths stay off while any block holds one */
      cl_ctx_detach_all_locked(d);
    if (enabled) {
      d->trace.entries = bufs[i].entries;
      d->trace.frames = bufs[i].frames;
      d->trace.cap = max_entries;
      d->trace_grown = 0;
    }
    cl_leave_exclusive(d);
  }
  free(bufs);
  pthread_mutex_unlock(&a->meta_lock);
  return CACHALOT_OK;
}

cachalot_status cl_record_history_stacks(cachalot_allocator *a, bool enabled) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_record_history_stacks");
  if (arg != CACHALOT_OK)
    return arg;
  pthread_mutex_lock(&a->meta_lock);
  a->trace_stacks = enabled;
  cachalot_status rc = CACHALOT_OK;
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    if (!enabled) {
      free(d->trace.frames);
      d->trace.frames = NULL;
      for (size_t k = 0; k < d->trace.count; k++) /* rows calloc'ed by a later "on" must not be read */
        d->trace.entries[(d->trace.head + k) % d->trace.cap].n_frames = 0;
    } else if (d->trace.cap && !d->trace.frames) {
      /* entries recorded so far have n_frames 0 (set when stacks went off): rows are read below it */
      d->trace.frames = calloc(cl_trace_rows(d) * CL_TRACE_MAX_FRAMES, sizeof(void *));
      if (!d->trace.frames)
        rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_record_history_stacks: host out of memory");
    }
    cl_leave_exclusive(d);
  }
  pthread_mutex_unlock(&a->meta_lock);
  return rc;
}

cachalot_status cachalot_record_history(cachalot_allocator *a, bool enabled, size_t max_entries) {
  return cl_record_history(a, enabled, max_entries);
}
cachalot_status cachalot_record_history_stacks(cachalot_allocator *a, bool enabled) {
  return cl_record_history_stacks(a, enabled);
}

cachalot_status cachalot_set_context_ops(cachalot_allocator *a, const cachalot_context_ops *ops) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_set_context_ops");
  if (arg != CACHALOT_OK)
    return arg;
  if (ops && (!ops->retain || !ops->release))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_set_context_ops: retain and release must both be set");
  pthread_mutex_lock(&a->meta_lock);
  cachalot_status rc = CACHALOT_OK;
  /* Every device in exclusive mode: no call can be keeping a context meanwhile. */
  for (int i = 0; i < a->device_count; i++)
    cl_enter_exclusive(&a->devices[i]);
  if (atomic_load_explicit(&a->n_ctx, memory_order_acquire) != 0)
    rc = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "cachalot_set_context_ops: %zu context references are still kept (turn history off and free "
                 "the blocks first)",
                 atomic_load_explicit(&a->n_ctx, memory_order_relaxed));
  else if (ops)
    a->ctx_ops = *ops;
  else
    memset(&a->ctx_ops, 0, sizeof a->ctx_ops);
  for (int i = a->device_count; i-- > 0;)
    cl_leave_exclusive(&a->devices[i]);
  pthread_mutex_unlock(&a->meta_lock);
  return rc;
}

/* The annotation's copy: at most CL_ANNOTATION_MAX bytes of text, cut before the character that would
 * cross the bound (a UTF-8 sequence is never split; text that is not UTF-8 is cut at the bound). */
static char *annotation_copy(const char *text) {
  size_t n = strnlen(text, CL_ANNOTATION_MAX + 1);
  if (n > CL_ANNOTATION_MAX) {
    n = CL_ANNOTATION_MAX;
    /* text[n] is the first byte left out: while it continues a sequence, that sequence goes too */
    for (size_t back = 0; back < 3 && n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80; back++)
      n--;
  }
  char *copy = malloc(n + 1);
  if (copy) {
    memcpy(copy, text, n);
    copy[n] = '\0';
  }
  return copy;
}

cachalot_status cachalot_annotate(cachalot_allocator *a, int device, const char *text) {
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_annotate");
  if (rc != CACHALOT_OK)
    return rc;
  if (!text)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_annotate: text is NULL");
  /* copied before the lock is taken, and dropped if history turns out to be off */
  char *copy = annotation_copy(text);
  if (!copy)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_annotate: host out of memory");
  cl_device *d = &a->devices[device];
  cl_enter_exclusive(d);
  if (d->trace.cap != 0) {
    cl_trace_entry *e = cl_trace_record_slow_locked(d, CL_TRACE_USER_DEFINED, 0, 0, NULL, NULL);
    e->text = copy;
    copy = NULL;
  }
  cl_leave_exclusive(d);
  free(copy);
  return CACHALOT_OK;
}
