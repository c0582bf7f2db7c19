/* libFuzzer target: sequences of API calls on the simulated device, read from the input bytes. The first
 * byte picks a config; then each op byte picks a call and the next bytes its arguments: malloc (sizes
 * from 1 B to 256 MiB, on one of three streams), free, record_stream, stream completion, kernel launches,
 * empty_cache, private-pool routing during a simulated capture (begin/end, release), injected device
 * allocation and event failures, settings changed at run time, frees of pointers cachalot does not own,
 * stats and snapshots; and what bindings use: history on and off, malloc and free with contexts (counted
 * references), snapshots as C structures, empty_cache of one released pool. Op 15, after the observers,
 * reads a chain of calls of the pinned-host cache (include/cachalot/host.h) that a 0 byte ends: malloc
 * (0 B, 1 B to 16 MiB, and sizes no host can pin), free, frees of pointers it does not hold (inner,
 * freed, device blocks; and a host block to the device allocator), record_event on valid and invalid
 * devices and streams, empty_cache, stats and their resets, injected pinning failures, the two pinning
 * keys changed at run time, stream completion, and a block used by a copy on a stream. After every call:
 *   - the status is one the call may return, with a message when it is not OK;
 *   - cachalot_check passes (structure and every stat recomputed from the blocks);
 *   - reserved_bytes equals what the simulated device says it holds (nothing lost, nothing counted twice);
 *   - no context was released more often than it was retained;
 *   - the host cache's pinned bytes are what the simulated backend holds pinned, its active blocks are the
 *     ones the program holds, each still carrying its own tags (no block handed out twice).
 * At the end everything is freed and empty_cache must give the device all of its memory back, and the
 * host all of its pinned memory (unless a block was freed while a marked stream was captured: a graph may
 * read it, so it is kept until destroy); with history off every context reference is given
 * back, and destroy leaves none. */
#include <cachalot/cachalot.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, ...)                                                                                     \
  do {                                                                                                         \
    if (!(cond)) {                                                                                             \
      fprintf(stderr, "fuzz_api: op %zu: ", op_index);                                                         \
      fprintf(stderr, __VA_ARGS__);                                                                            \
      fprintf(stderr, " (last error: %s)\n", cachalot_last_error());                                           \
      abort();                                                                                                 \
    }                                                                                                          \
  } while (0)

enum { SLOTS = 32, STREAMS = 3, MAX_OPS = 200, LOOP_LAPS = 12, LOOP_MAX_OPS = 1200 };

static const char *const confs[] = {
    "",
    "expandable_segments:True",
    "expandable_segments:True,expandable_compact:True",
    "preset:low_fragmentation",
    "max_split_size_mb:20,roundup_power2_divisions:4",
    "garbage_collection_threshold:0.5,per_process_memory_fraction:0.8",
    ("expandable_segments:True,max_split_size_mb:20,garbage_collection_threshold:0.6,"
     "per_process_memory_fraction:0.9"),
    "release_lock_on_cudamalloc:False,roundup_power2_divisions:[1:4,>:2]",
    "expandable_segments:True,release_lock_on_cudamalloc:False",
    "detect_captures:True",
};

typedef struct {
  const uint8_t *p, *end;
} input;

static unsigned next(input *in) { return in->p < in->end ? *in->p++ : 0; }

static size_t op_index;

/* Contexts: CTXS counters; a context is a pointer to one, its value the references cachalot holds. */
enum { CTXS = 4 };
static long ctx_refs[CTXS];
static void ctx_retain(void *c) { ++*(long *)c; }
static void ctx_release(void *c) {
  if (--*(long *)c < 0)
    abort(); /* released more often than retained */
}
static long ctx_total(void) {
  long t = 0;
  for (int i = 0; i < CTXS; i++)
    t += ctx_refs[i];
  return t;
}
static cachalot_stream capture_stream;

static bool is_capture_stream(cachalot_stream s, void *ctx) {
  (void)ctx;
  return s == capture_stream;
}


/* A status a call may return, with a message when it is not OK. */
static void expect_status(cachalot_status rc, const char *call, cachalot_status also1, cachalot_status also2) {
  REQUIRE(rc == CACHALOT_OK || rc == also1 || rc == also2, "%s returned %s", call, cachalot_status_name(rc));
  REQUIRE(rc == CACHALOT_OK || cachalot_last_error()[0], "%s failed without a message", call);
}

static void host_consistent(cachalot_allocator *a, cachalot_backend *b);

