/* Injected device failures on the simulated backend: a device allocation failing at every possible point
 * of a sequence (fail the next N, fail every k-th), failures inside the oversize-release and the
 * release-all retries, event records that fail at free(), and a campaign over a seeded sequence with
 * captures in four configs (page maps of expandable segments among the failures). After each failure: the documented status
 * and message, cachalot_check passes, every live allocation is intact, cachalot's reserved bytes equal the
 * device's own count, and after freeing everything and empty_cache both are 0. The pinned-host cache
 * gets the same treatment (its section below): pinnings and event records failing at every step of a
 * sequence, refused unpinnings, exact stats and pinned bytes after every step. */
#include "helpers.h"

#include "allocator/backend/ops.h"

/* ---- a fixed sequence of operations, replayed with faults injected ---------------------------- */

enum { S_DEFAULT, S_ONE, S_TWO, N_STREAMS };
enum { OP_MALLOC, OP_FREE, OP_RECORD, OP_COMPLETE };

typedef struct {
  int op;
  int slot;    /* OP_MALLOC / OP_FREE / OP_RECORD */
  size_t size; /* OP_MALLOC */
  int stream;  /* OP_MALLOC: allocation stream; OP_RECORD: used stream; OP_COMPLETE: stream */
} step;

#define M(slot, size, stream) {OP_MALLOC, (slot), (size), (stream)}
#define F(slot) {OP_FREE, (slot), 0, 0}
#define R(slot, stream) {OP_RECORD, (slot), 0, (stream)}
#define C(stream) {OP_COMPLETE, 0, 0, (stream)}

static const step script[] = {
    M(0, 1, S_ONE),               /* small segment */
    M(1, 3 * MiB, S_ONE),         /* 20 MiB segment */
    M(2, 12 * MiB, S_TWO),        /* 12 MiB segment */
    F(1),
    M(3, 2 * MiB, S_ONE),         /* reuses slot 1's segment */
    M(4, 700 * KiB, S_TWO),       /* small segment of stream two */
    F(2),
    M(5, 30 * MiB, S_ONE),        /* 30 MiB segment */
    F(0),
    M(6, 12 * MiB, S_TWO),        /* reuses slot 2's segment */
    M(7, 25 * MiB, S_TWO),        /* 26 MiB segment */
    F(5),
    M(8, MiB + 1, S_DEFAULT),     /* 20 MiB segment */
    R(3, S_TWO),
    F(3),                         /* pending on stream two */
    M(9, 2 * MiB, S_ONE),         /* from slot 1's segment, beside the pending block */
    M(10, 19 * MiB, S_ONE),       /* slot 5's cached 30 MiB segment */
    M(11, 40 * MiB, S_ONE),       /* 40 MiB segment */
    C(S_TWO),
    M(12, 1000, S_TWO),           /* polls: the pending block is freed */
    M(13, 64 * MiB, S_DEFAULT),   /* 64 MiB segment */
};
enum { N_STEPS = sizeof script / sizeof script[0], N_SLOTS = 14, N_MALLOCS = 14 };

typedef struct {
  env e;
  cachalot_stream streams[N_STREAMS];
  char *ptr[N_SLOTS];
  size_t size[N_SLOTS];
  bool live[N_SLOTS];
} run_state;

static void run_begin(run_state *r) {
  memset(r, 0, sizeof *r);
  r->e = ENV(1, 0, "");
  r->streams[S_DEFAULT] = NULL;
  r->streams[S_ONE] = STREAM(r->e.b, 0);
  r->streams[S_TWO] = STREAM(r->e.b, 0);
}

/* Everything that must hold after any step, fault or not. */
static void verify_(run_state *r, const char *file, int line) {
  env *e = &r->e;
  check_(e->a, file, line);
  expect_reserved_is_used_(e, 0, file, line);
  cachalot_device_stats st = stats_(e->a, 0, file, line);
  int64_t n = 0, requested = 0;
  for (int i = 0; i < N_SLOTS; i++) {
    if (!r->live[i])
      continue;
    n++;
    requested += (int64_t)r->size[i];
    /* live ranges never overlap */
    for (int j = 0; j < i; j++) {
      if (r->live[j] && r->ptr[i] < r->ptr[j] + r->size[j] && r->ptr[j] < r->ptr[i] + r->size[i]) {
        print_error("%s:%d: slots %d and %d overlap\n", file, line, i, j);
        _fail(file, line);
      }
    }
  }
  eq_i64_(st.allocation[CACHALOT_STAT_ALL].current, n, "allocation.all.current vs live slots", file, line);
  /* a pending block (slot 3, freed with a use on stream two) still counts as active and requested */
  int64_t pending = st.active[CACHALOT_STAT_ALL].current - st.allocation[CACHALOT_STAT_ALL].current;
  if (pending != 0 && pending != 1) {
    print_error("%s:%d: %lld pending blocks\n", file, line, (long long)pending);
    _fail(file, line);
  }
  eq_i64_(st.requested_bytes[CACHALOT_STAT_ALL].current, requested + (pending ? (int64_t)r->size[3] : 0),
          "requested_bytes.all.current vs live slots", file, line);
}
#define VERIFY(r) verify_((r), __FILE__, __LINE__)

/* Runs step i. A malloc may fail only when `may_fail`; returns its status. */
static cachalot_status run_step(run_state *r, int i, bool may_fail) {
  const step *s = &script[i];
  env *e = &r->e;
  cachalot_status rc = CACHALOT_OK;
  switch (s->op) {
  case OP_MALLOC: {
    void *p = (void *)(uintptr_t)0x1;
    rc = cachalot_malloc(e->a, 0, s->size, r->streams[s->stream], &p);
    if (rc == CACHALOT_OK) {
      assert_non_null(p);
      r->ptr[s->slot] = p;
      r->size[s->slot] = s->size;
      r->live[s->slot] = true;
    } else {
      if (!may_fail || rc != CACHALOT_ERROR_OUT_OF_MEMORY)
        fail_msg("step %d: malloc(%zu): %s: %s", i, s->size, cachalot_status_name(rc), cachalot_last_error());
      assert_null(p);
      CONTAINS(cachalot_last_error(), "CUDA out of memory. Tried to allocate ");
    }
    break;
  }
  case OP_FREE:
    if (r->live[s->slot]) {
      FREE(e->a, r->ptr[s->slot]);
      r->live[s->slot] = false;
    }
    break;
  case OP_RECORD:
    if (r->live[s->slot])
      RECORD(e->a, r->ptr[s->slot], r->streams[s->stream]);
    break;
  case OP_COMPLETE:
    COMPLETE(e, r->streams[s->stream]);
    break;
  }
  VERIFY(r);
  return rc;
}

