/* The snapshot's schema: the parsed JSON tree checked field by field into the model of
 * snapshot_reader.h, every message naming the JSON path of what is wrong. The text itself is checked in
 * snapshot_json.c, the file read in snapshot_file.c. */
#include "snapshot_reader.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sums over a hostile file saturate instead of wrapping (the reader stands alone, for a fuzzer). */
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* What the checks below need: the file's name for messages, the error buffer, and the JSON path of the
 * value being checked ("segments[3].blocks[0].size"), grown and shrunk as the walk goes down and up. */
typedef struct {
  const char *name;
  char *err;
  char path[160];
  size_t path_len;
} ctx;

static int fail(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(ctx *c, const char *fmt, ...) {
  int n = snprintf(c->err, AS_ERR_LEN, "%s: ", c->name);
  if (n < 0 || n >= AS_ERR_LEN)
    return -1;
  if (c->path_len > 0) {
    int m = snprintf(c->err + n, AS_ERR_LEN - (size_t)n, "%s: ", c->path);
    if (m < 0 || m >= AS_ERR_LEN - n)
      return -1;
    n += m;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err + n, AS_ERR_LEN - (size_t)n, fmt, ap);
  va_end(ap);
  return -1;
}

/* Appends ".key" or "[i]" to the path; returns the old length for path_pop. A path too long for the
 * buffer is cut (messages stay readable; only the tail is lost). */
static size_t path_push(ctx *c, const char *key, size_t index) {
  size_t old = c->path_len, room = sizeof c->path - old;
  int n = key ? snprintf(c->path + old, room, "%s%s", old ? "." : "", key) : snprintf(c->path + old, room, "[%zu]", index);
  c->path_len = n < 0 ? old : (size_t)n >= room ? sizeof c->path - 1 : old + (size_t)n;
  return old;
}

static void path_pop(ctx *c, size_t old) {
  c->path_len = old;
  c->path[old] = '\0';
}

static const char *type_name(const cJSON *v) {
  if (v == NULL)
    return "nothing";
  switch (v->type & 0xff) {
  case cJSON_False:
  case cJSON_True:
    return "a boolean";
  case cJSON_NULL:
    return "null";
  case cJSON_Number:
    return "a number";
  case cJSON_String:
    return "a string";
  case cJSON_Array:
    return "an array";
  case cJSON_Object:
    return "an object";
  default:
    return "an unknown value";
  }
}

/* Copies at most 40 characters of a string from the file into buf for a message, with anything not
 * printable ASCII shown as '?', so a message never carries control bytes to the terminal. */
static const char *quote(char buf[48], const char *s) {
  size_t i = 0;
  for (; s[i] != '\0' && i < 40; i++)
    buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
  if (s[i] != '\0' && i >= 3)
    memcpy(buf + i - 3, "...", 3);
  buf[i] = '\0';
  return buf;
}

/* A number for a message: whole numbers in full ("18446744073709551616", "-1"), others as %g ("1.5",
 * "inf"). Doubles beyond 2^63 in magnitude are all whole; below it a round trip through int64_t tells. */
static const char *number_text(char buf[48], double d) {
  bool whole = d == d && d > -1e20 && d < 1e20 && (d >= 9.2e18 || d <= -9.2e18 || (double)(int64_t)d == d);
  snprintf(buf, 48, whole ? "%.0f" : "%g", d);
  return buf;
}

/* An unsigned integer field. cJSON keeps numbers as doubles: the value must be finite, integral and in
 * [0, 2^64) (converting anything else to uint64_t would be undefined). Absent: `dflt` unless required. */
static int get_u64(ctx *c, const cJSON *obj, const char *key, bool required, uint64_t dflt, uint64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = dflt;
  if (v == NULL) {
    if (!required)
      return 0;
    size_t old = path_push(c, key, 0);
    int r = fail(c, "missing (expected a non-negative integer)");
    path_pop(c, old);
    return r;
  }
  size_t old = path_push(c, key, 0);
  int r = 0;
  char num[48];
  if (!cJSON_IsNumber(v)) {
    r = fail(c, "expected a non-negative integer, got %s", type_name(v));
  } else {
    double d = v->valuedouble;
    /* The comparisons are false for NaN, so NaN lands in the error branch. */
    if (!(d >= 0.0 && d < 18446744073709551616.0) || (double)(uint64_t)d != d)
      r = fail(c, "expected a non-negative integer, got %s", number_text(num, d));
    else
      *out = (uint64_t)d;
  }
  path_pop(c, old);
  return r;
}

static int get_bool(ctx *c, const cJSON *obj, const char *key, bool *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = false;
  if (v == NULL)
    return 0;
  if (!cJSON_IsBool(v)) {
    size_t old = path_push(c, key, 0);
    int r = fail(c, "expected a boolean, got %s", type_name(v));
    path_pop(c, old);
    return r;
  }
  *out = cJSON_IsTrue(v);
  return 0;
}

/* A string field; *out is NULL when absent and not required. */
static int get_string(ctx *c, const cJSON *obj, const char *key, bool required, const char **out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = NULL;
  if (v == NULL && !required)
    return 0;
  if (!cJSON_IsString(v) || v->valuestring == NULL) {
    size_t old = path_push(c, key, 0);
    int r = v == NULL ? fail(c, "missing (expected a string)") : fail(c, "expected a string, got %s", type_name(v));
    path_pop(c, old);
    return r;
  }
  *out = v->valuestring;
  return 0;
}

/* An array field; *out is NULL when absent and not required. */
static int get_array(ctx *c, const cJSON *obj, const char *key, bool required, const cJSON **out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = NULL;
  if (v == NULL && !required)
    return 0;
  if (!cJSON_IsArray(v)) {
    size_t old = path_push(c, key, 0);
    int r = v == NULL ? fail(c, "missing (expected an array)") : fail(c, "expected an array, got %s", type_name(v));
    path_pop(c, old);
    return r;
  }
  *out = v;
  return 0;
}

/* The element count of an array, walking the list (cJSON_GetArraySize returns an int). */
static size_t array_len(const cJSON *a) {
  size_t n = 0;
  for (const cJSON *e = a ? a->child : NULL; e != NULL; e = e->next)
    n++;
  return n;
}

/* A "frames" array (of a block or a trace entry): objects with a string "name" and "filename" and, when
 * present, a non-negative integer "line". *out is NULL when absent. */
static int get_frames(ctx *c, const cJSON *obj, const cJSON **out) {
  if (get_array(c, obj, "frames", false, out))
    return -1;
  if (*out == NULL)
    return 0;
  size_t old = path_push(c, "frames", 0), i = 0;
  int r = 0;
  for (const cJSON *f = (*out)->child; f != NULL && r == 0; f = f->next, i++) {
    size_t old_i = path_push(c, NULL, i);
    const char *s;
    uint64_t line;
    if (!cJSON_IsObject(f))
      r = fail(c, "expected a frame object, got %s", type_name(f));
    else if (get_string(c, f, "name", true, &s) || get_string(c, f, "filename", true, &s) ||
             get_u64(c, f, "line", false, 0, &line))
      r = -1;
    path_pop(c, old_i);
  }
  path_pop(c, old);
  return r;
}

as_frame as_frame_get(const cJSON *frame) {
  as_frame f = {"", "", 0};
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(frame, "name");
  if (cJSON_IsString(v))
    f.name = v->valuestring;
  v = cJSON_GetObjectItemCaseSensitive(frame, "filename");
  if (cJSON_IsString(v))
    f.filename = v->valuestring;
  v = cJSON_GetObjectItemCaseSensitive(frame, "line");
  if (cJSON_IsNumber(v))
    f.line = (uint64_t)v->valuedouble; /* checked to be a non-negative integer below 2^64 */
  return f;
}

static int parse_block(ctx *c, const cJSON *jb, uint64_t next_address, as_block *b) {
  if (!cJSON_IsObject(jb))
    return fail(c, "expected a block object, got %s", type_name(jb));
  const char *state = NULL;
  if (get_u64(c, jb, "size", true, 0, &b->size) || get_u64(c, jb, "address", false, next_address, &b->address) ||
      get_u64(c, jb, "requested_size", false, 0, &b->requested_size) || get_string(c, jb, "state", true, &state) ||
      get_frames(c, jb, &b->frames))
    return -1;
  if (strcmp(state, "active_allocated") == 0)
    b->state = AS_ACTIVE_ALLOCATED;
  else if (strcmp(state, "active_pending_free") == 0)
    b->state = AS_ACTIVE_PENDING_FREE;
  else if (strcmp(state, "inactive") == 0)
    b->state = AS_INACTIVE;
  else {
    char q[48];
    size_t old = path_push(c, "state", 0);
    fail(c, "unknown block state '%s' (expected active_allocated, active_pending_free or inactive)", quote(q, state));
    path_pop(c, old);
    return -1;
  }
  return 0;
}

static int parse_device(ctx *c, uint64_t device, as_segment *s) {
  if (device > AS_MAX_DEVICE) {
    size_t old = path_push(c, "device", 0);
    fail(c, "device %llu is out of range (at most %d)", (unsigned long long)device, AS_MAX_DEVICE);
    path_pop(c, old);
    return -1;
  }
  s->device = (int)device;
  return 0;
}

/* segment_type: absent is large (older PyTorch snapshots lack it). */
static int parse_segment_type(ctx *c, const char *type, as_segment *s) {
  if (type == NULL || strcmp(type, "large") == 0) {
    s->small = false;
  } else if (strcmp(type, "small") == 0) {
    s->small = true;
  } else {
    char q[48];
    size_t old = path_push(c, "segment_type", 0);
    fail(c, "unknown segment type '%s' (expected small or large)", quote(q, type));
    path_pop(c, old);
    return -1;
  }
  return 0;
}

static int parse_pool_id(ctx *c, const cJSON *pool, uint64_t pool_id[2]) {
  size_t old = path_push(c, "segment_pool_id", 0);
  const cJSON *p0 = pool->child, *p1 = p0 ? p0->next : NULL;
  int r = 0;
  if (p0 == NULL || p1 == NULL || p1->next != NULL) {
    r = fail(c, "expected an array of two integers");
  } else {
    for (int i = 0; i < 2 && r == 0; i++) {
      const cJSON *v = i ? p1 : p0;
      if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0.0 && v->valuedouble < 18446744073709551616.0) ||
          (double)(uint64_t)v->valuedouble != v->valuedouble)
        r = fail(c, "expected an array of two non-negative integers, element %d is %s", i, type_name(v));
      else
        pool_id[i] = (uint64_t)v->valuedouble;
    }
  }
  path_pop(c, old);
  return r;
}

