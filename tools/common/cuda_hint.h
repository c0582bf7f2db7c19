/* What the tools say when the CUDA backend cannot be had. The library's message ends with advice for a
 * C program ("use cachalot_backend_sim() for a simulated device"); a user of a command line needs the
 * tool's own flag instead (alloc_snapshot replay --backend sim, alloc_bench -a cachalot-sim). */
#ifndef TOOLS_COMMON_CUDA_HINT_H
#define TOOLS_COMMON_CUDA_HINT_H

#include <stddef.h>

/* Copies `msg` into buf, the clause that names cachalot_backend_sim() replaced by `hint` (appended
 * where there is none, so the flag is named whatever the library's wording). */
void tool_cuda_hint(char *buf, size_t len, const char *msg, const char *hint);

#endif
