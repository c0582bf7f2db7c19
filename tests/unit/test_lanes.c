/* Lanes (src/allocator/core/lane.c): the warm paths count stats into per-stream shares, and exclusive mode
 * folds them into the device's numbers. These tests hold those numbers to a model that knows nothing of
 * lanes: a serial run over several streams must give exactly the currents, peaks and totals one shared
 * counter would, through warm paths and exclusive mode alike, across reset_peak_stats; and threads on
 * their own streams must leave exact totals behind. */
#include "helpers.h"

#include "allocator/internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

static uint64_t next_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static size_t rounded(size_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }

/* One counter as PyTorch keeps it: current, peak, allocated, freed. */
typedef struct {
  int64_t cur, peak, alloc, freed;
} model_stat;

static void model_add(model_stat *m, int64_t n) {
  if (n >= 0) {
    m->cur += n;
    m->alloc += n;
    if (m->cur > m->peak)
      m->peak = m->cur;
  } else {
    m->cur += n;
    m->freed -= n;
  }
}

static void expect_stat(const cachalot_stat *s, const model_stat *m, const char *what, long step) {
  if (s->current != m->cur || s->peak != m->peak || s->allocated != m->alloc || s->freed != m->freed) {
    print_error("step %ld: %s is {current %lld, peak %lld, allocated %lld, freed %lld}, the model says "
                "{%lld, %lld, %lld, %lld}\n",
                step, what, (long long)s->current, (long long)s->peak, (long long)s->allocated, (long long)s->freed,
                (long long)m->cur, (long long)m->peak, (long long)m->alloc, (long long)m->freed);
    fail();
  }
}

enum { STREAMS = 4, LIVE = 48, STEPS = 4000 };

typedef struct {
  void *p;
  size_t size, req;
  bool small;
} live_block;

/* Field-by-field comparison of two stats structs, naming the first difference. */
static void expect_same_stats(const cachalot_device_stats *got, const cachalot_device_stats *ref, long step) {
  const int64_t *g = (const int64_t *)(const void *)got, *r = (const int64_t *)(const void *)ref;
  for (size_t i = 0; i < sizeof *got / sizeof(int64_t); i++) {
    if (g[i] != r[i]) {
      print_error("step %ld: stats word %zu is %lld with lanes, %lld in exclusive mode only\n", step, i,
                  (long long)g[i], (long long)r[i]);
      fail();
    }
  }
}

/* A serial run over four streams, twice: once with the warm paths, once with history on (which sends
 * every call through exclusive mode, the reference). Every stat, peaks and totals included, must be the
 * same after every step, also across reset_peak_stats; allocation counts and requested bytes must also
 * match one plain counter. */
static void serial_streams_match_one_counter(void **state) {
  (void)state;
  env e = ENV(1, 0, NULL), ref = ENV(1, 0, NULL);
  OK(cachalot_record_history(ref.a, true, 16));
  cachalot_stream st[STREAMS], rst[STREAMS];
  for (int i = 0; i < STREAMS; i++) {
    st[i] = STREAM(e.b, 0);
    rst[i] = STREAM(ref.b, 0);
  }
  live_block live[LIVE];
  void *rlive[LIVE];
  int n_live = 0;
  /* [0] all, [1] small, [2] large, as CACHALOT_STAT_* */
  model_stat count[3] = {{0}}, req[3] = {{0}};
  uint64_t rng = 7;
  for (long step = 0; step < STEPS; step++) {
    const bool do_free = n_live == LIVE || (n_live > 0 && next_rand(&rng) % 2);
    if (do_free) {
      int k = (int)(next_rand(&rng) % (uint64_t)n_live);
      live_block b = live[k];
      OK(cachalot_free(e.a, b.p));
      OK(cachalot_free(ref.a, rlive[k]));
      live[k] = live[--n_live];
      rlive[k] = rlive[n_live];
      const int kind = b.small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
      model_add(&count[0], -1), model_add(&count[kind], -1);
      model_add(&req[0], -(int64_t)b.req), model_add(&req[kind], -(int64_t)b.req);
    } else {
      /* mostly small-pool sizes, one in five from the large pool */
      size_t n = next_rand(&rng) % 5 == 0 ? (size_t)(1 * MiB + next_rand(&rng) % (6 * MiB))
                                          : (size_t)(1 + next_rand(&rng) % (256 * KiB));
      const int si = (int)(next_rand(&rng) % STREAMS);
      live_block b = {NULL, rounded(n), n, rounded(n) <= MiB};
      OK(cachalot_malloc(e.a, 0, n, st[si], &b.p));
      OK(cachalot_malloc(ref.a, 0, n, rst[si], &rlive[n_live]));
      live[n_live++] = b;
      const int kind = b.small ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
      model_add(&count[0], 1), model_add(&count[kind], 1);
      model_add(&req[0], (int64_t)b.req), model_add(&req[kind], (int64_t)b.req);
    }
    if (step == STEPS / 2) {
      OK(cachalot_reset_peak_stats(e.a, 0));
      OK(cachalot_reset_peak_stats(ref.a, 0));
      for (int k = 0; k < 3; k++) {
        count[k].peak = count[k].cur;
        req[k].peak = req[k].cur;
      }
    }
    /* Reading the stats folds every lane into exact numbers, so reads come only now and then: peaks
     * reached between them must have been caught by the lanes' room alone. */
    if (next_rand(&rng) % 8 != 0)
      continue;
    cachalot_device_stats ds = STATS(e.a, 0), rs = STATS(ref.a, 0);
    expect_same_stats(&ds, &rs, step);
    static const char *kinds[3] = {"all", "small_pool", "large_pool"};
    for (int k = 0; k < 3; k++) {
      char what[64];
      snprintf(what, sizeof what, "allocation.%s", kinds[k]);
      expect_stat(&ds.allocation[k], &count[k], what, step);
      snprintf(what, sizeof what, "requested_bytes.%s", kinds[k]);
      expect_stat(&ds.requested_bytes[k], &req[k], what, step);
    }
    if (step % 64 == 0) {
      CHECK(e.a);
      CHECK(ref.a);
    }
  }
  while (n_live > 0) {
    FREE(e.a, live[--n_live].p);
    FREE(ref.a, rlive[n_live]);
  }
  cachalot_device_stats ds = STATS(e.a, 0), rs = STATS(ref.a, 0);
  expect_same_stats(&ds, &rs, STEPS);
  EQ(ds.allocated_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(ds.inactive_split[CACHALOT_STAT_ALL].current, 0);
  env_free(&e);
  env_free(&ref);
}

/* The same peaks when the lanes are busy with the warm path and a stats read folds them in the middle
 * of a pattern: a peak reached entirely on warm paths is still seen. */
static void warm_path_peak_between_reads(void **state) {
  (void)state;
  env e = ENV(1, 0, NULL);
  cachalot_stream a = STREAM(e.b, 0), b = STREAM(e.b, 0);
  /* segments on both streams, then all free: later allocations of these sizes are warm */
  void *pa = ALLOC(e.a, 0, MiB, a), *pb = ALLOC(e.a, 0, MiB, b);
  FREE(e.a, pa);
  FREE(e.a, pb);
  OK(cachalot_reset_peak_stats(e.a, 0));
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].peak, 0);
  /* 1 MiB on a, then 1 MiB on b while a's is live, then both freed: peak 2 MiB */
  void *x, *y;
  OK(cachalot_malloc(e.a, 0, MiB, a, &x));
  OK(cachalot_malloc(e.a, 0, MiB, b, &y));
  OK(cachalot_free(e.a, x));
  OK(cachalot_free(e.a, y));
  cachalot_device_stats ds = STATS(e.a, 0);
  EQ(ds.allocated_bytes[CACHALOT_STAT_ALL].peak, 2 * MiB);
  EQ(ds.allocated_bytes[CACHALOT_STAT_SMALL_POOL].peak, 2 * MiB);
  EQ(ds.allocation[CACHALOT_STAT_ALL].peak, 2);
  EQ(ds.allocated_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(ds.num_device_alloc, 2); /* both warm: no new segment */
  /* now the other way round, a's 1 MiB after b's is gone: the peak stays 2 MiB, and 1 MiB reached twice
   * more does not raise it */
  OK(cachalot_malloc(e.a, 0, MiB, b, &y));
  OK(cachalot_free(e.a, y));
  OK(cachalot_malloc(e.a, 0, MiB, a, &x));
  OK(cachalot_free(e.a, x));
  ds = STATS(e.a, 0);
  EQ(ds.allocated_bytes[CACHALOT_STAT_ALL].peak, 2 * MiB);
  EQ(ds.allocation[CACHALOT_STAT_ALL].allocated, 6);
  EQ(ds.allocation[CACHALOT_STAT_ALL].freed, 6);
  CHECK(e.a);
  env_free(&e);
}