/* What a segment's blocks add up to, for files that do not give the sums themselves. */
typedef struct {
  uint64_t allocated, active, requested;
} block_sums;

/* The blocks of segment s (its address and total_size already read), checked to tile it in order. */
static int parse_blocks(ctx *c, const cJSON *blocks, as_segment *s, block_sums *sums) {
  size_t n = array_len(blocks);
  s->blocks = calloc(n ? n : 1, sizeof *s->blocks);
  if (s->blocks == NULL)
    return fail(c, "out of host memory for %zu blocks", n);
  if (s->total_size > UINT64_MAX - s->address) {
    size_t old = path_push(c, "total_size", 0);
    fail(c, "the segment at 0x%llx of %llu bytes ends past the end of the address space",
         (unsigned long long)s->address, (unsigned long long)s->total_size);
    path_pop(c, old);
    return -1;
  }
  uint64_t seg_end = s->address + s->total_size;
  size_t old = path_push(c, "blocks", 0);
  uint64_t next = s->address;
  for (const cJSON *jb = blocks->child; jb != NULL; jb = jb->next) {
    size_t old_i = path_push(c, NULL, s->n_blocks);
    as_block *b = &s->blocks[s->n_blocks];
    int r = parse_block(c, jb, next, b);
    /* Blocks tile their segment in address order: a block outside it, or over the one before, made
     * `show` report 1 TiB allocated in a 2 MiB segment. */
    if (r == 0 && b->address < next)
      r = fail(c, "the block at 0x%llx begins before %s (0x%llx)", (unsigned long long)b->address,
               s->n_blocks == 0 ? "its segment" : "the end of the block before it", (unsigned long long)next);
    else if (r == 0 && (b->address > seg_end || b->size > seg_end - b->address))
      r = fail(c, "the block at 0x%llx of %llu bytes ends past its segment (0x%llx + %llu bytes)",
               (unsigned long long)b->address, (unsigned long long)b->size, (unsigned long long)s->address,
               (unsigned long long)s->total_size);
    path_pop(c, old_i);
    if (r) {
      path_pop(c, old);
      return -1;
    }
    s->n_blocks++;
    next = sat_add(b->address, b->size);
    if (b->state != AS_INACTIVE) {
      sums->active = sat_add(sums->active, b->size);
      if (b->state == AS_ACTIVE_ALLOCATED) {
        sums->allocated = sat_add(sums->allocated, b->size);
        sums->requested = sat_add(sums->requested, b->requested_size);
      }
    }
  }
  path_pop(c, old);
  return 0;
}

