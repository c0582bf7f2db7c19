/* The command line's advice in place of the C API's (see cuda_hint.h). */
#include "cuda_hint.h"

#include <stdio.h>
#include <string.h>

void tool_cuda_hint(char *buf, size_t len, const char *msg, const char *hint) {
  size_t keep = strlen(msg);
  const char *api = strstr(msg, "cachalot_backend_sim()");
  if (api != NULL) {
    const char *clause = api;
    while (clause > msg && clause[-1] != ';')
      clause--;
    keep = clause > msg ? (size_t)(clause - 1 - msg) : 0;
  }
  snprintf(buf, len, "%.*s%s%s", (int)keep, msg, keep > 0 ? "; " : "", hint);
}
