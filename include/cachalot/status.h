/* cachalot: status codes and the error convention.
 *
 * Every call returns a cachalot_status. CACHALOT_OK is 0; anything else is a failure, and
 * cachalot_last_error() then holds a message in words for the calling thread (valid until that
 * thread's next failing call). Out-parameters are cleared (NULL / 0) before anything can fail, so a
 * caller never reads a stale value after an error.
 */
#ifndef CACHALOT_STATUS_H
#define CACHALOT_STATUS_H

#if defined(CACHALOT_STATIC_DEFINE)
#define CACHALOT_API
#elif defined(__GNUC__)
#define CACHALOT_API __attribute__((visibility("default")))
#else
#define CACHALOT_API
#endif

#if defined(__GNUC__)
#define CACHALOT_NODISCARD __attribute__((warn_unused_result))
#else
#define CACHALOT_NODISCARD
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cachalot_status {
  CACHALOT_OK = 0,
  CACHALOT_ERROR_OUT_OF_MEMORY,    /* the device (or a memory fraction) cannot hold the request */
  CACHALOT_ERROR_INVALID_ARGUMENT, /* NULL out-pointer, bad device index, bad fraction, ... */
  CACHALOT_ERROR_INVALID_POINTER,  /* a pointer cachalot did not hand out, or already freed */
  CACHALOT_ERROR_INVALID_STATE,    /* the call is not allowed in the current state */
  CACHALOT_ERROR_CONFIG,           /* a malformed or invalid configuration string */
  CACHALOT_ERROR_DEVICE,           /* the device / driver failed (no GPU, no driver, CUDA error) */
  CACHALOT_ERROR_NOT_SUPPORTED     /* not available in this build or not implemented (see README) */
} cachalot_status;

/* The library's version, "MAJOR.MINOR.PATCH" (the Python package's cachalot.__version__ is the same). */
CACHALOT_API const char *cachalot_version(void);

/* The status's name, e.g. "CACHALOT_ERROR_OUT_OF_MEMORY". Never NULL. */
CACHALOT_API const char *cachalot_status_name(cachalot_status s);

/* The calling thread's last error message ("" if none yet). Never NULL. */
CACHALOT_API const char *cachalot_last_error(void);

/* Warnings (calls that succeed but deserve attention, e.g. an empty captured graph) go to this handler;
 * by default they are printed to stderr as "cachalot: warning: ...". So do the notes of the snapshot
 * variables (where CACHALOT_SNAPSHOT_AT_EXIT wrote its file), printed as "cachalot: ...". NULL restores
 * the default. The handler may be called from any thread. */
typedef void (*cachalot_warning_handler)(const char *message, void *ctx);
CACHALOT_API void cachalot_set_warning_handler(cachalot_warning_handler fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