static void run_end(run_state *r) {
  for (int i = 0; i < N_SLOTS; i++)
    if (r->live[i]) {
      FREE(r->e.a, r->ptr[i]);
      r->live[i] = false;
      VERIFY(r);
    }
  EMPTY(r->e.a);
  VERIFY(r);
  cachalot_device_stats st = STATS(r->e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(st.active[CACHALOT_STAT_ALL].current, 0);
  EQ(st.requested_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(USED(r->e.b, 0), 0);
  env_free(&r->e);
}

/* The reference run: which mallocs ask the device for a segment. */
static void reference(bool needs_device[N_STEPS]) {
  run_state r;
  run_begin(&r);
  for (int i = 0; i < N_STEPS; i++) {
    int64_t before = STATS(r.e.a, 0).num_device_alloc;
    OK(run_step(&r, i, false));
    needs_device[i] = STATS(r.e.a, 0).num_device_alloc > before;
  }
  cachalot_device_stats st = STATS(r.e.a, 0);
  EXPECT_COUNTERS(r.e.a, 0, 9, 0, 0, 0, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, (2 + 20 + 12 + 2 + 30 + 26 + 20 + 40 + 64) * MiB);
  run_end(&r);
}

static void test_fail_next_at_every_step(void **state) {
  (void)state;
  bool needs_device[N_STEPS];
  reference(needs_device);
  int device_steps = 0;
  for (int k = 0; k < N_STEPS; k++)
    device_steps += needs_device[k];
  EQ(device_steps, 9);

  /* count 2: the first attempt and the release-all retry both fail: the call fails */
  for (int k = 0; k < N_STEPS; k++) {
    if (script[k].op != OP_MALLOC)
      continue;
    run_state r;
    run_begin(&r);
    for (int i = 0; i < N_STEPS; i++) {
      if (i == k) {
        OK(cachalot_sim_fail_device_allocs(r.e.b, 2));
        cachalot_device_stats before = STATS(r.e.a, 0);
        cachalot_status rc = run_step(&r, i, true);
        OK(cachalot_sim_fail_device_allocs(r.e.b, 0));
        cachalot_device_stats after = STATS(r.e.a, 0);
        if (needs_device[k]) {
          if (rc != CACHALOT_ERROR_OUT_OF_MEMORY)
            fail_msg("k=%d: expected an out-of-memory failure, got %s", k, cachalot_status_name(rc));
          EQ(after.num_ooms, 1);
          EQ(after.num_alloc_retries, 1);
          EQ(after.num_sync_all_streams, 1);
          EQ(after.num_device_alloc, before.num_device_alloc);
          EQ(after.allocation[CACHALOT_STAT_ALL].current, before.allocation[CACHALOT_STAT_ALL].current);
          EQ(after.allocated_bytes[CACHALOT_STAT_ALL].current, before.allocated_bytes[CACHALOT_STAT_ALL].current);
        } else {
          OK(rc);
          EQ(after.num_ooms, 0);
          EQ(after.num_alloc_retries, 0);
        }
      } else {
        OK(run_step(&r, i, false));
      }
    }
    run_end(&r);
  }

  /* count 1: the release-all retry succeeds */
  for (int k = 0; k < N_STEPS; k++) {
    if (script[k].op != OP_MALLOC)
      continue;
    run_state r;
    run_begin(&r);
    for (int i = 0; i < N_STEPS; i++) {
      if (i == k) {
        OK(cachalot_sim_fail_device_allocs(r.e.b, 1));
        OK(run_step(&r, i, false));
        OK(cachalot_sim_fail_device_allocs(r.e.b, 0));
        cachalot_device_stats after = STATS(r.e.a, 0);
        EQ(after.num_alloc_retries, needs_device[k] ? 1 : 0);
        EQ(after.num_ooms, 0);
      } else {
        OK(run_step(&r, i, false));
      }
    }
    run_end(&r);
  }
}

static void test_fail_every_k(void **state) {
  (void)state;
  bool needs_device[N_STEPS];
  reference(needs_device);
  for (int k = 1; k <= 6; k++) {
    run_state r;
    run_begin(&r);
    OK(cachalot_sim_fail_every(r.e.b, k));
    int failed = 0;
    for (int i = 0; i < N_STEPS; i++)
      failed += run_step(&r, i, true) != CACHALOT_OK;
    cachalot_device_stats st = STATS(r.e.a, 0);
    EQ(st.num_ooms, failed);
    if (k == 1) /* every device allocation fails: nothing is ever cached, every malloc fails */
      EQ(failed, N_MALLOCS);
    else /* the retry always gets the next, good, attempt */
      EQ(failed, 0);
    OK(cachalot_sim_fail_every(r.e.b, 0));
    run_end(&r);
  }
}

static void test_fail_every_two_exact(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  OK(cachalot_sim_fail_every(e.b, 2));
  void *m1 = ALLOC(e.a, 0, 12 * MiB, NULL); /* attempt 1: ok */
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  void *m2 = ALLOC(e.a, 0, 14 * MiB, NULL); /* 2 fails, the retry (3) succeeds */
  EXPECT_COUNTERS(e.a, 0, 2, 0, 1, 0, 1);
  void *m3 = ALLOC(e.a, 0, 16 * MiB, NULL); /* 4 fails, 5 */
  EXPECT_COUNTERS(e.a, 0, 3, 0, 2, 0, 2);
  FREE(e.a, m1);
  void *m4 = ALLOC(e.a, 0, 18 * MiB, NULL); /* 6 fails; the retry gives m1's segment back; 7 */
  EXPECT_COUNTERS(e.a, 0, 4, 1, 3, 0, 3);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 3, .alloc_b = 48 * MiB, .active = 3, .active_b = 48 * MiB, .req_b = 48 * MiB, .seg = 3,
                  .res_b = 48 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  OK(cachalot_sim_fail_every(e.b, 1));
  void *x = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 1, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(x);
  STR_EQ(cachalot_last_error(),
         "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 80.00 GiB of which 79.95 GiB "
         "is free. Of the allocated memory 48.00 MiB is allocated by cachalot, and 0 bytes is reserved by cachalot "
         "but unallocated. If reserved but unallocated memory is large try setting "
         "CACHALOT_ALLOC_CONF=expandable_segments:True to avoid fragmentation.");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 4, 1, 4, 1, 4);
  OK(cachalot_sim_fail_every(e.b, 0));
  void *y = ALLOC(e.a, 0, 1, NULL);
  EXPECT_COUNTERS(e.a, 0, 5, 1, 4, 1, 4);
  FREE(e.a, m2);
  FREE(e.a, m3);
  FREE(e.a, m4);
  FREE(e.a, y);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* Failures around step 6 (release of oversize blocks) and step 7 (wait for events, release all). */
static void test_fail_in_oversize_and_retry_paths(void **state) {
  (void)state;
  for (int fails = 1; fails <= 3; fails++) {
    env e = ENV(1, 100 * MiB, "max_split_size_mb:40");
    cachalot_stream s = STREAM(e.b, 0);
    void *a = ALLOC(e.a, 0, 60 * MiB, s);
    FREE(e.a, a);
    void *b = ALLOC(e.a, 0, 30 * MiB, s);
    OK(cachalot_sim_fail_device_allocs(e.b, fails));
    void *c = (void *)(uintptr_t)0x1;
    cachalot_status rc = cachalot_malloc(e.a, 0, 30 * MiB, s, &c);
    CHECK(e.a);
    OK(cachalot_sim_fail_device_allocs(e.b, 0));
    EXPECT_RESERVED_IS_USED(&e, 0);
    EXPECT_OVERSIZE(e.a, 0, 0, 0); /* the 60 MiB block went back at step 6 in every case */
    if (fails == 1) {
      /* step 5 fails, step 6 frees the oversize block and its retry succeeds */
      OK(rc);
      EXPECT_COUNTERS(e.a, 0, 3, 1, 0, 0, 0);
    } else if (fails == 2) {
      /* step 6's retry fails too; step 7's succeeds */
      OK(rc);
      EXPECT_COUNTERS(e.a, 0, 3, 1, 1, 0, 1);
    } else {
      STATUS(rc, CACHALOT_ERROR_OUT_OF_MEMORY);
      assert_null(c);
      CONTAINS(cachalot_last_error(), "Tried to allocate 30.00 MiB. GPU 0 has a total capacity of 100.00 MiB of "
                                      "which 70.00 MiB is free. Of the allocated memory 30.00 MiB");
      EXPECT_COUNTERS(e.a, 0, 2, 1, 1, 1, 1);
      c = NULL;
    }
    FREE(e.a, b);
    FREE(e.a, c);
    EMPTY(e.a);
    EXPECT_POOLS(e.a, 0, PX0, PX0);
    EQ(USED(e.b, 0), 0);
    env_free(&e);
  }

  /* step 7 waits for outstanding events: a pending block's segment becomes whole and goes back */
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0), s3 = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 12 * MiB, s1);
  RECORD(e.a, p, s2);
  FREE(e.a, p);
  OK(cachalot_sim_fail_device_allocs(e.b, 1));
  void *q = ALLOC(e.a, 0, 12 * MiB, s3);
  EXPECT_COUNTERS(e.a, 0, 2, 1, 1, 0, 1);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 12 * MiB, .active = 1, .active_b = 12 * MiB, .req_b = 12 * MiB, .seg = 1,
                  .res_b = 12 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, q);
  env_free(&e);
}

/* A device failure that is not out-of-memory is passed through at once: no oversize release, no
 * release-all retry, no OOM counted (PyTorch's C10_CUDA_CHECK on a non-OOM cudaMalloc error). The
 * simulator's address space (2^46 bytes per device) standing in for it. */
static void test_device_error_is_not_oom(void **state) {
  (void)state;
  env e = ENV(1, (size_t)1 << 50, "max_split_size_mb:40");
  cachalot_stream s = STREAM(e.b, 0);
  void *huge = ALLOC(e.a, 0, (size_t)1 << 46, s); /* the whole simulated address space */
  EXPECT_OVERSIZE(e.a, 0, 1, 1);
  void *x = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 1, NULL, &x), CACHALOT_ERROR_DEVICE);
  assert_null(x);
  CONTAINS(cachalot_last_error(), "cachalot_malloc: device 0: ");
  CONTAINS(cachalot_last_error(), "address space exhausted");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* with the huge block cached (oversize) on s: still no step 6 release, no step 7 retry */
  FREE(e.a, huge);
  STATUS(cachalot_malloc(e.a, 0, MiB + 1, s, &x), CACHALOT_ERROR_DEVICE);
  assert_null(x);
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = (int64_t)1 << 46));
  EXPECT_RESERVED_IS_USED(&e, 0);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* ---- event records that fail at free() --------------------------------------------------------- */

