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
 *   capture_invalidate_held's callers) do so here too; ending an invalidated capture fails with no
 *   graph. A replay enqueues the graph's nodes as work on the stream, one number each.
 * - Pinned host memory: real host memory (malloc), counted by kind; freeing a host_alloc allocation
 *   completes every device's work, as cudaFreeHost synchronizes.
 * - Fault injection: the next N device allocations fail, every k-th fails, the next N event records fail,
 *   the next N host pinnings fail.
 *
 * One mutex guards the whole backend; nothing here is on the allocator's warm path except event record,
 * query and release, which take it briefly and never touch the host heap once the event pool is warm.
 *
 * This header is private to backend/sim/: the state every file of it works on, the small helpers they
 * share (static inline, so that the warm path's lock and stream lookups cost no call across files), and
 * the functions one file defines for the others.
 */
#ifndef CACHALOT_BACKEND_SIM_H
#define CACHALOT_BACKEND_SIM_H

#include "../ops.h"

#include "../../../common/error.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* uthash's default reaction to a failed host allocation is exit(); with HASH_NONFATAL_OOM it instead
 * leaves the element out and calls this, which sets the `oom` flag every adding function declares, so
 * the failure comes back to the caller as a status. */
#ifndef HASH_NONFATAL_OOM
#define HASH_NONFATAL_OOM 1
#elif !HASH_NONFATAL_OOM
#error "backend/sim/ needs uthash built with HASH_NONFATAL_OOM=1"
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
 * Invariant: completed <= submitted; an event with seq <= completed is done, once the stream is settled:
 * a device synchronization (a device free, cudaFreeHost) completes every stream of the device by raising
 * the device's sync_epoch, which costs nothing per stream (5,000 streams made each device free walk them
 * all); a stream whose sync_epoch lags has had everything it submitted completed since, and
 * sim_stream_settle says so before its `submitted` is raised or its `completed` read (setting `completed` to
 * `submitted` needs no settling: settling does no more).
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
  uint64_t sync_epoch; /* its device's sync_epoch when it was last settled */
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
/* A watched event (completion_watch): where and how far its stream must complete. */
struct sim_watch {
  struct sim_stream *stream;
  uint64_t seq;
};

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

/* Pinned host memory: real host memory (tests read and write it), keyed by its address; `registered`
 * for a range host_register page-locked, else a host_alloc allocation the backend owns. */
struct sim_host {
  void *ptr;
  size_t size;
  bool registered;
  UT_hash_handle hh;
};

/* Invariant: used == the sum of the sizes of the device's live allocations and mappings, and used <=
 * capacity;
 * bump is a multiple of SIM_ALIGN, at most SIM_RANGE, and above every live allocation's end offset. */
struct sim_device {
  size_t used;
  uint64_t bump;
  struct sim_stream default_stream;
  uint64_t sync_epoch; /* device synchronizations so far (see sim_stream) */
};

/* Everything below `mu` is guarded by it; functions named _held run with it held.
 * Invariant: global_captures / strict_captures count the captures underway whose mode is GLOBAL /
 * not RELAXED; they let an allocation skip the scan for captures of its own thread in the common case. */
struct sim_backend {
  struct cachalot_backend base;
  size_t capacity;
  bool complete_immediately;
  pthread_mutex_t mu;
  /* The completion word of every device (ops.h): raised, under mu, when a watched event completes and by
   * every device synchronization */
  uint32_t completions;
  bool no_word; /* cachalot_sim_completion_word(b, false): completion_word answers NULL */
  struct sim_watch *watches; /* the watched events not completed yet */
  size_t n_watches, cap_watches;

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
  int fail_host;        /* injected failures left for the next host pinnings (alloc or register) */

  struct sim_host *host;           /* live pinned host ranges */
  size_t host_allocated;           /* bytes of live host_alloc allocations */
  size_t host_registered;          /* bytes of live host_register ranges */

