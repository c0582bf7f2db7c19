#include "error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { MSG_CAP = 1024 };

static _Thread_local char last_msg[MSG_CAP];

cachalot_status cl_fail(cachalot_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  return s;
}

void cl_error_prefix(const char *fmt, ...) {
  char prefix[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  if (n <= 0)
    return;
  size_t plen = (size_t)n < sizeof prefix ? (size_t)n : sizeof prefix - 1;
  size_t mlen = strnlen(last_msg, MSG_CAP - 1);
  if (plen + mlen > MSG_CAP - 1)
    mlen = MSG_CAP - 1 - plen; /* keep the prefix; cut the old message's tail */
  memmove(last_msg + plen, last_msg, mlen);
  memcpy(last_msg, prefix, plen);
  last_msg[plen + mlen] = '\0';
}

const char *cl_error_message(void) { return last_msg; }

const char *cachalot_last_error(void) { return cl_error_message(); }
const char *cachalot_status_name(cachalot_status s) { return cl_status_name(s); }

const char *cl_status_name(cachalot_status s) {
  switch (s) {
  case CACHALOT_OK: return "CACHALOT_OK";
  case CACHALOT_ERROR_OUT_OF_MEMORY: return "CACHALOT_ERROR_OUT_OF_MEMORY";
  case CACHALOT_ERROR_INVALID_ARGUMENT: return "CACHALOT_ERROR_INVALID_ARGUMENT";
  case CACHALOT_ERROR_INVALID_POINTER: return "CACHALOT_ERROR_INVALID_POINTER";
  case CACHALOT_ERROR_INVALID_STATE: return "CACHALOT_ERROR_INVALID_STATE";
  case CACHALOT_ERROR_CONFIG: return "CACHALOT_ERROR_CONFIG";
  case CACHALOT_ERROR_DEVICE: return "CACHALOT_ERROR_DEVICE";
  case CACHALOT_ERROR_NOT_SUPPORTED: return "CACHALOT_ERROR_NOT_SUPPORTED";
  }
  return "CACHALOT_STATUS_UNKNOWN";
}

/* The handler and its context change together, rarely; a reader takes one consistent pair under the lock
 * (two buffers swapped by an index were not enough: two setters could write the same buffer, and a reader
 * could read one a later setter was writing). Warnings are rare: a mutex costs nothing that matters. */
typedef struct {
  cachalot_warning_handler fn;
  void *ctx;
} warning_sink;
static warning_sink sink;
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;

void cachalot_set_warning_handler(cachalot_warning_handler fn, void *ctx) {
  pthread_mutex_lock(&sink_lock);
  sink = (warning_sink){fn, ctx};
  pthread_mutex_unlock(&sink_lock);
}

/* Warnings and notes share the handler; only stderr's prefix tells them apart. */
static void emit(const char *prefix, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  pthread_mutex_lock(&sink_lock);
  const warning_sink s = sink;
  pthread_mutex_unlock(&sink_lock);
  if (s.fn)
    s.fn(msg, s.ctx);
  else
    fprintf(stderr, "cachalot: %s%s\n", prefix, msg);
}

void cl_warn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("warning: ", fmt, ap);
  va_end(ap);
}

void cl_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("", fmt, ap);
  va_end(ap);
}
