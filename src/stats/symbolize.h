/* Return addresses of recorded C stacks as names, files and lines, for the snapshot writer: the cost is
 * paid when a snapshot is written, never when a stack is recorded. One symbolizer serves one snapshot
 * and looks each distinct address up once. */
#ifndef CACHALOT_STATS_SYMBOLIZE_H
#define CACHALOT_STATS_SYMBOLIZE_H

#include <stdbool.h>

typedef struct cl_symbolizer cl_symbolizer;

/* What a frame is written as: "name", "filename", "line" of the snapshot's frames. */
typedef struct {
  const char *name;     /* the function (demangled), or the address as 0x... when no symbol covers it */
  const char *filename; /* the source file, else the object file, else "??" */
  int line;             /* the line of the call (0 when unknown) */
} cl_frame_info;

/* NULL on host OOM (the writer then writes addresses alone). */
cl_symbolizer *cl_symbolizer_new(void);
/* addr is a return address, as backtrace() gives them: the call before it is looked up, so that line is
 * the line of the call. The result lives as long as the symbolizer. */
cl_frame_info cl_symbolize(cl_symbolizer *s, void *addr);
void cl_symbolizer_free(cl_symbolizer *s);
/* Whether frames are named through libdw in this process (debug info: files and lines), or only from the
 * dynamic symbols (dladdr): libdw when the build has its loader (-Dlibdw) and libdw.so.1 was opened with
 * every function bound. Opens it the first time, as the first symbolization does. */
bool cl_symbolize_has_libdw(void);
/* For the tests of the fallback: the library opened in place of libdw.so.1 (NULL: none). Only before the
 * first symbolization of the process, which reads it once. */
void cl_symbolize_libdw_soname(const char *soname);
/* A C++ name demangled into a malloc'ed string, or NULL (not mangled, or no demangler in the process). */
char *cl_demangle(const char *name);

#endif