  uint64_t next_capture_id;
  int global_captures;
  int strict_captures;
};

/* ---- shared helpers ---- */

static inline struct sim_backend *sim_of(cachalot_backend *b) { return (struct sim_backend *)b; }

static inline void sim_lock(struct sim_backend *sim) { pthread_mutex_lock(&sim->mu); }
static inline void sim_unlock(struct sim_backend *sim) { pthread_mutex_unlock(&sim->mu); }

static inline uintptr_t handle_bits(cachalot_stream s) { return (uintptr_t)(void *)s; }

static inline cachalot_status sim_check_device(const struct sim_backend *sim, int device, const char *fn) {
  if (device < 0 || device >= sim->base.device_count)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: device %d out of range (the backend has %d)", fn,
                   device, sim->base.device_count);
  return CACHALOT_OK;
}

/* The completion word moves. */
static inline void sim_raise_held(struct sim_backend *sim) {
  __atomic_fetch_add(&sim->completions, 1, __ATOMIC_RELEASE);
}

/* Work of `st` completed: the word moves if that completed a watched event, as the GPU's write after it
 * would. Only then: a core that forgot to watch an event would wait in the tests as it would on a GPU. */
static inline void sim_completed_held(struct sim_backend *sim, struct sim_stream *st) {
  bool raise = false;
  for (size_t i = 0; i < sim->n_watches;) {
    if (sim->watches[i].stream == st && st->completed >= sim->watches[i].seq) {
      sim->watches[i] = sim->watches[--sim->n_watches];
      raise = true;
    } else {
      i++;
    }
  }
  if (raise)
    sim_raise_held(sim);
}

/* Completes what the stream submitted before its device's latest synchronization (see sim_stream). */
static inline void sim_stream_settle(struct sim_backend *sim, struct sim_stream *st) {
  const uint64_t epoch = sim->dev[st->device].sync_epoch;
  if (st->sync_epoch != epoch) {
    st->completed = st->submitted;
    st->sync_epoch = epoch;
  }
}

/* Submits `n` items of work on `st` (outside a capture), settled first; with complete_immediately they are
 * done at once. The number of the last one. */
static inline uint64_t sim_submit_held(struct sim_backend *sim, struct sim_stream *st, uint64_t n) {
  sim_stream_settle(sim, st);
  st->submitted += n;
  if (sim->complete_immediately) {
    st->completed = st->submitted;
    sim_completed_held(sim, st);
  }
  return st->submitted;
}

/* Every stream of `device` completes (what cudaFree's implicit synchronization does). */
static inline void sim_complete_device_held(struct sim_backend *sim, int device) {
  struct sim_stream *def = &sim->dev[device].default_stream;
  def->completed = def->submitted;
  sim->dev[device].sync_epoch++;
  for (size_t i = 0; i < sim->n_watches;) /* every watched event of the device is done */
    if (sim->watches[i].stream->device == device)
      sim->watches[i] = sim->watches[--sim->n_watches];
    else
      i++;
  sim_raise_held(sim);
}

static inline struct sim_stream *find_stream_held(struct sim_backend *sim, cachalot_stream s) {
  const void *key = (const void *)s;
  struct sim_stream *st = NULL;
  HASH_FIND_PTR(sim->streams, &key, st);
  return st;
}

/* A non-NULL handle that must name a stream of this backend (of any device) that is not destroyed. */
static inline cachalot_status live_stream_held(struct sim_backend *sim, cachalot_stream s, struct sim_stream **out) {
  struct sim_stream *st = find_stream_held(sim, s);
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
static inline cachalot_status resolve_stream_held(struct sim_backend *sim, int device, cachalot_stream s,
                                                    struct sim_stream **out) {
  *out = NULL;
  if (!s) {
    *out = &sim->dev[device].default_stream;
    return CACHALOT_OK;
  }
  struct sim_stream *st = NULL;
  cachalot_status rc = live_stream_held(sim, s, &st);
  if (rc != CACHALOT_OK)
    return rc;
  if (st->device != device)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "simulated stream 0x%" PRIxPTR " belongs to device %d, not device %d", handle_bits(s),
                   st->device, device);
  *out = st;
  return CACHALOT_OK;
}

