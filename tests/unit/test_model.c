/* cachalot against a deliberately simple reference model of PyTorch's size and free rules on one stream:
 * segments as plain arrays of blocks in address order, best fit by scanning every free block, the split rule,
 * merges with free neighbours. Seeded random sequences of malloc and free; after every operation the pointer
 * cachalot returned must be the one the model picks, the split and byte stats must equal the model's,
 * and cachalot_check must pass.
 *
 * The sizes are drawn so that many free blocks share a size class (the index keeps blocks in per-class
 * trees, and nodes are updated in place when a split or merge keeps their class): the model does not
 * know about classes at all, so any placement or tree mistake shows as a different pointer or a failed
 * check. */
#include "helpers.h"

#include "allocator/core/sizes.h"

enum { MAX_SEGS = 64, MAX_BLOCKS = 4096, LIVE = 96 };

typedef struct {
  uintptr_t ptr;
  size_t size;
  bool free;
} mblock;

typedef struct {
  uintptr_t ptr;
  size_t size;
  bool small;
  int n;
  mblock *b; /* MAX_BLOCKS */
} mseg;

typedef struct {
  mseg seg[MAX_SEGS];
  int n_seg;
} model;

static size_t round_req(size_t s) { return s < 512 ? 512 : (s + 511) / 512 * 512; }

/* The model's best fit: the smallest free block of the kind that fits, the lowest address among equal
 * sizes. */
static bool model_fit(const model *m, bool small, size_t size, int *si, int *bi) {
  bool found = false;
  for (int s = 0; s < m->n_seg; s++) {
    if (m->seg[s].small != small)
      continue;
    for (int i = 0; i < m->seg[s].n; i++) {
      const mblock *b = &m->seg[s].b[i];
      if (!b->free || b->size < size)
        continue;
      const mblock *best = found ? &m->seg[*si].b[*bi] : NULL;
      if (!best || b->size < best->size || (b->size == best->size && b->ptr < best->ptr)) {
        *si = s;
        *bi = i;
        found = true;
      }
    }
  }
  return found;
}

static void model_insert(mseg *g, int at, mblock b) {
  memmove(&g->b[at + 1], &g->b[at], (size_t)(g->n - at) * sizeof b);
  g->b[at] = b;
  g->n++;
}
static void model_erase(mseg *g, int at) {
  memmove(&g->b[at], &g->b[at + 1], (size_t)(g->n - at - 1) * sizeof *g->b);
  g->n--;
}

/* malloc in the model; `got` is what cachalot returned (it names a new segment's address). */
static uintptr_t model_malloc(model *m, size_t req, uintptr_t got, size_t *block_size) {
  const size_t size = round_req(req);
  const bool small = size <= CL_SMALL_SIZE;
  int s, i;
  if (!model_fit(m, small, size, &s, &i)) {
    assert_true(m->n_seg < MAX_SEGS);
    s = m->n_seg++;
    mseg *g = &m->seg[s];
    g->ptr = got;
    g->size = cl_segment_size(size);
    g->small = small;
    g->n = 1;
    g->b[0] = (mblock){got, g->size, true};
    i = 0;
  }
  mseg *g = &m->seg[s];
  mblock *b = &g->b[i];
  const size_t rest = b->size - size;
  const bool split = small ? rest >= 512 : rest > CL_SMALL_SIZE;
  const uintptr_t p = b->ptr;
  b->free = false;
  if (split) {
    b->size = size;
    model_insert(g, i + 1, (mblock){p + size, rest, true});
  }
  *block_size = g->b[i].size; /* a block not split is handed out whole */
  return p;
}

static void model_free(model *m, uintptr_t p) {
  for (int s = 0; s < m->n_seg; s++) {
    mseg *g = &m->seg[s];
    for (int i = 0; i < g->n; i++) {
      if (g->b[i].ptr != p)
        continue;
      assert_false(g->b[i].free);
      g->b[i].free = true;
      if (i + 1 < g->n && g->b[i + 1].free) {
        g->b[i].size += g->b[i + 1].size;
        model_erase(g, i + 1);
      }
      if (i > 0 && g->b[i - 1].free) {
        g->b[i - 1].size += g->b[i].size;
        model_erase(g, i);
      }
      return;
    }
  }
  fail_msg("model: 0x%llx is not a block", (unsigned long long)p);
}

