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
 *   thread only in the latter case; a RELAXED thread never.
 * - Fault injection: the next N device allocations fail, every k-th fails, the next N event records fail.
 *
 * One mutex guards the whole backend; nothing here is on the allocator's warm path except event record,
 * query and release, which take it briefly and never touch the host heap once the event pool is warm.
 */
#include "backend.h"

#include "../../common/error.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>

/* Whether `b` is a simulated backend, so that the cachalot_sim_* controls and sim-only paths apply.
 * Declared here until the prototype moves to backend.h. */
bool cl_backend_is_sim(const cachalot_backend *b);

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

/* A simulated stream. Its work is numbered 1, 2, ...: each event recorded outside a capture submits
 * the next number.
 * Invariant: completed <= submitted; an event with seq <= completed is done.
 * capture_id != 0 exactly when capturing; capture_mode and capture_thread mean something only then.
 * Created streams live in sim_backend.streams, keyed by their handle (`key`, the struct's own address),
 * until the backend is destroyed; each device's default stream (the NULL handle) is embedded in
 * sim_device and is never in the hash, so no caller-supplied handle can name it, and it never captures. */
struct sim_stream {
  const void *key;
  int device;
  uint64_t submitted;
  uint64_t completed;
  uint64_t capture_id;
  cachalot_capture_mode capture_mode;
  pthread_t capture_thread;
  UT_hash_handle hh;
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

/* Invariant: used == the sum of the sizes of the device's live allocations, and used <= capacity;
 * bump is a multiple of SIM_ALIGN, at most SIM_RANGE, and above every live allocation's end offset. */
struct sim_device {
  size_t used;
  uint64_t bump;
  struct sim_stream default_stream;
};

/* Everything below `mu` is guarded by it.
 * Invariant: global_captures / strict_captures count the capturing streams whose mode is GLOBAL /
 * not RELAXED; they let an allocation skip the scan for captures of its own thread in the common case. */
struct sim_backend {
  struct cachalot_backend base;
  size_t capacity;
  bool complete_immediately;
  pthread_mutex_t mu;

