/* cachalot_snapshot_json: every segment and block of every device, the memory history, and the settings,
 * in the schema of torch.cuda.memory._snapshot(), so PyTorch's viewer reads it. Each device
 * is written under its lock, so a device's segments and trace are one consistent moment. */
#include "../allocator/internal.h"
#include "../common/json_writer.h"
#include "stats.h"
#include "symbolize.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const action_names[] = {
    [CL_TRACE_ALLOC] = "alloc",
    [CL_TRACE_FREE_REQUESTED] = "free_requested",
    [CL_TRACE_FREE_COMPLETED] = "free_completed",
    [CL_TRACE_SEGMENT_ALLOC] = "segment_alloc",
    [CL_TRACE_SEGMENT_FREE] = "segment_free",
    [CL_TRACE_SEGMENT_MAP] = "segment_map",
    [CL_TRACE_SEGMENT_UNMAP] = "segment_unmap",
    [CL_TRACE_OOM] = "oom",
    [CL_TRACE_SNAPSHOT] = "snapshot",
    [CL_TRACE_USER_DEFINED] = "user_defined",
};

static const char *block_state_name(const cl_block *b) {
  switch (b->state) {
  case CL_ALLOCATED: return "active_allocated";
  case CL_PENDING: return "active_pending_free";
  default: return "inactive";
  }
}

static void write_empty_frames(cl_json *j) {
  cl_json_key(j, "frames");
  cl_json_begin_array(j);
  cl_json_end_array(j);
}

/* Where the program's frames start: when cachalot is a shared object its own frames are the leading ones
 * inside it and are left out; linked statically they cannot be told apart by object and stay. */
static int first_program_frame(void *const *frames, int n) {
  Dl_info self;
  int first = 0;
  if (dladdr((void *)(uintptr_t)cachalot_snapshot_json, &self) && self.dli_fname && strstr(self.dli_fname, ".so")) {
    Dl_info f;
    while (first < n && dladdr(frames[first], &f) && f.dli_fbase == self.dli_fbase)
      first++;
  }
  return first;
}

/* "frames": each return address as {"name", "filename", "line"} (symbolize.c), innermost first. */
static void write_frames(cl_json *j, cl_symbolizer *sym, void *const *frames, int n) {
  cl_json_key(j, "frames");
  cl_json_begin_array(j);
  for (int i = first_program_frame(frames, n); i < n; i++) {
    const cl_frame_info f = cl_symbolize(sym, frames[i]);
    cl_json_begin_object(j);
    cl_json_key(j, "name");
    cl_json_string(j, f.name);
    cl_json_key(j, "filename");
    cl_json_string(j, f.filename);
    cl_json_key(j, "line");
    cl_json_int(j, f.line);
    cl_json_end_object(j);
  }
  cl_json_end_array(j);
}

/* A block's frames: the stack of its alloc, kept while it is handed out with stacks on. */
static void write_block_frames_locked(cl_json *j, cl_symbolizer *sym, const cl_device *d, const cl_block *b) {
  CL_ASSERT_EXCLUSIVE(d);
  void *const *frames = NULL;
  const int n = b->state != CL_FREE && d->block_ctx ? cl_block_frames_locked(d, b->ptr, &frames) : 0;
  if (n)
    write_frames(j, sym, frames, n);
  else
    write_empty_frames(j);
}