/* The model's inactive_split / inactive_split_bytes of a kind: free blocks of split segments. */
static void model_split(const model *m, bool small, int64_t *blocks, int64_t *bytes) {
  *blocks = *bytes = 0;
  for (int s = 0; s < m->n_seg; s++) {
    const mseg *g = &m->seg[s];
    if (g->small != small || g->n < 2)
      continue;
    for (int i = 0; i < g->n; i++)
      if (g->b[i].free) {
        (*blocks)++;
        *bytes += (int64_t)g->b[i].size;
      }
  }
}

static uint64_t rng_next(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* Sizes: a few narrow bands (many blocks per class), exact small classes, and large requests. */
static size_t draw_size(uint64_t *r) {
  const uint64_t k = rng_next(r) % 8;
  const uint64_t v = rng_next(r);
  switch (k) {
  case 0: return 1 + v % 512;                              /* 512 B after rounding */
  case 1: return 300 * 512 + v % (8 * 512);                /* one band of the small classes */
  case 2: return 1 + v % (4 * KiB);
  case 3: return 64 * KiB + v % (64 * KiB);
  case 4: return 200 * KiB + v % (2 * KiB);                /* very narrow: equal sizes, order by address */
  case 5: return 3 * MiB + v % (256 * KiB);                /* one band of the large classes */
  case 6: return 1 * MiB + 1 + v % (9 * MiB);
  default: return 12 * MiB + v % (4 * MiB);
  }
}

static void run_seed(uint64_t seed, int ops) {
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  model *m = calloc(1, sizeof *m);
  mblock *store = calloc((size_t)MAX_SEGS * MAX_BLOCKS, sizeof *store);
  assert_non_null(m);
  assert_non_null(store);
  for (int g = 0; g < MAX_SEGS; g++)
    m->seg[g].b = store + (size_t)g * MAX_BLOCKS;
  void *live[LIVE] = {0};
  size_t live_bytes = 0;
  size_t bytes_of[LIVE] = {0}; /* the block sizes handed out */
  uint64_t r = seed;
  for (int op = 0; op < ops; op++) {
    const int slot = (int)(rng_next(&r) % LIVE);
    if (live[slot]) {
      OK(cachalot_free(e.a, live[slot]));
      model_free(m, (uintptr_t)live[slot]);
      live[slot] = NULL;
      live_bytes -= bytes_of[slot];
    } else {
      const size_t req = draw_size(&r);
      void *p = NULL;
      OK(cachalot_malloc(e.a, 0, req, s, &p));
      const uintptr_t want = model_malloc(m, req, (uintptr_t)p, &bytes_of[slot]);
      if ((uintptr_t)p != want)
        fail_msg("seed %llu op %d: malloc(%zu) gave 0x%llx, the model 0x%llx", (unsigned long long)seed, op, req,
                 (unsigned long long)(uintptr_t)p, (unsigned long long)want);
      live[slot] = p;
      live_bytes += bytes_of[slot];
    }
    CHECK(e.a);
    cachalot_device_stats st = STATS(e.a, 0);
    EQ(st.allocated_bytes[CACHALOT_STAT_ALL].current, live_bytes);
    for (int k = 0; k < 2; k++) {
      int64_t blocks, bytes;
      model_split(m, k == 1, &blocks, &bytes);
      const int t = k == 1 ? CACHALOT_STAT_SMALL_POOL : CACHALOT_STAT_LARGE_POOL;
      EQ(st.inactive_split[t].current, blocks);
      EQ(st.inactive_split_bytes[t].current, bytes);
    }
  }
  for (int i = 0; i < LIVE; i++)
    if (live[i])
      FREE(e.a, live[i]);
  EQ(STATS(e.a, 0).inactive_split[CACHALOT_STAT_ALL].current, 0);
  free(store);
  free(m);
  env_free(&e);
}

static void test_random_sequences_match_the_model(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 12; seed++)
    run_seed(seed * 0x9E3779B97F4A7C15ull, 1500);
}

/* ---- stream order: a second model, of what PyTorch's rules promise across streams ----
 * Ranges, not placement: every live allocation covers [p, p + rounded request); a freed block that other
 * streams used is *held* until the work those streams had enqueued when it was freed has completed (the
 * model counts, per stream, work launched and work completed, as the simulated device does). Seeded
 * sequences of malloc, free, record_stream, kernel launches, stream completions and empty_cache on three
 * streams, in four configs; after every operation no live range may overlap another live or a held range
 * (no memory handed out twice, nothing reused before its streams' events), the allocation count and the
 * requested bytes of live blocks must be cachalot's, and the device must hold what reserved_bytes says. */
