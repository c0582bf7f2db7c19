/* The simulated backend's graph operations (the ops table's "graphs" section and cachalot_sim_launch):
 * captures count their nodes, replays enqueue them as work, side streams join a capture through
 * stream_wait and must be joined back, and the misuses CUDA answers by invalidating a capture (as seen on
 * CUDA 13) are invalidated here too. */
#include "helpers.h"

#include "allocator/backend/ops.h"

#include <pthread.h>
#include <unistd.h>

static cachalot_backend *sim_new(int devices, bool immediate) {
  cachalot_sim_options o = {.device_count = devices, .capacity_bytes = 1 * GiB, .complete_immediately = immediate};
  cachalot_backend *b = NULL;
  OK(cachalot_backend_sim(&o, &b));
  return b;
}

static cachalot_stream op_stream(cachalot_backend *b, int device) {
  cachalot_stream s = NULL;
  OK(b->ops->stream_create(b, device, &s));
  assert_non_null(s);
  return s;
}

static uint64_t submitted(cachalot_backend *b, cachalot_stream s) {
  uint64_t n = 12345;
  OK(cachalot_sim_stream_submitted(b, s, &n));
  return n;
}

/* The capture id `s` of device 0 shows, and whether it is capturing (as -1 when not). */
static int64_t capture_of(cachalot_backend *b, cachalot_stream s) {
  bool capturing = false;
  uint64_t id = 99;
  OK(b->ops->stream_capture_info(b, 0, s, &capturing, &id));
  if (!capturing) {
    EQ(id, 0);
    return -1;
  }
  return (int64_t)id;
}

static void launch_n(cachalot_backend *b, cachalot_stream s, int n) {
  for (int i = 0; i < n; i++)
    OK(cachalot_sim_launch(b, s));
}

static bool event_done(cachalot_backend *b, cl_event *e) {
  bool done = false;
  OK(b->ops->event_query(b, e, &done));
  return done;
}

/* Ends the capture of `s` expecting `want`; returns the graph (NULL on failure) and its node count. */
static cl_graph *end_capture(cachalot_backend *b, cachalot_stream s, cachalot_status want, size_t *n) {
  cl_graph *g = (cl_graph *)(uintptr_t)1;
  *n = 777;
  STATUS(b->ops->capture_end(b, 0, s, &g, n), want);
  if (want != CACHALOT_OK) {
    assert_null(g);
    EQ(*n, 0);
  } else {
    assert_non_null(g);
  }
  return g;
}

static void capture_counts_launches(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  EQ(capture_of(b, s), -1);
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  EQ(capture_of(b, s), 1);
  launch_n(b, s, 5);
  EQ(submitted(b, s), 0); /* captured launches are nodes, not work */
  size_t n = 0;
  cl_graph *g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 5);
  EQ(capture_of(b, s), -1);
  EQ(submitted(b, s), 0);

  /* a second capture gets the next id and counts from 0 again */
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_RELAXED));
  EQ(capture_of(b, s), 2);
  launch_n(b, s, 2);
  cl_graph *g2 = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 2);
  b->ops->graph_destroy(b, g);
  b->ops->graph_destroy(b, g2);
  b->ops->graph_destroy(b, g2); /* a second destroy is ignored */
  b->ops->stream_destroy(b, s);
  cachalot_backend_destroy(b);
}

static void empty_capture(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  size_t n = 0;
  cl_graph *g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 0);
  cl_graph_exec *x = NULL;
  OK(b->ops->graph_instantiate(b, 0, g, &x));
  assert_non_null(x);
  OK(b->ops->graph_launch(b, 0, x, s));
  EQ(submitted(b, s), 0);
  b->ops->graph_exec_destroy(b, x);
  b->ops->graph_destroy(b, g);
  cachalot_backend_destroy(b);
}

