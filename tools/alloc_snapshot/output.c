/* alloc_snapshot: the output files of dump, replay -o, convert and folded (see cli.h). */
#include "cli.h"

#include <zlib.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../common/outfile.h"

/* gzwrite takes an unsigned count: the bytes go in pieces of at most 1 GiB. */
static bool write_gz(FILE *f, const unsigned char *bytes, size_t len, bool newline, int *err) {
  /* zlib writes to the descriptor itself, past the FILE, so tool_out_close still flushes (nothing),
   * syncs and renames the same file. */
  int fd = dup(fileno(f));
  gzFile gz = fd >= 0 ? gzdopen(fd, "wb") : NULL;
  if (gz == NULL) {
    *err = errno;
    if (fd >= 0)
      close(fd);
    return false;
  }
  bool ok = true;
  for (size_t off = 0; ok && off < len;) {
    unsigned n = len - off > (1u << 30) ? (1u << 30) : (unsigned)(len - off);
    ok = gzwrite(gz, bytes + off, n) == (int)n;
    off += n;
  }
  ok = ok && (!newline || gzputc(gz, '\n') == '\n');
  *err = errno;
  if (gzclose(gz) != Z_OK && ok) {
    ok = false;
    *err = errno;
  }
  return ok;
}

int as_write_file(const char *cmd, const char *path, const void *data, size_t len, bool newline) {
  const unsigned char *bytes = data;
  const char *name = tool_out_name(path);
  tool_out o;
  char why[256];
  if (tool_out_open(&o, path, why, sizeof why) != 0)
    return as_failure(cmd, "%s: cannot create the output: %s", name, why);
  size_t plen = strlen(path);
  int err = 0;
  bool ok;
  if (plen > 3 && strcmp(path + plen - 3, ".gz") == 0) {
    ok = write_gz(o.f, bytes, len, newline, &err);
  } else {
    ok = fwrite(bytes, 1, len, o.f) == len && (!newline || fputc('\n', o.f) != EOF);
    err = errno;
  }
  if (!ok) {
    tool_out_close(&o, false, why, sizeof why);
    return as_failure(cmd, "%s: cannot write the output: %s", name, strerror(err ? err : EIO));
  }
  if (tool_out_close(&o, true, why, sizeof why) != 0)
    return as_failure(cmd, "%s: cannot write the output: %s", name, why);
  return AS_EXIT_OK;
}

int as_write_output(const char *cmd, const char *path, const char *text, size_t len) {
  return as_write_file(cmd, path, text, len, true);
}