/* Like resolve_stream_held, but a non-NULL stream may belong to any device (a cross-device wait or
 * event record is legal in CUDA); NULL is `device`'s default stream. */
static inline cachalot_status resolve_any_stream_held(struct sim_backend *sim, int device, cachalot_stream s,
                                                        struct sim_stream **out) {
  if (!s) {
    *out = &sim->dev[device].default_stream;
    return CACHALOT_OK;
  }
  return live_stream_held(sim, s, out);
}

/* The opening of a call on stream `s` of `device`: the device checked for `fn`, the backend locked, the
 * stream resolved (of any device where `any_device`: CUDA's handles are global). CACHALOT_OK with the lock
 * held; else the status, with nothing held. */
static inline cachalot_status sim_enter_stream(struct sim_backend *sim, int device, cachalot_stream s, bool any_device,
                                               const char *fn, struct sim_stream **out) {
  *out = NULL;
  cachalot_status st = sim_check_device(sim, device, fn);
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  st = any_device ? resolve_any_stream_held(sim, device, s, out) : resolve_stream_held(sim, device, s, out);
  if (st != CACHALOT_OK)
    sim_unlock(sim);
  return st;
}

/* CUDA's messages for the capture errors the simulation reproduces. */
static const char MSG_UNSUPPORTED[] = "operation not permitted when stream is capturing";
static const char MSG_INVALIDATED[] = "operation failed due to a previous error during capture";

/* A misuse during a capture breaks it, as in CUDA: it stays underway (and keeps prohibiting unsafe calls)
 * until its origin stream ends it, which then fails with no graph. */
static inline void capture_invalidate_held(struct sim_capture *c) { c->invalidated = true; }

static inline bool valid_mode(cachalot_capture_mode m) {
  return m == CACHALOT_CAPTURE_GLOBAL || m == CACHALOT_CAPTURE_THREAD_LOCAL || m == CACHALOT_CAPTURE_RELAXED;
}

static inline cachalot_status host_oom(const char *fn) {
  return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "%s: host out of memory", fn);
}

/* ---- what one file defines for the others ---- */

/* state.c: whether `b` is a simulated backend, so that the cachalot_sim_* controls apply. */
bool cl_backend_is_sim(const cachalot_backend *b);

/* device.c: whether this device allocation (or map) is to fail by fault injection; counts it. */
bool cl_sim_inject_held(struct sim_backend *sim);
cachalot_status cl_sim_alloc(cachalot_backend *b, int device, size_t size, void **ptr);
cachalot_status cl_sim_free(cachalot_backend *b, int device, void *ptr);
cachalot_status cl_sim_mem_info(cachalot_backend *b, int device, size_t *free_bytes, size_t *total_bytes);
cachalot_status cl_sim_device_sync(cachalot_backend *b, int device);
cachalot_status cl_sim_event_record(cachalot_backend *b, int device, cachalot_stream s, cl_event **out);
cachalot_status cl_sim_event_query(cachalot_backend *b, cl_event *e, bool *done);
cachalot_status cl_sim_event_sync(cachalot_backend *b, cl_event *e);
void cl_sim_event_release(cachalot_backend *b, cl_event *e);
const uint32_t *cl_sim_completion_word(cachalot_backend *b, int device);
void cl_sim_completion_watch(cachalot_backend *b, int device, cl_event *e);

/* streams.c */
cachalot_status cl_sim_stream_create_impl(struct sim_backend *sim, int device, cachalot_stream *out,
                                          const char *fn);