static void replay_enqueues_nodes(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0), t = op_stream(b, 0);
  void *p = NULL;
  OK(b->ops->alloc(b, 0, 4096, &p));
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  launch_n(b, s, 3);
  OK(b->ops->memcpy_async(b, 0, p, (char *)p + 1024, 512, s));
  OK(b->ops->memcpy_async(b, 0, p, (char *)p + 1024, 0, s)); /* 0 bytes: no node */
  size_t n = 0;
  cl_graph *g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 4);
  cl_graph_exec *x = NULL;
  OK(b->ops->graph_instantiate(b, 0, g, &x));
  b->ops->graph_destroy(b, g); /* the instance outlives its graph */

  OK(b->ops->graph_launch(b, 0, x, s));
  EQ(submitted(b, s), 4);
  cl_event *e = NULL;
  OK(b->ops->event_record(b, 0, s, &e));
  EQ(submitted(b, s), 5);
  assert_false(event_done(b, e));
  OK(b->ops->graph_launch(b, 0, x, t));
  EQ(submitted(b, t), 4);
  EQ(submitted(b, s), 5);
  OK(b->ops->stream_sync(b, 0, s));
  assert_true(event_done(b, e));
  OK(b->ops->graph_launch(b, 0, x, s));
  OK(b->ops->graph_launch(b, 0, x, NULL));
  EQ(submitted(b, s), 9);
  EQ(submitted(b, NULL), 4);
  b->ops->event_release(b, e);
  b->ops->graph_exec_destroy(b, x);
  STATUS(b->ops->graph_launch(b, 0, x, s), CACHALOT_ERROR_INVALID_ARGUMENT); /* destroyed instance */
  CONTAINS(cachalot_last_error(), "not a live simulated graph instance");
  OK(b->ops->free(b, 0, p));
  cachalot_backend_destroy(b);
}

