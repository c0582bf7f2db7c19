/* Memory history and snapshots (torch.cuda.memory._snapshot()) on the simulated device: the ring buffer's
 * order when it wraps, block states and pool ids in the snapshot, call stacks, and every current stat
 * recomputed from the snapshot after seeded random sequences. The JSON is read with cJSON. */
#include "helpers.h"

#include <cachalot/pool.h>
#include <cachalot/snapshot.h>
#include <cjson/cJSON.h>
#include <dlfcn.h>

#include "stats/symbolize.h"

#include <stdlib.h>
#include <string.h>

static cJSON *snapshot(cachalot_allocator *a) {
  char *text = NULL;
  OK(cachalot_snapshot_json(a, &text));
  assert_non_null(text);
  cJSON *doc = cJSON_Parse(text);
  if (!doc)
    fail_msg("the snapshot is not valid JSON: %.200s", text);
  free(text);
  return doc;
}

static cJSON *trace_of(cJSON *doc, int device) {
  cJSON *traces = cJSON_GetObjectItemCaseSensitive(doc, "device_traces");
  assert_true(cJSON_IsArray(traces));
  cJSON *t = cJSON_GetArrayItem(traces, device);
  assert_true(cJSON_IsArray(t));
  return t;
}

static const char *str(cJSON *o, const char *k) {
  cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  assert_true(cJSON_IsString(v));
  return v->valuestring;
}

