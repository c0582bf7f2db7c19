/* The step plan (expandable_plan, set by preset:low_fragmentation) on the simulated device: a training
 * loop's step found without any call from the program, planned, and served from then on with no page
 * mapped or unmapped; a step that deviates (an evaluation step) served by the online policy and the plan
 * taken up again; a lasting change of shape that drops the plan and forms a new one; two streams;
 * record_stream'd blocks whose frees complete late; a capture in the middle. Exact bytes throughout, and
 * cachalot_check after every call (the helpers run it). */
#include "helpers.h"

#include "allocator/internal.h"

#define PRESET "preset:low_fragmentation"
#define PAGE (2 * MiB)

enum { ACTS = 36 };

static const size_t SIZES[6] = {2 * MiB, 3 * MiB, 4 * MiB, 5 * MiB, 6 * MiB, 7 * MiB};
/* One step's activations: 6 x (2 + 3 + ... + 7) MiB. */
#define ACT_BYTES ((size_t)6 * 27 * MiB)
#define CARRY (6 * MiB)

typedef struct {
  void *act[ACTS];
  void *carry; /* a buffer each step keeps to the next one (gradients kept for the next step, a prefetch) */
} step_ptrs;

/* One step of a training loop on stream s (the odd activations on stream `odd`): ACTS activations (sizes
 * times `scale`), then the buffer kept
 * to the next step (the previous step's freed first), then the activations freed newest first: 74 events,
 * 73 in the first step. With `side`, the fourth activation is used by that stream too, and its free
 * completes only when `side` does, at the end of the step. */
static void step_on(env *e, cachalot_stream s, cachalot_stream odd, step_ptrs *p, size_t scale, cachalot_stream side) {
  for (int i = 0; i < ACTS; i++)
    p->act[i] = ALLOC(e->a, 0, SIZES[i % 6] * scale, i % 2 ? odd : s);
  if (side) {
    RECORD(e->a, p->act[3], side);
    OK(cachalot_sim_launch(e->b, side));
  }
  if (p->carry)
    FREE(e->a, p->carry);
  p->carry = ALLOC(e->a, 0, CARRY, s);
  for (int i = ACTS - 1; i >= 0; i--)
    FREE(e->a, p->act[i]);
  if (side)
    COMPLETE(e, side);
}
static void step(env *e, cachalot_stream s, step_ptrs *p, size_t scale, cachalot_stream side) {
  step_on(e, s, s, p, scale, side);
}

static cachalot_plan_stats plan_of(cachalot_allocator *a) {
  cachalot_plan_stats ps;
  OK(cachalot_plan_stats_get(a, 0, &ps));
  return ps;
}

static int64_t device_calls(cachalot_allocator *a) {
  const cachalot_device_stats st = STATS(a, 0);
  return st.num_device_alloc + st.num_device_free;
}

/* The opening most tests share: seven steps on the default stream, after which the plan is in force. */
static void to_force_(env *e, step_ptrs *p, const char *file, int line) {
  for (int k = 0; k < 7; k++)
    step(e, NULL, p, 1, NULL);
  eq_i64_(plan_of(e->a).in_force, 1, "in force", file, line);
}
#define TO_FORCE(e, p) to_force_((e), (p), __FILE__, __LINE__)

/* The end every test shares: the step's buffer freed, empty_cache, nothing held by the allocator or on
 * the device, the allocator gone. */
static void finish_(env *e, step_ptrs *p, const char *file, int line) {
  if (p->carry)
    free_ok_(e->a, p->carry, file, line);
  empty_ok_(e->a, file, line);
  expect_pools_(e->a, 0, PX0, PX0, file, line);
  eq_i64_((int64_t)used_(e->b, 0, file, line), 0, "device memory used", file, line);
  env_free(e);
}
#define FINISH(e, p) finish_((e), (p), __FILE__, __LINE__)

