/* libFuzzer target: a request to the snapshot socket (CACHALOT_SNAPSHOT_SOCKET), as a connected peer of
 * the right user would send it: any bytes, up to end of stream. The answer must be one JSON object (a
 * snapshot, stats, the list, or an error naming what is expected), never a crash. Two allocators with
 * memory handed out are registered once. */
#include <cachalot/cachalot.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "process/export.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static cachalot_backend *backend;
static cachalot_allocator *allocs[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  char path[64];
  snprintf(path, sizeof path, "/tmp/cachalot-fuzz-%ld.sock", (long)getpid());
  setenv("CACHALOT_SNAPSHOT_SOCKET", path, 1); /* registers the allocators for the socket */
  cachalot_sim_options o = {.device_count = 2, .capacity_bytes = (size_t)1 << 30, .complete_immediately = true};
  if (cachalot_backend_sim(&o, &backend) != CACHALOT_OK)
    abort();
  for (int i = 0; i < 2; i++) {
    void *p = NULL;
    if (cachalot_create(backend, i ? "expandable_segments:True" : "", &allocs[i]) != CACHALOT_OK ||
        cachalot_record_history(allocs[i], true, 100) != CACHALOT_OK ||
        cachalot_malloc(allocs[i], i, 3 << 20, NULL, &p) != CACHALOT_OK)
      abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
    return 0;
  size_t off = 0;
  while (off < size && off < 4096) { /* the socket buffer holds this much; the server reads 127 bytes */
    ssize_t w = write(fds[0], data + off, size - off < 4096 - off ? size - off : 4096 - off);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  shutdown(fds[0], SHUT_WR);
  cl_export_serve(fds[1]);
  close(fds[1]);
  char buf[256];
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  if (n <= 0 || buf[0] != '{') {
    fprintf(stderr, "fuzz_socket: the answer is not a JSON object (%zd bytes)\n", n);
    abort();
  }
  return 0;
}