static double num(cJSON *o, const char *k) {
  cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

static void test_history_off_by_default(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  void *p = ALLOC(e.a, 0, 1000, NULL);
  cJSON *doc = snapshot(e.a);
  assert_int_equal(cJSON_GetArraySize(trace_of(doc, 0)), 0);
  cJSON_Delete(doc);
  STATUS(cachalot_record_history(e.a, true, 0), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_record_history(NULL, true, 4), CACHALOT_ERROR_INVALID_ARGUMENT);
  STATUS(cachalot_snapshot_json(e.a, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  FREE(e.a, p);
  env_free(&e);
}

static void test_ring_wraps_oldest_first(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  cachalot_stream s = STREAM(e.b, 0);
  OK(cachalot_record_history(e.a, true, 5));
  /* segment_alloc, alloc(100), alloc(200), alloc(300), free_requested(200), free_completed(200), snapshot:
   * seven entries in a ring of five keep the last five */
  void *a = ALLOC(e.a, 0, 100, s), *b = ALLOC(e.a, 0, 200, s), *c = ALLOC(e.a, 0, 300, s);
  FREE(e.a, b);
  cJSON *doc = snapshot(e.a);
  cJSON *t = trace_of(doc, 0);
  assert_int_equal(cJSON_GetArraySize(t), 5);
  const char *want[] = {"alloc", "alloc", "free_requested", "free_completed", "snapshot"};
  const double sizes[] = {200, 300, 200, 200, 1024}; /* snapshot: the active bytes (two 512 B blocks) */
  double last_time = 0;
  for (int i = 0; i < 5; i++) {
    cJSON *en = cJSON_GetArrayItem(t, i);
    assert_string_equal(str(en, "action"), want[i]);
    assert_true(num(en, "size") == sizes[i]);
    assert_true(num(en, "time_us") >= last_time);
    last_time = num(en, "time_us");
    assert_true(num(en, "stream") == (double)(uintptr_t)(i < 4 ? s : NULL));
  }
  assert_true(num(cJSON_GetArrayItem(t, 0), "addr") == (double)(uintptr_t)b);
  cJSON_Delete(doc);
  /* turning it on again clears it; turning it off stops it */
  OK(cachalot_record_history(e.a, true, 5));
  FREE(e.a, a);
  OK(cachalot_record_history(e.a, false, 0));
  FREE(e.a, c);
  doc = snapshot(e.a);
  assert_int_equal(cJSON_GetArraySize(trace_of(doc, 0)), 0);
  cJSON_Delete(doc);
  env_free(&e);
}

/* An oom entry names the device's free bytes "device_free", as PyTorch's snapshots do (its viewer reads
 * that key), and has no "addr". */
static void test_oom_entry_keys(void **state) {
  (void)state;
  env e = ENV(1, 64 * MiB, "");
  cachalot_stream s = STREAM(e.b, 0);
  OK(cachalot_record_history(e.a, true, 16));
  void *p = ALLOC(e.a, 0, 20 * MiB, s); /* reserves 20 MiB: 44 MiB stay free on the device */
  void *q = NULL;
  STATUS(cachalot_malloc(e.a, 0, 100 * MiB, s, &q), CACHALOT_ERROR_OUT_OF_MEMORY);
  cJSON *doc = snapshot(e.a);
  cJSON *t = trace_of(doc, 0), *oom = NULL, *en = NULL;
  cJSON_ArrayForEach(en, t) {
    if (strcmp(str(en, "action"), "oom") == 0)
      oom = en;
  }
  assert_non_null(oom);
  assert_true(num(oom, "device_free") == (double)(44 * MiB));
  assert_true(num(oom, "size") == (double)(100 * MiB));
  assert_null(cJSON_GetObjectItemCaseSensitive(oom, "addr"));
  assert_true(num(cJSON_GetArrayItem(t, 1), "addr") == (double)(uintptr_t)p); /* the alloc keeps addr */
  cJSON_Delete(doc);
  FREE(e.a, p);
  CHECK(e.a);
  env_free(&e);
}

static bool only(cachalot_stream s, void *ctx) { return s == (cachalot_stream)ctx; }

static void test_states_pools_settings(void **state) {
  (void)state;
  env e = ENV(1, 0, "max_split_size_mb:40,roundup_power2_divisions:4");
  cachalot_stream s = STREAM(e.b, 0), side = STREAM(e.b, 0), cap = STREAM(e.b, 0);
  OK(cachalot_record_history(e.a, true, 100));
  OK(cachalot_record_history_stacks(e.a, true));
  void *p = ALLOC(e.a, 0, 1000, s);
  void *q = ALLOC(e.a, 0, 3 * MiB, s);
  RECORD(e.a, q, side);
  FREE(e.a, q);
  cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
  OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, cap));
  void *r = ALLOC(e.a, 0, 512, cap);
  OK(cachalot_end_allocate_to_pool(e.a, 0, id));
  cJSON *doc = snapshot(e.a);
  cJSON *segs = cJSON_GetObjectItemCaseSensitive(doc, "segments");
  assert_int_equal(cJSON_GetArraySize(segs), 3);
  int seen_pending = 0, seen_pool = 0;
  double last_addr = 0;
  cJSON *seg;
  cJSON_ArrayForEach(seg, segs) {
    assert_true(num(seg, "address") > last_addr); /* address order */
    last_addr = num(seg, "address");
    cJSON *pid = cJSON_GetObjectItemCaseSensitive(seg, "segment_pool_id");
    bool in_pool = cJSON_GetArrayItem(pid, 1)->valuedouble == (double)id.second;
    cJSON *blocks = cJSON_GetObjectItemCaseSensitive(seg, "blocks");
    cJSON *b0 = cJSON_GetArrayItem(blocks, 0);
    if (in_pool) {
      seen_pool++;
      assert_string_equal(str(b0, "state"), "active_allocated");
      assert_true(num(b0, "address") == (double)(uintptr_t)r);
      assert_string_equal(str(seg, "segment_type"), "small");
    } else if (num(seg, "total_size") == 20.0 * MiB) {
      seen_pending++;
      assert_string_equal(str(b0, "state"), "active_pending_free");
      assert_true(num(seg, "allocated_size") == 0);
      assert_true(num(seg, "active_size") == 3.0 * MiB);
      assert_string_equal(str(cJSON_GetArrayItem(blocks, 1), "state"), "inactive");
    } else {
      assert_true(num(b0, "address") == (double)(uintptr_t)p);
      assert_true(num(b0, "requested_size") == 1000);
      assert_true(num(b0, "size") == 1024);
    }
    assert_false(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(seg, "is_expandable")));
  }
  assert_int_equal(seen_pending, 1);
  assert_int_equal(seen_pool, 1);
  /* alloc and free entries carry call stacks, segment entries none */
  cJSON *en;
  int with_frames = 0;
  cJSON_ArrayForEach(en, trace_of(doc, 0)) {
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(en, "frames"));
    const char *act = str(en, "action");
    if (!strcmp(act, "alloc") || !strcmp(act, "free_requested"))
      with_frames += n > 0;
    else
      assert_int_equal(n, 0);
  }
  assert_int_equal(with_frames, 4);
  cJSON *set = cJSON_GetObjectItemCaseSensitive(doc, "allocator_settings");
  assert_string_equal(str(set, "CACHALOT_ALLOC_CONF"), "max_split_size_mb:40,roundup_power2_divisions:4");
  assert_true(num(set, "max_split_size") == 40.0 * MiB);
  cJSON *div = cJSON_GetObjectItemCaseSensitive(set, "roundup_power2_divisions");
  assert_int_equal(cJSON_GetArraySize(div), 16);
  assert_true(num(div, "32768") == 4);
  cJSON_Delete(doc);
  FREE(e.a, p);
  FREE(e.a, r);
  COMPLETE(&e, side);
  OK(cachalot_release_pool(e.a, 0, id));
  EMPTY(e.a);
  env_free(&e);
}

