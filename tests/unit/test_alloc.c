/* The caching allocator's behaviour on the simulated device (PyTorch's rules for sizes, frees, malloc steps,
 * stats and config): rounding, the split rule, best fit, merging, per-stream caching, record_stream,
 * max_split_size, OOM, memory fraction, garbage collection, stats, run-time settings, several devices. Every
 * step is followed by cachalot_check() and the numbers are PyTorch's, exactly. */
#include "helpers.h"

#include <locale.h>
#include <math.h>

/* ==== §1 rounding ============================================================================== */

typedef struct {
  const char *conf;
  size_t req;     /* bytes asked for */
  size_t block;   /* the block handed out */
  size_t seg;     /* the segment made for it */
  size_t split_b; /* the free rest left in the segment (0: not split) */
} round_case;

#define DIV_LIST "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]"

static const round_case round_cases[] = {
    /* below 512 and exact multiples */
    {"", 1, 512, 2 * MiB, 2 * MiB - 512},
    {"", 511, 512, 2 * MiB, 2 * MiB - 512},
    {"", 512, 512, 2 * MiB, 2 * MiB - 512},
    {"", 513, 1024, 2 * MiB, 2 * MiB - 1024},
    /* exactly 1 MiB is small; one byte more is large, in a 20 MiB segment */
    {"", MiB, MiB, 2 * MiB, MiB},
    {"", MiB + 1, MiB + 512, 20 * MiB, 19 * MiB - 512},
    {"", 4 * MiB, 4 * MiB, 20 * MiB, 16 * MiB},
    /* below 10 MiB: 20 MiB segments; from 10 MiB: the rounded size rounded up to 2 MiB */
    {"", 10 * MiB - 512, 10 * MiB - 512, 20 * MiB, 10 * MiB + 512},
    {"", 10 * MiB - 1, 10 * MiB, 10 * MiB, 0},
    {"", 10 * MiB, 10 * MiB, 10 * MiB, 0},
    {"", 10 * MiB + 1, 10 * MiB + 512, 12 * MiB, 2 * MiB - 512},
    {"", 10 * MiB + 512, 10 * MiB + 512, 12 * MiB, 2 * MiB - 512},
    /* a rest of at most 1 MiB in the large pool is not split off: the caller gets the whole segment */
    {"", 11 * MiB - 512, 11 * MiB - 512, 12 * MiB, MiB + 512},
    {"", 11 * MiB, 12 * MiB, 12 * MiB, 0},
    {"", 11 * MiB + 1, 12 * MiB, 12 * MiB, 0},
    /* roundup_power2_divisions:4 (84 MiB -> 96 MiB, as in PyTorch) */
    {"roundup_power2_divisions:4", 84 * MiB, 100663296, 96 * MiB, 0},
    {"roundup_power2_divisions:4", 64 * MiB, 64 * MiB, 64 * MiB, 0},          /* a power of two stays */
    {"roundup_power2_divisions:4", 64 * MiB + 1, 80 * MiB, 80 * MiB, 0},
    {"roundup_power2_divisions:4", 1537, 2048, 2 * MiB, 2 * MiB - 2048},      /* <= 512*4: plain (not 1792) */
    {"roundup_power2_divisions:4", 4097, 5120, 2 * MiB, 2 * MiB - 5120},      /* > 512*4: divisions (not 4608)
    * */
    {"roundup_power2_divisions:2", 3 * MiB + 1, 4 * MiB, 20 * MiB, 16 * MiB},
    /* the list form (PyTorch's documented example) */
    {DIV_LIST, 84 * MiB, 92274688, 88 * MiB, 0},
    {DIV_LIST, 400 * MiB, 512 * MiB, 512 * MiB, 0},
    {DIV_LIST, 256 * MiB, 256 * MiB, 256 * MiB, 0},                           /* a power of two stays */
    {DIV_LIST, 1100 * MiB, 1100 * MiB, 1100 * MiB, 0},                        /* 1024:1 -> plain */
};

static void test_rounding_table(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof round_cases / sizeof round_cases[0]; i++) {
    const round_case *c = &round_cases[i];
    print_message("case %zu: conf '%s', %zu bytes\n", i, c->conf, c->req);
    env e = ENV(1, 0, c->conf);
    cachalot_stream s = STREAM(e.b, 0);
    const bool small = c->block <= MiB;
    const int64_t split = c->split_b ? 1 : 0;
    void *p = ALLOC(e.a, 0, c->req, s);
    pool_x x = PX(.alloc = 1, .alloc_b = (int64_t)c->block, .active = 1, .active_b = (int64_t)c->block,
                  .req_b = (int64_t)c->req, .seg = 1, .res_b = (int64_t)c->seg, .split = split,
                  .split_b = (int64_t)c->split_b);
    EXPECT_POOLS(e.a, 0, small ? x : PX0, small ? PX0 : x);
    EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
    EXPECT_RESERVED_IS_USED(&e, 0);

    FREE(e.a, p);
    pool_x y = PX(.seg = 1, .res_b = (int64_t)c->seg);
    EXPECT_POOLS(e.a, 0, small ? y : PX0, small ? PX0 : y);

    /* The same request again takes the cached block: same pointer, no device call. */
    void *q = ALLOC(e.a, 0, c->req, s);
    assert_ptr_equal(q, p);
    EXPECT_POOLS(e.a, 0, small ? x : PX0, small ? PX0 : x);
    EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
    FREE(e.a, q);

    EMPTY(e.a);
    EXPECT_POOLS(e.a, 0, PX0, PX0);
    EXPECT_COUNTERS(e.a, 0, 1, 1, 0, 0, 1);
    EQ(USED(e.b, 0), 0);
    env_free(&e);
  }
}

static void test_size_zero_and_huge(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_device_stats before = STATS(e.a, 0);
  void *p = (void *)(uintptr_t)0x1234;
  OK(cachalot_malloc(e.a, 0, 0, NULL, &p));
  assert_null(p);
  CHECK(e.a);
  OK(cachalot_free(e.a, p)); /* free(NULL) is a no-op */
  CHECK(e.a);

  p = (void *)(uintptr_t)0x1234;
  STATUS(cachalot_malloc(e.a, 0, (size_t)1 << 60, NULL, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  STR_EQ(cachalot_last_error(), "CUDA out of memory. Tried to allocate more than 1EB memory.");
  CHECK(e.a);
  p = (void *)(uintptr_t)0x1234;
  STATUS(cachalot_malloc(e.a, 0, SIZE_MAX, NULL, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "more than 1EB");
  CHECK(e.a);
  /* PyTorch rejects these before the allocator proper: nothing is counted. */
  cachalot_device_stats after = STATS(e.a, 0);
  assert_memory_equal(&before, &after, sizeof before);

  /* One below 2^60 goes the whole way (its segment is 2^60 bytes) and is a counted OOM. */
  STATUS(cachalot_malloc(e.a, 0, ((size_t)1 << 60) - 1, NULL, &p), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(p);
  CONTAINS(cachalot_last_error(), "CUDA out of memory. Tried to allocate 1073741824.00 GiB. GPU 0 has a total "
                                  "capacity of 80.00 GiB of which 80.00 GiB is free.");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 0, 0, 1, 1, 1);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);
}

/* ==== §1 split rule ============================================================================== */

static void test_split_small_pool(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *a = ALLOC(e.a, 0, MiB, NULL); /* [a 1M][free 1M] */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = MiB, .active = 1, .active_b = MiB, .req_b = MiB, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = MiB),
               PX0);
  /* a rest of exactly 512 bytes is split off in the small pool */
  char *b = ALLOC(e.a, 0, MiB - 512, NULL); /* [a][b 1M-512][free 512] */
  assert_ptr_equal(b, a + MiB);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 2, .alloc_b = 2 * MiB - 512, .active = 2, .active_b = 2 * MiB - 512,
                  .req_b = 2 * MiB - 512, .seg = 1, .res_b = 2 * MiB, .split = 1, .split_b = 512),
               PX0);
  char *c = ALLOC(e.a, 0, 100, NULL); /* takes the last 512 bytes whole */
  assert_ptr_equal(c, b + MiB - 512);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 3, .alloc_b = 2 * MiB, .active = 3, .active_b = 2 * MiB, .req_b = 2 * MiB - 512 + 100,
                  .seg = 1, .res_b = 2 * MiB),
               PX0);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);

  FREE(e.a, b); /* neighbours allocated: no merge */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 2, .alloc_b = MiB + 512, .active = 2, .active_b = MiB + 512, .req_b = MiB + 100, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = MiB - 512),
               PX0);
  FREE(e.a, a); /* merges with the next block (b) */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 100, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX0);
  /* re-split of an already split free block: count unchanged, bytes shrink */
  char *d = ALLOC(e.a, 0, 4096, NULL);
  assert_ptr_equal(d, a);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 2, .alloc_b = 4096 + 512, .active = 2, .active_b = 4096 + 512, .req_b = 4096 + 100,
                  .seg = 1, .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 512 - 4096),
               PX0);
  FREE(e.a, c); /* merges with the previous free block */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 4096, .active = 1, .active_b = 4096, .req_b = 4096, .seg = 1,
                  .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 4096),
               PX0);
  FREE(e.a, d); /* the whole segment is free again: not split */
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  env_free(&e);
}

