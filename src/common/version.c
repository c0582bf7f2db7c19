/* The library's version, from the build (meson.build's project version). */
#include <cachalot/status.h>

#ifndef CACHALOT_VERSION
#error "CACHALOT_VERSION is set by the build"
#endif

const char *cachalot_version(void) { return CACHALOT_VERSION; }
