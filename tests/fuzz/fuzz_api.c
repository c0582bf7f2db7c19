/* libFuzzer target: sequences of API calls on the simulated device, read from the input bytes. The first
 * byte picks a config; then each op byte picks a call and the next bytes its arguments: malloc (sizes
 * from 1 B to 256 MiB, on one of three streams), free, record_stream, stream completion, kernel launches,
 * empty_cache, private-pool routing during a simulated capture (begin/end, release), injected device
 * allocation and event failures, settings changed at run time, frees of pointers cachalot does not own,
 * stats and snapshots; and what bindings use: history on and off, malloc and free with contexts (counted
 * references), snapshots as C structures, empty_cache of one released pool. After every call:
 *   - the status is one the call may return, with a message when it is not OK;
 *   - cachalot_check passes (structure and every stat recomputed from the blocks);
 *   - reserved_bytes equals what the simulated device says it holds (nothing lost, nothing counted twice);
 *   - no context was released more often than it was retained.
 * At the end everything is freed and empty_cache must give the device all of its memory back; with history
 * off every context reference is given back, and destroy leaves none. */
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

enum { SLOTS = 32, STREAMS = 3, MAX_OPS = 200 };

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

static void consistent(cachalot_allocator *a, cachalot_backend *b) {
  REQUIRE(cachalot_check(a) == CACHALOT_OK, "cachalot_check");
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
  if (cachalot_create(b, confs[next(&in) % (sizeof confs / sizeof confs[0])], &a) != CACHALOT_OK)
    abort();
  memset(ctx_refs, 0, sizeof ctx_refs);
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

  while (in.p < in.end && op_index < MAX_OPS) {
    op_index++;
    const unsigned op = next(&in) % 23;
    if (trace)
      fprintf(stderr, "op %zu: %u (next bytes %02x %02x %02x %02x)\n", op_index, op, in.p < in.end ? in.p[0] : 0,
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
    default: { /* observers: stats, peaks, snapshots */
      char *json = NULL;
      expect_status(cachalot_snapshot_json(a, &json), "snapshot_json", CACHALOT_ERROR_OUT_OF_MEMORY, CACHALOT_OK);
      free(json);
      expect_status(cachalot_reset_peak_stats(a, 0), "reset_peak_stats", CACHALOT_OK, CACHALOT_OK);
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
  for (int i = 1; i < STREAMS; i++)
    (void)cachalot_sim_stream_complete(b, streams[i]);
  REQUIRE(cachalot_empty_cache(a) == CACHALOT_OK, "final empty_cache");
  consistent(a, b);
  REQUIRE(cachalot_record_history(a, false, 0) == CACHALOT_OK, "history off");
  REQUIRE(ctx_total() == 0, "%ld context references kept with nothing allocated and history off", ctx_total());
  for (int dev = 0; dev < 2; dev++) {
    size_t used = 1;
    REQUIRE(cachalot_sim_device_used(b, dev, &used) == CACHALOT_OK && used == 0, "%zu bytes left on device %d",
            used, dev);
  }
  cachalot_destroy(a);
  REQUIRE(ctx_total() == 0, "%ld context references kept after destroy", ctx_total());
  cachalot_backend_destroy(b);
  return 0;
}
