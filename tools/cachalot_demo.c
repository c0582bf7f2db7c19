/* cachalot_demo: the README's first command. Allocates, frees and prints memory stats, on the GPU when
 * there is one (--sim forces the simulated device), and shows caching at work: the second round of
 * allocations is served from cache without new device allocations. */
#include <cachalot/cachalot.h>

#include <stdio.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

static int fail(const char *what, cachalot_status s) {
  fprintf(stderr, "cachalot_demo: %s: %s: %s\n", what, cachalot_status_name(s), cachalot_last_error());
  return 1;
}

static void print_stats(const char *title, const cachalot_device_stats *st) {
  printf("\n%s\n", title);
  printf("  %-26s %14s %14s\n", "stat (all pools)", "current", "peak");
  printf("  %-26s %14lld %14lld\n", "allocation", (long long)st->allocation[0].current,
         (long long)st->allocation[0].peak);
  printf("  %-26s %14lld %14lld\n", "segment", (long long)st->segment[0].current, (long long)st->segment[0].peak);
  printf("  %-26s %12.2f M %12.2f M\n", "allocated_bytes", st->allocated_bytes[0].current / MIB,
         st->allocated_bytes[0].peak / MIB);
  printf("  %-26s %12.2f M %12.2f M\n", "reserved_bytes", st->reserved_bytes[0].current / MIB,
         st->reserved_bytes[0].peak / MIB);
  printf("  %-26s %12.2f M %12.2f M\n", "requested_bytes", st->requested_bytes[0].current / MIB,
         st->requested_bytes[0].peak / MIB);
  printf("  %-26s %12.2f M %12.2f M\n", "inactive_split_bytes", st->inactive_split_bytes[0].current / MIB,
         st->inactive_split_bytes[0].peak / MIB);
  printf("  device allocations %lld, device frees %lld, retries %lld, OOMs %lld\n",
         (long long)st->num_device_alloc, (long long)st->num_device_free, (long long)st->num_alloc_retries,
         (long long)st->num_ooms);
}

int main(int argc, char **argv) {
  int force_sim = argc > 1 && strcmp(argv[1], "--sim") == 0;
  if (argc > 1 && !force_sim) {
    fprintf(stderr, "usage: cachalot_demo [--sim]\n");
    return 2;
  }
  cachalot_backend *backend = NULL;
  cachalot_status s = force_sim ? CACHALOT_ERROR_NOT_SUPPORTED : cachalot_backend_cuda(&backend);
  if (s == CACHALOT_OK) {
    printf("cachalot_demo: using the CUDA backend (GPU 0)\n");
  } else {
    if (!force_sim)
      printf("cachalot_demo: no GPU (%s)\n", cachalot_last_error());
    cachalot_sim_options opt = {.device_count = 1, .capacity_bytes = (size_t)80 << 30, .complete_immediately = true};
    if ((s = cachalot_backend_sim(&opt, &backend)) != CACHALOT_OK)
      return fail("cachalot_backend_sim", s);
    printf("cachalot_demo: using the simulated device (1 device, 80 GiB)\n");
  }
  cachalot_allocator *a = NULL;
  if ((s = cachalot_create(backend, NULL, &a)) != CACHALOT_OK) {
    cachalot_backend_destroy(backend);
    return fail("cachalot_create", s);
  }

  static const size_t sizes[] = {1, 4096, 100000, 1 << 20, (1 << 20) + 1, 5u << 20, 12u << 20, 64u << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  int rc = 0;
  for (int round = 0; round < 2 && !rc; round++) {
    for (int i = 0; i < N; i++) {
      if ((s = cachalot_malloc(a, 0, sizes[i], NULL, &p[i])) != CACHALOT_OK) {
        rc = fail("cachalot_malloc", s);
        break;
      }
      if (round == 0)
        printf("  malloc(%9zu) -> %p\n", sizes[i], p[i]);
    }
    if (rc)
      break;
    cachalot_device_stats st;
    if ((s = cachalot_memory_stats(a, 0, &st)) != CACHALOT_OK)
      rc = fail("cachalot_memory_stats", s);
    else
      print_stats(round == 0 ? "after the first round of allocations" : "after the second round (served from cache)",
                  &st);
    for (int i = 0; i < N && !rc; i++)
      if ((s = cachalot_free(a, p[i])) != CACHALOT_OK)
        rc = fail("cachalot_free", s);
  }
  if (!rc && (s = cachalot_empty_cache(a)) != CACHALOT_OK)
    rc = fail("cachalot_empty_cache", s);
  cachalot_device_stats st;
  if (!rc && (s = cachalot_memory_stats(a, 0, &st)) == CACHALOT_OK)
    print_stats("after free and empty_cache", &st);
  if (!rc && (s = cachalot_check(a)) != CACHALOT_OK)
    rc = fail("cachalot_check", s);
  cachalot_destroy(a);
  cachalot_backend_destroy(backend);
  if (!rc)
    printf("\ncachalot_demo: OK\n");
  return rc;
}
