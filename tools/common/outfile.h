/* The files the tools write (alloc_snapshot's -o, alloc_bench's --csv, --json, --svg and `svg OUT`).
 *
 * "-" is standard output, as on every command line that names a file: it is written and flushed, never
 * closed (the tool may print more after it). A regular file, or a path where nothing is yet, is written
 * to a temporary file beside it that is then renamed onto it: a reader never sees half a file, and a run
 * that fails leaves the old file as it was.
 * Anything else is written through, as a shell's redirection would: renaming onto a device, a FIFO or a
 * symbolic link replaces it with a regular file (run as root, `-o /dev/full` turned the device into
 * one). A symbolic link to a regular file stays a link: the file it names is the one replaced. Errors
 * that only show when the buffers are flushed or the file is closed (a full disk; /dev/full) are errors
 * like any other. */
#ifndef TOOLS_COMMON_OUTFILE_H
#define TOOLS_COMMON_OUTFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
  FILE *f;    /* what to write to: stdout for "-" */
  char *tmp;  /* the temporary file, renamed onto dest at the end; NULL when writing through */
  char *dest; /* the file that tmp replaces */
} tool_out;

/* Opens `path` for writing ("-": standard output). 0, or -1 with the reason ("it is a directory",
 * strerror's text) in `why`. */
int tool_out_open(tool_out *o, const char *path, char *why, size_t why_len);

/* How messages name `path`: "standard output" for "-", else the path itself. */
const char *tool_out_name(const char *path);

/* Ends the writing and releases `o`. With `keep`, flushes, and puts a temporary file in place: 0, or -1
 * with the reason in `why` when anything written could not be (the temporary file is removed then).
 * Without `keep` (the caller failed half way), removes the temporary file and returns -1. */
int tool_out_close(tool_out *o, bool keep, char *why, size_t why_len);

#endif
