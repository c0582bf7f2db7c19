/* cachalot: stats as JSON, memory history, and snapshots in PyTorch's schema (torch.cuda.memory_stats() keys;
 * torch.cuda.memory._snapshot()). JSON strings are malloc'ed; the caller frees them with free(). */
#ifndef CACHALOT_SNAPSHOT_H
#define CACHALOT_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator.h"
#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `device`'s memory_stats as one flat JSON object with torch.cuda.memory_stats()'s sorted, dot-joined
 * keys ("active.all.current", ..., "requested_bytes.small_pool.peak"). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_memory_stats_json(cachalot_allocator *a, int device,
                                                                           char **json);

/* Starts (enabled) or stops recording trace entries (alloc, free_requested, free_completed, segment_alloc,
 * segment_free, segment_map, segment_unmap, oom, snapshot) into a ring buffer of max_entries per device
 * (oldest dropped first). The buffer grows as entries come (4096 at first, doubled when full), so any limit,
 * SIZE_MAX too, costs only what is recorded; where the host has no memory to grow, the buffer keeps what
 * it has and drops its oldest from then on (with a warning). Turning it on again clears the buffer. Off by
 * default; costs nothing when off. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_record_history(cachalot_allocator *a, bool enabled,
                                                                        size_t max_entries);

/* Records C call stacks ("frames": name, filename, line) with alloc, free_requested and user_defined entries
 * while history is on, and keeps its alloc's stack with each block handed out meanwhile (the snapshot's
 * blocks' "frames") until the block is freed or history is turned off. Names, files and lines are looked
 * up when a snapshot is written. Off by default. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_record_history_stacks(cachalot_allocator *a, bool enabled);

/* Marks a moment of the program on `device`'s timeline: while history is on, records a "user_defined" trace
 * entry (addr, size and stream 0) whose "name" in the snapshot is `text`, with C frames while stacks are
 * on. Text longer than 1023 bytes is cut to at most 1023, before a UTF-8 character that would cross the
 * bound; cachalot keeps its own copy until the entry leaves the ring buffer. In the snapshot's JSON each
 * byte that starts no UTF-8 character is \ufffd, so the file is UTF-8 whatever `text` holds. While history is off nothing
 * is recorded and CACHALOT_OK is returned. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_annotate(cachalot_allocator *a, int device,
                                                                  const char *text);

/* --- contexts: what the caller knows about an allocation (e.g. the stack of the program that made it) ---
 *
 * A context is an opaque pointer of the caller's with a reference count that the caller's ops keep.
 * While history is on, cachalot_malloc_with_context keeps the context with the block it hands out (until
 * the block is freed) and with the alloc trace entry (until the entry leaves the ring buffer or history
 * is turned off); cachalot_free_with_context keeps one with the free_requested entry. cachalot takes one
 * reference (retain) for each place it keeps a context and lets go of it (release) when the place goes;
 * the caller's own reference stays the caller's. While history is off, contexts are not kept: turning it
 * off lets go of those of the trace and of the blocks (so that the lock-free warm paths, which run only
 * while no block holds a context, come back). retain and
 * release may be called with allocator locks held, from any thread: they must not call cachalot. */
typedef struct {
  void (*retain)(void *ctx);
  void (*release)(void *ctx);
} cachalot_context_ops;

/* Sets the ops (both non-NULL; NULL ops turn contexts off). CACHALOT_ERROR_INVALID_STATE while any
 * context is kept. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_set_context_ops(cachalot_allocator *a,
                                                                         const cachalot_context_ops *ops);
/* cachalot_malloc, keeping `ctx` (may be NULL) as described above. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_malloc_with_context(cachalot_allocator *a, int device,
                                                                             size_t size, cachalot_stream s,
                                                                             void *ctx, void **out);
/* cachalot_free, keeping `ctx` (may be NULL) with the free_requested trace entry. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_free_with_context(cachalot_allocator *a, void *ptr,
                                                                           void *ctx);

/* --- the snapshot as C structures (what cachalot_snapshot_json writes, with contexts) --- */

typedef enum {
  CACHALOT_BLOCK_FREE,          /* cached */
  CACHALOT_BLOCK_ALLOCATED,     /* handed out */
  CACHALOT_BLOCK_PENDING_FREE   /* freed, waiting for other streams' work */
} cachalot_block_kind;

typedef struct {
  uintptr_t address;
  size_t size;
  size_t requested; /* 0 when free */
  cachalot_block_kind state;
  void *context;    /* the block's context (allocated or pending), or NULL */
} cachalot_snapshot_block;

typedef struct {
  int device;
  uintptr_t address;
  size_t total_size;
  cachalot_stream stream;
  bool small;
  bool expandable;
  cachalot_mempool_id pool;
  size_t n_blocks;
  cachalot_snapshot_block *blocks; /* address order */
} cachalot_snapshot_segment;

/* The actions of trace entries, in the order of PyTorch's TraceEntry::Action. */
typedef enum {
  CACHALOT_TRACE_ALLOC,
  CACHALOT_TRACE_FREE_REQUESTED,
  CACHALOT_TRACE_FREE_COMPLETED,
  CACHALOT_TRACE_SEGMENT_ALLOC,
  CACHALOT_TRACE_SEGMENT_FREE,
  CACHALOT_TRACE_SEGMENT_MAP,
  CACHALOT_TRACE_SEGMENT_UNMAP,
  CACHALOT_TRACE_SNAPSHOT,
  CACHALOT_TRACE_OOM
} cachalot_trace_action;

typedef struct {
  cachalot_trace_action action;
  int device;
  uintptr_t addr;  /* for oom: the device's free bytes */
  size_t size;
  cachalot_stream stream;
  int64_t time_us; /* since the epoch */
  /* As PyTorch's entries carry one: the call's context (the malloc's on its alloc, segment_alloc,
   * segment_map and oom entries, the free's on its free entries), else, on a block's free entries, the one
   * its allocation left with it, and on a segment_free entry the one of the malloc that made the segment;
   * on a segment_unmap entry the call's that unmapped (a malloc's that needed the pages, a free's), else
   * NULL (the runs of expandable segments keep none); NULL where none was given. */
  void *context;
} cachalot_trace_entry;

typedef struct {
  size_t n_segments;
  cachalot_snapshot_segment *segments; /* by device, then address */
  size_t n_trace;
  cachalot_trace_entry *trace;         /* by device, oldest first within a device */
} cachalot_snapshot_info;

/* Takes the snapshot of every device. With include_trace: its trace entries too (user_defined ones left
 * out: the actions above have none), then records a "snapshot" trace entry on each device, as PyTorch's
 * allocator does after reading its trace: the next snapshot shows it (the JSON snapshot records it
 * before, to mark its own moment). Without include_trace: segments and blocks only, and the history is
 * left as it is. Every context in it holds a reference until cachalot_snapshot_info_free. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_snapshot_take(cachalot_allocator *a, bool include_trace,
                                                                       cachalot_snapshot_info **out);
/* Lets go of the snapshot's contexts and frees it. NULL is a no-op. */
CACHALOT_API void cachalot_snapshot_info_free(cachalot_allocator *a, cachalot_snapshot_info *s);

/* The snapshot of every device: {"segments": [...], "device_traces": [[...] per device],
 * "allocator_settings": {...}} in torch.cuda.memory._snapshot()'s schema, plus pool ids. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_snapshot_json(cachalot_allocator *a, char **json);

#ifdef __cplusplus
}
#endif
#endif