enum { THREADS = 4, THREAD_STEPS = 20000, THREAD_LIVE = 32 };

typedef struct {
  cachalot_allocator *a;
  cachalot_stream s;
  uint64_t seed;
  long allocs;
  int64_t max_bytes; /* the most this thread held at once */
  bool failed;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  void *live[THREAD_LIVE];
  size_t sizes[THREAD_LIVE];
  int n = 0;
  int64_t held = 0;
  for (long i = 0; i < THREAD_STEPS; i++) {
    if (n == THREAD_LIVE || (n > 0 && next_rand(&w->seed) % 2)) {
      int k = (int)(next_rand(&w->seed) % (uint64_t)n);
      if (cachalot_free(w->a, live[k]) != CACHALOT_OK)
        w->failed = true;
      held -= (int64_t)sizes[k];
      live[k] = live[--n];
      sizes[k] = sizes[n];
    } else {
      size_t sz = 1 + next_rand(&w->seed) % (64 * KiB);
      if (cachalot_malloc(w->a, 0, sz, w->s, &live[n]) != CACHALOT_OK) {
        w->failed = true;
        continue;
      }
      sizes[n++] = rounded(sz);
      held += (int64_t)rounded(sz);
      w->allocs++;
      if (held > w->max_bytes)
        w->max_bytes = held;
    }
  }
  while (n > 0)
    if (cachalot_free(w->a, live[--n]) != CACHALOT_OK)
      w->failed = true;
  return NULL;
}

/* Threads on their own streams: totals are exact afterwards, and the peak lies between the most one
 * thread held and the sum of what each held at most. */
static void threads_leave_exact_totals(void **state) {
  (void)state;
  env e = ENV(1, 0, NULL);
  worker w[THREADS];
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.a = e.a, .s = STREAM(e.b, 0), .seed = (uint64_t)i + 1};
    assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  long allocs = 0;
  int64_t max_one = 0, sum_max = 0;
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_false(w[i].failed);
    allocs += w[i].allocs;
    max_one = w[i].max_bytes > max_one ? w[i].max_bytes : max_one;
    sum_max += w[i].max_bytes;
  }
  CHECK(e.a);
  cachalot_device_stats ds = STATS(e.a, 0);
  EQ(ds.allocation[CACHALOT_STAT_ALL].current, 0);
  EQ(ds.allocation[CACHALOT_STAT_ALL].allocated, allocs);
  EQ(ds.allocation[CACHALOT_STAT_ALL].freed, allocs);
  EQ(ds.allocated_bytes[CACHALOT_STAT_ALL].current, 0);
  EQ(ds.allocated_bytes[CACHALOT_STAT_ALL].allocated, ds.allocated_bytes[CACHALOT_STAT_ALL].freed);
  EQ(ds.inactive_split[CACHALOT_STAT_ALL].current, 0);
  if (ds.allocated_bytes[CACHALOT_STAT_ALL].peak < max_one || ds.allocated_bytes[CACHALOT_STAT_ALL].peak > sum_max) {
    print_error("allocated_bytes peak %lld is outside [%lld, %lld]\n",
                (long long)ds.allocated_bytes[CACHALOT_STAT_ALL].peak, (long long)max_one, (long long)sum_max);
    fail();
  }
  env_free(&e);
}

/* Many streams used once each (issue 17 item 7: after 5,000 of them every exclusive-mode call took
 * 1,500 times longer, for good): at empty_cache the lanes of streams with nothing left go dormant, with
 * their free indexes and event queues, so exclusive mode walks none of them; a stream used again wakes
 * its lane. */
