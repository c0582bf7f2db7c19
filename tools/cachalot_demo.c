/* cachalot_demo: the README's first command. Allocates, frees and prints memory stats, on the GPU when
 * there is one (--sim forces the simulated device), and shows caching at work: the second round of
 * allocations is served from cache without new device allocations.
 *
 * It is also the program of the debugging quick start (docs/tools.md). The library writes the
 * CACHALOT_SNAPSHOT_AT_EXIT snapshot at exit for each allocator still live then (and says where), so with
 * that variable set the demo keeps its allocator and ends holding three allocations made by functions of
 * their own: the snapshot's frames tell who holds what. */
#include <cachalot/cachalot.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

static const char usage[] =
    "usage: cachalot_demo [--sim]\n"
    "       cachalot_demo --help | --version\n"
    "\n"
    "Allocates, frees and prints memory stats on GPU 0, or on the simulated device (--sim, or when no\n"
    "GPU answers); the second round of allocations is served from cache.\n"
    "\n"
    "With CACHALOT_SNAPSHOT_AT_EXIT=PATH set it ends holding three allocations, made by load_weights,\n"
    "grow_kv_cache and make_scratch, and the library writes the snapshot to PATH at exit;\n"
    "CACHALOT_RECORD_HISTORY=100000,stacks adds the trace and the C stacks (docs/snapshots.md):\n"
    "  CACHALOT_RECORD_HISTORY=100000,stacks CACHALOT_SNAPSHOT_AT_EXIT=demo.json cachalot_demo\n"
    "  alloc_snapshot plot demo.json -o demo.html\n"
    "\n"
    "Exit status: 0 success, 1 an allocator call failed, 2 usage error.\n";

static int fail(const char *what, cachalot_status s) {
  fprintf(stderr, "cachalot_demo: %s: %s: %s\n", what, cachalot_status_name(s), cachalot_last_error());
  return 1;
}

static void print_bytes(const char *name, const cachalot_stat *st) {
  printf("  %-26s %12.2f MiB %12.2f MiB\n", name, st->current / MIB, st->peak / MIB);
}

static void print_stats(const char *title, const cachalot_device_stats *st) {
  printf("\n%s\n", title);
  printf("  %-26s %16s %16s\n", "stat (all pools)", "current", "peak");
  printf("  %-26s %16lld %16lld\n", "allocation", (long long)st->allocation[0].current,
         (long long)st->allocation[0].peak);
  printf("  %-26s %16lld %16lld\n", "segment", (long long)st->segment[0].current, (long long)st->segment[0].peak);
  print_bytes("allocated_bytes", &st->allocated_bytes[0]);
  print_bytes("reserved_bytes", &st->reserved_bytes[0]);
  print_bytes("requested_bytes", &st->requested_bytes[0]);
  print_bytes("inactive_split_bytes", &st->inactive_split_bytes[0]);
  printf("  device allocations %lld, device frees %lld, retries %lld, OOMs %lld\n",
         (long long)st->num_device_alloc, (long long)st->num_device_free, (long long)st->num_alloc_retries,
         (long long)st->num_ooms);
}

#if defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE __attribute__((noinline, noclone)) /* no "load_weights.constprop.0" in the frames */
#endif

/* The allocations held for the snapshot, each from a function of its own, kept out of line so that
 * each has a frame. Each hands its pointer on after the call, from a local whose address the call
 * takes, so that the call is no tail call (whose frame would be gone). They return cachalot_malloc's
 * status so that a failure is reported as what it was. Together they exceed the rounds' peak, so the
 * trace's peak is theirs. */
static NOINLINE cachalot_status load_weights(cachalot_allocator *a, void **out) {
  void *p = NULL;
  const cachalot_status s = cachalot_malloc(a, 0, (size_t)64 << 20, NULL, &p);
  *out = p;
  return s;
}

static NOINLINE cachalot_status grow_kv_cache(cachalot_allocator *a, void **out) {
  void *p = NULL;
  const cachalot_status s = cachalot_malloc(a, 0, (size_t)24 << 20, NULL, &p);
  *out = p;
  return s;
}