static void test_fail_events(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0), s3 = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, 4 * MiB, s1);
  RECORD(e.a, p, s2);
  RECORD(e.a, p, s3);
  cachalot_device_stats before = STATS(e.a, 0);
  OK(cachalot_sim_fail_events(e.b, 2));
  for (int i = 0; i < 2; i++) {
    STATUS(cachalot_free(e.a, p), CACHALOT_ERROR_DEVICE);
    CONTAINS(cachalot_last_error(), "injected event failure");
    CONTAINS(cachalot_last_error(), "cachalot_free");
    CHECK(e.a);
    cachalot_device_stats now = STATS(e.a, 0);
    assert_memory_equal(&before, &now, sizeof now); /* still allocated, nothing changed */
  }
  /* still a live allocation: it can be used and freed later */
  RECORD(e.a, p, s2);
  FREE(e.a, p);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1, .res_b = 20 * MiB, .split = 1,
                  .split_b = 16 * MiB));
  COMPLETE(&e, s2);
  COMPLETE(&e, s3);
  char *q = ALLOC(e.a, 0, 4 * MiB, s1);
  assert_ptr_equal(q, p);
  FREE(e.a, q);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));

  /* A block without stream uses records no event: a pending event failure does not touch its free. */
  OK(cachalot_sim_fail_events(e.b, 1));
  char *r = ALLOC(e.a, 0, 4 * MiB, s1);
  FREE(e.a, r);
  OK(cachalot_sim_fail_events(e.b, 0));

  /* A stream no event can be recorded on is refused by record_stream itself, so that the block's free
   * cannot fail forever later; nothing changes. */
  char *t = ALLOC(e.a, 0, 4 * MiB, s1);
  before = STATS(e.a, 0);
  assert_int_equal(cachalot_record_stream(e.a, t, (cachalot_stream)(uintptr_t)0xdead0),
                   CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "unknown simulated stream");
  CHECK(e.a);

  /* All or nothing: when an event cannot be recorded, those already recorded are given back and the
   * block stays allocated. */
  RECORD(e.a, t, s2);
  RECORD(e.a, t, s3);
  OK(cachalot_sim_fail_events(e.b, 1));
  cachalot_status rc = cachalot_free(e.a, t);
  if (rc == CACHALOT_OK)
    fail_msg("free with a failing event record succeeded");
  assert_int_equal(rc, CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "injected event failure");
  CHECK(e.a);
  cachalot_device_stats now = STATS(e.a, 0);
  assert_memory_equal(&before, &now, sizeof now);
  /* no event was left outstanding on s2: a malloc after completing nothing still works, and
   * empty_cache finds no event to wait for on t's behalf */
  void *u = ALLOC(e.a, 0, 1000, s2);
  FREE(e.a, u);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 16 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  env_free(&e); /* destroy gives t's segment back */
}

/* ---- a seeded random mix of everything, with faults ----------------------------------------------- */

enum { RND_SLOTS = 64, RND_PENDING = 256 };

typedef struct {
  uintptr_t ptr;
  size_t size;
  unsigned streams; /* bit i: stream i has not been completed since the free */
  int64_t device_frees, syncs; /* a device free or a wait for all events may complete the work early */
} rnd_pending;

typedef struct {
  env e;
  cachalot_stream st[3];
  uintptr_t ptr[RND_SLOTS];
  size_t size[RND_SLOTS];
  unsigned uses[RND_SLOTS];
  int alloc_stream[RND_SLOTS];
  bool live[RND_SLOTS];
  rnd_pending pend[RND_PENDING];
  int n_pend;
  uint64_t rng;
} rnd_state;

static uint64_t rnd_next(rnd_state *r) {
  r->rng ^= r->rng << 13;
  r->rng ^= r->rng >> 7;
  r->rng ^= r->rng << 17;
  return r->rng;
}
static unsigned rnd_below(rnd_state *r, unsigned n) { return (unsigned)(rnd_next(r) % n); }

static size_t rnd_size(rnd_state *r) {
  static const size_t fixed[] = {1, 512, 513, MiB, MiB + 1, 10 * MiB - 512, 10 * MiB, 10 * MiB + 512,
                                 20 * MiB, 40 * MiB, 64 * MiB, 11 * MiB};
  if (rnd_below(r, 4) == 0)
    return fixed[rnd_below(r, sizeof fixed / sizeof fixed[0])];
  unsigned bits = rnd_below(r, 27); /* up to 64 MiB */
  return (size_t)1 + (size_t)(rnd_next(r) & (((uint64_t)1 << bits) - 1));
}

static void rnd_verify(rnd_state *r, int op) {
  cachalot_status rc = cachalot_check(r->e.a);
  if (rc != CACHALOT_OK)
    fail_msg("op %d: cachalot_check: %s", op, cachalot_last_error());
  cachalot_device_stats st = STATS(r->e.a, 0);
  if (st.reserved_bytes[CACHALOT_STAT_ALL].current != (int64_t)USED(r->e.b, 0))
    fail_msg("op %d: reserved %lld, device used %zu", op, (long long)st.reserved_bytes[CACHALOT_STAT_ALL].current,
             USED(r->e.b, 0));
  int64_t n = 0, req = 0;
  for (int i = 0; i < RND_SLOTS; i++)
    if (r->live[i]) {
      n++;
      req += (int64_t)r->size[i];
    }
  if (st.allocation[CACHALOT_STAT_ALL].current != n)
    fail_msg("op %d: %lld allocations, %lld live", op, (long long)st.allocation[CACHALOT_STAT_ALL].current,
             (long long)n);
  int64_t pending_blocks = st.active[CACHALOT_STAT_ALL].current - n;
  if (pending_blocks < 0 || st.requested_bytes[CACHALOT_STAT_ALL].current < req ||
      (pending_blocks == 0 && st.requested_bytes[CACHALOT_STAT_ALL].current != req))
    fail_msg("op %d: active %lld, requested %lld for %lld live blocks of %lld bytes", op,
             (long long)st.active[CACHALOT_STAT_ALL].current, (long long)st.requested_bytes[CACHALOT_STAT_ALL].current,
             (long long)n, (long long)req);
  /* drop the pending ranges whose work may be done */
  int k = 0;
  for (int i = 0; i < r->n_pend; i++)
    if (r->pend[i].streams && r->pend[i].device_frees == st.num_device_free && r->pend[i].syncs == st.num_sync_all_streams)
      r->pend[k++] = r->pend[i];
  r->n_pend = k;
  /* no live range overlaps another, or memory still in use by a stream */
  for (int i = 0; i < RND_SLOTS; i++) {
    if (!r->live[i])
      continue;
    for (int j = 0; j < i; j++)
      if (r->live[j] && r->ptr[i] < r->ptr[j] + r->size[j] && r->ptr[j] < r->ptr[i] + r->size[i])
        fail_msg("op %d: slots %d and %d overlap", op, i, j);
    for (int j = 0; j < r->n_pend; j++)
      if (r->ptr[i] < r->pend[j].ptr + r->pend[j].size && r->pend[j].ptr < r->ptr[i] + r->size[i])
        fail_msg("op %d: slot %d reuses memory still pending on a stream", op, i);
  }
  for (int k2 = 0; k2 < 3; k2++) {
    const cachalot_stat *arrs[] = {st.allocation, st.allocated_bytes, st.active, st.active_bytes, st.requested_bytes,
                                   st.segment, st.reserved_bytes, st.inactive_split, st.inactive_split_bytes};
    for (size_t a = 0; a < sizeof arrs / sizeof arrs[0]; a++)
      if (arrs[a][k2].allocated - arrs[a][k2].freed != arrs[a][k2].current || arrs[a][k2].peak < arrs[a][k2].current)
        fail_msg("op %d: stat array %zu kind %d: allocated - freed != current or peak < current", op, a, k2);
  }
}