static void streams_come_and_go(void **state) {
  (void)state;
  enum { N = 2000 };
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream *s = malloc(N * sizeof *s);
  assert_non_null(s);
  cachalot_stream keep = STREAM(e.b, 0);
  void *held = ALLOC(e.a, 0, 4096, keep); /* a stream that keeps a segment keeps its lane */
  for (int i = 0; i < N; i++) { /* (cachalot_check once at the end: after each step it would be N^2) */
    s[i] = STREAM(e.b, 0);
    void *p = NULL;
    OK(cachalot_malloc(e.a, 0, 1000 + (size_t)i, s[i], &p));
    if (i % 2)
      OK(cachalot_record_stream(e.a, p, keep)); /* an event queue of `keep`'s, and one free more */
    OK(cachalot_free(e.a, p));
    OK(cachalot_forget_stream(e.a, s[i]));
  }
  CHECK(e.a);
  EQ(d->n_lanes, N + 1);
  OK(cachalot_sim_stream_complete(e.b, keep));
  EMPTY(e.a);
  EQ(d->n_lanes, 1); /* only `keep`'s */
  EQ(d->n_all_lanes, N + 1);
  EQ(HASH_COUNT(d->default_pool.bins), 1);
  EQ(HASH_COUNT(d->events), 0);
  EQ(USED(e.b, 0), 2 * MiB);
  void *p = ALLOC(e.a, 0, 1000, s[17]); /* wakes its lane */
  EQ(d->n_lanes, 2);
  FREE(e.a, p);
  p = ALLOC(e.a, 0, 1000, s[17]); /* its warm path again */
  FREE(e.a, p);
  cachalot_stream fresh = STREAM(e.b, 0);
  p = ALLOC(e.a, 0, 1000, fresh);
  EQ(d->n_all_lanes, N + 2);
  FREE(e.a, p);
  FREE(e.a, held);
  EMPTY(e.a);
  EQ(d->n_lanes, 0);
  EQ(USED(e.b, 0), 0);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  free(s);
  env_free(&e);
}

/* Whether a call finishes while another thread holds the device lock, as only a warm path can (a call in
 * exclusive mode waits for the lock, here 2 s, and the answer is false): hold_lock, the call, let_go. */
typedef struct {
  cl_device *d;
  pthread_t t;
  atomic_bool held, done, done_while_held;
} lock_holder;
static void *hold_device_lock(void *arg) {
  lock_holder *h = arg;
  pthread_mutex_lock(&h->d->lock);
  atomic_store(&h->held, true);
  for (int i = 0; i < 2000 && !atomic_load(&h->done); i++)
    usleep(1000);
  atomic_store(&h->done_while_held, atomic_load(&h->done));
  pthread_mutex_unlock(&h->d->lock);
  return NULL;
}
static void hold_lock(lock_holder *h, cl_device *d) {
  h->d = d;
  atomic_init(&h->held, false);
  atomic_init(&h->done, false);
  atomic_init(&h->done_while_held, false);
  assert_int_equal(pthread_create(&h->t, NULL, hold_device_lock, h), 0);
  while (!atomic_load(&h->held))
    sched_yield();
}
static bool let_go(lock_holder *h) {
  atomic_store(&h->done, true);
  pthread_join(h->t, NULL);
  return atomic_load(&h->done_while_held);
}
static bool free_is_warm(cachalot_allocator *a, cl_device *d, void *p) {
  lock_holder h;
  hold_lock(&h, d);
  OK(cachalot_free(a, p));
  return let_go(&h);
}
static bool malloc_is_warm(cachalot_allocator *a, cl_device *d, size_t size, cachalot_stream s, void **p) {
  lock_holder h;
  hold_lock(&h, d);
  OK(cachalot_malloc(a, 0, size, s, p));
  return let_go(&h);
}

/* Streams that hold memory but make no call (issue 30: replaying 4,096 streams took 10 s): after
 * CL_LANE_IDLE_MAX exclusive sections without a call, their lanes go cold, down to CL_LANE_ARMED_MIN armed,
 * so that exclusive mode no longer takes and folds them; a cold lane's next malloc or free arms it under
 * the device mutex alone (issue 31: a stream per request paid an exclusive section per request), is
 * served as before (its cached block, no new segment), and its warm paths run again. */
static void idle_lanes_go_cold(void **state) {
  (void)state;
  enum { N = 100 };
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s[N];
  void *p[N];
  for (int i = 0; i < N; i++) {
    s[i] = STREAM(e.b, 0);
    p[i] = ALLOC(e.a, 0, 4096, s[i]); /* a segment each: no lane is dormant */
  }
  CHECK(e.a);
  EQ(d->n_lanes, N);
  /* every ALLOC is sections of its own (the malloc, and the helper's check): the first streams' lanes
   * went cold while the later ones were made */
  EQ(d->n_armed, CL_LANE_ARMED_MIN);
  for (int k = 0; k < CL_LANE_IDLE_MAX; k++) /* sections without a call: all idle long enough */
    CHECK(e.a);
  EQ(d->n_armed, CL_LANE_ARMED_MIN);
  int c1 = -1, c2 = -1; /* two streams whose lanes are cold */
  for (int i = 0; i < N && c2 < 0; i++)
    if (!cl_lane_find(d, s[i])->armed)
      *(c1 < 0 ? &c1 : &c2) = i;
  assert_true(c1 >= 0 && c2 >= 0);
  const size_t used = USED(e.b, 0);
  EQ(used, (size_t)N * 2 * MiB);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, N * 4096);

  cl_lane *cold = cl_lane_find(d, s[c1]);
  assert_non_null(cold);
  assert_false(cold->armed);
  cl_enter_exclusive(d);
  const cl_bins *kept = cl_bins_get_locked(d, &d->default_pool, s[c1], false);
  cl_leave_exclusive(d);
  assert_true(cold->bins == kept); /* kept for its next arming */
  EQ(atomic_load(&cold->warm), 0);
  /* Its call arms it under the device mutex alone (no exclusive section: an armed lane's idle count, which
   * every section raises, stays), then runs warm; past CL_LANE_ARMED_MIN armed, another lane goes cold. */
  cl_lane *hot = d->lanes[0];
  const unsigned idle_before = hot->idle;
  OK(cachalot_free(e.a, p[c1])); /* (not FREE: its check is an exclusive section) */
  EQ(hot->idle, idle_before);
  assert_true(cold->armed);
  EQ(d->n_armed, CL_LANE_ARMED_MIN);
  CHECK(e.a);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, (N - 1) * 4096);
  void *q = ALLOC(e.a, 0, 4096, s[c1]); /* the block it freed (at the peak: in exclusive mode) */
  EQ((uintptr_t)q, (uintptr_t)p[c1]);
  assert_true(free_is_warm(e.a, d, q)); /* armed: the warm path again */
  CHECK(e.a);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, (N - 1) * 4096);
  q = ALLOC(e.a, 0, 4096, s[c1]);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, N * 4096);

  cl_lane *other = cl_lane_find(d, s[c2]);
  assert_false(other->armed);
  void *r = ALLOC(e.a, 0, 8192, s[c2]); /* a cold lane's malloc: its own cached space, no new segment */
  CHECK(e.a);
  assert_true(other->armed);
  assert_true((uintptr_t)r - (uintptr_t)p[c2] < 2 * MiB);
  EQ(USED(e.b, 0), used);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, N * 4096 + 8192);

  FREE(e.a, q);
  FREE(e.a, r);
  for (int i = 0; i < N; i++) {
    if (i != c1)
      FREE(e.a, p[i]);
    CHECK(e.a);
  }
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 0);
  EMPTY(e.a);
  EQ(d->n_lanes, 0);
  EQ(d->n_armed, 0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

static int64_t realtime_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The warm paths' history clock reads the real clock once a millisecond and interpolates with the time
 * stamp counter in between, at a rate it measures itself (once per process: an earlier test may have).
 * Over 40 ms of pairs back to back (40 anchors, so that a lead that carried from one to the next would
 * grow), then pairs with naps longer than an anchor between, every entry's time lies within the real
 * clock's readings around its call, give or take the anchor's and the rate's error (under 4 us with a
 * counter at 1 GHz or more and a fast clock; the slack is twice that),
 * the device's times never go backwards, and the rate measured agrees with the counter's over the test. */
