/* The simulated device's memory (allocations, free, mem_info, device sync) and its events, the part of the
 * simulation the allocator's warm path reaches (event record, query and release). */
#include "sim.h"

#include <stdlib.h>
#include <string.h>

/* Whether this device allocation (or map) is to fail by fault injection; counts it (lock held). */
bool cl_sim_inject_held(struct sim_backend *sim) {
  bool inject = false;
  if (sim->fail_every > 0 && ++sim->alloc_count % (uint64_t)sim->fail_every == 0)
    inject = true;
  if (sim->fail_allocs > 0) {
    sim->fail_allocs--;
    inject = true;
  }
  return inject;
}

cachalot_status cl_sim_alloc(cachalot_backend *b, int device, size_t size, void **ptr) {
  struct sim_backend *sim = sim_of(b);
  if (!ptr)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated device allocation: ptr is NULL");
  *ptr = NULL;
  if (size == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated device allocation of 0 bytes");
  cachalot_status st = sim_check_device(sim, device, "simulated device allocation");
  if (st != CACHALOT_OK)
    return st;

  sim_lock(sim);
  struct sim_device *dev = &sim->dev[device];
  uint64_t aligned = 0;
  struct sim_alloc *rec = NULL;
  bool oom = false;
  if (cl_sim_unsafe_call_prohibited_held(sim)) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "operation not permitted when stream is capturing");
    goto out;
  }

  /* Fault injection sits after the capture check, so only allocations the device would have attempted
   * count toward fail_every, including those the fail-next count already failed. */
  if (cl_sim_inject_held(sim)) {
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "injected device allocation failure");
    goto out;
  }

  if (size > sim->capacity - dev->used) {
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY,
                 "simulated device %d out of memory: %zu bytes requested, %zu free", device, size,
                 sim->capacity - dev->used);
    goto out;
  }
  /* Checked before rounding so the rounding cannot wrap. */
  if ((uint64_t)size > SIM_RANGE - dev->bump) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated address space exhausted");
    goto out;
  }
  aligned = ((uint64_t)size + SIM_ALIGN - 1) & ~(SIM_ALIGN - 1);
  if (aligned > SIM_RANGE - dev->bump) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated address space exhausted");
    goto out;
  }

  rec = malloc(sizeof *rec);
  if (!rec) {
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
    goto out;
  }
  rec->addr = ((uint64_t)(device + 1) << SIM_RANGE_SHIFT) + dev->bump;
  rec->size = size;
  rec->device = device;
  HASH_ADD(hh, sim->allocs, addr, sizeof rec->addr, rec);
  if (oom) {
    free(rec);
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
    goto out;
  }
  dev->bump += aligned;
  dev->used += size;
  *ptr = (void *)(uintptr_t)rec->addr;
  st = CACHALOT_OK;
out:
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_free(cachalot_backend *b, int device, void *ptr) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated device free");
  if (st != CACHALOT_OK)
    return st;
  /* cudaFree(NULL) succeeds without doing anything; so does this. */
  if (!ptr)
    return CACHALOT_OK;

  sim_lock(sim);
  uint64_t addr = (uint64_t)(uintptr_t)ptr;
  struct sim_alloc *rec = NULL;
  HASH_FIND(hh, sim->allocs, &addr, sizeof addr, rec);
  if (!rec) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated device free of unknown pointer 0x%" PRIx64, addr);
    goto out;
  }
  if (rec->device != device) {
    st = cl_fail(CACHALOT_ERROR_DEVICE,
                 "simulated device free of 0x%" PRIx64 " on device %d, but it was allocated on device %d",
                 addr, device, rec->device);
    goto out;
  }
  /* cudaFree synchronizes the device, which CUDA refuses while a capture the thread must respect is
   * underway; a free during capture is an allocator bug we want to surface. */
  if (cl_sim_unsafe_call_prohibited_held(sim)) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "operation not permitted when stream is capturing");
    goto out;
  }
  HASH_DEL(sim->allocs, rec);
  sim->dev[device].used -= rec->size;
  free(rec);
  sim_complete_device_held(sim, device);
  st = CACHALOT_OK;
