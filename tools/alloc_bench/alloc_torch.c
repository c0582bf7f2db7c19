/* alloc_bench: PyTorch's allocators ("PyTorch"): its CUDA caching allocator (the device workloads but mt
 * and graph) and its caching host allocator (the host workload).
 *
 * PyTorch's allocators are C++ inside the torch Python package, so the row runs in a child process:
 * `python3 torch_host.py serve` (tools/alloc_bench/torch_host.py, found at the path built in), which loads
 * torch and the loops of cachalot's PyTorch backend library (src/torch/bench.cpp): one calls the allocator
 * that pin_memory=True uses, one PyTorch's CUDA caching allocator. It answers one line per command over a
 * socket pair on its standard input and output:
 *
 *   (at start)                   -> "ready TORCH_VERSION" | "error MESSAGE"
 *   "ops N" + N lines "SIZE SLOT" -> "loaded"             | "error MESSAGE"   (SIZE 0 frees SLOT)
 *   "pass"                        -> "ok NS"              | "error DONE MESSAGE"
 *   "stats"                       -> "stats RESERVED_PEAK ALLOCATED_PEAK PINNINGS"   (-1: unknown)
 *   "check"                       -> "ok"                 | "error MESSAGE"
 * and for the device workloads, the same with a d (the sequence's ops carry their stream and record, the
 * stats are torch.cuda.memory_stats()'s, the check empties the cache and finds nothing reserved):
 *   "dops N STREAMS" + N lines "SIZE SLOT STREAM RECORD" -> "loaded" | "error MESSAGE"
 *   "dpass", "dstats", "dcheck"
 *   "history off|plain|stacks"    -> "ok"                 | "error MESSAGE"
 *
 * NS is the time of the loop alone, taken in the child; the child's stderr is ours. One child per row,
 * so each row starts from a fresh allocator, as the others do. The probe (`torch_host.py probe`) builds
 * the extension once (torch caches it), so that a machine where it cannot be built skips the row. */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ALLOC_BENCH_TORCH_DRIVER
#define ALLOC_BENCH_TORCH_DRIVER ""
#endif

extern char **environ;

typedef struct {
  ab_alloc base;
  pid_t pid;
  int fd;   /* our end of the socket pair: commands go out through it */
  FILE *in; /* the same end, for reading the replies line by line */
  const ab_op *loaded; /* the sequence the child holds (NULL: none yet) */
  size_t loaded_n;
  bool device; /* the row is a device workload's (the d commands) */
} pt_inst;

enum { LINE = 400 }; /* a reply line: the driver keeps its messages to 300 characters */

/* Starts `python3 DRIVER mode` with its standard input and output on a socket pair; its standard error is
 * ours, or /dev/null when quiet. A socket rather than pipes: send() with MSG_NOSIGNAL makes a child that
 * died an error to report, not a SIGPIPE that kills alloc_bench. */
