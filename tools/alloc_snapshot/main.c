/* alloc_snapshot: the command line tool a person uses to see where device memory went (issue 4).
 * This file only dispatches to the subcommands; each lives in its own file (show.c, segments.c,
 * diff.c, replay.c, folded.c, ...); the snapshot reader is tools/common/snapshot_reader.h. */
#include <cachalot/status.h>

#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: alloc_snapshot COMMAND [ARGS]\n"
    "       alloc_snapshot --help | --version\n"
    "\n"
    "Looks at memory snapshots of cachalot or PyTorch (torch.cuda.memory._snapshot()).\n"
    "\n"
    "commands:\n"
    "  show FILE       summary per device, pool and stream; the largest segments\n"
    "  segments FILE   the segments, filtered by device, pool or stream, as a JSON array\n"
    "  summary FILE... one row per file (rank) of a job: peaks, skew between ranks, the worst rank\n"
    "  diff A B        what changed between two snapshots, per pool and segment\n"
    "  replay TRACE    replays a trace's allocations through cachalot; reports the peaks\n"
    "  dump            the snapshot of a live process, over its CACHALOT_SNAPSHOT_SOCKET\n"
    "  plot FILE       one self-contained HTML page: the segment map and memory over time\n"
    "  convert IN OUT  a snapshot from JSON to a PyTorch pickle or back (gzip'ed or not)\n"
    "  folded FILE     who held the memory at its peak, as folded stacks for flame graphs\n"
    "\n"
    "FILE is snapshot JSON or a PyTorch pickle, gzip'ed or not ('-' reads standard input). An output\n"
    "(-o) of '-' is standard output; one that is a regular file is replaced atomically; anything else\n"
    "(a device, a FIFO) is written through, and a symbolic link stays a link.\n"
    "Exit status: 0 success, 1 failure (unreadable or malformed file, allocator error), 2 usage error.\n"
    "'alloc_snapshot COMMAND --help' describes a command.\n";

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"show", as_cmd_show},
    {"segments", as_cmd_segments},
    {"summary", as_cmd_summary},
    {"diff", as_cmd_diff},
    {"replay", as_cmd_replay},
    {"dump", as_cmd_dump},
    {"plot", as_cmd_plot},
    {"convert", as_cmd_convert},
    {"folded", as_cmd_folded},
};

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return AS_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--version") == 0) {
    printf("alloc_snapshot %s\n", cachalot_version());
    return as_finish_stdout("--version", AS_EXIT_OK);
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    if (strcmp(cmd, "help") == 0 && argc > 2) {
      /* "help CMD" is "CMD --help". */
      char *help_argv[] = {argv[2], "--help", NULL};
      for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[2], commands[i].name) == 0)
          return commands[i].run(2, help_argv);
      fprintf(stderr, "alloc_snapshot help: unknown command '%s'\n\n%s", argv[2], usage);
      return AS_EXIT_USAGE;
    }
    fputs(usage, stdout);
    return as_finish_stdout("help", AS_EXIT_OK);
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "alloc_snapshot: unknown command '%s'\n\n%s", cmd, usage);
  return AS_EXIT_USAGE;
}
