#include "plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cachalot_allocator *cl_plugin_allocator(const char *who) {
  cachalot_allocator *a = cachalot_default();
  if (!a) {
    fprintf(stderr, "%s: %s\n", who, cachalot_last_error());
    return NULL;
  }
  const char *conf = getenv("CACHALOT_ALLOC_CONF");
  if (conf && strstr(conf, "detect_captures"))
    return a;
  /* the user's string with the key added, so that snapshots show what is in force */
  static const char key[] = "detect_captures:True";
  const size_t n = (conf ? strlen(conf) : 0) + sizeof key + 1;
  char *s = malloc(n);
  if (!s) {
    fprintf(stderr, "%s: host out of memory turning on capture detection\n", who);
    return a;
  }
  snprintf(s, n, "%s%s%s", conf && *conf ? conf : "", conf && *conf ? "," : "", key);
  if (cachalot_set_settings(a, s) != CACHALOT_OK)
    fprintf(stderr, "%s: turning on capture detection: %s\n", who, cachalot_last_error());
  free(s);
  return a;
}