enum { SLIVE = 48, NSTREAM = 3 };

typedef struct {
  uintptr_t lo, hi;
  uint64_t until[NSTREAM]; /* held while launched work numbered up to until[s] has not completed on s */
  bool used;
} held_range;

typedef struct {
  uintptr_t p;
  size_t size, req;
  bool uses[NSTREAM];
} live_range;

static bool overlaps(uintptr_t a0, uintptr_t a1, uintptr_t b0, uintptr_t b1) { return a0 < b1 && b0 < a1; }

static cachalot_plan_stats plan_stats; /* the step plan's at the end of the last run_stream_seed */

/* Frees live[slot], holding its range until the streams that used it have done the work enqueued so far. */
static void stream_free(env *e, live_range *live, int slot, held_range *held, size_t *n_held,
                       const uint64_t *launched) {
  FREE(e->a, (void *)live[slot].p);
  held_range h = {live[slot].p, live[slot].p + live[slot].size, {0}, false};
  for (int t = 0; t < NSTREAM; t++)
    if (live[slot].uses[t] && t != 0) { /* stream 0 allocated it (the allocation stream needs no event) */
      h.until[t] = launched[t];
      h.used = true;
    }
  if (h.used && *n_held < 4096)
    held[(*n_held)++] = h;
  live[slot] = (live_range){0};
}

/* With step_ops > 0 the sequence repeats: every step_ops operations, what is live is freed in slot order
 * and the generator starts again from the seed, so that the allocator sees a step that repeats (the step
 * plan of expandable_plan forms on it) among launches, completions and record_stream on other streams;
 * every fifth step is drawn from another seed, a deviation whose blocks the plan's places may meet. */
static void run_stream_seed(uint64_t seed, const char *conf, int ops, int step_ops) {
  env e = ENV(1, 4 * GiB, conf);
  cachalot_stream st[NSTREAM] = {NULL, STREAM(e.b, 0), STREAM(e.b, 0)};
  uint64_t launched[NSTREAM] = {0}, completed[NSTREAM] = {0};
  live_range live[SLIVE] = {{0}};
  held_range *held = calloc(4096, sizeof *held);
  assert_non_null(held);
  size_t n_held = 0;
  uint64_t r = seed;
  for (int op = 0; op < ops; op++) {
    if (step_ops && op % step_ops == 0) {
      for (int i = 0; i < SLIVE; i++)
        if (live[i].p)
          stream_free(&e, live, i, held, &n_held, launched);
      r = (op / step_ops) % 5 == 4 ? ~seed : seed; /* every fifth step another: a deviation */
    }
    const uint64_t k = rng_next(&r) % 100;
    const int slot = (int)(rng_next(&r) % SLIVE);
    const int si = (int)(rng_next(&r) % NSTREAM);
    if (k < 8) { /* work on a stream (stream 0, the legacy one, never runs kernels here) */
      if (si) {
        OK(cachalot_sim_launch(e.b, st[si]));
        launched[si]++;
      }
    } else if (k < 16) {
      if (si) {
        COMPLETE(&e, st[si]);
        completed[si] = launched[si];
      }
    } else if (k < 18) {
      EMPTY(e.a); /* waits for every event: every held range is free now */
      n_held = 0;
      for (int t = 1; t < NSTREAM; t++)
        completed[t] = launched[t];
    } else if (live[slot].p && k < 30) {
      RECORD(e.a, (void *)live[slot].p, st[si]);
      live[slot].uses[si] = true;
    } else if (live[slot].p) {
      stream_free(&e, live, slot, held, &n_held, launched);
    } else {
      const size_t req = draw_size(&r);
      void *p = NULL;
      const cachalot_device_stats before = STATS(e.a, 0);
      OK(cachalot_malloc(e.a, 0, req, NULL, &p));
      const cachalot_device_stats after = STATS(e.a, 0);
      if (after.num_device_free != before.num_device_free) {
        /* it synchronized the device to unmap pages (compaction before a new peak; the simulated device
         * then completes every stream): nothing is held any more. The allocator's own counter stands for
         * the synchronization here, so an unmap without one would go unseen by this model; test_expandable
         * and the gpu suite's unmap under a running kernel check that one. */
        n_held = 0;
        for (int t = 1; t < NSTREAM; t++)
          completed[t] = launched[t];
      }
      const uintptr_t lo = (uintptr_t)p, hi = lo + round_req(req);
      for (int i = 0; i < SLIVE; i++)
        if (live[i].p && overlaps(lo, hi, live[i].p, live[i].p + live[i].size))
          fail_msg("seed %llu op %d: [0x%llx, 0x%llx) overlaps a live allocation", (unsigned long long)seed, op,
                   (unsigned long long)lo, (unsigned long long)hi);
      for (size_t i = 0; i < n_held; i++) {
        bool still = false;
        for (int t = 1; t < NSTREAM; t++)
          still |= held[i].until[t] > completed[t];
        if (still && overlaps(lo, hi, held[i].lo, held[i].hi))
          fail_msg("seed %llu op %d: [0x%llx, 0x%llx) reuses memory a stream may still be using",
                   (unsigned long long)seed, op, (unsigned long long)lo, (unsigned long long)hi);
      }
      live[slot] = (live_range){lo, hi - lo, req, {false}};
      CHECK(e.a);
    }
    /* drop held ranges whose streams are done */
    for (size_t i = 0; i < n_held;) {
      bool still = false;
      for (int t = 1; t < NSTREAM; t++)
        still |= held[i].until[t] > completed[t];
      if (still)
        i++;
      else
        held[i] = held[--n_held];
    }
    cachalot_device_stats stats = STATS(e.a, 0);
    int64_t count = 0, requested = 0;
    for (int i = 0; i < SLIVE; i++)
      if (live[i].p) {
        count++;
        requested += (int64_t)live[i].req;
      }
    EQ(stats.allocation[CACHALOT_STAT_ALL].current, count);
    /* requested bytes also count blocks freed but pending: at least the live ones */
    if (stats.requested_bytes[CACHALOT_STAT_ALL].current < requested)
      fail_msg("seed %llu op %d: requested_bytes %lld below the live requests %lld", (unsigned long long)seed, op,
               (long long)stats.requested_bytes[CACHALOT_STAT_ALL].current, (long long)requested);
    EXPECT_RESERVED_IS_USED(&e, 0);
  }
  OK(cachalot_plan_stats_get(e.a, 0, &plan_stats));
  for (int i = 0; i < SLIVE; i++)
    if (live[i].p)
      FREE(e.a, (void *)live[i].p);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_RESERVED_IS_USED(&e, 0);
  free(held);
  env_free(&e);
}

