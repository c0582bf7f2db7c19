/* The simulated device backend: the backend the unit suite, trace replay and the benchmarks' "cachalot on
 * the simulated device" run on, since CI has no GPU.
 *
 * What it models, and how:
 * - Device memory: device d owns the fake address range [(d+1) << 46, (d+2) << 46). Allocations are
 *   bump-allocated from it at 512-byte alignment and addresses are never reused, so a stale pointer can
 *   never alias a newer allocation. A device counts the bytes asked of it against its capacity.
 * - Streams and events: a stream numbers its work 1, 2, ...; recording an event submits the next number,
 *   and the event is done once the stream's completed number reaches it. Only the caller completes work
 *   (cachalot_sim_stream_complete, an event sync, or a device free, which synchronizes the device as
 *   cudaFree does), unless complete_immediately is set.
 * - Stream capture: CUDA's rule for calls that may synchronize (cudaMalloc, cudaFree) made while a
 *   capture is underway. A thread whose capture mode is GLOBAL is refused while any GLOBAL
 *   capture is underway on this backend or while it has a non-RELAXED capture of its own; a THREAD_LOCAL
 *   thread only in the latter case; a RELAXED thread never. (CUDA also invalidates the captures that
 *   caused such a refusal; the simulation only refuses the call, and the capture carries on.)
 * - Graphs: work (cachalot_sim_launch, memcpy_async) enqueued on a capturing stream becomes a node of
 *   the capture's graph, with an edge from each node the stream depends on, as CUDA builds it. A stream
 *   joins a capture by waiting (stream_wait) on a stream of it, and takes the capture's id; the capture
 *   ends on its origin stream only, and fails as "unjoined" unless every node is an ancestor of (or is)
 *   a node the origin stream depends on at that point, i.e. every side stream's work was waited on by
 *   the origin stream after it was enqueued. The misuses CUDA answers by invalidating a capture (see
 *   capture_invalidate_locked's callers) do so here too; ending an invalidated capture fails with no
 *   graph. A replay enqueues the graph's nodes as work on the stream, one number each.
 * - Fault injection: the next N device allocations fail, every k-th fails, the next N event records fail.
 *
 * One mutex guards the whole backend; nothing here is on the allocator's warm path except event record,
 * query and release, which take it briefly and never touch the host heap once the event pool is warm.
 */
#include "../ops.h"

#include "../../../common/error.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* uthash's default reaction to a failed host allocation is exit(); with HASH_NONFATAL_OOM it instead
 * leaves the element out and calls this, which sets the `oom` flag every adding function declares, so
 * the failure comes back to the caller as a status. */
#ifndef HASH_NONFATAL_OOM
#define HASH_NONFATAL_OOM 1
#elif !HASH_NONFATAL_OOM
#error "sim.c needs uthash built with HASH_NONFATAL_OOM=1"
#endif
#define uthash_nonfatal_oom(obj) (oom = true)
#include <uthash.h>

enum {
  SIM_MAX_DEVICES = 64,
  SIM_EVENT_SLAB = 64, /* events per host allocation of the event pool */
};

#define SIM_ALIGN ((uint64_t)512)
#define SIM_RANGE_SHIFT 46
#define SIM_RANGE ((uint64_t)1 << SIM_RANGE_SHIFT) /* bytes of address space per device */
#define SIM_DEFAULT_CAPACITY ((size_t)80 << 30)

/* A simulated stream. Its work is numbered 1, 2, ...: each event recorded and each work item enqueued
 * outside a capture submits the next number.
 * Invariant: completed <= submitted; an event with seq <= completed is done.
 * capture != NULL exactly while the stream takes part in a capture (as its origin or joined into it);
 * deps[0..n_deps) then lists the nodes of the capture's graph that the stream's next node will depend
 * on (CUDA's capture dependency set, without duplicates), and n_deps is 0 otherwise.
 * Created streams live in sim_backend.streams, keyed by their handle (`key`, the struct's own address),
 * until the backend is destroyed, also once `destroyed` (so an event recorded on a destroyed stream
 * stays valid and no later stream can have the same handle); each device's default stream (the NULL
 * handle) is embedded in sim_device and is never in the hash, so no caller-supplied handle can name it,
 * and it never captures. */
struct sim_stream {
  const void *key;
  int device;
  bool destroyed;
  uint64_t submitted;
  uint64_t completed;
  struct sim_capture *capture;
  size_t *deps;
  size_t n_deps, cap_deps;
  UT_hash_handle hh;
};

/* What a capture node stands for, for the DOT dump. */
enum sim_node_kind { SIM_NODE_KERNEL, SIM_NODE_MEMCPY };

struct sim_edge {
  size_t from, to;
};

/* A capture sequence: begun on `origin`, joined by the other `members`. The graph under construction is
 * n_nodes nodes (kinds[i] the kind of node i) and the edges between them.
 * Invariant: the capture is on sim_backend.captures exactly while it is underway; members[0] == origin
 * and every member's `capture` points here; mode and thread are the begin's; id != 0 and unique on the
 * backend; invalidated once a misuse broke it (it then still counts as underway, with id 0 shown to
 * stream_capture_info, until the origin ends it). */
struct sim_capture {
  uint64_t id;
  struct sim_stream *origin;
  cachalot_capture_mode mode;
  pthread_t thread;
  bool invalidated;
  struct sim_stream **members;
  size_t n_members, cap_members;
  unsigned char *kinds;
  size_t n_nodes, cap_nodes;
  struct sim_edge *edges;
  size_t n_edges, cap_edges;
  struct sim_capture *prev, *next;
};

/* A captured graph and an instantiated one, handed to the core as cl_graph* / cl_graph_exec*. Both are
 * listed on the backend (so a handle can be checked, and what the caller never destroyed is freed with the
 * backend); an instance does not refer to its graph, which may be destroyed first, as in CUDA. */
struct cl_graph {
  uint64_t capture_id;
  size_t n_nodes;
  unsigned char *kinds;
  struct sim_edge *edges;
  size_t n_edges;
  struct cl_graph *prev, *next;
};

struct cl_graph_exec {
  size_t n_nodes;
  struct cl_graph_exec *prev, *next;
};

/* A recorded event, handed to the core as a cl_event* (the core never looks inside).
 * Invariant: stream == NULL exactly while the event sits on the free list. An event recorded while its
 * stream was capturing (captured != 0) stands for graph work, not device work: CUDA refuses to query or
 * synchronize such an event, and so do we. */
struct sim_event {
  struct sim_stream *stream;
  uint64_t seq;
  bool captured;
  struct sim_event *next_free;
};

/* Events are carved from slabs that are freed only with the backend, so a released event's memory stays
 * valid and the pool needs no host allocation once it has grown to the core's peak. */
struct sim_event_slab {
  struct sim_event_slab *next;
  struct sim_event events[SIM_EVENT_SLAB];
};

/* A live device allocation of `size` bytes at `addr` on `device`, keyed by addr. */
struct sim_alloc {
  uint64_t addr;
  size_t size;
  int device;
  UT_hash_handle hh;
};