/* Every current stat of §4, recomputed from a snapshot the way the invariant states it. */
static void expect_stats_match_snapshot(cachalot_allocator *a) {
  cJSON *doc = snapshot(a);
  int64_t alloc[3] = {0}, alloc_b[3] = {0}, active[3] = {0}, active_b[3] = {0}, req[3] = {0}, seg[3] = {0},
          res[3] = {0}, split[3] = {0}, split_b[3] = {0};
  cJSON *s;
  cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(doc, "segments")) {
    int k = strcmp(str(s, "segment_type"), "small") ? CACHALOT_STAT_LARGE_POOL : CACHALOT_STAT_SMALL_POOL;
    cJSON *blocks = cJSON_GetObjectItemCaseSensitive(s, "blocks");
    int n = cJSON_GetArraySize(blocks);
    int kinds[2] = {CACHALOT_STAT_ALL, k};
    for (int x = 0; x < 2; x++) {
      seg[kinds[x]]++;
      res[kinds[x]] += (int64_t)num(s, "total_size");
    }
    cJSON *b;
    cJSON_ArrayForEach(b, blocks) {
      const char *st = str(b, "state");
      int64_t size = (int64_t)num(b, "size");
      for (int x = 0; x < 2; x++) {
        if (!strcmp(st, "active_allocated")) {
          alloc[kinds[x]]++;
          alloc_b[kinds[x]] += size;
        }
        if (!strncmp(st, "active_", 7)) {
          active[kinds[x]]++;
          active_b[kinds[x]] += size;
          req[kinds[x]] += (int64_t)num(b, "requested_size");
        } else if (n > 1) {
          split[kinds[x]]++;
          split_b[kinds[x]] += size;
        }
      }
    }
  }
  cJSON_Delete(doc);
  cachalot_device_stats st = STATS(a, 0);
  for (int k = 0; k < 3; k++) {
    EQ(st.allocation[k].current, alloc[k]);
    EQ(st.allocated_bytes[k].current, alloc_b[k]);
    EQ(st.active[k].current, active[k]);
    EQ(st.active_bytes[k].current, active_b[k]);
    EQ(st.requested_bytes[k].current, req[k]);
    EQ(st.segment[k].current, seg[k]);
    EQ(st.reserved_bytes[k].current, res[k]);
    EQ(st.inactive_split[k].current, split[k]);
    EQ(st.inactive_split_bytes[k].current, split_b[k]);
  }
}