static void test_split_two_ten_mib(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  const size_t r = 10 * MiB - 512;
  char *p1 = ALLOC(e.a, 0, r, NULL);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = r, .active = 1, .active_b = r, .req_b = r, .seg = 1, .res_b = 20 * MiB,
                  .split = 1, .split_b = 10 * MiB + 512));
  char *p2 = ALLOC(e.a, 0, r, NULL);
  assert_ptr_equal(p2, p1 + r);
  /* the rest (1024 bytes) is not split off: the second block is 10 MiB + 512 */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 20 * MiB, .active = 2, .active_b = 20 * MiB, .req_b = 2 * r, .seg = 1,
                  .res_b = 20 * MiB, .split = 0, .split_b = 0));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  FREE(e.a, p1);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 10 * MiB + 512, .active = 1, .active_b = 10 * MiB + 512, .req_b = r,
                  .seg = 1, .res_b = 20 * MiB, .split = 1, .split_b = r));
  FREE(e.a, p2);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));
  env_free(&e);
}

static void test_split_large_one_mib_rest(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *x = ALLOC(e.a, 0, 5 * MiB, NULL); /* [x 5][free 15] */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 5 * MiB, .active = 1, .active_b = 5 * MiB, .req_b = 5 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 15 * MiB));
  /* rest exactly 1 MiB: not split, the caller gets 15 MiB */
  char *y = ALLOC(e.a, 0, 14 * MiB, NULL);
  assert_ptr_equal(y, x + 5 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 20 * MiB, .active = 2, .active_b = 20 * MiB, .req_b = 19 * MiB, .seg = 1,
                  .res_b = 20 * MiB));
  FREE(e.a, y);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 5 * MiB, .active = 1, .active_b = 5 * MiB, .req_b = 5 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 15 * MiB));
  /* rest 1 MiB + 512: split */
  char *z = ALLOC(e.a, 0, 14 * MiB - 512, NULL);
  assert_ptr_equal(z, y);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 19 * MiB - 512, .active = 2, .active_b = 19 * MiB - 512,
                  .req_b = 19 * MiB - 512, .seg = 1, .res_b = 20 * MiB, .split = 1, .split_b = MiB + 512));
  FREE(e.a, x); /* x's next (z) is allocated: two inactive split blocks */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 14 * MiB - 512, .active = 1, .active_b = 14 * MiB - 512,
                  .req_b = 14 * MiB - 512, .seg = 1, .res_b = 20 * MiB, .split = 2, .split_b = 6 * MiB + 512));
  FREE(e.a, z); /* merges with both */
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  env_free(&e);
}

/* ==== §2 best fit, merging, whole segment reuse ==================================================== */

static void test_best_fit(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  /* One 20 MiB segment carved into a1 2 | g1 3 | a2 2 | g2 2 | a3 2 | g3 2 | a4 2 | rest 5 (MiB) */
  char *a1 = ALLOC(e.a, 0, 2 * MiB, s);
  char *g1 = ALLOC(e.a, 0, 3 * MiB, s);
  char *a2 = ALLOC(e.a, 0, 2 * MiB, s);
  char *g2 = ALLOC(e.a, 0, 2 * MiB, s);
  char *a3 = ALLOC(e.a, 0, 2 * MiB, s);
  char *g3 = ALLOC(e.a, 0, 2 * MiB, s);
  char *a4 = ALLOC(e.a, 0, 2 * MiB, s);
  assert_ptr_equal(g1, a1 + 2 * MiB);
  assert_ptr_equal(a4, a1 + 13 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 7, .alloc_b = 15 * MiB, .active = 7, .active_b = 15 * MiB, .req_b = 15 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 5 * MiB));
  /* free the higher of the two equal 2 MiB gaps first, then the 3 MiB one, then the lower one */
  FREE(e.a, g3);
  FREE(e.a, g1);
  FREE(e.a, g2);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 4, .alloc_b = 8 * MiB, .active = 4, .active_b = 8 * MiB, .req_b = 8 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 4, .split_b = 12 * MiB));
  /* smallest fitting block, lowest address among equal sizes */
  char *q1 = ALLOC(e.a, 0, 2 * MiB, s);
  assert_ptr_equal(q1, g2);
  char *q2 = ALLOC(e.a, 0, 2 * MiB - 512, s); /* fits the 2 MiB gap g3 (rest 512: not split) */
  assert_ptr_equal(q2, g3);
  char *q3 = ALLOC(e.a, 0, 2 * MiB + 512, s); /* 3 MiB gap: rest 1 MiB - 512, not split */
  assert_ptr_equal(q3, g1);
  char *q4 = ALLOC(e.a, 0, 3 * MiB, s); /* only the 5 MiB rest fits */
  assert_ptr_equal(q4, a1 + 15 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 8, .alloc_b = 18 * MiB, .active = 8, .active_b = 18 * MiB,
                  .req_b = 8 * MiB + 2 * MiB + 2 * MiB - 512 + 2 * MiB + 512 + 3 * MiB, .seg = 1, .res_b = 20 * MiB,
                  .split = 1, .split_b = 2 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  char *all[] = {a1, a2, a3, a4, q1, q2, q3, q4};
  for (size_t i = 0; i < 8; i++)
    FREE(e.a, all[i]);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));

  /* Across segments (on a fresh stream): two whole free segments of the same size, the lower address
   * wins, whatever the order they were freed in. */
  cachalot_stream sx = STREAM(e.b, 0);
  char *s1 = ALLOC(e.a, 0, 12 * MiB, sx);
  char *s2 = ALLOC(e.a, 0, 12 * MiB, sx);
  assert_true(s1 < s2);
  FREE(e.a, s2);
  FREE(e.a, s1);
  char *t = ALLOC(e.a, 0, 12 * MiB, sx);
  assert_ptr_equal(t, s1);
  char *u = ALLOC(e.a, 0, 11 * MiB, sx); /* 12 MiB block, rest 1 MiB: whole */
  assert_ptr_equal(u, s2);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 24 * MiB, .active = 2, .active_b = 24 * MiB, .req_b = 23 * MiB, .seg = 3,
                  .res_b = 44 * MiB));
  EXPECT_COUNTERS(e.a, 0, 3, 0, 0, 0, 0);
  FREE(e.a, t);
  FREE(e.a, u);
  env_free(&e);
}

static void test_merge_neighbours(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *a = ALLOC(e.a, 0, 2 * MiB, NULL);
  char *b = ALLOC(e.a, 0, 2 * MiB, NULL);
  char *c = ALLOC(e.a, 0, 2 * MiB, NULL); /* [a][b][c][rest 14] */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 3, .alloc_b = 6 * MiB, .active = 3, .active_b = 6 * MiB, .req_b = 6 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 14 * MiB));
  FREE(e.a, a); /* no free neighbour */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 4 * MiB, .active = 2, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 2, .split_b = 16 * MiB));
  FREE(e.a, b); /* merges with prev */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 2 * MiB, .active = 1, .active_b = 2 * MiB, .req_b = 2 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 2, .split_b = 18 * MiB));
  /* the merged 4 MiB block is the best fit for 4 MiB */
  char *ab = ALLOC(e.a, 0, 4 * MiB, NULL);
  assert_ptr_equal(ab, a);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 6 * MiB, .active = 2, .active_b = 6 * MiB, .req_b = 6 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 14 * MiB));
  FREE(e.a, ab);
  FREE(e.a, c); /* merges with prev and next: the whole segment */
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));

  a = ALLOC(e.a, 0, 2 * MiB, NULL);
  b = ALLOC(e.a, 0, 2 * MiB, NULL);
  FREE(e.a, b); /* merges with next */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 2 * MiB, .active = 1, .active_b = 2 * MiB, .req_b = 2 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 18 * MiB));
  FREE(e.a, a);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));

  /* whole segment reuse: 19 MiB takes the cached 20 MiB segment whole (rest 1 MiB) */
  char *w = ALLOC(e.a, 0, 19 * MiB, NULL);
  assert_ptr_equal(w, a);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 20 * MiB, .active = 1, .active_b = 20 * MiB, .req_b = 19 * MiB, .seg = 1,
                  .res_b = 20 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  FREE(e.a, w);
  env_free(&e);
}

/* ==== §2 per-stream caching ====================================================================== */

static void test_per_stream(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream sa = STREAM(e.b, 0), sb = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 4 * MiB, sa);
  FREE(e.a, p);
  void *q = ALLOC(e.a, 0, 4 * MiB, sb); /* not A's block: a new segment */
  assert_ptr_not_equal(q, p);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 2,
                  .res_b = 40 * MiB, .split = 1, .split_b = 16 * MiB));
  void *r = ALLOC(e.a, 0, 4 * MiB, sa); /* A's block again */
  assert_ptr_equal(r, p);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);

  /* small pool too, and the default (NULL) stream is a stream like the others */
  void *x = ALLOC(e.a, 0, 1000, sa);
  FREE(e.a, x);
  void *y = ALLOC(e.a, 0, 1000, NULL);
  assert_ptr_not_equal(y, x);
  void *z = ALLOC(e.a, 0, 1000, sa);
  assert_ptr_equal(z, x);
  EXPECT_COUNTERS(e.a, 0, 4, 0, 0, 0, 0);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 2, .alloc_b = 2048, .active = 2, .active_b = 2048, .req_b = 2000, .seg = 2,
                  .res_b = 4 * MiB, .split = 2, .split_b = 4 * MiB - 2048),
               PX(.alloc = 2, .alloc_b = 8 * MiB, .active = 2, .active_b = 8 * MiB, .req_b = 8 * MiB, .seg = 2,
                  .res_b = 40 * MiB, .split = 2, .split_b = 32 * MiB));
  FREE(e.a, q);
  FREE(e.a, r);
  FREE(e.a, y);
  FREE(e.a, z);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_COUNTERS(e.a, 0, 4, 4, 0, 0, 1);
  env_free(&e);
}

/* ==== §2 record_stream =========================================================================== */