/* Runs one step and checks the plan's counters and the device calls so far. */
static void step_expect_(env *e, step_ptrs *p, int64_t found, int64_t served, int64_t clean, int64_t calls,
                         const char *file, int line) {
  step(e, NULL, p, 1, NULL);
  const cachalot_plan_stats ps = plan_of(e->a);
  eq_i64_(ps.periods_found, found, "periods found", file, line);
  eq_i64_(ps.plans_formed, found, "plans formed", file, line);
  eq_i64_(ps.served, served, "mallocs served", file, line);
  eq_i64_(ps.missed, 0, "mallocs missed", file, line);
  eq_i64_(ps.laps_clean, clean, "clean laps", file, line);
  eq_i64_(ps.in_force, clean > 0, "in force", file, line);
  eq_i64_(device_calls(e->a), calls, "device calls", file, line);
}
#define STEP_EXPECT(e, p, found, served, clean, calls)                                                          \
  step_expect_((e), (p), (found), (served), (clean), (calls), __FILE__, __LINE__)

/* The period (74 events) is found in the fourth step, once a whole period has matched the one before;
 * the plan serves from the fifth, mapping its range as the blocks come (and unmapping the online policy's
 * free pages so that reserved memory stays at its peak); the sixth maps nothing, and the plan is in force
 * from the seventh. From then on each step hands out its 37 blocks at the planned places (the same two
 * places by the step's parity), maps and unmaps nothing, and holds exactly the weights and the plan's
 * range: 30 MiB + the live-bytes bound of the step, 168 MiB. */
static void plan_formed_and_served(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  void *w[3];
  for (int i = 0; i < 3; i++)
    w[i] = ALLOC(e.a, 0, 10 * MiB, NULL);
  step_ptrs p = {{0}, NULL};
  for (int k = 0; k < 3; k++)
    STEP_EXPECT(&e, &p, 0, 0, 0, 40);
  STEP_EXPECT(&e, &p, 1, 0, 0, 40);
  cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.period, 2 * ACTS + 2);
  EQ(ps.footprint, ACT_BYTES + CARRY); /* every activation and one buffer: the live-bytes bound */
  const int64_t peak = 30 * MiB + ACT_BYTES + CARRY;
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, peak);
  STEP_EXPECT(&e, &p, 1, 37, 0, 114);
  STEP_EXPECT(&e, &p, 1, 74, 0, 114);
  STEP_EXPECT(&e, &p, 1, 111, 1, 114);
  void *even[ACTS + 1], *odd[ACTS + 1];
  for (int k = 0; k < 6; k++) {
    STEP_EXPECT(&e, &p, 1, 148 + 37 * k, 2 + k, 114);
    void **v = k % 2 ? odd : even;
    if (k >= 2) { /* each block where the same block was two steps before */
      for (int i = 0; i < ACTS; i++)
        EQ(p.act[i], v[i]);
      EQ(p.carry, v[ACTS]);
    }
    memcpy(v, p.act, sizeof p.act);
    v[ACTS] = p.carry;
  }
  ps = plan_of(e.a);
  EQ(ps.unplanned, 0);
  EQ(ps.device_calls_in_force, 0);
  const cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, peak); /* the weights' pages and the plan's range */
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].peak, peak);
  EXPECT_RESERVED_IS_USED(&e, 0);
  for (int i = 0; i < 3; i++)
    FREE(e.a, w[i]);
  FINISH(&e, &p);
}

/* The two places of each block of the step (by the step's parity) once the plan is in force. */
typedef struct {
  void *at[2][ACTS + 1];
} places;

static places learn_places(env *e, step_ptrs *p) {
  places pl;
  for (int k = 0; k < 2; k++) {
    step(e, NULL, p, 1, NULL);
    memcpy(pl.at[k], p->act, sizeof p->act);
    pl.at[k][ACTS] = p->carry;
  }
  return pl;
}

/* Whether every block of the step just run sits at one of its two places, the same parity for all. */
static void expect_at_places(const places *pl, const step_ptrs *p) {
  const int k = p->act[0] == pl->at[0][0] ? 0 : 1;
  for (int i = 0; i < ACTS; i++)
    EQ(p->act[i], pl->at[k][i]);
  EQ(p->carry, pl->at[k][ACTS]);
}

/* The steady state after a plan recovered: two more steps, each block at its learned place and no page
 * mapped or unmapped; the plan formed once, never dropped, in force, with no device call while it was. */