/* A reservation of address space (va_reserve), keyed by base, and a mapping inside one (va_map), keyed
 * by addr. */
struct sim_range {
  uint64_t addr;
  size_t size;
  int device;
  UT_hash_handle hh;
};

/* Invariant: used == the sum of the sizes of the device's live allocations and mappings, and used <=
 * capacity;
 * bump is a multiple of SIM_ALIGN, at most SIM_RANGE, and above every live allocation's end offset. */
struct sim_device {
  size_t used;
  uint64_t bump;
  struct sim_stream default_stream;
};

/* Everything below `mu` is guarded by it.
 * Invariant: global_captures / strict_captures count the captures underway whose mode is GLOBAL /
 * not RELAXED; they let an allocation skip the scan for captures of its own thread in the common case. */
struct sim_backend {
  struct cachalot_backend base;
  size_t capacity;
  bool complete_immediately;
  pthread_mutex_t mu;

  struct sim_device dev[SIM_MAX_DEVICES];
  struct sim_stream *streams;
  struct sim_alloc *allocs;
  struct sim_range *reservations, *mappings;
  struct sim_event *free_events;
  struct sim_event_slab *slabs;
  struct sim_capture *captures;
  struct cl_graph *graphs;
  struct cl_graph_exec *execs;

  int fail_allocs;      /* injected failures left for the next device allocations */
  int fail_every;       /* 0: off; else the fail_every-th, 2*fail_every-th, ... allocation fails */
  uint64_t alloc_count; /* allocations that reached fault injection since fail_every was set */
  int fail_events;      /* injected failures left for the next event records */

  uint64_t next_capture_id;
  int global_captures;
  int strict_captures;
};

static const cl_backend_ops sim_ops;

/* The calling thread's stream-capture mode (cudaThreadExchangeStreamCaptureMode). Per thread, not per
 * backend, as in CUDA; zero-initialized to GLOBAL, CUDA's default. */
static _Thread_local cachalot_capture_mode sim_thread_mode = CACHALOT_CAPTURE_GLOBAL;

/* Whether `b` is a simulated backend, so that the cachalot_sim_* controls apply. */
static bool backend_is_sim(const cachalot_backend *b) { return b && b->ops == &sim_ops; }

static struct sim_backend *sim_of(cachalot_backend *b) { return (struct sim_backend *)b; }

static void sim_lock(struct sim_backend *sim) { pthread_mutex_lock(&sim->mu); }
static void sim_unlock(struct sim_backend *sim) { pthread_mutex_unlock(&sim->mu); }

static uintptr_t handle_bits(cachalot_stream s) { return (uintptr_t)(void *)s; }

/* The public controls accept any backend handle; anything but a simulated one is the caller's mistake. */
static cachalot_status sim_check(cachalot_backend *b, const char *fn) {
  if (!b)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: backend is NULL", fn);
  if (!backend_is_sim(b))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: not a simulated backend (it is \"%s\")", fn,
                   b->ops->name);
  return CACHALOT_OK;
}

static cachalot_status sim_check_device(const struct sim_backend *sim, int device, const char *fn) {
  if (device < 0 || device >= sim->base.device_count)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: device %d out of range (the backend has %d)", fn,
                   device, sim->base.device_count);
  return CACHALOT_OK;
}

static struct sim_stream *find_stream_locked(struct sim_backend *sim, cachalot_stream s) {
  const void *key = (const void *)s;
  struct sim_stream *st = NULL;
  HASH_FIND_PTR(sim->streams, &key, st);
  return st;
}

/* A non-NULL handle that must name a stream of this backend (of any device) that is not destroyed. */
static cachalot_status live_stream_locked(struct sim_backend *sim, cachalot_stream s, struct sim_stream **out) {
  struct sim_stream *st = find_stream_locked(sim, s);
  *out = NULL;
  if (!st)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
  if (st->destroyed)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated stream 0x%" PRIxPTR " was destroyed",
                   handle_bits(s));
  *out = st;
  return CACHALOT_OK;
}

/* Resolves a handle used with `device`: NULL is that device's default stream; anything else must be a
 * live stream created on this backend for the same device. */
static cachalot_status resolve_stream_locked(struct sim_backend *sim, int device, cachalot_stream s,
                                             struct sim_stream **out) {
  *out = NULL;
  if (!s) {
    *out = &sim->dev[device].default_stream;
    return CACHALOT_OK;
  }
  struct sim_stream *st = NULL;
  cachalot_status rc = live_stream_locked(sim, s, &st);
  if (rc != CACHALOT_OK)
    return rc;
  if (st->device != device)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "simulated stream 0x%" PRIxPTR " belongs to device %d, not device %d", handle_bits(s),
                   st->device, device);
  *out = st;
  return CACHALOT_OK;
}

/* Like resolve_stream_locked, but a non-NULL stream may belong to any device (a cross-device wait or
 * event record is legal in CUDA); NULL is `device`'s default stream. */
static cachalot_status resolve_any_stream_locked(struct sim_backend *sim, int device, cachalot_stream s,
                                                 struct sim_stream **out) {
  if (!s) {
    *out = &sim->dev[device].default_stream;
    return CACHALOT_OK;
  }
  return live_stream_locked(sim, s, out);
}

/* The capture id a stream shows: 0 when it takes part in no capture, and also (as CUDA does) when its
 * capture has been invalidated. */
static uint64_t shown_capture_id(const struct sim_stream *st) {
  return st->capture && !st->capture->invalidated ? st->capture->id : 0;
}

/* CUDA's messages for the capture errors the simulation reproduces. */
static const char MSG_UNSUPPORTED[] = "operation not permitted when stream is capturing";
static const char MSG_INVALIDATED[] = "operation failed due to a previous error during capture";

/* A misuse during a capture breaks it, as in CUDA: it stays underway (and keeps prohibiting unsafe calls)
 * until its origin stream ends it, which then fails with no graph. */
static void capture_invalidate_locked(struct sim_capture *c) { c->invalidated = true; }

/* CUDA's rule for calls that may synchronize (cudaMalloc, cudaFree) while a capture is underway; see the
 * comment at the top of the file. */
static bool unsafe_call_prohibited_locked(struct sim_backend *sim) {
  cachalot_capture_mode mine = sim_thread_mode;
  if (mine == CACHALOT_CAPTURE_RELAXED)
    return false;
  if (mine == CACHALOT_CAPTURE_GLOBAL && sim->global_captures > 0)
    return true;
  if (sim->strict_captures == 0)
    return false;
  pthread_t self = pthread_self();
  for (const struct sim_capture *c = sim->captures; c; c = c->next) {
    if (c->mode != CACHALOT_CAPTURE_RELAXED && pthread_equal(c->thread, self))
      return true;
  }
  return false;
}

static void complete_device_locked(struct sim_backend *sim, int device) {
  struct sim_stream *def = &sim->dev[device].default_stream;
  def->completed = def->submitted;
  struct sim_stream *st, *tmp;
  HASH_ITER(hh, sim->streams, st, tmp) {
    if (st->device == device)
      st->completed = st->submitted;
  }
}

