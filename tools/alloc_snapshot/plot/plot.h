/* alloc_snapshot plot: what the files of plot/ share: the page being written, the explorer page
 * (explorer.c) and the snapshot's data in it (explorer_data.c); plot.c holds the command. */
#ifndef ALLOC_SNAPSHOT_PLOT_H
#define ALLOC_SNAPSHOT_PLOT_H

#include <stddef.h>
#include <stdio.h>

#include "../../common/snapshot_reader.h"

/* The page being written. Its stream's errors are sticky: the command checks them once, when it closes
 * the output (common/outfile.h). */
typedef struct {
  FILE *f;
} page;

/* The whole explorer page of devices[0 .. n_devices). 0, or -1 on host OOM. */
int as_write_explorer(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices);
/* The snapshot's data as the page's JSON document (explorer_data.c describes it). 0, or -1 on host OOM. */
int as_explorer_data(page *p, const char *input, const as_snapshot *snap, const int *devices, size_t n_devices);

#endif