static void test_stream_order_holds(void **state) {
  (void)state;
  static const char *confs[] = {"", "max_split_size_mb:20,roundup_power2_divisions:4", "expandable_segments:True",
                                "preset:low_fragmentation"};
  for (uint64_t seed = 1; seed <= 8; seed++)
    run_stream_seed(seed * 0x2545F4914F6CDD1Dull, confs[seed % 4], 1500, 0);
}

/* The same model over a step that repeats, with the preset: the step plan forms and serves (checked: not a
 * test that could pass without a plan), and no range it hands out overlaps a live or a held one. */
static void test_stream_order_holds_with_a_plan(void **state) {
  (void)state;
  int64_t served = 0, missed = 0;
  for (uint64_t seed = 1; seed <= 6; seed++) {
    run_stream_seed(seed * 0x9E3779B97F4A7C15ull, "preset:low_fragmentation", 3000, 150);
    served += plan_stats.served;
    missed += plan_stats.missed;
  }
  if (served == 0) /* (test_plan makes planned ranges that are taken: the misses) */
    fail_msg("%lld mallocs served by a plan, %lld missed", (long long)served, (long long)missed);
}

/* ---- stream order of the pinned-host cache (include/cachalot/host.h): a third model ----
 * Blocks, not ranges: each pinning is a block of a power of two, handed out whole. The model keeps every
 * block's state (allocated, waiting for the events recorded at its free, free, given back) and, per
 * stream, how many times the stream has completed; the events recorded at a free complete at the
 * stream's next completion. Seeded sequences of host malloc (size 0 among them), free,
 * cachalot_host_record_event on five streams of two devices (the default streams too, and streams named
 * with another device's number), kernel launches, stream completion, empty_cache, settings changed
 * between the two ways of pinning, and misuse that must change nothing. After every malloc:
 *   - safety: the block handed out is not allocated, and not one whose marked streams had work still to
 *     complete at its free (an event recorded then that has not completed);
 *   - liveness: when a free block of the size exists, one is handed out, and exactly the one most recently
 *     freed (a waiting block counts as freed when the cache sees its events complete, polling at malloc
 *     and empty_cache, in the order the blocks were freed); else a new pinning;
 * and after every call the host stats and the pinned bytes of each kind are the model's. Giving back a
 * block of cudaHostAlloc's kind synchronizes the device (every stream completes), registered ones not. */