static void steady_(env *e, step_ptrs *p, const places *pl, const char *file, int line) {
  const int64_t calls = device_calls(e->a);
  for (int k = 0; k < 2; k++) {
    step(e, NULL, p, 1, NULL);
    expect_at_places(pl, p);
  }
  const cachalot_plan_stats ps = plan_of(e->a);
  eq_i64_(ps.plans_formed, 1, "plans formed", file, line);
  eq_i64_(ps.plans_dropped, 0, "plans dropped", file, line);
  eq_i64_(ps.in_force, 1, "in force", file, line);
  eq_i64_(ps.device_calls_in_force, 0, "device calls in force", file, line);
  eq_i64_(device_calls(e->a), calls, "device calls", file, line);
}
#define STEADY(e, p, pl) steady_((e), (p), (pl), __FILE__, __LINE__)

/* An evaluation step (ten 9 MiB blocks, none of the step's sizes) in the middle: the plan goes out of
 * force at its first malloc, which the online policy serves outside the plan's range (unmapping free pages
 * of the range first, so that reserved memory stays at its peak); the next step takes the period up again, the one after
 * serves again once a whole period has matched, and the plan is back in force two steps later, every
 * block at its old place and no device call since. Nothing was dropped: the plan is the same one. */
static void plan_deviation_recovers(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  const places pl = learn_places(&e, &p);
  EQ(plan_of(e.a).served, 185);
  void *ev[10];
  for (int i = 0; i < 10; i++)
    ev[i] = ALLOC(e.a, 0, 9 * MiB, NULL);
  for (int i = 0; i < 10; i++)
    FREE(e.a, ev[i]);
  cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.in_force, 0);
  EQ(ps.served, 185);
  EQ(ps.missed, 0);
  /* no new peak: its growth unmapped free pages of the plan's range first (with a plan, growth has no
   * slack above the reserved peak: what repeats is planned, only deviations grow) */
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, ACT_BYTES + CARRY);
  static const int64_t served[5] = {185, 186, 223, 260, 297};
  for (int k = 0; k < 5; k++) {
    step(&e, NULL, &p, 1, NULL);
    ps = plan_of(e.a);
    EQ(ps.served, served[k]);
    EQ(ps.missed, 0);
    EQ(ps.in_force, k == 4);
    if (k >= 2)
      expect_at_places(&pl, &p);
  }
  STEADY(&e, &p, &pl);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, ACT_BYTES + CARRY);
  FINISH(&e, &p);
}

/* The shape changes for good (every size doubles): no malloc follows the plan, which is dropped once two
 * whole periods of events have passed without one (in the third step); the new period is found in the
 * fourth, served from the fifth and in force from the seventh, with a range of the new step's live-bytes
 * bound, and no device call after the fifth. */
static void plan_dropped_and_formed_again(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  static const int64_t dropped[8] = {0, 0, 1, 1, 1, 1, 1, 1}, formed[8] = {1, 1, 1, 2, 2, 2, 2, 2},
                       served[8] = {111, 111, 111, 111, 148, 185, 222, 259};
  int64_t calls = 0;
  for (int k = 0; k < 8; k++) {
    step(&e, NULL, &p, 2, NULL);
    const cachalot_plan_stats ps = plan_of(e.a);
    EQ(ps.plans_dropped, dropped[k]);
    EQ(ps.plans_formed, formed[k]);
    (void)served;
    EQ(ps.missed, 0);
    EQ(ps.in_force, k >= 6);
    EQ(ps.footprint, k == 2 ? 0 : k < 2 ? (int64_t)(ACT_BYTES + CARRY) : (int64_t)(2 * ACT_BYTES + CARRY));
    if (k == 4)
      calls = device_calls(e.a);
    if (k > 4)
      EQ(device_calls(e.a), calls);
  }
  /* the doubled step's live-bytes bound */
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, 2 * ACT_BYTES + CARRY);
  FINISH(&e, &p);
}

/* One activation of each step is used by a side stream (record_stream) and its free completes only when
 * that stream does, at the end of the step, after the other frees: its life is its completion's, and the
 * plan places it so. Same schedule as without: found in the fourth step, in force from the seventh, no
 * device call from the fifth on, nothing missed. */
