/* memory_stats as JSON: one flat object whose keys are exactly torch.cuda.memory_stats()'s
 * for the native allocator (122 of them), dot-joined and sorted in strcmp order, as PyTorch (and
 * Python's sorted()) gives them. The stats are copied under the device lock and written outside it. */
#include "../allocator/internal.h"
#include "../common/json_writer.h"
#include "stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FN "cachalot_memory_stats_json"

enum { KEY_MAX = 64, N_ARRAYS = 9, N_FIELDS = 4, N_COUNTERS = 6 };
enum { N_KEYS = N_ARRAYS * CACHALOT_STAT_TYPES * N_FIELDS + 2 * N_FIELDS + N_COUNTERS }; /* 122 */

typedef struct {
  char key[KEY_MAX];
  int64_t value;
} entry;

typedef struct {
  entry e[N_KEYS];
  int n;
} entries;

static void add(entries *es, const char *key, int64_t value) {
  entry *e = &es->e[es->n++];
  snprintf(e->key, sizeof e->key, "%s", key);
  e->value = value;
}

/* The four fields of one stat under `prefix` ("allocation.all", "oversize_segments"). */
static void add_stat(entries *es, const char *prefix, const cachalot_stat *s) {
  static const char *const fields[N_FIELDS] = {"current", "peak", "allocated", "freed"};
  const int64_t values[N_FIELDS] = {s->current, s->peak, s->allocated, s->freed};
  char key[KEY_MAX];
  for (int f = 0; f < N_FIELDS; f++) {
    /* the longest key, "inactive_split_bytes.large_pool.allocated", is 41 characters */
    if (snprintf(key, sizeof key, "%s.%s", prefix, fields[f]) >= (int)sizeof key)
      abort();
    add(es, key, values[f]);
  }
}

static int by_key(const void *x, const void *y) { return strcmp(((const entry *)x)->key, ((const entry *)y)->key); }

static void collect(const cachalot_device_stats *st, entries *es) {
  static const char *const kinds[CACHALOT_STAT_TYPES] = {"all", "small_pool", "large_pool"};
  const struct {
    const char *name;
    const cachalot_stat *arr;
#define ARRAY(name) {#name, st->name},
  } arrays[] = {CL_STAT_ARRAYS(ARRAY)};
#undef ARRAY
  _Static_assert(sizeof arrays / sizeof arrays[0] == N_ARRAYS, "N_KEYS counts every stat array");
  char prefix[KEY_MAX];
  es->n = 0;
  for (int i = 0; i < N_ARRAYS; i++)
    for (int k = 0; k < CACHALOT_STAT_TYPES; k++) {
      snprintf(prefix, sizeof prefix, "%s.%s", arrays[i].name, kinds[k]);
      add_stat(es, prefix, &arrays[i].arr[k]);
    }
  add_stat(es, "oversize_allocations", &st->oversize_allocations);
  add_stat(es, "oversize_segments", &st->oversize_segments);
  add(es, "num_alloc_retries", st->num_alloc_retries);
  add(es, "num_ooms", st->num_ooms);
  add(es, "num_sync_all_streams", st->num_sync_all_streams);
  add(es, "num_device_alloc", st->num_device_alloc);
  add(es, "num_device_free", st->num_device_free);
  add(es, "max_split_size", st->max_split_size); /* -1 when unlimited, as in the struct and PyTorch */
  qsort(es->e, (size_t)es->n, sizeof es->e[0], by_key);
}

cachalot_status cl_memory_stats_json(cachalot_allocator *a, int device, char **json) {
  if (!json)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, FN ": json is NULL");
  *json = NULL;
  cachalot_status rc = cl_check_device_arg(a, device, FN);
  if (rc != CACHALOT_OK)
    return rc;

  cl_device *d = &a->devices[device];
  cachalot_device_stats st;
  cl_enter_exclusive(d);
  st = d->stats;
  cl_leave_exclusive(d);

  entries *es = malloc(sizeof *es);
  if (!es)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, FN ": host out of memory");
  collect(&st, es);

  cl_json j;
  cl_json_init(&j);
  cl_json_begin_object(&j);
  for (int i = 0; i < es->n; i++) {
    cl_json_key(&j, es->e[i].key);
    cl_json_int(&j, es->e[i].value);
  }
  cl_json_end_object(&j);
  free(es);
  char *out = cl_json_finish(&j);
  if (!out)
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, FN ": host out of memory");
  *json = out;
  return CACHALOT_OK;
}

cachalot_status cachalot_memory_stats_json(cachalot_allocator *a, int device, char **json) {
  return cl_memory_stats_json(a, device, json);
}