static void consistent(cachalot_allocator *a, cachalot_backend *b) {
  REQUIRE(cachalot_check(a) == CACHALOT_OK, "cachalot_check");
  host_consistent(a, b);
  for (int dev = 0; dev < 2; dev++) {
    cachalot_device_stats st;
    size_t used = 0;
    REQUIRE(cachalot_memory_stats(a, dev, &st) == CACHALOT_OK, "memory_stats");
    REQUIRE(cachalot_sim_device_used(b, dev, &used) == CACHALOT_OK, "device used");
    REQUIRE((int64_t)used == st.reserved_bytes[0].current, "device %d holds %zu, reserved_bytes says %lld", dev,
            used, (long long)st.reserved_bytes[0].current);
  }
}

static size_t request_size(input *in) {
  const unsigned shift = next(in) % 29; /* up to 256 MiB */
  const size_t base = (size_t)1 << shift;
  return base + (((size_t)next(in) << 8 | next(in)) % base);
}

/* Sizes that only fail (above any host's memory, or no power of two) reach the simulated backend's
 * malloc: under AddressSanitizer that must return NULL, as the C library's does, rather than end the run. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* The pinned-host blocks the program holds: each carries its slot's tag in its first and last byte. */
enum { HSLOTS = 16 };
static struct {
  unsigned char *p[HSLOTS];
  size_t n[HSLOTS];
  bool marked_capture[HSLOTS]; /* record_event named the stream that captures */
  unsigned char *freed;        /* the last block freed, for frees of a freed pointer */
  bool stuck;                  /* a block's event was recorded into a capture: it may stay cached */
  bool accumulated_reset;      /* the stats' allocated and freed start again from 0 */
} host;

static unsigned char host_tag(unsigned k) { return (unsigned char)(0xa0 + k); }

static size_t pow2_up(size_t n) {
  size_t r = 1;
  while (r < n)
    r <<= 1;
  return r;
}

static void host_consistent(cachalot_allocator *a, cachalot_backend *b) {
  cachalot_host_stats st;
  size_t by_alloc = 0, by_register = 0;
  REQUIRE(cachalot_host_memory_stats(a, &st) == CACHALOT_OK, "host_memory_stats");
  REQUIRE(cachalot_sim_host_pinned(b, &by_alloc, &by_register) == CACHALOT_OK, "host pinned");
  REQUIRE((int64_t)(by_alloc + by_register) == st.allocated_bytes.current,
          "the backend holds %zu + %zu bytes pinned, the host cache says %lld", by_alloc, by_register,
          (long long)st.allocated_bytes.current);
  int64_t live = 0, live_bytes = 0;
  for (unsigned k = 0; k < HSLOTS; k++) {
    if (!host.p[k])
      continue;
    live++;
    live_bytes += (int64_t)pow2_up(host.n[k]);
    REQUIRE(host.p[k][0] == host_tag(k) && host.p[k][host.n[k] - 1] == host_tag(k),
            "host slot %u's block was written by another holder", k);
    for (unsigned j = 0; j < k; j++)
      REQUIRE(host.p[j] != host.p[k], "host slots %u and %u hold the same block", j, k);
  }
  REQUIRE(st.active_requests.current == live && st.active_bytes.current == live_bytes,
          "the host cache has %lld blocks active (%lld bytes), the program holds %lld (%lld)",
          (long long)st.active_requests.current, (long long)st.active_bytes.current, (long long)live,
          (long long)live_bytes);
  REQUIRE(st.allocations.current >= live, "fewer host blocks than active ones");
  const cachalot_stat *s4[] = {&st.allocations, &st.allocated_bytes, &st.active_requests, &st.active_bytes};
  for (int i = 0; i < 4; i++) {
    REQUIRE(s4[i]->peak >= s4[i]->current, "host stat %d: peak below current", i);
    REQUIRE(host.accumulated_reset || s4[i]->allocated - s4[i]->freed == s4[i]->current,
            "host stat %d: allocated - freed != current", i);
  }
  REQUIRE(host.accumulated_reset || st.num_host_alloc - st.num_host_free == st.allocations.current,
          "%lld pinnings and %lld unpinnings for %lld blocks", (long long)st.num_host_alloc,
          (long long)st.num_host_free, (long long)st.allocations.current);
}

/* 0 B, 1 B to 16 MiB, or a size no host can pin (powers of two to 2^63, beyond, SIZE_MAX) */
static size_t host_size(input *in, bool *huge) {
  const unsigned k = next(in) % 32;
  *huge = k == 31;
  if (k == 0)
    return 0;
  if (k == 31) {
    const unsigned h = next(in);
    return h % 3 == 0 ? SIZE_MAX : h % 3 == 1 ? ((size_t)1 << 63) + 1 + h : (size_t)1 << (41 + h % 23);
  }
  const unsigned shift = next(in) % 24;
  const size_t base = (size_t)1 << shift;
  return base + (((size_t)next(in) << 8 | next(in)) % base);
}