static void history_clock_follows_real_time(void **state) {
  (void)state;
  enum { PAIRS = 100000, SLACK_US = 8, BURST_US = 40000, RUN_US = 80000 };
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0);
  OK(cachalot_record_history(e.a, true, 4 + 3 * PAIRS));
  FREE(e.a, ALLOC(e.a, 0, 1000, s)); /* the segment, in exclusive mode */
  int64_t *before = malloc(PAIRS * sizeof *before), *after = malloc(PAIRS * sizeof *after);
  assert_non_null(before);
  assert_non_null(after);
#if defined(__x86_64__) || defined(__i386__)
  const uint64_t tsc0 = __rdtsc();
#endif
  const int64_t start = realtime_us();
  int n = 0;
  while (n < PAIRS && (n <= PAIRS / 4 || realtime_us() - start < RUN_US)) {
    const bool burst = n < PAIRS / 2 && realtime_us() - start < BURST_US;
    before[n] = realtime_us();
    void *p = NULL;
    if (n == 0 || n == PAIRS / 4) { /* (the check holds the device lock: slow) */
      assert_true(malloc_is_warm(e.a, d, 1000, s, &p));
      assert_true(free_is_warm(e.a, d, p));
    } else {
      OK(cachalot_malloc(e.a, 0, 1000, s, &p));
      OK(cachalot_free(e.a, p));
    }
    after[n] = realtime_us();
    n++;
    if (!burst && n % 64 == 0) { /* gaps longer than an anchor */
      const struct timespec nap = {0, 1500 * 1000};
      nanosleep(&nap, NULL);
    }
  }
  const int64_t end = realtime_us();
#if defined(__x86_64__) || defined(__i386__)
  const uint64_t ticks = __rdtsc() - tsc0;
#endif
  CHECK(e.a);
  cachalot_snapshot_info *si = NULL;
  OK(cachalot_snapshot_take(e.a, true, &si));
  EQ(si->n_trace, 4 + 3 * (size_t)n); /* segment_alloc and the first pair's, then the timed pairs' */
  int64_t last = si->trace[3].time_us;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 3; k++) {
      const int64_t t = si->trace[4 + 3 * i + k].time_us;
      if (t < before[i] - SLACK_US || t > after[i] + SLACK_US)
        fail_msg("pair %d entry %d: time %lld us outside the call's [%lld, %lld]", i, k, (long long)t,
                 (long long)before[i], (long long)after[i]);
      assert_true(t >= last);
      last = t;
    }
  cachalot_snapshot_info_free(e.a, si);
#if defined(__x86_64__) || defined(__i386__)
  /* the rate, against this test's own: within 1% */
  const double measured = (double)cl_clock_rate(), own = (double)(end - start) * 4294967296.0 / (double)ticks;
  assert_true(measured > 0);
  if (measured < own * 0.99 || measured > own * 1.01)
    fail_msg("clock rate %.0f against %.0f measured here", measured, own);
#else
  (void)end;
#endif
  free(before);
  free(after);
  env_free(&e);
}

/* The rate's arithmetic: readings paired at most CL_CLOCK_PAIR_MAX_NS apart (further, ns << 32 would
 * wrap: a pair 4.3 s apart once gave a rate 855 times too low) and counters between 0.2 and 10 GHz. */
static void history_clock_rate_math(void **state) {
  (void)state;
  const uint64_t ghz3 = ((uint64_t)1 << 32) / 3000; /* 1/3000 us a tick */
  EQ(cl_clock_rate_q32(60000000, 20000000), ghz3);        /* 20 ms at 3 GHz */
  EQ(cl_clock_rate_q32(3000000000u, 1000000000), ghz3);   /* 1 s at 3 GHz, the longest pair */
  EQ(cl_clock_rate_q32(3000000003u, 1000000001), 0);      /* longer */
  EQ(cl_clock_rate_q32(15000000000u, 5000000000), 0);     /* 5 s: refused, not wrapped */
  EQ(cl_clock_rate_q32(0, 20000000), 0);
  EQ(cl_clock_rate_q32(60000000, 0), 0);
  EQ(cl_clock_rate_q32(60000000, -5), 0);
  EQ(cl_clock_rate_q32(20000, 20000000), 0);               /* 1 MHz */
  EQ(cl_clock_rate_q32(400000000000u, 20000000), 0);       /* 20 GHz */
  assert_true(cl_clock_rate_q32(4000000, 20000000) != 0);  /* 0.2 GHz */
  assert_true(cl_clock_rate_q32(200000000, 20000000) != 0); /* 10 GHz */
}

/* History on, without stacks or contexts (issue 31: it sent every call to exclusive mode, 13x a pair): the
 * warm paths run and record alloc, free_requested and free_completed as exclusive mode does, in order,
 * with the block's address, requested size and stream and a time within the call's, also past the ring's
 * wrap (a warm entry taking the row of an annotation frees its text). */
