/* Deterministic multi-thread x multi-stream stress test on the simulated device.
 *
 * Each thread runs a fixed, seeded sequence of operations (malloc of log-uniform sizes, free,
 * record_stream on its second stream, completion of that stream) against one shared allocator on two
 * devices. Interleavings vary between runs; the operation sequences do not. A shadow set of every
 * range cachalot has handed out and not yet made reusable catches overlaps: a range is added at
 * malloc, removed at free when it has no stream uses, and otherwise removed only after the used stream
 * was completed (under the shadow lock, so no other thread can insert the reused range before the
 * removal). Between rounds the threads stop at a barrier, and cachalot_check and the stats are compared
 * with the shadow's own totals.
 *
 * A second test runs the same threads against small devices, where out-of-memory, the release-all retry
 * and empty_cache race with everything else; there only consistency is checked.
 *
 * With contexts (what the PyTorch backend does while history is on): every malloc and free carries a
 * counted context, one thread in eight takes C-structure snapshots while the others run, and at the end
 * every reference must be back (history off), then none after destroy.
 *
 * Last, the pinned-host cache, whose blocks every thread shares (host_stress below).
 */
#include <cachalot/cachalot.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { THREADS = 8, DEVICES = 2, ROUNDS = 6, OPS_PER_ROUND = 3000, MAX_LIVE = 48, MAX_RANGES = 8192 };
/* Each thread allocates on OWN streams of its own per device, stream j on about 2^-(j+1) of its mallocs:
 * 32 lanes a device, the rare ones idle long enough to go cold while other threads' warm paths run, then
 * armed again by their next call (see cl_lane). */
enum { OWN = 4 };

#define CHECK(cond, ...)                                                                                           \
  do {                                                                                                             \
    if (!(cond)) {                                                                                                 \
      fprintf(stderr, "stress: FAIL %s:%d: ", __FILE__, __LINE__);                                               \
      fprintf(stderr, __VA_ARGS__);                                                                                \
      fprintf(stderr, " (last error: %s)\n", cachalot_last_error());                                              \
      exit(1);                                                                                                     \
    }                                                                                                              \
  } while (0)

typedef struct {
  uintptr_t lo, hi;
  int owner;
  cachalot_stream waits_for; /* non-NULL: pending until this stream completes */
} range;

/* The shadow set: sorted by lo, guarded by `lock`. */
static struct {
  pthread_mutex_t lock;
  range r[MAX_RANGES];
  int n;
} shadow = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int shadow_find_locked(uintptr_t lo) {
  int a = 0, b = shadow.n;
  while (a < b) {
    int m = (a + b) / 2;
    if (shadow.r[m].lo < lo)
      a = m + 1;
    else
      b = m;
  }
  return a;
}

static void shadow_insert(uintptr_t lo, size_t size, int owner) {
  pthread_mutex_lock(&shadow.lock);
  int i = shadow_find_locked(lo);
  uintptr_t hi = lo + size;
  CHECK(i == shadow.n || shadow.r[i].lo >= hi, "range 0x%llx+%zu overlaps 0x%llx (owner %d, pending %d)",
        (unsigned long long)lo, size, (unsigned long long)shadow.r[i].lo, shadow.r[i].owner,
        shadow.r[i].waits_for != NULL);
  CHECK(i == 0 || shadow.r[i - 1].hi <= lo, "range 0x%llx+%zu overlaps 0x%llx (owner %d, pending %d)",
        (unsigned long long)lo, size, (unsigned long long)shadow.r[i - 1].lo, shadow.r[i - 1].owner,
        shadow.r[i - 1].waits_for != NULL);
  CHECK(shadow.n < MAX_RANGES, "shadow full");
  memmove(&shadow.r[i + 1], &shadow.r[i], (size_t)(shadow.n - i) * sizeof(range));
  shadow.r[i] = (range){lo, hi, owner, NULL};
  shadow.n++;
  pthread_mutex_unlock(&shadow.lock);
}

static void shadow_remove_locked(int i) {
  memmove(&shadow.r[i], &shadow.r[i + 1], (size_t)(shadow.n - i - 1) * sizeof(range));
  shadow.n--;
}