static void host_malloc_into(cachalot_allocator *a, unsigned k, size_t n, bool huge) {
  void *p = (void *)(uintptr_t)0x1;
  const cachalot_status rc = cachalot_host_malloc(a, n, &p);
  expect_status(rc, "host_malloc", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
  REQUIRE(!huge || rc == CACHALOT_ERROR_OUT_OF_MEMORY, "host_malloc(%zu) succeeded", n);
  REQUIRE(rc == CACHALOT_OK ? (p != NULL) == (n != 0) : p == NULL, "host_malloc: pointer and status disagree");
  if (rc != CACHALOT_OK || !p)
    return;
  host.p[k] = p;
  host.n[k] = n;
  host.marked_capture[k] = false;
  host.p[k][0] = host.p[k][n - 1] = host_tag(k);
}

/* Frees slot k's block; false if it stays allocated (an event could not be recorded). */
static bool host_free_slot(cachalot_allocator *a, unsigned k, bool capturing) {
  if (host.p[k])
    REQUIRE(host.p[k][0] == host_tag(k) && host.p[k][host.n[k] - 1] == host_tag(k),
            "host slot %u's block was written by another holder", k);
  const cachalot_status rc = cachalot_host_free(a, host.p[k]);
  expect_status(rc, "host_free", CACHALOT_ERROR_DEVICE, CACHALOT_ERROR_OUT_OF_MEMORY);
  if (rc != CACHALOT_OK)
    return false;
  if (host.p[k]) {
    host.stuck |= capturing && host.marked_capture[k];
    host.freed = host.p[k];
  }
  host.p[k] = NULL;
  return true;
}

/* record_event on slot k's block (or NULL): with device 0, 1 (both exist), 2 or -1; with NULL, a stream of
 * either device, or a handle that is no stream. The first argument that is wrong decides the status. */
static void host_record(cachalot_allocator *a, input *in, cachalot_stream *streams, cachalot_stream streams1,
                        unsigned k) {
  static const int devices[] = {0, 0, 0, 1, 2, -1};
  const int device = devices[next(in) % 6];
  const unsigned w = next(in) % 6;
  const cachalot_stream s = w < 3 ? streams[w] : w == 3 ? streams1 : w == 4 ? NULL : (cachalot_stream)(uintptr_t)0x5150;
  const cachalot_status rc = cachalot_host_record_event(a, host.p[k], device, s);
  const cachalot_status want = device < 0 || device > 1 || w == 5 ? CACHALOT_ERROR_INVALID_ARGUMENT
                               : !host.p[k]                       ? CACHALOT_ERROR_INVALID_POINTER
                                                                  : CACHALOT_OK;
  REQUIRE(rc == want || (want == CACHALOT_OK && rc == CACHALOT_ERROR_OUT_OF_MEMORY),
          "host_record_event(device %d, stream %u) returned %s, expected %s", device, w, cachalot_status_name(rc),
          cachalot_status_name(want));
  REQUIRE(rc == CACHALOT_OK || cachalot_last_error()[0], "host_record_event failed without a message");
  if (rc == CACHALOT_OK && w == 1)
    host.marked_capture[k] = true;
}

/* Pointers the host cache does not hold as allocated blocks: each is refused and changes nothing. */
static void host_bad_pointer(cachalot_allocator *a, input *in, void **slot) {
  const unsigned w = next(in) % 4, k = next(in);
  void *bad = NULL;
  int stack = 0;
  switch (w) {
  case 0: /* inside a block */
    bad = host.p[k % HSLOTS] ? host.p[k % HSLOTS] + 1 : (void *)&stack;
    break;
  case 1: /* freed (maybe given back since), unless handed out again */
    bad = host.freed;
    for (unsigned j = 0; j < HSLOTS; j++)
      if (host.p[j] == host.freed)
        bad = NULL;
    break;
  case 2: /* a device block */
    bad = slot[k % SLOTS];
    break;
  default: /* a host block to the device allocator */
    if (host.p[k % HSLOTS]) {
      const cachalot_status rc = cachalot_free(a, host.p[k % HSLOTS]);
      REQUIRE(rc == CACHALOT_ERROR_INVALID_POINTER, "cachalot_free of a pinned host block returned %s",
              cachalot_status_name(rc));
    }
    return;
  }
  if (!bad)
    return;
  cachalot_status rc = cachalot_host_free(a, bad);
  REQUIRE(rc == CACHALOT_ERROR_INVALID_POINTER, "host_free of a pointer it does not hold returned %s",
          cachalot_status_name(rc));
  rc = cachalot_host_record_event(a, bad, 0, NULL);
  REQUIRE(rc == CACHALOT_ERROR_INVALID_POINTER, "host_record_event on a pointer it does not hold returned %s",
          cachalot_status_name(rc));
}

static void host_settings(cachalot_allocator *a, input *in) {
  static const char *const changes[] = {"pinned_use_cuda_host_register:True",
                                        "pinned_use_cuda_host_register:False",
                                        "pinned_num_register_threads:1",
                                        "pinned_num_register_threads:4",
                                        "pinned_num_register_threads:128",
                                        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
                                        "pinned_num_register_threads:3",
                                        "pinned_num_register_threads:256",
                                        "pinned_use_cuda_host_register:maybe"};
  const unsigned c = next(in) % (sizeof changes / sizeof changes[0]);
  const cachalot_status rc = cachalot_set_settings(a, changes[c]);
  REQUIRE(rc == (c < 6 ? CACHALOT_OK : CACHALOT_ERROR_CONFIG), "set_settings(%s) returned %s", changes[c],
          cachalot_status_name(rc));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, data + size};
  op_index = 0;
  static int trace = -1; /* FUZZ_API_TRACE=1: each op on stderr, to read a finding */
  if (trace < 0)
    trace = getenv("FUZZ_API_TRACE") != NULL;
  /* device 1 only for blocks used by device 0's streams (cross-device record_stream, op 22) */
  cachalot_sim_options o = {.device_count = 2, .capacity_bytes = (size_t)512 << 20, .complete_immediately = false};
  cachalot_backend *b = NULL;
  cachalot_allocator *a = NULL;
  if (cachalot_backend_sim(&o, &b) != CACHALOT_OK)
    abort();
  /* the config byte's top bit: the operations that follow run LOOP_LAPS times in a row, a program whose
   * steps repeat (the step plan of expandable_plan forms on them) */
  const unsigned conf_byte = next(&in);
  if (cachalot_create(b, confs[(conf_byte & 0x7f) % (sizeof confs / sizeof confs[0])], &a) != CACHALOT_OK)
    abort();
  const uint8_t *const ops_start = in.p;
  const size_t max_ops = conf_byte & 0x80 ? LOOP_MAX_OPS : MAX_OPS;
  int laps = conf_byte & 0x80 ? LOOP_LAPS - 1 : 0;
  memset(ctx_refs, 0, sizeof ctx_refs);
  memset(&host, 0, sizeof host);
  const cachalot_context_ops ops = {ctx_retain, ctx_release};
  if (cachalot_set_context_ops(a, &ops) != CACHALOT_OK)
    abort();
  cachalot_mempool_id released = {0, 0}; /* the last pool released, for empty_cache_pool */
  cachalot_stream streams[STREAMS] = {NULL}, streams1 = NULL;
  for (int i = 1; i < STREAMS; i++)
    if (cachalot_sim_stream_create(b, 0, &streams[i]) != CACHALOT_OK)
      abort();
  if (cachalot_sim_stream_create(b, 1, &streams1) != CACHALOT_OK)
    abort();
  void *slot[SLOTS] = {0};
  bool capturing = false;
  cachalot_mempool_id pools[8];
  int n_pools = 0, next_pool = 1;

  for (;;) {
    if (in.p >= in.end && laps > 0 && in.end > ops_start) {
      in.p = ops_start;
      laps--;
    }
    if (in.p >= in.end || op_index >= max_ops)
      break;
    op_index++;
    const unsigned op = next(&in) % 23;
    if (trace)
      fprintf(stderr, "op %zu: %u at byte %zu (next bytes %02x %02x %02x %02x)\n", op_index, op,
              (size_t)(in.p - data) - 1, in.p < in.end ? in.p[0] : 0,
              in.p + 1 < in.end ? in.p[1] : 0, in.p + 2 < in.end ? in.p[2] : 0, in.p + 3 < in.end ? in.p[3] : 0);
    cachalot_status rc;
    switch (op) {
    case 0:
    case 1:
    case 2: { /* malloc */
      const unsigned k = next(&in) % SLOTS;
      const size_t n = request_size(&in);
      cachalot_stream s = streams[next(&in) % STREAMS];
      if (slot[k]) {
        rc = cachalot_free(a, slot[k]);
        expect_status(rc, "free", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
        if (rc != CACHALOT_OK)
          break; /* still allocated (an event could not be recorded): keep it */
        slot[k] = NULL;
      }
      rc = cachalot_malloc(a, 0, n, s, &slot[k]);
      /* DEVICE: a simulated capture refuses what it would refuse on a GPU */
      expect_status(rc, "malloc", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_ERROR_DEVICE);
      REQUIRE((rc == CACHALOT_OK) == (slot[k] != NULL), "malloc: pointer and status disagree");
      break;
    }
    case 3: { /* free */
      const unsigned k = next(&in) % SLOTS;
      rc = cachalot_free(a, slot[k]);
      expect_status(rc, "free", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
      if (rc == CACHALOT_OK) /* else still allocated (an event could not be recorded) */
        slot[k] = NULL;
      break;
    }
    case 4: { /* record_stream */
      const unsigned k = next(&in) % SLOTS;
      cachalot_stream s = streams[next(&in) % STREAMS];
      rc = cachalot_record_stream(a, slot[k], s);
      expect_status(rc, "record_stream", slot[k] ? CACHALOT_ERROR_OUT_OF_MEMORY : CACHALOT_ERROR_INVALID_POINTER,
                    CACHALOT_ERROR_INVALID_POINTER);
      break;
    }
    case 5: /* a stream's work completes (refused on a capturing stream) */
      (void)cachalot_sim_stream_complete(b, streams[1 + next(&in) % (STREAMS - 1)]);
      break;
    case 6:
      (void)cachalot_sim_launch(b, streams[next(&in) % STREAMS]);
      break;
    case 7:
      expect_status(cachalot_empty_cache(a), "empty_cache", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
      break;
    case 8:
      (void)cachalot_sim_fail_device_allocs(b, (int)(next(&in) % 3));
      break;
    case 9:
      (void)cachalot_sim_fail_events(b, (int)(next(&in) % 3));
      break;
    case 10: /* a capture of stream 1 begins, routed to a fresh private pool */
      if (!capturing && n_pools < 8) {
        const cachalot_capture_mode mode = next(&in) % 2 ? CACHALOT_CAPTURE_GLOBAL : CACHALOT_CAPTURE_RELAXED;
        capture_stream = streams[1];
        const cachalot_mempool_id id = {0, (uint64_t)next_pool++};
        if (cachalot_sim_capture_begin(b, streams[1], mode) == CACHALOT_OK) {
          expect_status(cachalot_begin_allocate_to_pool(a, 0, id, is_capture_stream, NULL), "begin_allocate_to_pool",
                        CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
          pools[n_pools++] = id;
          capturing = true;
        }
      }
      break;
    case 11:
      if (capturing) {
        expect_status(cachalot_end_allocate_to_pool(a, 0, pools[n_pools - 1]), "end_allocate_to_pool", CACHALOT_OK,
                      CACHALOT_OK);
        (void)cachalot_sim_capture_end(b, streams[1]);
        capturing = false;
      }
      break;
    case 12: /* the oldest pool that is not routing is released */
      if (n_pools > (capturing ? 1 : 0)) {
        expect_status(cachalot_release_pool(a, 0, pools[0]), "release_pool", CACHALOT_OK, CACHALOT_OK);
        released = pools[0];
        memmove(pools, pools + 1, (size_t)(n_pools - 1) * sizeof pools[0]);
        n_pools--;
      }
      break;
    case 13: { /* settings change at run time */
      static const char *const changes[] = {"expandable_segments:True", "expandable_segments:False",
                                            "max_split_size_mb:40", "roundup_power2_divisions:8",
                                            "expandable_compact:True", "expandable_page_mb:2",
                                            "bogus:1"};
      const char *c = changes[next(&in) % (sizeof changes / sizeof changes[0])];
      expect_status(cachalot_set_settings(a, c), "set_settings", CACHALOT_ERROR_CONFIG, CACHALOT_OK);
      break;
    }
    case 14: { /* a pointer cachalot does not own: inside a block (blocks start 512 B apart), or never handed out */
      const unsigned k = next(&in) % SLOTS;
      void *bad = slot[k] ? (char *)slot[k] + 256 : (void *)(uintptr_t)(0x1000 + 512 * next(&in));
      rc = cachalot_free(a, bad);
      expect_status(rc, "free of a foreign pointer", CACHALOT_ERROR_INVALID_POINTER, CACHALOT_OK);
      REQUIRE(rc == CACHALOT_ERROR_INVALID_POINTER || !slot[k], "free of an inner pointer succeeded");
      break;
    }
    case 16: { /* malloc with a context */
      const unsigned k = next(&in) % SLOTS;
      const size_t n = request_size(&in);
      cachalot_stream s = streams[next(&in) % STREAMS];
      long *ctx = &ctx_refs[next(&in) % CTXS];
      if (slot[k])
        break; /* malloc with a context only into an empty slot: op 3 or 17 frees */
      rc = cachalot_malloc_with_context(a, 0, n, s, ctx, &slot[k]);
      expect_status(rc, "malloc_with_context", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_ERROR_DEVICE);
      REQUIRE((rc == CACHALOT_OK) == (slot[k] != NULL), "malloc_with_context: pointer and status disagree");
      break;
    }
    case 17: { /* free with a context */
      const unsigned k = next(&in) % SLOTS;
      rc = cachalot_free_with_context(a, slot[k], &ctx_refs[next(&in) % CTXS]);
      expect_status(rc, "free_with_context", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
      if (rc == CACHALOT_OK)
        slot[k] = NULL;
      break;
    }
    case 18: { /* history: off, or on with a small ring (entries overwritten, their contexts let go) */
      const unsigned n = next(&in) % 9;
      expect_status(cachalot_record_history(a, n != 0, n), "record_history", CACHALOT_ERROR_OUT_OF_MEMORY,
                    CACHALOT_OK);
      break;
    }
    case 19: { /* a snapshot as C structures, holding its contexts; or empty_cache of the last released pool */
      if (next(&in) % 2) {
        rc = cachalot_empty_cache_pool(a, 0, released);
        expect_status(rc, "empty_cache_pool", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
        break;
      }
      cachalot_snapshot_info *si = NULL;
      rc = cachalot_snapshot_take(a, next(&in) % 2, &si);
      expect_status(rc, "snapshot_take", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
      if (rc != CACHALOT_OK)
        break;
      long held = 0;
      size_t allocated = 0;
      for (size_t i = 0; i < si->n_segments; i++)
        for (size_t j = 0; j < si->segments[i].n_blocks; j++) {
          held += si->segments[i].blocks[j].context != NULL;
          allocated += si->segments[i].blocks[j].state == CACHALOT_BLOCK_ALLOCATED;
        }
      for (size_t i = 0; i < si->n_trace; i++)
        held += si->trace[i].context != NULL;
      /* (taking it may also let go of an entry its "snapshot" entry overwrote: only freeing it is exact) */
      const long with = ctx_total();
      size_t live = 0;
      for (int k = 0; k < SLOTS; k++)
        live += slot[k] != NULL;
      REQUIRE(allocated == live, "the snapshot shows %zu allocated blocks, the program holds %zu", allocated, live);
      cachalot_snapshot_info_free(a, si);
      REQUIRE(ctx_total() == with - held, "the snapshot held %ld contexts, freeing it let go of %ld", held,
              with - ctx_total());
      break;
    }
    case 20: { /* a caller-built pool state: a checkpoint of a pool, one field changed, restored */
      if (!n_pools)
        break;
      cachalot_pool_state *st = NULL;
      rc = cachalot_checkpoint_pool(a, 0, pools[next(&in) % (unsigned)n_pools], &st);
      expect_status(rc, "checkpoint_pool", CACHALOT_ERROR_INVALID_ARGUMENT, CACHALOT_ERROR_OUT_OF_MEMORY);
      if (rc != CACHALOT_OK)
        break;
      enum { MAX_SEGS = 64 };
      uintptr_t lo[MAX_SEGS], hi[MAX_SEGS]; /* the pool's segments, before any change */
      const size_t n_segs = st->n_segments < MAX_SEGS ? st->n_segments : MAX_SEGS;
      for (size_t i = 0; i < n_segs; i++) {
        lo[i] = st->segments[i].address;
        hi[i] = lo[i] + st->segments[i].size;
      }
      if (st->n_segments > MAX_SEGS) {
        cachalot_pool_state_free(st);
        break;
      }
      const unsigned what = next(&in) % 6, k = next(&in);
      cachalot_segment_state overwritten = {0}; /* the duplicate's victim, put back before the state is freed */
      if (st->n_segments) {
        cachalot_segment_state *sg = &st->segments[k % st->n_segments];
        switch (what) {
        case 0: sg->address += 512 * (next(&in) % 3); break;
        case 1: sg->size ^= (size_t)1 << (next(&in) % 30); break;
        case 2: if (sg->n_blocks) sg->blocks[k % sg->n_blocks].size += 512; break;
        case 3: if (sg->n_blocks) sg->blocks[k % sg->n_blocks].allocated ^= 1; break;
        case 4: /* a segment named twice */
          if (st->n_segments > 1) {
            overwritten = st->segments[(k + 1) % st->n_segments];
            st->segments[(k + 1) % st->n_segments] = *sg;
          }
          break;
        default: break; /* unchanged */
        }
      }
      void **ptrs = NULL;
      size_t n = 0;
      /* a capture may be underway: restoring a pool's blocks is refused then only if some are pending */
      rc = cachalot_restore_pool(a, st, &ptrs, &n);
      /* DEVICE: a pending block could not be waited for (injected event failures) */
      if (rc != CACHALOT_ERROR_DEVICE && rc != CACHALOT_ERROR_OUT_OF_MEMORY)
        expect_status(rc, "restore_pool", CACHALOT_ERROR_INVALID_STATE, CACHALOT_ERROR_INVALID_ARGUMENT);
      REQUIRE(rc == CACHALOT_OK || cachalot_last_error()[0], "restore_pool failed without a message");
      if (rc == CACHALOT_OK) {
        /* every block the program held in that pool was freed and the checkpoint's re-made: the program
         * no longer owns its slots there; it adopts the restored pointers where it can */
        for (int s2 = 0; s2 < SLOTS; s2++)
          for (size_t i = 0; slot[s2] && i < n_segs; i++)
            if ((uintptr_t)slot[s2] >= lo[i] && (uintptr_t)slot[s2] < hi[i])
              slot[s2] = NULL;
        for (size_t i = 0; i < n; i++) {
          int s2 = 0;
          while (s2 < SLOTS && slot[s2])
            s2++;
          if (s2 < SLOTS)
            slot[s2] = ptrs[i];
          else
            expect_status(cachalot_free(a, ptrs[i]), "free of a restored block", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
        }
      }
      free(ptrs);
      if (overwritten.blocks)
        st->segments[(k + 1) % st->n_segments] = overwritten;
      cachalot_pool_state_free(st);
      break;
    }
    case 21: { /* a stream goes (forgotten after its work completes) and a new one comes */
      const unsigned k = 1 + next(&in) % (STREAMS - 1);
      if (capturing)
        break; /* deferred frees may still record on it */
      bool used = false;
      for (int s2 = 0; s2 < SLOTS; s2++)
        used |= slot[s2] != NULL; /* (blocks of any stream may have it among their uses) */
      for (int s2 = 0; s2 < HSLOTS; s2++)
        used |= host.p[s2] != NULL; /* pinned blocks too, marked with it */
      if (used)
        break; /* a stream must outlive its blocks' uses: only swap with nothing allocated */
      (void)cachalot_sim_stream_complete(b, streams[k]);
      expect_status(cachalot_empty_cache(a), "empty_cache", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
      expect_status(cachalot_forget_stream(a, streams[k]), "forget_stream", CACHALOT_OK, CACHALOT_OK);
      REQUIRE(cachalot_sim_stream_create(b, 0, &streams[k]) == CACHALOT_OK, "stream create");
      break;
    }
    case 22: { /* a device-1 block used by a device-0 stream (the capturing one, maybe), then maybe freed */
      const unsigned k = next(&in) % SLOTS;
      if (slot[k])
        break;
      rc = cachalot_malloc(a, 1, request_size(&in), streams1, &slot[k]);
      expect_status(rc, "malloc on device 1", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_ERROR_DEVICE);
      if (rc != CACHALOT_OK)
        break;
      rc = cachalot_record_stream(a, slot[k], streams[next(&in) % STREAMS]);
      expect_status(rc, "record_stream across devices", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
      if (next(&in) % 2) {
        rc = cachalot_free(a, slot[k]);
        expect_status(rc, "free", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
        if (rc == CACHALOT_OK)
          slot[k] = NULL;
      }
      break;
    }
    default: { /* op 15: observers (stats, peaks, snapshots), then a chain of pinned-host calls */
      char *json = NULL;
      expect_status(cachalot_snapshot_json(a, &json), "snapshot_json", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
      free(json);
      expect_status(cachalot_reset_peak_stats(a, 0), "reset_peak_stats", CACHALOT_OK, CACHALOT_OK);
      /* (a 0 byte ends the chain at once: inputs from before the host cache read as they did) */
      for (unsigned h; op_index < max_ops && (h = next(&in) % 12) != 0;) {
        consistent(a, b);
        op_index++;
        if (trace)
          fprintf(stderr, "op %zu: host %u at byte %zu\n", op_index, h, (size_t)(in.p - data) - 1);
        const unsigned k = next(&in) % HSLOTS;
        switch (h) {
        case 1:
        case 2: { /* malloc into slot k, freeing what it held */
          bool huge = false;
          const size_t n = host_size(&in, &huge);
          if (host.p[k] && !host_free_slot(a, k, capturing))
            break;
          host_malloc_into(a, k, n, huge);
          break;
        }
        case 3:
          (void)host_free_slot(a, k, capturing);
          break;
        case 4:
          host_bad_pointer(a, &in, slot);
          break;
        case 5:
          host_record(a, &in, streams, streams1, k);
          break;
        case 6: /* DEVICE: a global capture refuses cudaFreeHost */
          expect_status(cachalot_host_empty_cache(a), "host_empty_cache", CACHALOT_ERROR_DEVICE, CACHALOT_OK);
          break;
        case 7: {
          cachalot_host_stats st;
          expect_status(cachalot_host_memory_stats(a, &st), "host_memory_stats", CACHALOT_OK, CACHALOT_OK);
          if (k % 4 == 1)
            expect_status(cachalot_host_reset_peak_stats(a), "host_reset_peak_stats", CACHALOT_OK, CACHALOT_OK);
          if (k % 4 == 2) {
            expect_status(cachalot_host_reset_accumulated_stats(a), "host_reset_accumulated_stats", CACHALOT_OK,
                          CACHALOT_OK);
            host.accumulated_reset = true;
          }
          break;
        }
        case 8:
          (void)cachalot_sim_fail_host_pins(b, (int)(k % 3));
          break;
        case 9:
          host_settings(a, &in);
          break;
        case 10: /* the default streams of both devices, or device 1's stream (op 5 completes the others) */
          (void)cachalot_sim_stream_complete(b, k % 2 ? NULL : streams1);
          break;
        default: { /* a copy: a block written, used by a stream, freed while the copy may still run */
          bool huge = false;
          const size_t n = host_size(&in, &huge);
          const unsigned w = next(&in) % STREAMS;
          if (host.p[k] && !host_free_slot(a, k, capturing))
            break;
          host_malloc_into(a, k, n, huge);
          if (!host.p[k])
            break;
          rc = cachalot_host_record_event(a, host.p[k], 0, streams[w]);
          expect_status(rc, "host_record_event", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
          host.marked_capture[k] |= rc == CACHALOT_OK && w == 1;
          (void)cachalot_sim_launch(b, streams[w]);
          (void)host_free_slot(a, k, capturing);
          break;
        }
        }
      }
      break;
    }
    }
    consistent(a, b);
  }

  /* Wind down: everything back to the device. */
  op_index++;
  (void)cachalot_sim_fail_device_allocs(b, 0);
  (void)cachalot_sim_fail_events(b, 0);
  if (capturing) {
    (void)cachalot_end_allocate_to_pool(a, 0, pools[n_pools - 1]);
    (void)cachalot_sim_capture_end(b, streams[1]);
  }
  for (int k = 0; k < SLOTS; k++)
    if (slot[k])
      REQUIRE(cachalot_free(a, slot[k]) == CACHALOT_OK, "final free");
  for (int i = 0; i < n_pools; i++)
    REQUIRE(cachalot_release_pool(a, 0, pools[i]) == CACHALOT_OK, "final release_pool");
  (void)cachalot_sim_fail_host_pins(b, 0);
  for (unsigned k = 0; k < HSLOTS; k++)
    REQUIRE(host_free_slot(a, k, false), "final host_free");
  for (int i = 1; i < STREAMS; i++)
    (void)cachalot_sim_stream_complete(b, streams[i]);
  (void)cachalot_sim_stream_complete(b, NULL);
  (void)cachalot_sim_stream_complete(b, streams1);
  REQUIRE(cachalot_empty_cache(a) == CACHALOT_OK, "final empty_cache");
  REQUIRE(cachalot_host_empty_cache(a) == CACHALOT_OK, "final host_empty_cache");
  consistent(a, b);
  cachalot_host_stats hst;
  REQUIRE(cachalot_host_memory_stats(a, &hst) == CACHALOT_OK, "host_memory_stats");
  REQUIRE(host.stuck || hst.allocations.current == 0, "%lld pinned blocks left after freeing all and empty_cache",
          (long long)hst.allocations.current);
  REQUIRE(cachalot_record_history(a, false, 0) == CACHALOT_OK, "history off");
  REQUIRE(ctx_total() == 0, "%ld context references kept with nothing allocated and history off", ctx_total());
  for (int dev = 0; dev < 2; dev++) {
    size_t used = 1;
    REQUIRE(cachalot_sim_device_used(b, dev, &used) == CACHALOT_OK && used == 0, "%zu bytes left on device %d",
            used, dev);
  }
  cachalot_destroy(a);
  REQUIRE(ctx_total() == 0, "%ld context references kept after destroy", ctx_total());
  size_t by_alloc = 1, by_register = 1;
  REQUIRE(cachalot_sim_host_pinned(b, &by_alloc, &by_register) == CACHALOT_OK && by_alloc + by_register == 0,
          "%zu + %zu bytes left pinned after destroy", by_alloc, by_register);
  cachalot_backend_destroy(b);
  return 0;
}