out:
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_mem_info(cachalot_backend *b, int device, size_t *free_bytes,
                                size_t *total_bytes) {
  struct sim_backend *sim = sim_of(b);
  if (free_bytes)
    *free_bytes = 0;
  if (total_bytes)
    *total_bytes = 0;
  if (!free_bytes || !total_bytes)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated mem_info: NULL output");
  cachalot_status st = sim_check_device(sim, device, "simulated mem_info");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  *free_bytes = sim->capacity - sim->dev[device].used;
  *total_bytes = sim->capacity;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cl_sim_device_sync(cachalot_backend *b, int device) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated device sync");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  if (cl_sim_unsafe_call_prohibited_held(sim))
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated device sync: operation not permitted when stream is capturing");
  else
    sim_complete_device_held(sim, device);
  sim_unlock(sim);
  return st;
}

static struct sim_event *pop_event_held(struct sim_backend *sim) {
  if (!sim->free_events) {
    struct sim_event_slab *slab = malloc(sizeof *slab);
    if (!slab)
      return NULL;
    slab->next = sim->slabs;
    sim->slabs = slab;
    for (int i = 0; i < SIM_EVENT_SLAB; i++) {
      slab->events[i].stream = NULL;
      slab->events[i].next_free = sim->free_events;
      sim->free_events = &slab->events[i];
    }
  }
  struct sim_event *ev = sim->free_events;
  sim->free_events = ev->next_free;
  ev->next_free = NULL;
  return ev;
}

cachalot_status cl_sim_event_record(cachalot_backend *b, int device, cachalot_stream s, cl_event **out) {
  struct sim_backend *sim = sim_of(b);
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event record: out is NULL");
  *out = NULL;
  /* A stream of another device is fine: the event goes on that stream's own device, as with CUDA. */
  struct sim_stream *stream;
  cachalot_status st = sim_enter_stream(sim, device, s, true, "simulated event record", &stream);
  if (st != CACHALOT_OK)
    return st;
  if (stream->capture && stream->capture->invalidated) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated event record: %s", MSG_INVALIDATED);
    goto out;
  }
  if (sim->fail_events > 0) {
    sim->fail_events--;
    st = cl_fail(CACHALOT_ERROR_DEVICE, "injected event failure");
    goto out;
  }
  struct sim_event *ev = pop_event_held(sim);
  if (!ev) {
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
    goto out;
  }
  ev->stream = stream;
  ev->captured = stream->capture != NULL;
  if (ev->captured) {
    /* Recording into a capture adds a graph node, not device work: the stream's numbering is untouched. */
    ev->seq = stream->submitted;
  } else {
    ev->seq = sim_submit_held(sim, stream, 1);
  }
  *out = (cl_event *)ev;
  st = CACHALOT_OK;
out:
  sim_unlock(sim);
  return st;
}

/* Shared by query and sync: an event that is not recorded (released, or never from this pool) or that was
 * captured cannot be asked about. */
static cachalot_status check_event_held(const struct sim_event *ev, const char *fn) {
  if (!ev->stream)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: the simulated event is not recorded (released?)",
                   fn);
  if (ev->captured)
    return cl_fail(CACHALOT_ERROR_DEVICE,
                   "%s: operation not permitted when stream is capturing "
                   "(the event was recorded during a capture)",
                   fn);
  return CACHALOT_OK;
}