static void test_stats_equal_snapshot_random(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 4; seed++) {
    env e = ENV(1, 2 * GiB, seed % 2 ? "" : "max_split_size_mb:20,roundup_power2_divisions:2");
    cachalot_stream s[3] = {STREAM(e.b, 0), STREAM(e.b, 0), STREAM(e.b, 0)};
    cachalot_mempool_id id = cachalot_graph_pool_handle(e.a);
    OK(cachalot_record_history(e.a, true, 64));
    void *live[48] = {0};
    uint64_t x = seed * 0x9E3779B97F4A7C15ull;
    bool routing = false;
    for (int op = 0; op < 3000; op++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      int k = (int)(x % 48), r = (int)((x >> 8) % 100);
      if (r < 2) {
        if (routing)
          OK(cachalot_end_allocate_to_pool(e.a, 0, id));
        else
          OK(cachalot_begin_allocate_to_pool(e.a, 0, id, only, s[2]));
        routing = !routing;
      } else if (r < 5) {
        COMPLETE(&e, s[(x >> 20) % 3]);
      } else if (r < 10 && live[k]) {
        OK(cachalot_record_stream(e.a, live[k], s[(x >> 24) % 3]));
      } else if (live[k]) {
        FREE(e.a, live[k]);
        live[k] = NULL;
      } else {
        size_t size = (size_t)((x >> 30) % (1u << ((x >> 50) % 25))) + 1;
        void *p = NULL;
        if (cachalot_malloc(e.a, 0, size, s[(x >> 40) % 3], &p) == CACHALOT_OK)
          live[k] = p;
      }
      if (op % 500 == 499)
        expect_stats_match_snapshot(e.a);
    }
    expect_stats_match_snapshot(e.a);
    for (int k = 0; k < 48; k++)
      if (live[k])
        FREE(e.a, live[k]);
    if (routing)
      OK(cachalot_end_allocate_to_pool(e.a, 0, id));
    env_free(&e);
  }
}

/* ---- frames: C stacks of live blocks and entries, symbolized when the snapshot is written ------------ */

#if defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE __attribute__((noinline, noclone)) /* no "alloc_here.constprop.0" */
#endif

static int alloc_line, annotate_line;

/* The call sites the frames must name. Each call is on the line recorded beside it, and its result is
 * used after it, so that it is no tail call (whose frame would be gone). */
static NOINLINE void *alloc_here(cachalot_allocator *a, size_t size) {
  void *p = NULL;
  alloc_line = __LINE__; cachalot_status rc = cachalot_malloc(a, 0, size, NULL, &p);
  return rc == CACHALOT_OK ? p : NULL;
}

static NOINLINE cachalot_status annotate_here(cachalot_allocator *a, const char *text) {
  annotate_line = __LINE__; cachalot_status rc = cachalot_annotate(a, 0, text);
  return rc == CACHALOT_OK ? rc : CACHALOT_ERROR_INVALID_STATE;
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && strcmp(s + n - k, tail) == 0;
}

/* The frame of `fn` among `frames`, which the rule of this build says how to write:
 *   libdw:  {"name": "alloc_here", "filename": ".../tests/unit/test_snapshot.c", "line": the call's line};
 *           in a build without debug info (release, plain) the symbol table's name, the executable as
 *           the file, line 0;
 *   dladdr: the executable exports no symbol, so {"name": "0x<return address>", "filename": the executable
 *           as dladdr names it, "line": 0}, the return address inside fn (within its first 512 bytes). */
static void expect_frame(cJSON *frames, void *fn, const char *fn_name, int line) {
  assert_true(cJSON_IsArray(frames));
  int found = 0;
  cJSON *f;
  Dl_info self;
  assert_true(dladdr(fn, &self) != 0);
  cJSON_ArrayForEach(f, frames) {
    const char *name = str(f, "name"), *file = str(f, "filename");
    if (cl_symbolize_has_libdw()) {
      if (strcmp(name, fn_name) != 0)
        continue;
#if TEST_HAVE_DEBUG_INFO
      if (!ends_with(file, "tests/unit/test_snapshot.c"))
        fail_msg("%s's frame names the file %s", fn_name, file);
      assert_int_equal((int)num(f, "line"), line);
#else
      if (!ends_with(file, "/test_snapshot"))
        fail_msg("%s's frame names the file %s, not the executable", fn_name, file);
      assert_int_equal((int)num(f, "line"), 0);
      (void)line;
#endif
      found++;
    } else {
      assert_true(num(f, "line") == 0);
      if (strncmp(name, "0x", 2) != 0)
        continue;
      uintptr_t at = (uintptr_t)strtoull(name + 2, NULL, 16);
      char hex[32];
      snprintf(hex, sizeof hex, "0x%llx", (unsigned long long)at);
      assert_string_equal(name, hex);
      Dl_info info;
      if (at - (uintptr_t)fn < 512 && dladdr((void *)(at - 1), &info) && info.dli_fbase == self.dli_fbase) {
        assert_null(info.dli_sname);
        assert_string_equal(file, info.dli_fname);
        found++;
      }
    }
  }
  assert_int_equal(found, 1);
}

