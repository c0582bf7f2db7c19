/* A process to dump from: it makes an allocator on the simulated device (CACHALOT_SNAPSHOT_SOCKET comes
 * from the environment), allocates a little, prints "ready" and waits until its standard input closes. */
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
  while (getchar() != EOF)
    ;
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
  return 0;
}
