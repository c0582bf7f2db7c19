/* The internal side of the error convention: a failing function calls cl_fail(), which records a
 * message for cachalot_last_error() in thread-local storage and returns the status unchanged, so the
 * idiom is `return cl_fail(CACHALOT_ERROR_..., "what went wrong: %d", x);`. */
#ifndef CACHALOT_COMMON_ERROR_H
#define CACHALOT_COMMON_ERROR_H

#include <cachalot/status.h>

#if defined(__GNUC__)
#define CL_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define CL_LIKELY(x) __builtin_expect(!!(x), 1)
#define CL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CL_PRINTF(f, a)
#define CL_LIKELY(x) (x)
#define CL_UNLIKELY(x) (x)
#endif

/* Records the message (printf format) and returns `s`. */
cachalot_status cl_fail(cachalot_status s, const char *fmt, ...) CL_PRINTF(2, 3);

/* Sends a warning to the handler set with cachalot_set_warning_handler (stderr by default). */
void cl_warn(const char *fmt, ...) CL_PRINTF(1, 2);

/* Sends a note the user asked for (where a debugging variable wrote its file) the same way, printed to
 * stderr as "cachalot: ..." by default. */
void cl_note(const char *fmt, ...) CL_PRINTF(1, 2);

/* Prefixes the current thread's message with printf-formatted context ("cachalot_free: " ...). */
void cl_error_prefix(const char *fmt, ...) CL_PRINTF(1, 2);
/* The calling thread's last message (what cachalot_last_error returns), for the library's own use. */
const char *cl_error_message(void);
/* The name of s's enumerator ("CACHALOT_ERROR_DEVICE"); cachalot_status_name is a shell over it. */
const char *cl_status_name(cachalot_status s);

#endif