static void launch_outside_capture_is_work(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  OK(cachalot_sim_launch(b, s));
  EQ(submitted(b, s), 1);
  cl_event *e = NULL;
  OK(b->ops->event_record(b, 0, s, &e));
  EQ(submitted(b, s), 2);
  assert_false(event_done(b, e));
  OK(cachalot_sim_stream_complete(b, s));
  assert_true(event_done(b, e));
  b->ops->event_release(b, e);
  /* NULL is device 0's default stream */
  OK(cachalot_sim_launch(b, NULL));
  EQ(submitted(b, NULL), 1);
  STATUS(cachalot_sim_launch(b, (cachalot_stream)(uintptr_t)0x40), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "unknown simulated stream");
  cachalot_backend_destroy(b);

  /* complete_immediately: work is done as soon as it is enqueued */
  b = sim_new(1, true);
  s = op_stream(b, 0);
  OK(cachalot_sim_launch(b, s));
  OK(b->ops->event_record(b, 0, s, &e));
  assert_true(event_done(b, e));
  b->ops->event_release(b, e);
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  launch_n(b, s, 2);
  size_t n = 0;
  cl_graph *g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 2);
  cl_graph_exec *x = NULL;
  OK(b->ops->graph_instantiate(b, 0, g, &x));
  OK(b->ops->graph_launch(b, 0, x, s));
  EQ(submitted(b, s), 4);
  OK(b->ops->event_record(b, 0, s, &e));
  assert_true(event_done(b, e));
  b->ops->event_release(b, e);
  /* leaks on purpose: the backend frees the graph and the instance nobody destroyed */
  cachalot_backend_destroy(b);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void side_stream_joins_and_dot(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream o = op_stream(b, 0), side = op_stream(b, 0);
  void *p = NULL;
  OK(b->ops->alloc(b, 0, 4096, &p));
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  int64_t id = capture_of(b, o);
  EQ(id, 1);
  OK(cachalot_sim_launch(b, o)); /* n0 */
  OK(b->ops->stream_wait(b, 0, side, o));
  EQ(capture_of(b, side), id); /* joined: the routing filter "capturing with my id" matches it */
  OK(b->ops->memcpy_async(b, 0, p, (char *)p + 64, 64, side)); /* n1, after n0 */
  OK(cachalot_sim_launch(b, o));                                /* n2, after n0 */
  OK(b->ops->stream_wait(b, 0, o, side));                       /* join back */
  EQ(capture_of(b, side), id);
  OK(cachalot_sim_launch(b, o)); /* n3, after n2 and n1 */
  /* an event recorded on the joined stream is captured, like one on the origin */
  cl_event *e = NULL;
  OK(b->ops->event_record(b, 0, side, &e));
  bool done = false;
  STATUS(b->ops->event_query(b, e, &done), CACHALOT_ERROR_DEVICE);
  b->ops->event_release(b, e);
  size_t n = 0;
  cl_graph *g = end_capture(b, o, CACHALOT_OK, &n);
  EQ(n, 4);
  EQ(capture_of(b, o), -1);
  EQ(capture_of(b, side), -1); /* the joined stream left the capture with it */
  EQ(submitted(b, side), 0);

  char path[128];
  snprintf(path, sizeof path, "/tmp/cachalot_test_sim_graph_%ld.dot", (long)getpid());
  OK(b->ops->graph_debug_dot(b, g, path));
  STR_EQ(read_file(path), "digraph cachalot_sim_graph {\n"
                          "  label=\"capture 1, 4 nodes\";\n"
                          "  n0 [label=\"kernel\"];\n"
                          "  n1 [label=\"memcpy\"];\n"
                          "  n2 [label=\"kernel\"];\n"
                          "  n3 [label=\"kernel\"];\n"
                          "  n0 -> n1;\n"
                          "  n0 -> n2;\n"
                          "  n2 -> n3;\n"
                          "  n1 -> n3;\n"
                          "}\n");
  unlink(path);
  STATUS(b->ops->graph_debug_dot(b, g, "/nonexistent-dir-cachalot/x.dot"), CACHALOT_ERROR_INVALID_ARGUMENT);
  STR_EQ(cachalot_last_error(), "simulated graph debug dot: cannot open '/nonexistent-dir-cachalot/x.dot' for "
                                "writing: No such file or directory");
  STATUS(b->ops->graph_debug_dot(b, NULL, path), CACHALOT_ERROR_INVALID_ARGUMENT);

  /* an empty graph is a valid, empty digraph */
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  cl_graph *g0 = end_capture(b, o, CACHALOT_OK, &n);
  OK(b->ops->graph_debug_dot(b, g0, path));
  STR_EQ(read_file(path), "digraph cachalot_sim_graph {\n  label=\"capture 2, 0 nodes\";\n}\n");
  unlink(path);
  b->ops->graph_destroy(b, g0);
  b->ops->graph_destroy(b, g);
  OK(b->ops->free(b, 0, p));
  cachalot_backend_destroy(b);
}

static void unjoined_fork_fails(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream o = op_stream(b, 0), side = op_stream(b, 0);
  size_t n = 0;

  /* work on the side stream that the origin never waits for */
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, o));
  OK(b->ops->stream_wait(b, 0, side, o));
  OK(cachalot_sim_launch(b, side));
  end_capture(b, o, CACHALOT_ERROR_INVALID_STATE, &n);
  CONTAINS(cachalot_last_error(), "simulated capture end: capture sequence contains a fork that was not joined to "
                                  "the primary stream (1 of the 2 nodes of capture 1 are not waited on by stream 0x");
  CONTAINS(cachalot_last_error(), "); it is ended, with no graph");
  EQ(capture_of(b, o), -1);
  EQ(capture_of(b, side), -1); /* the capture is over for every member, as in CUDA */
  OK(cachalot_sim_launch(b, side));
  EQ(submitted(b, side), 1);

  /* joined back, then more side work after the join: unjoined again */
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, o));
  OK(b->ops->stream_wait(b, 0, side, o));
  OK(cachalot_sim_launch(b, side));
  OK(b->ops->stream_wait(b, 0, o, side));
  OK(cachalot_sim_launch(b, side));
  end_capture(b, o, CACHALOT_ERROR_INVALID_STATE, &n);
  CONTAINS(cachalot_last_error(), "(1 of the 3 nodes of capture 2 are not waited on");

  /* a fork with no work of its own needs no join (CUDA accepts it too) */
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, o));
  OK(b->ops->stream_wait(b, 0, side, o));
  OK(cachalot_sim_launch(b, o));
  cl_graph *g = end_capture(b, o, CACHALOT_OK, &n);
  EQ(n, 2);
  b->ops->graph_destroy(b, g);

  /* the public end shares the rule */
  OK(cachalot_sim_capture_begin(b, o, CACHALOT_CAPTURE_GLOBAL));
  OK(b->ops->stream_wait(b, 0, side, o));
  OK(cachalot_sim_launch(b, side));
  STATUS(cachalot_sim_capture_end(b, o), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "cachalot_sim_capture_end: capture sequence contains a fork");
  EQ(capture_of(b, o), -1);
  cachalot_backend_destroy(b);
}

