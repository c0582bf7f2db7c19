/* What graph.c gives graphed.c: the capture, replay and lifetime of a cachalot_graph, with the errors
 * of the entry points of the same names (cachalot_graph_create and so on are shells over these). */
#ifndef CACHALOT_GRAPH_GRAPH_H
#define CACHALOT_GRAPH_GRAPH_H

#include <cachalot/cachalot.h>

cachalot_status cl_graph_create(cachalot_allocator *a, int device, bool keep_graph, cachalot_graph **out);
cachalot_status cl_graph_capture_begin(cachalot_graph *g, cachalot_stream s, cachalot_mempool_id pool,
                                       cachalot_capture_mode mode);
cachalot_status cl_graph_capture_end(cachalot_graph *g);
cachalot_status cl_graph_replay(cachalot_graph *g, cachalot_stream s);
void cl_graph_destroy(cachalot_graph *g);

#endif