/* ---- the ops table ---- */

/* Whether this device allocation (or map) is to fail by fault injection; counts it (lock held). */
static bool inject_locked(struct sim_backend *sim) {
  bool inject = false;
  if (sim->fail_every > 0 && ++sim->alloc_count % (uint64_t)sim->fail_every == 0)
    inject = true;
  if (sim->fail_allocs > 0) {
    sim->fail_allocs--;
    inject = true;
  }
  return inject;
}

static cachalot_status sim_alloc(cachalot_backend *b, int device, size_t size, void **ptr) {
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
  if (unsafe_call_prohibited_locked(sim)) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "operation not permitted when stream is capturing");
    goto out;
  }

  /* Fault injection sits after the capture check, so only allocations the device would have attempted
   * count toward fail_every, including those the fail-next count already failed. */
  if (inject_locked(sim)) {
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

static cachalot_status sim_free(cachalot_backend *b, int device, void *ptr) {
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
  if (unsafe_call_prohibited_locked(sim)) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "operation not permitted when stream is capturing");
    goto out;
  }
  HASH_DEL(sim->allocs, rec);
  sim->dev[device].used -= rec->size;
  free(rec);
  complete_device_locked(sim, device);
  st = CACHALOT_OK;
out:
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_mem_info(cachalot_backend *b, int device, size_t *free_bytes,
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

static struct sim_event *pop_event_locked(struct sim_backend *sim) {
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

static cachalot_status sim_stream_check(cachalot_backend *b, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  if (!s)
    return CACHALOT_OK;
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  cachalot_status st = live_stream_locked(sim, s, &stream);
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_event_record(cachalot_backend *b, int device, cachalot_stream s, cl_event **out) {
  struct sim_backend *sim = sim_of(b);
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event record: out is NULL");
  *out = NULL;
  cachalot_status st = sim_check_device(sim, device, "simulated event record");
  if (st != CACHALOT_OK)
    return st;

  sim_lock(sim);
  /* A stream of another device is fine: the event goes on that stream's own device, as with CUDA. */
  struct sim_stream *stream = NULL;
  st = resolve_any_stream_locked(sim, device, s, &stream);
  if (st != CACHALOT_OK)
    goto out;
  if (stream->capture && stream->capture->invalidated) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated event record: %s", MSG_INVALIDATED);
    goto out;
  }
  if (sim->fail_events > 0) {
    sim->fail_events--;
    st = cl_fail(CACHALOT_ERROR_DEVICE, "injected event failure");
    goto out;
  }
  struct sim_event *ev = pop_event_locked(sim);
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
    ev->seq = ++stream->submitted;
    if (sim->complete_immediately)
      stream->completed = stream->submitted;
  }
  *out = (cl_event *)ev;
  st = CACHALOT_OK;
out:
  sim_unlock(sim);
  return st;
}

/* Shared by query and sync: an event that is not recorded (released, or never from this pool) or that was
 * captured cannot be asked about. */
static cachalot_status check_event_locked(const struct sim_event *ev, const char *fn) {
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

static cachalot_status sim_event_query(cachalot_backend *b, cl_event *e, bool *done) {
  struct sim_backend *sim = sim_of(b);
  if (!done)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event query: done is NULL");
  *done = false;
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event query: event is NULL");
  struct sim_event *ev = (struct sim_event *)e;
  sim_lock(sim);
  cachalot_status st = check_event_locked(ev, "simulated event query");
  if (st == CACHALOT_OK)
    *done = ev->stream->completed >= ev->seq;
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_event_sync(cachalot_backend *b, cl_event *e) {
  struct sim_backend *sim = sim_of(b);
  if (!e)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated event sync: event is NULL");
  struct sim_event *ev = (struct sim_event *)e;
  sim_lock(sim);
  cachalot_status st = check_event_locked(ev, "simulated event sync");
  /* Nothing runs on a simulated device but the caller's say-so, so waiting is what finishes the work;
   * everything before the event on its stream finishes with it. */
  if (st == CACHALOT_OK && ev->stream->completed < ev->seq)
    ev->stream->completed = ev->seq;
  sim_unlock(sim);
  return st;
}

static void sim_event_release(cachalot_backend *b, cl_event *e) {
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

static cachalot_status sim_stream_capture_info(cachalot_backend *b, int device, cachalot_stream s,
                                               bool *capturing, uint64_t *capture_id) {
  struct sim_backend *sim = sim_of(b);
  if (capturing)
    *capturing = false;
  if (capture_id)
    *capture_id = 0;
  if (!capturing || !capture_id)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated stream capture info: NULL output");
  cachalot_status st = sim_check_device(sim, device, "simulated stream capture info");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_any_stream_locked(sim, device, s, &stream); /* any device's stream: CUDA's handles are */
  if (st == CACHALOT_OK) {
    /* An invalidated capture counts as capturing with id 0, as cudaStreamGetCaptureInfo reports it. */
    *capturing = stream->capture != NULL;
    *capture_id = shown_capture_id(stream);
  }
  sim_unlock(sim);
  return st;
}

static bool valid_mode(cachalot_capture_mode m) {
  return m == CACHALOT_CAPTURE_GLOBAL || m == CACHALOT_CAPTURE_THREAD_LOCAL || m == CACHALOT_CAPTURE_RELAXED;
}

static cachalot_status sim_capture_mode_exchange(cachalot_backend *b, cachalot_capture_mode *mode) {
  (void)b;
  if (!mode)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture mode exchange: mode is NULL");
  if (!valid_mode(*mode))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture mode exchange: invalid mode %d",
                   (int)*mode);
  cachalot_capture_mode prev = sim_thread_mode;
  sim_thread_mode = *mode;
  *mode = prev;
  return CACHALOT_OK;
}

/* ---- captures and graphs ---- */

/* Room for `need` elements of `elem` bytes in the array `p` of capacity *cap, where need > *cap: the
 * (possibly moved) array, or NULL on host OOM with `p` untouched. */
static void *grow_array(void *p, size_t *cap, size_t need, size_t elem) {
  size_t n = *cap ? *cap : 8;
  while (n < need) {
    if (n > SIZE_MAX / 2)
      return NULL;
    n *= 2;
  }
  if (n > SIZE_MAX / elem)
    return NULL;
  void *q = realloc(p, n * elem);
  if (q)
    *cap = n;
  return q;
}

static bool reserve_deps(struct sim_stream *st, size_t need) {
  if (need <= st->cap_deps)
    return true;
  size_t *q = grow_array(st->deps, &st->cap_deps, need, sizeof *q);
  if (q)
    st->deps = q;
  return q != NULL;
}

static cachalot_status host_oom(const char *fn) {
  return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "%s: host out of memory", fn);
}

/* Ends capture `c` whatever its state: every member leaves it, and the counters and the capture list
 * forget it. Its node arrays are freed unless they were moved to a graph (set to NULL) first. */
static void capture_finish_locked(struct sim_backend *sim, struct sim_capture *c) {
  for (size_t i = 0; i < c->n_members; i++) {
    c->members[i]->capture = NULL;
    c->members[i]->n_deps = 0;
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    sim->captures = c->next;
  if (c->next)
    c->next->prev = c->prev;
  if (c->mode == CACHALOT_CAPTURE_GLOBAL)
    sim->global_captures--;
  if (c->mode != CACHALOT_CAPTURE_RELAXED)
    sim->strict_captures--;
  free(c->members);
  free(c->kinds);
  free(c->edges);
  free(c);
}

/* Shared by the capture_begin op and cachalot_sim_capture_begin; `stream` is a live created stream. */
static cachalot_status capture_begin_locked(struct sim_backend *sim, struct sim_stream *stream,
                                            cachalot_capture_mode mode, const char *fn) {
  if (stream->capture)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: stream 0x%" PRIxPTR " is already capturing (capture %" PRIu64 ")", fn,
                   (uintptr_t)stream->key, stream->capture->id);
  struct sim_capture *c = calloc(1, sizeof *c);
  struct sim_stream **members = malloc(4 * sizeof *members);
  if (!c || !members) {
    free(c);
    free(members);
    return host_oom(fn);
  }
  c->id = sim->next_capture_id++;
  c->origin = stream;
  c->mode = mode;
  c->thread = pthread_self();
  c->members = members;
  c->members[0] = stream;
  c->n_members = 1;
  c->cap_members = 4;
  c->next = sim->captures;
  if (sim->captures)
    sim->captures->prev = c;
  sim->captures = c;
  if (mode == CACHALOT_CAPTURE_GLOBAL)
    sim->global_captures++;
  if (mode != CACHALOT_CAPTURE_RELAXED)
    sim->strict_captures++;
  stream->capture = c;
  stream->n_deps = 0;
  return CACHALOT_OK;
}

/* Whether every node of `c` is one the origin stream depends on, or an ancestor of one: CUDA's rule that
 * each fork is joined back into the origin stream before the capture ends. Relies on the edges being
 * sorted by `to` (a node's incoming edges are added with the node). False on host OOM. */
static bool capture_joined(const struct sim_capture *c, bool *joined, size_t *unjoined) {
  size_t n = c->n_nodes;
  *joined = true;
  *unjoined = 0;
  if (n == 0)
    return true;
  size_t *first_in = malloc((n + 1) * sizeof *first_in);
  size_t *stack = malloc(n * sizeof *stack);
  unsigned char *seen = calloc(n, 1);
  if (!first_in || !stack || !seen) {
    free(first_in);
    free(stack);
    free(seen);
    return false;
  }
  size_t e = 0;
  for (size_t v = 0; v <= n; v++) {
    while (e < c->n_edges && c->edges[e].to < v)
      e++;
    first_in[v] = e; /* the edges into v are [first_in[v], first_in[v + 1]) */
  }
  size_t top = 0, reached = 0;
  const struct sim_stream *o = c->origin;
  for (size_t i = 0; i < o->n_deps; i++) {
    if (!seen[o->deps[i]]) {
      seen[o->deps[i]] = 1;
      stack[top++] = o->deps[i];
    }
  }
  while (top > 0) {
    size_t v = stack[--top];
    reached++;
    for (size_t k = first_in[v]; k < first_in[v + 1]; k++) {
      size_t u = c->edges[k].from;
      if (!seen[u]) {
        seen[u] = 1;
        stack[top++] = u;
      }
    }
  }
  free(first_in);
  free(stack);
  free(seen);
  *joined = reached == n;
  *unjoined = n - reached;
  return true;
}

/* Shared by the capture_end op and cachalot_sim_capture_end (graph == NULL: the graph is dropped). */
static cachalot_status capture_end_locked(struct sim_backend *sim, struct sim_stream *stream, const char *fn,
                                          struct cl_graph **graph, size_t *n_nodes) {
  struct sim_capture *c = stream->capture;
  if (!c)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "%s: stream 0x%" PRIxPTR " is not capturing", fn,
                   (uintptr_t)stream->key);
  if (c->origin != stream) {
    /* cudaErrorStreamCaptureUnmatched, which also invalidates the capture (seen on CUDA 13). */
    capture_invalidate_locked(c);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: capture was not initiated in this stream (stream 0x%" PRIxPTR
                   " joined capture %" PRIu64 " of stream 0x%" PRIxPTR "); the capture is now invalidated",
                   fn, (uintptr_t)stream->key, c->id, (uintptr_t)c->origin->key);
  }
  uint64_t id = c->id;
  if (c->mode != CACHALOT_CAPTURE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
    /* cudaErrorStreamCaptureWrongThread, which also ends the capture (seen on CUDA 13). */
    capture_finish_locked(sim, c);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: capture %" PRIu64 " must be ended by the thread that began it; it is ended, with no graph",
                   fn, id);
  }
  if (c->invalidated) {
    capture_finish_locked(sim, c);
    return cl_fail(CACHALOT_ERROR_DEVICE, "%s: %s (capture %" PRIu64 " was invalidated; no graph)", fn,
                   MSG_INVALIDATED, id);
  }
  bool joined = true;
  size_t unjoined = 0;
  if (!capture_joined(c, &joined, &unjoined))
    return host_oom(fn); /* the capture stays underway */
  if (!joined) {
    size_t total = c->n_nodes;
    capture_finish_locked(sim, c);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: capture sequence contains a fork that was not joined to the primary stream (%zu of the "
                   "%zu nodes of capture %" PRIu64 " are not waited on by stream 0x%" PRIxPTR
                   "); it is ended, with no graph",
                   fn, unjoined, total, id, (uintptr_t)stream->key);
  }
  if (graph) {
    struct cl_graph *g = calloc(1, sizeof *g);
    if (!g)
      return host_oom(fn); /* the capture stays underway */
    g->capture_id = id;
    g->n_nodes = c->n_nodes;
    g->kinds = c->kinds;
    g->edges = c->edges;
    g->n_edges = c->n_edges;
    c->kinds = NULL;
    c->edges = NULL;
    g->next = sim->graphs;
    if (sim->graphs)
      sim->graphs->prev = g;
    sim->graphs = g;
    *graph = g;
    *n_nodes = g->n_nodes;
  }
  capture_finish_locked(sim, c);
  return CACHALOT_OK;
}