static void test_record_stream_pending(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  char *p = ALLOC(e.a, 0, 4 * MiB, s1);
  RECORD(e.a, p, s2);
  RECORD(e.a, p, s2); /* twice: still one use */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 16 * MiB));
  FREE(e.a, p);
  /* allocation stats drop at once; active and requested stay until the event completes */
  pool_x pending = PX(.alloc = 0, .alloc_b = 0, .active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1,
                      .res_b = 20 * MiB, .split = 1, .split_b = 16 * MiB);
  EXPECT_POOLS(e.a, 0, PX0, pending);

  COMPLETE(&e, s1); /* the allocation stream, not the used one */
  EXPECT_POOLS(e.a, 0, PX0, pending);
  char *q = ALLOC(e.a, 0, 4 * MiB, s1); /* p is still pending: carved from the rest */
  assert_ptr_equal(q, p + 4 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 2, .active_b = 8 * MiB, .req_b = 8 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 12 * MiB));

  COMPLETE(&e, s2); /* completes the event, but nothing changes before the next malloc polls */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 2, .active_b = 8 * MiB, .req_b = 8 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 12 * MiB));
  char *r = ALLOC(e.a, 0, 4 * MiB, s1);
  assert_ptr_equal(r, p);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 8 * MiB, .active = 2, .active_b = 8 * MiB, .req_b = 8 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 12 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  FREE(e.a, q);
  FREE(e.a, r);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));

  /* the default stream as the used stream */
  char *t = ALLOC(e.a, 0, 4 * MiB, s1);
  RECORD(e.a, t, NULL);
  FREE(e.a, t);
  char *u = ALLOC(e.a, 0, 4 * MiB, s1);
  assert_ptr_equal(u, p + 4 * MiB);
  COMPLETE(&e, NULL);
  char *v = ALLOC(e.a, 0, 4 * MiB, s1);
  assert_ptr_equal(v, p);
  FREE(e.a, u);
  FREE(e.a, v);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 1, .res_b = 20 * MiB));
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  env_free(&e);
}

static void test_record_stream_own_stream_ignored(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 1000, s1);
  RECORD(e.a, p, s1);
  FREE(e.a, p); /* really free at once */
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  void *q = ALLOC(e.a, 0, 1000, NULL);
  RECORD(e.a, q, NULL);
  FREE(e.a, q);
  EXPECT_POOLS(e.a, 0, PX(.seg = 2, .res_b = 4 * MiB), PX0);
  void *r = ALLOC(e.a, 0, 1000, s1);
  assert_ptr_equal(r, p);
  FREE(e.a, r);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  env_free(&e);
}

static void test_record_stream_two_streams(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0), s3 = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 4 * MiB, s1);
  RECORD(e.a, p, s2);
  RECORD(e.a, p, s3);
  FREE(e.a, p);
  pool_x large_pending = PX(.active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1, .res_b = 20 * MiB,
                            .split = 1, .split_b = 16 * MiB);
  COMPLETE(&e, s2);
  void *x = ALLOC(e.a, 0, 1, s1); /* polls: s3's event is still outstanding */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               large_pending);
  COMPLETE(&e, s3);
  void *y = ALLOC(e.a, 0, 1, s1); /* now both have completed */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 2, .alloc_b = 1024, .active = 2, .active_b = 1024, .req_b = 2, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 1024),
               PX(.seg = 1, .res_b = 20 * MiB));
  FREE(e.a, x);
  FREE(e.a, y);
  env_free(&e);
}

static void test_record_stream_event_order(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0), s3 = STREAM(e.b, 0);
  /* Events of one stream complete in order: an event recorded after the completion is not done. */
  char *p1 = ALLOC(e.a, 0, 4 * MiB, s1);
  char *p2 = ALLOC(e.a, 0, 4 * MiB, s1);
  RECORD(e.a, p1, s2);
  RECORD(e.a, p2, s2);
  FREE(e.a, p1);
  COMPLETE(&e, s2);
  FREE(e.a, p2); /* recorded after the completion */
  void *x = ALLOC(e.a, 0, 1, s1);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.active = 1, .active_b = 4 * MiB, .req_b = 4 * MiB, .seg = 1, .res_b = 20 * MiB, .split = 2,
                  .split_b = 16 * MiB));
  COMPLETE(&e, s2);
  FREE(e.a, x);
  void *y = ALLOC(e.a, 0, 1, s1);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.seg = 1, .res_b = 20 * MiB));
  FREE(e.a, y);

  /* A not-ready event stops only its own stream. */
  char *q1 = ALLOC(e.a, 0, 4 * MiB, s1);
  char *q2 = ALLOC(e.a, 0, 4 * MiB, s1);
  RECORD(e.a, q1, s2);
  RECORD(e.a, q2, s3);
  FREE(e.a, q1);
  FREE(e.a, q2);
  COMPLETE(&e, s3);
  char *z = ALLOC(e.a, 0, 4 * MiB, s1); /* q2 is free again (merged with the rest): carved from there */
  assert_ptr_equal(z, q2);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB),
               PX(.alloc = 1, .alloc_b = 4 * MiB, .active = 2, .active_b = 8 * MiB, .req_b = 8 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 12 * MiB));
  FREE(e.a, z);
  COMPLETE(&e, s2);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_COUNTERS(e.a, 0, 2, 2, 0, 0, 1);
  env_free(&e);
}

static void test_empty_cache_waits_for_events(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  void *p = ALLOC(e.a, 0, 12 * MiB, s1);
  void *k = ALLOC(e.a, 0, 100, s1); /* kept: its segment stays */
  RECORD(e.a, p, s2);
  FREE(e.a, p);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 100, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.active = 1, .active_b = 12 * MiB, .req_b = 12 * MiB, .seg = 1, .res_b = 12 * MiB));
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  EMPTY(e.a); /* waits for s2's event, frees p, releases its segment */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 100, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX0);
  EXPECT_COUNTERS(e.a, 0, 2, 1, 0, 0, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);
  EMPTY(e.a); /* counts a sync even with nothing outstanding */
  EXPECT_COUNTERS(e.a, 0, 2, 1, 0, 0, 2);
  FREE(e.a, k);
  EMPTY(e.a);
  EXPECT_COUNTERS(e.a, 0, 2, 2, 0, 0, 3);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

/* ==== §1 max_split_size ========================================================================== */

static void test_max_split_basic(void **state) {
  (void)state;
  env e = ENV(1, 0, "max_split_size_mb:40");
  EQ(STATS(e.a, 0).max_split_size, 40 * MiB);
  cachalot_stream s = STREAM(e.b, 0);
  char *a = ALLOC(e.a, 0, 50 * MiB, s);
  EXPECT_OVERSIZE(e.a, 0, 1, 1);
  FREE(e.a, a);
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  /* below max_split: never an oversize cached block */
  char *b = ALLOC(e.a, 0, 30 * MiB, s);
  assert_ptr_not_equal(b, a);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  /* oversize request: takes the 50 MiB block whole (50 < 45 + 20), no split */
  char *c = ALLOC(e.a, 0, 45 * MiB, s);
  assert_ptr_equal(c, a);
  EXPECT_OVERSIZE(e.a, 0, 1, 1);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 80 * MiB, .active = 2, .active_b = 80 * MiB, .req_b = 75 * MiB, .seg = 2,
                  .res_b = 80 * MiB));
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  FREE(e.a, c);
  FREE(e.a, b);
  /* a 20 MiB segment (for a request below 10 MiB) still splits: it is below max_split */
  char *d = ALLOC(e.a, 0, 2 * MiB, STREAM(e.b, 0));
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 2 * MiB, .active = 1, .active_b = 2 * MiB, .req_b = 2 * MiB, .seg = 3,
                  .res_b = 100 * MiB, .split = 1, .split_b = 18 * MiB));
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  FREE(e.a, d);
  env_free(&e);

  /* max_split_size_mb:20: the 20 MiB segments themselves are oversize and are never split. */
  e = ENV(1, 0, "max_split_size_mb:20");
  EQ(STATS(e.a, 0).max_split_size, 20 * MiB);
  char *f = ALLOC(e.a, 0, 2 * MiB, NULL); /* 2 MiB < max_split: splits its new 20 MiB segment */
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 2 * MiB, .active = 1, .active_b = 2 * MiB, .req_b = 2 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 18 * MiB));
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  FREE(e.a, f); /* the merged 20 MiB block is oversize now */
  char *g = ALLOC(e.a, 0, 2 * MiB, NULL); /* so a 2 MiB request cannot take it */
  assert_ptr_not_equal(g, f);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  char *h = ALLOC(e.a, 0, 20 * MiB, NULL); /* but a 20 MiB one takes it whole */
  assert_ptr_equal(h, f);
  EXPECT_OVERSIZE(e.a, 0, 1, 2);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 22 * MiB, .active = 2, .active_b = 22 * MiB, .req_b = 22 * MiB, .seg = 2,
                  .res_b = 40 * MiB, .split = 1, .split_b = 18 * MiB));
  FREE(e.a, g);
  FREE(e.a, h);
  EXPECT_OVERSIZE(e.a, 0, 0, 2);
  env_free(&e);
}