enum { HREFS = 5, HSLOTS = 24, HBLOCKS = 1024 };

typedef enum { HM_GONE, HM_ALLOCATED, HM_WAITING, HM_FREE } hm_state;

typedef struct {
  char *p;
  size_t size;
  bool registered;
  hm_state state;
  unsigned marks, waits;  /* refs marked since handed out; refs whose events its free recorded */
  uint64_t need[HREFS];   /* waiting until completions[r] > need[r] for each r in waits */
  uint64_t stamp;         /* waiting: when freed; free: when it joined its free list */
} hm_block;

typedef struct {
  hm_block b[HBLOCKS];
  int n;
  uint64_t completions[HREFS], clock;
  bool registered;
  int64_t pins, unpins;
} host_model;

static bool hm_events_done(const host_model *m, const hm_block *b) {
  for (int r = 0; r < HREFS; r++)
    if ((b->waits >> r & 1) && m->completions[r] <= b->need[r])
      return false;
  return true;
}

/* What the cache's poll does: waiting blocks whose events completed join their free lists, in the order
 * they were freed. */
static void hm_poll(host_model *m) {
  for (;;) {
    int first = -1;
    for (int i = 0; i < m->n; i++)
      if (m->b[i].state == HM_WAITING && hm_events_done(m, &m->b[i]) &&
          (first < 0 || m->b[i].stamp < m->b[first].stamp))
        first = i;
    if (first < 0)
      return;
    m->b[first].state = HM_FREE;
    m->b[first].stamp = ++m->clock;
  }
}

static int hm_lookup(const host_model *m, const void *p) {
  for (int i = 0; i < m->n; i++)
    if (m->b[i].state != HM_GONE && m->b[i].p == p)
      return i;
  return -1;
}

static size_t pow2_up(size_t n) {
  size_t r = 1;
  while (r < n)
    r <<= 1;
  return r;
}

/* Few sizes, so that blocks are asked for again; 0 among them. */
static size_t draw_host_size(uint64_t *r) {
  const uint64_t k = rng_next(r) % 10, v = rng_next(r);
  switch (k) {
  case 0: return 0;
  case 1: return 1 + v % 8;
  case 2: return 65 + v % 64;          /* 128 B */
  case 3: case 4: return 2049 + v % 2048; /* 4 KiB */
  case 5: return 4097 + v % 4096;      /* 8 KiB */
  case 6: return 60 * KiB + v % (4 * KiB);
  case 7: return 1 + v % (256 * KiB);
  default: return 4096;
  }
}

static void hm_verify(const host_model *m, env *e, uint64_t seed, int op) {
  int64_t blocks = 0, bytes = 0, active = 0, active_b = 0;
  size_t kind[2] = {0, 0};
  for (int i = 0; i < m->n; i++) {
    if (m->b[i].state == HM_GONE)
      continue;
    blocks++;
    bytes += (int64_t)m->b[i].size;
    kind[m->b[i].registered] += m->b[i].size;
    if (m->b[i].state == HM_ALLOCATED) {
      active++;
      active_b += (int64_t)m->b[i].size;
    }
  }
  cachalot_host_stats s;
  OK(cachalot_host_memory_stats(e->a, &s));
  size_t by_alloc = 0, by_register = 0;
  OK(cachalot_sim_host_pinned(e->b, &by_alloc, &by_register));
  if (s.allocations.current != blocks || s.allocated_bytes.current != bytes || s.active_requests.current != active ||
      s.active_bytes.current != active_b || s.num_host_alloc != m->pins || s.num_host_free != m->unpins ||
      by_alloc != kind[0] || by_register != kind[1])
    fail_msg("seed %llu op %d: host stats %lld blocks (%lld B), %lld active (%lld B), %lld pinnings, %lld unpinnings, "
             "pinned %zu + %zu registered; the model %lld (%lld), %lld (%lld), %lld, %lld, %zu + %zu",
             (unsigned long long)seed, op, (long long)s.allocations.current, (long long)s.allocated_bytes.current,
             (long long)s.active_requests.current, (long long)s.active_bytes.current, (long long)s.num_host_alloc,
             (long long)s.num_host_free, by_alloc, by_register, (long long)blocks, (long long)bytes,
             (long long)active, (long long)active_b, (long long)m->pins, (long long)m->unpins, kind[0], kind[1]);
  CHECK(e->a);
}

