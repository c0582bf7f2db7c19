/* A process to dump from: it makes an allocator on the simulated device (CACHALOT_SNAPSHOT_SOCKET comes
 * from the environment), allocates a little, prints "ready" and then serves its standard input until it
 * closes: each line "alloc SIZE" allocates SIZE bytes more and prints "allocated K" (K allocations made on
 * request so far), so that a test can act between dumps. */
#include <cachalot/cachalot.h>

#include <stdio.h>

int main(void) {
  cachalot_backend *b;
  cachalot_allocator *a;
  void *p, *q;
  if (cachalot_backend_sim(NULL, &b) || cachalot_create(b, "", &a) || cachalot_record_history(a, true, 100) ||
      cachalot_malloc(a, 0, 1000, NULL, &p) || cachalot_malloc(a, 0, 3 << 20, NULL, &q)) {
    fprintf(stderr, "live_process: %s\n", cachalot_last_error());
    return 1;
  }
  puts("ready");
  fflush(stdout);
  char line[64];
  int made = 0;
  while (fgets(line, sizeof line, stdin)) {
    unsigned long size = 0;
    void *r; /* kept until the end: the allocator's destroy gives everything back */
    if (sscanf(line, "alloc %lu", &size) == 1) {
      if (cachalot_malloc(a, 0, size, NULL, &r)) {
        fprintf(stderr, "live_process: %s\n", cachalot_last_error());
        return 1;
      }
      printf("allocated %d\n", ++made);
      fflush(stdout);
    }
  }
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
  return 0;
}