static void rnd_run(uint64_t seed, int ops) {
  static const char *confs[] = {
      "max_split_size_mb:40",
      "max_split_size_mb:20",
      "max_split_size_mb:18446744073709551615",
      "roundup_power2_divisions:4",
      "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
      "roundup_power2_divisions:1",
      "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
      "per_process_memory_fraction:1.0",
      "release_lock_on_cudamalloc:False",
      "release_lock_on_cudamalloc:True,max_non_split_rounding_mb:40",
  };
  rnd_state *r = calloc(1, sizeof *r);
  assert_non_null(r);
  r->rng = seed;
  r->e = ENV(1, 512 * MiB, "");
  r->st[0] = NULL;
  r->st[1] = STREAM(r->e.b, 0);
  r->st[2] = STREAM(r->e.b, 0);
  int ooms = 0;
  for (int op = 0; op < ops; op++) {
    unsigned what = rnd_below(r, 100);
    int slot = (int)rnd_below(r, RND_SLOTS);
    if (what < 45) { /* malloc into a free slot, or free a live one */
      if (!r->live[slot]) {
        size_t size = rnd_size(r);
        int si = (int)rnd_below(r, 3);
        void *p = (void *)(uintptr_t)0x1;
        cachalot_status rc = cachalot_malloc(r->e.a, 0, size, r->st[si], &p);
        if (rc == CACHALOT_OK) {
          assert_non_null(p);
          r->live[slot] = true;
          r->ptr[slot] = (uintptr_t)p;
          r->size[slot] = size;
          r->uses[slot] = 0;
          r->alloc_stream[slot] = si;
        } else if (rc == CACHALOT_ERROR_OUT_OF_MEMORY) {
          assert_null(p);
          ooms++;
        } else {
          fail_msg("op %d: malloc(%zu): %s: %s", op, size, cachalot_status_name(rc), cachalot_last_error());
        }
      } else {
        cachalot_device_stats st = STATS(r->e.a, 0);
        cachalot_status rc = cachalot_free(r->e.a, (void *)r->ptr[slot]);
        if (rc == CACHALOT_OK) {
          if (r->uses[slot] && r->n_pend < RND_PENDING)
            r->pend[r->n_pend++] = (rnd_pending){r->ptr[slot], r->size[slot], r->uses[slot], st.num_device_free,
                                                 st.num_sync_all_streams};
          r->live[slot] = false;
        } else if (rc != CACHALOT_ERROR_DEVICE || !r->uses[slot]) {
          fail_msg("op %d: free: %s: %s", op, cachalot_status_name(rc), cachalot_last_error());
        }
      }
    } else if (what < 60) { /* record_stream */
      if (r->live[slot]) {
        int si = (int)rnd_below(r, 3);
        OK(cachalot_record_stream(r->e.a, (void *)r->ptr[slot], r->st[si]));
        if (si != r->alloc_stream[slot])
          r->uses[slot] |= 1u << si;
      }
    } else if (what < 75) { /* complete a stream */
      int si = (int)rnd_below(r, 3);
      OK(cachalot_sim_stream_complete(r->e.b, r->st[si]));
      for (int i = 0; i < r->n_pend; i++)
        r->pend[i].streams &= ~(1u << si);
    } else if (what < 78) {
      OK(cachalot_empty_cache(r->e.a));
    } else if (what < 82) {
      OK(cachalot_set_settings(r->e.a, confs[rnd_below(r, sizeof confs / sizeof confs[0])]));
    } else if (what < 84) {
      static const double fr[] = {0.25, 0.5, 0.75, 1.0};
      OK(cachalot_set_memory_fraction(r->e.a, 0, fr[rnd_below(r, 4)]));
    } else if (what < 88) {
      OK(cachalot_sim_fail_device_allocs(r->e.b, (int)rnd_below(r, 4)));
    } else if (what < 90) {
      OK(cachalot_sim_fail_every(r->e.b, (int)rnd_below(r, 5)));
    } else if (what < 92) {
      OK(cachalot_sim_fail_events(r->e.b, (int)rnd_below(r, 3)));
    } else if (what < 93) {
      OK(cachalot_reset_peak_stats(r->e.a, 0));
    }
    rnd_verify(r, op);
  }
  OK(cachalot_sim_fail_device_allocs(r->e.b, 0));
  OK(cachalot_sim_fail_every(r->e.b, 0));
  OK(cachalot_sim_fail_events(r->e.b, 0));
  for (int i = 0; i < RND_SLOTS; i++)
    if (r->live[i]) {
      FREE(r->e.a, (void *)r->ptr[i]);
      r->live[i] = false;
    }
  for (int si = 0; si < 3; si++)
    COMPLETE(&r->e, r->st[si]);
  EMPTY(r->e.a);
  rnd_verify(r, ops);
  cachalot_device_stats st = STATS(r->e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(st.active[CACHALOT_STAT_ALL].current, 0);
  EQ(st.requested_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(USED(r->e.b, 0), 0);
  print_message("seed %llu: %d ops, %d failed mallocs, %lld device allocs, %lld device frees, %lld retries, "
                "%lld syncs, peak %lld blocks active\n",
                (unsigned long long)seed, ops, ooms, (long long)st.num_device_alloc, (long long)st.num_device_free,
                (long long)st.num_alloc_retries, (long long)st.num_sync_all_streams,
                (long long)st.active[CACHALOT_STAT_ALL].peak);
  assert_true(ooms > 0); /* the mix does reach the out-of-memory path */
  env_free(&r->e);
  free(r);
}

static void test_random_ops_with_faults(void **state) {
  (void)state;
  static const uint64_t seeds[] = {0x9E3779B97F4A7C15ull, 12345, 0xC0FFEEull, 777};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
    rnd_run(seeds[i], 20000);
}

/* A device free can fail (here: the simulated device refuses frees while a global-mode capture is
 * underway, as cudaFree does). The segment must stay cached and counted, never be dropped from the books
 * while the device still holds it. */
static void test_failed_device_free_keeps_segment(void **state) {
  (void)state;
  env e = ENV(1, 80 * MiB, "");
  cachalot_stream s = STREAM(e.b, 0), s2 = STREAM(e.b, 0), cap = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 40 * MiB, s);
  FREE(e.a, p);
  OK(cachalot_sim_capture_begin(e.b, cap, CACHALOT_CAPTURE_GLOBAL));

  /* empty_cache: the free fails, the status says so, the segment stays */
  STATUS(cachalot_empty_cache(e.a), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "operation not permitted when stream is capturing");
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 40 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);

  /* step 7 under the capture: on another stream 30 MiB more fits beside the cached 40 MiB; 50 MiB does
   * not, the release of the cached segment fails, and the call is an OOM that loses nothing */
  void *q = ALLOC(e.a, 0, 30 * MiB, s2);
  void *r = NULL;
  STATUS(cachalot_malloc(e.a, 0, 50 * MiB, s2, &r), CACHALOT_ERROR_OUT_OF_MEMORY);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 1, 1, 2);
  assert_null(r);
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 30 * MiB, .active = 1, .active_b = 30 * MiB, .req_b = 30 * MiB, .seg = 2,
                  .res_b = 70 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);

  /* after the capture the cached segment serves a request again, and frees work */
  OK(cachalot_sim_capture_end(e.b, cap));
  void *t = ALLOC(e.a, 0, 40 * MiB, s);
  assert_ptr_equal(t, p);
  FREE(e.a, t);
  FREE(e.a, q);
  EMPTY(e.a);
  CHECK(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* ---- a campaign: one device failure at every malloc of a long sequence, in several configs ----
 * The sequence (seeded) mixes mallocs of both kinds on three streams, frees, record_stream, stream
 * completion, empty_cache and private-pool routing during simulated captures (mallocs on the capturing
 * stream go to the capture's pool; during a capture the release-all retry is skipped, so a failure there
 * is an OOM). For each malloc step k the sequence runs from the start with the next device allocation
 * (a segment, or a page map with expandable segments) made to fail at step k. After every step: the
 * failing call reported OUT_OF_MEMORY with the OOM message, cachalot_check passes, live allocations do
 * not overlap and are all counted, and reserved_bytes equals the device's own count; at the end
 * everything goes back. */
enum { CAMP_OPS = 120, CAMP_SLOTS = 24 };

typedef struct {
  int op; /* 0 malloc, 1 free, 2 record, 3 complete, 4 empty_cache, 5 capture begin, 6 capture end */
  int slot, stream;
  size_t size;
} camp_step;

static cachalot_stream camp_capture;
static bool camp_filter(cachalot_stream s, void *ctx) {
  (void)ctx;
  return s == camp_capture;
}

static void camp_script(uint64_t seed, camp_step *out) {
  uint64_t x = seed;
  for (int i = 0; i < CAMP_OPS; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const unsigned k = (unsigned)(x % 100);
    camp_step st = {0, (int)((x >> 8) % CAMP_SLOTS), (int)((x >> 16) % 3), 0};
    if (k < 50) {
      st.op = 0;
      st.size = (x >> 24) % 3 == 0 ? 1 + (x >> 30) % (1 * MiB) : 1 + (x >> 30) % (30 * MiB);
    } else if (k < 72) {
      st.op = 1;
    } else if (k < 80) {
      st.op = 2;
    } else if (k < 88) {
      st.op = 3;
    } else if (k < 91) {
      st.op = 4;
    } else if (k < 96) {
      st.op = 5;
    } else {
      st.op = 6;
    }
    out[i] = st;
  }
}

/* Runs the script; fails the next device allocation at malloc step `fail_at` (-1: none). Returns how many
 * device allocations (segments or maps) the run made. */
static int64_t camp_run(const camp_step *script, const char *conf, int fail_at, int64_t *ooms,
                        int64_t *event_failures, int break_capture_at, int64_t *broken) {
  env e = ENV(1, 256 * MiB, conf);
  cachalot_stream st[3] = {NULL, STREAM(e.b, 0), STREAM(e.b, 0)};
  camp_capture = st[1];
  void *ptr[CAMP_SLOTS] = {0};
  size_t size[CAMP_SLOTS] = {0};
  bool capturing = false;
  bool capture_broken = false;
  uint64_t next_id = 1;
  cachalot_mempool_id pools[CAMP_OPS];
  int n_pools = 0;
  for (int i = 0; i < CAMP_OPS; i++) {
    const camp_step *s = &script[i];
    if (i == break_capture_at && capturing) {
      /* the capture breaks: a synchronization of the capturing stream invalidates it, as on CUDA */
      STATUS(e.b->ops->stream_sync(e.b, 0, st[1]), CACHALOT_ERROR_DEVICE);
      capture_broken = true;
      (*broken)++;
    }
    switch (s->op) {
    case 0: {
      if (ptr[s->slot])
        break;
      if (i == fail_at)
        OK(cachalot_sim_fail_device_allocs(e.b, 2)); /* the first attempt and the retry */
      void *p = (void *)1;
      cachalot_status rc = cachalot_malloc(e.a, 0, s->size, st[s->stream], &p);
      OK(cachalot_sim_fail_device_allocs(e.b, 0));
      if (rc == CACHALOT_OK) {
        ptr[s->slot] = p;
        size[s->slot] = s->size;
      } else {
        if (rc != CACHALOT_ERROR_OUT_OF_MEMORY)
          fail_msg("%s, step %d (fail at %d): malloc(%zu): %s: %s", conf, i, fail_at, s->size,
                   cachalot_status_name(rc), cachalot_last_error());
        assert_null(p);
        CONTAINS(cachalot_last_error(), "out of memory");
      }
      break;
    }
    case 1:
      if (ptr[s->slot]) {
        if (i == fail_at)
          OK(cachalot_sim_fail_events(e.b, 1)); /* the event of a block used by another stream */
        cachalot_status rc = cachalot_free(e.a, ptr[s->slot]);
        OK(cachalot_sim_fail_events(e.b, 0));
        if (rc == CACHALOT_OK) {
          ptr[s->slot] = NULL;
        } else { /* the block stays allocated and can be freed again */
          if (rc != CACHALOT_ERROR_DEVICE || i != fail_at)
            fail_msg("%s, step %d (fail at %d): free: %s: %s", conf, i, fail_at, cachalot_status_name(rc),
                     cachalot_last_error());
          CONTAINS(cachalot_last_error(), "cachalot_free");
          (*event_failures)++;
        }
      }
      break;
    case 2:
      if (ptr[s->slot])
        RECORD(e.a, ptr[s->slot], st[s->stream]);
      break;
    case 3:
      if (!(capturing && s->stream == 1))
        COMPLETE(&e, st[s->stream]);
      break;
    case 4:
      STATUS(cachalot_empty_cache(e.a), CACHALOT_OK); /* during a capture it does nothing */
      break;
    case 5:
      if (!capturing) {
        OK(cachalot_sim_capture_begin(e.b, st[1], CACHALOT_CAPTURE_GLOBAL));
        pools[n_pools] = (cachalot_mempool_id){0, next_id++};
        OK(cachalot_begin_allocate_to_pool(e.a, 0, pools[n_pools++], camp_filter, NULL));
        capturing = true;
      }
      break;
    default:
      if (capturing) {
        OK(cachalot_end_allocate_to_pool(e.a, 0, pools[n_pools - 1]));
        /* a broken capture ends with an error and no graph; the allocator is unaffected */
        STATUS(cachalot_sim_capture_end(e.b, st[1]), capture_broken ? CACHALOT_ERROR_DEVICE : CACHALOT_OK);
        capturing = capture_broken = false;
      }
      break;
    }
    CHECK(e.a);
    EXPECT_RESERVED_IS_USED(&e, 0);
    int64_t live = 0;
    for (int a = 0; a < CAMP_SLOTS; a++) {
      if (!ptr[a])
        continue;
      live++;
      for (int b = 0; b < a; b++)
        if (ptr[b] && (char *)ptr[a] < (char *)ptr[b] + size[b] && (char *)ptr[b] < (char *)ptr[a] + size[a])
          fail_msg("%s, step %d (fail at %d): slots %d and %d overlap", conf, i, fail_at, a, b);
    }
    EQ(STATS(e.a, 0).allocation[CACHALOT_STAT_ALL].current, live);
  }
  if (capturing) {
    OK(cachalot_end_allocate_to_pool(e.a, 0, pools[n_pools - 1]));
    const cachalot_status ended = cachalot_sim_capture_end(e.b, st[1]); /* broken or not */
    assert_true(ended == CACHALOT_OK || ended == CACHALOT_ERROR_DEVICE);
  }
  for (int a = 0; a < CAMP_SLOTS; a++)
    if (ptr[a])
      FREE(e.a, ptr[a]);
  for (int k = 0; k < n_pools; k++)
    OK(cachalot_release_pool(e.a, 0, pools[k]));
  for (int k = 1; k < 3; k++)
    COMPLETE(&e, st[k]);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  const int64_t device_allocs = STATS(e.a, 0).num_device_alloc;
  *ooms = STATS(e.a, 0).num_ooms;
  env_free(&e);
  return device_allocs;
}

static void test_campaign_every_malloc(void **state) {
  (void)state;
  static const char *confs[] = {"", "expandable_segments:True", "preset:low_fragmentation",
                                "max_split_size_mb:20,garbage_collection_threshold:0.5,per_process_memory_fraction:0.9"};
  camp_step script[CAMP_OPS];
  int64_t total_event_failures = 0, total_broken = 0;
  for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
    camp_script(0x5DEECE66Dull * (c + 1), script);
    int64_t ooms = 0, failed_runs = 0, event_failures = 0, broken = 0;
    EQ(camp_run(script, confs[c], -1, &ooms, &event_failures, -1, &broken) > 0, 1);
    const int64_t base_ooms = ooms; /* the sequence's own, without injection */
    int runs = 0, free_runs = 0;
    for (int k = 0; k < CAMP_OPS; k++) {
      if (script[k].op == 0) {
        (void)camp_run(script, confs[c], k, &ooms, &event_failures, -1, &broken);
        failed_runs += ooms > base_ooms;
        runs++;
      } else if (script[k].op == 1) {
        (void)camp_run(script, confs[c], k, &ooms, &event_failures, -1, &broken);
        free_runs++;
      }
      (void)camp_run(script, confs[c], -1, &ooms, &event_failures, k, &broken); /* the capture breaks at k */
    }
    total_broken += broken;
    print_message("%s: %d runs with a device failure, %lld of them reported; %d with an event failure at a free, "
                  "%lld reported\n", confs[c][0] ? confs[c] : "defaults", runs, (long long)failed_runs, free_runs,
                  (long long)event_failures);
    EQ(runs > 30, 1);
    EQ(failed_runs >= 8, 1); /* the injection does reach the device at many steps */
    total_event_failures += event_failures;
  }
  EQ(total_event_failures >= 1, 1); /* the event injection reaches a free of a block another stream used */
  print_message("captures broken at some step: %lld runs\n", (long long)total_broken);
  EQ(total_broken >= 20, 1);
}

