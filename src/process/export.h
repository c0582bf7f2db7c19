/* Snapshots driven by environment variables (export.c): what process.c and the tests call. */
#ifndef CACHALOT_PROCESS_EXPORT_H
#define CACHALOT_PROCESS_EXPORT_H

#include <stdbool.h>
#include <stddef.h>

#include <cachalot/allocator.h>

/* Reads the CACHALOT_SNAPSHOT_* variables (once per process) and, if any is set, adds `a` to the live
 * allocators they serve and sets its OOM hook. Called before `a` is handed out. */
void cl_export_register(cachalot_allocator *a);
/* CACHALOT_RECORD_HISTORY=N[,stacks]: turns history (and C stacks) on for `a`; a malformed value is
 * ignored with a warning. Called before `a` is handed out. */
void cl_export_history_from_env(cachalot_allocator *a);
/* Takes `a` out of the live allocators; after it returns no request or exit snapshot reads `a`. */
void cl_export_unregister(cachalot_allocator *a);
/* Answers one request of the snapshot socket on a connected fd (what the socket thread does after the
 * credential check; the socket fuzzer calls it on a socketpair). */
void cl_export_serve(int fd);
/* An environment variable's path with "%p" replaced by the pid, "%r" by the rank (RANK, else LOCAL_RANK,
 * when a plain number; else nothing) and "%h" by the host name, into out[cap]; false, with out empty, when
 * it does not fit (or nothing is left). */
bool cl_export_expand_path(const char *in, char *out, size_t cap);

#endif
