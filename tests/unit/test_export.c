/* Snapshots without code changes: CACHALOT_SNAPSHOT_ON_OOM / _AT_EXIT / _SOCKET. The variables are read
 * once per process, so each scenario runs in a child process of its own. */
#include "helpers.h"

#include "process/export.h"

#include <cachalot/snapshot.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[64];

static int threads_now(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  while (d && (e = readdir(d)))
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return NULL;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

/* Sends one request and returns the reply (static buffer), or NULL. */
static char *ask_n(const char *path, const char *req, size_t len);
static char *ask(const char *path, const char *req) { return ask_n(path, req, strlen(req)); }

/* A request of len bytes (NULs and all); the whole reply, or NULL where the connection failed or was reset
 * before any reply. */
static char *ask_n(const char *path, const char *req, size_t len) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  if (write(fd, req, len) < 0) {
    close(fd);
    return NULL;
  }
  static char buf[1 << 20];
  size_t n = 0;
  ssize_t r;
  while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
    n += (size_t)r;
  buf[n] = '\0';
  close(fd);
  return buf;
}

/* The child: OOM snapshot, socket requests, then exit (the at-exit snapshot). Exit status 0 when all
 * checks in it held, else the number of the failed check. */
static int child(void) {
  char oom[128], sock[128], pidsock[128];
  snprintf(oom, sizeof oom, "%s/oom-%%p.json", dir);
  snprintf(sock, sizeof sock, "%s/s-%%p", dir);
  setenv("CACHALOT_SNAPSHOT_ON_OOM", oom, 1);
  setenv("CACHALOT_SNAPSHOT_SOCKET", sock, 1);
  snprintf(pidsock, sizeof pidsock, "%s/exit.json", dir);
  setenv("CACHALOT_SNAPSHOT_AT_EXIT", pidsock, 1);
  cachalot_sim_options o = {1, 64 * MiB, false};
  cachalot_backend *b;
  cachalot_allocator *a;
  if (cachalot_backend_sim(&o, &b) || cachalot_create(b, "", &a))
    return 1;
  void *p, *q;
  if (cachalot_malloc(a, 0, 40 * MiB, NULL, &p))
    return 2;
  if (cachalot_malloc(a, 0, 40 * MiB, NULL, &q) != CACHALOT_ERROR_OUT_OF_MEMORY)
    return 3;
  if (!strstr(cachalot_last_error(), "CUDA out of memory. Tried to allocate 40.00 MiB"))
    return 4; /* the snapshot did not clobber the message */
  char path[160];
  snprintf(path, sizeof path, "%s/oom-%ld.json", dir, (long)getpid());
  char *text = slurp(path);
  if (!text || !strstr(text, "\"segments\":[{") || !strstr(text, "\"total_size\":41943040"))
    return 5;
  snprintf(path, sizeof path, "%s/s-%ld", dir, (long)getpid());
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISSOCK(st.st_mode) || (st.st_mode & 0777) != 0600)
    return 6;
  char *r = ask(path, "stats 0 0\n");
  if (!r || !strstr(r, "\"allocation.all.current\":1") || !strstr(r, "\"num_ooms\":1"))
    return 7;
  r = ask(path, "snapshot\n");
  if (!r || !strstr(r, "\"device_traces\":[") || !strstr(r, "\"allocator_settings\":{"))
    return 8;
  r = ask(path, "list\n");
  if (!r || !strstr(r, "\"allocators\":1"))
    return 9;
  r = ask(path, "bogus 7\n");
  if (!r || !strstr(r, "\"error\""))
    return 10;
  r = ask(path, "snapshot 5\n"); /* no such allocator */
  if (!r || !strstr(r, "\"error\""))
    return 11;
  /* a client that hangs up before the answer: the server's write fails; the program must live on */
  for (int k = 0; k < 20; k++) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
      return 16;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0)
      return 13;
    if (write(fd, "snapshot\n", 9) != 9)
      return 14;
    close(fd);
  }
  r = ask(path, "list\n"); /* still serving */
  if (!r || !strstr(r, "\"allocators\":1"))
    return 15;
  if (cachalot_free(a, p))
    return 12;
  return 0; /* exit: the at-exit snapshot (the allocator is still alive) */
}

