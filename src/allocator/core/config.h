/* CACHALOT_ALLOC_CONF: PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar and keys.
 *
 * All tunables live here with their defaults (cl_config_defaults). A parse either yields a whole new
 * config or fails with CACHALOT_ERROR_CONFIG and leaves nothing half-applied. */
#ifndef CACHALOT_ALLOCATOR_CONFIG_H
#define CACHALOT_ALLOCATOR_CONFIG_H

#include <cachalot/status.h>

#include <stdbool.h>
#include <stddef.h>

enum { CL_ROUNDUP_INTERVALS = 16 }; /* [1 MiB, 2 MiB), [2, 4), ... , [32 GiB, inf) */
enum { CL_MAX_REGISTER_THREADS = 128 }; /* pinned_num_register_threads' limit, PyTorch's */

/* Which keys a string named (for set_settings: unnamed keys keep their values). */
enum {
  CL_KEY_MAX_SPLIT = 1u << 0,
  CL_KEY_MAX_NON_SPLIT_ROUNDING = 1u << 1,
  CL_KEY_GC_THRESHOLD = 1u << 2,
  CL_KEY_ROUNDUP = 1u << 3,
  CL_KEY_EXPANDABLE = 1u << 4,
  CL_KEY_RELEASE_LOCK = 1u << 5,
  CL_KEY_FRACTION = 1u << 6,
  CL_KEY_DETECT_CAPTURES = 1u << 7,
  CL_KEY_EXPANDABLE_COMPACT = 1u << 8,
  CL_KEY_PRESET = 1u << 9,
  CL_KEY_EXPANDABLE_PAGE = 1u << 10,
  CL_KEY_PINNED_REGISTER = 1u << 11,
  CL_KEY_PINNED_THREADS = 1u << 12,
  CL_KEY_CAPTURE_REUSE = 1u << 13,
  CL_KEY_EXPANDABLE_PLAN = 1u << 14,
};

typedef struct cl_config {
  size_t max_split_size;         /* bytes; SIZE_MAX = unlimited (default) */
  size_t max_non_split_rounding; /* bytes; default 20 MiB: an oversize request takes a cached block only
                                    if block size < request + this */
  double gc_threshold;           /* garbage_collection_threshold; 0 = off (default) */
  bool expandable_segments;      /* default false */
  bool release_lock_on_cudamalloc; /* default true: no allocator lock is held across a device allocation */
  bool capture_reuse;            /* graph_capture_record_stream_reuse, default false: a block freed during a
                                    capture with other streams' uses is reused within the capture once the
                                    allocating stream's captured work depends on every one of those uses
                                    (free.c, capture_reuse.c); else it waits for the capture's end */
  double memory_fraction;        /* per_process_memory_fraction; < 0 = not set (default) */
  unsigned roundup_divisions[CL_ROUNDUP_INTERVALS]; /* 0 or 1 = plain 512 B rounding (default 0) */
  bool plain_rounding;           /* no roundup_divisions entry above 1: every size rounds to 512 B */
  bool detect_captures;          /* cachalot's own key, default false: malloc asks whether its stream is
                                    being captured and routes it to a private pool of that capture
                                    (autocapture.c) */
  bool expandable_compact;       /* cachalot's own key, default false: with expandable segments, a growth
                                    that would set a new reserved peak above the requested peak + 1/64
                                    first unmaps whole free pages elsewhere (expandable.c) */
  bool expandable_plan;          /* cachalot's own key, default false: with expandable segments, a step that
                                    repeats is found and its blocks placed by a plan (expandable/plan.c) */
  size_t expandable_page;        /* cachalot's own key expandable_page_mb, default 20 MiB (PyTorch's): the
                                    page of the large kind's expandable segments, mapped and unmapped
                                    whole; smaller pages leave fewer free bytes mapped beside live blocks
                                    for more map calls (expandable.c) */
  bool pinned_use_host_register;  /* pinned_use_cuda_host_register, default false: the host cache pins
                                    malloc'd memory with cudaHostRegister instead of cudaHostAlloc */
  unsigned pinned_num_register_threads; /* default 1, a power of two <= 128: threads that touch the pages
                                    of a block to register before it is registered (host_pin.c) */
  unsigned keys_set;             /* CL_KEY_* named by the last parse */
} cl_config;

/* The defaults. */
void cl_config_defaults(cl_config *c);

/* Returns the keys PyTorch states afresh at each _set_allocator_settings call (max_split_size,
 * roundup_power2_divisions, garbage_collection_threshold) to their defaults. */
void cl_config_reset_per_call(cl_config *c);

/* The key names the parser accepts, NULL-terminated. */
const char *const *cl_config_keys(void);

/* Parses `s` on top of `base` (copied to *out first; unnamed keys keep base's values). NULL or "" is
 * valid and changes nothing. On failure *out is unspecified, the status is CACHALOT_ERROR_CONFIG and the
 * message names the offending key or token and what was expected. */
cachalot_status cl_config_parse(const char *s, const cl_config *base, cl_config *out);

#endif