static void test_max_non_split_rounding(void **state) {
  (void)state;
  env e = ENV(1, 0, "max_split_size_mb:40");
  char *x = ALLOC(e.a, 0, 70 * MiB, NULL);
  FREE(e.a, x);
  char *y = ALLOC(e.a, 0, 50 * MiB, NULL); /* 70 >= 50 + 20: not taken */
  assert_ptr_not_equal(y, x);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  FREE(e.a, y);
  char *z = ALLOC(e.a, 0, 50 * MiB + 512, NULL); /* lowest fit is 70 MiB: 70 < 70 MiB + 512: taken */
  assert_ptr_equal(z, x);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 70 * MiB, .active = 1, .active_b = 70 * MiB, .req_b = 50 * MiB + 512,
                  .seg = 2, .res_b = 120 * MiB));
  EXPECT_OVERSIZE(e.a, 0, 1, 2);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  FREE(e.a, z);
  env_free(&e);

  e = ENV(1, 0, "max_split_size_mb:40,max_non_split_rounding_mb:30");
  x = ALLOC(e.a, 0, 70 * MiB, NULL);
  FREE(e.a, x);
  y = ALLOC(e.a, 0, 40 * MiB, NULL); /* 70 >= 40 + 30: not taken */
  assert_ptr_not_equal(y, x);
  z = ALLOC(e.a, 0, 50 * MiB, NULL); /* 70 < 50 + 30: taken whole */
  assert_ptr_equal(z, x);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 110 * MiB, .active = 2, .active_b = 110 * MiB, .req_b = 90 * MiB, .seg = 2,
                  .res_b = 110 * MiB));
  EXPECT_OVERSIZE(e.a, 0, 2, 2);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  FREE(e.a, y);
  FREE(e.a, z);
  env_free(&e);
}

static void test_max_split_release_when_full(void **state) {
  (void)state;
  /* One cached oversize block >= max(size, max_split) goes back, then the device is asked again. */
  env e = ENV(1, 100 * MiB, "max_split_size_mb:40");
  cachalot_stream s = STREAM(e.b, 0);
  char *a = ALLOC(e.a, 0, 60 * MiB, s);
  FREE(e.a, a);
  char *b = ALLOC(e.a, 0, 30 * MiB, s); /* 90 MiB used */
  char *c = ALLOC(e.a, 0, 30 * MiB, s); /* device full: the 60 MiB block is released (step 6) */
  assert_ptr_not_equal(c, a);
  EXPECT_COUNTERS(e.a, 0, 3, 1, 0, 0, 0);
  EXPECT_OVERSIZE(e.a, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 60 * MiB, .active = 2, .active_b = 60 * MiB, .req_b = 60 * MiB, .seg = 2,
                  .res_b = 60 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, b);
  FREE(e.a, c);
  env_free(&e);

  /* No single block is large enough: the largest go back, down until enough. */
  e = ENV(1, 160 * MiB, "max_split_size_mb:40");
  s = STREAM(e.b, 0);
  char *p42 = ALLOC(e.a, 0, 42 * MiB, s);
  char *p44 = ALLOC(e.a, 0, 44 * MiB, s);
  char *p46 = ALLOC(e.a, 0, 46 * MiB, s);
  FREE(e.a, p42);
  FREE(e.a, p44);
  FREE(e.a, p46);
  EXPECT_OVERSIZE(e.a, 0, 0, 3);
  char *big = ALLOC(e.a, 0, 80 * MiB, s); /* 28 MiB free: 46 and 44 go, 42 stays */
  EXPECT_COUNTERS(e.a, 0, 4, 2, 0, 0, 0);
  EXPECT_OVERSIZE(e.a, 0, 1, 2);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 80 * MiB, .active = 1, .active_b = 80 * MiB, .req_b = 80 * MiB, .seg = 2,
                  .res_b = 122 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  char *again = ALLOC(e.a, 0, 42 * MiB, s);
  assert_ptr_equal(again, p42);
  EXPECT_COUNTERS(e.a, 0, 4, 2, 0, 0, 0);
  FREE(e.a, big);
  FREE(e.a, again);
  env_free(&e);
}

static void test_max_split_changed_at_run_time(void **state) {
  (void)state;
  /* A free block that became oversize inside a split segment: step 6 cannot give it back (only whole
   * segments go to the device), an oversize request takes it whole only within the rounding limit. */
  env e = ENV(1, 128 * MiB, "");
  cachalot_stream s = STREAM(e.b, 0);
  char *big = ALLOC(e.a, 0, 100 * MiB, s);
  FREE(e.a, big);
  char *x = ALLOC(e.a, 0, 30 * MiB, s); /* unlimited max_split: the 100 MiB block is split */
  assert_ptr_equal(x, big);
  OK(cachalot_set_settings(e.a, "max_split_size_mb:40"));
  CHECK(e.a);
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  pool_x split = PX(.alloc = 1, .alloc_b = 30 * MiB, .active = 1, .active_b = 30 * MiB, .req_b = 30 * MiB, .seg = 1,
                    .res_b = 100 * MiB, .split = 1, .split_b = 70 * MiB);
  EXPECT_POOLS(e.a, 0, PX0, split);
  void *y = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 50 * MiB, s, &y), CACHALOT_ERROR_OUT_OF_MEMORY); /* 70 >= 50 + 20 */
  assert_null(y);
  CONTAINS(cachalot_last_error(), "Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 128.00 MiB of which "
                                  "28.00 MiB is free. Of the allocated memory 30.00 MiB is allocated by cachalot, "
                                  "and 70.00 MiB is reserved");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 1, 1, 1);
  EXPECT_POOLS(e.a, 0, PX0, split);
  EXPECT_RESERVED_IS_USED(&e, 0);
  char *z = ALLOC(e.a, 0, 60 * MiB, s); /* 70 < 60 + 20: taken whole, not split (60 >= max_split) */
  assert_ptr_equal(z, x + 30 * MiB);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 100 * MiB, .active = 2, .active_b = 100 * MiB, .req_b = 90 * MiB, .seg = 1,
                  .res_b = 100 * MiB));
  EXPECT_OVERSIZE(e.a, 0, 1, 1);
  FREE(e.a, x);
  FREE(e.a, z);
  EXPECT_OVERSIZE(e.a, 0, 0, 1);
  env_free(&e);
}

/* cachalot_get_settings reports the settings in force: presets expanded, keys in order, unnamed keys
 * kept, a rejected string changing nothing (the PyTorch backend's allocator_settings read it). */
static bool expandable_now(cachalot_allocator *a) {
  cachalot_settings st;
  OK(cachalot_get_settings(a, &st));
  return st.expandable_segments;
}

static void test_settings_in_force(void **state) {
  (void)state;
  env e = ENV(1, 128 * MiB, "");
  cachalot_settings st;
  OK(cachalot_get_settings(e.a, &st));
  EQ(st.max_split_size, SIZE_MAX);
  assert_true(st.garbage_collection_threshold == 0.0);
  assert_false(st.expandable_segments || st.expandable_compact || st.pinned_use_cuda_host_register);
  EQ(st.expandable_page, 20 * MiB);
  assert_true(st.release_lock_on_cudamalloc);
  EQ(st.pinned_num_register_threads, 1);
  for (int i = 0; i < 16; i++)
    EQ(st.roundup_power2_divisions[i], 0);
  OK(cachalot_set_settings(e.a, "preset:low_fragmentation"));
  assert_true(expandable_now(e.a));
  OK(cachalot_set_settings(e.a, "max_split_size_mb:40,garbage_collection_threshold:0.5,"
                                "roundup_power2_divisions:[256:4,>:8],pinned_num_register_threads:4"));
  OK(cachalot_get_settings(e.a, &st));
  assert_true(st.expandable_segments && st.expandable_compact); /* unnamed keys keep their values */
  EQ(st.expandable_page, 2 * MiB);
  EQ(st.max_split_size, 40 * MiB);
  assert_true(st.garbage_collection_threshold == 0.5);
  EQ(st.pinned_num_register_threads, 4);
  EQ(st.roundup_power2_divisions[7], 4); /* [128, 256) MiB: the first entry fills below itself */
  EQ(st.roundup_power2_divisions[8], 4); /* [256, 512) MiB */
  EQ(st.roundup_power2_divisions[9], 8); /* [512 MiB, 1 GiB): `>` starts above the entry before it */
  OK(cachalot_set_settings(e.a, "preset:low_fragmentation,expandable_segments:False"));
  assert_false(expandable_now(e.a));
  STATUS(cachalot_set_settings(e.a, "expandable_segments:True,expandable_page_mb:3"), CACHALOT_ERROR_CONFIG);
  assert_false(expandable_now(e.a));
  OK(cachalot_set_settings(e.a, "expandable_segments:False, preset : low_fragmentation"));
  assert_true(expandable_now(e.a));
  CHECK(e.a);
  STATUS(cachalot_get_settings(NULL, &st), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_get_settings(e.a, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  env_free(&e);
}

/* ==== §3 out of memory =========================================================================== */

typedef struct {
  int calls;
  int device;
  size_t alloc_size, limit, device_free;
} oom_log;

static void on_oom(int device, size_t alloc_size, size_t limit, size_t device_free, void *ctx) {
  oom_log *l = ctx;
  l->calls++;
  l->device = device;
  l->alloc_size = alloc_size;
  l->limit = limit;
  l->device_free = device_free;
}

#define OOM_TAIL                                                                                                   \
  " is reserved by cachalot but unallocated. If reserved but unallocated memory is large try setting "            \
  "CACHALOT_ALLOC_CONF=expandable_segments:True to avoid fragmentation."

typedef struct {
  cachalot_allocator *a;
  int calls;
  int64_t ooms_seen;
} oom_reentrant;

/* An observer runs with no allocator lock held: it may call back into the allocator. */
static void on_oom_reenter(int device, size_t alloc_size, size_t limit, size_t device_free, void *ctx) {
  (void)alloc_size;
  (void)limit;
  (void)device_free;
  oom_reentrant *r = ctx;
  r->calls++;
  cachalot_device_stats st;
  if (cachalot_memory_stats(r->a, device, &st) == CACHALOT_OK)
    r->ooms_seen = st.num_ooms;
  if (cachalot_check(r->a) != CACHALOT_OK)
    r->ooms_seen = -1;
}

static void test_oom_message_and_retry(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "");
  oom_log log = {0};
  oom_reentrant re = {e.a, 0, 0};
  OK(cachalot_attach_oom_observer(e.a, on_oom, &log));
  OK(cachalot_attach_oom_observer(e.a, on_oom_reenter, &re));
  cachalot_stream s1 = STREAM(e.b, 0);
  char *a1 = ALLOC(e.a, 0, 20 * MiB, NULL);
  char *a2 = ALLOC(e.a, 0, 20 * MiB, NULL);
  char *sm = ALLOC(e.a, 0, 1, NULL);
  char *a3 = ALLOC(e.a, 0, 2 * MiB, NULL); /* 20 MiB segment, 18 MiB free in it */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.alloc = 3, .alloc_b = 42 * MiB, .active = 3, .active_b = 42 * MiB, .req_b = 42 * MiB, .seg = 3,
                  .res_b = 60 * MiB, .split = 1, .split_b = 18 * MiB));
  EQ(USED(e.b, 0), 62 * MiB);

  void *x = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 20 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(x);
  /* allocated 42 MiB + 512; reserved - allocated = 20 MiB - 512 */
  STR_EQ(cachalot_last_error(), "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
                                "64.00 MiB of which 2.00 MiB is free. Of the allocated memory 42.00 MiB is "
                                "allocated by cachalot, and 20.00 MiB" OOM_TAIL);
  CHECK(e.a);
  EQ(log.calls, 1);
  EQ(log.device, 0);
  EQ(log.alloc_size, 20 * MiB);
  EQ(log.limit, 64 * MiB);
  EQ(log.device_free, 2 * MiB);
  EQ(re.calls, 1);
  EQ(re.ooms_seen, 1); /* counted before the observers run */
  /* step 5, (no step 6), step 7 waits for events and retries once, step 8 counts the OOM */
  EXPECT_COUNTERS(e.a, 0, 4, 0, 1, 1, 1);
  /* nothing lost */
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.alloc = 3, .alloc_b = 42 * MiB, .active = 3, .active_b = 42 * MiB, .req_b = 42 * MiB, .seg = 3,
                  .res_b = 60 * MiB, .split = 1, .split_b = 18 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);

  /* free + retry: a2's block is cached on the default stream and taken again */
  FREE(e.a, a2);
  char *y = ALLOC(e.a, 0, 20 * MiB, NULL);
  assert_ptr_equal(y, a2);
  EXPECT_COUNTERS(e.a, 0, 4, 0, 1, 1, 1);

  /* release-all-and-retry: on stream s1 nothing is cached; the device is full; step 7 gives a1's
   * cached segment back and the retry succeeds */
  FREE(e.a, a1);
  char *z = ALLOC(e.a, 0, 20 * MiB, s1);
  EXPECT_COUNTERS(e.a, 0, 5, 1, 2, 1, 2);
  EQ(log.calls, 1);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.alloc = 3, .alloc_b = 42 * MiB, .active = 3, .active_b = 42 * MiB, .req_b = 42 * MiB, .seg = 3,
                  .res_b = 60 * MiB, .split = 1, .split_b = 18 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, y);
  FREE(e.a, z);
  FREE(e.a, sm);
  FREE(e.a, a3);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