/* ---- the pinned-host cache (include/cachalot/host.h) under injected pinning and event failures ----
 * A small model of the cache says, after every step, exactly which block a malloc gets (the most recently
 * freed free block of its power of two, else a new pinning), how many blocks and bytes are pinned and of
 * which kind, and how many pinnings and unpinnings were made. A failed pinning gives the free blocks back
 * and tries once more; giving back a block of cudaHostAlloc's kind synchronizes the device (the simulated
 * one completes every stream), cudaHostUnregister does not. */
enum { HM_BLOCKS = 160, HM_REFS = 3 }; /* refs: device 0's default stream, two streams of device 0 */

typedef enum { HB_GONE, HB_ALLOCATED, HB_WAITING, HB_FREE } hb_state;

typedef struct {
  char *ptr;
  size_t size;
  bool registered;
  hb_state state;
  unsigned marks;          /* refs record_event named since it was handed out */
  uint64_t need[HM_REFS];  /* WAITING: reusable once epoch[r] > need[r] for every r it was marked with */
  unsigned waits;          /* WAITING: the marks it was freed with */
  uint64_t stamp;          /* WAITING: when freed; FREE: when it joined its free list */
} hblock;

typedef struct {
  hblock b[HM_BLOCKS];
  int n;
  uint64_t epoch[HM_REFS]; /* completions of each ref so far */
  uint64_t clock;
  bool registered;         /* how the next pinning is made */
  int pin_fails;           /* injected pinning failures left, as the simulated backend counts them */
  int64_t pins, unpins;
} hmodel;

static size_t hm_round(size_t n) {
  size_t r = 1;
  while (r < n)
    r <<= 1;
  return r;
}

/* The cache polls the events of waiting blocks (at malloc and empty_cache): those whose streams are done
 * join their free lists in the order they were freed, so the last of them is the first reused. */
