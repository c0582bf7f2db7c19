/* Snapshots without code changes (issue: snapshots), driven by environment variables read when an
 * allocator is created:
 *   CACHALOT_SNAPSHOT_ON_OOM=path   written when an allocation fails as out of memory
 *   CACHALOT_SNAPSHOT_AT_EXIT=path  written at process exit (atexit), for every live allocator
 *   CACHALOT_SNAPSHOT_SOCKET=path   one background thread answers on a UNIX socket (mode 0600, peers of
 *                                   another user refused): "snapshot [N]" or "stats [N] [DEVICE]" gets the
 *                                   JSON of allocator N (default 0, the oldest live one), "list" the count
 *   CACHALOT_RECORD_HISTORY=N[,stacks]  memory history of N entries per device from creation on (and C
 *                                   call stacks), so that those snapshots have a trace
 * In every path "%p" becomes the process id, "%r" the rank (RANK, else LOCAL_RANK, else nothing) and "%h"
 * the host name, so that the ranks of a distributed run on a shared file system write apart. Nothing runs
 * in a signal handler, and with none of the variables set no thread is started and no file is touched.
 *
 * Live allocators are kept in a registry guarded by `reg_lock`; a request is served with the lock held,
 * so cachalot_destroy (process.c: it leaves the registry first) never races with one.
 *
 * Hostile or slow clients: each connection is served on a thread of its own (at most MAX_CLIENTS at once;
 * one more waits for a slot, up to the time limit, then is answered "busy"), with a time limit on every read
 * and write, so an idle client, or one that never reads its answer, holds nobody else up. Paths: a regular file or nothing at a snapshot path is
 * replaced through a temporary file and a rename; anything else there (a symlink, a FIFO, a device) is
 * written through, never replaced; a socket path holding anything but a socket is left alone. */
#include "../allocator/internal.h"
#include "../common/json_writer.h"
#include "../stats/stats.h"
#include "export.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

enum { MAX_LIVE = 64, MAX_CLIENTS = 8, IO_TIMEOUT_MS = 2000, MAX_REQUEST = 128, MAX_DRAIN = 65536 };
enum { HISTORY_ENV_MAX = 100000000 }; /* entries per device: ~5 GB of ring at most */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static cachalot_allocator *live[MAX_LIVE];
static int n_live;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static char oom_path[512], exit_path[512], socket_path[108];
static pid_t env_pid; /* the process that read the environment: the exports are its, not a forked child's */
static dev_t sock_dev; /* the socket file this process serves, removed at exit only if still the same */
static ino_t sock_ino;

/* The rank of a distributed run for "%r": RANK, else LOCAL_RANK, when it is a plain number (a value that
 * could name another folder, "../x", is not used); else nothing. */
static void rank_piece(char *piece, size_t cap) {
  piece[0] = '\0';
  const char *names[] = {"RANK", "LOCAL_RANK"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    const size_t n = v ? strlen(v) : 0;
    if (n == 0 || n >= cap || strspn(v, "0123456789") != n)
      continue;
    memcpy(piece, v, n + 1);
    return;
  }
}

/* The host name for "%h", with any '/' made '_' so that it stays one path component. */
static void host_piece(char *piece, size_t cap) {
  if (gethostname(piece, cap) != 0)
    piece[0] = '\0';
  piece[cap - 1] = '\0';
  for (char *c = piece; *c; c++)
    if (*c == '/')
      *c = '_';
}

/* `in` with "%p" replaced by the pid, "%r" by the rank, "%h" by the host name. False, with out empty, if
 * it does not fit (cap > 0). */
bool cl_export_expand_path(const char *in, char *out, size_t cap) {
  size_t o = 0;
  for (const char *p = in; *p; p++) {
    char piece[256];
    if (p[0] == '%' && p[1] == 'p') {
      snprintf(piece, sizeof piece, "%ld", (long)getpid());
      p++;
    } else if (p[0] == '%' && p[1] == 'r') {
      rank_piece(piece, 24);
      p++;
    } else if (p[0] == '%' && p[1] == 'h') {
      host_piece(piece, sizeof piece);
      p++;
    } else if (p[0] == '%' && p[1] == '%') { /* a literal %, as in printf and core_pattern */
      piece[0] = '%';
      piece[1] = '\0';
      p++;
    } else {
      piece[0] = *p;
      piece[1] = '\0';
    }
    size_t n = strlen(piece);
    if (o + n + 1 > cap) {
      out[0] = '\0'; /* not a truncated path that would then be written to */
      return false;
    }
    memcpy(out + o, piece, n);
    o += n;
  }
  out[o] = '\0';
  return o > 0;
}

