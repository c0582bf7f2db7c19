/* Memory history: a ring buffer of trace entries per device (torch.cuda.memory._snapshot()), with optional C
 * call stacks and the caller's contexts. Recording happens under the device lock, at the places the allocator
 * changes state; reading happens in snapshot.c and snapshot_info.c. */
#include "internal.h"

#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

_Thread_local void *cl_tls_alloc_ctx, *cl_tls_free_ctx;

/* A context kept with a handed-out block, by the block's address. */
typedef struct cl_block_ctx {
  uintptr_t ptr;
  void *ctx;
  UT_hash_handle hh;
} cl_block_ctx;

void cl_ctx_retain(cachalot_allocator *a, void *ctx) {
  a->ctx_ops.retain(ctx);
  atomic_fetch_add_explicit(&a->n_ctx, 1, memory_order_relaxed);
}

void cl_ctx_release(cachalot_allocator *a, void *ctx) {
  /* released before the count drops: until then cachalot_set_context_ops cannot change the ops (a
   * snapshot's contexts are released with no lock held) */
  a->ctx_ops.release(ctx);
  atomic_fetch_sub_explicit(&a->n_ctx, 1, memory_order_release);
}

void cl_ctx_attach_locked(cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  void *ctx = cl_tls_alloc_ctx;
  if (!ctx || d->trace.cap == 0 || !d->owner->ctx_ops.retain)
    return;
  cl_block_ctx *e = malloc(sizeof *e);
  if (!e) /* the block goes without its context: history loses a detail, nothing else */
    return;
  e->ptr = ptr;
  e->ctx = ctx;
  bool hash_oom = false;
  HASH_ADD(hh, d->block_ctx, ptr, sizeof e->ptr, e);
  if (hash_oom) {
    free(e);
    return;
  }
  cl_ctx_retain(d->owner, ctx);
}

void cl_ctx_detach_locked(cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e;
  HASH_FIND(hh, d->block_ctx, &ptr, sizeof ptr, e);
  if (!e)
    return;
  HASH_DEL(d->block_ctx, e);
  cl_ctx_release(d->owner, e->ctx);
  free(e);
}

void *cl_ctx_of_locked(const cl_device *d, uintptr_t ptr) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e;
  HASH_FIND(hh, d->block_ctx, &ptr, sizeof ptr, e);
  return e ? e->ctx : NULL;
}

/* Lets go of every block's context (destroy). */
void cl_ctx_detach_all_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_block_ctx *e, *tmp;
  HASH_ITER(hh, d->block_ctx, e, tmp) {
    HASH_DEL(d->block_ctx, e);
    cl_ctx_release(d->owner, e->ctx);
    free(e);
  }
}

void cl_trace_record_slow_locked(cl_device *d, cl_trace_action action, uint64_t addr, uint64_t size,
                                 cachalot_stream stream) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_trace *t = &d->trace;
  size_t slot;
  if (t->count < t->cap) {
    slot = (t->head + t->count) % t->cap;
    t->count++;
  } else { /* full: the oldest entry makes room */
    slot = t->head;
    t->head = (t->head + 1) % t->cap;
  }
  cl_trace_entry *e = &t->entries[slot];
  if (e->ctx) /* a reused slot */
    cl_ctx_release(d->owner, e->ctx);
  e->ctx = NULL;
  void *ctx = action == CL_TRACE_ALLOC ? cl_tls_alloc_ctx : action == CL_TRACE_FREE_REQUESTED ? cl_tls_free_ctx : NULL;
  if (ctx && d->owner->ctx_ops.retain) {
    cl_ctx_retain(d->owner, ctx);
    e->ctx = ctx;
  }
  e->action = (uint8_t)action;
  e->addr = addr;
  e->size = size;
  e->stream = (uintptr_t)stream;
  e->time_us = now_us();
  e->n_frames = 0;
  if (t->frames && (action == CL_TRACE_ALLOC || action == CL_TRACE_FREE_REQUESTED)) {
    /* Inlining makes the number of cachalot's own frames vary; snapshot.c drops them when writing. */
    void *buf[CL_TRACE_MAX_FRAMES + 8];
    int n = backtrace(buf, CL_TRACE_MAX_FRAMES + 8);
    int skip = n > 1 ? 1 : n; /* this function */
    int keep = n - skip > CL_TRACE_MAX_FRAMES ? CL_TRACE_MAX_FRAMES : n - skip;
    memcpy(&t->frames[slot * CL_TRACE_MAX_FRAMES], buf + skip, (size_t)keep * sizeof(void *));
    e->n_frames = (uint8_t)keep;
  }
}

