/* What the stats room gives the rooms above it (process/export.c's snapshot files and socket replies):
 * the JSON documents, with the errors of cachalot_snapshot_json and cachalot_memory_stats_json, which are
 * shells over these. */
#ifndef CACHALOT_STATS_STATS_H
#define CACHALOT_STATS_STATS_H

#include <cachalot/cachalot.h>

cachalot_status cl_snapshot_json(cachalot_allocator *a, char **json);
cachalot_status cl_memory_stats_json(cachalot_allocator *a, int device, char **json);

#endif