/* Marks the range at lo as released (waits == NULL) or pending on `waits`. */
static void shadow_release(uintptr_t lo, cachalot_stream waits) {
  pthread_mutex_lock(&shadow.lock);
  int i = shadow_find_locked(lo);
  CHECK(i < shadow.n && shadow.r[i].lo == lo, "freeing an unknown range");
  if (waits)
    shadow.r[i].waits_for = waits;
  else
    shadow_remove_locked(i);
  pthread_mutex_unlock(&shadow.lock);
}

/* Contexts: counters of the references cachalot holds. */
enum { CTXS = 4 };
static _Atomic long ctx_refs[CTXS];
static void ctx_retain(void *c) { atomic_fetch_add((_Atomic long *)c, 1); }
static void ctx_release(void *c) { CHECK(atomic_fetch_sub((_Atomic long *)c, 1) > 0, "a context released too often"); }
static long ctx_total(void) {
  long t = 0;
  for (int i = 0; i < CTXS; i++)
    t += atomic_load(&ctx_refs[i]);
  return t;
}

typedef struct {
  cachalot_allocator *a;
  cachalot_backend *b;
  pthread_barrier_t *barrier;
  int id;
  bool strict; /* overlap checking on (the roomy configuration) */
  bool contexts; /* malloc and free with contexts; history on */
  bool history;  /* history on (with or without contexts) */
  uint64_t rng;
  cachalot_stream own[DEVICES][OWN], side[DEVICES];
  struct {
    void *p;
    size_t size;
    int dev;
    bool used_side;
  } live[MAX_LIVE];
  int n_live;
  long ooms;
} worker;

