/* Forks under load on the simulated device: worker threads keep every kind of lock of the allocator busy
 * (the warm paths' lane locks, exclusive mode, history with contexts, snapshots, the pinned-host cache)
 * while the main thread forks again and again. Each child makes one call of the public API, bounded by an
 * alarm, and must get CACHALOT_ERROR_DEVICE with the forked message at once, whatever the parent's threads
 * held at the fork; then it destroys the allocator and exits, as a child that never touches CUDA does.
 * A child that hangs is killed by its alarm and named with the call it made. */
#include <cachalot/cachalot.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { THREADS = 4, FORKS_PER_CALL = 6, CHILD_SECONDS = 2 };

static cachalot_allocator *a;
static cachalot_backend *b;
static cachalot_stream streams[THREADS];
static void *kept; /* a block the parent holds: the children free and record it */
static void *kept_host;
static _Atomic bool stop;
static _Atomic long ops;

/* A worker's call that must succeed. */
static void must(cachalot_status rc, const char *what) {
  if (rc != CACHALOT_OK) {
    fprintf(stderr, "fork: a worker's %s failed: %s\n", what, cachalot_last_error());
    abort();
  }
}

static void ctx_retain(void *c) { (void)c; }
static void ctx_release(void *c) { (void)c; }

static void *worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  void *held[8] = {0};
  int ctx = 0;
  while (!atomic_load(&stop)) {
    r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
    const int k = (int)(r % 8);
    if (held[k]) {
      must(cachalot_free(a, held[k]), "free");
      held[k] = NULL;
    } else if (cachalot_malloc_with_context(a, 0, 512u << (r >> 60), streams[id], &ctx, &held[k]) != CACHALOT_OK) {
      held[k] = NULL; /* out of memory is allowed: the capacity is small */
    }
    switch ((r >> 32) % 64) { /* now and then, the calls that take the other locks */
    case 0: {
      char *json = NULL;
      if (cachalot_snapshot_json(a, &json) == CACHALOT_OK)
        free(json);
      break;
    }
    case 1:
      must(cachalot_empty_cache(a), "empty_cache");
      break;
    case 2: {
      void *h = NULL;
      if (cachalot_host_malloc(a, 4096, &h) == CACHALOT_OK && h)
        must(cachalot_host_free(a, h), "host_free");
      break;
    }
    case 3: {
      cachalot_device_stats st;
      must(cachalot_memory_stats(a, 0, &st), "memory_stats");
      break;
    }
    case 4:
      if (held[k])
        must(cachalot_record_stream(a, held[k], streams[(id + 1) % THREADS]), "record_stream");
      break;
    case 5:
      must(cachalot_sim_stream_complete(b, streams[(id + 1) % THREADS]), "stream_complete");
      break;
    default:
      break;
    }
    atomic_fetch_add_explicit(&ops, 1, memory_order_relaxed);
  }
  for (int k = 0; k < 8; k++)
    if (held[k])
      must(cachalot_free(a, held[k]), "free");
  return NULL;
}

/* ---- the calls a child makes, one each ----------------------------------------------------------- */

static cachalot_status c_malloc(void) {
  void *p = NULL;
  return cachalot_malloc(a, 0, 1000, streams[0], &p);
}
static cachalot_status c_malloc_ctx(void) {
  void *p = NULL;
  int c;
  return cachalot_malloc_with_context(a, 0, 1000, streams[1], &c, &p);
}
static cachalot_status c_free(void) { return cachalot_free(a, kept); }
static cachalot_status c_free_ctx(void) {
  int c;
  return cachalot_free_with_context(a, kept, &c);
}
static cachalot_status c_record_stream(void) { return cachalot_record_stream(a, kept, streams[2]); }
static cachalot_status c_empty_cache(void) { return cachalot_empty_cache(a); }
static cachalot_status c_memory_stats(void) {
  cachalot_device_stats st;
  return cachalot_memory_stats(a, 0, &st);
}
static cachalot_status c_memory_stats_json(void) {
  char *j = NULL;
  return cachalot_memory_stats_json(a, 0, &j);
}
static cachalot_status c_snapshot_json(void) {
  char *j = NULL;
  return cachalot_snapshot_json(a, &j);
}
static cachalot_status c_snapshot_take(void) {
  cachalot_snapshot_info *s = NULL;
  return cachalot_snapshot_take(a, true, &s);
}
static cachalot_status c_record_history(void) { return cachalot_record_history(a, true, 100); }
static cachalot_status c_annotate(void) { return cachalot_annotate(a, 0, "child"); }
static cachalot_status c_reset_peak(void) { return cachalot_reset_peak_stats(a, 0); }
static cachalot_status c_fraction(void) { return cachalot_set_memory_fraction(a, 0, 0.5); }
static cachalot_status c_settings(void) { return cachalot_set_settings(a, "garbage_collection_threshold:0.5"); }
static cachalot_status c_forget(void) { return cachalot_forget_stream(a, streams[3]); }
static cachalot_status c_pool_count(void) {
  int n = 0;
  return cachalot_pool_use_count(a, 0, (cachalot_mempool_id){1, 0}, &n);
}
static cachalot_status c_begin_pool(void) {
  return cachalot_begin_allocate_to_pool(a, 0, (cachalot_mempool_id){1, 0}, NULL, NULL);
}
static cachalot_status c_empty_pool(void) { return cachalot_empty_cache_pool(a, 0, (cachalot_mempool_id){1, 0}); }
static cachalot_status c_check(void) { return cachalot_check(a); }
static cachalot_status c_graph(void) { /* the graph layer takes no lock of its own: the allocator's check */
  cachalot_graph *g = NULL;
  return cachalot_graph_create(a, 0, false, &g);
}
static cachalot_status c_settings_get(void) {
  cachalot_settings st;
  return cachalot_get_settings(a, &st);
}
static cachalot_status c_host_malloc(void) {
  void *h = NULL;
  return cachalot_host_malloc(a, 100, &h);
}
static cachalot_status c_host_free(void) { return cachalot_host_free(a, kept_host); }
static cachalot_status c_host_empty(void) { return cachalot_host_empty_cache(a); }
static cachalot_status c_host_stats(void) {
  cachalot_host_stats st;
  return cachalot_host_memory_stats(a, &st);
}