static void test_oom_with_fraction_message(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "");
  oom_log log = {0};
  OK(cachalot_attach_oom_observer(e.a, on_oom, &log));
  OK(cachalot_set_memory_fraction(e.a, 0, 0.5));
  CHECK(e.a);
  void *a = ALLOC(e.a, 0, 20 * MiB, NULL);
  void *b = ALLOC(e.a, 0, MiB, NULL); /* 1 MiB unallocated in its 2 MiB segment */
  void *x = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 20 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(x);
  /* PyTorch's format_size: exactly 1 MiB is still "1024.00 KiB" (size <= 1048576 uses KiB) */
  STR_EQ(cachalot_last_error(), "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
                                "64.00 MiB of which 42.00 MiB is free. 32.00 MiB allowed; Of the allocated memory "
                                "21.00 MiB is allocated by cachalot, and 1024.00 KiB" OOM_TAIL);
  CHECK(e.a);
  EQ(log.calls, 1);
  EQ(log.alloc_size, 20 * MiB);
  EQ(log.limit, 32 * MiB);
  EQ(log.device_free, 42 * MiB);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 1, 1, 1);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, a);
  FREE(e.a, b);
  env_free(&e);
}

/* ==== numbers whatever the program's locale ====================================================== */

/* A program that called setlocale(LC_ALL, "") under a decimal-comma locale: "0.8" in a config is still a
 * number, JSON keeps its decimal points, and so does the out-of-memory message. The locale is compiled into
 * a scratch folder with localedef (Debian's `locales` package); without it the test is skipped. */
static void test_decimal_comma_locale(void **state) {
  (void)state;
  char dir[] = "/tmp/cachalot-locale-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char cmd[256];
  snprintf(cmd, sizeof cmd, "localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", dir);
  const int built = system(cmd);
  setenv("LOCPATH", dir, 1);
  const bool comma = built == 0 && setlocale(LC_ALL, "de_DE.UTF-8") != NULL;
  char probe[16];
  snprintf(probe, sizeof probe, "%.1f", 0.5);
  if (!comma || strcmp(probe, "0,5") != 0) {
    setlocale(LC_ALL, "C");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) /* a scratch folder left behind: harmless */
      fprintf(stderr, "could not remove %s\n", dir);
    skip(); /* no decimal-comma locale can be made here */
  }
  env e = ENV(1, 64 * MiB, "garbage_collection_threshold:0.8,per_process_memory_fraction:0.5");
  char *json = NULL;
  OK(cachalot_snapshot_json(e.a, &json));
  CONTAINS(json, "\"garbage_collection_threshold\":0.80000000000000004");
  free(json);
  void *x = NULL;
  STATUS(cachalot_malloc(e.a, 0, 40 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "Tried to allocate 40.00 MiB");
  STATUS(cachalot_set_settings(e.a, "garbage_collection_threshold:0,5"), CACHALOT_ERROR_CONFIG); /* ","
  * separates */
  OK(cachalot_set_settings(e.a, "garbage_collection_threshold:0.5"));
  env_free(&e);
  setlocale(LC_ALL, "C");
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) /* a scratch folder left behind: harmless */
    fprintf(stderr, "could not remove %s\n", dir);
}

/* ==== §3 memory fraction and garbage collection ================================================ */

/* A device of SIZE_MAX bytes with fraction 1.0 (the product is 2^64 as a double, whose conversion to size_t
 * was undefined and gave "0 bytes allowed"), and with a garbage-collection threshold on top. */
static void test_fraction_of_huge_device(void **state) {
  (void)state;
  env e = ENV(1, SIZE_MAX, "per_process_memory_fraction:1.0,garbage_collection_threshold:0.9");
  void *x = ALLOC(e.a, 0, 1, NULL);
  EXPECT_POOLS(e.a, 0, PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1,
                          .res_b = 2 * MiB, .split = 1, .split_b = 2 * MiB - 512), PX0);
  OK(cachalot_set_memory_fraction(e.a, 0, 1.0));
  void *y = ALLOC(e.a, 0, 3 * MiB, NULL);
  FREE(e.a, y);
  FREE(e.a, x);
  EMPTY(e.a);
  EQ(USED(e.b, 0), 0);
  env_free(&e);
}

static void test_fraction_config_key(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "per_process_memory_fraction:0.5");
  void *a = ALLOC(e.a, 0, 20 * MiB, NULL);
  void *b = ALLOC(e.a, 0, 12 * MiB, NULL); /* reserved 32 MiB = the limit: allowed */
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  /* An injected device failure stays pending if the device is never asked. */
  OK(cachalot_sim_fail_device_allocs(e.b, 1));
  void *x = (void *)(uintptr_t)0x1;
  STATUS(cachalot_malloc(e.a, 0, 1, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  assert_null(x);
  CONTAINS(cachalot_last_error(), "of which 32.00 MiB is free. 32.00 MiB allowed; Of the allocated memory 32.00 MiB");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 1, 1, 1);
  EQ(USED(e.b, 0), 32 * MiB);
  /* Lift the limit: the next device allocation meets the pending failure, and the retry succeeds. */
  OK(cachalot_set_memory_fraction(e.a, 0, 1.0));
  CHECK(e.a);
  void *y = ALLOC(e.a, 0, 1, NULL);
  EXPECT_COUNTERS(e.a, 0, 3, 0, 2, 1, 2);

  /* cachalot_set_memory_fraction: 0.25 -> 16 MiB; the step-7 release of cached segments counts too */
  OK(cachalot_set_memory_fraction(e.a, 0, 0.25));
  CHECK(e.a);
  FREE(e.a, a);
  FREE(e.a, b);
  FREE(e.a, y);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX(.seg = 2, .res_b = 32 * MiB));
  void *z = ALLOC(e.a, 0, 14 * MiB, STREAM(e.b, 0)); /* 34 + 14 > 16: release all cached, then 14 <= 16 */
  EXPECT_COUNTERS(e.a, 0, 4, 3, 3, 1, 3);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 14 * MiB, .active = 1, .active_b = 14 * MiB, .req_b = 14 * MiB, .seg = 1,
                  .res_b = 14 * MiB));
  void *w = ALLOC(e.a, 0, 1, NULL); /* 14 + 2 = 16 MiB: exactly the limit, allowed */
  EXPECT_COUNTERS(e.a, 0, 5, 3, 3, 1, 3);
  STATUS(cachalot_malloc(e.a, 0, MiB + 1, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY); /* + 20 MiB: refused */
  assert_null(x);
  CONTAINS(cachalot_last_error(), "Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which "
                                  "48.00 MiB is free. 16.00 MiB allowed; ");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 5, 3, 4, 2, 4);
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, w);
  FREE(e.a, z);
  env_free(&e);
}

