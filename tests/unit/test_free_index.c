/* Best fit through the segregated-fit free index (struct cl_bins in src/allocator/internal.h): free
 * blocks whose sizes share a size class, sit in neighbouring classes or classes far apart (other bitmap
 * words), and requests whose answer is decided inside a class, in the next non-empty class, or by the
 * descending walk of the oversize release across classes. Every size is exact, every step is followed
 * by cachalot_check() (which verifies the classes and bitmaps), and every expected block follows from
 * PyTorch's best-fit rule alone: the smallest block >= the request, the lowest address among equal sizes. The
 * class layout only decides which paths are exercised; the premises are asserted so that a change of layout
 * shows here instead of silently weakening the test. */
#include "helpers.h"

#include "allocator/internal.h"

#define U ((size_t)512) /* the unit of sizes: every block is a multiple of 512 bytes */

static unsigned small_class(size_t units) { return cl_fit_class(true, units * U); }
static unsigned large_class(size_t bytes) { return cl_fit_class(false, bytes); }

static void test_small_pool_classes(void **state) {
  (void)state;
  /* The premises: 75 and 76 units share a class, 77 is in the next (empty here), 79 in the one
   * after, 85 further up with empty classes between; 1, 2, 8 and 9 units are classes of their own. */
  assert_int_equal(small_class(75), small_class(76));
  assert_int_equal(small_class(77), small_class(75) + 1);
  assert_int_equal(small_class(79), small_class(75) + 2);
  assert_true(small_class(85) > small_class(79) + 1);
  assert_true(small_class(1) < small_class(2) && small_class(8) + 1 == small_class(9));

  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  /* One 2 MiB segment carved into  ga 76 | k 1 | gb 75 | k 1 | gc 76 | k 1 | gd 79 | k 1 | ge 85 |
   * k 1 | tail 3700  (units of 512 B); the keepers k stay allocated, so the gaps never merge. */
  static const size_t gap_units[5] = {76, 75, 76, 79, 85};
  char *gap[5], *keep[5];
  for (int i = 0; i < 5; i++) {
    gap[i] = ALLOC(e.a, 0, gap_units[i] * U, s);
    keep[i] = ALLOC(e.a, 0, U, s);
    assert_ptr_equal(keep[i], gap[i] + gap_units[i] * U);
    if (i)
      assert_ptr_equal(gap[i], keep[i - 1] + U);
  }
  char *ga = gap[0], *gb = gap[1], *gc = gap[2], *gd = gap[3], *ge = gap[4];
  const int order[5] = {2, 4, 0, 3, 1}; /* gc first: the higher of the two 76-unit gaps */
  for (int i = 0; i < 5; i++)
    FREE(e.a, gap[order[i]]);
  const int64_t tail = (int64_t)((4096 - 391 - 5) * U);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 5, .alloc_b = 5 * U, .active = 5, .active_b = 5 * U, .req_b = 5 * U, .seg = 1,
                  .res_b = 2 * MiB, .split = 6, .split_b = 391 * U + tail),
               PX0);

  /* Inside one class: 75 is too small for 76, and of the two 76s the lower address wins. */
  char *p = ALLOC(e.a, 0, 76 * U - 100, s);
  assert_ptr_equal(p, ga);
  char *q = ALLOC(e.a, 0, 76 * U, s);
  assert_ptr_equal(q, gc);
  /* 77's class is empty: the next non-empty class holds gd (79); its 2-unit rest changes class. */
  char *r = ALLOC(e.a, 0, 77 * U, s);
  assert_ptr_equal(r, gd);
  /* Just above every block of its class (gb, 75): from the next non-empty class, past four empty ones
   * (77's, 79's now that gd is taken, and the two between 79's and 85's): ge (85), leaving a 9-unit
   * rest. */
  char *t = ALLOC(e.a, 0, 75 * U + 1, s);
  assert_ptr_equal(t, ge);
  /* Exact classes: 2 units -> gd's rest; 8 units -> the 9-unit rest of ge (class 8 is empty), split. */
  char *u2 = ALLOC(e.a, 0, 2 * U, s);
  assert_ptr_equal(u2, gd + 77 * U);
  char *u8 = ALLOC(e.a, 0, 8 * U - 1, s);
  assert_ptr_equal(u8, ge + 76 * U);
  /* The last block of gb's class. */
  char *v = ALLOC(e.a, 0, 75 * U, s);
  assert_ptr_equal(v, gb);
  EXPECT_POOLS(e.a, 0,
               PX(.alloc = 12, .alloc_b = (5 + 76 + 76 + 77 + 76 + 2 + 8 + 75) * U,
                  .active = 12, .active_b = (5 + 76 + 76 + 77 + 76 + 2 + 8 + 75) * U,
                  .req_b = (5 + 76 + 76 + 77 + 75 + 2 + 8 + 75) * U - 100 + 1 - 1, .seg = 1, .res_b = 2 * MiB,
                  .split = 2, .split_b = U + tail),
               PX0);

  /* Merges that move a block up a class: the 8-unit block joins the 1-unit rest (9 units), then ge's
   * first part joins them (85 units, ge's old class): a 85-unit request finds it, not the tail. */
  FREE(e.a, u8);
  FREE(e.a, t);
  char *w = ALLOC(e.a, 0, 85 * U, s);
  assert_ptr_equal(w, ge);
  /* A keeper freed next to the tail merges into it; the tail is then the only block that fits. */
  FREE(e.a, keep[4]);
  char *x = ALLOC(e.a, 0, 86 * U, s);
  assert_ptr_equal(x, keep[4]);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);

  char *rest[] = {p, q, r, u2, v, w, x, keep[0], keep[1], keep[2], keep[3]};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
    FREE(e.a, rest[i]);
  EXPECT_POOLS(e.a, 0, PX(.seg = 1, .res_b = 2 * MiB), PX0);
  env_free(&e);
}