static void write_segment_locked(cl_json *j, cl_symbolizer *sym, const cl_device *d, const cl_segment *s) {
  CL_ASSERT_EXCLUSIVE(d);
  uint64_t allocated = 0, active = 0, requested = 0;
  for (const cl_block *b = s->head; b; b = b->next) {
    if (b->state == CL_ALLOCATED)
      allocated += b->size;
    if (b->state != CL_FREE) {
      active += b->size;
      requested += b->requested;
    }
  }
  cl_json_begin_object(j);
  cl_json_key(j, "device");
  cl_json_int(j, d->index);
  cl_json_key(j, "address");
  cl_json_uint(j, s->ptr);
  cl_json_key(j, "total_size");
  cl_json_uint(j, s->size);
  cl_json_key(j, "allocated_size");
  cl_json_uint(j, allocated);
  cl_json_key(j, "active_size");
  cl_json_uint(j, active);
  cl_json_key(j, "requested_size");
  cl_json_uint(j, requested);
  cl_json_key(j, "stream");
  cl_json_uint(j, (uintptr_t)s->stream);
  cl_json_key(j, "segment_type");
  cl_json_string(j, s->small ? "small" : "large");
  cl_json_key(j, "segment_pool_id");
  cl_json_begin_array(j);
  cl_json_uint(j, s->pool->id.first);
  cl_json_uint(j, s->pool->id.second);
  cl_json_end_array(j);
  cl_json_key(j, "is_expandable");
  cl_json_bool(j, s->expandable);
  write_empty_frames(j);
  cl_json_key(j, "blocks");
  cl_json_begin_array(j);
  for (const cl_block *b = s->head; b; b = b->next) {
    cl_json_begin_object(j);
    cl_json_key(j, "address");
    cl_json_uint(j, b->ptr);
    cl_json_key(j, "size");
    cl_json_uint(j, b->size);
    cl_json_key(j, "requested_size");
    cl_json_uint(j, b->state == CL_FREE ? 0 : b->requested);
    cl_json_key(j, "state");
    cl_json_string(j, block_state_name(b));
    write_block_frames_locked(j, sym, d, b);
    cl_json_end_object(j);
  }
  cl_json_end_array(j);
  cl_json_end_object(j);
}

/* The device's segments, in address order, into `j`. */
static cachalot_status write_segments_locked(cl_json *j, cl_symbolizer *sym, cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  if (!d->n_segments)
    return CACHALOT_OK;
  cl_segment **v = malloc(d->n_segments * sizeof *v);
  if (!v)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_snapshot_json: host out of memory");
  size_t n = 0;
  for (cl_segment *s = d->segments; s; s = s->next)
    v[n++] = s;
  qsort(v, n, sizeof *v, cl_segment_cmp_addr);
  for (size_t i = 0; i < n; i++)
    write_segment_locked(j, sym, d, v[i]);
  free(v);
  return CACHALOT_OK;
}

static void write_trace_locked(cl_json *j, cl_symbolizer *sym, const cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  const cl_trace *t = &d->trace;
  cl_json_begin_array(j);
  for (size_t k = 0; k < t->count; k++) {
    size_t slot = (t->head + k) % t->cap;
    const cl_trace_entry *e = &t->entries[slot];
    cl_json_begin_object(j);
    cl_json_key(j, "action");
    cl_json_string(j, action_names[e->action]);
    cl_json_key(j, e->action == CL_TRACE_OOM ? "device_free" : "addr"); /* PyTorch's keys: an oom entry's
                                                                           * addr holds the device's free bytes */
    cl_json_uint(j, e->addr);
    cl_json_key(j, "size");
    cl_json_uint(j, e->size);
    cl_json_key(j, "stream");
    cl_json_uint(j, e->stream);
    cl_json_key(j, "time_us");
    cl_json_int(j, e->time_us);
    if (e->text) { /* cachalot_annotate's: the key PyTorch's user_defined entries carry */
      cl_json_key(j, "name");
      cl_json_string(j, e->text);
    }
    if (t->frames && e->n_frames)
      write_frames(j, sym, &t->frames[slot * CL_TRACE_MAX_FRAMES], e->n_frames);
    else
      write_empty_frames(j);
    cl_json_end_object(j);
  }
  cl_json_end_array(j);
}

static void write_settings(cl_json *j, const cl_config *c, const char *raw) {
  cl_json_begin_object(j);
  cl_json_key(j, "CACHALOT_ALLOC_CONF");
  cl_json_string(j, raw ? raw : "");
  cl_json_key(j, "max_split_size");
  cl_json_int(j, c->max_split_size == SIZE_MAX ? -1 : (int64_t)c->max_split_size);
  cl_json_key(j, "garbage_collection_threshold");
  cl_json_double(j, c->gc_threshold);
  cl_json_key(j, "expandable_segments");
  cl_json_bool(j, c->expandable_segments);
  cl_json_key(j, "expandable_compact"); /* cachalot's own: what preset:low_fragmentation sets beside it */
  cl_json_bool(j, c->expandable_compact);
  cl_json_key(j, "expandable_plan"); /* cachalot's own, the preset's too: the step plan */
  cl_json_bool(j, c->expandable_plan);
  cl_json_key(j, "expandable_page_mb"); /* cachalot's own: the large kind's page */
  cl_json_int(j, (int64_t)(c->expandable_page >> 20));
  cl_json_key(j, "release_lock_on_cudamalloc");
  cl_json_bool(j, c->release_lock_on_cudamalloc);
  cl_json_key(j, "pinned_use_cuda_host_register");
  cl_json_bool(j, c->pinned_use_host_register);
  cl_json_key(j, "pinned_num_register_threads");
  cl_json_uint(j, c->pinned_num_register_threads);
  cl_json_key(j, "roundup_power2_divisions");
  cl_json_begin_object(j);
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++) {
    char key[16];
    snprintf(key, sizeof key, "%d", 1 << i); /* the interval's lower bound in MiB */
    cl_json_key(j, key);
    cl_json_uint(j, c->roundup_divisions[i]);
  }
  cl_json_end_object(j);
  cl_json_end_object(j);
}