static void plan_record_stream(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  cachalot_stream side = STREAM(e.b, 0);
  step_ptrs p = {{0}, NULL};
  int64_t calls = 0;
  for (int k = 0; k < 10; k++) {
    step(&e, NULL, &p, 1, side);
    const cachalot_plan_stats ps = plan_of(e.a);
    EQ(ps.periods_found, k >= 3);
    EQ(ps.served, k >= 4 ? 37 * (k - 3) : 0);
    EQ(ps.missed, 0);
    EQ(ps.in_force, k >= 6);
    if (k == 4)
      calls = device_calls(e.a);
    if (k > 4)
      EQ(device_calls(e.a), calls);
  }
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, ACT_BYTES + CARRY);
  FINISH(&e, &p);
}

/* The step on two streams, the odd activations on a second one: one range on each stream's reservation,
 * each block served in its own stream's, and the same schedule as on one stream. */
static void plan_two_streams(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  cachalot_stream s2 = STREAM(e.b, 0);
  step_ptrs p = {{0}, NULL};
  int64_t calls = 0;
  for (int k = 0; k < 10; k++) {
    step_on(&e, NULL, s2, &p, 1, NULL);
    const cachalot_plan_stats ps = plan_of(e.a);
    EQ(ps.periods_found, k >= 3);
    EQ(ps.served, k >= 4 ? 37 * (k - 3) : 0);
    EQ(ps.missed, 0);
    EQ(ps.in_force, k >= 6);
    if (k >= 3) /* the first stream's activations and the buffer (72 + 6 MiB), the second's (90 MiB) */
      EQ(ps.footprint, ACT_BYTES + CARRY);
    if (k == 4)
      calls = device_calls(e.a);
    if (k > 4)
      EQ(device_calls(e.a), calls);
    for (int i = 0; i < ACTS; i++) {
      const cl_segment *seg = cl_page_get(&e.a->pages, (uintptr_t)p.act[i]);
      assert_non_null(seg);
      EQ(seg->stream == (i % 2 ? s2 : NULL), 1);
    }
  }
  FINISH(&e, &p);
}

/* A graph captured in the middle of a step, on a stream of its own: its mallocs go to its private pool,
 * which the tracker does not see, so the step stays in force; the only device calls are the pool's. */
static void plan_capture_in_the_middle(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  cachalot_stream cs = STREAM(e.b, 0);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  const int64_t calls = device_calls(e.a), served = plan_of(e.a).served;
  for (int i = 0; i < ACTS / 2; i++)
    p.act[i] = ALLOC(e.a, 0, SIZES[i % 6], NULL);
  cachalot_graph *g = NULL;
  OK(cachalot_graph_create(e.a, 0, false, &g));
  OK(cachalot_graph_capture_begin(g, cs, (cachalot_mempool_id){0, 0}, CACHALOT_CAPTURE_GLOBAL));
  void *x = ALLOC(e.a, 0, 3 * MiB, cs), *y = ALLOC(e.a, 0, 700 * KiB, cs);
  OK(cachalot_sim_launch(e.b, cs));
  FREE(e.a, x);
  OK(cachalot_graph_capture_end(g));
  for (int i = ACTS / 2; i < ACTS; i++)
    p.act[i] = ALLOC(e.a, 0, SIZES[i % 6], NULL);
  FREE(e.a, p.carry);
  p.carry = ALLOC(e.a, 0, CARRY, NULL);
  for (int i = ACTS - 1; i >= 0; i--)
    FREE(e.a, p.act[i]);
  for (int k = 0; k < 2; k++)
    step(&e, NULL, &p, 1, NULL);
  const cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.served - served, 3 * 37);
  EQ(ps.missed, 0);
  EQ(ps.in_force, 1);
  EQ(ps.device_calls_in_force, 2); /* the pool's: a page of each kind */
  EQ(device_calls(e.a), calls + 2);
  FREE(e.a, y);
  OK(cachalot_graph_reset(g));
  cachalot_graph_destroy(g);
  FINISH(&e, &p);
}

