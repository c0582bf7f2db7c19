/* Memory history and snapshots (torch.cuda.memory._snapshot()) on the simulated device: the ring buffer's
 * order when it wraps, block states and pool ids in the snapshot, call stacks, and every current stat
 * recomputed from the snapshot after seeded random sequences. The JSON is read with cJSON. */
#include "helpers.h"

#include <cachalot/pool.h>
#include <cachalot/snapshot.h>
#include <cjson/cJSON.h>

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_history_off_by_default),
      cmocka_unit_test(test_ring_wraps_oldest_first),
      cmocka_unit_test(test_oom_entry_keys),
      cmocka_unit_test(test_states_pools_settings),
      cmocka_unit_test(test_stats_equal_snapshot_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