static uint64_t next_rand(uint64_t *s) { /* xorshift64*: fixed sequences per seed */
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

static size_t random_size(uint64_t *s) { /* log-uniform over 1 B .. 16 MiB */
  unsigned bits = (unsigned)(next_rand(s) % 24) + 1;
  return (size_t)(next_rand(s) % ((uint64_t)1 << bits)) + 1;
}

static void complete_side(worker *w, int dev) {
  /* Under the shadow lock: pending ranges of this stream leave the shadow before anyone can be handed
   * the memory again. */
  pthread_mutex_lock(&shadow.lock);
  CHECK(cachalot_sim_stream_complete(w->b, w->side[dev]) == CACHALOT_OK, "stream complete");
  for (int i = shadow.n - 1; i >= 0; i--)
    if (shadow.r[i].waits_for == w->side[dev])
      shadow_remove_locked(i);
  pthread_mutex_unlock(&shadow.lock);
}

static void free_one(worker *w, int k) {
  cachalot_status s = w->contexts ? cachalot_free_with_context(w->a, w->live[k].p, &ctx_refs[k % CTXS])
                                  : cachalot_free(w->a, w->live[k].p);
  CHECK(s == CACHALOT_OK, "free");
  if (w->strict)
    shadow_release((uintptr_t)w->live[k].p, w->live[k].used_side ? w->side[w->live[k].dev] : NULL);
  w->live[k] = w->live[--w->n_live];
}

static void *run(void *arg) {
  worker *w = arg;
  for (int round = 0; round < ROUNDS; round++) {
    for (int op = 0; op < OPS_PER_ROUND; op++) {
      uint64_t r = next_rand(&w->rng) % 100;
      if (r < 50 && w->n_live < MAX_LIVE) {
        int dev = (int)(next_rand(&w->rng) % DEVICES);
        size_t size = random_size(&w->rng);
        cachalot_stream st = w->own[dev][__builtin_ctzll(next_rand(&w->rng) | (1ull << (OWN - 1)))];
        void *p = NULL;
        cachalot_status s = w->contexts ? cachalot_malloc_with_context(w->a, dev, size, st, &ctx_refs[w->id % CTXS], &p)
                                        : cachalot_malloc(w->a, dev, size, st, &p);
        if (s == CACHALOT_ERROR_OUT_OF_MEMORY && !w->strict) {
          w->ooms++;
          continue;
        }
        CHECK(s == CACHALOT_OK && p, "malloc(%zu) on device %d", size, dev);
        if (w->strict)
          shadow_insert((uintptr_t)p, size, w->id);
        w->live[w->n_live].p = p;
        w->live[w->n_live].size = size;
        w->live[w->n_live].dev = dev;
        w->live[w->n_live].used_side = false;
        w->n_live++;
      } else if (r < 85 && w->n_live > 0) {
        free_one(w, (int)(next_rand(&w->rng) % (uint64_t)w->n_live));
      } else if (r < 93 && w->n_live > 0) {
        int k = (int)(next_rand(&w->rng) % (uint64_t)w->n_live);
        CHECK(cachalot_record_stream(w->a, w->live[k].p, w->side[w->live[k].dev]) == CACHALOT_OK, "record_stream");
        w->live[k].used_side = true;
      } else if (r < 98) {
        complete_side(w, (int)(next_rand(&w->rng) % DEVICES));
      } else if (w->history && w->id == 0) { /* a snapshot while the others allocate and free */
        cachalot_snapshot_info *si = NULL;
        CHECK(cachalot_snapshot_take(w->a, true, &si) == CACHALOT_OK, "snapshot_take");
        cachalot_snapshot_info_free(w->a, si);
      } else if (!w->strict) {
        CHECK(cachalot_empty_cache(w->a) == CACHALOT_OK, "empty_cache");
      }
    }
    pthread_barrier_wait(w->barrier); /* round done: main thread checks */
    pthread_barrier_wait(w->barrier); /* checks done */
  }
  while (w->n_live > 0)
    free_one(w, w->n_live - 1);
  for (int d = 0; d < DEVICES; d++)
    complete_side(w, d);
  return NULL;
}

/* contexts: history on with context ops, every call with a context; history: history on, without contexts
 * too (the warm paths then record the entries themselves, racing each other for the ring). */
static void run_config_ctx(size_t capacity, bool strict, const char *conf, bool contexts, bool history) {
  cachalot_sim_options opt = {.device_count = DEVICES, .capacity_bytes = capacity, .complete_immediately = false};
  cachalot_backend *b = NULL;
  cachalot_allocator *a = NULL;
  CHECK(cachalot_backend_sim(&opt, &b) == CACHALOT_OK, "backend");
  CHECK(cachalot_create(b, conf, &a) == CACHALOT_OK, "create");
  if (contexts) {
    const cachalot_context_ops ops = {ctx_retain, ctx_release};
    CHECK(cachalot_set_context_ops(a, &ops) == CACHALOT_OK, "context ops");
  }
  if (history)
    CHECK(cachalot_record_history(a, true, 256) == CACHALOT_OK, "history");
  static worker w[THREADS];
  pthread_t t[THREADS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, THREADS + 1);
  for (int i = 0; i < THREADS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].a = a;
    w[i].b = b;
    w[i].barrier = &barrier;
    w[i].id = i;
    w[i].strict = strict;
    w[i].contexts = contexts;
    w[i].history = history;
    w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (int d = 0; d < DEVICES; d++) {
      for (int j = 0; j < OWN; j++)
        CHECK(cachalot_sim_stream_create(b, d, &w[i].own[d][j]) == CACHALOT_OK, "stream");
      CHECK(cachalot_sim_stream_create(b, d, &w[i].side[d]) == CACHALOT_OK, "stream");
    }
  }
  for (int i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, run, &w[i]);
  for (int round = 0; round < ROUNDS; round++) {
    pthread_barrier_wait(&barrier);
    CHECK(cachalot_check(a) == CACHALOT_OK, "cachalot_check after round %d", round);
    int64_t live_bytes[DEVICES] = {0}, live_count[DEVICES] = {0};
    for (int i = 0; i < THREADS; i++)
      for (int k = 0; k < w[i].n_live; k++) {
        live_bytes[w[i].live[k].dev] += (int64_t)w[i].live[k].size;
        live_count[w[i].live[k].dev]++;
      }
    for (int d = 0; d < DEVICES; d++) {
      cachalot_device_stats st;
      CHECK(cachalot_memory_stats(a, d, &st) == CACHALOT_OK, "stats");
      CHECK(st.allocation[0].current == live_count[d], "device %d: %lld allocations, threads hold %lld", d,
            (long long)st.allocation[0].current, (long long)live_count[d]);
      CHECK(st.allocated_bytes[0].current >= live_bytes[d], "allocated bytes below what the threads hold");
      size_t used = 0;
      CHECK(cachalot_sim_device_used(b, d, &used) == CACHALOT_OK, "device used");
      CHECK((int64_t)used == st.reserved_bytes[0].current, "device %d: device holds %zu, reserved says %lld", d,
            used, (long long)st.reserved_bytes[0].current);
    }
    pthread_barrier_wait(&barrier);
  }
  long ooms = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    ooms += w[i].ooms;
  }
  pthread_barrier_destroy(&barrier);
  CHECK(cachalot_check(a) == CACHALOT_OK, "final check");
  CHECK(cachalot_empty_cache(a) == CACHALOT_OK, "empty_cache");
  for (int d = 0; d < DEVICES; d++) {
    cachalot_device_stats st;
    size_t used = 1;
    CHECK(cachalot_memory_stats(a, d, &st) == CACHALOT_OK, "stats");
    CHECK(cachalot_sim_device_used(b, d, &used) == CACHALOT_OK, "used");
    CHECK(st.allocation[0].current == 0 && st.active[0].current == 0 && st.reserved_bytes[0].current == 0 &&
              used == 0,
          "device %d: memory left after freeing everything: %lld active, %zu on the device", d,
          (long long)st.active[0].current, used);
  }
  CHECK(cachalot_check(a) == CACHALOT_OK, "check after empty_cache");
  if (contexts) {
    CHECK(ctx_total() > 0, "history on: the trace holds contexts");
    CHECK(cachalot_record_history(a, false, 0) == CACHALOT_OK, "history off");
    CHECK(ctx_total() == 0, "%ld context references left with nothing allocated and history off", ctx_total());
  }
  printf("stress: %s capacity %zu MiB, conf '%s'%s: %d threads x %d ops on %d devices, %ld OOMs: ok\n",
         strict ? "strict" : "tight", capacity >> 20, conf, contexts ? ", contexts" : history ? ", history" : "", THREADS,
         ROUNDS * OPS_PER_ROUND, DEVICES, ooms);
  cachalot_destroy(a);
  CHECK(ctx_total() == 0, "context references left after destroy");
  cachalot_backend_destroy(b);
}