static void test_garbage_collection(void **state) {
  (void)state;
  /* allowed = 200 MiB, threshold 100 MiB */
  env e = ENV(1, 200 * MiB, "per_process_memory_fraction:1.0,garbage_collection_threshold:0.5");
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  char *A = ALLOC(e.a, 0, 30 * MiB, s1); /* lookup 1 */
  char *B = ALLOC(e.a, 0, 40 * MiB, s1); /* lookup 2 */
  char *C = ALLOC(e.a, 0, 20 * MiB, s1); /* lookup 3; reserved 90 */
  FREE(e.a, A);                          /* age base 3 */
  char *D = ALLOC(e.a, 0, 12 * MiB, s2); /* lookup 4; reserved 90 <= 100: no gc; 102 after */
  FREE(e.a, B);                          /* age base 4 */
  FREE(e.a, C);                          /* age base 4 */
  EXPECT_COUNTERS(e.a, 0, 4, 0, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 12 * MiB, .active = 1, .active_b = 12 * MiB, .req_b = 12 * MiB, .seg = 4,
                  .res_b = 102 * MiB));
  /* lookup 5: ages A 2, B 1, C 1, mean 4/3: A alone goes (30 MiB >= the 2 MiB over the threshold) */
  char *E = ALLOC(e.a, 0, 24 * MiB, s2);
  EXPECT_COUNTERS(e.a, 0, 5, 1, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 36 * MiB, .active = 2, .active_b = 36 * MiB, .req_b = 36 * MiB, .seg = 4,
                  .res_b = 96 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* B and C are still cached */
  char *b2 = ALLOC(e.a, 0, 40 * MiB, s1);
  assert_ptr_equal(b2, B);
  char *c2 = ALLOC(e.a, 0, 20 * MiB, s1);
  assert_ptr_equal(c2, C);
  EXPECT_COUNTERS(e.a, 0, 5, 1, 0, 0, 0);
  FREE(e.a, b2);
  FREE(e.a, c2);
  FREE(e.a, D);
  FREE(e.a, E);
  env_free(&e);

  /* Equal ages: every candidate is at the mean, and a pass does not stop at the target. */
  e = ENV(1, 200 * MiB, "per_process_memory_fraction:1.0,garbage_collection_threshold:0.5");
  s1 = STREAM(e.b, 0);
  s2 = STREAM(e.b, 0);
  A = ALLOC(e.a, 0, 40 * MiB, s1); /* lookup 1 */
  B = ALLOC(e.a, 0, 40 * MiB, s1); /* lookup 2 */
  C = ALLOC(e.a, 0, 30 * MiB, s2); /* lookup 3; reserved 110 */
  FREE(e.a, A);                    /* age base 3 */
  FREE(e.a, B);                    /* age base 3 */
  D = ALLOC(e.a, 0, 10 * MiB, s2); /* lookup 4: 10 MiB over; A and B (age 1 = mean) both go */
  EXPECT_COUNTERS(e.a, 0, 4, 2, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 40 * MiB, .active = 2, .active_b = 40 * MiB, .req_b = 40 * MiB, .seg = 2,
                  .res_b = 40 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, C);
  FREE(e.a, D);
  env_free(&e);

  /* Oldest first, in passes: the first pass (age >= mean 3) frees A only, which is not enough; the
   * second (mean of B and C: 2) frees both. */
  e = ENV(1, 300 * MiB, "per_process_memory_fraction:1.0,garbage_collection_threshold:0.5");
  s1 = STREAM(e.b, 0);
  s2 = STREAM(e.b, 0);
  A = ALLOC(e.a, 0, 20 * MiB, s1);       /* lookup 1 */
  FREE(e.a, A);                          /* age base 1 */
  char *X = ALLOC(e.a, 0, 10 * MiB, s2); /* lookup 2 */
  B = ALLOC(e.a, 0, 40 * MiB, s1);       /* lookup 3 (A is too small) */
  C = ALLOC(e.a, 0, 40 * MiB, s1);       /* lookup 4 */
  FREE(e.a, B);                          /* age base 4 */
  FREE(e.a, C);                          /* age base 4 */
  char *Y = ALLOC(e.a, 0, 70 * MiB, s2); /* lookup 5; reserved 110 <= 150: no gc; 180 after */
  EXPECT_COUNTERS(e.a, 0, 5, 0, 0, 0, 0);
  char *Z = ALLOC(e.a, 0, 12 * MiB, s2); /* lookup 6: 30 MiB over; ages A 5, B 2, C 2 */
  EXPECT_COUNTERS(e.a, 0, 6, 3, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 3, .alloc_b = 92 * MiB, .active = 3, .active_b = 92 * MiB, .req_b = 92 * MiB, .seg = 3,
                  .res_b = 92 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  FREE(e.a, X);
  FREE(e.a, Y);
  FREE(e.a, Z);
  env_free(&e);

  /* The same without a memory fraction: no collection at all. */
  e = ENV(1, 200 * MiB, "garbage_collection_threshold:0.5");
  s1 = STREAM(e.b, 0);
  s2 = STREAM(e.b, 0);
  A = ALLOC(e.a, 0, 30 * MiB, s1);
  B = ALLOC(e.a, 0, 40 * MiB, s1);
  C = ALLOC(e.a, 0, 20 * MiB, s1);
  FREE(e.a, A);
  D = ALLOC(e.a, 0, 12 * MiB, s2);
  FREE(e.a, B);
  FREE(e.a, C);
  E = ALLOC(e.a, 0, 24 * MiB, s2);
  EXPECT_COUNTERS(e.a, 0, 5, 0, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 2, .alloc_b = 36 * MiB, .active = 2, .active_b = 36 * MiB, .req_b = 36 * MiB, .seg = 5,
                  .res_b = 126 * MiB));
  FREE(e.a, D);
  FREE(e.a, E);
  env_free(&e);
}

/* ==== §4 stats =================================================================================== */

static void expect_alloc_minus_freed(cachalot_stat *s, const char *name, void *ctx) {
  (void)ctx;
  if (s->allocated - s->freed != s->current)
    fail_msg("%s: allocated %lld - freed %lld != current %lld", name, (long long)s->allocated,
             (long long)s->freed, (long long)s->current);
  if (s->peak < s->current)
    fail_msg("%s: peak %lld < current %lld", name, (long long)s->peak, (long long)s->current);
}

static void expect_peak_is_current(cachalot_stat *s, const char *name, void *ctx) {
  (void)ctx;
  if (s->peak != s->current)
    fail_msg("%s: peak %lld != current %lld after reset_peak", name, (long long)s->peak, (long long)s->current);
}

static void expect_accumulated_zero(cachalot_stat *s, const char *name, void *ctx) {
  (void)ctx;
  if (s->allocated != 0 || s->freed != 0)
    fail_msg("%s: allocated %lld freed %lld after reset_accumulated", name, (long long)s->allocated,
             (long long)s->freed);
}

static void test_stats_resets(void **state) {
  (void)state;
  env e = ENV(1, 0, "max_split_size_mb:40");
  char *a = ALLOC(e.a, 0, MiB + 1, NULL);
  char *b = ALLOC(e.a, 0, 100, NULL);
  char *c = ALLOC(e.a, 0, 50 * MiB, NULL);
  FREE(e.a, a);
  FREE(e.a, c);
  cachalot_device_stats st = STATS(e.a, 0);
  for_each_stat(&st, expect_alloc_minus_freed, NULL);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].peak, 51 * MiB + 512);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].current, 0);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].allocated, 51 * MiB + 512);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].freed, 51 * MiB + 512);
  EQ(st.allocated_bytes[CACHALOT_STAT_ALL].peak, 51 * MiB + 1024);
  EQ(st.allocation[CACHALOT_STAT_ALL].peak, 3);
  EQ(st.allocation[CACHALOT_STAT_ALL].allocated, 3);
  EQ(st.allocation[CACHALOT_STAT_ALL].freed, 2);
  EQ(st.inactive_split[CACHALOT_STAT_ALL].peak, 2);
  EQ(st.oversize_allocations.peak, 1);
  EQ(st.oversize_segments.current, 1);
  EQ(st.requested_bytes[CACHALOT_STAT_ALL].peak, MiB + 1 + 100 + 50 * MiB);
  EQ(st.max_split_size, 40 * MiB);

  OK(cachalot_reset_peak_stats(e.a, 0));
  CHECK(e.a);
  st = STATS(e.a, 0);
  for_each_stat(&st, expect_peak_is_current, NULL);
  for_each_stat(&st, expect_alloc_minus_freed, NULL); /* reset_peak leaves allocated/freed */
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].peak, 0);
  EQ(st.allocated_bytes[CACHALOT_STAT_SMALL_POOL].peak, 512);
  EQ(st.num_device_alloc, 3);

  OK(cachalot_reset_accumulated_stats(e.a, 0));
  CHECK(e.a);
  cachalot_device_stats at_reset = STATS(e.a, 0);
  for_each_stat(&at_reset, expect_accumulated_zero, NULL);
  EXPECT_COUNTERS(e.a, 0, 0, 0, 0, 0, 0);
  EQ(at_reset.allocation[CACHALOT_STAT_ALL].current, 1); /* current values are untouched */
  EQ(at_reset.reserved_bytes[CACHALOT_STAT_ALL].current, 72 * MiB);
  EQ(at_reset.max_split_size, 40 * MiB);

  a = ALLOC(e.a, 0, MiB + 1, NULL); /* reuses the cached block: no device call */
  st = STATS(e.a, 0);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].allocated, MiB + 512);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].freed, 0);
  EQ(st.allocated_bytes[CACHALOT_STAT_LARGE_POOL].peak, MiB + 512);
  EQ(st.inactive_split_bytes[CACHALOT_STAT_LARGE_POOL].allocated, 19 * MiB - 512); /* the whole segment split
  * */
  EQ(st.inactive_split_bytes[CACHALOT_STAT_LARGE_POOL].freed, 0);
  EQ(st.num_device_alloc, 0);
  FREE(e.a, a);
  FREE(e.a, b);
  EMPTY(e.a);
  st = STATS(e.a, 0);
  EXPECT_COUNTERS(e.a, 0, 0, 3, 0, 0, 1);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].freed, 72 * MiB);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].allocated, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].peak, 72 * MiB);
  EQ(st.segment[CACHALOT_STAT_ALL].freed, 3);
  /* allocated - freed is the change since the reset */
  const cachalot_stat *now_arr[] = {st.allocation, st.allocated_bytes, st.active, st.active_bytes,
                                    st.requested_bytes, st.segment, st.reserved_bytes, st.inactive_split,
                                    st.inactive_split_bytes};
  const cachalot_stat *then_arr[] = {at_reset.allocation, at_reset.allocated_bytes, at_reset.active,
                                     at_reset.active_bytes, at_reset.requested_bytes, at_reset.segment,
                                     at_reset.reserved_bytes, at_reset.inactive_split,
                                     at_reset.inactive_split_bytes};
  for (size_t i = 0; i < sizeof now_arr / sizeof now_arr[0]; i++)
    for (int k = 0; k < 3; k++)
      EQ(now_arr[i][k].allocated - now_arr[i][k].freed, now_arr[i][k].current - then_arr[i][k].current);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  env_free(&e);

  e = ENV(1, 0, "");
  EQ(STATS(e.a, 0).max_split_size, -1);
  env_free(&e);
}