void cl_trace_free_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_trace *t = &d->trace;
  for (size_t i = 0; i < t->count; i++) {
    cl_trace_entry *e = &t->entries[(t->head + i) % t->cap];
    if (e->ctx)
      cl_ctx_release(d->owner, e->ctx);
  }
  free(d->trace.entries);
  free(d->trace.frames);
  memset(&d->trace, 0, sizeof d->trace);
}

/* A fresh buffer for a device (all allocated before any device is touched, so a failure changes nothing). */
typedef struct {
  cl_trace_entry *entries;
  void **frames;
} trace_buffers;

cachalot_status cachalot_record_history(cachalot_allocator *a, bool enabled, size_t max_entries) {
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_record_history: allocator is NULL");
  if (enabled && max_entries == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_record_history: max_entries must be at least 1");
  if (enabled && max_entries > SIZE_MAX / (CL_TRACE_MAX_FRAMES * sizeof(void *)))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_record_history: max_entries %zu is too large",
                   max_entries);
  pthread_mutex_lock(&a->meta_lock);
  const bool stacks = a->trace_stacks;
  trace_buffers *bufs = calloc((size_t)a->device_count, sizeof *bufs);
  bool oom = !bufs;
  for (int i = 0; enabled && !oom && i < a->device_count; i++) {
    bufs[i].entries = calloc(max_entries, sizeof(cl_trace_entry));
    bufs[i].frames = stacks ? calloc(max_entries * CL_TRACE_MAX_FRAMES, sizeof(void *)) : NULL;
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
                   max_entries);
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
    }
    cl_leave_exclusive(d);
  }
  free(bufs);
  pthread_mutex_unlock(&a->meta_lock);
  return CACHALOT_OK;
}

cachalot_status cachalot_record_history_stacks(cachalot_allocator *a, bool enabled) {
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_record_history_stacks: allocator is NULL");
  pthread_mutex_lock(&a->meta_lock);
  a->trace_stacks = enabled;
  cachalot_status rc = CACHALOT_OK;
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    if (!enabled) {
      free(d->trace.frames);
      d->trace.frames = NULL;
    } else if (d->trace.cap && !d->trace.frames) {
      /* entries recorded so far keep n_frames 0: frames are only ever read below n_frames */
      d->trace.frames = calloc(d->trace.cap * CL_TRACE_MAX_FRAMES, sizeof(void *));
      if (!d->trace.frames)
        rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_record_history_stacks: host out of memory");
    }
    cl_leave_exclusive(d);
  }
  pthread_mutex_unlock(&a->meta_lock);
  return rc;
}

cachalot_status cachalot_set_context_ops(cachalot_allocator *a, const cachalot_context_ops *ops) {
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_set_context_ops: allocator is NULL");
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

/* The thread's contexts are saved and restored, not cleared: an out-of-memory observer runs inside the
 * call and may allocate (through any allocator) itself. */
cachalot_status cachalot_malloc_with_context(cachalot_allocator *a, int device, size_t size, cachalot_stream s,
                                             void *ctx, void **out) {
  void *const saved = cl_tls_alloc_ctx;
  cl_tls_alloc_ctx = ctx;
  cachalot_status rc = cachalot_malloc(a, device, size, s, out);
  cl_tls_alloc_ctx = saved;
  return rc;
}

cachalot_status cachalot_free_with_context(cachalot_allocator *a, void *ptr, void *ctx) {
  void *const saved = cl_tls_free_ctx;
  cl_tls_free_ctx = ctx;
  cachalot_status rc = cachalot_free(a, ptr);
  cl_tls_free_ctx = saved;
  return rc;
}