/* The segment's allocated, active and requested sizes: the file's own sums win when present; they are
 * recomputed only for files that lack them. */
static int parse_sizes(ctx *c, const cJSON *js, const block_sums *sums, as_segment *s) {
  if (get_u64(c, js, "allocated_size", false, sums->allocated, &s->allocated_size) ||
      get_u64(c, js, "active_size", false, sums->active, &s->active_size) ||
      get_u64(c, js, "requested_size", false, sums->requested, &s->requested_size))
    return -1;
  bool allocated_over = s->allocated_size > s->total_size;
  if (allocated_over || s->active_size > s->total_size) {
    size_t old = path_push(c, allocated_over ? "allocated_size" : "active_size", 0);
    fail(c, "%llu bytes in a segment of %llu bytes",
         (unsigned long long)(allocated_over ? s->allocated_size : s->active_size), (unsigned long long)s->total_size);
    path_pop(c, old);
    return -1;
  }
  return 0;
}

static int parse_segment(ctx *c, const cJSON *js, as_segment *s) {
  if (!cJSON_IsObject(js))
    return fail(c, "expected a segment object, got %s", type_name(js));
  s->json = js;
  uint64_t device = 0;
  const char *type = NULL;
  const cJSON *blocks = NULL, *pool = NULL;
  if (get_u64(c, js, "device", true, 0, &device) || get_u64(c, js, "address", true, 0, &s->address) ||
      get_u64(c, js, "total_size", true, 0, &s->total_size) || get_u64(c, js, "stream", false, 0, &s->stream) ||
      get_bool(c, js, "is_expandable", &s->is_expandable) || get_string(c, js, "segment_type", false, &type) ||
      get_array(c, js, "segment_pool_id", false, &pool) || get_array(c, js, "blocks", true, &blocks))
    return -1;
  if (parse_device(c, device, s) || parse_segment_type(c, type, s) ||
      (pool != NULL && parse_pool_id(c, pool, s->pool_id)))
    return -1;
  block_sums sums = {0, 0, 0};
  if (parse_blocks(c, blocks, s, &sums))
    return -1;
  return parse_sizes(c, js, &sums, s);
}