static void history_on_warm_paths(void **state) {
  (void)state;
  enum { RING = 64, PAIRS = 100 };
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0);
  OK(cachalot_record_history(e.a, true, RING));
  FREE(e.a, ALLOC(e.a, 0, 1000, s)); /* the segment and the peaks, in exclusive mode */
  OK(cachalot_annotate(e.a, 0, "a row a warm entry takes over"));
  const int64_t t0 = realtime_us();
  void *p = NULL;
  assert_true(malloc_is_warm(e.a, d, 1000, s, &p));
  assert_true(free_is_warm(e.a, d, p));
  for (int i = 1; i < PAIRS; i++) {
    void *q = NULL;
    OK(cachalot_malloc(e.a, 0, 1000, s, &q));
    EQ((uintptr_t)q, (uintptr_t)p);
    OK(cachalot_free(e.a, q));
  }
  const int64_t t1 = realtime_us();
  CHECK(e.a);
  cachalot_snapshot_info *si = NULL;
  OK(cachalot_snapshot_take(e.a, true, &si));
  EQ(si->n_trace, RING); /* full: the pairs' entries only, the oldest gone */
  static const cachalot_trace_action cycle[3] = {CACHALOT_TRACE_ALLOC, CACHALOT_TRACE_FREE_REQUESTED,
                                                 CACHALOT_TRACE_FREE_COMPLETED};
  const int first = 3 * PAIRS - RING; /* the index, among the pairs' entries, of the oldest kept */
  int64_t last = t0;
  for (size_t i = 0; i < si->n_trace; i++) {
    const cachalot_trace_entry *en = &si->trace[i];
    EQ(en->action, cycle[(first + (int)i) % 3]);
    EQ(en->addr, (uintptr_t)p);
    EQ(en->size, 1000);
    assert_ptr_equal(en->stream, s);
    assert_null(en->context);
    assert_true(en->time_us >= last - 2 && en->time_us <= t1 + 2); /* (the warm clock's microseconds) */
    if (en->time_us > last)
      last = en->time_us;
  }
  cachalot_snapshot_info_free(e.a, si);
  void *q = NULL;
  assert_true(malloc_is_warm(e.a, d, 1000, s, &q)); /* the snapshot entry is exclusive mode's: still warm */
  FREE(e.a, q);
  OK(cachalot_record_history_stacks(e.a, true)); /* with stacks the warm paths stay off */
  assert_false(malloc_is_warm(e.a, d, 1000, s, &q));
  assert_false(free_is_warm(e.a, d, q));
  OK(cachalot_record_history(e.a, false, 0));
  assert_true(malloc_is_warm(e.a, d, 1000, s, &q));
  assert_true(free_is_warm(e.a, d, q));
  CHECK(e.a);
  env_free(&e);
}

/* History's warm entries skip the ring's lock while one lane is armed (CL_WARM_SOLO), and a second lane
 * armed outside exclusive mode takes that back before it records: a thread's pairs on the first stream
 * and this thread's on the second, at once, leave every entry in the ring. */
typedef struct {
  cachalot_allocator *a;
  cachalot_stream s;
  int pairs;
} pairs_job;

static void *run_pairs(void *arg) {
  pairs_job *j = arg;
  for (int i = 0; i < j->pairs; i++) {
    void *p = NULL;
    if (cachalot_malloc(j->a, 0, 1000, j->s, &p) != CACHALOT_OK || cachalot_free(j->a, p) != CACHALOT_OK)
      return (void *)1;
  }
  return NULL;
}

static void history_solo_lane_gives_way(void **state) {
  (void)state;
  enum { N = 20, PAIRS = 20000 };
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s[N];
  void *p[N];
  for (int i = 0; i < N; i++) {
    s[i] = STREAM(e.b, 0);
    p[i] = ALLOC(e.a, 0, 4096, s[i]);
  }
  int c = 0; /* the first streams' lanes went cold while the later ones were made: s[c] is one */
  while (cl_lane_find(d, s[c])->armed)
    c++;
  cl_lane *hot = cl_lane_find(d, s[N - 1]), *cold = cl_lane_find(d, s[c]);
  assert_true(hot->armed);
  OK(cachalot_record_history(e.a, true, 1 << 20));
  for (int i = 0; i < N - 1; i++)
    if (i != c)
      FREE(e.a, p[i]);
  OK(cachalot_empty_cache(e.a)); /* the lanes of streams with no memory left rest */
  CHECK(e.a);
  assert_false(hot->armed); /* idle through the frees' sections */
  assert_false(cold->armed);
  FREE(e.a, ALLOC(e.a, 0, 1000, s[N - 1])); /* armed again, the only one (and its peak raised) */
  EQ(d->n_armed, 1);
  EQ(atomic_load(&hot->warm) & CL_WARM_SOLO, CL_WARM_SOLO);
  void *q = NULL;
  assert_true(malloc_is_warm(e.a, d, 1000, s[N - 1], &q));
  assert_true(free_is_warm(e.a, d, q));
  cachalot_snapshot_info *si = NULL;
  OK(cachalot_snapshot_take(e.a, true, &si));
  const size_t before = si->n_trace;
  cachalot_snapshot_info_free(e.a, si);

  OK(cachalot_free(e.a, p[c])); /* the cold lane arms under the device mutex alone */
  assert_true(cold->armed);
  EQ(atomic_load(&hot->warm) & CL_WARM_SOLO, 0);
  EQ(atomic_load(&cold->warm) & CL_WARM_SOLO, 0);
  pairs_job job = {e.a, s[N - 1], PAIRS};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_pairs, &job), 0);
  pairs_job mine = {e.a, s[c], PAIRS};
  assert_null(run_pairs(&mine));
  void *ret = (void *)1;
  assert_int_equal(pthread_join(t, &ret), 0);
  assert_null(ret);
  CHECK(e.a);
  EQ(atomic_load(&hot->warm) & CL_WARM_SOLO, 0); /* two armed lanes: neither */

  OK(cachalot_snapshot_take(e.a, true, &si));
  size_t n[3][3] = {{0}}; /* alloc, free_requested, free_completed of 1000 bytes: on s[c], on others, on s[N - 1] */
  for (size_t i = before; i < si->n_trace; i++) {
    const cachalot_trace_entry *en = &si->trace[i];
    const int k = en->action == CACHALOT_TRACE_ALLOC ? 0 : en->action == CACHALOT_TRACE_FREE_REQUESTED ? 1
                  : en->action == CACHALOT_TRACE_FREE_COMPLETED ? 2 : -1;
    if (k >= 0 && en->size == 1000)
      n[en->stream == s[c] ? 0 : en->stream == s[N - 1] ? 2 : 1][k]++;
  }
  cachalot_snapshot_info_free(e.a, si);
  for (int k = 0; k < 3; k++) {
    EQ(n[0][k], PAIRS);
    EQ(n[1][k], 0);
    EQ(n[2][k], PAIRS);
  }
  FREE(e.a, p[N - 1]);
  OK(cachalot_record_history(e.a, false, 0));
  CHECK(e.a);
  env_free(&e);
}

