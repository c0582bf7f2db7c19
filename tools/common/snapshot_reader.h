/* A snapshot file as a checked model (the schema of torch.cuda.memory._snapshot()), for alloc_snapshot
 * and alloc_bench: snapshot_file.c reads the file, snapshot_json.c checks its JSON text, and
 * snapshot_reader.c checks the schema into the model below.
 *
 * Reads cachalot's and PyTorch's snapshot JSON, plain or gzip'ed (one gzip member or several, nothing
 * after them), as strict JSON (as_json_parse), and checks every field it uses for its type and range
 * before anything looks at it, so that a malformed file is an error message and never a crash: the
 * input is bounded (AS_MAX_INPUT_BYTES after decompression), cJSON bounds the nesting depth, every
 * number must be a finite integer in range, every size sum saturates. A segment must fit the address
 * space, its blocks lie inside it in address order without overlapping, and its allocated and active
 * sizes be at most its total size.
 * Keys the model does not use are ignored (compile_context, user_metadata, ...), so newer PyTorch
 * versions still load; a key it uses with the wrong type is an error naming the key's path. Frames
 * ("frames" of blocks and trace entries: [{"name", "filename", "line"}]), a user_defined entry's "name"
 * and the top-level "external_annotations" ([{"device", "time_us", "stage", "name"}]) are checked too,
 * for the plot; a frame's "line" may be absent (0).
 *
 * What may be absent (older PyTorch snapshots lack them) and what it defaults to: block "address" (the
 * previous block's end), "requested_size" (0), segment "allocated_size"/"active_size"/"requested_size"
 * (summed from the blocks), "stream" (0), "segment_pool_id" ([0, 0]), "is_expandable" (false),
 * "segment_type" (large), trace "stream"/"time_us"/"size" (0), and either of "segments" and
 * "device_traces" (empty) but not both.
 */
#ifndef TOOLS_COMMON_SNAPSHOT_READER_H
#define TOOLS_COMMON_SNAPSHOT_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* The most a file may hold once decompressed: a gzip bomb or /dev/zero stops here. */
#define AS_MAX_INPUT_BYTES ((size_t)1 << 30)
/* What the readers hold is bounded by their input: a gzip'ed file inflates to at most AS_GZIP_MAX_RATIO
 * times its size (at least AS_GZIP_MIN_BYTES; real snapshots inflate 20 to 30 times), and JSON text may
 * hold at most one value per AS_JSON_BYTES_PER_VALUE bytes of it (at least AS_JSON_MIN_VALUES, at most
 * AS_PICKLE_MAX_NODES; real snapshots take ~20 bytes a value), each a cJSON node of 64 bytes. */
#define AS_GZIP_MAX_RATIO ((size_t)256)
#define AS_GZIP_MIN_BYTES ((size_t)64 << 20)
#define AS_JSON_BYTES_PER_VALUE ((size_t)4)
#define AS_JSON_MIN_VALUES ((size_t)1 << 20)
#define AS_JSON_MAX_VALUES ((size_t)1 << 25)
/* Device indices above this are taken for garbage (CUDA has nowhere near as many devices). */
#define AS_MAX_DEVICE 4095

typedef enum { AS_ACTIVE_ALLOCATED, AS_ACTIVE_PENDING_FREE, AS_INACTIVE } as_block_state;

typedef struct {
  uint64_t address, size, requested_size;
  as_block_state state;
  const cJSON *frames; /* checked: an array of frame objects (as_frame_get); NULL when absent */
} as_block;

typedef struct {
  int device;
  uint64_t address, total_size, allocated_size, active_size, requested_size;
  uint64_t stream;     /* the stream handle as an integer; 0 is the default stream */
  bool small;          /* segment_type "small"; else "large" */
  uint64_t pool_id[2]; /* segment_pool_id; {0, 0} is the default pools */
  bool is_expandable;
  size_t n_blocks;
  as_block *blocks;   /* in file order (SPEC: address order) */
  const cJSON *json;  /* the segment's object in the file, printed as is by `segments` */
} as_segment;

typedef enum {
  AS_ALLOC,
  AS_FREE_REQUESTED,
  AS_FREE_COMPLETED,
  AS_SEGMENT_ALLOC,
  AS_SEGMENT_FREE,
  AS_SEGMENT_MAP,
  AS_SEGMENT_UNMAP,
  AS_OOM,
  AS_SNAPSHOT,
  AS_USER_DEFINED,
  AS_ACTION_OTHER /* an action this version does not know: kept, counted, not replayed */
} as_action;

typedef struct {
  as_action action;
  uint64_t addr, size, stream;
  uint64_t time_us;
  const cJSON *frames; /* checked as a block's; NULL when absent */
  /* user_defined entries: their "name", else their first frame's name (NULL: neither); other entries
   * NULL */
  const char *name;
  const cJSON *json; /* the entry's object in the file */
} as_trace_entry;

/* One frame of a checked "frames" array. */
typedef struct {
  const char *name, *filename;
  uint64_t line;
} as_frame;

/* An element of the top-level "external_annotations": a START or END of a named range on a device. */
typedef struct {
  int device;
  uint64_t time_us;
  bool start; /* stage "START"; else "END" */
  const char *name;
} as_annotation;

typedef struct {
  size_t n;
  as_trace_entry *entries; /* oldest first */
} as_device_trace;

typedef struct {
  cJSON *root;
  size_t n_segments;
  as_segment *segments;
  size_t n_devices; /* device_traces' length: entry d is device d */
  as_device_trace *traces;
  size_t n_annotations; /* external_annotations, in file order */
  as_annotation *annotations;
  const cJSON *allocator_settings; /* NULL when absent */
  const char *conf;                /* the raw config string of allocator_settings, NULL when absent */
} as_snapshot;

enum { AS_ERR_LEN = 512 };

/* Reads `path` ("-" is standard input). 0 on success; -1 with a message naming the file and the
 * problem in err (nothing to free then). */
int as_snapshot_load(const char *path, as_snapshot *out, char err[AS_ERR_LEN]);
/* The same from `len` bytes of JSON text in memory (what a fuzzer calls); `name` names it in messages.
 * `data` need not end in a NUL and may hold any bytes. */
int as_snapshot_parse(const char *name, const char *data, size_t len, as_snapshot *out, char err[AS_ERR_LEN]);
void as_snapshot_free(as_snapshot *s);

/* `len` bytes of JSON as RFC 8259 has it, and nothing after it but white space: what cJSON alone lets
 * through (control bytes between tokens, raw ones in strings, "01", "\u0000") is refused too. The tree,
 * or NULL with a message that starts with `name` in err. */
cJSON *as_json_parse(const char *name, const char *data, size_t len, char err[AS_ERR_LEN]);

/* The frame an element of a checked "frames" array holds (the reader checked its fields). */
as_frame as_frame_get(const cJSON *frame);

/* "NAME: message" into err (AS_ERR_LEN bytes); always -1, for `return as_read_fail(...)` in the readers of
 * the file's text (snapshot_json.c, the pickle reader). */
int as_read_fail(const char *name, char *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

const char *as_block_state_name(as_block_state s);
const char *as_action_name(as_action a);

#endif