static void parse_action(const char *name, as_action *out) {
  static const char *const names[] = {"alloc",       "free_requested", "free_completed", "segment_alloc",
                                      "segment_free", "segment_map",    "segment_unmap",  "oom",
                                      "snapshot",    "user_defined"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(name, names[i]) == 0) {
      *out = (as_action)i;
      return;
    }
  *out = AS_ACTION_OTHER;
}

static int parse_entry(ctx *c, const cJSON *je, as_trace_entry *e) {
  if (!cJSON_IsObject(je))
    return fail(c, "expected a trace entry object, got %s", type_name(je));
  const char *action = NULL;
  if (get_string(c, je, "action", true, &action))
    return -1;
  parse_action(action, &e->action);
  /* addr and size are what a replay needs: required for alloc and free entries, optional elsewhere. */
  bool needed = e->action == AS_ALLOC || e->action == AS_FREE_REQUESTED || e->action == AS_FREE_COMPLETED;
  /* an oom entry's free bytes of the device: "device_free", PyTorch's key and cachalot's now; cachalot's
   * files written before wrote "addr" */
  const char *addr_key = e->action == AS_OOM && cJSON_GetObjectItemCaseSensitive(je, "device_free") ? "device_free"
                                                                                                   : "addr";
  if (get_u64(c, je, addr_key, needed, 0, &e->addr) || get_u64(c, je, "size", needed, 0, &e->size) ||
      get_u64(c, je, "stream", false, 0, &e->stream) || get_u64(c, je, "time_us", false, 0, &e->time_us) ||
      get_frames(c, je, &e->frames) || get_string(c, je, "name", false, &e->name))
    return -1;
  e->json = je;
  /* A user_defined entry's text: its "name" (cachalot_annotate), else the first frame's name. */
  if (e->action != AS_USER_DEFINED)
    e->name = NULL;
  else if (e->name == NULL && e->frames != NULL && e->frames->child != NULL)
    e->name = as_frame_get(e->frames->child).name;
  return 0;
}

