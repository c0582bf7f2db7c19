/* The allocator object: creation from a backend and a config and destruction (the public entry points
 * are in src/process/process.c), settings at run time, the fork watch and OOM observers. */
#include "host/host_cache.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Moves `s` to `value`, counting the step as an increase or a decrease. */
static void stat_set(cachalot_stat *s, int64_t value) {
  if (value > s->current)
    cl_stat_inc(s, value - s->current);
  else if (value < s->current)
    cl_stat_dec(s, s->current - value);
}

/* Recounts oversize_allocations / oversize_segments after max_split_size changed. */
static void recount_oversize_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  const size_t max_split = d->cfg.max_split_size;
  int64_t allocs = 0, segs = 0;
  for (cl_segment *s = d->segments; s; s = s->next) {
    segs += !s->expandable && s->size >= max_split;
    for (cl_block *b = s->head; b; b = b->next)
      allocs += b->state == CL_ALLOCATED && b->size >= max_split;
  }
  stat_set(&d->stats.oversize_allocations, allocs);
  stat_set(&d->stats.oversize_segments, segs);
}

/* Applies a validated config to a device. */
static void apply_config_locked(cl_device *d, const cl_config *c) {
  CL_ASSERT_EXCLUSIVE(d);
  const size_t old_split = d->cfg.max_split_size;
  d->cfg = *c;
  if (c->keys_set & CL_KEY_FRACTION) {
    d->fraction = c->memory_fraction;
    d->allowed_max = 0; /* until the device total is known: refuse rather than use an old limit */
    d->total_known = false;
  }
  atomic_store_explicit(&d->detect, c->detect_captures, memory_order_relaxed);
  cl_plan_configure_locked(d);
  d->stats.max_split_size = c->max_split_size == SIZE_MAX ? -1 : (int64_t)c->max_split_size;
  if (old_split != c->max_split_size)
    recount_oversize_locked(d);
}

static void free_device(cl_device *d) {
  cachalot_backend *be = d->owner->backend;
  (void)cl_sync_all_events_locked(d);
  cl_stream_events *se, *setmp;
  HASH_ITER(hh, d->events, se, setmp) {
    while (se->head) { /* only events whose sync failed are left: give them back regardless */
      cl_pending_event *e = se->head;
      se->head = e->next;
      be->ops->event_release(be, e->ev);
    }
    HASH_DEL(d->events, se);
    free(se);
  }
  cl_plan_destroy_locked(d);
  /* unmaps the runs; they are freed below with the other segments */
  const size_t kept_pages = cl_expandable_destroy_locked(d);
  size_t kept = kept_pages, kept_segments = 0;
  char why[160] = "";
  if (kept)
    snprintf(why, sizeof why, "%s", cl_error_message());
  cl_segment *s = d->segments;
  while (s) {
    cl_segment *next = s->next;
    const cachalot_segment_source *src = s->from_source ? cl_pool_source(d, s->pool) : NULL;
    if (src)
      src->free((void *)s->ptr, s->size, d->index, s->stream, src->ctx);
    else if (!s->expandable && be->ops->free(be, d->index, (void *)s->ptr) != CACHALOT_OK) {
      kept += s->size;
      kept_segments++;
      if (!why[0])
        snprintf(why, sizeof why, "%s", cl_error_message());
    }
    for (cl_block *b = s->head; b; b = b->next)
      free(b->uses);
    cl_segment_ctx_drop_locked(d, s);
    free(s->at);
    free(s);
    s = next;
  }
  d->segments = NULL;
  /* destroy returns nothing: say what stays on the device (a capture underway refuses frees, as CUDA does) */
  if (kept)
    cl_warn("cachalot_destroy: %zu bytes of device %d could not be given back and stay allocated on the device "
            "(%zu segments, %zu bytes of mapped pages): %s",
            kept, d->index, kept_segments, kept_pages, why);
  while (d->spare_segments) {
    s = d->spare_segments;
    d->spare_segments = s->release_next;
    free(s->at);
    free(s);
  }
  cl_lanes_destroy_locked(d);
  for (cl_block *b = d->spare_blocks; b; b = b->next)
    free(b->uses);
  cl_bins *bins, *btmp;
  HASH_ITER(hh, d->default_pool.bins, bins, btmp) {
    HASH_DEL(d->default_pool.bins, bins);
    cl_vranges_release_locked(d, bins); /* none left: cl_expandable_destroy_locked released them */
    free(bins);
  }
  cl_pools_destroy_locked(d);
  for (size_t i = 0; i < d->n_deferred; i++)
    free(d->deferred[i].wait);
  free(d->deferred);
  cl_ctx_detach_all_locked(d);
  cl_trace_free_locked(d);
  for (size_t i = 0; i < d->n_chunks; i++)
    free(d->chunks[i]);
  free(d->chunks);
}