/* Writes all of [p, p + n) to fd, which may be non-blocking: a reader that stops reading (a FIFO, a
 * device) gets IO_TIMEOUT_MS without progress, then the write gives up (errno ETIMEDOUT); one that keeps
 * reading gets everything. A reader that goes away is EPIPE, not a SIGPIPE that would end the program:
 * the signal is blocked on this thread for the write, and one it raised is taken off before unblocking. */
static bool write_all(int fd, const char *p, size_t n) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigemptyset(&pending);
  const bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  struct timespec stalled, now;
  clock_gettime(CLOCK_MONOTONIC, &stalled);
  bool ok = true;
  while (n > 0) {
    const ssize_t k = write(fd, p, n);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      clock_gettime(CLOCK_MONOTONIC, &stalled); /* progress: the limit counts from here */
      continue;
    }
    if (k < 0 && errno == EINTR)
      continue;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long waited_ms = (now.tv_sec - stalled.tv_sec) * 1000 + (now.tv_nsec - stalled.tv_nsec) / 1000000;
    if (k < 0 && errno == EAGAIN && waited_ms < IO_TIMEOUT_MS) {
      struct pollfd w = {.fd = fd, .events = POLLOUT};
      (void)poll(&w, 1, 10);
      continue;
    }
    if (k >= 0 || errno == EAGAIN)
      errno = ETIMEDOUT;
    ok = false;
    break;
  }
  const int err = errno;
  if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
    const struct timespec zero = {0, 0};
    (void)sigtimedwait(&pipe_set, NULL, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  errno = err;
  return ok;
}

/* The snapshot text and a newline, as alloc_snapshot writes JSON, so the files round-trip byte for byte. */
static bool write_text(int fd, const char *text) { return write_all(fd, text, strlen(text)) && write_all(fd, "\n", 1); }

/* Writes `text` to `path`. A regular file (or nothing) there is replaced through a temporary file and a
 * rename, so a reader never sees half a file; anything else (a symlink, a FIFO, a device) is written
 * through, as a shell redirection would, instead of being replaced by a regular file. */
static bool write_file(const char *path, const char *text) {
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    /* written through, never waited for: a FIFO nobody reads fails to open (ENXIO) rather than block the
     * exit, and one that stops reading gets the time limit */
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666); /* a dangling link: its target */
    if (fd < 0)
      return false;
    const bool ok = write_text(fd, text);
    return (close(fd) == 0) && ok;
  }
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0)
    return false;
  bool ok = write_text(fd, text);
  ok = close(fd) == 0 && ok;
  if (ok)
    ok = rename(tmp, path) == 0;
  if (!ok)
    unlink(tmp);
  return ok;
}

static bool write_snapshot(cachalot_allocator *a, const char *path) {
  char *json = NULL;
  if (cl_snapshot_json(a, &json) != CACHALOT_OK) {
    cl_warn("could not take the snapshot for %s: %s", path, cl_error_message());
    return false;
  }
  const bool ok = write_file(path, json);
  if (!ok)
    cl_warn("could not write the snapshot to %s: %s", path, strerror(errno));
  free(json);
  return ok;
}

/* The OOM hook: writes the CACHALOT_SNAPSHOT_ON_OOM snapshot, keeping the OOM message. */
static void on_oom(cachalot_allocator *a) {
  char saved[1024]; /* the OOM message must survive the snapshot's own calls */
  snprintf(saved, sizeof saved, "%s", cl_error_message());
  write_snapshot(a, oom_path);
  (void)cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "%s", saved);
}

/* Says where each snapshot went, and that none was written when every allocator had been destroyed
 * before exit (a program that cleans up would otherwise get nothing, silently). The notes go out after
 * reg_lock is let go: a warning handler may call back into cachalot. */