static int parse_traces(ctx *c, const cJSON *traces, as_snapshot *s) {
  size_t n = array_len(traces);
  if (n > (size_t)AS_MAX_DEVICE + 1)
    return fail(c, "%zu device traces: more devices than the %d allowed", n, AS_MAX_DEVICE + 1);
  s->traces = calloc(n ? n : 1, sizeof *s->traces);
  if (s->traces == NULL)
    return fail(c, "out of host memory");
  s->n_devices = n;
  size_t d = 0;
  for (const cJSON *jt = traces->child; jt != NULL; jt = jt->next, d++) {
    size_t old = path_push(c, NULL, d);
    if (!cJSON_IsArray(jt)) {
      fail(c, "expected an array of trace entries, got %s", type_name(jt));
      path_pop(c, old);
      return -1;
    }
    size_t m = array_len(jt);
    as_device_trace *t = &s->traces[d];
    t->entries = calloc(m ? m : 1, sizeof *t->entries);
    if (t->entries == NULL) {
      fail(c, "out of host memory for %zu trace entries", m);
      path_pop(c, old);
      return -1;
    }
    for (const cJSON *je = jt->child; je != NULL; je = je->next) {
      size_t old_i = path_push(c, NULL, t->n);
      int r = parse_entry(c, je, &t->entries[t->n]);
      path_pop(c, old_i);
      if (r) {
        path_pop(c, old);
        return -1;
      }
      t->n++;
    }
    path_pop(c, old);
  }
  return 0;
}

/* "external_annotations": [{"device", "time_us", "stage": "START" | "END", "name"}], all required. */
static int parse_annotations(ctx *c, const cJSON *root, as_snapshot *s) {
  const cJSON *list = NULL;
  if (get_array(c, root, "external_annotations", false, &list))
    return -1;
  if (list == NULL)
    return 0;
  size_t n = array_len(list);
  s->annotations = calloc(n ? n : 1, sizeof *s->annotations);
  if (s->annotations == NULL)
    return fail(c, "out of host memory for %zu annotations", n);
  size_t old = path_push(c, "external_annotations", 0);
  int r = 0;
  for (const cJSON *ja = list->child; ja != NULL && r == 0; ja = ja->next) {
    size_t old_i = path_push(c, NULL, s->n_annotations);
    as_annotation *a = &s->annotations[s->n_annotations];
    uint64_t device = 0;
    const char *stage = NULL;
    if (!cJSON_IsObject(ja))
      r = fail(c, "expected an annotation object, got %s", type_name(ja));
    else if (get_u64(c, ja, "device", true, 0, &device) || get_u64(c, ja, "time_us", true, 0, &a->time_us) ||
             get_string(c, ja, "stage", true, &stage) || get_string(c, ja, "name", true, &a->name))
      r = -1;
    else if (device > AS_MAX_DEVICE)
      r = fail(c, "device %llu is out of range (at most %d)", (unsigned long long)device, AS_MAX_DEVICE);
    else if (strcmp(stage, "START") != 0 && strcmp(stage, "END") != 0) {
      char q[48];
      r = fail(c, "unknown stage '%s' (expected START or END)", quote(q, stage));
    } else {
      a->device = (int)device;
      a->start = stage[0] == 'S';
      s->n_annotations++;
    }
    path_pop(c, old_i);
  }
  path_pop(c, old);
  return r;
}