static void run_config(size_t capacity, bool strict, const char *conf) {
  run_config_ctx(capacity, strict, conf, false, false);
}

/* Warning handlers set from two threads while two others warn (an empty captured graph warns): each
 * warning must reach a handler with that handler's own context. */
enum { WARN_ROUNDS = 400 };
static _Atomic long warn_seen, warn_mixed;
static void handler_a(const char *m, void *ctx) {
  (void)m;
  atomic_fetch_add(&warn_seen, 1);
  if (ctx != (void *)handler_a)
    atomic_fetch_add(&warn_mixed, 1);
}
static void handler_b(const char *m, void *ctx) {
  (void)m;
  atomic_fetch_add(&warn_seen, 1);
  if (ctx != (void *)handler_b)
    atomic_fetch_add(&warn_mixed, 1);
}
static _Atomic int warners_left;
static void *setter(void *arg) {
  const bool a = arg != NULL;
  while (atomic_load(&warners_left) > 0)
    cachalot_set_warning_handler(a ? handler_a : handler_b, a ? (void *)handler_a : (void *)handler_b);
  return NULL;
}
typedef struct {
  cachalot_allocator *a;
  cachalot_backend *b;
} warn_arg;
static void *warner(void *arg) {
  warn_arg *w = arg;
  cachalot_stream s = NULL;
  CHECK(cachalot_sim_stream_create(w->b, 0, &s) == CACHALOT_OK, "stream");
  for (int i = 0; i < WARN_ROUNDS; i++) {
    cachalot_graph *g = NULL;
    CHECK(cachalot_graph_create(w->a, 0, false, &g) == CACHALOT_OK, "graph");
    CHECK(cachalot_graph_capture_begin(g, s, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_RELAXED) == CACHALOT_OK,
          "capture begin");
    CHECK(cachalot_graph_capture_end(g) == CACHALOT_OK, "capture end"); /* empty: a warning */
    cachalot_graph_destroy(g);
  }
  atomic_fetch_sub(&warners_left, 1);
  return NULL;
}
static void warning_handlers(void) {
  cachalot_backend *b = NULL;
  cachalot_allocator *a = NULL;
  CHECK(cachalot_backend_sim(NULL, &b) == CACHALOT_OK, "backend");
  CHECK(cachalot_create(b, "", &a) == CACHALOT_OK, "create");
  warn_arg wa = {a, b};
  atomic_store(&warners_left, 2);
  cachalot_set_warning_handler(handler_a, (void *)handler_a);
  pthread_t t[4];
  pthread_create(&t[0], NULL, setter, (void *)1);
  pthread_create(&t[1], NULL, setter, NULL);
  pthread_create(&t[2], NULL, warner, &wa);
  pthread_create(&t[3], NULL, warner, &wa);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  cachalot_set_warning_handler(NULL, NULL);
  CHECK(atomic_load(&warn_seen) == 2 * WARN_ROUNDS, "%ld warnings reached a handler, %d expected",
        atomic_load(&warn_seen), 2 * WARN_ROUNDS);
  CHECK(atomic_load(&warn_mixed) == 0, "%ld warnings reached a handler with the other one's context",
        atomic_load(&warn_mixed));
  printf("stress: warning handlers set from 2 threads while 2 warn: %d warnings, each with its handler's context: ok\n",
         2 * WARN_ROUNDS);
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
}