cachalot_status cl_sim_event_query(cachalot_backend *b, cl_event *e, bool *done) {
  struct sim_backend *sim = sim_of(b);
  if (!done)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event query: done is NULL");
  *done = false;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event query: event is NULL");
  struct sim_event *ev = (struct sim_event *)e;
  sim_lock(sim);
  cachalot_status st = check_event_held(ev, "simulated event query");
  if (st == CACHALOT_OK) {
    sim_stream_settle(sim, ev->stream);
    *done = ev->stream->completed >= ev->seq;
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_event_sync(cachalot_backend *b, cl_event *e) {
  struct sim_backend *sim = sim_of(b);
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event sync: event is NULL");
  struct sim_event *ev = (struct sim_event *)e;
  sim_lock(sim);
  cachalot_status st = check_event_held(ev, "simulated event sync");
  /* Nothing runs on a simulated device but the caller's say-so, so waiting is what finishes the work;
   * everything before the event on its stream finishes with it. */
  if (st == CACHALOT_OK)
    sim_stream_settle(sim, ev->stream);
  if (st == CACHALOT_OK && ev->stream->completed < ev->seq) {
    ev->stream->completed = ev->seq;
    sim_completed_held(sim, ev->stream);
  }
  sim_unlock(sim);
  return st;
}

void cl_sim_event_release(cachalot_backend *b, cl_event *e) {
  struct sim_backend *sim = sim_of(b);
  struct sim_event *ev = (struct sim_event *)e;
  /* Releasing NULL or an event twice is ignored rather than corrupting the free list. */
  if (!ev)
    return;
  sim_lock(sim);
  if (ev->stream) {
    ev->stream = NULL;
    ev->next_free = sim->free_events;
    sim->free_events = ev;
  }
  sim_unlock(sim);
}

const uint32_t *cl_sim_completion_word(cachalot_backend *b, int device) {
  (void)device; /* one word for every device: a completion on one sends the others to poll too, which is safe */
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  const bool keep = !sim->no_word;
  sim_unlock(sim);
  return keep ? &sim->completions : NULL;
}

/* Keeps `ev` among the watched events; false on host OOM. */
static bool watch_add_held(struct sim_backend *sim, const struct sim_event *ev) {
  if (sim->n_watches == sim->cap_watches) {
    size_t cap = sim->cap_watches ? sim->cap_watches * 2 : 16;
    struct sim_watch *w = realloc(sim->watches, cap * sizeof *w);
    if (!w)
      return false;
    sim->watches = w;
    sim->cap_watches = cap;
  }
  sim->watches[sim->n_watches++] = (struct sim_watch){ev->stream, ev->seq};
  return true;
}

void cl_sim_completion_watch(cachalot_backend *b, int device, cl_event *e) {
  (void)device; /* one word for every device */
  struct sim_backend *sim = sim_of(b);
  struct sim_event *ev = (struct sim_event *)e;
  sim_lock(sim);
  if (ev && ev->stream && !ev->captured)
    sim_stream_settle(sim, ev->stream);
  /* Moved now where the event is done already or nothing could be waited for on; where it cannot be kept,
   * as the contract asks, with no word from here on. */
  if (!ev || !ev->stream || ev->captured || ev->stream->completed >= ev->seq) {
    sim_raise_held(sim);
  } else if (!watch_add_held(sim, ev)) {
    sim->no_word = true;
    sim_raise_held(sim);
  }
  sim_unlock(sim);
}

/* A handle that names the allocation: the bytes "cachalot-sim-ipc", the device and the base address (the
 * simulated device has one process; tests read the handle back). */
cachalot_status cl_sim_ipc_handle(cachalot_backend *b, int device, void *base, unsigned char handle[64]) {
  struct sim_backend *sim = sim_of(b);
  if (!base || !handle)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated ipc handle: %s is NULL", !base ? "base" : "handle");
  cachalot_status st = sim_check_device(sim, device, "simulated ipc handle");
  if (st != CACHALOT_OK)
    return st;
  memset(handle, 0, 64);
  memcpy(handle, "cachalot-sim-ipc", 16);
  const int32_t dev = device;
  const uintptr_t addr = (uintptr_t)base;
  memcpy(handle + 16, &dev, sizeof dev);
  memcpy(handle + 24, &addr, sizeof addr);
  return CACHALOT_OK;
}