static int parse_settings(ctx *c, const cJSON *root, as_snapshot *s) {
  const cJSON *set = cJSON_GetObjectItemCaseSensitive(root, "allocator_settings");
  if (set == NULL)
    return 0;
  if (!cJSON_IsObject(set)) {
    size_t old = path_push(c, "allocator_settings", 0);
    fail(c, "expected an object, got %s", type_name(set));
    path_pop(c, old);
    return -1;
  }
  s->allocator_settings = set;
  /* PyTorch names the raw string after its environment variable; cachalot after its own. */
  static const char *const keys[] = {"PYTORCH_CUDA_ALLOC_CONF", "CACHALOT_ALLOC_CONF"};
  size_t old = path_push(c, "allocator_settings", 0);
  int r = 0;
  for (size_t i = 0; i < 2 && s->conf == NULL && r == 0; i++)
    r = get_string(c, set, keys[i], false, &s->conf);
  path_pop(c, old);
  return r;
}

int as_snapshot_parse(const char *name, const char *data, size_t len, as_snapshot *out, char err[AS_ERR_LEN]) {
  ctx c = {.name = name, .err = err};
  memset(out, 0, sizeof *out);
  out->root = as_json_parse(name, data, len, err);
  if (out->root == NULL)
    return -1;
  const cJSON *root = out->root, *segs = NULL, *traces = NULL;
  int r = 0;
  if (!cJSON_IsObject(root))
    r = fail(&c, "not a memory snapshot: the document is %s, expected an object", type_name(root));
  else if (get_array(&c, root, "segments", false, &segs) || get_array(&c, root, "device_traces", false, &traces))
    r = -1;
  else if (segs == NULL && traces == NULL)
    r = fail(&c, "not a memory snapshot: neither \"segments\" nor \"device_traces\" is present");
  if (r == 0 && segs != NULL) {
    size_t n = array_len(segs);
    out->segments = calloc(n ? n : 1, sizeof *out->segments);
    if (out->segments == NULL)
      r = fail(&c, "out of host memory for %zu segments", n);
    size_t old = path_push(&c, "segments", 0);
    for (const cJSON *js = segs->child; js != NULL && r == 0; js = js->next) {
      size_t old_i = path_push(&c, NULL, out->n_segments);
      r = parse_segment(&c, js, &out->segments[out->n_segments]);
      path_pop(&c, old_i);
      out->n_segments++; /* counted even when it failed, so its blocks are freed */
    }
    path_pop(&c, old);
  }
  if (r == 0 && traces != NULL) {
    size_t old = path_push(&c, "device_traces", 0);
    r = parse_traces(&c, traces, out);
    path_pop(&c, old);
  }
  if (r == 0)
    r = parse_settings(&c, root, out);
  if (r == 0)
    r = parse_annotations(&c, root, out);
  if (r != 0) {
    as_snapshot_free(out);
    return -1;
  }
  return 0;
}

void as_snapshot_free(as_snapshot *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->n_segments; i++)
    free(s->segments[i].blocks);
  free(s->segments);
  for (size_t d = 0; d < s->n_devices; d++)
    free(s->traces[d].entries);
  free(s->traces);
  free(s->annotations);
  cJSON_Delete(s->root);
  memset(s, 0, sizeof *s);
}

const char *as_block_state_name(as_block_state s) {
  switch (s) {
  case AS_ACTIVE_ALLOCATED:
    return "active_allocated";
  case AS_ACTIVE_PENDING_FREE:
    return "active_pending_free";
  case AS_INACTIVE:
    return "inactive";
  }
  return "?";
}

const char *as_action_name(as_action a) {
  static const char *const names[] = {"alloc",       "free_requested", "free_completed", "segment_alloc",
                                      "segment_free", "segment_map",    "segment_unmap",  "oom",
                                      "snapshot",    "user_defined",   "other"};
  return (size_t)a < sizeof names / sizeof names[0] ? names[a] : "?";
}
