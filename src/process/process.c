/* The allocator as a process sees it: cachalot_create and cachalot_destroy are the core's lifecycle plus
 * the process services that hook in from here (the CACHALOT_SNAPSHOT_* exports), and cachalot_default is
 * the one allocator over the CUDA backend that plug-ins share. The services live above the core, so the
 * core never names them; a static link still pulls them in, since the public create calls them. */
#include "../allocator/internal.h"
#include "export.h"

#include <stdio.h>

static cachalot_status create(cachalot_backend *b, const char *conf, cachalot_allocator **out) {
  cachalot_status rc = cl_allocator_create(b, conf, out);
  if (rc == CACHALOT_OK) {
    cl_export_history_from_env(*out);
    cl_export_register(*out);
  }
  return rc;
}

cachalot_status cachalot_create(cachalot_backend *b, const char *conf, cachalot_allocator **out) {
  return create(b, conf, out);
}

void cachalot_destroy(cachalot_allocator *a) {
  /* In a forked child the allocator's memory, locks and device are the parent's: nothing is freed or
   * locked, so a child that exits cleanly never waits on a lock a parent's thread held at the fork. */
  if (!a || cl_forked(a))
    return;
  cl_export_unregister(a); /* first: no exit snapshot or socket request may read a half-freed allocator */
  cl_allocator_destroy(a);
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static cachalot_allocator *default_allocator;
static cachalot_status default_status;
static char default_error[512];

static void make_default(void) {
  cachalot_backend *b = NULL;
  default_status = cl_backend_cuda(&b);
  if (default_status == CACHALOT_OK) {
    default_status = create(b, NULL, &default_allocator);
    if (default_status != CACHALOT_OK)
      b->ops->destroy(b);
  }
  if (default_status != CACHALOT_OK)
    snprintf(default_error, sizeof default_error, "%s", cl_error_message());
}

cachalot_allocator *cachalot_default(void) {
  pthread_once(&default_once, make_default);
  if (!default_allocator)
    (void)cl_fail(default_status, "cachalot_default: %s", default_error);
  return default_allocator;
}