/* A stream per request, each request at the device's peak (one live at a time): a cold lane arms without
 * exclusive mode, and a lane short of room for the peaks gathers the others' (issue 31: 3.8 us a request on
 * the simulated device). The stats stay exact, and the armed lanes stay CL_LANE_ARMED_MIN. */
static void stream_per_request(void **state) {
  (void)state;
  enum { N = 300, ROUNDS = 3 };
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s[N];
  for (int i = 0; i < N; i++)
    s[i] = STREAM(e.b, 0);
  for (int round = 0; round < ROUNDS; round++) {
    for (int i = 0; i < N; i++) {
      void *a = NULL, *b = NULL;
      OK(cachalot_malloc(e.a, 0, 4096, s[i], &a));
      OK(cachalot_malloc(e.a, 0, 65536, s[i], &b));
      OK(cachalot_free(e.a, a));
      OK(cachalot_free(e.a, b));
      assert_true(d->n_armed <= (round == 0 ? (size_t)N : (size_t)CL_LANE_ARMED_MIN + 1));
    }
    const cachalot_device_stats st = STATS(e.a, 0);
    EQ(st.allocated_bytes[CACHALOT_STAT_ALL].current, 0);
    EQ(st.allocated_bytes[CACHALOT_STAT_ALL].peak, 4096 + 65536);
    EQ(st.allocation[CACHALOT_STAT_ALL].allocated, (int64_t)(round + 1) * N * 2);
    EQ(st.allocated_bytes[CACHALOT_STAT_ALL].freed, (int64_t)(round + 1) * N * (4096 + 65536));
    EQ(st.segment[CACHALOT_STAT_ALL].current, N);
    CHECK(e.a);
  }
  EQ(USED(e.b, 0), (size_t)N * 2 * MiB); /* a segment per stream, made in the first round only */
  env_free(&e);
}

/* Garbage collection set (issue 31: it sent every call to exclusive mode): the warm paths run, and each
 * warm malloc counts its lookup as exclusive mode's does, so that a free block's age (lookups since its
 * free) is PyTorch's. */
static void gc_keeps_warm_paths(void **state) {
  (void)state;
  env e = ENV(1, 200 * MiB, "per_process_memory_fraction:1.0,garbage_collection_threshold:0.5");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0);
  char *a = ALLOC(e.a, 0, 30 * MiB, s); /* lookup 1, in exclusive mode */
  FREE(e.a, a);
  EQ(d->default_pool.lookups[0], 1);
  void *p = NULL;
  assert_true(malloc_is_warm(e.a, d, 30 * MiB, s, &p)); /* lookup 2 */
  EQ((uintptr_t)p, (uintptr_t)a);
  assert_true(free_is_warm(e.a, d, p));
  EQ(d->default_pool.lookups[0], 2);
  for (int i = 0; i < 10; i++) {
    OK(cachalot_malloc(e.a, 0, 30 * MiB, s, &p));
    OK(cachalot_free(e.a, p));
  }
  EQ(d->default_pool.lookups[0], 12);
  EQ(d->default_pool.lookups[1], 0); /* small blocks count in their own pool's */
  CHECK(e.a); /* the last free's deferred return, made in exclusive mode */
  const cl_block *b = d->segments->head;
  EQ(b->state, CL_FREE);
  EQ(b->gc_base, 12); /* freed after the 12th lookup */
  FREE(e.a, ALLOC(e.a, 0, 12 * MiB, s)); /* lookup 13: the first split sets the split stats' peaks */
  assert_true(malloc_is_warm(e.a, d, 12 * MiB, s, &p)); /* a split again: the rest is stamped after lookup 14 */
  EQ(d->default_pool.lookups[0], 14);
  const cl_block *rest = d->segments->head->next;
  EQ(rest->state, CL_FREE);
  EQ(rest->gc_base, 14);
  FREE(e.a, p);
  CHECK(e.a);
  env_free(&e);
}

/* Streams whose memory went back to the device in an out-of-memory retry keep no state (their lanes go
 * dormant, as at empty_cache), with no call from the program. */
static void oom_retry_rests_streams(void **state) {
  (void)state;
  enum { N = 10 };
  env e = ENV(1, 64 * MiB, "");
  cl_device *d = &e.a->devices[0];
  for (int i = 0; i < N; i++) {
    cachalot_stream s = STREAM(e.b, 0);
    FREE(e.a, ALLOC(e.a, 0, 4096, s)); /* a 2 MiB segment each, cached */
  }
  EQ(d->n_lanes, N);
  EQ(USED(e.b, 0), N * 2 * MiB);
  cachalot_stream main_s = STREAM(e.b, 0);
  void *big = ALLOC(e.a, 0, 50 * MiB, main_s); /* fits only once the cached segments are gone */
  EQ(STATS(e.a, 0).num_alloc_retries, 1);
  EQ(d->n_lanes, 1); /* main_s's alone */
  EQ(USED(e.b, 0), 50 * MiB);
  FREE(e.a, big);
  CHECK(e.a);
  env_free(&e);
}

/* A block waiting for an event (record_stream'd on a busy stream, then freed) left the warm malloc off for
 * the whole device (issue 31: 7x a pair). Its event is polled by the next CL_POLLS_BEFORE_WATCH mallocs;
 * still not done, its stream is watched (the completion word moves once the event is done) and mallocs
 * skip the poll while the word stands still, the pending block's own stream and kind included; the block
 * is handed out only once its event is done, on the first malloc after that. */