static cJSON *entry_of(cJSON *trace, const char *action, int nth) {
  cJSON *en;
  cJSON_ArrayForEach(en, trace) {
    if (strcmp(str(en, "action"), action) == 0 && nth-- == 0)
      return en;
  }
  fail_msg("no %s entry", action);
  return NULL;
}

static cJSON *block_at(cJSON *doc, void *p) {
  cJSON *seg, *b;
  cJSON_ArrayForEach(seg, cJSON_GetObjectItemCaseSensitive(doc, "segments")) {
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(seg, "blocks")) {
      if (num(b, "address") == (double)(uintptr_t)p)
        return b;
    }
  }
  fail_msg("no block at %p", p);
  return NULL;
}

static void test_frames_name_the_call(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  OK(cachalot_record_history(e.a, true, 100));
  OK(cachalot_record_history_stacks(e.a, true));
  void *p = alloc_here(e.a, 1000), *q = alloc_here(e.a, 3 * MiB);
  assert_non_null(p);
  assert_non_null(q);
  OK(annotate_here(e.a, "phase"));
  CHECK(e.a);
  cJSON *doc = snapshot(e.a);
  cJSON *t = trace_of(doc, 0);
  expect_frame(cJSON_GetObjectItemCaseSensitive(entry_of(t, "alloc", 0), "frames"), (void *)alloc_here,
               "alloc_here", alloc_line);
  expect_frame(cJSON_GetObjectItemCaseSensitive(entry_of(t, "user_defined", 0), "frames"), (void *)annotate_here,
               "annotate_here", annotate_line);
  /* the live blocks carry their alloc's stack: the same frames as their alloc entries */
  char *blk = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(block_at(doc, p), "frames"));
  char *ent = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(entry_of(t, "alloc", 0), "frames"));
  assert_string_equal(blk, ent);
  free(blk);
  free(ent);
  expect_frame(cJSON_GetObjectItemCaseSensitive(block_at(doc, q), "frames"), (void *)alloc_here, "alloc_here",
               alloc_line);
  cJSON_Delete(doc);
  /* a freed block lets go of its stack: its rest is inactive with no frames */
  FREE(e.a, q);
  doc = snapshot(e.a);
  assert_string_equal(str(block_at(doc, q), "state"), "inactive");
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(block_at(doc, q), "frames")), 0);
  assert_true(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(block_at(doc, p), "frames")) > 0);
  cJSON_Delete(doc);
  /* without stacks, blocks handed out later keep none; history off lets go of every block's */
  OK(cachalot_record_history_stacks(e.a, false));
  void *r = alloc_here(e.a, 2000);
  doc = snapshot(e.a);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(block_at(doc, r), "frames")), 0);
  assert_true(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(block_at(doc, p), "frames")) > 0);
  cJSON_Delete(doc);
  /* stacks on again with the ring kept: the entries recorded before stacks went off have no frames (their
   * rows are new), only what is recorded from now on has */
  OK(cachalot_record_history_stacks(e.a, true));
  void *u = alloc_here(e.a, 2500);
  doc = snapshot(e.a);
  t = trace_of(doc, 0);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(entry_of(t, "alloc", 0), "frames")), 0);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(entry_of(t, "alloc", 2), "frames")), 0);
  expect_frame(cJSON_GetObjectItemCaseSensitive(entry_of(t, "alloc", 3), "frames"), (void *)alloc_here,
               "alloc_here", alloc_line);
  cJSON_Delete(doc);
  FREE(e.a, u);
  OK(cachalot_record_history_stacks(e.a, false));
  OK(cachalot_record_history(e.a, false, 0));
  doc = snapshot(e.a);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(block_at(doc, p), "frames")), 0);
  cJSON_Delete(doc);
  CHECK(e.a);
  FREE(e.a, r);
  /* a block freed while still holding its stack, then the allocator destroyed with one held (ASan: no leak) */
  OK(cachalot_record_history(e.a, true, 4));
  OK(cachalot_record_history_stacks(e.a, true));
  void *s = alloc_here(e.a, 4000);
  FREE(e.a, p);
  (void)s;
  CHECK(e.a);
  env_free(&e);
}

