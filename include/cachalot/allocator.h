/* cachalot: the caching allocator (PyTorch's caching allocator: sizes, frees, malloc steps, config).
 *
 * Stream rule: a block freed on its allocation stream is reusable at once by later requests on that
 * stream. A block that record_stream() marked as used by other streams is reused only after an event
 * recorded on each of those streams at free() time has completed.
 */
#ifndef CACHALOT_ALLOCATOR_H
#define CACHALOT_ALLOCATOR_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cachalot_allocator cachalot_allocator;

/* Called when an allocation fails as out of memory, with no allocator lock held, before the failing
 * call returns: device, the segment size that was requested, the limit (fraction x total when a
 * memory fraction is set, else the device total) and the device's free bytes. */
typedef void (*cachalot_oom_observer)(int device, size_t alloc_size, size_t limit, size_t device_free,
                                      void *ctx);

/* Creates an allocator on backend `b` (which must outlive it). `conf` is a CACHALOT_ALLOC_CONF string
 * (PYTORCH_CUDA_ALLOC_CONF); NULL reads the environment variable CACHALOT_ALLOC_CONF, "" means the defaults.
 * A malformed config fails with CACHALOT_ERROR_CONFIG and creates nothing. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_create(cachalot_backend *b, const char *conf,
                                                                cachalot_allocator **out);

/* Replaces the settings at run time, as PyTorch's _set_allocator_settings does: the string is validated
 * exactly as at create time and applied only when all of it is valid. max_split_size_mb,
 * roundup_power2_divisions and garbage_collection_threshold return to their defaults unless the string
 * names them (PyTorch's rule: each call states those three afresh); other keys it does not name keep
 * their current values. A new per_process_memory_fraction applies to every device. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_set_settings(cachalot_allocator *a, const char *conf);

/* Validates a config string as cachalot_create would, creating nothing: CACHALOT_OK, or
 * CACHALOT_ERROR_CONFIG with the reason in cachalot_last_error(). NULL reads CACHALOT_ALLOC_CONF. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_check_config(const char *conf);

/* The keys a config string may name, in a NULL-terminated static array: for a layer that receives one
 * string meant for several parsers (PyTorch's PYTORCH_CUDA_ALLOC_CONF) and hands cachalot its share. */
CACHALOT_API const char *const *cachalot_config_keys(void);

/* The settings in force, after presets and set_settings: what the snapshot's allocator_settings show. */
typedef struct {
  size_t max_split_size;                /* bytes; SIZE_MAX: unlimited */
  double garbage_collection_threshold;  /* 0: off */
  bool expandable_segments, expandable_compact, expandable_plan;
  size_t expandable_page;               /* bytes: the large kind's page (expandable_page_mb) */
  bool release_lock_on_cudamalloc;
  bool pinned_use_cuda_host_register;
  unsigned pinned_num_register_threads;
  unsigned roundup_power2_divisions[16]; /* for sizes in [1, 2) MiB, [2, 4) MiB, ..., [32 GiB, inf) */
} cachalot_settings;

CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_get_settings(cachalot_allocator *a, cachalot_settings *out);

/* Waits for outstanding events and gives every segment back to the device, including those of blocks
 * still allocated: pointers from this allocator are invalid afterwards. NULL is a no-op. No other call
 * on `a` may be in flight. */
CACHALOT_API void cachalot_destroy(cachalot_allocator *a);

/* The process-wide allocator: the CUDA backend with the CACHALOT_ALLOC_CONF environment config, made on
 * first use (thread-safe). NULL when it cannot be made; cachalot_last_error() then says why. */
CACHALOT_API cachalot_allocator *cachalot_default(void);

/* Allocates `size` bytes on `device` for use on stream `s`. size 0 gives *out = NULL and succeeds.
 * Fails with CACHALOT_ERROR_OUT_OF_MEMORY (message as PyTorch's) when the memory cannot be had
 * after freeing cached blocks; what is already allocated stays valid. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_malloc(cachalot_allocator *a, int device, size_t size,
                                                                cachalot_stream s, void **out);

/* Frees a pointer from cachalot_malloc. NULL is a no-op. A pointer cachalot did not hand out, an
 * interior pointer or one already freed is CACHALOT_ERROR_INVALID_POINTER and changes nothing. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_free(cachalot_allocator *a, void *ptr);

/* Marks the allocation `ptr` as used by stream `s` (ignored for its own allocation stream): its memory
 * will not be reused until the work enqueued on `s` before its free() has completed. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_record_stream(cachalot_allocator *a, void *ptr,
                                                                       cachalot_stream s);

/* CUDA IPC (PyTorch's shareIpcHandle): the IPC handle of the device allocation that holds the block at
 * `ptr` (cudaIpcGetMemHandle of its segment) and ptr's offset in that allocation, for another process's
 * cudaIpcOpenMemHandle. The program must keep the block allocated while another process has it open.
 * CACHALOT_ERROR_NOT_SUPPORTED for a block of an expandable segment (mapped pages have no such handle). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_ipc_handle(cachalot_allocator *a, void *ptr,
                                                                    unsigned char handle[64], size_t *offset);

/* Waits for outstanding events, then gives every whole free cached segment back to the device. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_empty_cache(cachalot_allocator *a);

/* Caps the memory cachalot reserves on `device` to fraction x device total (fraction in [0, 1]). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_set_memory_fraction(cachalot_allocator *a, int device,
                                                                             double fraction);

/* The memory fraction in force on `device` (1.0 when none was set, as PyTorch's getMemoryFraction). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_get_memory_fraction(cachalot_allocator *a, int device,
                                                                             double *out);

/* Adds an observer called at every out-of-memory failure (see cachalot_oom_observer). */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_attach_oom_observer(cachalot_allocator *a,
                                                                             cachalot_oom_observer fn,
                                                                             void *ctx);

/* The number of devices of the allocator's backend. */
CACHALOT_API CACHALOT_NODISCARD cachalot_status cachalot_device_count(cachalot_allocator *a, int *out);

#ifdef __cplusplus
}
#endif
#endif