static const struct {
  const char *name;
  cachalot_status (*call)(void);
} CALLS[] = {
    {"cachalot_malloc", c_malloc},
    {"cachalot_malloc_with_context", c_malloc_ctx},
    {"cachalot_free", c_free},
    {"cachalot_free_with_context", c_free_ctx},
    {"cachalot_record_stream", c_record_stream},
    {"cachalot_empty_cache", c_empty_cache},
    {"cachalot_memory_stats", c_memory_stats},
    {"cachalot_memory_stats_json", c_memory_stats_json},
    {"cachalot_snapshot_json", c_snapshot_json},
    {"cachalot_snapshot_take", c_snapshot_take},
    {"cachalot_record_history", c_record_history},
    {"cachalot_annotate", c_annotate},
    {"cachalot_reset_peak_stats", c_reset_peak},
    {"cachalot_set_memory_fraction", c_fraction},
    {"cachalot_set_settings", c_settings},
    {"cachalot_forget_stream", c_forget},
    {"cachalot_pool_use_count", c_pool_count},
    {"cachalot_begin_allocate_to_pool", c_begin_pool},
    {"cachalot_empty_cache_pool", c_empty_pool},
    {"cachalot_check", c_check},
    {"cachalot_graph_create", c_graph},
    {"cachalot_get_settings", c_settings_get},
    {"cachalot_host_malloc", c_host_malloc},
    {"cachalot_host_free", c_host_free},
    {"cachalot_host_empty_cache", c_host_empty},
    {"cachalot_host_memory_stats", c_host_stats},
};
enum { N_CALLS = sizeof CALLS / sizeof CALLS[0] };

/* The child: the call (1: another status, 2: another message), then destroy, which must return too;
 * a hang ends in SIGALRM. */
static int child(int k) {
  alarm(CHILD_SECONDS);
  if (CALLS[k].call() != CACHALOT_ERROR_DEVICE)
    return 1;
  if (!strstr(cachalot_last_error(), "forked after cachalot was used"))
    return 2;
  cachalot_destroy(a);
  return 0;
}

int main(void) {
  cachalot_sim_options opt = {.device_count = 1, .capacity_bytes = (size_t)256 << 20, .complete_immediately = false};
  if (cachalot_backend_sim(&opt, &b) != CACHALOT_OK || cachalot_create(b, "", &a) != CACHALOT_OK) {
    fprintf(stderr, "fork: setup: %s\n", cachalot_last_error());
    return 1;
  }
  const cachalot_context_ops cops = {ctx_retain, ctx_release};
  if (cachalot_set_context_ops(a, &cops) != CACHALOT_OK || cachalot_record_history(a, true, 256) != CACHALOT_OK)
    return 1;
  for (int i = 0; i < THREADS; i++)
    if (cachalot_sim_stream_create(b, 0, &streams[i]) != CACHALOT_OK)
      return 1;
  if (cachalot_malloc(a, 0, 4096, streams[0], &kept) != CACHALOT_OK ||
      cachalot_host_malloc(a, 64, &kept_host) != CACHALOT_OK)
    return 1;
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  int failed = 0, forks = 0;
  for (int round = 0; round < FORKS_PER_CALL; round++)
    for (int k = 0; k < N_CALLS; k++) {
      while (atomic_load_explicit(&ops, memory_order_relaxed) < (long)(forks + 1) * 50)
        sched_yield(); /* the workers are well into their calls */
      fflush(NULL);
      const pid_t pid = fork();
      if (pid < 0) {
        perror("fork");
        return 1;
      }
      if (pid == 0)
        _exit(child(k));
      forks++;
      int status = 0;
      if (waitpid(pid, &status, 0) != pid)
        return 1;
      if (WIFSIGNALED(status)) {
        fprintf(stderr, "fork: child %d: %s: %s\n", forks, CALLS[k].name,
                WTERMSIG(status) == SIGALRM ? "hung (killed by its alarm)" : strsignal(WTERMSIG(status)));
        failed++;
      } else if (WEXITSTATUS(status) != 0) {
        static const char *why[] = {"", "another status than CACHALOT_ERROR_DEVICE", "another message"};
        const int w = WEXITSTATUS(status);
        fprintf(stderr, "fork: child %d: %s: %s\n", forks, CALLS[k].name, w < 3 ? why[w] : "exit status");
        failed++;
      }
    }
  atomic_store(&stop, true);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  /* the parent goes on as before */
  void *p = NULL;
  if (cachalot_malloc(a, 0, 1000, streams[0], &p) != CACHALOT_OK || cachalot_free(a, p) != CACHALOT_OK ||
      cachalot_free(a, kept) != CACHALOT_OK || cachalot_host_free(a, kept_host) != CACHALOT_OK ||
      cachalot_check(a) != CACHALOT_OK) {
    fprintf(stderr, "fork: the parent after the forks: %s\n", cachalot_last_error());
    failed++;
  }
  (void)cachalot_destroy(a);
  cachalot_backend_destroy(b);
  printf("fork: %d children, %d calls, %ld parent ops: %d failed\n", forks, N_CALLS, atomic_load(&ops), failed);
  return failed ? 1 : 0;
}