/* Adds a node of `kind` to the capture of `st` (capturing, not invalidated), depending on every node
 * `st` depends on; `st` then depends on the new node alone. Nothing changes on host OOM. */
static cachalot_status capture_add_node_locked(struct sim_stream *st, enum sim_node_kind kind, const char *fn) {
  struct sim_capture *c = st->capture;
  if (c->n_nodes + 1 > c->cap_nodes) {
    unsigned char *q = grow_array(c->kinds, &c->cap_nodes, c->n_nodes + 1, sizeof *q);
    if (!q)
      return host_oom(fn);
    c->kinds = q;
  }
  if (c->n_edges + st->n_deps > c->cap_edges) {
    struct sim_edge *q = grow_array(c->edges, &c->cap_edges, c->n_edges + st->n_deps, sizeof *q);
    if (!q)
      return host_oom(fn);
    c->edges = q;
  }
  if (!reserve_deps(st, 1))
    return host_oom(fn);
  size_t id = c->n_nodes++;
  c->kinds[id] = (unsigned char)kind;
  for (size_t i = 0; i < st->n_deps; i++)
    c->edges[c->n_edges++] = (struct sim_edge){st->deps[i], id};
  st->deps[0] = id;
  st->n_deps = 1;
  return CACHALOT_OK;
}

