/* A growing byte buffer for the tools' writers (the pickle writer, convert's JSON): a failed allocation
 * makes it inert (oom set, later puts ignored), so a writer checks once at the end. */
#ifndef TOOLS_COMMON_BYTES_H
#define TOOLS_COMMON_BYTES_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  unsigned char *buf; /* len bytes written, cap allocated; free() it */
  size_t len, cap;
  bool oom;
} as_bytes;

void as_bytes_put(as_bytes *b, const void *data, size_t n);

#endif