/* ---- the pinned-host cache under threads ----
 * HOST_WORKERS threads allocate pinned blocks (1 B to 64 KiB), fill each with a pattern of their own, mark
 * some with streams (their own, one shared per device, the default streams), launch work there, check the
 * pattern before every free, and complete their own stream now and then; worker 0 also empties the cache.
 * Two more threads complete any of the streams meanwhile. Every sequence is seeded; only the interleaving
 * varies. A shadow set of the blocks handed out or freed with events outstanding catches a block handed
 * out twice or before the streams it was marked with have completed: an entry is marked pending before
 * its free (so that a completion racing with the free can only drop it early, weakening the check, never
 * report a false reuse), and completions clear their stream from the entries in the same critical
 * section. Between rounds the workers stop at a barrier, and cachalot_check, the active blocks and the
 * pinned bytes are compared with what the threads hold. */
enum { HOST_WORKERS = 6, HOST_ROUNDS = 4, HOST_OPS = 2500, HOST_LIVE = 24, HOST_MAX = 64 << 10,
       HOST_COMPLETIONS = 3000, HOST_SHADOW = 8192 };
/* stream indices: 0 and 1 the default streams of devices 0 and 1, 2 and 3 shared streams of devices 0 and
 * 1, 4 + i worker i's own */
enum { HS_SHARED = 2, HS_OWN = 4, HS_STREAMS = HS_OWN + HOST_WORKERS };

typedef struct {
  uintptr_t lo, hi;
  unsigned pending; /* freed: the streams whose events its free recorded and that have not completed since */
  bool freed;
} host_range;

static struct {
  pthread_mutex_t lock;
  host_range r[HOST_SHADOW];
  int n;
} hshadow = {.lock = PTHREAD_MUTEX_INITIALIZER};

typedef struct {
  cachalot_allocator *a;
  cachalot_backend *b;
  cachalot_stream streams[HS_STREAMS];
  bool registered; /* blocks are registered: giving one back does not synchronize the device */
  pthread_barrier_t barrier;
} host_shared;

typedef struct {
  host_shared *sh;
  int id;
  uint64_t rng;
  struct {
    unsigned char *p;
    size_t n;
    unsigned char tag;
    unsigned marks;
  } live[HOST_LIVE];
  int n_live;
  unsigned char pattern[HOST_MAX];
} host_worker;

static int hshadow_find_locked(uintptr_t lo) {
  for (int i = 0; i < hshadow.n; i++)
    if (hshadow.r[i].lo == lo)
      return i;
  return -1;
}

static void hshadow_remove_locked(int i) { hshadow.r[i] = hshadow.r[--hshadow.n]; }

static void hshadow_insert(uintptr_t lo, size_t n) {
  pthread_mutex_lock(&hshadow.lock);
  for (int i = 0; i < hshadow.n; i++)
    CHECK(lo >= hshadow.r[i].hi || hshadow.r[i].lo >= lo + n,
          "pinned block %p+%zu handed out over %p+%zu, %s", (void *)lo, n, (void *)hshadow.r[i].lo,
          (size_t)(hshadow.r[i].hi - hshadow.r[i].lo),
          hshadow.r[i].freed ? "freed with events on its streams not yet complete" : "still handed out");
  CHECK(hshadow.n < HOST_SHADOW, "host shadow full");
  hshadow.r[hshadow.n++] = (host_range){lo, lo + n, 0, false};
  pthread_mutex_unlock(&hshadow.lock);
}