static void test_large_pool_classes(void **state) {
  (void)state;
  /* The premises: 3 MiB - 64 KiB and 3 MiB share a class, 2.5 MiB is in the one below; a 40 MiB
   * block's class lies several above 9 MiB's, and its 31 MiB rest's more than one above 20 MiB's. */
  assert_int_equal(large_class(3 * MiB - 64 * KiB), large_class(3 * MiB));
  assert_int_equal(large_class(5 * MiB / 2), large_class(3 * MiB) - 1);
  assert_true(large_class(40 * MiB) > large_class(9 * MiB) + 4);
  assert_true(large_class(31 * MiB) > large_class(20 * MiB) + 1);

  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  /* One 20 MiB segment: g1 3 - 1/16 | k 2 | g2 3 | k 2 | g3 3 - 1/16 | k 2 | tail 5 + 1/8 (MiB). */
  char *g1 = ALLOC(e.a, 0, 3 * MiB - 64 * KiB, s);
  char *k1 = ALLOC(e.a, 0, 2 * MiB, s);
  char *g2 = ALLOC(e.a, 0, 3 * MiB, s);
  char *k2 = ALLOC(e.a, 0, 2 * MiB, s);
  char *g3 = ALLOC(e.a, 0, 3 * MiB - 64 * KiB, s);
  char *k3 = ALLOC(e.a, 0, 2 * MiB, s);
  assert_ptr_equal(g3, g1 + 10 * MiB - 64 * KiB);
  assert_ptr_equal(k3, g3 + 3 * MiB - 64 * KiB);
  FREE(e.a, g3);
  FREE(e.a, g1);
  FREE(e.a, g2);

  /* Inside one class: 3 MiB - 63.5 KiB passes over the 3 MiB - 64 KiB blocks to g2 (the rest, 63.5 KiB,
   * stays on it: a large block splits only for a rest above 1 MiB). */
  char *a = ALLOC(e.a, 0, 3 * MiB - 64 * KiB + 512, s);
  assert_ptr_equal(a, g2);
  /* Equal sizes: the lower address. */
  char *b = ALLOC(e.a, 0, 3 * MiB - 64 * KiB, s);
  assert_ptr_equal(b, g1);
  /* 2.5 MiB: its own class is empty, the next holds g3 (rest 448 KiB: not split). */
  char *c = ALLOC(e.a, 0, 5 * MiB / 2, s);
  assert_ptr_equal(c, g3);
  EXPECT_COUNTERS(e.a, 0, 1, 0, 0, 0, 0);

  /* A 40 MiB segment, freed: 9 MiB skips the empty classes up to the 40 MiB block's, rather than asking
   * the device. */
  char *big = ALLOC(e.a, 0, 40 * MiB, s);
  FREE(e.a, big);
  char *d = ALLOC(e.a, 0, 9 * MiB, s);
  assert_ptr_equal(d, big);
  /* 20 MiB: the next non-empty class above its own is the 31 MiB rest's. */
  char *f = ALLOC(e.a, 0, 20 * MiB, s);
  assert_ptr_equal(f, big + 9 * MiB);
  EXPECT_COUNTERS(e.a, 0, 2, 0, 0, 0, 0);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 8, .alloc_b = 44 * MiB - 128 * KiB, .active = 8, .active_b = 44 * MiB - 128 * KiB,
                  .req_b = 44 * MiB - 640 * KiB + 512, .seg = 2, .res_b = 60 * MiB,
                  .split = 2, .split_b = 5 * MiB + 128 * KiB + 11 * MiB));
  char *all[] = {a, b, c, d, f, k1, k2, k3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    FREE(e.a, all[i]);
  EXPECT_POOLS(e.a, 0, PX0, PX(.seg = 2, .res_b = 60 * MiB));
  env_free(&e);
}