static void capture_argument_and_state_errors(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(2, false);
  cachalot_stream s = op_stream(b, 0), s1 = op_stream(b, 1);
  size_t n = 0;
  STATUS(b->ops->capture_begin(b, 0, NULL, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_ARGUMENT);
  STR_EQ(cachalot_last_error(), "CUDA graphs must be captured on a non-default stream");
  STATUS(b->ops->capture_begin(b, 0, s, (cachalot_capture_mode)7), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(b->ops->capture_begin(b, 0, s1, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "belongs to device 1, not device 0");
  STATUS(b->ops->capture_begin(b, 0, (cachalot_stream)(uintptr_t)0x40, CACHALOT_CAPTURE_GLOBAL),
         CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "unknown simulated stream 0x40");
  end_capture(b, s, CACHALOT_ERROR_INVALID_STATE, &n);
  CONTAINS(cachalot_last_error(), "is not capturing");
  end_capture(b, NULL, CACHALOT_ERROR_INVALID_ARGUMENT, &n);

  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  STATUS(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "is already capturing (capture 1)");
  /* the public begin is the same capture state */
  STATUS(cachalot_sim_capture_begin(b, s, CACHALOT_CAPTURE_GLOBAL), CACHALOT_ERROR_INVALID_STATE);
  CONTAINS(cachalot_last_error(), "cachalot_sim_capture_begin: stream 0x");
  cl_graph *g = NULL;
  STATUS(b->ops->capture_end(b, 0, s, &g, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(g);
  EQ(capture_of(b, s), 1); /* still capturing */
  OK(cachalot_sim_launch(b, s));
  g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 1);
  b->ops->graph_destroy(b, g);

  /* the public begin and the op end share the capture */
  OK(cachalot_sim_capture_begin(b, s, CACHALOT_CAPTURE_THREAD_LOCAL));
  launch_n(b, s, 3);
  g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 3);
  cl_graph_exec *x = (cl_graph_exec *)(uintptr_t)1;
  STATUS(b->ops->graph_instantiate(b, 0, NULL, &x), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_null(x);
  STATUS(b->ops->graph_instantiate(b, 2, g, &x), CACHALOT_ERROR_INVALID_ARGUMENT);
  b->ops->graph_destroy(b, g);
  STATUS(b->ops->graph_instantiate(b, 0, g, &x), CACHALOT_ERROR_INVALID_ARGUMENT); /* destroyed graph */
  CONTAINS(cachalot_last_error(), "is not a live simulated graph");

  STATUS(b->ops->memcpy_async(b, 0, NULL, &n, 8, s), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(b->ops->memcpy_async(b, 0, &n, &n, 8, s1), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(b->ops->stream_sync(b, 0, (cachalot_stream)(uintptr_t)0x40), CACHALOT_ERROR_INVALID_ARGUMENT);
  cachalot_backend_destroy(b);
}

/* Ending on a stream that only joined the capture: cudaErrorStreamCaptureUnmatched, and the capture is
 * invalidated; work and events on it then fail, and the origin's end fails with no graph. */
static void end_on_joined_stream_invalidates(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream o = op_stream(b, 0), side = op_stream(b, 0);
  size_t n = 0;
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, o));
  OK(b->ops->stream_wait(b, 0, side, o));
  end_capture(b, side, CACHALOT_ERROR_INVALID_STATE, &n);
  CONTAINS(cachalot_last_error(), "capture was not initiated in this stream");
  EQ(capture_of(b, o), 0); /* capturing, invalidated: id 0, as CUDA reports it */
  EQ(capture_of(b, side), 0);
  STATUS(cachalot_sim_launch(b, o), CACHALOT_ERROR_DEVICE);
  STR_EQ(cachalot_last_error(), "cachalot_sim_launch: operation failed due to a previous error during capture");
  cl_event *e = NULL;
  STATUS(b->ops->event_record(b, 0, o, &e), CACHALOT_ERROR_DEVICE);
  assert_null(e);
  STATUS(b->ops->stream_wait(b, 0, side, o), CACHALOT_ERROR_DEVICE);
  end_capture(b, o, CACHALOT_ERROR_DEVICE, &n);
  STR_EQ(cachalot_last_error(),
         "simulated capture end: operation failed due to a previous error during capture (capture 1 was "
         "invalidated; no graph)");
  EQ(capture_of(b, o), -1);
  EQ(capture_of(b, side), -1);
  cachalot_backend_destroy(b);
}

static void merge_and_isolation_invalidate(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream o1 = op_stream(b, 0), o2 = op_stream(b, 0), plain = op_stream(b, 0);
  size_t n = 0;
  OK(b->ops->capture_begin(b, 0, o1, CACHALOT_CAPTURE_GLOBAL));
  OK(b->ops->capture_begin(b, 0, o2, CACHALOT_CAPTURE_RELAXED));
  EQ(capture_of(b, o1), 1);
  EQ(capture_of(b, o2), 2);
  STATUS(b->ops->stream_wait(b, 0, o1, o2), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "merge of two independent capture sequences");
  EQ(capture_of(b, o1), 0);
  EQ(capture_of(b, o2), 0);
  end_capture(b, o1, CACHALOT_ERROR_DEVICE, &n);
  end_capture(b, o2, CACHALOT_ERROR_DEVICE, &n);

  OK(cachalot_sim_launch(b, plain));
  OK(b->ops->capture_begin(b, 0, o1, CACHALOT_CAPTURE_GLOBAL));
  STATUS(b->ops->stream_wait(b, 0, o1, plain), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "dependency created on uncaptured work in another stream");
  EQ(capture_of(b, o1), 0);
  end_capture(b, o1, CACHALOT_ERROR_DEVICE, &n);

  /* the default stream cannot join a capture */
  OK(b->ops->capture_begin(b, 0, o1, CACHALOT_CAPTURE_GLOBAL));
  STATUS(b->ops->stream_wait(b, 0, NULL, o1), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "the default stream cannot join capture 4");
  EQ(capture_of(b, NULL), -1);
  EQ(capture_of(b, o1), 4);
  cl_graph *g = end_capture(b, o1, CACHALOT_OK, &n);
  EQ(n, 0);
  b->ops->graph_destroy(b, g);

  /* outside a capture a wait only checks its streams */
  OK(b->ops->stream_wait(b, 0, o1, plain));
  OK(b->ops->stream_wait(b, 0, NULL, plain));
  OK(b->ops->stream_wait(b, 0, plain, plain));
  EQ(submitted(b, o1), 0);
  EQ(submitted(b, plain), 1);
  STATUS(b->ops->stream_wait(b, 0, o1, (cachalot_stream)(uintptr_t)0x40), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(b->ops->stream_wait(b, 0, (cachalot_stream)(uintptr_t)0x40, o1), CACHALOT_ERROR_INVALID_ARGUMENT);
  cachalot_backend_destroy(b);
}

static void sync_and_graph_launch_in_capture_invalidate(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  size_t n = 0;
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, s));
  STATUS(b->ops->stream_sync(b, 0, s), CACHALOT_ERROR_DEVICE);
  CONTAINS(cachalot_last_error(), "operation not permitted when stream is capturing");
  EQ(capture_of(b, s), 0);
  end_capture(b, s, CACHALOT_ERROR_DEVICE, &n);

  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, s));
  cl_graph *g = end_capture(b, s, CACHALOT_OK, &n);
  cl_graph_exec *x = NULL;
  OK(b->ops->graph_instantiate(b, 0, g, &x));
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  STATUS(b->ops->graph_launch(b, 0, x, s), CACHALOT_ERROR_DEVICE);
  EQ(capture_of(b, s), 0);
  end_capture(b, s, CACHALOT_ERROR_DEVICE, &n);
  EQ(submitted(b, s), 0);

  /* after the failed captures the stream works as before */
  OK(b->ops->graph_launch(b, 0, x, s));
  EQ(submitted(b, s), 1);
  cl_event *e = NULL;
  OK(b->ops->event_record(b, 0, s, &e));
  assert_false(event_done(b, e));
  OK(b->ops->stream_sync(b, 0, s));
  assert_true(event_done(b, e));
  b->ops->event_release(b, e);
  b->ops->graph_exec_destroy(b, x);
  b->ops->graph_destroy(b, g);
  cachalot_backend_destroy(b);
}

typedef struct {
  cachalot_backend *b;
  cachalot_stream s;
  cachalot_capture_mode mode; /* the thread's capture mode */
  cachalot_status end, alloc;
  size_t n;
} thread_job;

static void *other_thread_end(void *arg) {
  thread_job *j = arg;
  cl_graph *g = NULL;
  j->end = j->b->ops->capture_end(j->b, 0, j->s, &g, &j->n);
  if (g)
    j->b->ops->graph_destroy(j->b, g);
  return NULL;
}

static void *other_thread_alloc(void *arg) {
  thread_job *j = arg;
  cachalot_capture_mode m = j->mode;
  if (j->b->ops->capture_mode_exchange(j->b, &m) != CACHALOT_OK)
    return NULL;
  void *p = NULL;
  j->alloc = j->b->ops->alloc(j->b, 0, 1024, &p);
  if (p && j->b->ops->free(j->b, 0, p) != CACHALOT_OK)
    j->alloc = CACHALOT_ERROR_INVALID_STATE;
  return NULL;
}

static void run_thread(void *(*fn)(void *), thread_job *j) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, j), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