/* Before the free: a block without marks leaves the shadow; a marked one waits for its streams. */
static void hshadow_freeing(uintptr_t lo, unsigned marks) {
  pthread_mutex_lock(&hshadow.lock);
  const int i = hshadow_find_locked(lo);
  CHECK(i >= 0 && !hshadow.r[i].freed, "freeing a pinned block the shadow does not hold");
  if (marks) {
    hshadow.r[i].freed = true;
    hshadow.r[i].pending = marks;
  } else {
    hshadow_remove_locked(i);
  }
  pthread_mutex_unlock(&hshadow.lock);
}

/* Completes stream k (0 or 1: the default streams of both devices) and clears it from the shadow, in one
 * critical section: no block can be reused between the two. */
static void host_complete(host_shared *sh, int k) {
  pthread_mutex_lock(&hshadow.lock);
  CHECK(cachalot_sim_stream_complete(sh->b, k < HS_SHARED ? NULL : sh->streams[k]) == CACHALOT_OK, "complete");
  const unsigned done = k < HS_SHARED ? 3u : 1u << k;
  for (int i = hshadow.n - 1; i >= 0; i--) {
    hshadow.r[i].pending &= ~done;
    if (hshadow.r[i].freed && !hshadow.r[i].pending)
      hshadow_remove_locked(i);
  }
  pthread_mutex_unlock(&hshadow.lock);
}

static void host_empty(host_shared *sh) {
  pthread_mutex_lock(&hshadow.lock);
  cachalot_host_stats before, after;
  CHECK(cachalot_host_memory_stats(sh->a, &before) == CACHALOT_OK, "host stats");
  CHECK(cachalot_host_empty_cache(sh->a) == CACHALOT_OK, "host empty_cache");
  CHECK(cachalot_host_memory_stats(sh->a, &after) == CACHALOT_OK, "host stats");
  /* cudaFreeHost synchronizes the device: every stream may have completed */
  if (!sh->registered && after.num_host_free > before.num_host_free)
    for (int i = hshadow.n - 1; i >= 0; i--)
      if (hshadow.r[i].freed)
        hshadow_remove_locked(i);
  pthread_mutex_unlock(&hshadow.lock);
}

static void host_free_one(host_worker *w, int k) {
  memset(w->pattern, w->live[k].tag, w->live[k].n);
  CHECK(memcmp(w->live[k].p, w->pattern, w->live[k].n) == 0, "worker %d: pinned block %p (%zu B) was written by "
        "another holder", w->id, (void *)w->live[k].p, w->live[k].n);
  hshadow_freeing((uintptr_t)w->live[k].p, w->live[k].marks);
  CHECK(cachalot_host_free(w->sh->a, w->live[k].p) == CACHALOT_OK, "host free");
  w->live[k] = w->live[--w->n_live];
}