static void pending_block_keeps_malloc_warm(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, MiB, s); /* small kind, as the pairs below: one 2 MiB segment */
  RECORD(e.a, p, side);
  FREE(e.a, p);
  EQ(d->n_unwatched, 1);
  void *q = NULL;
  for (int i = 0; i < CL_POLLS_BEFORE_WATCH; i++) { /* (the event is not done: nothing moves) */
    assert_false(malloc_is_warm(e.a, d, 4096, s, &q)); /* polls */
    EQ((uintptr_t)q, (uintptr_t)(p + MiB));
    FREE(e.a, q);
  }
  EQ(d->n_unwatched, 0); /* watched now */
  EXPECT_POOLS(e.a, 0,
               PX(.active = 1, .active_b = MiB, .req_b = MiB, .seg = 1, .res_b = 2 * MiB, .split = 1, .split_b = MiB),
               PX0);
  for (int i = 0; i < 3; i++) {
    assert_true(malloc_is_warm(e.a, d, 4096, s, &q));
    EQ((uintptr_t)q, (uintptr_t)(p + MiB)); /* the free half: the pending one is not reused */
    assert_true(free_is_warm(e.a, d, q));
    CHECK(e.a);
  }
  COMPLETE(&e, side);
  void *x = NULL;
  assert_false(malloc_is_warm(e.a, d, 4096, s, &x)); /* the word moved: this one polls */
  EQ((uintptr_t)x, (uintptr_t)p); /* the block is back, merged: best fit starts the segment */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 4096, .active = 1, .active_b = 4096, .req_b = 4096, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 4096),
               PX0);
  FREE(e.a, x);
  assert_true(malloc_is_warm(e.a, d, 4096, s, &x)); /* nothing pending: the plain warm path */
  FREE(e.a, x);
  CHECK(e.a);
  env_free(&e);
}

/* A watch follows its event, not the stream (issue 31 review): work enqueued on the side stream after the
 * event and before the watch does not hold the word back once the event itself is done. */
static void watch_follows_its_event(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, MiB, s);
  RECORD(e.a, p, side);
  FREE(e.a, p);
  OK(cachalot_sim_launch(e.b, side)); /* later work on the side stream, before the watch */
  void *q = NULL;
  for (int i = 0; i < CL_POLLS_BEFORE_WATCH; i++) {
    assert_false(malloc_is_warm(e.a, d, 4096, s, &q));
    FREE(e.a, q);
  }
  assert_true(malloc_is_warm(e.a, d, 4096, s, &q)); /* watched */
  FREE(e.a, q);
  cl_stream_events *se = NULL;
  HASH_FIND_PTR(d->events, &side, se);
  assert_non_null(se);
  OK(e.b->ops->event_sync(e.b, se->head->ev)); /* the event done, the launch after it not */
  assert_false(malloc_is_warm(e.a, d, 4096, s, &q)); /* the word moved: polls, and p is back */
  EQ((uintptr_t)q, (uintptr_t)p); /* merged with the free half: best fit starts the segment */
  FREE(e.a, q);
  EQ(d->n_pending_events, 0);
  CHECK(e.a);
  env_free(&e);
}

/* A stream whose event needed a watch is slow: its next events are watched as they are recorded, so no
 * malloc polls for them; every CL_SLOW_PROBE-th goes unwatched, and one done by the first poll makes the
 * stream fast again (its next event is polled, not watched). */
static void slow_stream_watched_at_once(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0);
  void *q = NULL;
  char *p = ALLOC(e.a, 0, MiB, s);
  RECORD(e.a, p, side);
  FREE(e.a, p);
  for (int i = 0; i < CL_POLLS_BEFORE_WATCH; i++) {
    assert_false(malloc_is_warm(e.a, d, 4096, s, &q));
    FREE(e.a, q);
  }
  COMPLETE(&e, side);
  FREE(e.a, ALLOC(e.a, 0, 4096, s)); /* the poll that frees p */
  EQ(d->n_pending_events, 0);
  for (int k = 1; k < CL_SLOW_PROBE; k++) { /* watched when recorded: not one poll */
    p = ALLOC(e.a, 0, MiB, s);
    RECORD(e.a, p, side);
    FREE(e.a, p);
    EQ(d->n_unwatched, 0);
    assert_true(malloc_is_warm(e.a, d, 4096, s, &q));
    assert_true((char *)q != p);
    FREE(e.a, q);
    COMPLETE(&e, side);
    assert_false(malloc_is_warm(e.a, d, 4096, s, &q)); /* the word moved: polls, and p is back */
    EQ((uintptr_t)q, (uintptr_t)p);
    FREE(e.a, q);
    CHECK(e.a);
  }
  p = ALLOC(e.a, 0, MiB, s); /* the probe: not watched */
  RECORD(e.a, p, side);
  FREE(e.a, p);
  EQ(d->n_unwatched, 1);
  COMPLETE(&e, side);
  assert_false(malloc_is_warm(e.a, d, 4096, s, &q)); /* its first poll finds it done */
  EQ((uintptr_t)q, (uintptr_t)p);
  FREE(e.a, q);
  p = ALLOC(e.a, 0, MiB, s); /* fast again: polled, not watched */
  RECORD(e.a, p, side);
  FREE(e.a, p);
  EQ(d->n_unwatched, 1);
  assert_false(malloc_is_warm(e.a, d, 4096, s, &q));
  FREE(e.a, q);
  COMPLETE(&e, side);
  FREE(e.a, ALLOC(e.a, 0, 4096, s));
  EQ(d->n_pending_events, 0);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  CHECK(e.a);
  env_free(&e);
}

/* A backend without a completion word: while a block waits for an event every malloc polls first, in
 * exclusive mode, as PyTorch's does (skipping the poll where the block could not change the best fit would
 * still move the split stats' peaks); frees stay warm; with the event done, the first malloc frees the
 * block. */
static void pending_block_without_word(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  OK(cachalot_sim_completion_word(e.b, false));
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), other = STREAM(e.b, 0), side = STREAM(e.b, 0);
  char *big = ALLOC(e.a, 0, 4 * MiB, s); /* large kind */
  FREE(e.a, ALLOC(e.a, 0, 4096, s));
  FREE(e.a, ALLOC(e.a, 0, 4096, other));
  RECORD(e.a, big, side);
  FREE(e.a, big);
  void *q = NULL;
  assert_false(malloc_is_warm(e.a, d, 4096, s, &q)); /* another kind: it polls all the same */
  assert_true(free_is_warm(e.a, d, q));
  assert_false(malloc_is_warm(e.a, d, 4096, other, &q)); /* another stream too */
  FREE(e.a, q);
  EQ(d->n_pending_events, 1);
  COMPLETE(&e, side);
  assert_false(malloc_is_warm(e.a, d, 4096, s, &q)); /* the poll that frees it */
  EQ(d->n_pending_events, 0);
  FREE(e.a, q);
  EXPECT_POOLS(e.a, 0, PX(.seg = 2, .res_b = 4 * MiB), PX(.seg = 1, .res_b = 20 * MiB));
  CHECK(e.a);
  env_free(&e);
}

