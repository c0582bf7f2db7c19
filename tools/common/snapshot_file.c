/* A snapshot file's bytes: read whole (standard input too), inflated when gzip'ed (every member of a
 * concatenation), and bounded by AS_MAX_INPUT_BYTES once decompressed, so a gzip bomb or /dev/zero is
 * refused rather than eating the host's memory. */
#include "snapshot_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Reads all of fd into a malloc'ed buffer; more than AS_MAX_INPUT_BYTES is refused. */
static int read_fd(int fd, const char *name, char **data, size_t *len, char err[AS_ERR_LEN]) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  if (buf == NULL) {
    snprintf(err, AS_ERR_LEN, "%s: out of host memory", name);
    return -1;
  }
  for (;;) {
    if (n == cap) {
      if (cap >= AS_MAX_INPUT_BYTES) {
        snprintf(err, AS_ERR_LEN, "%s: larger than %zu MiB: refused", name, AS_MAX_INPUT_BYTES >> 20);
        break;
      }
      size_t ncap = cap * 2 > AS_MAX_INPUT_BYTES ? AS_MAX_INPUT_BYTES : cap * 2;
      char *grown = realloc(buf, ncap);
      if (grown == NULL) {
        snprintf(err, AS_ERR_LEN, "%s: out of host memory after %zu bytes", name, n);
        break;
      }
      buf = grown;
      cap = ncap;
    }
    ssize_t got = read(fd, buf + n, cap - n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      snprintf(err, AS_ERR_LEN, "%s: cannot read: %s", name, strerror(errno));
      break;
    }
    if (got == 0) {
      *data = buf;
      *len = n;
      return 0;
    }
    n += (size_t)got;
  }
  free(buf);
  return -1;
}

static bool gzip_magic(const unsigned char *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

/* Inflates every gzip member of in[0..in_len). gzread stopped at the first member's end when what
 * followed was not gzip, and the rest of the file was silently dropped: here it is an error. */
static int gunzip(const char *name, const unsigned char *in, size_t in_len, char **data, size_t *len,
                  char err[AS_ERR_LEN]) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    snprintf(err, AS_ERR_LEN, "%s: cannot read: out of host memory", name);
    return -1;
  }
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)in_len; /* at most AS_MAX_INPUT_BYTES */
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  int rc = -1;
  if (buf == NULL) {
    snprintf(err, AS_ERR_LEN, "%s: out of host memory", name);
    goto done;
  }
  /* the most it may inflate to: AS_GZIP_MAX_RATIO times its size, at least AS_GZIP_MIN_BYTES */
  size_t limit = in_len > AS_MAX_INPUT_BYTES / AS_GZIP_MAX_RATIO ? AS_MAX_INPUT_BYTES : in_len * AS_GZIP_MAX_RATIO;
  if (limit < AS_GZIP_MIN_BYTES)
    limit = AS_GZIP_MIN_BYTES;
  for (;;) {
    if (n == cap) {
      if (cap >= limit) {
        if (limit == AS_MAX_INPUT_BYTES)
          snprintf(err, AS_ERR_LEN, "%s: larger than %zu MiB once decompressed: refused", name,
                   AS_MAX_INPUT_BYTES >> 20);
        else
          snprintf(err, AS_ERR_LEN,
                   "%s: inflates to more than %zu MiB, over %zu times its %zu bytes (a gzip bomb?): refused; "
                   "the reader takes at most %zu times a file's size (at least %zu MiB)",
                   name, limit >> 20, AS_GZIP_MAX_RATIO, in_len, AS_GZIP_MAX_RATIO, AS_GZIP_MIN_BYTES >> 20);
        goto done;
      }
      size_t ncap = cap * 2 > limit ? limit : cap * 2;
      char *grown = realloc(buf, ncap);
      if (grown == NULL) {
        snprintf(err, AS_ERR_LEN, "%s: out of host memory after %zu bytes", name, n);
        goto done;
      }
      buf = grown;
      cap = ncap;
    }
    z.next_out = (Bytef *)buf + n;
    z.avail_out = (uInt)(cap - n);
    int r = inflate(&z, Z_NO_FLUSH);
    n = cap - z.avail_out;
    if (r == Z_STREAM_END) {
      if (z.avail_in == 0)
        break;
      if (!gzip_magic(z.next_in, z.avail_in)) {
        snprintf(err, AS_ERR_LEN, "%s: %u bytes after the end of the gzip data (from byte %zu): not a snapshot",
                 name, z.avail_in, in_len - z.avail_in);
        goto done;
      }
      inflateReset(&z); /* the next member of a concatenation (`cat a.gz b.gz`) */
    } else if (r == Z_BUF_ERROR && z.avail_out > 0) {
      snprintf(err, AS_ERR_LEN, "%s: corrupt or truncated gzip data: unexpected end of file", name);
      goto done;
    } else if (r != Z_OK && r != Z_BUF_ERROR) {
      snprintf(err, AS_ERR_LEN, "%s: corrupt gzip data: %s", name,
               r == Z_MEM_ERROR ? "out of host memory" : z.msg != NULL ? z.msg : "invalid data");
      goto done;
    }
  }
  *data = buf;
  *len = n;
  buf = NULL;
  rc = 0;
done:
  free(buf);
  inflateEnd(&z);
  return rc;
}

/* Reads the whole file, decompressed when it starts with gzip's magic bytes, into a malloc'ed buffer. */
static int read_all(const char *path, const char *name, char **data, size_t *len, char err[AS_ERR_LEN]) {
  *data = NULL;
  *len = 0;
  int fd = strcmp(path, "-") == 0 ? dup(STDIN_FILENO) : open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, AS_ERR_LEN, "%s: cannot open: %s", name, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(err, AS_ERR_LEN, "%s: is a directory, not a snapshot file", name);
    close(fd);
    return -1;
  }
  char *raw = NULL;
  size_t raw_len = 0;
  int rc = read_fd(fd, name, &raw, &raw_len, err);
  close(fd);
  if (rc != 0 || !gzip_magic((const unsigned char *)raw, raw_len)) {
    *data = raw;
    *len = raw_len;
    return rc;
  }
  rc = gunzip(name, (const unsigned char *)raw, raw_len, data, len, err);
  free(raw);
  return rc;
}

int as_snapshot_load(const char *path, as_snapshot *out, char err[AS_ERR_LEN]) {
  memset(out, 0, sizeof *out);
  char *data = NULL;
  size_t len = 0;
  const char *name = strcmp(path, "-") == 0 ? "<stdin>" : path;
  if (read_all(path, name, &data, &len, err) != 0)
    return -1;
  int r = as_snapshot_parse(name, data, len, out, err);
  free(data);
  return r;
}