static void test_oversize_release_across_classes(void **state) {
  (void)state;
  /* The premises: 66 and 68 MiB share a class, 90 MiB is in the next one up, 260 MiB further up with
   * empty classes between. */
  assert_int_equal(large_class(66 * MiB), large_class(68 * MiB));
  assert_int_equal(large_class(90 * MiB), large_class(68 * MiB) + 1);
  assert_true(large_class(260 * MiB) > large_class(90 * MiB) + 1);

  /* Whole cached oversize segments of 66, 68, 90 and 260 MiB on a 500 MiB device: 400 MiB does not fit
   * the device (484 MiB used) and no cached block is >= 400 MiB, so they go back from the largest down,
   * across classes and inside a class, until 400 MiB are released: 260, 90 and 68
   * (walking down, 68 comes before 66); 66 stays. */
  env e = ENV(1, 500 * MiB, "max_split_size_mb:40");
  cachalot_stream s = STREAM(e.b, 0);
  char *p66 = ALLOC(e.a, 0, 66 * MiB, s);
  char *p90 = ALLOC(e.a, 0, 90 * MiB, s);
  char *p68 = ALLOC(e.a, 0, 68 * MiB, s);
  char *p260 = ALLOC(e.a, 0, 260 * MiB, s);
  FREE(e.a, p90);
  FREE(e.a, p68);
  FREE(e.a, p260);
  FREE(e.a, p66);
  EXPECT_OVERSIZE(e.a, 0, 0, 4);
  char *big = ALLOC(e.a, 0, 400 * MiB, s);
  EXPECT_COUNTERS(e.a, 0, 5, 3, 0, 0, 0);
  EXPECT_OVERSIZE(e.a, 0, 1, 2);
  EXPECT_POOLS(e.a, 0, PX0,
               PX(.alloc = 1, .alloc_b = 400 * MiB, .active = 1, .active_b = 400 * MiB, .req_b = 400 * MiB,
                  .seg = 2, .res_b = 466 * MiB));
  EXPECT_RESERVED_IS_USED(&e, 0);
  /* The one that stayed is still cached. */
  char *again = ALLOC(e.a, 0, 66 * MiB, s);
  assert_ptr_equal(again, p66);
  EXPECT_COUNTERS(e.a, 0, 5, 3, 0, 0, 0);
  FREE(e.a, big);
  FREE(e.a, again);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_pool_classes),
      cmocka_unit_test(test_large_pool_classes),
      cmocka_unit_test(test_oversize_release_across_classes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