static void hm_process(hmodel *m) {
  for (;;) {
    int next = -1;
    for (int i = 0; i < m->n; i++) {
      const hblock *b = &m->b[i];
      if (b->state != HB_WAITING || (next >= 0 && b->stamp > m->b[next].stamp))
        continue;
      bool done = true;
      for (int r = 0; r < HM_REFS; r++)
        if ((b->waits >> r & 1) && m->epoch[r] <= b->need[r])
          done = false;
      if (done)
        next = i;
    }
    if (next < 0)
      return;
    m->b[next].state = HB_FREE;
    m->b[next].stamp = ++m->clock;
  }
}

static int hm_head(const hmodel *m, size_t size) {
  int head = -1;
  for (int i = 0; i < m->n; i++)
    if (m->b[i].state == HB_FREE && m->b[i].size == size && (head < 0 || m->b[i].stamp > m->b[head].stamp))
      head = i;
  return head;
}

/* Gives every free block back; returns how many. */
static int hm_release_free(hmodel *m) {
  int n = 0;
  bool synced = false;
  for (int i = 0; i < m->n; i++)
    if (m->b[i].state == HB_FREE) {
      m->b[i].state = HB_GONE;
      synced |= !m->b[i].registered;
      n++;
    }
  m->unpins += n;
  if (synced) /* cudaFreeHost synchronizes the device */
    for (int r = 0; r < HM_REFS; r++)
      m->epoch[r]++;
  return n;
}

static bool hm_pin_fails(hmodel *m) {
  if (m->pin_fails <= 0)
    return false;
  m->pin_fails--;
  return true;
}

/* The model's malloc of `req` bytes: the block it hands out (-1: a new pinning, -2: out of memory). */
static int hm_malloc(hmodel *m, size_t req, int *released) {
  const size_t size = hm_round(req);
  *released = 0;
  hm_process(m);
  const int head = hm_head(m, size);
  if (head >= 0) {
    m->b[head].state = HB_ALLOCATED;
    m->b[head].marks = 0;
    return head;
  }
  if (hm_pin_fails(m)) {
    hm_process(m);
    *released = hm_release_free(m);
    if (*released == 0 || hm_pin_fails(m))
      return -2;
  }
  return -1;
}

static int hm_find(const hmodel *m, const void *p) {
  for (int i = 0; i < m->n; i++)
    if (m->b[i].state != HB_GONE && m->b[i].ptr == p)
      return i;
  return -1;
}

/* Expected stats and pinned bytes, from the model. */
static void hm_expect_(const hmodel *m, env *e, const char *file, int line) {
  int64_t blocks = 0, bytes = 0, active = 0, active_b = 0;
  size_t pinned[2] = {0, 0};
  for (int i = 0; i < m->n; i++) {
    const hblock *b = &m->b[i];
    if (b->state == HB_GONE)
      continue;
    blocks++;
    bytes += (int64_t)b->size;
    pinned[b->registered] += b->size;
    if (b->state == HB_ALLOCATED) {
      active++;
      active_b += (int64_t)b->size;
    }
  }
  cachalot_host_stats s;
  status_is_(cachalot_host_memory_stats(e->a, &s), CACHALOT_OK, "cachalot_host_memory_stats", file, line);
  eq_i64_(s.allocations.current, blocks, "host allocations.current", file, line);
  eq_i64_(s.allocated_bytes.current, bytes, "host allocated_bytes.current", file, line);
  eq_i64_(s.active_requests.current, active, "host active_requests.current", file, line);
  eq_i64_(s.active_bytes.current, active_b, "host active_bytes.current", file, line);
  eq_i64_(s.num_host_alloc, m->pins, "num_host_alloc", file, line);
  eq_i64_(s.num_host_free, m->unpins, "num_host_free", file, line);
  eq_i64_(s.host_alloc_time.count, m->pins, "host_alloc_time.count", file, line);
  eq_i64_(s.host_free_time.count, m->unpins, "host_free_time.count", file, line);
  size_t by_alloc = 1, by_register = 1;
  status_is_(cachalot_sim_host_pinned(e->b, &by_alloc, &by_register), CACHALOT_OK, "cachalot_sim_host_pinned", file,
             line);
  eq_i64_((int64_t)by_alloc, (int64_t)pinned[0], "pinned bytes of cudaHostAlloc's kind", file, line);
  eq_i64_((int64_t)by_register, (int64_t)pinned[1], "pinned bytes of cudaHostRegister's kind", file, line);
  check_(e->a, file, line);
}
#define HM_EXPECT(m, e) hm_expect_((m), (e), __FILE__, __LINE__)

/* A seeded sequence of host-cache calls, replayed with one fault injected at one step. */
enum { HC_OPS = 120, HC_SLOTS = 6 };
enum { HC_MALLOC, HC_FREE, HC_RECORD, HC_COMPLETE, HC_LAUNCH, HC_EMPTY, HC_TOGGLE };

typedef struct {
  int op, slot, ref;
  size_t size;
} hc_step;

static void hc_script(uint64_t seed, hc_step *out) {
  /* few sizes, so that freed blocks are asked for again: 1 B, 128 B, 4 KiB, 8 KiB, 64 KiB, 2 MiB blocks */
  static const size_t sizes[] = {1, 100, 3000, 4096, 5 * KiB, 64 * KiB, MiB + 1};
  uint64_t x = seed;
  for (int i = 0; i < HC_OPS; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const unsigned k = (unsigned)(x % 100);
    hc_step st = {HC_MALLOC, (int)((x >> 8) % HC_SLOTS), (int)((x >> 16) % HM_REFS),
                  sizes[(x >> 24) % (sizeof sizes / sizeof sizes[0])]};
    st.op = k < 36   ? HC_MALLOC
            : k < 58 ? HC_FREE
            : k < 78 ? HC_RECORD
            : k < 88 ? HC_COMPLETE
            : k < 93 ? HC_LAUNCH
            : k < 97 ? HC_EMPTY
                     : HC_TOGGLE;
    out[i] = st;
  }
}

typedef struct {
  int64_t ooms, retried, event_failures;
} hc_counts;

typedef enum { HC_NO_FAULT, HC_PIN_ONCE, HC_PIN_TWICE, HC_EVENT } hc_fault;

/* The tag a live slot's block carries at both ends of its request. */
static unsigned char hc_tag(int slot) { return (unsigned char)(0x61 + slot); }

/* Runs the script in config `conf`, with `fault` injected just before step `at`; the model checks every
 * step. `toggle`: HC_TOGGLE steps switch the pinning way at run time (else they do nothing). */