/* Names every address the devices keep before the writing passes, with no lock held: the first lookups
 * read debug info (milliseconds to seconds in a large process), and the allocator must not wait on them.
 * What is recorded between this and the writing passes is named there, from modules already read. */
static void symbolize_unlocked(cachalot_allocator *a, cl_symbolizer *sym) {
  enum { PIECE = 1 << 16 }; /* addresses copied per locked section: 512 KiB, a few microseconds */
  void **buf = sym ? malloc(PIECE * sizeof *buf) : NULL;
  for (int i = 0; buf && i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    for (size_t from = 0, n = 0, count = 1; from < count;) {
      cl_enter_exclusive(d);
      n = cl_trace_frames_locked(d, &from, buf, PIECE);
      count = d->trace.count; /* the ring moves between pieces: a few entries named twice or later */
      cl_leave_exclusive(d);
      for (size_t k = 0; k < n; k++)
        (void)cl_symbolize(sym, buf[k]);
    }
    cl_enter_exclusive(d);
    size_t n = cl_block_frames_copy_locked(d, buf, PIECE);
    cl_leave_exclusive(d);
    for (size_t k = 0; k < n; k++)
      (void)cl_symbolize(sym, buf[k]);
  }
  free(buf);
}

cachalot_status cl_snapshot_json(cachalot_allocator *a, char **json) {
  if (!json)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_snapshot_json: json is NULL");
  *json = NULL;
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_snapshot_json");
  if (arg != CACHALOT_OK)
    return arg;
  /* Segments of all devices come first in the schema, traces after: two passes over the devices, each
   * device's trace taken in the same locked section as a "snapshot" entry marking the moment. */
  cl_json j;
  cl_json_init(&j);
  cl_symbolizer *sym = cl_symbolizer_new(); /* NULL on host OOM: frames are then written as "??" */
  symbolize_unlocked(a, sym);
  cachalot_status rc = CACHALOT_OK;
  cl_json_begin_object(&j);
  cl_json_key(&j, "segments");
  cl_json_begin_array(&j);
  for (int i = 0; i < a->device_count && rc == CACHALOT_OK; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    uint64_t active = (uint64_t)d->stats.active_bytes[CACHALOT_STAT_ALL].current;
    cl_trace_locked(d, CL_TRACE_SNAPSHOT, 0, active, NULL);
    rc = write_segments_locked(&j, sym, d);
    cl_leave_exclusive(d);
  }
  cl_json_end_array(&j);
  cl_json_key(&j, "device_traces");
  cl_json_begin_array(&j);
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &a->devices[i];
    cl_enter_exclusive(d);
    write_trace_locked(&j, sym, d);
    cl_leave_exclusive(d);
  }
  cl_json_end_array(&j);
  cl_json_key(&j, "allocator_settings");
  pthread_mutex_lock(&a->meta_lock);
  cl_device *d0 = &a->devices[0];
  cl_enter_exclusive(d0);
  cl_config cfg = d0->cfg;
  cl_leave_exclusive(d0);
  write_settings(&j, &cfg, a->conf_raw);
  pthread_mutex_unlock(&a->meta_lock);
  cl_json_end_object(&j);
  cl_symbolizer_free(sym);
  if (rc != CACHALOT_OK) {
    cl_json_discard(&j);
    return rc;
  }
  char *out = cl_json_finish(&j);
  if (!out)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_snapshot_json: host out of memory");
  *json = out;
  return CACHALOT_OK;
}

cachalot_status cachalot_snapshot_json(cachalot_allocator *a, char **json) { return cl_snapshot_json(a, json); }