/* One work item on `st`: a node of its capture, or the stream's next number. */
static cachalot_status enqueue_locked(struct sim_backend *sim, struct sim_stream *st, enum sim_node_kind kind,
                                      const char *fn) {
  if (st->capture) {
    if (st->capture->invalidated)
      return cl_fail(CACHALOT_ERROR_DEVICE, "%s: %s", fn, MSG_INVALIDATED);
    return capture_add_node_locked(st, kind, fn);
  }
  st->submitted++;
  if (sim->complete_immediately)
    st->completed = st->submitted;
  return CACHALOT_OK;
}

static cachalot_status sim_capture_begin(cachalot_backend *b, int device, cachalot_stream s,
                                         cachalot_capture_mode mode) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated capture begin");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  if (!valid_mode(mode))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture begin: invalid capture mode %d", (int)mode);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_locked(sim, device, s, &stream);
  if (st == CACHALOT_OK)
    st = capture_begin_locked(sim, stream, mode, "simulated capture begin");
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_capture_end(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
                                       size_t *n_nodes) {
  struct sim_backend *sim = sim_of(b);
  if (graph)
    *graph = NULL;
  if (n_nodes)
    *n_nodes = 0;
  if (!graph || !n_nodes)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated capture end: NULL output");
  cachalot_status st = sim_check_device(sim, device, "simulated capture end");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_locked(sim, device, s, &stream);
  if (st == CACHALOT_OK)
    st = capture_end_locked(sim, stream, "simulated capture end", graph, n_nodes);
  sim_unlock(sim);
  return st;
}

static bool graph_known_locked(const struct sim_backend *sim, const struct cl_graph *g) {
  for (const struct cl_graph *x = sim->graphs; x; x = x->next)
    if (x == g)
      return true;
  return false;
}

static bool exec_known_locked(const struct sim_backend *sim, const struct cl_graph_exec *e) {
  for (const struct cl_graph_exec *x = sim->execs; x; x = x->next)
    if (x == e)
      return true;
  return false;
}

static cachalot_status sim_graph_instantiate(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec) {
  struct sim_backend *sim = sim_of(b);
  if (!exec)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph instantiate: exec is NULL");
  *exec = NULL;
  cachalot_status st = sim_check_device(sim, device, "simulated graph instantiate");
  if (st != CACHALOT_OK)
    return st;
  struct cl_graph_exec *e = calloc(1, sizeof *e);
  if (!e)
    return host_oom("simulated graph instantiate");
  sim_lock(sim);
  if (!g || !graph_known_locked(sim, g)) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph instantiate: %p is not a live simulated graph",
                 (void *)g);
    free(e);
  } else {
    e->n_nodes = g->n_nodes;
    e->next = sim->execs;
    if (sim->execs)
      sim->execs->prev = e;
    sim->execs = e;
    *exec = e;
  }
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_graph_launch(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated graph launch");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  if (!e || !exec_known_locked(sim, e)) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                 "simulated graph launch: %p is not a live simulated graph instance", (void *)e);
  } else if ((st = resolve_stream_locked(sim, device, s, &stream)) != CACHALOT_OK) {
    /* failed */
  } else if (stream->capture) {
    /* cudaGraphLaunch into a capture is refused and invalidates it (seen on CUDA 13). */
    capture_invalidate_locked(stream->capture);
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated graph launch: %s (the capture is now invalidated)",
                 MSG_UNSUPPORTED);
  } else {
    stream->submitted += e->n_nodes;
    if (sim->complete_immediately)
      stream->completed = stream->submitted;
  }
  sim_unlock(sim);
  return st;
}

static void sim_graph_destroy(cachalot_backend *b, cl_graph *g) {
  struct sim_backend *sim = sim_of(b);
  if (!g)
    return;
  sim_lock(sim);
  /* An unknown handle (destroyed twice, or not ours) is ignored rather than freed. */
  if (graph_known_locked(sim, g)) {
    if (g->prev)
      g->prev->next = g->next;
    else
      sim->graphs = g->next;
    if (g->next)
      g->next->prev = g->prev;
    free(g->kinds);
    free(g->edges);
    free(g);
  }
  sim_unlock(sim);
}

static void sim_graph_exec_destroy(cachalot_backend *b, cl_graph_exec *e) {
  struct sim_backend *sim = sim_of(b);
  if (!e)
    return;
  sim_lock(sim);
  if (exec_known_locked(sim, e)) {
    if (e->prev)
      e->prev->next = e->next;
    else
      sim->execs = e->next;
    if (e->next)
      e->next->prev = e->prev;
    free(e);
  }
  sim_unlock(sim);
}

/* The DOT file: one line per node ("n3 [label=\"kernel\"];"), then one per edge ("n0 -> n3;"). */
static cachalot_status sim_graph_debug_dot(cachalot_backend *b, cl_graph *g, const char *path) {
  struct sim_backend *sim = sim_of(b);
  if (!path)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: path is NULL");
  sim_lock(sim);
  cachalot_status st = CACHALOT_OK;
  if (!g || !graph_known_locked(sim, g)) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: %p is not a live simulated graph",
                 (void *)g);
    goto out;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    int err = errno;
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: cannot open '%s' for writing: %s",
                 path, strerror(err));
    goto out;
  }
  fprintf(f, "digraph cachalot_sim_graph {\n");
  fprintf(f, "  label=\"capture %" PRIu64 ", %zu nodes\";\n", g->capture_id, g->n_nodes);
  for (size_t i = 0; i < g->n_nodes; i++)
    fprintf(f, "  n%zu [label=\"%s\"];\n", i, g->kinds[i] == SIM_NODE_MEMCPY ? "memcpy" : "kernel");
  for (size_t i = 0; i < g->n_edges; i++)
    fprintf(f, "  n%zu -> n%zu;\n", g->edges[i].from, g->edges[i].to);
  fprintf(f, "}\n");
  int werr = ferror(f) ? (errno ? errno : EIO) : 0;
  if (fclose(f) != 0 && !werr)
    werr = errno ? errno : EIO;
  if (werr)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated graph debug dot: writing '%s' failed: %s", path,
                 strerror(werr));
