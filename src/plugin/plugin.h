/* What the PyTorch plug-in and the interposer share. */
#ifndef CACHALOT_PLUGIN_PLUGIN_H
#define CACHALOT_PLUGIN_PLUGIN_H

#include <cachalot/cachalot.h>

/* cachalot_default() (the CUDA backend, $CACHALOT_ALLOC_CONF) with capture detection turned on, unless
 * the config names detect_captures itself: callers of a plug-in cannot tell cachalot about captures.
 * NULL when the allocator cannot start; the reason goes to stderr after `who`. Call it once. */
cachalot_allocator *cl_plugin_allocator(const char *who);

#endif
