/* Output files of the tools (see outfile.h). */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int reason(char *why, size_t why_len, int err) {
  snprintf(why, why_len, "%s", strerror(err ? err : EIO));
  return -1;
}

/* O_NOCTTY: a terminal given as the output must not become the controlling terminal. */
static int open_through(tool_out *o, const char *path, char *why, size_t why_len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666);
  if (fd < 0)
    return reason(why, why_len, errno);
  o->f = fdopen(fd, "w");
  if (o->f == NULL) {
    int e = errno;
    close(fd);
    return reason(why, why_len, e);
  }
  return 0;
}

const char *tool_out_name(const char *path) { return strcmp(path, "-") == 0 ? "standard output" : path; }

int tool_out_open(tool_out *o, const char *path, char *why, size_t why_len) {
  memset(o, 0, sizeof *o);
  if (strcmp(path, "-") == 0) {
    o->f = stdout;
    return 0;
  }
  struct stat st;
  bool replace = false; /* a regular file is there, whose mode the new one keeps */
  char *dest = NULL;
  if (lstat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      snprintf(why, why_len, "it is a directory");
      return -1;
    }
    if (S_ISLNK(st.st_mode)) {
      /* Only a link to a regular file is replaced atomically, at the file's own place; a dangling link
       * or a link to a device is written through. */
      char *target = realpath(path, NULL);
      struct stat tst;
      if (target != NULL && stat(target, &tst) == 0 && S_ISREG(tst.st_mode)) {
        dest = target;
        st = tst;
        replace = true;
      } else {
        free(target);
        return open_through(o, path, why, why_len);
      }
    } else if (S_ISREG(st.st_mode)) {
      replace = true;
    } else {
      return open_through(o, path, why, why_len);
    }
  } else if (errno != ENOENT) {
    return reason(why, why_len, errno);
  }
  if (dest == NULL && (dest = strdup(path)) == NULL)
    return reason(why, why_len, ENOMEM);
  size_t len = strlen(dest) + sizeof ".tmp.XXXXXX";
  char *tmp = malloc(len);
  if (tmp == NULL) {
    free(dest);
    return reason(why, why_len, ENOMEM);
  }
  snprintf(tmp, len, "%s.tmp.XXXXXX", dest);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int e = errno;
    free(tmp);
    /* A file one may write in a directory one may not: written in place, as it could be before. */
    if (replace && (e == EACCES || e == EPERM)) {
      int r = open_through(o, dest, why, why_len);
      free(dest);
      return r;
    }
    free(dest);
    return reason(why, why_len, e);
  }
  mode_t mode;
  if (replace) {
    mode = st.st_mode & 0777;
  } else {
    mode_t mask = umask(0);
    umask(mask);
    mode = 0666 & ~mask;
  }
  (void)fchmod(fd, mode); /* mkstemp's 0600 otherwise; a failure leaves a file only its owner reads */
  o->f = fdopen(fd, "w");
  if (o->f == NULL) {
    int e = errno;
    close(fd);
    unlink(tmp);
    free(tmp);
    free(dest);
    return reason(why, why_len, e);
  }
  o->tmp = tmp;
  o->dest = dest;
  return 0;
}

int tool_out_close(tool_out *o, bool keep, char *why, size_t why_len) {
  bool ok = keep;
  int e = 0;
  if (ok && (fflush(o->f) != 0 || ferror(o->f))) {
    ok = false;
    e = errno;
  }
  /* Data in the page cache only: a crash after the rename could leave an empty file in the old one's
   * place. Not for what is written through: fsync fails on a FIFO or a device. */
  if (ok && o->tmp != NULL && fsync(fileno(o->f)) != 0) {
    ok = false;
    e = errno;
  }
  /* stdout stays open: the tool's own messages and its final check of stdout come after. A failure
   * here is the caller's to report, so the final check must not report it again: the error flag goes
   * (the failed flush dropped what it could not write). */
  if (o->f == stdout) {
    if (!ok)
      clearerr(stdout);
  } else if (fclose(o->f) != 0 && ok) {
    ok = false;
    e = errno;
  }
  if (ok && o->tmp != NULL && rename(o->tmp, o->dest) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok && o->tmp != NULL)
    unlink(o->tmp);
  free(o->tmp);
  free(o->dest);
  memset(o, 0, sizeof *o);
  if (!ok && keep)
    return reason(why, why_len, e);
  if (why_len > 0)
    why[0] = '\0';
  return ok ? 0 : -1;
}