/* ==== §8 settings at run time ==================================================================== */

static void test_set_settings(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  void *p1 = ALLOC(e.a, 0, 84 * MiB, NULL);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 84 * MiB);
  OK(cachalot_set_settings(e.a, "roundup_power2_divisions:4"));
  CHECK(e.a);
  void *p2 = ALLOC(e.a, 0, 84 * MiB, NULL);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 84 * MiB + 96 * MiB);

  /* invalid: nothing of it applies (not even the valid first key) */
  cachalot_device_stats before = STATS(e.a, 0);
  STATUS(cachalot_set_settings(e.a, "roundup_power2_divisions:8,max_split_size_mb:10"), CACHALOT_ERROR_CONFIG);
  CONTAINS(cachalot_last_error(), "max_split_size_mb");
  CHECK(e.a);
  STATUS(cachalot_set_settings(e.a, "roundup_power2_divisions:8,bogus_key:1"), CACHALOT_ERROR_CONFIG);
  CONTAINS(cachalot_last_error(), "bogus_key");
  CHECK(e.a);
  STATUS(cachalot_set_settings(e.a, "roundup_power2_divisions:8,expandable_segments:maybe"), CACHALOT_ERROR_CONFIG);
  CONTAINS(cachalot_last_error(), "expandable_segments");
  CHECK(e.a);
  cachalot_device_stats after = STATS(e.a, 0);
  assert_memory_equal(&before, &after, sizeof before);
  void *p3 = ALLOC(e.a, 0, 84 * MiB, NULL); /* still 4 divisions: 96 MiB, not 88 */
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 84 * MiB + 2 * 96 * MiB);
  /* PyTorch's rule: each call states max_split_size_mb, roundup_power2_divisions and
   * garbage_collection_threshold afresh (unnamed, they return to their defaults) ... */
  OK(cachalot_set_settings(e.a, "garbage_collection_threshold:0.5,max_split_size_mb:1000"));
  OK(cachalot_set_settings(e.a, "release_lock_on_cudamalloc:False"));
  CHECK(e.a);
  cachalot_settings now;
  OK(cachalot_get_settings(e.a, &now));
  EQ(now.max_split_size, SIZE_MAX);
  assert_true(now.garbage_collection_threshold == 0.0);
  EQ(now.roundup_power2_divisions[6], 0);
  assert_false(now.release_lock_on_cudamalloc);
  void *p84 = ALLOC(e.a, 0, 84 * MiB, NULL); /* no divisions now: 84 MiB */
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 2 * 84 * MiB + 2 * 96 * MiB);
  FREE(e.a, p84);
  OK(cachalot_empty_cache(e.a)); /* its segment would count in the oversize figures below */
  CHECK(e.a);
  /* ... and every other key a string does not name keeps its value */
  OK(cachalot_set_settings(e.a, "roundup_power2_divisions:4"));
  CHECK(e.a);
  OK(cachalot_get_settings(e.a, &now));
  assert_false(now.release_lock_on_cudamalloc);
  void *p4 = ALLOC(e.a, 0, 84 * MiB, NULL);
  EQ(STATS(e.a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 84 * MiB + 3 * 96 * MiB);
  EXPECT_OVERSIZE(e.a, 0, 0, 0);

  /* max_split_size changes recount the oversize stats */
  OK(cachalot_set_settings(e.a, "max_split_size_mb:90"));
  CHECK(e.a);
  EQ(STATS(e.a, 0).max_split_size, 90 * MiB);
  EXPECT_OVERSIZE(e.a, 0, 3, 3);
  FREE(e.a, p2);
  EXPECT_OVERSIZE(e.a, 0, 2, 3);
  OK(cachalot_set_settings(e.a, "max_split_size_mb:20"));
  CHECK(e.a);
  EXPECT_OVERSIZE(e.a, 0, 3, 4);
  FREE(e.a, p1);
  EXPECT_OVERSIZE(e.a, 0, 2, 4);
  OK(cachalot_set_settings(e.a, "max_split_size_mb:1000"));
  CHECK(e.a);
  EXPECT_OVERSIZE(e.a, 0, 0, 0);
  /* the recount is a change like any other: allocated - freed still equals current */
  cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.oversize_segments.allocated - st.oversize_segments.freed, st.oversize_segments.current);
  EQ(st.oversize_segments.peak, 4);
  OK(cachalot_set_settings(e.a, "max_split_size_mb:18446744073709551615")); /* unlimited again */
  CHECK(e.a);
  EQ(STATS(e.a, 0).max_split_size, -1);
  FREE(e.a, p3);
  FREE(e.a, p4);
  EXPECT_OVERSIZE(e.a, 0, 0, 0);

  /* fraction by set_settings, on every device */
  env_free(&e);
  e = ENV(2, 64 * MiB, "");
  OK(cachalot_set_settings(e.a, "per_process_memory_fraction:0.5"));
  CHECK(e.a);
  void *q0 = ALLOC(e.a, 0, 30 * MiB, NULL);
  void *q1 = ALLOC(e.a, 1, 30 * MiB, NULL);
  void *x = NULL;
  STATUS(cachalot_malloc(e.a, 1, 4 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "GPU 1 has a total capacity of 64.00 MiB of which 34.00 MiB is free. 32.00 MiB "
                                  "allowed; ");
  CHECK(e.a);
  STATUS(cachalot_malloc(e.a, 0, 4 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CHECK(e.a);
  FREE(e.a, q0);
  FREE(e.a, q1);
  env_free(&e);
}

/* ==== several devices ============================================================================ */

static void test_two_devices(void **state) {
  (void)state;
  env e = ENV(2, GiB, "");
  int n = 0;
  OK(cachalot_device_count(e.a, &n));
  EQ(n, 2);
  cachalot_stream t1 = STREAM(e.b, 1), t1b = STREAM(e.b, 1);
  void *p0 = ALLOC(e.a, 0, MiB, NULL);
  void *p1 = ALLOC(e.a, 1, 3 * MiB, t1);
  pool_x d0 = PX(.alloc = 1, .alloc_b = MiB, .active = 1, .active_b = MiB, .req_b = MiB, .seg = 1, .res_b = 2 * MiB,
                 .split = 1, .split_b = MiB);
  EXPECT_POOLS(e.a, 0, d0, PX0);
  EXPECT_POOLS(e.a, 1, PX0,
               PX(.alloc = 1, .alloc_b = 3 * MiB, .active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 1,
                  .res_b = 20 * MiB, .split = 1, .split_b = 17 * MiB));
  EQ(USED(e.b, 0), 2 * MiB);
  EQ(USED(e.b, 1), 20 * MiB);

  /* free finds device 1 */
  RECORD(e.a, p1, t1b);
  FREE(e.a, p1);
  EXPECT_POOLS(e.a, 0, d0, PX0);
  EXPECT_POOLS(e.a, 1, PX0,
               PX(.active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 1, .res_b = 20 * MiB, .split = 1,
                  .split_b = 17 * MiB));
  COMPLETE(&e, t1b);
  void *q1 = ALLOC(e.a, 1, 3 * MiB, t1);
  assert_ptr_equal(q1, p1);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  EXPECT_COUNTERS(e.a, 1, 1, 0, 0, 0, 0);

  /* device -1 and 2 are rejected everywhere */
  const int bad[] = {-1, 2};
  for (int i = 0; i < 2; i++) {
    void *x = (void *)(uintptr_t)0x1;
    STATUS(cachalot_malloc(e.a, bad[i], 512, NULL, &x), CACHALOT_ERROR_INVALID_ARGUMENT);
    assert_null(x);
    CONTAINS(cachalot_last_error(), "out of range");
    cachalot_device_stats st;
    memset(&st, 0x5a, sizeof st);
    STATUS(cachalot_memory_stats(e.a, bad[i], &st), CACHALOT_ERROR_INVALID_ARGUMENT);
    EQ(st.num_device_alloc, 0);
    STATUS(cachalot_reset_peak_stats(e.a, bad[i]), CACHALOT_ERROR_INVALID_ARGUMENT);
    STATUS(cachalot_reset_accumulated_stats(e.a, bad[i]), CACHALOT_ERROR_INVALID_ARGUMENT);
    STATUS(cachalot_set_memory_fraction(e.a, bad[i], 0.5), CACHALOT_ERROR_INVALID_ARGUMENT);
    CHECK(e.a);
  }

  /* per-device fraction and OOM */
  OK(cachalot_set_memory_fraction(e.a, 1, 0.01)); /* 10.24 MiB */
  CHECK(e.a);
  void *x = NULL;
  STATUS(cachalot_malloc(e.a, 1, 20 * MiB, NULL, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "GPU 1 has a total capacity of 1024.00 MiB of which 1004.00 MiB is free. 10.24 MiB "
                                  "allowed; ");
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 1, 1, 0, 1, 1, 1);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);
  void *p0b = ALLOC(e.a, 0, 20 * MiB, NULL); /* device 0 has no fraction */
  OK(cachalot_reset_accumulated_stats(e.a, 1));
  EXPECT_COUNTERS(e.a, 1, 0, 0, 0, 0, 0);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);

  FREE(e.a, p0);
  FREE(e.a, p0b);
  FREE(e.a, q1);
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EXPECT_POOLS(e.a, 1, PX0, PX0);
  EQ(USED(e.b, 0), 0);
  EQ(USED(e.b, 1), 0);
  env_free(&e);
}