static int spawn_driver(const char *mode, bool quiet, pid_t *pid, int *fd, char err[AB_ERR_LEN]) {
  const char *driver = ALLOC_BENCH_TORCH_DRIVER;
  if (driver[0] == '\0') {
    snprintf(err, AB_ERR_LEN, "alloc_bench was built without the path of its PyTorch driver (torch_host.py)");
    return -1;
  }
  if (access(driver, R_OK) != 0) {
    snprintf(err, AB_ERR_LEN, "its driver %s cannot be read (%s): PyTorch's row runs from a source tree",
             driver, strerror(errno));
    return -1;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    snprintf(err, AB_ERR_LEN, "socketpair: %s", strerror(errno));
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
  if (quiet)
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char *argv[] = {"python3", (char *)driver, (char *)mode, NULL};
  int rc = posix_spawnp(pid, "python3", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(sv[1]);
  if (rc != 0) {
    close(sv[0]);
    snprintf(err, AB_ERR_LEN, "cannot run python3 (%s)%s", strerror(rc), rc == ENOENT ? ": not in PATH" : "");
    return -1;
  }
  *fd = sv[0];
  return 0;
}

/* The child's exit, as words for a message. */
static void reap(pid_t pid, char *buf, size_t len) {
  int status = 0;
  pid_t r;
  while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
    ;
  if (r < 0)
    snprintf(buf, len, "its status is unknown (%s)", strerror(errno));
  else if (WIFEXITED(status))
    snprintf(buf, len, "it exited with status %d%s", WEXITSTATUS(status),
             WEXITSTATUS(status) == 127 ? " (python3 could not run it)" : "");
  else
    snprintf(buf, len, "it was killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* One reply line into line[LINE], without its newline; -1 at end of file. */
static int read_line(FILE *in, char line[LINE]) {
  if (fgets(line, LINE, in) == NULL)
    return -1;
  line[strcspn(line, "\n")] = '\0';
  return 0;
}

static int send_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t k = send(fd, buf, len, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    buf += k;
    len -= (size_t)k;
  }
  return 0;
}

static int probe_torch(char err[AB_ERR_LEN]) {
  pid_t pid;
  int fd;
  if (spawn_driver("probe", true, &pid, &fd, err) != 0)
    return -1;
  FILE *in = fdopen(fd, "r");
  char line[LINE] = "";
  bool got = in != NULL && read_line(in, line) == 0;
  if (in != NULL)
    fclose(in);
  else
    close(fd);
  char how[128];
  reap(pid, how, sizeof how);
  if (got && strncmp(line, "ok ", 3) == 0)
    return 0;
  if (got && strncmp(line, "no ", 3) == 0)
    snprintf(err, AB_ERR_LEN, "%s", line + 3);
  else
    snprintf(err, AB_ERR_LEN, "its driver %s answered nothing: %s", ALLOC_BENCH_TORCH_DRIVER, how);
  return -1;
}

static void pt_close(ab_alloc *base) {
  pt_inst *p = (pt_inst *)base;
  if (p->in != NULL) {
    shutdown(p->fd, SHUT_WR); /* end of file for the child: it exits */
    fclose(p->in);
    char how[128];
    reap(p->pid, how, sizeof how);
  }
  free(p->base.streams);
  free(p);
}

/* The reply to a command; a child that is gone is described in err. */
static int reply(pt_inst *p, char line[LINE], const char *what, char err[AB_ERR_LEN]) {
  if (read_line(p->in, line) == 0)
    return 0;
  fclose(p->in); /* first: a child still alive then reads end of file and exits */
  p->in = NULL;
  char how[128];
  reap(p->pid, how, sizeof how);
  snprintf(err, AB_ERR_LEN, "the PyTorch driver gave no reply to '%s': %s", what, how);
  return -1;
}

static int command(pt_inst *p, const char *cmd, char line[LINE], char err[AB_ERR_LEN]) {
  if (p->in == NULL) {
    snprintf(err, AB_ERR_LEN, "the PyTorch driver is gone");
    return -1;
  }
  char buf[64];
  int n = snprintf(buf, sizeof buf, "%s\n", cmd);
  if (send_all(p->fd, buf, (size_t)n) != 0) {
    snprintf(err, AB_ERR_LEN, "cannot send '%s' to the PyTorch driver: %s", cmd, strerror(errno));
    return -1;
  }
  return reply(p, line, cmd, err);
}

static int pt_open(ab_alloc **out, int n_streams, char err[AB_ERR_LEN]) {
  *out = NULL;
  pt_inst *p = calloc(1, sizeof *p);
  /* the streams live in the child: the handles here are placeholders the harness passes back */
  void **streams = calloc(n_streams > 0 ? (size_t)n_streams : 1, sizeof *streams);
  if (p == NULL || streams == NULL) {
    free(p);
    free(streams);
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  p->base.vt = &ab_torch;
  p->base.n_streams = n_streams;
  p->base.streams = streams;
  if (spawn_driver("serve", false, &p->pid, &p->fd, err) != 0) {
    free(streams);
    free(p);
    return -1;
  }
  if ((p->in = fdopen(p->fd, "r")) == NULL) {
    snprintf(err, AB_ERR_LEN, "fdopen: %s", strerror(errno));
    close(p->fd);
    char how[128];
    reap(p->pid, how, sizeof how);
    free(streams);
    free(p);
    return -1;
  }
  char line[LINE];
  if (reply(p, line, "start", err) != 0 || strncmp(line, "ready ", 6) != 0) {
    if (p->in != NULL)
      snprintf(err, AB_ERR_LEN, "the PyTorch driver did not start: %s", line);
    pt_close(&p->base);
    return -1;
  }
  snprintf(p->base.note, sizeof p->base.note, "torch %.100s", line + 6);
  *out = &p->base;
  return 0;
}

/* Sends ops[0..n) to the child, once per sequence (untimed: the child times its loop alone); a device
 * sequence with each op's stream and record. */
static int load(pt_inst *p, const ab_op *ops, size_t n, char err[AB_ERR_LEN]) {
  if (p->loaded == ops && p->loaded_n == n)
    return 0;
  size_t cap = 64 + n * 64, k = 0;
  char *buf = malloc(cap);
  if (buf == NULL) {
    snprintf(err, AB_ERR_LEN, "out of host memory");
    return -1;
  }
  if (p->device) {
    k += (size_t)snprintf(buf, cap, "dops %zu %d\n", n, p->base.n_streams);
    for (size_t i = 0; i < n; i++)
      k += (size_t)snprintf(buf + k, cap - k, "%" PRIu64 " %" PRIu32 " %u %u\n", ops[i].size, ops[i].slot,
                            (unsigned)ops[i].stream, (unsigned)ops[i].record);
  } else {
    k += (size_t)snprintf(buf, cap, "ops %zu\n", n);
    for (size_t i = 0; i < n; i++)
      k += (size_t)snprintf(buf + k, cap - k, "%" PRIu64 " %" PRIu32 "\n", ops[i].size, ops[i].slot);
  }
  char line[LINE];
  int rc = send_all(p->fd, buf, k);
  free(buf);
  if (rc != 0) {
    snprintf(err, AB_ERR_LEN, "cannot send the sequence to the PyTorch driver: %s", strerror(errno));
    return -1;
  }
  if (reply(p, line, "ops", err) != 0)
    return -1;
  if (strcmp(line, "loaded") != 0) {
    snprintf(err, AB_ERR_LEN, "the PyTorch driver refused the sequence: %s", line);
    return -1;
  }
  p->loaded = ops;
  p->loaded_n = n;
  return 0;
}

static int pt_host_run(ab_alloc *base, const ab_op *ops, size_t n, void **slots, size_t *done, uint64_t *ns,
                       char err[AB_ERR_LEN]) {
  (void)slots; /* the pointers live in the child */
  pt_inst *p = (pt_inst *)base;
  *done = 0;
  char line[LINE];
  if (load(p, ops, n, err) != 0 || command(p, p->device ? "dpass" : "pass", line, err) != 0)
    return -1;
  if (sscanf(line, "ok %" SCNu64, ns) == 1) {
    *done = n;
    return 0;
  }
  /* The child freed what the failed pass left live, so *done stays 0: there is nothing to undo here. */
  size_t failed_at = 0;
  int at = 0;
  if (sscanf(line, "error %zu %n", &failed_at, &at) == 1 && at > 0)
    snprintf(err, AB_ERR_LEN, "op %zu: %s", failed_at, line + at);
  else
    snprintf(err, AB_ERR_LEN, "the PyTorch driver: %s", line);
  return -1;
}

/* A device workload's pass: the child's loop, its time the pass's (pass_ns). */
static int pt_run(ab_alloc *base, void *const *streams, const ab_op *ops, size_t n, void **slots, size_t *done,
                  char err[AB_ERR_LEN]) {
  (void)streams;
  pt_inst *p = (pt_inst *)base;
  p->device = true;
  uint64_t ns = 0;
  if (pt_host_run(base, ops, n, slots, done, &ns, err) != 0)
    return -1;
  base->pass_ns = ns ? ns : 1;
  return 0;
}

static int pt_sync(ab_alloc *base, void *const *streams, int n, char err[AB_ERR_LEN]) {
  (void)base, (void)streams, (void)n, (void)err;
  return 0; /* the child's pass ends with its stream 0 synchronized */
}

static int pt_history(ab_alloc *base, bool on, bool stacks, char err[AB_ERR_LEN]) {
  char line[LINE];
  if (command((pt_inst *)base, !on ? "history off" : stacks ? "history stacks" : "history plain", line, err) != 0)
    return -1;
  if (strcmp(line, "ok") == 0)
    return 0;
  snprintf(err, AB_ERR_LEN, "%s", strncmp(line, "error ", 6) == 0 ? line + 6 : line);
  return -1;
}

static int pt_stats(ab_alloc *base, bool graph, ab_stats *out, char err[AB_ERR_LEN]) {
  (void)graph;
  return ab_torch.host_stats(base, out, err);
}

static int pt_host_stats(ab_alloc *base, ab_stats *out, char err[AB_ERR_LEN]) {
  char line[LINE];
  if (command((pt_inst *)base, ((pt_inst *)base)->device ? "dstats" : "stats", line, err) != 0)
    return -1;
  if (sscanf(line, "stats %" SCNd64 " %" SCNd64 " %" SCNd64, &out->peak_reserved, &out->peak_allocated,
             &out->device_allocs) != 3) {
    snprintf(err, AB_ERR_LEN, "the PyTorch driver's stats: %s", line);
    return -1;
  }
  return 0;
}

static int pt_check(ab_alloc *base, char err[AB_ERR_LEN]) {
  char line[LINE];
  if (command((pt_inst *)base, ((pt_inst *)base)->device ? "dcheck" : "check", line, err) != 0)
    return -1;
  if (strcmp(line, "ok") == 0)
    return 0;
  snprintf(err, AB_ERR_LEN, "%s", strncmp(line, "error ", 6) == 0 ? line + 6 : line);
  return -1;
}

const ab_allocator ab_torch = {
    .name = "PyTorch",
    .kinds = AB_HOST | AB_DEVICE,
    .probe = probe_torch,
    .open = pt_open,
    .run = pt_run,
    .run_rec = pt_run,
    .history = pt_history,
    .sync = pt_sync,
    .stats = pt_stats,
    .mt_na = "runs in one thread of its driver process",
    .graph_na = "its graph pools are not measured here",
    .check = pt_check,
    .host_run = pt_host_run,
    .host_stats = pt_host_stats,
    .close = pt_close,
};