out:
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_memcpy_async(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                        cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated memcpy");
  if (st != CACHALOT_OK)
    return st;
  if (n > 0 && (!dst || !src))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated memcpy: %s is NULL for %zu bytes",
                   !dst ? "dst" : "src", n);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_locked(sim, device, s, &stream);
  /* Nothing is copied: the addresses are fake. A copy of 0 bytes is no work and no node, as in CUDA. */
  if (st == CACHALOT_OK && n > 0)
    st = enqueue_locked(sim, stream, SIM_NODE_MEMCPY, "simulated memcpy");
  sim_unlock(sim);
  return st;
}

/* Adds the dependencies of `s` to those of `waiter` (both in the same capture), without duplicates. */
static cachalot_status deps_union_locked(struct sim_stream *waiter, const struct sim_stream *s, const char *fn) {
  if (waiter == s)
    return CACHALOT_OK;
  if (!reserve_deps(waiter, waiter->n_deps + s->n_deps))
    return host_oom(fn);
  size_t n = waiter->n_deps;
  for (size_t i = 0; i < s->n_deps; i++) {
    bool have = false;
    for (size_t j = 0; j < n && !have; j++)
      have = waiter->deps[j] == s->deps[i];
    if (!have)
      waiter->deps[waiter->n_deps++] = s->deps[i];
  }
  return CACHALOT_OK;
}

/* See the comment at the top of the file and the ops table entry. During a capture this is CUDA's event
 * record on `s` + wait on `waiter`; outside one it only checks its arguments: the simulation does not make
 * the waiter's completion wait for `s` (the caller completes streams, and may complete `s` first). */
static cachalot_status sim_stream_wait(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  static const char fn[] = "simulated stream wait";
  cachalot_status st = sim_check_device(sim, device, fn);
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_stream *w = NULL, *src = NULL;
  if ((st = resolve_any_stream_locked(sim, device, waiter, &w)) != CACHALOT_OK ||
      (st = resolve_any_stream_locked(sim, device, s, &src)) != CACHALOT_OK)
    goto out;
  struct sim_capture *cs = src->capture, *cw = w->capture;
  if (cs && cs->invalidated) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s: recording on the waited stream: %s", fn, MSG_INVALIDATED);
  } else if (cw && cw->invalidated) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s: %s", fn, MSG_INVALIDATED);
  } else if (cs && !cw) {
    /* A fork: the waiter joins the capture of `s`, depending on what `s` depends on. */
    if (w == &sim->dev[w->device].default_stream) {
      st = cl_fail(CACHALOT_ERROR_DEVICE, "%s: the default stream cannot join capture %" PRIu64 ": %s", fn, cs->id,
                   MSG_UNSUPPORTED);
    } else if (cs->n_members + 1 > cs->cap_members) {
      struct sim_stream **q = grow_array(cs->members, &cs->cap_members, cs->n_members + 1, sizeof *q);
      if (q)
        cs->members = q;
      else
        st = host_oom(fn);
    }
    if (st == CACHALOT_OK && !reserve_deps(w, src->n_deps))
      st = host_oom(fn);
    if (st == CACHALOT_OK) {
      cs->members[cs->n_members++] = w;
      w->capture = cs;
      if (src->n_deps > 0)
        memcpy(w->deps, src->deps, src->n_deps * sizeof *w->deps);
      w->n_deps = src->n_deps;
    }
  } else if (cs && cw == cs) {
    /* A join (or a further fork) inside one capture. */
    st = deps_union_locked(w, src, fn);
  } else if (cs && cw) {
    /* cudaErrorStreamCaptureMerge, which invalidates both captures (seen on CUDA 13). */
    capture_invalidate_locked(cs);
    capture_invalidate_locked(cw);
    st = cl_fail(CACHALOT_ERROR_DEVICE,
                 "%s: operation would have resulted in a merge of two independent capture sequences (captures %" PRIu64
                 " and %" PRIu64 " are now invalidated)",
                 fn, cw->id, cs->id);
  } else if (cw) {
    /* cudaErrorStreamCaptureIsolation, which invalidates the capture (seen on CUDA 13). */
    capture_invalidate_locked(cw);
    st = cl_fail(CACHALOT_ERROR_DEVICE,
                 "%s: dependency created on uncaptured work in another stream (capture %" PRIu64
                 " is now invalidated)",
                 fn, cw->id);
  }
  /* else: neither captures; see the comment above. */
out:
  sim_unlock(sim);
  return st;
}

static cachalot_status stream_create_impl(struct sim_backend *sim, int device, cachalot_stream *out,
                                          const char *fn) {
  struct sim_stream *stream = calloc(1, sizeof *stream);
  if (!stream)
    return host_oom(fn);
  stream->key = stream;
  stream->device = device;
  bool oom = false;
  sim_lock(sim);
  HASH_ADD_PTR(sim->streams, key, stream);
  sim_unlock(sim);
  if (oom) {
    free(stream);
    return host_oom(fn);
  }
  *out = (cachalot_stream)(void *)stream;
  return CACHALOT_OK;
}

static cachalot_status sim_stream_create(cachalot_backend *b, int device, cachalot_stream *out) {
  struct sim_backend *sim = sim_of(b);
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated stream create: out is NULL");
  *out = NULL;
  cachalot_status st = sim_check_device(sim, device, "simulated stream create");
  if (st != CACHALOT_OK)
    return st;
  return stream_create_impl(sim, device, out, "simulated stream create");
}

/* The stream is only marked destroyed (see struct sim_stream): its events stay valid and keep completing
 * as the caller completes work. Destroying a capture's origin abandons the capture; a destroyed joined
 * stream stays in its capture, whose end then still needs the stream's nodes joined (as CUDA does). */
static void sim_stream_destroy(cachalot_backend *b, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  if (!s)
    return;
  sim_lock(sim);
  struct sim_stream *stream = find_stream_locked(sim, s);
  if (stream && !stream->destroyed) {
    stream->destroyed = true;
    if (stream->capture && stream->capture->origin == stream)
      capture_finish_locked(sim, stream->capture);
  }
  sim_unlock(sim);
}

static cachalot_status sim_stream_sync(cachalot_backend *b, int device, cachalot_stream s) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated stream sync");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = resolve_stream_locked(sim, device, s, &stream);
  if (st == CACHALOT_OK) {
    if (stream->capture) {
      /* cudaStreamSynchronize of a capturing stream is refused and invalidates it (seen on CUDA 13). */
      capture_invalidate_locked(stream->capture);
      st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated stream sync: %s (the capture is now invalidated)",
                   MSG_UNSUPPORTED);
    } else {
      stream->completed = stream->submitted;
    }
  }
  sim_unlock(sim);
  return st;
}