static void *host_run(void *arg) {
  host_worker *w = arg;
  host_shared *sh = w->sh;
  const int own = HS_OWN + w->id;
  unsigned char counter = 0;
  for (int round = 0; round < HOST_ROUNDS; round++) {
    for (int op = 0; op < HOST_OPS; op++) {
      const uint64_t r = next_rand(&w->rng) % 100;
      if (r < 45 && w->n_live < HOST_LIVE) {
        const unsigned bits = (unsigned)(next_rand(&w->rng) % 17); /* log-uniform, 1 B to 64 KiB */
        const size_t n = (size_t)(next_rand(&w->rng) % ((uint64_t)1 << bits)) + 1;
        void *p = NULL;
        CHECK(cachalot_host_malloc(sh->a, n, &p) == CACHALOT_OK && p, "host malloc(%zu)", n);
        hshadow_insert((uintptr_t)p, n);
        const unsigned char tag = (unsigned char)(w->id * 40 + ++counter % 37 + 1);
        memset(p, tag, n);
        w->live[w->n_live].p = p;
        w->live[w->n_live].n = n;
        w->live[w->n_live].tag = tag;
        w->live[w->n_live].marks = 0;
        w->n_live++;
      } else if (r < 78 && w->n_live > 0) {
        host_free_one(w, (int)(next_rand(&w->rng) % (uint64_t)w->n_live));
      } else if (r < 92 && w->n_live > 0) { /* a copy from the block on a stream */
        const int k = (int)(next_rand(&w->rng) % (uint64_t)w->n_live);
        const uint64_t c = next_rand(&w->rng) % 4;
        const int s = c == 0 ? own : c == 1 ? HS_SHARED + (int)(next_rand(&w->rng) % 2) : (int)(c - 2);
        /* a default stream is named by its device; any other by itself, with either device's number */
        const int device = s < HS_SHARED ? s : (int)(next_rand(&w->rng) % DEVICES);
        CHECK(cachalot_host_record_event(sh->a, w->live[k].p, device, sh->streams[s]) == CACHALOT_OK,
              "host record_event");
        w->live[k].marks |= 1u << s;
        if (s != 1) /* (work on device 1's default stream cannot be launched: NULL is device 0's) */
          CHECK(cachalot_sim_launch(sh->b, sh->streams[s]) == CACHALOT_OK, "launch");
      } else if (r < 97) {
        host_complete(sh, own);
      } else if (r < 98 && w->id == 0) {
        host_empty(sh);
      } else {
        cachalot_host_stats st;
        CHECK(cachalot_host_memory_stats(sh->a, &st) == CACHALOT_OK, "host stats");
        CHECK(st.active_requests.current >= w->n_live, "fewer active pinned blocks than worker %d holds", w->id);
      }
    }
    pthread_barrier_wait(&sh->barrier);
    pthread_barrier_wait(&sh->barrier);
  }
  while (w->n_live > 0)
    host_free_one(w, w->n_live - 1);
  return NULL;
}

typedef struct {
  host_shared *sh;
  uint64_t rng;
} host_completer;

static void *host_complete_run(void *arg) {
  host_completer *c = arg;
  for (int i = 0; i < HOST_COMPLETIONS; i++) {
    host_complete(c->sh, (int)(next_rand(&c->rng) % HS_STREAMS));
    sched_yield();
  }
  return NULL;
}

