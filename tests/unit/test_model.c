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

#include "allocator/sizes.h"

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

static void run_stream_seed(uint64_t seed, const char *conf, int ops) {
  env e = ENV(1, 4 * GiB, conf);
  cachalot_stream st[NSTREAM] = {NULL, STREAM(e.b, 0), STREAM(e.b, 0)};
  uint64_t launched[NSTREAM] = {0}, completed[NSTREAM] = {0};
  live_range live[SLIVE] = {{0}};
  held_range *held = calloc(4096, sizeof *held);
  assert_non_null(held);
  size_t n_held = 0;
  uint64_t r = seed;
  for (int op = 0; op < ops; op++) {
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
      FREE(e.a, (void *)live[slot].p);
      held_range h = {live[slot].p, live[slot].p + live[slot].size, {0}, false};
      for (int t = 0; t < NSTREAM; t++)
        if (live[slot].uses[t] && t != 0) { /* stream 0 allocated it (the allocation stream needs no event) */
          h.until[t] = launched[t];
          h.used = true;
        }
      if (h.used && n_held < 4096)
        held[n_held++] = h;
      live[slot] = (live_range){0};
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
    run_stream_seed(seed * 0x2545F4914F6CDD1Dull, confs[seed % 4], 1500);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_sequences_match_the_model),
      cmocka_unit_test(test_stream_order_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