  struct sim_device dev[SIM_MAX_DEVICES];
  struct sim_stream *streams;
  struct sim_alloc *allocs;
  struct sim_event *free_events;
  struct sim_event_slab *slabs;

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

bool cl_backend_is_sim(const cachalot_backend *b) { return b && b->ops == &sim_ops; }

static struct sim_backend *sim_of(cachalot_backend *b) { return (struct sim_backend *)b; }

static void sim_lock(struct sim_backend *sim) { pthread_mutex_lock(&sim->mu); }
static void sim_unlock(struct sim_backend *sim) { pthread_mutex_unlock(&sim->mu); }

static uintptr_t handle_bits(cachalot_stream s) { return (uintptr_t)(void *)s; }

/* The public controls accept any backend handle; anything but a simulated one is the caller's mistake. */
static cachalot_status sim_check(cachalot_backend *b, const char *fn) {
  if (!b)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: backend is NULL", fn);
  if (!cl_backend_is_sim(b))
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

/* Resolves a handle used with `device`: NULL is that device's default stream; anything else must be a
 * stream created on this backend for the same device. */
static cachalot_status resolve_stream_locked(struct sim_backend *sim, int device, cachalot_stream s,
                                             struct sim_stream **out) {
  *out = NULL;
  if (!s) {
    *out = &sim->dev[device].default_stream;
    return CACHALOT_OK;
  }
  struct sim_stream *st = find_stream_locked(sim, s);
  if (!st)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
  if (st->device != device)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "simulated stream 0x%" PRIxPTR " belongs to device %d, not device %d", handle_bits(s),
                   st->device, device);
  *out = st;
  return CACHALOT_OK;
}

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
  struct sim_stream *st, *tmp;
  HASH_ITER(hh, sim->streams, st, tmp) {
    if (st->capture_id != 0 && st->capture_mode != CACHALOT_CAPTURE_RELAXED &&
        pthread_equal(st->capture_thread, self))
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
  bool inject = false;
  if (sim->fail_every > 0 && ++sim->alloc_count % (uint64_t)sim->fail_every == 0)
    inject = true;
  if (sim->fail_allocs > 0) {
    sim->fail_allocs--;
    inject = true;
  }
  if (inject) {
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
  bool known = find_stream_locked(sim, s) != NULL;
  sim_unlock(sim);
  return known ? CACHALOT_OK
               : cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
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
  struct sim_stream *stream = s ? find_stream_locked(sim, s) : &sim->dev[device].default_stream;
  if (!stream) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
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
  ev->captured = stream->capture_id != 0;
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
  st = resolve_stream_locked(sim, device, s, &stream);
  if (st == CACHALOT_OK) {
    *capturing = stream->capture_id != 0;
    *capture_id = stream->capture_id;
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

static void sim_destroy(cachalot_backend *b) {
  struct sim_backend *sim = sim_of(b);
  struct sim_stream *st, *stmp;
  HASH_ITER(hh, sim->streams, st, stmp) {
    HASH_DEL(sim->streams, st);
    free(st);
  }
  struct sim_alloc *a, *atmp;
  HASH_ITER(hh, sim->allocs, a, atmp) {
    HASH_DEL(sim->allocs, a);
    free(a);
  }
  while (sim->slabs) {
    struct sim_event_slab *next = sim->slabs->next;
    free(sim->slabs);
    sim->slabs = next;
  }
  pthread_mutex_destroy(&sim->mu);
  free(sim);
}

static const cl_backend_ops sim_ops = {
    .name = "sim",
    .alloc = sim_alloc,
    .free = sim_free,
    .mem_info = sim_mem_info,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .event_release = sim_event_release,
    .stream_check = sim_stream_check,
    .stream_capture_info = sim_stream_capture_info,
    .capture_mode_exchange = sim_capture_mode_exchange,
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

  struct sim_stream *stream = calloc(1, sizeof *stream);
  if (!stream)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_sim_stream_create: host out of memory");
  stream->key = stream;
  stream->device = device;
  bool oom = false;
  sim_lock(sim);
  HASH_ADD_PTR(sim->streams, key, stream);
  sim_unlock(sim);
  if (oom) {
    free(stream);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_sim_stream_create: host out of memory");
  }
  *out = (cachalot_stream)(void *)stream;
  return CACHALOT_OK;
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
  struct sim_stream *stream = find_stream_locked(sim, s);
  if (!stream) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                 "cachalot_sim_capture_begin: unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
  } else if (stream->capture_id != 0) {
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "cachalot_sim_capture_begin: stream 0x%" PRIxPTR " is already capturing (capture %" PRIu64 ")",
                 handle_bits(s), stream->capture_id);
  } else {
    stream->capture_id = sim->next_capture_id++;
    stream->capture_mode = mode;
    stream->capture_thread = pthread_self();
    if (mode == CACHALOT_CAPTURE_GLOBAL)
      sim->global_captures++;
    if (mode != CACHALOT_CAPTURE_RELAXED)
      sim->strict_captures++;
  }
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
  struct sim_stream *stream = find_stream_locked(sim, s);
  if (!stream) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                 "cachalot_sim_capture_end: unknown simulated stream 0x%" PRIxPTR, handle_bits(s));
  } else if (stream->capture_id == 0) {
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "cachalot_sim_capture_end: stream 0x%" PRIxPTR " is not capturing", handle_bits(s));
  } else if (stream->capture_mode != CACHALOT_CAPTURE_RELAXED &&
             !pthread_equal(stream->capture_thread, pthread_self())) {
    /* cudaStreamEndCapture's cudaErrorStreamCaptureWrongThread. */
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE,
                 "cachalot_sim_capture_end: capture %" PRIu64 " must be ended by the thread that began it",
                 stream->capture_id);
  } else {
    if (stream->capture_mode == CACHALOT_CAPTURE_GLOBAL)
      sim->global_captures--;
    if (stream->capture_mode != CACHALOT_CAPTURE_RELAXED)
      sim->strict_captures--;
    stream->capture_id = 0;
  }
  sim_unlock(sim);
  return st;
}