/* A block kept past the life the plan gave it (an activation held for a later step) stands where the
 * same block of the step after next is planned: that malloc finds its range taken, and the online policy
 * serves it, outside the plan's range and over no live block; every other block is served as planned,
 * and once the held block goes the plan serves that one at its place again. */
static void plan_miss_when_a_block_outlives_its_plan(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  const places pl = learn_places(&e, &p);
  const int64_t served = plan_of(e.a).served;
  /* a step that keeps its sixth activation */
  for (int i = 0; i < ACTS; i++)
    p.act[i] = ALLOC(e.a, 0, SIZES[i % 6], NULL);
  FREE(e.a, p.carry);
  p.carry = ALLOC(e.a, 0, CARRY, NULL);
  void *held = p.act[5];
  for (int i = ACTS - 1; i >= 0; i--)
    if (i != 5)
      FREE(e.a, p.act[i]);
  expect_at_places(&pl, &p);
  const int parity = held == pl.at[0][5] ? 0 : 1;
  /* the frees went another way: the plan serves again once a whole period matches, then meets the held
   * block in the first step of its parity */
  int k = 0;
  while (plan_of(e.a).missed == 0 && k++ < 6)
    step(&e, NULL, &p, 1, NULL);
  cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.missed, 1);
  EQ(ps.in_force, 0);
  EQ(p.act[5] != pl.at[parity][5], 1);
  for (int i = 0; i < ACTS; i++)
    if (i != 5)
      EQ(p.act[i], pl.at[parity][i]);
  EQ(p.carry, pl.at[parity][ACTS]);
  EQ(k, 3); /* the step the frees went another way in, the one that matches again, then the held parity */
  /* the kept step's 37, the last malloc of the step a whole period matched again in, 36 of the third */
  EQ(ps.served - served, 37 + 1 + 36);
  FREE(e.a, held); /* a free the period does not have here: the plan is followed again a step later */
  for (k = 0; k < 5; k++)
    step(&e, NULL, &p, 1, NULL);
  expect_at_places(&pl, &p);
  ps = plan_of(e.a);
  EQ(ps.missed, 1);
  EQ(ps.in_force, 1);
  EQ(ps.plans_dropped, 0);
  FINISH(&e, &p);
}

/* A program that starts its steps over (a second run in one process): the step's buffer and the weights
 * freed, nothing live, the weights made again. At that first malloc the tracker has lost the period: the
 * plan goes out of force and the free pages the online policy left mapped (the weights' 30 MiB) go back,
 * so that the new weights are placed by growth as on a first run; the plan's range stays mapped. The steps
 * that follow find the period again, the plan serves again once a whole period has matched (from the end
 * of the third step; serving from there, in the middle of a step, costs one page more) and is in force
 * from the sixth, every block at its old place, with no device call in force. */
static void plan_program_restarts(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  void *w[3];
  for (int i = 0; i < 3; i++)
    w[i] = ALLOC(e.a, 0, 10 * MiB, NULL);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  const places pl = learn_places(&e, &p);
  const int64_t peak = 30 * MiB + ACT_BYTES + CARRY;
  cachalot_device_stats st = STATS(e.a, 0);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, peak);
  EQ(st.num_device_alloc, 77);
  EQ(st.num_device_free, 37);
  EQ(plan_of(e.a).served, 185);
  FREE(e.a, p.carry);
  p.carry = NULL;
  for (int i = 0; i < 3; i++)
    FREE(e.a, w[i]);
  w[0] = ALLOC(e.a, 0, 10 * MiB, NULL);
  st = STATS(e.a, 0);
  cachalot_plan_stats ps = plan_of(e.a);
  EQ(st.reserved_bytes[CACHALOT_STAT_ALL].current, ACT_BYTES + CARRY + 10 * MiB); /* the range, one weight */
  EQ(st.num_device_free, 38); /* the weights' pages: one hole */
  EQ(st.num_device_alloc, 78);
  EQ(ps.in_force, 0);
  EQ(ps.served, 185);
  EQ(ps.device_calls_in_force, 0);
  for (int i = 1; i < 3; i++)
    w[i] = ALLOC(e.a, 0, 10 * MiB, NULL);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, peak);
  static const int64_t served[6] = {185, 185, 201, 238, 275, 312};
  for (int k = 0; k < 6; k++) {
    step(&e, NULL, &p, 1, NULL);
    ps = plan_of(e.a);
    EQ(ps.served, served[k]);
    EQ(ps.missed, 0);
    EQ(ps.in_force, k == 5);
    EQ(ps.device_calls_in_force, 0);
  }
  expect_at_places(&pl, &p);
  STEADY(&e, &p, &pl);
  EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak, peak + PAGE);
  for (int i = 0; i < 3; i++)
    FREE(e.a, w[i]);
  FINISH(&e, &p);
}