static void host_stress(const char *conf) {
  cachalot_sim_options opt = {.device_count = DEVICES, .capacity_bytes = (size_t)1 << 30,
                              .complete_immediately = false};
  static host_shared sh;
  static host_worker w[HOST_WORKERS];
  memset(&sh, 0, sizeof sh);
  CHECK(cachalot_backend_sim(&opt, &sh.b) == CACHALOT_OK, "backend");
  CHECK(cachalot_create(sh.b, conf, &sh.a) == CACHALOT_OK, "create");
  sh.registered = strstr(conf, "pinned_use_cuda_host_register:True") != NULL;
  for (int i = HS_SHARED; i < HS_STREAMS; i++)
    CHECK(cachalot_sim_stream_create(sh.b, i % DEVICES, &sh.streams[i]) == CACHALOT_OK, "stream");
  pthread_barrier_init(&sh.barrier, NULL, HOST_WORKERS + 1);
  pthread_t t[HOST_WORKERS + 2];
  host_completer comp[2];
  for (int i = 0; i < HOST_WORKERS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].sh = &sh;
    w[i].id = i;
    w[i].rng = 0xD1B54A32D192ED03ull * (uint64_t)(i + 1);
    pthread_create(&t[i], NULL, host_run, &w[i]);
  }
  for (int i = 0; i < 2; i++) {
    comp[i] = (host_completer){&sh, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 11)};
    pthread_create(&t[HOST_WORKERS + i], NULL, host_complete_run, &comp[i]);
  }
  for (int round = 0; round < HOST_ROUNDS; round++) {
    pthread_barrier_wait(&sh.barrier);
    CHECK(cachalot_check(sh.a) == CACHALOT_OK, "cachalot_check after host round %d", round);
    int64_t live = 0, live_bytes = 0;
    for (int i = 0; i < HOST_WORKERS; i++)
      for (int k = 0; k < w[i].n_live; k++) {
        live++;
        size_t b = 1;
        while (b < w[i].live[k].n)
          b <<= 1;
        live_bytes += (int64_t)b;
      }
    cachalot_host_stats st;
    size_t by_alloc = 0, by_register = 0;
    CHECK(cachalot_host_memory_stats(sh.a, &st) == CACHALOT_OK, "host stats");
    CHECK(cachalot_sim_host_pinned(sh.b, &by_alloc, &by_register) == CACHALOT_OK, "pinned");
    CHECK(st.active_requests.current == live && st.active_bytes.current == live_bytes,
          "%lld pinned blocks active (%lld B), the workers hold %lld (%lld B)", (long long)st.active_requests.current,
          (long long)st.active_bytes.current, (long long)live, (long long)live_bytes);
    CHECK(st.allocated_bytes.current == (int64_t)(by_alloc + by_register) &&
              (sh.registered ? by_alloc : by_register) == 0,
          "the host cache holds %lld bytes pinned, the backend %zu + %zu registered",
          (long long)st.allocated_bytes.current, by_alloc, by_register);
    pthread_barrier_wait(&sh.barrier);
  }
  for (int i = 0; i < HOST_WORKERS + 2; i++)
    pthread_join(t[i], NULL);
  pthread_barrier_destroy(&sh.barrier);
  host_complete(&sh, 0);
  for (int k = HS_SHARED; k < HS_STREAMS; k++)
    host_complete(&sh, k);
  host_empty(&sh);
  cachalot_host_stats st;
  size_t by_alloc = 1, by_register = 1;
  CHECK(cachalot_check(sh.a) == CACHALOT_OK, "final check");
  CHECK(cachalot_host_memory_stats(sh.a, &st) == CACHALOT_OK, "host stats");
  CHECK(cachalot_sim_host_pinned(sh.b, &by_alloc, &by_register) == CACHALOT_OK, "pinned");
  CHECK(st.allocations.current == 0 && by_alloc + by_register == 0 && hshadow.n == 0,
        "after freeing everything: %lld pinned blocks, %zu + %zu bytes pinned, %d shadow entries",
        (long long)st.allocations.current, by_alloc, by_register, hshadow.n);
  printf("stress: pinned host cache, conf '%s': %d threads x %d ops, 2 completing streams: %lld mallocs, "
         "%lld pinnings, %lld given back: ok\n", conf, HOST_WORKERS, HOST_ROUNDS * HOST_OPS,
         (long long)st.active_requests.allocated, (long long)st.num_host_alloc, (long long)st.num_host_free);
  cachalot_destroy(sh.a);
  cachalot_backend_destroy(sh.b);
}

int main(void) {
  run_config((size_t)64 << 30, true, "");
  run_config((size_t)64 << 30, true, "max_split_size_mb:20,roundup_power2_divisions:4");
  run_config((size_t)64 << 30, true, "release_lock_on_cudamalloc:False");
  run_config((size_t)256 << 20, false, "");
  run_config((size_t)256 << 20, false, "max_split_size_mb:20,garbage_collection_threshold:0.5,"
                                       "per_process_memory_fraction:0.9");
  /* expandable segments: runs growing, merging and losing pages while other threads' warm paths use
   * them; tight, unmapping at every OOM retry and (compact) before new peaks */
  run_config((size_t)64 << 30, true, "expandable_segments:True");
  run_config((size_t)256 << 20, false, "expandable_segments:True,expandable_compact:True");
  run_config((size_t)256 << 20, false, "preset:low_fragmentation");
  run_config((size_t)256 << 20, false, "expandable_segments:True,max_split_size_mb:20,"
                                       "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9");
  warning_handlers();
  /* contexts, as the PyTorch backend passes them while history is on */
  run_config_ctx((size_t)64 << 30, true, "", true, true);
  run_config_ctx((size_t)256 << 20, false, "expandable_segments:True", true, true);
  /* history without contexts: the warm paths record their own entries */
  run_config_ctx((size_t)64 << 30, true, "", false, true);
  run_config_ctx((size_t)256 << 20, false, "expandable_segments:True", false, true);
  /* the pinned-host cache: blocks shared by every thread, reuse gated by events on many streams */
  host_stress("");
  host_stress("pinned_use_cuda_host_register:True,pinned_num_register_threads:2");
  printf("1 passed, 0 failed\n");
  return 0;
}