static void sim_destroy(cachalot_backend *b) {
  struct sim_backend *sim = sim_of(b);
  while (sim->captures)
    capture_finish_locked(sim, sim->captures);
  while (sim->graphs) {
    struct cl_graph *next = sim->graphs->next;
    free(sim->graphs->kinds);
    free(sim->graphs->edges);
    free(sim->graphs);
    sim->graphs = next;
  }
  while (sim->execs) {
    struct cl_graph_exec *next = sim->execs->next;
    free(sim->execs);
    sim->execs = next;
  }
  struct sim_stream *st, *stmp;
  HASH_ITER(hh, sim->streams, st, stmp) {
    HASH_DEL(sim->streams, st);
    free(st->deps);
    free(st);
  }
  struct sim_alloc *a, *atmp;
  HASH_ITER(hh, sim->allocs, a, atmp) {
    HASH_DEL(sim->allocs, a);
    free(a);
  }
  struct sim_range *r, *rtmp;
  HASH_ITER(hh, sim->reservations, r, rtmp) {
    HASH_DEL(sim->reservations, r);
    free(r);
  }
  HASH_ITER(hh, sim->mappings, r, rtmp) {
    HASH_DEL(sim->mappings, r);
    free(r);
  }
  while (sim->slabs) {
    struct sim_event_slab *next = sim->slabs->next;
    free(sim->slabs);
    sim->slabs = next;
  }
  pthread_mutex_destroy(&sim->mu);
  free(sim);
}

/* ---- virtual memory: reservations of address space and mappings inside them ---- */

#define SIM_GRANULARITY ((uint64_t)2 << 20)

static cachalot_status sim_va_granularity(cachalot_backend *b, int device, size_t *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_granularity: out is NULL");
  *out = 0;
  cachalot_status st = sim_check_device(sim_of(b), device, "simulated va_granularity");
  if (st == CACHALOT_OK)
    *out = (size_t)SIM_GRANULARITY;
  return st;
}

static bool granular(uint64_t x) { return (x & (SIM_GRANULARITY - 1)) == 0; }

/* Adds the range [addr, addr + size) of `device` to `table` (lock held). OUT_OF_MEMORY on host OOM. */
static cachalot_status add_range_locked(struct sim_range **table, uint64_t addr, size_t size, int device) {
  struct sim_range *r = calloc(1, sizeof *r);
  bool oom = !r;
  if (r) {
    *r = (struct sim_range){.addr = addr, .size = size, .device = device};
    HASH_ADD(hh, *table, addr, sizeof r->addr, r);
  }
  if (oom) {
    free(r);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
  }
  return CACHALOT_OK;
}

/* The range of `table` that is exactly [addr, addr + size) of `device`, or NULL (lock held). */
static struct sim_range *exact_range_locked(struct sim_range *table, uint64_t addr, size_t size, int device) {
  struct sim_range *r = NULL;
  HASH_FIND(hh, table, &addr, sizeof addr, r);
  return r && r->size == size && r->device == device ? r : NULL;
}

static cachalot_status sim_va_reserve(cachalot_backend *b, int device, size_t size, void **base) {
  struct sim_backend *sim = sim_of(b);
  if (!base)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_reserve: base is NULL");
  *base = NULL;
  if (size == 0 || !granular(size))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_reserve: %zu bytes is not a positive multiple of "
                   "the granularity", size);
  cachalot_status st = sim_check_device(sim, device, "simulated va_reserve");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_device *dev = &sim->dev[device];
  const uint64_t start = (dev->bump + SIM_GRANULARITY - 1) & ~(SIM_GRANULARITY - 1);
  const uint64_t addr = ((uint64_t)(device + 1) << SIM_RANGE_SHIFT) + start;
  if (start > SIM_RANGE || (uint64_t)size > SIM_RANGE - start) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated va_reserve: address space exhausted");
  } else if ((st = add_range_locked(&sim->reservations, addr, size, device)) == CACHALOT_OK) {
    dev->bump = start + size; /* addresses are never reused, reserved or allocated */
    *base = (void *)(uintptr_t)addr;
  }
  sim_unlock(sim);
  return st;
}

/* The mapping overlapping [addr, addr + size), if any (lock held). */
static struct sim_range *overlapping_mapping_locked(struct sim_backend *sim, uint64_t addr, size_t size) {
  struct sim_range *m, *tmp;
  HASH_ITER(hh, sim->mappings, m, tmp)
  if (m->addr < addr + size && addr < m->addr + m->size)
    return m;
  return NULL;
}

static cachalot_status sim_va_release(cachalot_backend *b, int device, void *base, size_t size) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated va_release");
  if (st != CACHALOT_OK)
    return st;
  const uint64_t key = (uint64_t)(uintptr_t)base;
  sim_lock(sim);
  struct sim_range *r = exact_range_locked(sim->reservations, key, size, device);
  if (!r)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_release: 0x%" PRIx64 " (%zu bytes) is not a "
                 "reservation of device %d", key, size, device);
  else if (overlapping_mapping_locked(sim, key, size))
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE, "simulated va_release: the reservation at 0x%" PRIx64
                 " still has mapped memory", key);
  else {
    HASH_DEL(sim->reservations, r);
    free(r);
  }
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_va_map(cachalot_backend *b, int device, void *addr, size_t size) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated va_map");
  if (st != CACHALOT_OK)
    return st;
  const uint64_t a = (uint64_t)(uintptr_t)addr;
  if (size == 0 || !granular(size) || !granular(a))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_map: 0x%" PRIx64 " (%zu bytes) is not aligned to "
                   "the granularity", a, size);
  sim_lock(sim);
  struct sim_range *r, *tmp, *in = NULL;
  HASH_ITER(hh, sim->reservations, r, tmp)
  if (r->device == device && r->addr <= a && a - r->addr <= r->size && size <= r->size - (a - r->addr))
    in = r;
  struct sim_device *dev = &sim->dev[device];
  if (!in)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_map: 0x%" PRIx64 " (%zu bytes) is not inside a "
                 "reservation of device %d", a, size, device);
  else if (overlapping_mapping_locked(sim, a, size))
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE, "simulated va_map: 0x%" PRIx64 " is mapped already", a);
  else if (inject_locked(sim))
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "injected device allocation failure (map)");
  else if (size > sim->capacity - dev->used)
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "simulated device %d out of memory: %zu bytes to map, %zu free",
                 device, size, sim->capacity - dev->used);
  else if ((st = add_range_locked(&sim->mappings, a, size, device)) == CACHALOT_OK)
    dev->used += size;
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_va_unmap(cachalot_backend *b, int device, void *addr, size_t size) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated va_unmap");
  if (st != CACHALOT_OK)
    return st;
  const uint64_t key = (uint64_t)(uintptr_t)addr;
  sim_lock(sim);
  struct sim_range *m = exact_range_locked(sim->mappings, key, size, device);
  if (!m) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_unmap: 0x%" PRIx64 " (%zu bytes) is not a mapping "
                 "of device %d", key, size, device);
  } else {
    sim->dev[device].used -= size;
    HASH_DEL(sim->mappings, m);
    free(m);
  }
  sim_unlock(sim);
  return st;
}

static cachalot_status sim_device_sync(cachalot_backend *b, int device) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated device sync");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  if (unsafe_call_prohibited_locked(sim))
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated device sync: operation not permitted when stream is capturing");
  else
    complete_device_locked(sim, device);
  sim_unlock(sim);
  return st;
}