/* A pass of a program whose shapes never repeat (no period, so no plan): 48 buffers that grow by 640 KiB
 * at a time in an order drawn from `seed`, each regrowth making the new buffer before freeing the old (a KV
 * cache grown by torch.cat), 4,800 mallocs; then everything freed. Its reserved peak. */
static int64_t growing_pass(env *e, uint32_t seed) {
  OK(cachalot_reset_peak_stats(e->a, 0));
  void *buf[48];
  size_t size[48];
  uint32_t x = seed;
  for (int i = 0; i < 48; i++) {
    size[i] = 1 * MiB + (size_t)(i + 1) * 64 * KiB;
    buf[i] = ALLOC(e->a, 0, size[i], NULL);
  }
  for (int k = 0; k < 4800 - 48; k++) {
    x = x * 1103515245u + 12345u;
    const int i = (int)((x >> 16) % 48);
    size[i] = size[i] + 640 * KiB > 24 * MiB ? 1 * MiB + 64 * KiB : size[i] + 640 * KiB;
    void *grown = ALLOC(e->a, 0, size[i], NULL);
    FREE(e->a, buf[i]);
    buf[i] = grown;
  }
  for (int i = 0; i < 48; i++)
    FREE(e->a, buf[i]);
  EQ(STATS(e->a, 0).allocated_bytes[CACHALOT_STAT_ALL].current, 0);
  return STATS(e->a, 0).reserved_bytes[CACHALOT_STAT_ALL].peak;
}

/* Without a plan, a program that frees everything and starts over (thousands of mallocs since it last
 * did) gets the free pages back at its next malloc, and its next pass is placed and compacted as on a
 * fresh allocator: the same reserved peak, not the pass before's free pages scattered through it. A loop
 * of a few mallocs with nothing else live (a benchmark) does not trade pages at every turn. */
static void restart_without_a_plan(void **state) {
  (void)state;
  int64_t fresh[4];
  for (uint32_t k = 0; k < 4; k++) {
    env f = ENV(1, 4 * GiB, PRESET);
    fresh[k] = growing_pass(&f, 1000 + k);
    step_ptrs none = {{0}, NULL};
    FINISH(&f, &none);
  }
  env e = ENV(1, 4 * GiB, PRESET);
  EQ(growing_pass(&e, 1000), fresh[0]);
  for (uint32_t k = 1; k < 4; k++) {
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current > (int64_t)(64 * MiB), 1); /* the free pages cached */
    void *one = ALLOC(e.a, 0, 10 * MiB, NULL);
    EQ(STATS(e.a, 0).reserved_bytes[CACHALOT_STAT_ALL].current, 10 * MiB); /* the rest went back */
    FREE(e.a, one);
    EQ(growing_pass(&e, 1000 + k), fresh[k]);
  }
  /* a loop with nothing else live: 1,500 mallocs of 4 or 6 MiB drawn at random (no period), freed at once;
   * no page mapped or unmapped once both sizes have been seen */
  FREE(e.a, ALLOC(e.a, 0, 6 * MiB, NULL));
  const int64_t calls = device_calls(e.a);
  uint32_t x = 7;
  for (int k = 0; k < 1500; k++) {
    x = x * 1103515245u + 12345u;
    FREE(e.a, ALLOC(e.a, 0, (x >> 16) % 2 ? 4 * MiB : 6 * MiB, NULL));
  }
  EQ(device_calls(e.a), calls);
  EQ(plan_of(e.a).periods_found, 0);
  step_ptrs p = {{0}, NULL};
  FINISH(&e, &p);
}

