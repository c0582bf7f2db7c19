/* A client of an installed cachalot: built by install_test.sh with `pkg-config --cflags --libs cachalot`,
 * with `pkg-config --static` against libcachalot.a, and as a Meson project that takes cachalot as a
 * subproject. Checks a malloc/free round trip on the simulated device through the installed headers and
 * library. With the argument --leave-live the allocator is left alive at exit (holding its cached
 * segment), so that CACHALOT_SNAPSHOT_AT_EXIT has something to write. */
#include <cachalot/cachalot.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  const int leave_live = argc > 1 && strcmp(argv[1], "--leave-live") == 0;
  cachalot_backend *b = NULL;
  cachalot_allocator *a = NULL;
  void *p = NULL;
  cachalot_device_stats st;
  if (cachalot_backend_sim(NULL, &b) != CACHALOT_OK || cachalot_create(b, "", &a) != CACHALOT_OK ||
      cachalot_malloc(a, 0, 1000, NULL, &p) != CACHALOT_OK || cachalot_memory_stats(a, 0, &st) != CACHALOT_OK) {
    fprintf(stderr, "client: %s\n", cachalot_last_error());
    return 1;
  }
  /* 1000 bytes round up to 1024 (a multiple of 512), served from a 2 MiB small-pool segment
   * (docs/behaviour.md, Sizes) */
  const int ok = p != NULL && st.allocated_bytes[0].current == 1024 && st.reserved_bytes[0].current == 2 << 20;
  if (cachalot_free(a, p) != CACHALOT_OK || cachalot_check(a) != CACHALOT_OK) {
    fprintf(stderr, "client: %s\n", cachalot_last_error());
    return 1;
  }
  if (!leave_live) {
    cachalot_destroy(a);
    cachalot_backend_destroy(b);
  }
  printf("client: %s\n", ok ? "ok" : "wrong stats");
  return ok ? 0 : 1;
}