static const cl_backend_ops sim_ops = {
    .name = "sim",
    .alloc = sim_alloc,
    .free = sim_free,
    .mem_info = sim_mem_info,
    .va_granularity = sim_va_granularity,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .va_map = sim_va_map,
    .va_unmap = sim_va_unmap,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .event_release = sim_event_release,
    .stream_check = sim_stream_check,
    .stream_capture_info = sim_stream_capture_info,
    .capture_mode_exchange = sim_capture_mode_exchange,
    .capture_begin = sim_capture_begin,
    .capture_end = sim_capture_end,
    .graph_instantiate = sim_graph_instantiate,
    .graph_launch = sim_graph_launch,
    .graph_destroy = sim_graph_destroy,
    .graph_exec_destroy = sim_graph_exec_destroy,
    .graph_debug_dot = sim_graph_debug_dot,
    .memcpy_async = sim_memcpy_async,
    .stream_wait = sim_stream_wait,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_sync = sim_stream_sync,
    .device_sync = sim_device_sync,
    .destroy = sim_destroy,
};

/* ---- public API ---- */

cachalot_status cachalot_backend_sim(const cachalot_sim_options *opt, cachalot_backend **out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_sim: out is NULL");
  *out = NULL;
  cachalot_sim_options o = {
      .device_count = 1, .capacity_bytes = SIM_DEFAULT_CAPACITY, .complete_immediately = false};
  if (opt)
    o = *opt;
  if (o.device_count < 1 || o.device_count > SIM_MAX_DEVICES)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_backend_sim: device_count must be 1..%d, got %d", SIM_MAX_DEVICES,
                   o.device_count);
  if (o.capacity_bytes == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_backend_sim: capacity_bytes must be > 0");

  struct sim_backend *sim = calloc(1, sizeof *sim);
  if (!sim)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_sim: host out of memory");
  if (pthread_mutex_init(&sim->mu, NULL) != 0) {
    free(sim);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_backend_sim: cannot create a mutex");
  }
  sim->base.ops = &sim_ops;
  sim->base.device_count = o.device_count;
  sim->capacity = o.capacity_bytes;
  sim->complete_immediately = o.complete_immediately;
  sim->next_capture_id = 1;
  for (int d = 0; d < o.device_count; d++)
    sim->dev[d].default_stream.device = d;
  *out = &sim->base;
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_stream_create(cachalot_backend *b, int device, cachalot_stream *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_stream_create: out is NULL");
  *out = NULL;
  cachalot_status st = sim_check(b, "cachalot_sim_stream_create");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  st = sim_check_device(sim, device, "cachalot_sim_stream_create");
  if (st != CACHALOT_OK)
    return st;
  return stream_create_impl(sim, device, out, "cachalot_sim_stream_create");
}

cachalot_status cachalot_sim_stream_complete(cachalot_backend *b, cachalot_stream s) {
  cachalot_status st = sim_check(b, "cachalot_sim_stream_complete");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  if (!s) {
    for (int d = 0; d < sim->base.device_count; d++)
      sim->dev[d].default_stream.completed = sim->dev[d].default_stream.submitted;
  } else {
    struct sim_stream *stream = find_stream_locked(sim, s);
    if (stream)
      stream->completed = stream->submitted;
    else
      st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_sim_stream_complete: unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_fail_device_allocs(cachalot_backend *b, int count) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_device_allocs");
  if (st != CACHALOT_OK)
    return st;
  if (count < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_device_allocs: count %d is negative",
                   count);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_allocs = count;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_fail_every(cachalot_backend *b, int k) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_every");
  if (st != CACHALOT_OK)
    return st;
  if (k < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_every: k %d is negative", k);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_every = k;
  sim->alloc_count = 0;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_fail_events(cachalot_backend *b, int count) {
  cachalot_status st = sim_check(b, "cachalot_sim_fail_events");
  if (st != CACHALOT_OK)
    return st;
  if (count < 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_fail_events: count %d is negative", count);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  sim->fail_events = count;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_device_used(cachalot_backend *b, int device, size_t *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_device_used: out is NULL");
  *out = 0;
  cachalot_status st = sim_check(b, "cachalot_sim_device_used");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  st = sim_check_device(sim, device, "cachalot_sim_device_used");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  *out = sim->dev[device].used;
  sim_unlock(sim);
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_capture_begin(cachalot_backend *b, cachalot_stream s,
                                           cachalot_capture_mode mode) {
  cachalot_status st = sim_check(b, "cachalot_sim_capture_begin");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  if (!valid_mode(mode))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_capture_begin: invalid capture mode %d",
                   (int)mode);
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = live_stream_locked(sim, s, &stream);
  if (st != CACHALOT_OK)
    cl_error_prefix("cachalot_sim_capture_begin: ");
  else
    st = capture_begin_locked(sim, stream, mode, "cachalot_sim_capture_begin");
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_capture_end(cachalot_backend *b, cachalot_stream s) {
  cachalot_status st = sim_check(b, "cachalot_sim_capture_end");
  if (st != CACHALOT_OK)
    return st;
  if (!s)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "CUDA graphs must be captured on a non-default stream");
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = live_stream_locked(sim, s, &stream);
  if (st != CACHALOT_OK)
    cl_error_prefix("cachalot_sim_capture_end: ");
  else
    st = capture_end_locked(sim, stream, "cachalot_sim_capture_end", NULL, NULL);
  sim_unlock(sim);
  return st;
}

/* The stream a public control names: NULL is device 0's default stream; a destroyed stream is still
 * named (its work can still be inspected). */
static cachalot_status public_stream_locked(struct sim_backend *sim, cachalot_stream s, const char *fn,
                                            struct sim_stream **out) {
  *out = s ? find_stream_locked(sim, s) : &sim->dev[0].default_stream;
  if (!*out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: unknown simulated stream 0x%" PRIxPTR, fn, handle_bits(s));
  return CACHALOT_OK;
}

cachalot_status cachalot_sim_launch(cachalot_backend *b, cachalot_stream s) {
  cachalot_status st = sim_check(b, "cachalot_sim_launch");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = public_stream_locked(sim, s, "cachalot_sim_launch", &stream);
  if (st == CACHALOT_OK && stream->destroyed)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_launch: simulated stream 0x%" PRIxPTR " was destroyed",
                 handle_bits(s));
  if (st == CACHALOT_OK)
    st = enqueue_locked(sim, stream, SIM_NODE_KERNEL, "cachalot_sim_launch");
  sim_unlock(sim);
  return st;
}

cachalot_status cachalot_sim_stream_submitted(cachalot_backend *b, cachalot_stream s, uint64_t *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_sim_stream_submitted: out is NULL");
  *out = 0;
  cachalot_status st = sim_check(b, "cachalot_sim_stream_submitted");
  if (st != CACHALOT_OK)
    return st;
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_stream *stream = NULL;
  st = public_stream_locked(sim, s, "cachalot_sim_stream_submitted", &stream);
  if (st == CACHALOT_OK)
    *out = stream->submitted;
  sim_unlock(sim);
  return st;
}