/* ==== release_lock_on_cudamalloc:False behaves the same ============================================ */

typedef struct {
  cachalot_device_stats st[3];
  uintptr_t ptrs[8];
  size_t used;
} script_result;

static script_result run_script(const char *conf) {
  script_result r;
  memset(&r, 0, sizeof r);
  env e = ENV(1, 64 * MiB, conf);
  cachalot_stream s1 = STREAM(e.b, 0), s2 = STREAM(e.b, 0);
  char *a = ALLOC(e.a, 0, 20 * MiB, s1);
  char *b = ALLOC(e.a, 0, 3 * MiB, s1);
  char *c = ALLOC(e.a, 0, 1000, s2);
  RECORD(e.a, b, s2);
  FREE(e.a, b);
  FREE(e.a, a);
  r.st[0] = STATS(e.a, 0);
  char *d = ALLOC(e.a, 0, 40 * MiB, s2); /* full: waits for b's event, releases a's and b's segments */
  char *f = ALLOC(e.a, 0, 2 * MiB, s2);
  void *x = NULL;
  STATUS(cachalot_malloc(e.a, 0, 30 * MiB, s1, &x), CACHALOT_ERROR_OUT_OF_MEMORY);
  CHECK(e.a);
  r.st[1] = STATS(e.a, 0);
  FREE(e.a, d);
  EMPTY(e.a);
  r.st[2] = STATS(e.a, 0);
  r.ptrs[0] = (uintptr_t)a;
  r.ptrs[1] = (uintptr_t)b;
  r.ptrs[2] = (uintptr_t)c;
  r.ptrs[3] = (uintptr_t)d;
  r.ptrs[4] = (uintptr_t)f;
  r.used = USED(e.b, 0);
  FREE(e.a, c);
  FREE(e.a, f);
  env_free(&e);
  return r;
}

static void test_release_lock_false_same(void **state) {
  (void)state;
  script_result with = run_script("");
  script_result without = run_script("release_lock_on_cudamalloc:False");
  assert_memory_equal(&with, &without, sizeof with);
  /* and the script did what it says */
  EQ(with.st[1].num_alloc_retries, 2);
  EQ(with.st[1].num_ooms, 1);
  EQ(with.st[1].num_device_free, 2);
  EQ(with.st[1].reserved_bytes[CACHALOT_STAT_ALL].current, 2 * MiB + 40 * MiB + 20 * MiB);
  EQ(with.st[2].reserved_bytes[CACHALOT_STAT_ALL].current, 22 * MiB);
  EQ(with.used, 22 * MiB);
}

/* A block of device 0 used by a stream of device 1 (peer access): the event goes on that stream's own
 * device, and the block waits for it. */
static void test_record_stream_other_device(void **state) {
  (void)state;
  env e = ENV(2, GiB, "");
  cachalot_stream s0 = STREAM(e.b, 0), s1 = STREAM(e.b, 1);
  void *p = ALLOC(e.a, 0, 3 * MiB, s0);
  RECORD(e.a, p, s1);
  FREE(e.a, p);
  pool_x pending = PX(.active = 1, .active_b = 3 * MiB, .req_b = 3 * MiB, .seg = 1, .res_b = 20 * MiB, .split = 1,
                      .split_b = 17 * MiB);
  EXPECT_POOLS(e.a, 0, PX0, pending);
  void *q = ALLOC(e.a, 0, 3 * MiB, s0);
  assert_ptr_not_equal(q, p);
  FREE(e.a, q);
  COMPLETE(&e, s0); /* completing the allocation stream does not help: the use was on s1 */
  void *r = ALLOC(e.a, 0, 3 * MiB, s0);
  assert_ptr_not_equal(r, p);
  FREE(e.a, r);
  COMPLETE(&e, s1);
  void *t = ALLOC(e.a, 0, 3 * MiB, s0);
  assert_ptr_equal(t, p);
  FREE(e.a, t);
  CHECK(e.a);
  env_free(&e);
}

/* malloc step 6 frees oversize blocks of the request's own pool only: a small request never releases
 * large-pool blocks there, so a full device goes on to step 7 (sync, release all, a counted retry). */
static void test_oversize_release_not_for_small(void **state) {
  (void)state;
  env e = ENV(1, 60 * MiB, "max_split_size_mb:20");
  cachalot_stream s = STREAM(e.b, 0);
  void *big = ALLOC(e.a, 0, 40 * MiB, s);
  FREE(e.a, big);
  void *keep = ALLOC(e.a, 0, 20 * MiB, s);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  void *tiny = ALLOC(e.a, 0, 1, s); /* the device is full: 40 + 20 of 60 MiB */
  CHECK(e.a);
  EXPECT_COUNTERS(e.a, 0, 3, 1, 1, 0, 1);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 1, .alloc_b = 512, .active = 1, .active_b = 512, .req_b = 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 1, .split_b = 2 * MiB - 512),
               PX(.alloc = 1, .alloc_b = 20 * MiB, .active = 1, .active_b = 20 * MiB, .req_b = 20 * MiB, .seg = 1,
                  .res_b = 20 * MiB));
  FREE(e.a, tiny);
  FREE(e.a, keep);
  env_free(&e);
}

/* CUDA IPC (PyTorch's shareIpcHandle): the handle is the block's segment's allocation's, with the block's
 * offset in it; a pointer that is not a block's start, or NULL outputs, are refused, and so is a block of
 * an expandable segment. */
static void test_ipc_handle(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  char *p = ALLOC(e.a, 0, 1000, NULL);
  char *q = ALLOC(e.a, 0, 1000, NULL); /* the same 2 MiB segment, 1024 bytes on */
  unsigned char h[64];
  size_t off = 99;
  OK(cachalot_ipc_handle(e.a, q, h, &off));
  EQ(off, 1024);
  assert_memory_equal(h, "cachalot-sim-ipc", 16);
  uintptr_t base = 0;
  memcpy(&base, h + 24, sizeof base);
  assert_ptr_equal((void *)base, p); /* the segment's allocation */
  OK(cachalot_ipc_handle(e.a, p, h, &off));
  EQ(off, 0);
  STATUS(cachalot_ipc_handle(e.a, q + 512, h, &off), CACHALOT_ERROR_INVALID_POINTER);
  EQ(off, 0);
  STATUS(cachalot_ipc_handle(e.a, NULL, h, &off), CACHALOT_ERROR_INVALID_POINTER);
  STATUS(cachalot_ipc_handle(e.a, q, NULL, &off), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_ipc_handle(e.a, q, h, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CHECK(e.a);
  FREE(e.a, p);
  FREE(e.a, q);
  env_free(&e);

  e = ENV(1, 0, "expandable_segments:True");
  char *x = ALLOC(e.a, 0, 1000, NULL);
  STATUS(cachalot_ipc_handle(e.a, x, h, &off), CACHALOT_ERROR_NOT_SUPPORTED);
  CONTAINS(cachalot_last_error(), "expandable segment");
  FREE(e.a, x);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding_table),
      cmocka_unit_test(test_size_zero_and_huge),
      cmocka_unit_test(test_split_small_pool),
      cmocka_unit_test(test_split_two_ten_mib),
      cmocka_unit_test(test_split_large_one_mib_rest),
      cmocka_unit_test(test_best_fit),
      cmocka_unit_test(test_merge_neighbours),
      cmocka_unit_test(test_per_stream),
      cmocka_unit_test(test_record_stream_pending),
      cmocka_unit_test(test_record_stream_own_stream_ignored),
      cmocka_unit_test(test_record_stream_two_streams),
      cmocka_unit_test(test_record_stream_event_order),
      cmocka_unit_test(test_empty_cache_waits_for_events),
      cmocka_unit_test(test_max_split_basic),
      cmocka_unit_test(test_max_non_split_rounding),
      cmocka_unit_test(test_max_split_release_when_full),
      cmocka_unit_test(test_max_split_changed_at_run_time),
      cmocka_unit_test(test_settings_in_force),
      cmocka_unit_test(test_oom_message_and_retry),
      cmocka_unit_test(test_oom_with_fraction_message),
      cmocka_unit_test(test_fraction_config_key),
      cmocka_unit_test(test_fraction_of_huge_device),
      cmocka_unit_test(test_decimal_comma_locale),
      cmocka_unit_test(test_garbage_collection),
      cmocka_unit_test(test_stats_resets),
      cmocka_unit_test(test_set_settings),
      cmocka_unit_test(test_two_devices),
      cmocka_unit_test(test_ipc_handle),
      cmocka_unit_test(test_record_stream_other_device),
      cmocka_unit_test(test_oversize_release_not_for_small),
      cmocka_unit_test(test_release_lock_false_same),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