cachalot_status cl_sim_stream_check(cachalot_backend *b, cachalot_stream s);
cachalot_status cl_sim_stream_create(cachalot_backend *b, int device, cachalot_stream *out);
void cl_sim_stream_destroy(cachalot_backend *b, cachalot_stream s);
cachalot_status cl_sim_stream_sync(cachalot_backend *b, int device, cachalot_stream s);
cachalot_status cl_sim_memcpy_async(cachalot_backend *b, int device, void *dst, const void *src, size_t n,
                                    cachalot_stream s);

/* capture.c */
bool cl_sim_unsafe_call_prohibited_held(struct sim_backend *sim);
void cl_sim_capture_finish_held(struct sim_backend *sim, struct sim_capture *c);
cachalot_status cl_sim_capture_begin_held(struct sim_backend *sim, struct sim_stream *stream,
                                            cachalot_capture_mode mode, const char *fn);
cachalot_status cl_sim_capture_end_held(struct sim_backend *sim, struct sim_stream *stream, const char *fn,
                                          struct cl_graph **graph, size_t *n_nodes);
cachalot_status cl_sim_enqueue_held(struct sim_backend *sim, struct sim_stream *st, enum sim_node_kind kind,
                                      const char *fn);
cachalot_status cl_sim_capture_frontier(cachalot_backend *b, int device, cachalot_stream s, uint64_t *capture_id,
                                        uintptr_t *nodes, size_t cap, size_t *n);
cachalot_status cl_sim_capture_reaches(cachalot_backend *b, int device, cachalot_stream s, const uintptr_t *from,
                                       size_t n_from, const uintptr_t *to, size_t n_to, bool *all);
cachalot_status cl_sim_stream_capture_info(cachalot_backend *b, int device, cachalot_stream s, bool *capturing,
                                           uint64_t *capture_id);
cachalot_status cl_sim_capture_mode_exchange(cachalot_backend *b, cachalot_capture_mode *mode);
cachalot_status cl_sim_capture_begin(cachalot_backend *b, int device, cachalot_stream s,
                                     cachalot_capture_mode mode);
cachalot_status cl_sim_capture_end(cachalot_backend *b, int device, cachalot_stream s, cl_graph **graph,
                                   size_t *n_nodes);
cachalot_status cl_sim_stream_wait(cachalot_backend *b, int device, cachalot_stream waiter, cachalot_stream s);

/* graph.c */
cachalot_status cl_sim_graph_instantiate(cachalot_backend *b, int device, cl_graph *g, cl_graph_exec **exec);
cachalot_status cl_sim_graph_launch(cachalot_backend *b, int device, cl_graph_exec *e, cachalot_stream s);
void cl_sim_graph_destroy(cachalot_backend *b, cl_graph *g);
void cl_sim_graph_exec_destroy(cachalot_backend *b, cl_graph_exec *e);
cachalot_status cl_sim_graph_debug_dot(cachalot_backend *b, cl_graph *g, const char *path);
cachalot_status cl_sim_ipc_handle(cachalot_backend *b, int device, void *base, unsigned char handle[64]);

/* host.c */
cachalot_status cl_sim_host_alloc(cachalot_backend *b, size_t size, void **ptr);
cachalot_status cl_sim_host_free(cachalot_backend *b, void *ptr);
cachalot_status cl_sim_host_register(cachalot_backend *b, void *ptr, size_t size);
cachalot_status cl_sim_host_unregister(cachalot_backend *b, void *ptr);
void cl_sim_host_destroy_held(struct sim_backend *sim);

/* vmm.c */
cachalot_status cl_sim_va_granularity(cachalot_backend *b, int device, size_t *out);
cachalot_status cl_sim_va_reserve(cachalot_backend *b, int device, size_t size, void **base);
cachalot_status cl_sim_va_release(cachalot_backend *b, int device, void *base, size_t size);
cachalot_status cl_sim_va_map(cachalot_backend *b, int device, void *addr, size_t size);
cachalot_status cl_sim_va_unmap(cachalot_backend *b, int device, void *addr, size_t size);

#endif
