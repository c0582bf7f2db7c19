/* cachalot_snapshot_take: the snapshot as C structures, with the callers' contexts, for bindings that
 * build their own objects from it (the PyTorch backend builds PyTorch's SnapshotInfo). The same moment as
 * the JSON snapshot: each device's segments and trace are read in one locked section. */
#include "../allocator/internal.h"

#include <stdlib.h>
#include <string.h>

static const cachalot_trace_action public_action[] = {
    [CL_TRACE_ALLOC] = CACHALOT_TRACE_ALLOC,
    [CL_TRACE_FREE_REQUESTED] = CACHALOT_TRACE_FREE_REQUESTED,
    [CL_TRACE_FREE_COMPLETED] = CACHALOT_TRACE_FREE_COMPLETED,
    [CL_TRACE_SEGMENT_ALLOC] = CACHALOT_TRACE_SEGMENT_ALLOC,
    [CL_TRACE_SEGMENT_FREE] = CACHALOT_TRACE_SEGMENT_FREE,
    [CL_TRACE_SEGMENT_MAP] = CACHALOT_TRACE_SEGMENT_MAP,
    [CL_TRACE_SEGMENT_UNMAP] = CACHALOT_TRACE_SEGMENT_UNMAP,
    [CL_TRACE_OOM] = CACHALOT_TRACE_OOM,
    [CL_TRACE_SNAPSHOT] = CACHALOT_TRACE_SNAPSHOT,
};

static void *keep(cachalot_allocator *a, void *ctx) {
  if (ctx)
    cl_ctx_retain(a, ctx);
  return ctx;
}

/* Grows *v (of *cap elements of `size` bytes) to hold `need`. */
static bool reserve(void **v, size_t *cap, size_t need, size_t size) {
  if (need <= *cap)
    return true;
  size_t n = *cap ? *cap : 16;
  while (n < need)
    n *= 2;
  void *nv = realloc(*v, n * size);
  if (!nv)
    return false;
  *v = nv;
  *cap = n;
  return true;
}

/* One device's segments and blocks, appended to `out`. */
static bool take_segments_locked(cl_device *d, cachalot_snapshot_info *out, size_t *cap) {
  CL_ASSERT_EXCLUSIVE(d);
  if (!d->n_segments)
    return true;
  cl_segment **v = malloc(d->n_segments * sizeof *v);
  if (!v || !reserve((void **)&out->segments, cap, out->n_segments + d->n_segments, sizeof *out->segments)) {
    free(v);
    return false;
  }
  size_t n = 0;
  for (cl_segment *s = d->segments; s; s = s->next)
    v[n++] = s;
  qsort(v, n, sizeof *v, cl_segment_cmp_addr);
  cachalot_allocator *a = d->owner;
  bool ok = true;
  for (size_t i = 0; i < n && ok; i++) {
    const cl_segment *s = v[i];
    size_t nb = 0;
    for (const cl_block *b = s->head; b; b = b->next)
      nb++;
    cachalot_snapshot_block *blocks = calloc(nb, sizeof *blocks);
    if (!blocks) {
      ok = false;
      break;
    }
    cachalot_snapshot_segment *o = &out->segments[out->n_segments++];
    *o = (cachalot_snapshot_segment){.device = d->index, .address = s->ptr, .total_size = s->size,
                                     .stream = s->stream, .small = s->small, .expandable = s->expandable,
                                     .pool = s->pool->id, .n_blocks = nb, .blocks = blocks};
    size_t k = 0;
    for (const cl_block *b = s->head; b; b = b->next, k++) {
      cachalot_snapshot_block *ob = &blocks[k];
      ob->address = b->ptr;
      ob->size = b->size;
      ob->state = b->state == CL_ALLOCATED ? CACHALOT_BLOCK_ALLOCATED
                  : b->state == CL_PENDING ? CACHALOT_BLOCK_PENDING_FREE
                                           : CACHALOT_BLOCK_FREE;
      ob->requested = b->state == CL_FREE ? 0 : b->requested;
      ob->context = b->state == CL_FREE || !d->block_ctx ? NULL : keep(a, cl_ctx_of_locked(d, b->ptr));
    }
  }
  free(v);
  return ok;
}

static bool take_trace_locked(cl_device *d, cachalot_snapshot_info *out, size_t *cap) {
  CL_ASSERT_EXCLUSIVE(d);
  const cl_trace *t = &d->trace;
  if (!t->count)
    return true;
  if (!reserve((void **)&out->trace, cap, out->n_trace + t->count, sizeof *out->trace))
    return false;
  for (size_t k = 0; k < t->count; k++) {
    const cl_trace_entry *e = &t->entries[(t->head + k) % t->cap];
    if (e->action == CL_TRACE_USER_DEFINED)
      continue;
    out->trace[out->n_trace++] = (cachalot_trace_entry){
        .action = public_action[e->action], .device = d->index, .addr = e->addr, .size = e->size,
        .stream = (cachalot_stream)e->stream, .time_us = e->time_us, .context = keep(d->owner, e->ctx)};
  }
  return true;
}

static void info_free(cachalot_allocator *a, cachalot_snapshot_info *s);

cachalot_status cachalot_snapshot_take(cachalot_allocator *a, bool include_trace, cachalot_snapshot_info **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_snapshot_take: out is NULL");
  *out = NULL;
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_snapshot_take");
  if (arg != CACHALOT_OK)
    return arg;
  cachalot_snapshot_info *s = calloc(1, sizeof *s);
  if (!s)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_snapshot_take: host out of memory");
  size_t cap_seg = 0, cap_trace = 0;
  bool ok = true;
  for (int i = 0; i < a->device_count && ok; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    ok = take_segments_locked(d, s, &cap_seg) && (!include_trace || take_trace_locked(d, s, &cap_trace));
    /* The "snapshot" entry marks the moment in the history, as PyTorch's allocator records it: after the
     * trace is read, so a snapshot's trace ends with the program's last event and the next one shows the
     * mark. A query of the segments alone (a binding's lookup) leaves the history as it is. */
    if (include_trace)
      cl_trace_locked(d, CL_TRACE_SNAPSHOT, 0, (uint64_t)d->stats.active_bytes[CACHALOT_STAT_ALL].current, NULL);
    cl_leave_exclusive(d);
  }
  if (!ok) {
    info_free(a, s);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_snapshot_take: host out of memory");
  }
  *out = s;
  return CACHALOT_OK;
}

static void info_free(cachalot_allocator *a, cachalot_snapshot_info *s) {
  if (!s)
    return;
  for (size_t i = 0; i < s->n_segments; i++) {
    for (size_t k = 0; k < s->segments[i].n_blocks; k++)
      if (s->segments[i].blocks[k].context && a)
        cl_ctx_release(a, s->segments[i].blocks[k].context);
    free(s->segments[i].blocks);
  }
  for (size_t i = 0; i < s->n_trace; i++)
    if (s->trace[i].context && a)
      cl_ctx_release(a, s->trace[i].context);
  free(s->segments);
  free(s->trace);
  free(s);
}

void cachalot_snapshot_info_free(cachalot_allocator *a, cachalot_snapshot_info *s) { info_free(a, s); }
