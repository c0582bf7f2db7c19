/* libFuzzer target: the snapshot reader (tools/common/snapshot_reader.c), which every subcommand
 * runs on files it is given, and the summaries `show` computes from what it read. Any bytes must be
 * read or refused with a message, never crash; a snapshot that was read must hold together (blocks
 * inside the arrays it says, summaries computable). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_snapshot/cli.h"
#include "common/snapshot_reader.h"
#include "alloc_snapshot/summary.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  as_snapshot s;
  char err[AS_ERR_LEN];
  err[0] = '\0';
  if (as_snapshot_parse("fuzz", (const char *)data, size, &s, err) != 0) {
    if (!err[0]) {
      fprintf(stderr, "fuzz_snapshot: refused without a message\n");
      abort();
    }
    return 0;
  }
  as_group *groups = NULL;
  size_t n_groups = 0;
  if (as_group_segments(&s, &groups, &n_groups) == 0) {
    for (size_t i = 0; i < n_groups; i++)
      (void)as_fragmentation(&groups[i]);
    free(groups);
  }
  const as_segment **sorted = as_sorted_segments(&s);
  free((void *)sorted);
  char buf[AS_SIZE_BUF];
  for (size_t i = 0; i < s.n_segments; i++) {
    const as_segment *seg = &s.segments[i];
    (void)as_fmt_size(buf, seg->total_size, false);
    for (size_t k = 0; k < seg->n_blocks; k++)
      (void)as_block_state_name(seg->blocks[k].state);
  }
  for (size_t d = 0; d < s.n_devices; d++)
    for (size_t k = 0; k < s.traces[d].n; k++)
      (void)as_action_name(s.traces[d].entries[k].action);
  as_snapshot_free(&s);
  return 0;
}