/* record_stream under the block's lane lock alone (issue 31: a side-stream prefetch loop paid an exclusive
 * section a batch): the block's first use grows its array in exclusive mode; the allocation stream, a use
 * already there and a new one with room are warm; the free then waits for exactly those uses' events. */
static bool record_is_warm(cachalot_allocator *a, cl_device *d, void *p, cachalot_stream s) {
  lock_holder h;
  hold_lock(&h, d);
  OK(cachalot_record_stream(a, p, s));
  return let_go(&h);
}
static void record_stream_warm(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0), side2 = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, MiB, s);
  char *q = ALLOC(e.a, 0, 4096, s);
  assert_true(record_is_warm(e.a, d, p, s));      /* its own stream: nothing to add */
  assert_false(record_is_warm(e.a, d, p, side));  /* the first use: its array is made */
  assert_true(record_is_warm(e.a, d, p, side));   /* there already */
  assert_true(record_is_warm(e.a, d, p, side2));  /* room for it */
  CHECK(e.a);
  STATUS(cachalot_record_stream(e.a, p + 512, side), CACHALOT_ERROR_INVALID_POINTER); /* inside a block */
  FREE(e.a, p);
  EQ(d->n_pending_events, 2);
  COMPLETE(&e, side);
  void *x = ALLOC(e.a, 0, MiB, s);
  assert_true((char *)x != p); /* side2's event is not done */
  FREE(e.a, x);
  EQ(d->n_pending_events, 1);
  COMPLETE(&e, side2);
  x = ALLOC(e.a, 0, MiB, s);
  EQ((uintptr_t)x, (uintptr_t)p);
  EQ(d->n_pending_events, 0);
  FREE(e.a, x);
  FREE(e.a, q);
  STATUS(cachalot_record_stream(e.a, q, side), CACHALOT_ERROR_INVALID_POINTER); /* freed */
  EXPECT_POOLS(e.a, 0, PX(.seg = 2, .res_b = 4 * MiB), PX0);
  CHECK(e.a);
  env_free(&e);
}

/* Debug builds check the _locked naming rule: a _locked function called outside exclusive mode, or in
 * exclusive mode another thread holds, aborts with its name; inside exclusive mode it runs. */
#ifdef CL_DEBUG_LOCKS
static void *enter_and_hold(void *arg) {
  cl_enter_exclusive((cl_device *)arg);
  return NULL;
}
#endif
static void locked_functions_check_exclusive_mode(void **state) {
  (void)state;
#ifdef CL_DEBUG_LOCKS
  env e = ENV(1, 0, "");
  cl_device *d = &e.a->devices[0];
  cl_enter_exclusive(d);
  cl_process_events_locked(d); /* the rule holds: runs */
  cl_leave_exclusive(d);
  for (int kind = 0; kind < 2; kind++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      if (kind == 1) { /* exclusive mode held, by another thread */
        pthread_t t;
        pthread_create(&t, NULL, enter_and_hold, d);
        pthread_join(t, NULL);
      }
      if (!freopen("/dev/null", "w", stderr)) /* the abort message is expected: keep the log clean */
        _exit(3);
      cl_process_events_locked(d);
      _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
  }
  CHECK(e.a);
  env_free(&e);
#else
  skip();
#endif
}

/* cachalot_get_memory_fraction and cachalot_get_settings read what only exclusive mode writes, under the
 * device lock alone: a warm path in progress on another thread (here its lane's lock, held) does not stop
 * them, and they read exactly what was set. */
typedef struct {
  cachalot_allocator *a;
  double fraction;
  cachalot_settings settings;
  cachalot_status fraction_rc, settings_rc;
  atomic_int done;
} settings_reader;

static void *read_settings(void *arg) {
  settings_reader *r = arg;
  r->fraction_rc = cachalot_get_memory_fraction(r->a, 0, &r->fraction);
  r->settings_rc = cachalot_get_settings(r->a, &r->settings);
  atomic_store(&r->done, 1);
  return NULL;
}

static void reads_leave_warm_paths_running(void **state) {
  (void)state;
  env e = ENV(1, 0, "max_split_size_mb:64");
  cl_device *d = &e.a->devices[0];
  OK(cachalot_set_memory_fraction(e.a, 0, 0.5));
  cachalot_stream s = STREAM(e.b, 0);
  FREE(e.a, ALLOC(e.a, 0, 4096, s));
  CHECK(e.a);
  cl_lane *ln = cl_lane_find(d, s);
  assert_true(ln->armed);
  settings_reader r = {.a = e.a};
  atomic_init(&r.done, 0);
  cl_spin_lock(&ln->lock); /* a warm path of stream s, in progress */
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, read_settings, &r), 0);
  /* Exclusive mode would wait for the lane until it is let go below: a generous bound, not a timing. */
  for (int i = 0; i < 20000 && !atomic_load(&r.done); i++)
    usleep(500);
  const int done_while_held = atomic_load(&r.done);
  cl_spin_unlock(&ln->lock);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_true(done_while_held);
  OK(r.fraction_rc);
  assert_true(r.fraction == 0.5);
  OK(r.settings_rc);
  EQ(r.settings.max_split_size, (size_t)64 << 20);
  CHECK(e.a);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(serial_streams_match_one_counter),
      cmocka_unit_test(warm_path_peak_between_reads),
      cmocka_unit_test(threads_leave_exact_totals),
      cmocka_unit_test(streams_come_and_go),
      cmocka_unit_test(idle_lanes_go_cold),
      cmocka_unit_test(history_on_warm_paths),
      cmocka_unit_test(history_solo_lane_gives_way),
      cmocka_unit_test(history_clock_follows_real_time),
      cmocka_unit_test(history_clock_rate_math),
      cmocka_unit_test(stream_per_request),
      cmocka_unit_test(gc_keeps_warm_paths),
      cmocka_unit_test(oom_retry_rests_streams),
      cmocka_unit_test(pending_block_keeps_malloc_warm),
      cmocka_unit_test(slow_stream_watched_at_once),
      cmocka_unit_test(watch_follows_its_event),
      cmocka_unit_test(pending_block_without_word),
      cmocka_unit_test(record_stream_warm),
      cmocka_unit_test(locked_functions_check_exclusive_mode),
      cmocka_unit_test(reads_leave_warm_paths_running),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