/* Fork: a child of a process that used cachalot holds copies of its books, of device memory that is not
 * its own, and of locks other threads may have held; CUDA cannot be used there at all. The child handler
 * marks every live allocator and turns its warm paths off (their flag is read on every call anyway), so
 * each call of the child goes to a slow path that fails with a message, at no cost to the parent. */
static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static cachalot_allocator **watched;
static size_t n_watched, cap_watched;

static void fork_prepare(void) { pthread_mutex_lock(&fork_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&fork_lock); }
static void fork_child(void) {
  for (size_t i = 0; i < n_watched; i++) {
    cachalot_allocator *a = watched[i];
    atomic_store_explicit(&a->forked, true, memory_order_relaxed);
    atomic_store_explicit(&a->n_auto, 0, memory_order_relaxed); /* no capture to poll before a free */
    for (int k = 0; k < a->device_count; k++) {
      cl_device *d = &a->devices[k];
      atomic_store_explicit(&d->warm, 0, memory_order_relaxed);
      atomic_store_explicit(&d->detect, false, memory_order_relaxed);
      /* A lane lock that a thread of the parent held at the fork would be held in the child for good, and
       * the warm paths take it before they read `warm`: let go of every lane the warm paths can find.
       * What the lane guards may be half-changed, but nothing reads it again: with `warm` 0 every call
       * goes on to a slow path, which fails first. */
      cl_lane_index *t = atomic_load_explicit(&d->lane_index, memory_order_relaxed);
      for (size_t j = 0; t && j <= t->mask; j++) {
        cl_lane *ln = atomic_load_explicit(&t->slot[j], memory_order_relaxed);
        if (ln) {
          atomic_store_explicit(&ln->warm, 0, memory_order_relaxed);
          cl_spin_unlock(&ln->lock);
        }
      }
    }
  }
  pthread_mutex_unlock(&fork_lock);
}
static void fork_register(void) { (void)pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void fork_watch(cachalot_allocator *a, bool add) {
  pthread_once(&fork_once, fork_register);
  pthread_mutex_lock(&fork_lock);
  if (add) {
    if (n_watched == cap_watched) {
      size_t cap = cap_watched ? cap_watched * 2 : 8;
      cachalot_allocator **v = realloc(watched, cap * sizeof *v);
      if (v) {
        watched = v;
        cap_watched = cap;
      }
    }
    if (n_watched < cap_watched) /* (host out of memory: this one is not watched; nothing else changes) */
      watched[n_watched++] = a;
  } else {
    for (size_t i = 0; i < n_watched; i++)
      if (watched[i] == a) {
        watched[i] = watched[--n_watched];
        break;
      }
  }
  pthread_mutex_unlock(&fork_lock);
}

cachalot_status cl_allocator_create(cachalot_backend *b, const char *conf, cachalot_allocator **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_create: out is NULL");
  *out = NULL;
  if (!b)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_create: backend is NULL");
  if (b->device_count < 1)
    return cl_fail(CACHALOT_ERROR_DEVICE, "cachalot_create: the backend has no device");
  if (!conf)
    conf = getenv("CACHALOT_ALLOC_CONF");
  cl_config defaults, cfg;
  cl_config_defaults(&defaults);
  cachalot_status rc = cl_config_parse(conf, &defaults, &cfg);
  if (rc != CACHALOT_OK)
    return rc;

  cachalot_allocator *a = calloc(1, sizeof *a);
  char *raw = strdup(conf ? conf : "");
  /* aligned as the type says (calloc gives 16 bytes): the lock and the room atomics own their cache lines */
  cl_device *devs = aligned_alloc(_Alignof(cl_device), (size_t)b->device_count * sizeof *devs);
  if (devs)
    memset(devs, 0, (size_t)b->device_count * sizeof *devs);
  cl_host *host = NULL;
  if (!a || !raw || !devs || cl_host_create(b, &host) != CACHALOT_OK) {
    free(a);
    free(raw);
    free(devs);
    cl_host_destroy(host);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_create: host out of memory");
  }
  cl_host_configure(host, cfg.pinned_use_host_register, cfg.pinned_num_register_threads);
  a->host = host;
  a->backend = b;
  a->device_count = b->device_count;
  a->devices = devs;
  atomic_init(&a->next_capture_pool, 1);
  atomic_init(&a->next_pool_handle, 1);
  a->conf_raw = raw;
  pthread_mutex_init(&a->meta_lock, NULL);
  for (int i = 0; i < a->device_count; i++) {
    cl_device *d = &devs[i];
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->auto_lock, NULL);
    d->index = i;
    d->owner = a;
    d->fraction = -1.0;
    cl_enter_exclusive(d); /* nobody else sees d yet; entered so that the _locked contract holds */
    apply_config_locked(d, &cfg);
    cl_leave_exclusive(d);
  }
  fork_watch(a, true);
  *out = a;
  return CACHALOT_OK;
}