static NOINLINE cachalot_status make_scratch(cachalot_allocator *a, void **out) {
  void *p = NULL;
  const cachalot_status s = cachalot_malloc(a, 0, (size_t)512 << 10, NULL, &p);
  *out = p;
  return s;
}

/* Allocates what the demo holds at exit and says so; 0, or 1 after a message. Out of line too, so that
 * the frames read main -> hold_for_snapshot -> load_weights. */
static NOINLINE int hold_for_snapshot(cachalot_allocator *a) {
  static const struct {
    cachalot_status (*make)(cachalot_allocator *, void **);
    const char *name;
    size_t bytes;
  } held[] = {{load_weights, "load_weights", (size_t)64 << 20},
              {grow_kv_cache, "grow_kv_cache", (size_t)24 << 20},
              {make_scratch, "make_scratch", (size_t)512 << 10}};
  printf("\ncachalot_demo: holding for the snapshot at exit:");
  for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) {
    void *p;
    const cachalot_status s = held[i].make(a, &p);
    if (s != CACHALOT_OK)
      return fail(held[i].name, s);
    printf("%s %s %.2f MiB", i ? "," : "", held[i].name, held[i].bytes / MIB);
  }
  printf("\n");
  return 0;
}

/* -1 to run (with *force_sim set), else the exit status (--help, --version, a usage error). */
static int parse_args(int argc, char **argv, int *force_sim) {
  *force_sim = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--sim") == 0) {
      *force_sim = 1;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage, stdout);
      return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("cachalot_demo %s\n", cachalot_version());
      return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
    } else {
      fprintf(stderr, "cachalot_demo: unknown argument '%s'\n%s", argv[i], usage);
      return 2;
    }
  }
  return -1;
}

/* The same sizes twice, freeing between: the second round's stats show no new device allocations, which
 * is what caching buys. empty_cache then returns the segments to the device, and cachalot_check comes
 * last so that a broken invariant fails the demo instead of passing unseen. */
static int run_rounds(cachalot_allocator *a) {
  static const size_t sizes[] = {1, 4096, 100000, 1 << 20, (1 << 20) + 1, 5u << 20, 12u << 20, 64u << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  cachalot_status s;
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < N; i++) {
      if ((s = cachalot_malloc(a, 0, sizes[i], NULL, &p[i])) != CACHALOT_OK)
        return fail("cachalot_malloc", s);
      if (round == 0)
        printf("  malloc(%9zu) -> %p\n", sizes[i], p[i]);
    }
    cachalot_device_stats st;
    if ((s = cachalot_memory_stats(a, 0, &st)) != CACHALOT_OK)
      return fail("cachalot_memory_stats", s);
    print_stats(round == 0 ? "after the first round of allocations" : "after the second round (served from cache)",
                &st);
    for (int i = 0; i < N; i++)
      if ((s = cachalot_free(a, p[i])) != CACHALOT_OK)
        return fail("cachalot_free", s);
  }
  if ((s = cachalot_empty_cache(a)) != CACHALOT_OK)
    return fail("cachalot_empty_cache", s);
  cachalot_device_stats st;
  if ((s = cachalot_memory_stats(a, 0, &st)) != CACHALOT_OK)
    return fail("cachalot_memory_stats", s);
  print_stats("after free and empty_cache", &st);
  if ((s = cachalot_check(a)) != CACHALOT_OK)
    return fail("cachalot_check", s);
  return 0;
}

int main(int argc, char **argv) {
  int force_sim;
  int rc = parse_args(argc, argv, &force_sim);
  if (rc >= 0)
    return rc;
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
  rc = run_rounds(a);
  const char *exit_snapshot = getenv("CACHALOT_SNAPSHOT_AT_EXIT");
  if (exit_snapshot != NULL && exit_snapshot[0] != '\0') {
    /* The allocator and the backend stay for the library's exit snapshot, after a failure too. */
    if (!rc)
      rc = hold_for_snapshot(a);
  } else {
    cachalot_destroy(a);
    cachalot_backend_destroy(backend);
  }
  if (!rc)
    printf("\ncachalot_demo: OK\n");
  return rc;
}