static void at_exit(void) {
  /* A forked child inherits the handler but not the allocators (their calls fail there) nor the socket,
   * which the parent still serves; and a thread of the parent may have held reg_lock at the fork. */
  if (getpid() != env_pid)
    return;
  int written = 0, live_at_exit;
  pthread_mutex_lock(&reg_lock);
  live_at_exit = n_live;
  for (int i = 0; exit_path[0] && i < n_live; i++) { /* (registered for the socket alone too) */
    char path[600];
    if (i == 0)
      snprintf(path, sizeof path, "%s", exit_path);
    else
      snprintf(path, sizeof path, "%s.%d", exit_path, i);
    written += write_snapshot(live[i], path);
  }
  pthread_mutex_unlock(&reg_lock);
  if (exit_path[0] && live_at_exit == 0)
    cl_warn("CACHALOT_SNAPSHOT_AT_EXIT: no snapshot written to %s: no allocator was live at exit (the "
            "snapshot is of the allocators not yet destroyed)", exit_path);
  else if (written == 1 && live_at_exit == 1)
    cl_note("CACHALOT_SNAPSHOT_AT_EXIT: snapshot written to %s", exit_path);
  else if (written > 0)
    cl_note("CACHALOT_SNAPSHOT_AT_EXIT: %d of %d snapshots written: %s for the first live allocator, %s.N for "
            "the N-th after it", written, live_at_exit, exit_path, exit_path);
  struct stat st;
  if (socket_path[0] && lstat(socket_path, &st) == 0 && st.st_dev == sock_dev && st.st_ino == sock_ino)
    unlink(socket_path);
}

/* "record N [stacks] [ALLOCATOR]" or "record off [ALLOCATOR]" (args: what follows "record"): memory
 * history of N entries per device, cleared, with C stacks or without, or history and stacks off, on every
 * device of allocator ALLOCATOR (default 0), through the public calls a program would make. The reply
 * into *out: {"record":N,"stacks":BOOL} or {"error":"..."}. Called with reg_lock held. */
static void serve_record(char *args, char **out) {
  char *save = NULL, *tok[4] = {NULL};
  int n = 0;
  for (char *t = strtok_r(args, " \t\r\n", &save); t && n < 4; t = strtok_r(NULL, " \t\r\n", &save))
    tok[n++] = t; /* a fourth word is one too many: n = 4 fails the count below */
  const bool off = n >= 1 && !strcmp(tok[0], "off");
  const bool stacks = !off && n >= 2 && !strcmp(tok[1], "stacks");
  const int idx_at = 1 + stacks;
  char *end = NULL;
  unsigned long long entries = 0, idx = 0;
  bool ok = n >= 1 && n <= idx_at + 1;
  if (ok && !off) {
    errno = 0;
    entries = tok[0][0] >= '0' && tok[0][0] <= '9' ? strtoull(tok[0], &end, 10) : 0;
    ok = !errno && end && !*end && entries >= 1 && entries <= HISTORY_ENV_MAX;
  }
  if (ok && n == idx_at + 1) {
    errno = 0;
    end = NULL; /* a word that is not a number is not an allocator index ("record 10 stackz") */
    idx = tok[idx_at][0] >= '0' && tok[idx_at][0] <= '9' ? strtoull(tok[idx_at], &end, 10) : ULLONG_MAX;
    ok = !errno && end && !*end;
  }
  cl_json j;
  cl_json_init(&j);
  cl_json_begin_object(&j);
  cachalot_status rc = CACHALOT_OK;
  if (!ok) {
    cl_json_key(&j, "error");
    cl_json_string(&j, "record expects 'record N [stacks] [ALLOCATOR]' (N from 1 to 100000000) or 'record off "
                       "[ALLOCATOR]'");
  } else if (idx >= (unsigned long long)n_live) {
    char msg[96];
    snprintf(msg, sizeof msg, "record: no allocator %llu (%d live)", idx, n_live);
    cl_json_key(&j, "error");
    cl_json_string(&j, msg);
  } else {
    cachalot_allocator *a = live[idx];
    /* Off first, then stacks, then on: turning history on sizes the stack rows by the stacks setting,
     * and stacks turned on over the old ring would allocate rows for its size only to drop them. */
    rc = cl_record_history(a, false, 0);
    if (rc == CACHALOT_OK)
      rc = cl_record_history_stacks(a, stacks);
    if (rc == CACHALOT_OK && !off)
      rc = cl_record_history(a, true, (size_t)entries);
    if (rc != CACHALOT_OK) {
      cl_json_key(&j, "error");
      cl_json_string(&j, cl_error_message());
    } else {
      cl_json_key(&j, "record");
      cl_json_uint(&j, entries);
      cl_json_key(&j, "stacks");
      cl_json_bool(&j, stacks);
    }
  }
  cl_json_end_object(&j);
  *out = cl_json_finish(&j);
}