static void test_env_triggers(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/cachalot-export-XXXXXX");
  assert_non_null(mkdtemp(dir));
  pid_t pid = fork();
  if (pid == 0) {
    int rc = child();
    fflush(NULL);
    exit(rc);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  char path[160];
  snprintf(path, sizeof path, "%s/exit.json", dir);
  char *text = slurp(path);
  assert_non_null(text);
  assert_non_null(strstr(text, "\"segments\":[{"));
  const size_t len = strlen(text); /* one newline at the end, as alloc_snapshot writes JSON */
  assert_true(len > 2 && text[len - 1] == '\n' && text[len - 2] == '}');
  snprintf(path, sizeof path, "%s/s-%ld", dir, (long)pid);
  struct stat st;
  assert_int_not_equal(stat(path, &st), 0); /* the socket is removed at exit */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Paths too long for their buffers are ignored with a warning: no snapshot goes to a truncated path
 * (fuzz_env's first finding: a path that did not fit was kept cut short, and the OOM snapshot was written
 * there). */
static void test_env_too_long(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/cachalot-export-XXXXXX");
  assert_non_null(mkdtemp(dir));
  pid_t pid = fork();
  if (pid == 0) {
    char longpath[1200];
    int n = snprintf(longpath, sizeof longpath, "%s/", dir);
    memset(longpath + n, 'x', sizeof longpath - (size_t)n - 1);
    longpath[sizeof longpath - 1] = '\0';
    setenv("CACHALOT_SNAPSHOT_ON_OOM", longpath, 1);
    setenv("CACHALOT_SNAPSHOT_AT_EXIT", longpath, 1);
    /* cut to the socket's 92 bytes this would still be a valid name: the case that showed the bug */
    char sockpath[200];
    n = snprintf(sockpath, sizeof sockpath, "%s/", dir);
    memset(sockpath + n, 's', sizeof sockpath - (size_t)n - 1);
    sockpath[sizeof sockpath - 1] = '\0';
    setenv("CACHALOT_SNAPSHOT_SOCKET", sockpath, 1);
    cachalot_sim_options o = {1, 64 * MiB, false};
    cachalot_backend *b;
    cachalot_allocator *a;
    if (cachalot_backend_sim(&o, &b) || cachalot_create(b, "", &a))
      exit(1);
    void *p;
    if (cachalot_malloc(a, 0, 100 * MiB, NULL, &p) != CACHALOT_ERROR_OUT_OF_MEMORY)
      exit(2);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir); /* no socket, no OOM snapshot */
    exit(system(cmd) == 0 ? 0 : 3); /* at exit: no snapshot either (checked by the parent) */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", dir); /* nothing was written */
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int connect_to(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  const size_t n = strlen(path);
  if (n >= sizeof addr.sun_path) /* (the tests' paths fit: a longer one cannot be connected to) */
    return -1;
  memcpy(addr.sun_path, path, n + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Hostile clients and paths (issue 17 items 13-15), in a child: an idle client and one that never reads a
 * large answer hold nobody else up; a request over 127 bytes gets the error object, not a reset; the
 * socket variable pointing at a regular file leaves the file alone; the at-exit path a symlink is written
 * through, the link kept; with the socket variable alone nothing is written at exit. */
static int child_hostile(int step) {
  char path[160], target[160], link[160];
  cachalot_sim_options o = {1, 64 * GiB, false};
  cachalot_backend *b;
  cachalot_allocator *a;
  if (step == 0) { /* socket at a regular file */
    snprintf(path, sizeof path, "%s/precious", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs("keep me", f) < 0 || fclose(f) != 0)
      return 20;
    setenv("CACHALOT_SNAPSHOT_SOCKET", path, 1);
    if (cachalot_backend_sim(&o, &b) || cachalot_create(b, "", &a))
      return 21;
    char *text = slurp(path);
    return text && !strcmp(text, "keep me") ? 0 : 22;
  }
  if (step == 1) { /* at-exit path a symlink; a second allocator; then exit */
    snprintf(target, sizeof target, "%s/target.json", dir);
    snprintf(link, sizeof link, "%s/link.json", dir);
    if (symlink(target, link) != 0)
      return 30;
    setenv("CACHALOT_SNAPSHOT_AT_EXIT", link, 1);
    if (cachalot_backend_sim(&o, &b) || cachalot_create(b, "", &a))
      return 31;
    return 0;
  }
  if (step == 3) { /* at-exit path a FIFO nobody reads: the exit goes on (a blocking open waited for good) */
    snprintf(path, sizeof path, "%s/fifo", dir);
    if (mkfifo(path, 0600) != 0)
      return 50;
    setenv("CACHALOT_SNAPSHOT_AT_EXIT", path, 1);
    if (cachalot_backend_sim(&o, &b) || cachalot_create(b, "", &a))
      return 51;
    alarm(10);
    return 0;
  }
  /* step 2: the socket alone, under slow and hostile clients */
  snprintf(path, sizeof path, "%s/sock", dir);
  setenv("CACHALOT_SNAPSHOT_SOCKET", path, 1);
  cachalot_allocator *a2;
  if (cachalot_backend_sim(&o, &b) || cachalot_create(b, "", &a) || cachalot_create(b, "", &a2))
    return 40;
  for (int i = 0; i < 4000; i++) { /* a snapshot of ~1 MB: more than a socket buffer holds */
    void *p;
    if (cachalot_malloc(a, 0, 512 + 512 * (size_t)(i % 7), NULL, &p))
      return 41;
  }
  int idle = connect_to(path); /* connects, says nothing */
  int deaf = connect_to(path); /* asks, never reads */
  if (idle < 0 || deaf < 0 || write(deaf, "snapshot\n", 9) != 9)
    return 42;
  usleep(100000);
  double t0 = now_s();
  char *r = ask(path, "list\n");
  if (!r || !strstr(r, "\"allocators\":2") || now_s() - t0 > 1.0)
    return 43; /* answered at once, not after the others' time limits */
  char longreq[300];
  memset(longreq, 'x', sizeof longreq);
  longreq[sizeof longreq - 2] = '\n';
  longreq[sizeof longreq - 1] = '\0';
  r = ask(path, longreq);
  if (!r || !strstr(r, "request longer than 127 bytes"))
    return 44;
  /* a NUL cuts nothing short; a word that is not an index is not one; a line and more; binary bytes:
   * each answered with an error object, not a reset connection (issue 30) */
  r = ask_n(path, "record 10\0stacks\n", 17);
  if (!r || !strstr(r, "a NUL byte in the request (at byte 9)"))
    return 45;
  r = ask(path, "record 10 stackz\n");
  if (!r || !strstr(r, "record expects 'record N [stacks] [ALLOCATOR]'"))
    return 46;
  r = ask(path, "record 10\nstacks\n");
  if (!r || !strstr(r, "one request per connection: 7 bytes after its line"))
    return 47;
  unsigned char bin[30];
  for (size_t i = 0; i < sizeof bin; i++)
    bin[i] = (unsigned char)(i * 97 + 13); /* binary bytes, with a newline put at byte 5: 24 after it */
  bin[5] = '\n';
  r = ask_n(path, (const char *)bin, sizeof bin);
  if (!r || !strstr(r, "{\"error\":"))
    return 48;
  r = ask(path, "list\r\n"); /* a carriage return before the newline is the line's end too */
  if (!r || !strstr(r, "\"allocators\":2"))
    return 49;
  close(idle);
  close(deaf);
  return 0; /* exit: the socket alone writes no snapshot */
}

static void test_hostile_clients_and_paths(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/cachalot-export-XXXXXX");
  assert_non_null(mkdtemp(dir));
  for (int step = 0; step < 4; step++) {
    pid_t pid = fork();
    if (pid == 0) {
      unsetenv("CACHALOT_SNAPSHOT_ON_OOM");
      unsetenv("CACHALOT_SNAPSHOT_AT_EXIT");
      unsetenv("CACHALOT_SNAPSHOT_SOCKET");
      if (chdir(dir) != 0)
        exit(99);
      int rc = child_hostile(step);
      fflush(NULL);
      exit(rc);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  char path[200];
  struct stat st;
  snprintf(path, sizeof path, "%s/link.json", dir);
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISLNK(st.st_mode)); /* written through, not replaced */
  snprintf(path, sizeof path, "%s/target.json", dir);
  char *text = slurp(path);
  assert_non_null(text);
  assert_non_null(strstr(text, "\"segments\":["));
  snprintf(path, sizeof path, "%s/.1", dir); /* no stray file of the second allocator */
  assert_int_not_equal(lstat(path, &st), 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* An exit snapshot of ~1.2 MB into a FIFO whose reader is slow but keeps reading: all of it arrives, though
 * the pipe fills again and again (the time limit counts time without progress; it counted each wait). */
static void test_fifo_slow_reader(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/cachalot-export-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char path[200];
  snprintf(path, sizeof path, "%s/fifo", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  const int rd = open(path, O_RDONLY | O_NONBLOCK); /* open before the writer: its open must find a reader */
  assert_true(rd >= 0);
  pid_t pid = fork();
  if (pid == 0) {
    unsetenv("CACHALOT_SNAPSHOT_ON_OOM");
    unsetenv("CACHALOT_SNAPSHOT_SOCKET");
    setenv("CACHALOT_SNAPSHOT_AT_EXIT", path, 1);
    cachalot_backend *b;
    cachalot_allocator *a;
    if (cachalot_backend_sim(NULL, &b) || cachalot_create(b, "", &a))
      _exit(1);
    for (int i = 0; i < 12000; i++) {
      void *p;
      if (cachalot_malloc(a, 0, 512 + 512 * (size_t)(i % 7), NULL, &p))
        _exit(2);
    }
    alarm(30);
    exit(0);
  }
  size_t got = 0;
  char last = 0, buf[1024];
  for (int idle = 0; idle < 3000;) { /* until the writer is gone and nothing is left: 3 s without data */
    const ssize_t r = read(rd, buf, sizeof buf);
    if (r > 0) {
      got += (size_t)r;
      last = buf[r - 1];
      idle = 0;
      usleep(300); /* slow: the writer finds the pipe full hundreds of times */
    } else {
      usleep(1000);
      idle++;
      if (r == 0 && waitpid(pid, NULL, WNOHANG) == pid)
        break;
    }
  }
  close(rd);
  waitpid(pid, NULL, 0);
  if (got < (size_t)1 << 20)
    fail_msg("%zu bytes arrived", got);
  assert_int_equal(last, '\n');
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Two processes given one socket path (two ranks without %p or %r): the first serves it; the second
 * leaves it alone with a warning, and its exit does not remove it; a stale socket (its process gone) is
 * taken over. */
static pid_t serve_until_told(const char *path, int *tell) {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]); /* its own end: EOF on down when the test closes *tell */
    unsetenv("CACHALOT_SNAPSHOT_ON_OOM");
    unsetenv("CACHALOT_SNAPSHOT_AT_EXIT");
    setenv("CACHALOT_SNAPSHOT_SOCKET", path, 1);
    cachalot_backend *b;
    cachalot_allocator *a;
    if (cachalot_backend_sim(NULL, &b) || cachalot_create(b, "", &a))
      _exit(1);
    char c = 'u';
    if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) < 0)
      _exit(2);
    exit(0); /* at exit: its socket goes, if it is its own */
  }
  char c;
  if (read(up[0], &c, 1) != 1)
    return -1;
  close(up[0]);
  close(up[1]);
  close(down[0]);
  *tell = down[1];
  return pid;
}

static void finish(pid_t pid, int tell) {
  close(tell);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_socket_shared_path(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/cachalot-export-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char path[200], want[64];
  snprintf(path, sizeof path, "%s/sock", dir);
  int tell_a, tell_b;
  const pid_t a = serve_until_told(path, &tell_a);
  assert_true(a > 0);
  const pid_t b = serve_until_told(path, &tell_b); /* (it holds a copy of tell_a until it exits) */
  assert_true(b > 0);
  snprintf(want, sizeof want, "\"pid\":%ld", (long)a);
  char *r = ask(path, "list\n");
  assert_non_null(r);
  assert_non_null(strstr(r, want)); /* the first one's still */
  finish(b, tell_b);
  r = ask(path, "list\n");
  assert_non_null(r); /* the second one's exit left it */
  assert_non_null(strstr(r, want));
  /* the first one killed: its socket file stays, stale, and the next process takes it over */
  kill(a, SIGKILL);
  int status;
  assert_int_equal(waitpid(a, &status, 0), a);
  close(tell_a);
  struct stat st;
  assert_int_equal(lstat(path, &st), 0);
  const pid_t c = serve_until_told(path, &tell_a);
  assert_true(c > 0);
  snprintf(want, sizeof want, "\"pid\":%ld", (long)c);
  r = ask(path, "list\n");
  assert_non_null(r);
  assert_non_null(strstr(r, want));
  finish(c, tell_a);
  assert_int_not_equal(lstat(path, &st), 0); /* its own: removed at its exit */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_no_thread_without_env(void **state) {
  (void)state;
  pid_t pid = fork();
  if (pid == 0) {
    unsetenv("CACHALOT_SNAPSHOT_ON_OOM");
    unsetenv("CACHALOT_SNAPSHOT_AT_EXIT");
    unsetenv("CACHALOT_SNAPSHOT_SOCKET");
    int before = threads_now();
    cachalot_backend *b;
    cachalot_allocator *a;
    if (cachalot_backend_sim(NULL, &b) || cachalot_create(b, "", &a))
      exit(1);
    exit(threads_now() == before ? 0 : 2);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* Snapshot paths: "%p" the pid, "%r" the rank (RANK, else LOCAL_RANK, only a plain number), "%h" the
 * host name; a path that does not fit is refused whole. */
static void test_path_expansion(void **state) {
  (void)state;
  char out[256], want[300], host[256] = ""; /* want: a host of 255 bytes, "/" and a pid */
  assert_int_equal(gethostname(host, sizeof host - 1), 0);
  const long pid = (long)getpid();
  setenv("RANK", "3", 1);
  setenv("LOCAL_RANK", "1", 1);
  assert_true(cl_export_expand_path("/tmp/snap-%r-%p.json", out, sizeof out));
  snprintf(want, sizeof want, "/tmp/snap-3-%ld.json", pid);
  assert_string_equal(out, want);
  setenv("RANK", "../x", 1); /* not a number: LOCAL_RANK's instead */
  assert_true(cl_export_expand_path("r%r", out, sizeof out));
  assert_string_equal(out, "r1");
  unsetenv("RANK");
  unsetenv("LOCAL_RANK");
  assert_true(cl_export_expand_path("r%r.json", out, sizeof out));
  assert_string_equal(out, "r.json");
  assert_false(cl_export_expand_path("%r", out, sizeof out)); /* nothing left */
  assert_string_equal(out, "");
  assert_true(cl_export_expand_path("%h/%p", out, sizeof out));
  snprintf(want, sizeof want, "%s/%ld", host, pid);
  assert_string_equal(out, want);
  assert_false(cl_export_expand_path("%h-%h-%h", out, strlen(host))); /* does not fit: nothing */
  assert_string_equal(out, "");
  assert_true(cl_export_expand_path("100%", out, sizeof out)); /* a lone % stays */
  assert_string_equal(out, "100%");
  assert_true(cl_export_expand_path("a%%p-%%%p", out, sizeof out)); /* %% is a literal % */
  snprintf(want, sizeof want, "a%%p-%%%ld", pid);
  assert_string_equal(out, want);
}

static char history_warning[512];
static void keep_history_warning(const char *message, void *ctx) {
  (void)ctx;
  snprintf(history_warning, sizeof history_warning, "%s", message);
}

/* CACHALOT_RECORD_HISTORY=N[,stacks] turns history on at creation, for a program that never asks: a ring
 * of N entries per device (here the 4 a malloc+free make), with C stacks in the second
 * form; a malformed value leaves history off with a warning, and creation succeeds. */
static void test_history_from_env(void **state) {
  (void)state;
  const char *values[] = {"4", "4,stacks", "12x", "0", "4,stack", "-4"};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    const bool good = i < 2, stacks = i == 1;
    setenv("CACHALOT_RECORD_HISTORY", values[i], 1);
    history_warning[0] = '\0';
    cachalot_set_warning_handler(keep_history_warning, NULL);
    env e = ENV(1, 0, "");
    cachalot_set_warning_handler(NULL, NULL);
    unsetenv("CACHALOT_RECORD_HISTORY");
    cachalot_stream s = STREAM(e.b, 0);
    FREE(e.a, ALLOC(e.a, 0, 1000, s)); /* segment_alloc, alloc, free_requested, free_completed */
    cachalot_snapshot_info *si = NULL;
    OK(cachalot_snapshot_take(e.a, true, &si)); /* and a snapshot entry */
    EQ(si->n_trace, good ? 4 : 0);
    if (good) /* the snapshot's own entry comes after the trace is read */
      EQ(si->trace[3].action, CACHALOT_TRACE_FREE_COMPLETED);
    cachalot_snapshot_info_free(e.a, si);
    char *json = NULL;
    OK(cachalot_snapshot_json(e.a, &json));
    assert_int_equal(strstr(json, "\"filename\"") != NULL, stacks);
    free(json);
    if (good)
      assert_string_equal(history_warning, "");
    else
      CONTAINS(history_warning, "is not N or N,stacks");
    CHECK(e.a);
    env_free(&e);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_triggers),
      cmocka_unit_test(test_path_expansion),
      cmocka_unit_test(test_no_thread_without_env),
      cmocka_unit_test(test_env_too_long),
      cmocka_unit_test(test_hostile_clients_and_paths),
      cmocka_unit_test(test_socket_shared_path),
      cmocka_unit_test(test_fifo_slow_reader),
      /* last: it creates allocators in this process, which reads the CACHALOT_SNAPSHOT_* variables once
       * for good (the tests above set them in forked children) */
      cmocka_unit_test(test_history_from_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