cachalot_status cachalot_set_settings(cachalot_allocator *a, const char *conf) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_set_settings");
  if (arg != CACHALOT_OK)
    return arg;
  if (!conf)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_set_settings: conf is NULL");
  /* Every device holds the same settings; device 0's copy is the base the string applies to. */
  pthread_mutex_lock(&a->meta_lock);
  cl_device *d0 = &a->devices[0];
  cl_enter_exclusive(d0);
  cl_config base = d0->cfg;
  cl_leave_exclusive(d0);
  cl_config_reset_per_call(&base);
  cl_config cfg;
  cachalot_status rc = cl_config_parse(conf, &base, &cfg);
  char *raw = rc == CACHALOT_OK ? strdup(conf) : NULL;
  if (rc == CACHALOT_OK && !raw)
    rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_set_settings: host out of memory");
  if (rc == CACHALOT_OK) {
    free(a->conf_raw);
    a->conf_raw = raw;
    cl_host_configure(a->host, cfg.pinned_use_host_register, cfg.pinned_num_register_threads);
    for (int i = 0; i < a->device_count; i++) {
      cl_device *d = &a->devices[i];
      cl_enter_exclusive(d);
      apply_config_locked(d, &cfg);
      cl_leave_exclusive(d);
    }
  }
  pthread_mutex_unlock(&a->meta_lock);
  return rc;
}

cachalot_status cachalot_check_config(const char *conf) {
  if (!conf)
    conf = getenv("CACHALOT_ALLOC_CONF");
  cl_config cfg;
  return cl_config_parse(conf, NULL, &cfg);
}

const char *const *cachalot_config_keys(void) { return cl_config_keys(); }

cachalot_status cachalot_get_settings(cachalot_allocator *a, cachalot_settings *out) {
  if (out)
    memset(out, 0, sizeof *out);
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_get_settings");
  if (arg != CACHALOT_OK)
    return arg;
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_get_settings: out is NULL");
  _Static_assert(CL_ROUNDUP_INTERVALS == sizeof out->roundup_power2_divisions / sizeof(unsigned),
                 "one division count per interval");
  pthread_mutex_lock(&a->meta_lock); /* every device holds the same settings */
  cl_device *d0 = &a->devices[0];
  cl_lock_device(d0);
  const cl_config c = d0->cfg;
  cl_unlock_device(d0);
  pthread_mutex_unlock(&a->meta_lock);
  out->max_split_size = c.max_split_size;
  out->garbage_collection_threshold = c.gc_threshold;
  out->expandable_segments = c.expandable_segments;
  out->expandable_compact = c.expandable_compact;
  out->expandable_plan = c.expandable_plan;
  out->expandable_page = c.expandable_page;
  out->release_lock_on_cudamalloc = c.release_lock_on_cudamalloc;
  out->pinned_use_cuda_host_register = c.pinned_use_host_register;
  out->pinned_num_register_threads = c.pinned_num_register_threads;
  memcpy(out->roundup_power2_divisions, c.roundup_divisions, sizeof out->roundup_power2_divisions);
  return CACHALOT_OK;
}

void cl_allocator_destroy(cachalot_allocator *a) {
  fork_watch(a, false);
  cl_host_destroy(a->host);
  for (int i = 0; i < a->device_count; i++) {
    /* locked so that the _locked helpers' contract holds; no other call may be in flight (see header) */
    cl_enter_exclusive(&a->devices[i]);
    free_device(&a->devices[i]);
    pthread_mutex_unlock(&a->devices[i].lock); /* the lanes are gone with free_device */
    pthread_mutex_destroy(&a->devices[i].lock);
    cl_autocapture_destroy(&a->devices[i]);
  }
  cl_page_map_destroy(&a->pages);
  free(a->devices);
  free(a->observers);
  free(a->conf_raw);
  pthread_mutex_destroy(&a->meta_lock);
  free(a);
}

cachalot_status cachalot_attach_oom_observer(cachalot_allocator *a, cachalot_oom_observer fn, void *ctx) {
  cachalot_status arg = cl_check_allocator_arg(a, "cachalot_attach_oom_observer");
  if (arg != CACHALOT_OK)
    return arg;
  if (!fn)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_attach_oom_observer: observer is NULL");
  pthread_mutex_lock(&a->meta_lock);
  cachalot_status rc = CACHALOT_OK;
  if (a->n_observers == a->cap_observers) {
    size_t cap = a->cap_observers ? a->cap_observers * 2 : 4;
    cl_observer *o = realloc(a->observers, cap * sizeof *o);
    if (!o)
      rc = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_attach_oom_observer: host out of memory");
    else {
      a->observers = o;
      a->cap_observers = cap;
    }
  }
  if (rc == CACHALOT_OK)
    a->observers[a->n_observers++] = (cl_observer){fn, ctx};
  pthread_mutex_unlock(&a->meta_lock);
  return rc;
}

cachalot_status cachalot_device_count(cachalot_allocator *a, int *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_device_count: out is NULL");
  *out = 0;
  if (!a)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_device_count: allocator is NULL");
  *out = a->device_count;
  return CACHALOT_OK;
}