static void run_host_seed(uint64_t seed, const char *conf, int ops) {
  env e = ENV(2, 0, conf);
  /* refs 0 and 1: the default streams of devices 0 and 1; 2, 3 of device 0; 4 of device 1 */
  const cachalot_stream st[HREFS] = {NULL, NULL, STREAM(e.b, 0), STREAM(e.b, 0), STREAM(e.b, 1)};
  host_model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->registered = strstr(conf, "pinned_use_cuda_host_register:True") != NULL;
  char *slot[HSLOTS] = {0};
  size_t req[HSLOTS] = {0};
  int reused = 0, fresh = 0, held_back = 0;
  uint64_t r = seed;
  for (int op = 0; op < ops; op++) {
    const uint64_t k = rng_next(&r) % 100;
    const int sl = (int)(rng_next(&r) % HSLOTS);
    const int ref = (int)(rng_next(&r) % HREFS);
    if (k < 8) { /* work on a stream; an event recorded at a free waits for its stream's next completion
                  * whether work was launched before it or not */
      OK(cachalot_sim_launch(e.b, ref == 1 ? st[4] : st[ref]));
    } else if (k < 18) {
      OK(cachalot_sim_stream_complete(e.b, st[ref])); /* NULL: both default streams */
      if (ref < 2) {
        m->completions[0]++;
        m->completions[1]++;
      } else {
        m->completions[ref]++;
      }
    } else if (k < 20) {
      OK(cachalot_host_empty_cache(e.a));
      hm_poll(m);
      bool synced = false;
      for (int i = 0; i < m->n; i++)
        if (m->b[i].state == HM_FREE) {
          m->b[i].state = HM_GONE;
          synced |= !m->b[i].registered;
          m->unpins++;
        }
      if (synced) /* cudaFreeHost synchronizes the device; events not polled yet are seen at the next poll */
        for (int t = 0; t < HREFS; t++)
          m->completions[t]++;
    } else if (k < 22) {
      static const char *const changes[] = {"pinned_use_cuda_host_register:True",
                                            "pinned_use_cuda_host_register:False",
                                            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
                                            "pinned_num_register_threads:1"};
      const int c = (int)(rng_next(&r) % 4);
      OK(cachalot_set_settings(e.a, changes[c]));
      if (c < 3)
        m->registered = c != 1;
    } else if (k < 25) { /* misuse: nothing may change */
      char *p = slot[sl];
      if (p) {
        STATUS(cachalot_host_free(e.a, p + 1), CACHALOT_ERROR_INVALID_POINTER);
      } else {
        int i = (int)(rng_next(&r) % (uint64_t)(m->n ? m->n : 1));
        if (i < m->n && m->b[i].state != HM_ALLOCATED && m->b[i].state != HM_GONE) { /* freed already */
          STATUS(cachalot_host_free(e.a, m->b[i].p), CACHALOT_ERROR_INVALID_POINTER);
          STATUS(cachalot_host_record_event(e.a, m->b[i].p, 0, st[2]), CACHALOT_ERROR_INVALID_POINTER);
        }
      }
    } else if (slot[sl] && k < 50) {
      /* a stream of either device may be named with either device's number: the event goes on the stream */
      const int device = ref == 1 ? 1 : ref == 0 ? 0 : (int)(rng_next(&r) % 2);
      OK(cachalot_host_record_event(e.a, slot[sl], device, st[ref]));
      m->b[hm_lookup(m, slot[sl])].marks |= 1u << ref;
    } else if (slot[sl]) {
      if ((unsigned char)slot[sl][0] != (unsigned char)sl || (unsigned char)slot[sl][req[sl] - 1] != (unsigned char)sl)
        fail_msg("seed %llu op %d: slot %d's block was written by another holder", (unsigned long long)seed, op, sl);
      OK(cachalot_host_free(e.a, slot[sl]));
      hm_block *b = &m->b[hm_lookup(m, slot[sl])];
      b->state = b->marks ? HM_WAITING : HM_FREE;
      b->waits = b->marks;
      b->marks = 0;
      for (int t = 0; t < HREFS; t++)
        b->need[t] = m->completions[t];
      b->stamp = ++m->clock;
      slot[sl] = NULL;
    } else {
      const size_t n = draw_host_size(&r);
      void *p = (void *)(uintptr_t)0x1;
      OK(cachalot_host_malloc(e.a, n, &p));
      if (n == 0) {
        assert_null(p);
      } else {
        hm_poll(m);
        const size_t size = pow2_up(n);
        int head = -1, waiting = 0;
        for (int i = 0; i < m->n; i++) {
          if (m->b[i].size != size)
            continue;
          waiting += m->b[i].state == HM_WAITING;
          if (m->b[i].state == HM_FREE && (head < 0 || m->b[i].stamp > m->b[head].stamp))
            head = i;
        }
        const int got = hm_lookup(m, p);
        if (got >= 0 && m->b[got].state == HM_ALLOCATED)
          fail_msg("seed %llu op %d: host_malloc(%zu) handed out %p, a block already handed out",
                   (unsigned long long)seed, op, n, p);
        if (got >= 0 && m->b[got].state == HM_WAITING)
          fail_msg("seed %llu op %d: host_malloc(%zu) handed out %p, whose streams had work to complete at its "
                   "free that has not completed", (unsigned long long)seed, op, n, p);
        if (head >= 0 && got < 0)
          fail_msg("seed %llu op %d: host_malloc(%zu) pinned a new block with %p free", (unsigned long long)seed, op,
                   n, (void *)m->b[head].p);
        if (head >= 0 && got != head)
          fail_msg("seed %llu op %d: host_malloc(%zu) gave %p, the most recently freed block is %p",
                   (unsigned long long)seed, op, n, p, (void *)m->b[head].p);
        if (got >= 0 && m->b[got].size != size)
          fail_msg("seed %llu op %d: host_malloc(%zu) gave a block of %zu", (unsigned long long)seed, op, n,
                   m->b[got].size);
        if (head >= 0) {
          m->b[head].state = HM_ALLOCATED;
          reused++;
        } else {
          assert_true(m->n < HBLOCKS);
          m->b[m->n++] = (hm_block){.p = p, .size = size, .registered = m->registered, .state = HM_ALLOCATED};
          m->pins++;
          fresh++;
          held_back += waiting > 0;
        }
        slot[sl] = p;
        req[sl] = n;
        memset(p, sl, n); /* the whole request is the caller's to write */
      }
    }
    hm_verify(m, &e, seed, op);
  }
  for (int i = 0; i < HSLOTS; i++)
    if (slot[i])
      OK(cachalot_host_free(e.a, slot[i]));
  OK(cachalot_sim_stream_complete(e.b, NULL));
  for (int t = 2; t < HREFS; t++)
    OK(cachalot_sim_stream_complete(e.b, st[t]));
  OK(cachalot_host_empty_cache(e.a));
  cachalot_host_stats s;
  OK(cachalot_host_memory_stats(e.a, &s));
  EQ(s.allocations.current, 0);
  EQ(s.num_host_alloc, s.num_host_free);
  size_t by_alloc = 1, by_register = 1;
  OK(cachalot_sim_host_pinned(e.b, &by_alloc, &by_register));
  EQ(by_alloc + by_register, 0);
  /* every rule was exercised: blocks reused, new pinnings, and pinnings because a block of the size was
   * still waiting for its streams */
  print_message("host seed %llu, '%s': %d mallocs reused a block, %d pinned (%d while one of the size waited), "
                "%lld given back\n", (unsigned long long)seed, conf, reused, fresh, held_back, (long long)m->unpins);
  if (reused < 50 || fresh < 10 || held_back < 5)
    fail_msg("seed %llu: %d reused, %d pinned, %d pinned while a block waited: too few", (unsigned long long)seed,
             reused, fresh, held_back);
  free(m);
  env_free(&e);
}

static void test_host_stream_order_holds(void **state) {
  (void)state;
  static const char *confs[] = {"", "pinned_use_cuda_host_register:True",
                                "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"};
  for (uint64_t seed = 1; seed <= 9; seed++)
    run_host_seed(seed * 0xD1B54A32D192ED03ull, confs[seed % 3], 1500);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_sequences_match_the_model),
      cmocka_unit_test(test_stream_order_holds),
      cmocka_unit_test(test_stream_order_holds_with_a_plan),
      cmocka_unit_test(test_host_stream_order_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