static void hc_run(const hc_step *script, const char *conf, bool toggle, hc_fault fault, int at, hc_counts *n) {
  env e = ENV(1, 0, conf);
  cachalot_stream st[HM_REFS] = {NULL, STREAM(e.b, 0), STREAM(e.b, 0)};
  hmodel *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->registered = strstr(conf, "pinned_use_cuda_host_register:True") != NULL;
  char *ptr[HC_SLOTS] = {0};
  size_t req[HC_SLOTS] = {0};
  for (int i = 0; i < HC_OPS; i++) {
    const hc_step *s = &script[i];
    if (i == at && fault == HC_PIN_ONCE) {
      OK(cachalot_sim_fail_host_pins(e.b, 1));
      m->pin_fails = 1;
    } else if (i == at && fault == HC_PIN_TWICE) {
      OK(cachalot_sim_fail_host_pins(e.b, 2));
      m->pin_fails = 2;
    } else if (i == at && fault == HC_EVENT) {
      OK(cachalot_sim_fail_events(e.b, 1));
    }
    switch (s->op) {
    case HC_MALLOC: {
      if (ptr[s->slot])
        break;
      int released = 0;
      const int64_t unpins_before = m->unpins;
      const int want = hm_malloc(m, s->size, &released);
      void *p = (void *)(uintptr_t)0x1;
      const cachalot_status rc = cachalot_host_malloc(e.a, s->size, &p);
      if (want == -2) {
        if (rc != CACHALOT_ERROR_OUT_OF_MEMORY)
          fail_msg("'%s', step %d (fault %d at %d): host_malloc(%zu) returned %s, the model says out of memory",
                   conf, i, (int)fault, at, s->size, cachalot_status_name(rc));
        assert_null(p);
        CONTAINS(cachalot_last_error(), "cachalot_host_malloc: pinning ");
        CONTAINS(cachalot_last_error(), m->registered ? "injected host register failure"
                                                      : "injected host allocation failure");
        n->ooms++;
        break;
      }
      if (rc != CACHALOT_OK)
        fail_msg("'%s', step %d (fault %d at %d): host_malloc(%zu): %s: %s", conf, i, (int)fault, at, s->size,
                 cachalot_status_name(rc), cachalot_last_error());
      if (want >= 0 && p != m->b[want].ptr)
        fail_msg("'%s', step %d: host_malloc(%zu) gave %p, the model the free block %p", conf, i, s->size, p,
                 (void *)m->b[want].ptr);
      if (want == -1) {
        if (hm_find(m, p) >= 0)
          fail_msg("'%s', step %d: a new pinning at %p, a block the cache still holds", conf, i, p);
        assert_true(m->n < HM_BLOCKS);
        m->b[m->n++] = (hblock){.ptr = p, .size = hm_round(s->size), .registered = m->registered,
                                .state = HB_ALLOCATED};
        m->pins++;
        n->retried += m->unpins > unpins_before;
      }
      ptr[s->slot] = p;
      req[s->slot] = s->size;
      ptr[s->slot][0] = (char)hc_tag(s->slot);
      ptr[s->slot][s->size - 1] = (char)hc_tag(s->slot);
      break;
    }
    case HC_FREE: {
      if (!ptr[s->slot])
        break;
      hblock *b = &m->b[hm_find(m, ptr[s->slot])];
      const bool fails = i == at && fault == HC_EVENT && b->marks;
      const cachalot_status rc = cachalot_host_free(e.a, ptr[s->slot]);
      if (fails) { /* the block stays allocated, marked; nothing else changes */
        STATUS(rc, CACHALOT_ERROR_DEVICE);
        CONTAINS(cachalot_last_error(), "cachalot_host_free: recording an event on stream");
        CONTAINS(cachalot_last_error(), "injected event failure");
        n->event_failures++;
        break;
      }
      OK(rc);
      if (b->marks) {
        b->state = HB_WAITING;
        b->waits = b->marks;
        for (int r = 0; r < HM_REFS; r++)
          b->need[r] = m->epoch[r];
      } else {
        b->state = HB_FREE;
      }
      b->marks = 0;
      b->stamp = ++m->clock;
      ptr[s->slot] = NULL;
      break;
    }
    case HC_RECORD:
      if (ptr[s->slot]) {
        OK(cachalot_host_record_event(e.a, ptr[s->slot], 0, st[s->ref]));
        m->b[hm_find(m, ptr[s->slot])].marks |= 1u << s->ref;
      }
      break;
    case HC_COMPLETE:
      OK(cachalot_sim_stream_complete(e.b, st[s->ref]));
      m->epoch[s->ref]++;
      break;
    case HC_LAUNCH: /* work that a later event waits for; a free's event waits either way */
      OK(cachalot_sim_launch(e.b, st[s->ref]));
      break;
    case HC_EMPTY:
      OK(cachalot_host_empty_cache(e.a));
      hm_process(m);
      (void)hm_release_free(m);
      break;
    default:
      if (toggle) {
        m->registered = !m->registered;
        OK(cachalot_set_settings(e.a, m->registered ? "pinned_use_cuda_host_register:True"
                                                    : "pinned_use_cuda_host_register:False"));
      }
      break;
    }
    if (i == at) { /* the fault was for this step only */
      OK(cachalot_sim_fail_host_pins(e.b, 0));
      OK(cachalot_sim_fail_events(e.b, 0));
      m->pin_fails = 0;
    }
    HM_EXPECT(m, &e);
    for (int k = 0; k < HC_SLOTS; k++)
      if (ptr[k] && ((unsigned char)ptr[k][0] != hc_tag(k) || (unsigned char)ptr[k][req[k] - 1] != hc_tag(k)))
        fail_msg("'%s', step %d (fault %d at %d): slot %d's block was written by someone else", conf, i, (int)fault,
                 at, k);
  }
  /* after the faults the cache works: everything goes back, then new blocks are pinned and reused */
  for (int k = 0; k < HC_SLOTS; k++)
    if (ptr[k]) {
      OK(cachalot_host_free(e.a, ptr[k]));
      m->b[hm_find(m, ptr[k])].state = HB_FREE;
    }
  OK(cachalot_sim_stream_complete(e.b, NULL));
  for (int r = 1; r < HM_REFS; r++)
    OK(cachalot_sim_stream_complete(e.b, st[r]));
  OK(cachalot_host_empty_cache(e.a));
  for (int i = 0; i < m->n; i++)
    if (m->b[i].state != HB_GONE) {
      m->b[i].state = HB_GONE;
      m->unpins++;
    }
  HM_EXPECT(m, &e);
  EQ(m->pins, m->unpins);
  char *p1 = NULL, *p2 = NULL;
  OK(cachalot_host_malloc(e.a, 3 * KiB, (void **)&p1));
  memset(p1, 0x5a, 3 * KiB);
  OK(cachalot_host_free(e.a, p1));
  OK(cachalot_host_malloc(e.a, 4 * KiB, (void **)&p2));
  assert_ptr_equal(p2, p1);
  OK(cachalot_host_free(e.a, p2));
  CHECK(e.a);
  free(m);
  env_free(&e);
}

static void test_host_campaign(void **state) {
  (void)state;
  static const struct {
    const char *conf;
    bool toggle;
  } confs[] = {{"", false},
               {"pinned_use_cuda_host_register:True", false},
               {"pinned_use_cuda_host_register:True,pinned_num_register_threads:4", false},
               {"pinned_num_register_threads:2", true}};
  hc_step script[HC_OPS];
  for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
    hc_script(0x2545F4914F6CDD1Dull * (c + 3), script);
    hc_counts n = {0}, base = {0};
    hc_run(script, confs[c].conf, confs[c].toggle, HC_NO_FAULT, -1, &base);
    EQ(base.ooms, 0);
    int runs = 0;
    for (int k = 0; k < HC_OPS; k++) {
      if (script[k].op == HC_MALLOC) {
        hc_run(script, confs[c].conf, confs[c].toggle, HC_PIN_ONCE, k, &n);
        hc_run(script, confs[c].conf, confs[c].toggle, HC_PIN_TWICE, k, &n);
        runs += 2;
      } else if (script[k].op == HC_FREE) {
        hc_run(script, confs[c].conf, confs[c].toggle, HC_EVENT, k, &n);
        runs++;
      }
    }
    print_message("host cache, %s%s: %d runs with a fault: %lld mallocs out of memory, %lld pinned after giving "
                  "free blocks back, %lld frees refused\n", confs[c].conf[0] ? confs[c].conf : "defaults",
                  confs[c].toggle ? " (the pinning way toggled)" : "", runs, (long long)n.ooms,
                  (long long)n.retried, (long long)n.event_failures);
    /* each outcome is reached: the faults bite where the cache pins and where a marked block is freed */
    EQ(n.ooms >= 5, 1);
    EQ(n.retried >= 3, 1);
    EQ(n.event_failures >= 3, 1);
  }
}

/* A block freed while a stream it is marked with is being captured: no event is recorded (it would stand
 * for the graph, and CUDA refuses to query such an event); the block is kept, never reused and never
 * given back but by destroy, since the graph may copy from it at every replay. */
static void test_host_free_during_capture_keeps(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  char *p = NULL;
  OK(cachalot_host_malloc(e.a, 4 * KiB, (void **)&p));
  OK(cachalot_host_record_event(e.a, p, 0, s1));
  OK(cachalot_host_record_event(e.a, p, 0, s2));
  OK(cachalot_sim_capture_begin(e.b, s2, CACHALOT_CAPTURE_RELAXED));
  uint64_t n1 = 0, m1 = 0;
  OK(cachalot_sim_stream_submitted(e.b, s1, &n1));
  OK(cachalot_host_free(e.a, p));
  CHECK(e.a);
  OK(cachalot_sim_stream_submitted(e.b, s1, &m1));
  EQ(m1, n1); /* no event on s1 either: the block waits for nothing, it is kept */
  cachalot_host_stats st;
  OK(cachalot_host_memory_stats(e.a, &st));
  EQ(st.allocations.current, 1);
  EQ(st.active_requests.current, 0);
  EQ(st.active_bytes.current, 0);
  STATUS(cachalot_host_free(e.a, p), CACHALOT_ERROR_INVALID_POINTER); /* freed already */
  STATUS(cachalot_host_record_event(e.a, p, 0, s1), CACHALOT_ERROR_INVALID_POINTER);
  OK(cachalot_sim_capture_end(e.b, s2));
  OK(cachalot_sim_stream_complete(e.b, s1));
  OK(cachalot_sim_stream_complete(e.b, s2));
  char *q = NULL;
  OK(cachalot_host_malloc(e.a, 4 * KiB, (void **)&q)); /* never p */
  assert_true(q != p);
  OK(cachalot_host_free(e.a, q));
  OK(cachalot_host_empty_cache(e.a)); /* q goes back, p stays */
  CHECK(e.a);
  size_t pa = 0, pr = 0;
  OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
  EQ(pa, 4 * KiB);
  OK(cachalot_host_memory_stats(e.a, &st));
  EQ(st.allocations.current, 1);
  EQ(st.num_host_free, 1);
  env_free(&e); /* destroy gives p back (ASan: nothing leaked) */
}

/* Pinning while a stream captures in global mode (CUDA refuses cudaHostAlloc and cudaHostRegister then,
 * and the refusal invalidates the capture): the cache pins in relaxed mode, both ways, and the capture
 * ends with its graph. The thread's own mode is global again afterwards: a device call the capture
 * forbids is still refused. */