/* empty_cache with nothing live gives the stream's reservation back, and the plan's range with it: the
 * next malloc drops the plan (nothing may be placed by a range that is gone), and the steps that follow
 * find the period again and plan it anew. */
static void plan_after_empty_cache(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  FREE(e.a, p.carry);
  p.carry = NULL;
  EMPTY(e.a);
  EXPECT_POOLS(e.a, 0, PX0, PX0);
  EQ(e.a->devices[0].vranges == NULL, 1);
  for (int k = 0; k < 8; k++)
    step(&e, NULL, &p, 1, NULL);
  const cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.plans_dropped, 1);
  EQ(ps.plans_formed, 2);
  EQ(ps.missed, 0);
  EQ(ps.in_force, 1);
  EQ(ps.footprint, ACT_BYTES + CARRY);
  FINISH(&e, &p);
}

/* Injected map failures while the plan maps its range: one failure makes that malloc miss (the online
 * policy serves it, mapping what it needs) and the next step maps the rest; failing every k-th map of a
 * whole run makes some mallocs fail as out of memory, and still nothing is lost: after the run every byte
 * goes back and the device holds nothing. */
static void plan_map_failures(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  for (int k = 0; k < 4; k++)
    step(&e, NULL, &p, 1, NULL);
  EQ(plan_of(e.a).plans_formed, 1);
  EQ(plan_of(e.a).served, 0);
  OK(cachalot_sim_fail_device_allocs(e.b, 1));
  step(&e, NULL, &p, 1, NULL);
  cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.missed, 1);
  EQ(ps.served, 36);
  for (int k = 0; k < 4; k++)
    step(&e, NULL, &p, 1, NULL);
  ps = plan_of(e.a);
  EQ(ps.missed, 1);
  EQ(ps.in_force, 1);
  FINISH(&e, &p);

  int64_t served = 0, missed = 0, all_ooms = 0;
  for (int every = 2; every <= 9; every++) {
    env f = ENV(1, 4 * GiB, PRESET);
    void *live[ACTS + 1] = {0};
    int64_t ooms = 0;
    OK(cachalot_sim_fail_every(f.b, every));
    for (int k = 0; k < 12; k++) {
      for (int i = 0; i < ACTS; i++) {
        const cachalot_status rc = cachalot_malloc(f.a, 0, SIZES[i % 6], NULL, &live[i]);
        if (rc != CACHALOT_OK) {
          EQ(rc, CACHALOT_ERROR_OUT_OF_MEMORY);
          EQ(live[i] == NULL, 1);
          ooms++;
        }
        CHECK(f.a);
      }
      if (live[ACTS])
        FREE(f.a, live[ACTS]);
      if (cachalot_malloc(f.a, 0, CARRY, NULL, &live[ACTS]) != CACHALOT_OK)
        ooms++;
      CHECK(f.a);
      for (int i = ACTS - 1; i >= 0; i--)
        if (live[i])
          FREE(f.a, live[i]);
    }
    if (live[ACTS])
      FREE(f.a, live[ACTS]);
    OK(cachalot_sim_fail_every(f.b, 0));
    const cachalot_plan_stats q = plan_of(f.a);
    served += q.served;
    missed += q.missed;
    all_ooms += ooms;
    EQ(STATS(f.a, 0).num_ooms, ooms);
    EMPTY(f.a);
    EXPECT_POOLS(f.a, 0, PX0, PX0);
    EQ(USED(f.b, 0), 0);
    env_free(&f);
  }
  /* the campaign reaches all three: ranges served, ranges whose mapping failed, mallocs that failed */
  EQ(served > 0 && missed > 0 && all_ooms > 0, 1);
}

/* The key turned off and on again at run time (set_settings) while blocks numbered by the first tracker
 * are live: the new tracker does not count their frees, its bytes live stay exact (cachalot_check), and
 * it finds the period again. */
