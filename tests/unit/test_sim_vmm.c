/* The simulated backend's virtual memory (the ops behind expandable segments): reservations cost no
 * memory, mappings count against the device's capacity like allocations, and every misuse is refused
 * with the device's memory unchanged. */
#include "helpers.h"

#include "allocator/backend/ops.h"

#define PAGE ((size_t)2 << 20)

static cachalot_backend *sim_new(size_t capacity) {
  cachalot_sim_options o = {.device_count = 2, .capacity_bytes = capacity, .complete_immediately = true};
  cachalot_backend *b = NULL;
  OK(cachalot_backend_sim(&o, &b));
  return b;
}

static void reserve_map_unmap_release(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(64 * PAGE);
  const cl_backend_ops *ops = b->ops;
  size_t g = 0;
  OK(ops->va_granularity(b, 0, &g));
  EQ(g, PAGE);
  void *before = NULL, *base = NULL, *after = NULL;
  OK(ops->alloc(b, 0, 4096, &before));
  OK(ops->va_reserve(b, 0, 1024 * PAGE, &base)); /* far more than the device holds: address space only */
  EQ(USED(b, 0), 4096);
  EQ((uintptr_t)base % PAGE, 0);
  assert_true((char *)base >= (char *)before + 4096);
  OK(ops->alloc(b, 0, 4096, &after)); /* allocations never land in a reservation */
  assert_true((char *)after >= (char *)base + 1024 * PAGE);

  OK(ops->va_map(b, 0, base, PAGE));
  OK(ops->va_map(b, 0, (char *)base + 3 * PAGE, 10 * PAGE));
  EQ(USED(b, 0), 8192 + 11 * PAGE);
  size_t free_b = 0, total = 0;
  OK(ops->mem_info(b, 0, &free_b, &total));
  EQ(free_b, 64 * PAGE - 11 * PAGE - 8192);

  OK(ops->va_unmap(b, 0, base, PAGE));
  EQ(USED(b, 0), 8192 + 10 * PAGE);
  OK(ops->va_map(b, 0, base, PAGE)); /* a page can be mapped again */
  OK(ops->va_unmap(b, 0, base, PAGE));
  OK(ops->va_unmap(b, 0, (char *)base + 3 * PAGE, 10 * PAGE));
  EQ(USED(b, 0), 8192);
  OK(ops->va_release(b, 0, base, 1024 * PAGE));
  OK(ops->free(b, 0, before));
  OK(ops->free(b, 0, after));
  EQ(USED(b, 0), 0);
  cachalot_backend_destroy(b);
}

static void misuse_is_refused(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(64 * PAGE);
  const cl_backend_ops *ops = b->ops;
  void *base = NULL, *other = NULL;
  STATUS(ops->va_reserve(b, 0, PAGE + 512, &base), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(base);
  STATUS(ops->va_reserve(b, 0, 0, &base), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(ops->va_reserve(b, 0, PAGE, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  OK(ops->va_reserve(b, 0, 8 * PAGE, &base));
  OK(ops->va_reserve(b, 1, 8 * PAGE, &other));
  char *p = base;
  STATUS(ops->va_map(b, 0, p + 512, PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);     /* misaligned */
  STATUS(ops->va_map(b, 0, p, PAGE + 512), CACHALOT_ERROR_INVALID_ARGUMENT);     /* not whole pages */
  STATUS(ops->va_map(b, 0, p + 7 * PAGE, 2 * PAGE), CACHALOT_ERROR_INVALID_ARGUMENT); /* past the end */
  STATUS(ops->va_map(b, 1, p, PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);           /* device 0's reservation */
  STATUS(ops->va_map(b, 0, other, PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);       /* device 1's */
  OK(ops->va_map(b, 0, p + PAGE, 2 * PAGE));
  STATUS(ops->va_map(b, 0, p + 2 * PAGE, PAGE), CACHALOT_ERROR_INVALID_STATE);   /* overlaps */
  STATUS(ops->va_map(b, 0, p, 2 * PAGE), CACHALOT_ERROR_INVALID_STATE);
  STATUS(ops->va_unmap(b, 0, p + PAGE, PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);  /* part of a mapping */
  STATUS(ops->va_unmap(b, 0, p + 2 * PAGE, PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(ops->va_unmap(b, 1, p + PAGE, 2 * PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(ops->va_release(b, 0, base, 8 * PAGE), CACHALOT_ERROR_INVALID_STATE);   /* still mapped */
  STATUS(ops->va_release(b, 0, base, 4 * PAGE), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(USED(b, 0), 2 * PAGE);
  EQ(USED(b, 1), 0);
  OK(ops->va_unmap(b, 0, p + PAGE, 2 * PAGE));
  OK(ops->va_release(b, 0, base, 8 * PAGE));
  STATUS(ops->va_release(b, 0, base, 8 * PAGE), CACHALOT_ERROR_INVALID_ARGUMENT); /* twice */
  OK(ops->va_release(b, 1, other, 8 * PAGE));
  cachalot_backend_destroy(b);
}

/* A map the device cannot hold, or an injected failure, is out of memory and maps nothing; maps count
 * as device allocations for fail_every. */
static void out_of_memory_and_faults(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(8 * PAGE);
  const cl_backend_ops *ops = b->ops;
  void *base = NULL;
  OK(ops->va_reserve(b, 0, 16 * PAGE, &base));
  char *p = base;
  OK(ops->va_map(b, 0, p, 6 * PAGE));
  STATUS(ops->va_map(b, 0, p + 6 * PAGE, 4 * PAGE), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "out of memory");
  EQ(USED(b, 0), 6 * PAGE);
  OK(ops->va_map(b, 0, p + 6 * PAGE, 2 * PAGE)); /* what fits still does */
  OK(ops->va_unmap(b, 0, p + 6 * PAGE, 2 * PAGE));
  OK(cachalot_sim_fail_device_allocs(b, 1));
  STATUS(ops->va_map(b, 0, p + 6 * PAGE, PAGE), CACHALOT_ERROR_OUT_OF_MEMORY);
  CONTAINS(cachalot_last_error(), "injected");
  OK(ops->va_map(b, 0, p + 6 * PAGE, PAGE)); /* the injection was one-shot */
  OK(cachalot_sim_fail_every(b, 2));
  void *q = NULL;
  OK(ops->alloc(b, 0, 512, &q));                                               /* 1st */
  STATUS(ops->va_map(b, 0, p + 7 * PAGE, PAGE), CACHALOT_ERROR_OUT_OF_MEMORY); /* 2nd: injected */
  OK(cachalot_sim_fail_every(b, 0));
  EQ(USED(b, 0), 7 * PAGE + 512);
  OK(ops->free(b, 0, q));
  OK(ops->va_unmap(b, 0, p + 6 * PAGE, PAGE));
  OK(ops->va_unmap(b, 0, p, 6 * PAGE));
  OK(ops->va_release(b, 0, base, 16 * PAGE));
  EQ(USED(b, 0), 0);
  cachalot_backend_destroy(b); /* also frees what a test leaves behind */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reserve_map_unmap_release),
      cmocka_unit_test(misuse_is_refused),
      cmocka_unit_test(out_of_memory_and_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