static void test_host_pin_during_global_capture(void **state) {
  (void)state;
  static const char *const confs[] = {"", "pinned_use_cuda_host_register:True"};
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
    env e = ENV(1, 0, confs[i]);
    cachalot_stream s = STREAM(e.b, 0);
    OK(cachalot_sim_capture_begin(e.b, s, CACHALOT_CAPTURE_GLOBAL));
    char *p = NULL, *q = NULL;
    OK(cachalot_host_malloc(e.a, 32, (void **)&p));
    OK(cachalot_host_malloc(e.a, 64 * KiB, (void **)&q));
    CHECK(e.a);
    p[0] = q[0] = 1;
    cachalot_host_stats st;
    OK(cachalot_host_memory_stats(e.a, &st));
    EQ(st.num_host_alloc, 2);
    EQ(st.allocations.current, 2);
    size_t pa = 0, pr = 0;
    OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
    EQ(i == 0 ? pa : pr, st.allocated_bytes.current);
    EQ(i == 0 ? pr : pa, 0);
    cachalot_backend *b = e.b; /* the capture still forbids this thread's own unsafe calls */
    void *dev = NULL;
    STATUS(b->ops->alloc(b, 0, 1 << 20, &dev), CACHALOT_ERROR_DEVICE);
    OK(cachalot_sim_capture_end(e.b, s));
    OK(cachalot_host_free(e.a, p));
    OK(cachalot_host_free(e.a, q));
    CHECK(e.a);
    env_free(&e);
  }
}

static void test_host_pin_failures_both_ways(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  size_t pa = 0, pr = 0;
  char *a = NULL, *b = NULL, *c = NULL, *d = NULL, *x = NULL;
  OK(cachalot_host_malloc(e.a, 8 * KiB, (void **)&a)); /* cudaHostAlloc's kind */
  OK(cachalot_set_settings(e.a, "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"));
  OK(cachalot_host_malloc(e.a, 64 * KiB, (void **)&b)); /* registered, 16 pages touched by 4 threads */
  OK(cachalot_host_malloc(e.a, 100, (void **)&c));      /* registered, 128 B */
  OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
  EQ(pa, 8 * KiB);
  EQ(pr, 64 * KiB + 128);
  OK(cachalot_host_free(e.a, a));
  OK(cachalot_host_free(e.a, b));
  CHECK(e.a);
  /* one failure: a and b go back, each its own way; the 1 MiB block is registered at the retry */
  OK(cachalot_sim_fail_host_pins(e.b, 1));
  OK(cachalot_host_malloc(e.a, MiB, (void **)&d));
  OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
  EQ(pa, 0);
  EQ(pr, MiB + 128);
  cachalot_host_stats s;
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.current, 2);
  EQ(s.allocated_bytes.current, MiB + 128);
  EQ(s.active_requests.current, 2);
  EQ(s.num_host_alloc, 4);
  EQ(s.num_host_free, 2);
  CHECK(e.a);
  /* two failures with c freed: c goes back, the call fails, d stays */
  OK(cachalot_host_free(e.a, c));
  OK(cachalot_sim_fail_host_pins(e.b, 2));
  x = (char *)(uintptr_t)0x1;
  STATUS(cachalot_host_malloc(e.a, 2 * MiB, (void **)&x), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(x);
  CONTAINS(cachalot_last_error(), "cachalot_host_malloc: pinning 2097152 bytes: injected host register failure");
  OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
  EQ(pa, 0);
  EQ(pr, MiB);
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.current, 1);
  EQ(s.allocated_bytes.current, MiB);
  EQ(s.num_host_alloc, 4);
  EQ(s.num_host_free, 3);
  CHECK(e.a);
  /* nothing cached: one try, one injected failure left over for the next pinning */
  OK(cachalot_set_settings(e.a, "pinned_use_cuda_host_register:False"));
  OK(cachalot_sim_fail_host_pins(e.b, 2));
  STATUS(cachalot_host_malloc(e.a, 2 * MiB, (void **)&x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "injected host allocation failure");
  STATUS(cachalot_host_malloc(e.a, 2 * MiB, (void **)&x), CACHALOT_ERROR_OUT_OF_MEMORY);
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.num_host_alloc, 4);
  EQ(s.num_host_free, 3);
  CHECK(e.a);
  /* the faults stopped: pinning and reuse work again */
  OK(cachalot_host_malloc(e.a, 2 * MiB, (void **)&x));
  memset(x, 0x3c, 2 * MiB);
  OK(cachalot_host_free(e.a, x));
  char *y = NULL;
  OK(cachalot_host_malloc(e.a, 2 * MiB - 1, (void **)&y));
  assert_ptr_equal(y, x);
  OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
  EQ(pa, 2 * MiB);
  EQ(pr, MiB);
  OK(cachalot_host_free(e.a, y));
  OK(cachalot_host_free(e.a, d));
  OK(cachalot_host_empty_cache(e.a));
  OK(cachalot_sim_host_pinned(e.b, &pa, &pr));
  EQ(pa + pr, 0);
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.current, 0);
  EQ(s.num_host_alloc, 5);
  EQ(s.num_host_free, 5);
  CHECK(e.a);
  env_free(&e);
}

/* cudaFreeHost refused (the simulated device refuses it during a global capture, as CUDA refuses calls that
 * would synchronize a capturing device): empty_cache reports it and the blocks stay cached, pinned and
 * counted, reusable; a failed pinning's give-back is refused the same way and the retry still pins; after
 * the capture everything goes back. */
static void test_host_unpin_refused(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream cap = STREAM(e.b, 0);
  hmodel *m = calloc(1, sizeof *m);
  assert_non_null(m);
  char *p = NULL, *q = NULL, *r = NULL;
  OK(cachalot_host_malloc(e.a, 4 * KiB, (void **)&p));
  OK(cachalot_host_malloc(e.a, 8 * KiB, (void **)&q));
  OK(cachalot_host_free(e.a, p));
  OK(cachalot_host_free(e.a, q));
  m->b[m->n++] = (hblock){.ptr = p, .size = 4 * KiB, .state = HB_FREE};
  m->b[m->n++] = (hblock){.ptr = q, .size = 8 * KiB, .state = HB_FREE};
  m->pins = 2;
  OK(cachalot_sim_capture_begin(e.b, cap, CACHALOT_CAPTURE_GLOBAL));
  STATUS(cachalot_host_empty_cache(e.a), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "cachalot_host_empty_cache: ");
  HM_EXPECT(m, &e);
  cachalot_host_stats s;
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.allocated, 2); /* a refused give-back counts nothing: no pinning, no unpinning */
  EQ(s.allocations.freed, 0);
  EQ(s.allocated_bytes.allocated, 12 * KiB);
  EQ(s.allocated_bytes.freed, 0);
  OK(cachalot_host_malloc(e.a, 4 * KiB, (void **)&r)); /* still cached: reused */
  assert_ptr_equal(r, p);
  m->b[0].state = HB_ALLOCATED;
  HM_EXPECT(m, &e);
  /* a failed pinning: q's give-back is refused, q stays cached, the retry pins */
  OK(cachalot_sim_fail_host_pins(e.b, 1));
  char *t = NULL;
  OK(cachalot_host_malloc(e.a, 16 * KiB, (void **)&t));
  m->b[m->n++] = (hblock){.ptr = t, .size = 16 * KiB, .state = HB_ALLOCATED};
  m->pins = 3;
  HM_EXPECT(m, &e);
  OK(cachalot_sim_capture_end(e.b, cap));
  OK(cachalot_host_free(e.a, r));
  OK(cachalot_host_free(e.a, t));
  OK(cachalot_host_empty_cache(e.a));
  for (int i = 0; i < m->n; i++)
    m->b[i].state = HB_GONE;
  m->unpins = 3;
  HM_EXPECT(m, &e);
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.allocated, 3); /* as many as were pinned */
  EQ(s.allocations.freed, 3);
  EQ(s.allocated_bytes.allocated, 28 * KiB);
  EQ(s.allocated_bytes.freed, 28 * KiB);
  free(m);
  env_free(&e);
}


int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_campaign_every_malloc),
      cmocka_unit_test(test_fail_next_at_every_step),
      cmocka_unit_test(test_fail_every_k),
      cmocka_unit_test(test_fail_every_two_exact),
      cmocka_unit_test(test_fail_in_oversize_and_retry_paths),
      cmocka_unit_test(test_device_error_is_not_oom),
      cmocka_unit_test(test_fail_events),
      cmocka_unit_test(test_failed_device_free_keeps_segment),
      cmocka_unit_test(test_random_ops_with_faults),
      cmocka_unit_test(test_host_campaign),
      cmocka_unit_test(test_host_free_during_capture_keeps),
      cmocka_unit_test(test_host_pin_during_global_capture),
      cmocka_unit_test(test_host_pin_failures_both_ways),
      cmocka_unit_test(test_host_unpin_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