static void wrong_thread_end(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  OK(cachalot_sim_launch(b, s));
  thread_job j = {.b = b, .s = s, .end = CACHALOT_OK};
  run_thread(other_thread_end, &j);
  EQ(j.end, CACHALOT_ERROR_INVALID_STATE);
  EQ(capture_of(b, s), -1); /* ended, as cudaStreamEndCapture does on the wrong thread */
  /* the GLOBAL capture no longer prohibits allocations */
  void *p = NULL;
  OK(b->ops->alloc(b, 0, 1024, &p));
  OK(b->ops->free(b, 0, p));

  /* a RELAXED capture may be ended by any thread */
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_RELAXED));
  launch_n(b, s, 2);
  j.end = CACHALOT_ERROR_DEVICE;
  run_thread(other_thread_end, &j);
  EQ(j.end, CACHALOT_OK);
  EQ(j.n, 2);
  EQ(capture_of(b, s), -1);
  cachalot_backend_destroy(b);
}

/* A device allocation while a GLOBAL capture is underway fails unless the thread is RELAXED; a
 * THREAD_LOCAL capture only constrains its own thread. The refusal does not break the capture (CUDA
 * would invalidate it; the simulation does not). */
static void capture_mode_rules(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  void *p = NULL;
  size_t n = 0;

  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_GLOBAL));
  STATUS(b->ops->alloc(b, 0, 1024, &p), CACHALOT_ERROR_DEVICE);
  STR_EQ(cachalot_last_error(), "operation not permitted when stream is capturing");
  assert_null(p);
  cachalot_capture_mode m = CACHALOT_CAPTURE_RELAXED;
  OK(b->ops->capture_mode_exchange(b, &m));
  EQ(m, CACHALOT_CAPTURE_GLOBAL);
  OK(b->ops->alloc(b, 0, 1024, &p));
  OK(b->ops->free(b, 0, p));
  OK(b->ops->capture_mode_exchange(b, &m));
  EQ(m, CACHALOT_CAPTURE_RELAXED);
  thread_job j = {.b = b, .mode = CACHALOT_CAPTURE_GLOBAL, .alloc = CACHALOT_OK};
  run_thread(other_thread_alloc, &j);
  EQ(j.alloc, CACHALOT_ERROR_DEVICE);
  j.mode = CACHALOT_CAPTURE_THREAD_LOCAL;
  run_thread(other_thread_alloc, &j);
  EQ(j.alloc, CACHALOT_OK);
  OK(cachalot_sim_launch(b, s));
  cl_graph *g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 1);
  b->ops->graph_destroy(b, g);
  OK(b->ops->alloc(b, 0, 1024, &p));
  OK(b->ops->free(b, 0, p));

  /* THREAD_LOCAL: this thread is refused, a GLOBAL-mode thread elsewhere is not */
  OK(b->ops->capture_begin(b, 0, s, CACHALOT_CAPTURE_THREAD_LOCAL));
  STATUS(b->ops->alloc(b, 0, 1024, &p), CACHALOT_ERROR_DEVICE);
  j.mode = CACHALOT_CAPTURE_GLOBAL;
  j.alloc = CACHALOT_ERROR_DEVICE;
  run_thread(other_thread_alloc, &j);
  EQ(j.alloc, CACHALOT_OK);
  /* a side stream joined into the capture does not count as a second capture */
  cachalot_stream side = op_stream(b, 0);
  OK(b->ops->stream_wait(b, 0, side, s));
  run_thread(other_thread_alloc, &j);
  EQ(j.alloc, CACHALOT_OK);
  g = end_capture(b, s, CACHALOT_OK, &n);
  EQ(n, 0);
  b->ops->graph_destroy(b, g);
  OK(b->ops->alloc(b, 0, 1024, &p));
  OK(b->ops->free(b, 0, p));
  cachalot_backend_destroy(b);
}