static void plan_key_off_and_on(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  void *kept = ALLOC(e.a, 0, 3 * MiB, NULL);
  OK(cachalot_set_settings(e.a, "expandable_plan:False"));
  EQ(plan_of(e.a).plans_formed, 0); /* the counters went with the plan */
  step(&e, NULL, &p, 1, NULL);
  OK(cachalot_set_settings(e.a, "expandable_plan:True"));
  for (int k = 0; k < 8; k++)
    step(&e, NULL, &p, 1, NULL);
  const cachalot_plan_stats ps = plan_of(e.a);
  EQ(ps.plans_formed, 1);
  EQ(ps.missed, 0);
  EQ(ps.in_force, 1);
  /* the new tracker has seen more events than the first had when it numbered `kept`: a number kept from
   * then would name one of the new tracker's events */
  EQ(e.a->devices[0].step->n > 73 + 6 * 74 + 1, 1); /* kept was the first tracker's event 518 */
  FREE(e.a, kept);
  FREE(e.a, p.carry);
  p.carry = NULL;
  EQ(e.a->devices[0].step->live, 0);
  FINISH(&e, &p);
}

/* cachalot_check covers the plan: a reservation that keeps a range the plan does not have, or a plan whose
 * range its reservation does not keep, is a broken invariant. */
static void check_covers_the_plan(void **state) {
  (void)state;
  env e = ENV(1, 4 * GiB, PRESET);
  step_ptrs p = {{0}, NULL};
  TO_FORCE(&e, &p);
  void *small = ALLOC(e.a, 0, 4 * KiB, NULL); /* the small kind's reservation, which keeps no range */
  cl_vrange *vr = NULL;
  for (cl_vrange *v = e.a->devices[0].vranges; v; v = v->next)
    if (v->plan_hi)
      vr = v;
  assert_non_null(vr);
  const uintptr_t hi = vr->plan_hi;
  vr->plan_hi -= 2 * MiB;
  STATUS(cachalot_check(e.a), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "1 reservations keep a range, the plan has 0");
  vr->plan_hi = hi;
  CHECK(e.a);
  cl_vrange *other = NULL;
  for (cl_vrange *v = e.a->devices[0].vranges; v; v = v->next)
    if (!v->plan_hi)
      other = v;
  assert_non_null(other); /* the small kind's */
  other->plan_lo = other->base;
  other->plan_hi = other->base + 2 * MiB;
  STATUS(cachalot_check(e.a), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "2 reservations keep a range, the plan has 1");
  other->plan_lo = other->plan_hi = 0;
  CHECK(e.a);
  FREE(e.a, small);
  FREE(e.a, p.carry);
  env_free(&e);
}

/* cachalot_plan_stats_get refuses what it cannot answer, with a message, and is all 0 without the key. */
static void plan_stats_misuse(void **state) {
  (void)state;
  env e = ENV(2, 1 * GiB, "");
  cachalot_plan_stats ps;
  STATUS(cachalot_plan_stats_get(e.a, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "cachalot_plan_stats_get: out is NULL");
  STATUS(cachalot_plan_stats_get(NULL, 0, &ps), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_plan_stats_get(e.a, 2, &ps), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_plan_stats_get(e.a, -1, &ps), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "cachalot_plan_stats_get");
  memset(&ps, 0xff, sizeof ps);
  OK(cachalot_plan_stats_get(e.a, 1, &ps));
  EQ(ps.periods_found + ps.plans_formed + ps.served + ps.period + ps.footprint + ps.in_force, 0);
  env_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(plan_formed_and_served),
      cmocka_unit_test(plan_deviation_recovers),
      cmocka_unit_test(plan_dropped_and_formed_again),
      cmocka_unit_test(plan_record_stream),
      cmocka_unit_test(plan_two_streams),
      cmocka_unit_test(plan_capture_in_the_middle),
      cmocka_unit_test(plan_miss_when_a_block_outlives_its_plan),
      cmocka_unit_test(plan_program_restarts),
      cmocka_unit_test(restart_without_a_plan),
      cmocka_unit_test(plan_after_empty_cache),
      cmocka_unit_test(plan_map_failures),
      cmocka_unit_test(plan_key_off_and_on),
      cmocka_unit_test(check_covers_the_plan),
      cmocka_unit_test(plan_stats_misuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