/* Reads and drops what the client has sent and not yet been read, up to MAX_DRAIN bytes, without waiting:
 * closing with unread input would reset the connection before the client reads the answer. */
static void drain(int fd) {
  char sink[512];
  for (size_t got = 0; got < MAX_DRAIN;) {
    const ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (r <= 0)
      return;
    got += (size_t)r;
  }
}

/* One request: a line of text in, JSON (or an error object) out. A line longer than MAX_REQUEST - 1 bytes
 * is read to its end (up to MAX_DRAIN, within the time limit) and answered with an error, as is a line
 * with a NUL byte in it or with bytes after it (one request per connection); nothing unread is left at
 * close, which would reset the connection before the client reads the answer. */
static void serve(int fd) {
  char req[MAX_REQUEST];
  size_t n = 0, extra = 0;
  bool line = false;
  while (!line && n < sizeof req - 1) {
    ssize_t r = read(fd, req + n, sizeof req - 1 - n);
    if (r <= 0)
      break;
    line = memchr(req + n, '\n', (size_t)r) != NULL;
    n += (size_t)r;
  }
  req[n] = '\0';
  while (!line && n == sizeof req - 1 && extra < MAX_DRAIN) {
    char sink[512];
    ssize_t r = read(fd, sink, sizeof sink);
    if (r <= 0)
      break;
    line = memchr(sink, '\n', (size_t)r) != NULL;
    extra += (size_t)r;
  }
  /* the line ends at its newline (and a carriage return before it) */
  char *nl = memchr(req, '\n', n);
  const size_t line_len = nl ? (size_t)(nl - req) : n, after = nl ? n - line_len - 1 : 0;
  const bool nul = memchr(req, '\0', line_len) != NULL;
  if (nl) {
    *nl = '\0';
    if (line_len > 0 && req[line_len - 1] == '\r')
      req[line_len - 1] = '\0';
  }
  drain(fd);
  char cmd[16] = "";
  int idx = 0, device = 0;
  int got = extra || nul || after ? 0 : sscanf(req, "%15s %d %d", cmd, &idx, &device);
  char *out = NULL;
  char small[200];
  pthread_mutex_lock(&reg_lock);
  if (extra) {
    snprintf(small, sizeof small, "{\"error\":\"request longer than %d bytes\"}", MAX_REQUEST - 1);
  } else if (nul) {
    snprintf(small, sizeof small, "{\"error\":\"a NUL byte in the request (at byte %zu)\"}",
             (size_t)((char *)memchr(req, '\0', line_len) - req));
  } else if (after) {
    snprintf(small, sizeof small, "{\"error\":\"one request per connection: %zu bytes after its line\"}", after);
  } else if (got >= 1 && !strcmp(cmd, "record")) {
    serve_record(strstr(req, "record") + strlen("record"), &out);
    if (!out)
      snprintf(small, sizeof small, "{\"error\":\"host out of memory\"}");
  } else if (got >= 1 && !strcmp(cmd, "list")) {
    snprintf(small, sizeof small, "{\"allocators\":%d,\"pid\":%ld}", n_live, (long)getpid());
  } else if (got >= 1 && (!strcmp(cmd, "snapshot") || !strcmp(cmd, "stats")) && idx >= 0 && idx < n_live) {
    cachalot_status rc = !strcmp(cmd, "snapshot") ? cl_snapshot_json(live[idx], &out)
                                                   : cl_memory_stats_json(live[idx], device, &out);
    if (rc != CACHALOT_OK)
      snprintf(small, sizeof small, "{\"error\":\"%s\"}", cl_status_name(rc));
  } else {
    snprintf(small, sizeof small,
             "{\"error\":\"unknown request; expected 'snapshot [N]', 'stats [N] [DEVICE]', 'record N [stacks] [N]', "
             "'record off [N]' or 'list' (%d allocators)\"}",
             n_live);
  }
  pthread_mutex_unlock(&reg_lock);
  const char *text = out ? out : small;
  size_t len = strlen(text), off = 0;
  while (off < len) {
    /* MSG_NOSIGNAL: a client that hangs up early must not kill the program with SIGPIPE */
    ssize_t w = send(fd, text + off, len - off, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  drain(fd); /* what came meanwhile */
  free(out);
}

void cl_export_serve(int fd) { serve(fd); }

static _Atomic int n_clients;

static void *client_thread(void *arg) {
  int fd = (int)(intptr_t)arg;
  serve(fd);
  close(fd);
  atomic_fetch_sub(&n_clients, 1);
  return NULL;
}

static void *socket_thread(void *arg) {
  int srv = (int)(intptr_t)arg;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (;;) {
    int fd = accept4(srv, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        if (errno != EINTR && errno != ECONNABORTED)
          usleep(10000); /* out of descriptors or memory: let the clients being served finish */
        continue;
      }
      pthread_attr_destroy(&attr);
      return NULL;
    }
    struct ucred cred;
    socklen_t len = sizeof cred;
    /* The socket file is 0600 already; the credential check also holds if someone loosened it. */
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
      close(fd);
      continue;
    }
    /* every read and write of this client gives up after the time limit */
    const struct timeval tv = {IO_TIMEOUT_MS / 1000, (IO_TIMEOUT_MS % 1000) * 1000};
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    /* all slots taken: wait for one (a slow client holds its slot for the time limit at most) */
    for (int waited = 0; atomic_load(&n_clients) >= MAX_CLIENTS && waited < IO_TIMEOUT_MS; waited++)
      usleep(1000);
    pthread_t t;
    if (atomic_fetch_add(&n_clients, 1) >= MAX_CLIENTS ||
        pthread_create(&t, &attr, client_thread, (void *)(intptr_t)fd) != 0) {
      atomic_fetch_sub(&n_clients, 1);
      static const char busy[] = "{\"error\":\"busy: too many clients at once, try again\"}";
      (void)send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
    }
  }
}