static void stream_destroy_keeps_events(void **state) {
  (void)state;
  cachalot_backend *b = sim_new(1, false);
  cachalot_stream s = op_stream(b, 0);
  OK(cachalot_sim_launch(b, s));
  cl_event *e = NULL;
  OK(b->ops->event_record(b, 0, s, &e));
  b->ops->stream_destroy(b, s);
  b->ops->stream_destroy(b, s); /* twice: ignored */
  STATUS(b->ops->stream_check(b, s), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "was destroyed");
  STATUS(cachalot_sim_launch(b, s), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(b->ops->stream_sync(b, 0, s), CACHALOT_ERROR_INVALID_ARGUMENT);
  cl_event *e2 = NULL;
  STATUS(b->ops->event_record(b, 0, s, &e2), CACHALOT_ERROR_INVALID_ARGUMENT);
  /* the event recorded before stays valid and completes with the stream's work */
  assert_false(event_done(b, e));
  EQ(submitted(b, s), 2);
  OK(cachalot_sim_stream_complete(b, s));
  assert_true(event_done(b, e));
  b->ops->event_release(b, e);

  /* destroying a capture's origin abandons the capture: its GLOBAL mode stops prohibiting allocations */
  cachalot_stream o = op_stream(b, 0), side = op_stream(b, 0);
  OK(b->ops->capture_begin(b, 0, o, CACHALOT_CAPTURE_GLOBAL));
  OK(b->ops->stream_wait(b, 0, side, o));
  void *p = NULL;
  STATUS(b->ops->alloc(b, 0, 1024, &p), CACHALOT_ERROR_DEVICE);
  b->ops->stream_destroy(b, o);
  EQ(capture_of(b, side), -1);
  OK(b->ops->alloc(b, 0, 1024, &p));
  OK(b->ops->free(b, 0, p));

  /* a destroyed side stream stays in the capture: its unjoined work still fails the end (as in CUDA) */
  cachalot_stream o2 = op_stream(b, 0);
  size_t n = 0;
  OK(b->ops->capture_begin(b, 0, o2, CACHALOT_CAPTURE_GLOBAL));
  OK(b->ops->stream_wait(b, 0, side, o2));
  OK(cachalot_sim_launch(b, side));
  b->ops->stream_destroy(b, side);
  end_capture(b, o2, CACHALOT_ERROR_INVALID_STATE, &n);
  CONTAINS(cachalot_last_error(), "not joined");
  b->ops->stream_destroy(b, NULL);
  b->ops->stream_destroy(b, (cachalot_stream)(uintptr_t)0x40);
  cachalot_backend_destroy(b);
}

/* A device free (cudaFree's implicit synchronization) completes what every stream of that device had
 * submitted, and nothing submitted after it, nor any other device's work; with thousands of streams it
 * costs what it costs with one (it no longer walks them). */
static void device_free_completes_its_streams(void **state) {
  (void)state;
  enum { N = 3000 };
  cachalot_backend *b = sim_new(2, false);
  cachalot_stream *s = malloc(N * sizeof *s);
  assert_non_null(s);
  cl_event **before = malloc(N * sizeof *before);
  assert_non_null(before);
  for (int i = 0; i < N; i++) {
    s[i] = op_stream(b, 0);
    OK(cachalot_sim_launch(b, s[i]));
    OK(b->ops->event_record(b, 0, s[i], &before[i]));
  }
  cachalot_stream other = op_stream(b, 1);
  cl_event *on_other = NULL;
  OK(b->ops->event_record(b, 1, other, &on_other));
  void *p = NULL, *q = NULL;
  OK(b->ops->alloc(b, 0, 1024, &p));
  OK(b->ops->alloc(b, 0, 1024, &q));
  OK(cachalot_sim_launch(b, s[7])); /* submitted before the free: completed by it */
  OK(b->ops->free(b, 0, p));
  cl_event *after = NULL;
  OK(b->ops->event_record(b, 0, s[7], &after)); /* after it: not */
  for (int i = 0; i < N; i++)
    assert_true(event_done(b, before[i]));
  EQ(submitted(b, s[7]), 4);
  assert_false(event_done(b, after));
  assert_false(event_done(b, on_other));
  OK(b->ops->free(b, 0, q)); /* the next synchronization completes it */
  assert_true(event_done(b, after));
  assert_false(event_done(b, on_other));
  for (int i = 0; i < N; i++)
    b->ops->event_release(b, before[i]);
  b->ops->event_release(b, after);
  b->ops->event_release(b, on_other);
  free(before);
  free(s);
  cachalot_backend_destroy(b);
}

static void public_controls_reject_other_backends(void **state) {
  (void)state;
  cachalot_backend fake = {0};
  static const cl_backend_ops other = {.name = "other"};
  fake.ops = &other;
  uint64_t n = 5;
  STATUS(cachalot_sim_launch(&fake, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  CONTAINS(cachalot_last_error(), "not a simulated backend");
  STATUS(cachalot_sim_stream_submitted(&fake, NULL, &n), CACHALOT_ERROR_INVALID_ARGUMENT);
  EQ(n, 0);
  STATUS(cachalot_sim_launch(NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  cachalot_backend *b = sim_new(1, false);
  STATUS(cachalot_sim_stream_submitted(b, NULL, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  cachalot_backend_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(capture_counts_launches),
      cmocka_unit_test(empty_capture),
      cmocka_unit_test(replay_enqueues_nodes),
      cmocka_unit_test(launch_outside_capture_is_work),
      cmocka_unit_test(side_stream_joins_and_dot),
      cmocka_unit_test(unjoined_fork_fails),
      cmocka_unit_test(capture_argument_and_state_errors),
      cmocka_unit_test(end_on_joined_stream_invalidates),
      cmocka_unit_test(merge_and_isolation_invalidate),
      cmocka_unit_test(sync_and_graph_launch_in_capture_invalidate),
      cmocka_unit_test(wrong_thread_end),
      cmocka_unit_test(capture_mode_rules),
      cmocka_unit_test(stream_destroy_keeps_events),
      cmocka_unit_test(device_free_completes_its_streams),
      cmocka_unit_test(public_controls_reject_other_backends),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
