/* The growing byte buffer of bytes.h. */
#include "bytes.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void as_bytes_put(as_bytes *b, const void *data, size_t n) {
  if (b->oom || n == 0)
    return;
  if (n > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : (size_t)1 << 16;
    while (n > cap - b->len) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    unsigned char *nb = realloc(b->buf, cap);
    if (nb == NULL) {
      b->oom = true;
      return;
    }
    b->buf = nb;
    b->cap = cap;
  }
  memcpy(b->buf + b->len, data, n);
  b->len += n;
}