/* Whether a process serves the socket at path: a live one accepts (or its queue is full), a stale socket
 * file of a process that is gone refuses. */
static bool socket_alive(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  const size_t n = strlen(path);
  if (n >= sizeof addr.sun_path)
    return false;
  memcpy(addr.sun_path, path, n + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return false;
  /* only a refusal says nobody serves it: anything else (another user's socket: EACCES) is left alone */
  const bool alive = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 || errno != ECONNREFUSED;
  close(fd);
  return alive;
}

static void start_socket(const char *path) {
  int srv = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (srv < 0)
    return;
  /* bind to a private name, restrict it, then move it into place: the final path is never open to others */
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  char tmp[sizeof addr.sun_path];
  int n = snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof tmp) {
    close(srv);
    cl_warn("CACHALOT_SNAPSHOT_SOCKET: path too long: %s", path);
    return;
  }
  memcpy(addr.sun_path, tmp, (size_t)n + 1);
  /* Only a stale socket (of an earlier run) is replaced: a file the variable points at by mistake is not
   * deleted, and a socket another live process serves (two ranks given one path) stays its. */
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
    close(srv);
    cl_warn("CACHALOT_SNAPSHOT_SOCKET: %s exists and is not a socket: not replaced, no socket served", path);
    socket_path[0] = '\0';
    return;
  }
  struct stat stale_st;
  const bool stale = lstat(path, &stale_st) == 0 && !socket_alive(path);
  if (lstat(tmp, &st) == 0 && S_ISSOCK(st.st_mode))
    unlink(tmp);
  if (bind(srv, (struct sockaddr *)&addr, sizeof addr) != 0 || chmod(tmp, 0600) != 0 || listen(srv, 8) != 0) {
    cl_warn("CACHALOT_SNAPSHOT_SOCKET: cannot serve on %s: %s", path, strerror(errno));
    unlink(tmp);
    close(srv);
    socket_path[0] = '\0';
    return;
  }
  /* the stale file, if it is still the one found stale: not a live socket another process has put there
   * since (it may still win that race; then this one finds the path taken below and serves nothing) */
  if (stale && lstat(path, &st) == 0 && st.st_dev == stale_st.st_dev && st.st_ino == stale_st.st_ino)
    unlink(path);
  /* link, not rename: it fails where the path holds anything, so of two processes starting at once
   * only one gets it */
  const bool placed = link(tmp, path) == 0;
  const int err = errno;
  unlink(tmp);
  if (!placed || lstat(path, &st) != 0) {
    close(srv);
    if (err == EEXIST)
      cl_warn("CACHALOT_SNAPSHOT_SOCKET: %s is served by another live process: left alone, no socket served "
              "(give each process its own path, e.g. with %%p or %%r)", path);
    else
      cl_warn("CACHALOT_SNAPSHOT_SOCKET: cannot serve on %s: %s", path, strerror(err));
    socket_path[0] = '\0';
    return;
  }
  sock_dev = st.st_dev;
  sock_ino = st.st_ino;
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &attr, socket_thread, (void *)(intptr_t)srv) != 0) {
    close(srv);
    unlink(path);
    socket_path[0] = '\0';
  }
  pthread_attr_destroy(&attr);
}

