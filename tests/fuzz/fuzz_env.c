/* libFuzzer target: the paths of the snapshot environment variables (CACHALOT_SNAPSHOT_ON_OOM, _AT_EXIT,
 * _SOCKET), expanded as read_env does ("%p" -> pid) into a buffer of a size the input picks. The result
 * is a NUL-terminated path that fits, or empty when it does not: never a truncated path (which would then
 * be written to), never a write past the buffer (AddressSanitizer). CACHALOT_ALLOC_CONF, the other
 * variable, is fuzz_config's. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "process/export.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  const size_t cap = 1 + ((size_t)data[0] << 8 | data[1]) % 600;
  char *in = malloc(size - 1);
  char *out = malloc(cap);
  if (!in || !out)
    abort();
  memcpy(in, data + 2, size - 2);
  in[size - 2] = '\0';
  const bool ok = cl_export_expand_path(in, out, cap);
  const size_t n = strnlen(out, cap);
  if (n == cap || (ok && n == 0) || (!ok && n != 0)) {
    fprintf(stderr, "fuzz_env: expand_path gave %s with %zu bytes in a buffer of %zu\n", ok ? "true" : "false", n, cap);
    abort();
  }
  free(in);
  free(out);
  return 0;
}