/* C++ names are written demangled (the test program is C: the demangler comes from the process or the
 * system's libstdc++). */
static void test_demangle(void **state) {
  (void)state;
  char *d = cl_demangle("_ZN2ns3fooEiPKc");
  assert_non_null(d);
  assert_string_equal(d, "ns::foo(int, char const*)");
  free(d);
  assert_null(cl_demangle("plain_c_name"));
  assert_null(cl_demangle("_Znot a name"));
}

/* ---- annotations: user_defined entries with a "name" ------------------------------------------------- */

static const char *name_of(cJSON *en) { return str(en, "name"); }

static void test_annotate(void **state) {
  (void)state;
  env e = ENV(1, 0, "");
  /* history off: nothing recorded, not an error */
  OK(cachalot_annotate(e.a, 0, "ignored"));
  STATUS(cachalot_annotate(NULL, 0, "x"), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_string_equal(cachalot_last_error(), "cachalot_annotate: allocator is NULL");
  STATUS(cachalot_annotate(e.a, 0, NULL), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_string_equal(cachalot_last_error(), "cachalot_annotate: text is NULL");
  STATUS(cachalot_annotate(e.a, 1, "x"), CACHALOT_ERROR_INVALID_ARGUMENT);
  assert_string_equal(cachalot_last_error(), "cachalot_annotate: device 1 is out of range (the backend has 1 device)");
  STATUS(cachalot_annotate(e.a, -1, "x"), CACHALOT_ERROR_INVALID_ARGUMENT);
  cJSON *doc = snapshot(e.a);
  assert_int_equal(cJSON_GetArraySize(trace_of(doc, 0)), 0);
  cJSON_Delete(doc);

  OK(cachalot_record_history(e.a, true, 8));
  OK(cachalot_annotate(e.a, 0, "phase \"one\"\n\t\x01"));
  char *text = NULL;
  OK(cachalot_snapshot_json(e.a, &text));
  /* the exact entry, escaped; its time is the only value not known beforehand */
  const char *at = strstr(text, "{\"action\":\"user_defined\",\"addr\":0,\"size\":0,\"stream\":0,\"time_us\":");
  assert_non_null(at);
  at = strchr(at + 60, ',');
  assert_non_null(at);
  const char *want = ",\"name\":\"phase \\\"one\\\"\\n\\t\\u0001\",\"frames\":[]},{\"action\":\"snapshot\"";
  assert_memory_equal(at, want, strlen(want));
  free(text);

  /* text that is not UTF-8: each byte that starts no character becomes \ufffd, valid characters stay
   * (the snapshot was JSON Python could not read: 0xff) */
  OK(cachalot_record_history(e.a, true, 8));
  OK(cachalot_annotate(e.a, 0, "x\xff\xfey \xc3\xa9 \xc0\xaf \xed\xa0\x80 \xe2\x82"));
  text = NULL;
  OK(cachalot_snapshot_json(e.a, &text));
  want = "\"name\":\"x\\ufffd\\ufffdy \xc3\xa9 \\ufffd\\ufffd \\ufffd\\ufffd\\ufffd \\ufffd\\ufffd\"";
  if (!strstr(text, want))
    fail_msg("no %s in %.300s", want, text);
  free(text);

  /* the bound: 1023 bytes, cut before a UTF-8 character that would cross it */
  char big[1100];
  memset(big, 'a', sizeof big);
  big[1099] = '\0';
  char want_text[1024];
  memset(want_text, 'a', 1023);
  want_text[1023] = '\0';
  OK(cachalot_record_history(e.a, true, 8)); /* cleared: the texts recorded so far go */
  OK(cachalot_annotate(e.a, 0, big));        /* 1099 ASCII bytes: the first 1023 */
  memcpy(big + 1022, "\xc3\xa9", 2);         /* é at 1022-1023 would cross: cut before it */
  OK(cachalot_annotate(e.a, 0, big));
  memcpy(big + 1020, "\xf0\x9f\x90\xb3", 4); /* a 4-byte character at 1020-1023: cut before it */
  OK(cachalot_annotate(e.a, 0, big));
  memset(big, 'b', 1023);
  big[1023] = '\0';                         /* exactly 1023: kept whole */
  OK(cachalot_annotate(e.a, 0, big));
  doc = snapshot(e.a);
  cJSON *t = trace_of(doc, 0);
  assert_int_equal(cJSON_GetArraySize(t), 5);
  assert_string_equal(name_of(cJSON_GetArrayItem(t, 0)), want_text);
  want_text[1022] = '\0';
  assert_string_equal(name_of(cJSON_GetArrayItem(t, 1)), want_text);
  want_text[1020] = '\0';
  assert_string_equal(name_of(cJSON_GetArrayItem(t, 2)), want_text);
  assert_string_equal(name_of(cJSON_GetArrayItem(t, 3)), big);
  assert_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(t, 4), "name")); /* the snapshot entry */
  cJSON_Delete(doc);

  /* the ring drops the oldest texts (ASan: each freed once); the C structures leave annotations out */
  OK(cachalot_record_history(e.a, true, 3));
  for (int i = 0; i < 10; i++) {
    char s[16];
    snprintf(s, sizeof s, "t%d", i);
    OK(cachalot_annotate(e.a, 0, s));
  }
  void *p = ALLOC(e.a, 0, 1000, NULL);
  cachalot_snapshot_info *info = NULL;
  OK(cachalot_snapshot_take(e.a, true, &info));
  assert_int_equal(info->n_trace, 2); /* the ring holds t9, segment_alloc, alloc: t9 is left out (the
                                        snapshot's own entry comes after the trace is read) */
  assert_int_equal(info->trace[1].action, CACHALOT_TRACE_ALLOC);
  cachalot_snapshot_info_free(e.a, info);
  OK(cachalot_annotate(e.a, 0, "t10"));
  OK(cachalot_annotate(e.a, 0, "t11"));
  doc = snapshot(e.a);
  t = trace_of(doc, 0);
  assert_int_equal(cJSON_GetArraySize(t), 3);
  assert_string_equal(name_of(cJSON_GetArrayItem(t, 0)), "t10");
  assert_string_equal(name_of(cJSON_GetArrayItem(t, 1)), "t11");
  assert_string_equal(str(cJSON_GetArrayItem(t, 2), "action"), "snapshot");
  cJSON_Delete(doc);
  FREE(e.a, p);
  OK(cachalot_annotate(e.a, 0, "kept until destroy"));
  env_free(&e);
}