/* reg_lock around a fork: a child that makes an allocator of its own must not wait on it for good (a thread
 * of the parent may hold it while it takes a snapshot for the socket). */
static void fork_lock(void) { pthread_mutex_lock(&reg_lock); }
static void fork_unlock(void) { pthread_mutex_unlock(&reg_lock); }

static void read_env(void) {
  env_pid = getpid();
  (void)pthread_atfork(fork_lock, fork_unlock, fork_unlock);
  const char *v;
  if ((v = getenv("CACHALOT_SNAPSHOT_ON_OOM")) && *v && !cl_export_expand_path(v, oom_path, sizeof oom_path))
    cl_warn("CACHALOT_SNAPSHOT_ON_OOM: path too long, ignored");
  if ((v = getenv("CACHALOT_SNAPSHOT_AT_EXIT")) && *v && !cl_export_expand_path(v, exit_path, sizeof exit_path))
    cl_warn("CACHALOT_SNAPSHOT_AT_EXIT: path too long, ignored");
  if ((v = getenv("CACHALOT_SNAPSHOT_SOCKET")) && *v && !cl_export_expand_path(v, socket_path, sizeof socket_path - 16))
    cl_warn("CACHALOT_SNAPSHOT_SOCKET: path too long, ignored");
  if (exit_path[0] || socket_path[0])
    atexit(at_exit);
  if (socket_path[0])
    start_socket(socket_path);
}

/* CACHALOT_RECORD_HISTORY=N, or N,stacks: history of N entries per device from creation on, with C call
 * stacks for the second form, so that an unmodified program's snapshots have a trace. A value that is
 * not one of those forms is ignored with a warning (creation does not fail for a debugging aid). */
void cl_export_history_from_env(cachalot_allocator *a) {
  const char *v = getenv("CACHALOT_RECORD_HISTORY");
  if (!v || !*v)
    return;
  char *end = NULL;
  errno = 0;
  const unsigned long long n = strtoull(v, &end, 10);
  const bool stacks = end && strcmp(end, ",stacks") == 0;
  if (v[0] < '0' || v[0] > '9' || errno || n == 0 || n > HISTORY_ENV_MAX || (!stacks && *end)) {
    cl_warn("CACHALOT_RECORD_HISTORY=%.64s is not N or N,stacks (N from 1 to %d entries): history stays off", v,
            HISTORY_ENV_MAX);
    return;
  }
  if (cl_record_history(a, true, (size_t)n) != CACHALOT_OK ||
      (stacks && cl_record_history_stacks(a, true) != CACHALOT_OK))
    cl_warn("CACHALOT_RECORD_HISTORY: %s", cl_error_message());
}

void cl_export_register(cachalot_allocator *a) {
  pthread_once(&env_once, read_env);
  if (!oom_path[0] && !exit_path[0] && !socket_path[0])
    return;
  if (oom_path[0])
    a->on_oom = on_oom;
  pthread_mutex_lock(&reg_lock);
  if (n_live < MAX_LIVE)
    live[n_live++] = a;
  pthread_mutex_unlock(&reg_lock);
}

void cl_export_unregister(cachalot_allocator *a) {
  pthread_mutex_lock(&reg_lock);
  for (int i = 0; i < n_live; i++) {
    if (live[i] == a) {
      memmove(&live[i], &live[i + 1], (size_t)(n_live - i - 1) * sizeof live[0]);
      n_live--;
      break;
    }
  }
  pthread_mutex_unlock(&reg_lock);
}