/* The symbolizer this process must have: libdw where the library has its loader and libdw.so.1 opens here
 * (found by this test on its own, not through the loader), dladdr where TEST_LIBDW_SONAME put a library
 * that is absent or lacks libdw's functions in its place (tests/meson.build). */
static void test_symbolizer_expected(void **state) {
  (void)state;
  bool want = TEST_HAVE_LIBDW_LOADER && !getenv("TEST_LIBDW_SONAME");
  void *lib = want ? dlopen("libdw.so.1", RTLD_LAZY | RTLD_LOCAL) : NULL;
  want = want && lib && dlsym(lib, "dwfl_module_addrinfo");
  if (lib)
    dlclose(lib);
  if (cl_symbolize_has_libdw() != want)
    fail_msg("the symbolizer is %s, expected %s", cl_symbolize_has_libdw() ? "libdw" : "dladdr",
             want ? "libdw" : "dladdr");
  print_message("symbolizer: %s\n", want ? "libdw" : "dladdr");
}

int main(void) {
  /* before anything is symbolized: the loader reads the name once */
  if (getenv("TEST_LIBDW_SONAME"))
    cl_symbolize_libdw_soname(getenv("TEST_LIBDW_SONAME"));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_symbolizer_expected),
      cmocka_unit_test(test_history_off_by_default),
      cmocka_unit_test(test_ring_wraps_oldest_first),
      cmocka_unit_test(test_oom_entry_keys),
      cmocka_unit_test(test_states_pools_settings),
      cmocka_unit_test(test_stats_equal_snapshot_random),
      cmocka_unit_test(test_frames_name_the_call),
      cmocka_unit_test(test_demangle),
      cmocka_unit_test(test_annotate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
