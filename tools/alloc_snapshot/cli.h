/* alloc_snapshot: what the subcommands share: exit codes, option-value parsing, size formatting,
 * an aligned text table, and the final check that stdout was really written. */
#ifndef ALLOC_SNAPSHOT_CLI_H
#define ALLOC_SNAPSHOT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text.h" /* src/common/: the byte formatter */

/* Exit statuses of every subcommand. */
enum { AS_EXIT_OK = 0, AS_EXIT_FAILURE = 1, AS_EXIT_USAGE = 2 };

/* Entry points of the subcommands: argv[0] is the subcommand's name. */
int as_cmd_show(int argc, char **argv);
int as_cmd_segments(int argc, char **argv);
int as_cmd_summary(int argc, char **argv);
/* summary's table over n files (ranks.c); `cmd` names the command in messages (show with several files
 * gives the same table). */
int as_summarize_ranks(const char *cmd, char **files, size_t n, bool exact, bool json);
int as_cmd_diff(int argc, char **argv);
int as_cmd_replay(int argc, char **argv);
int as_cmd_dump(int argc, char **argv);
int as_cmd_plot(int argc, char **argv);
int as_cmd_convert(int argc, char **argv);
int as_cmd_folded(int argc, char **argv);

/* Prints "alloc_snapshot CMD: MESSAGE\n" to stderr and returns AS_EXIT_USAGE, with a hint to --help. */
int as_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The check of a subcommand that takes exactly one operand, named `what` (FILE, TRACE) in its messages:
 * AS_EXIT_OK when argv[optind] is the only operand, else a usage error ("no FILE given", "one FILE
 * expected, got N arguments"). */
int as_one_operand(const char *cmd, const char *what, int argc, int optind);
/* Prints "alloc_snapshot CMD: MESSAGE\n" to stderr and returns AS_EXIT_FAILURE. */
int as_failure(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* getopt_long with this tool's messages: returns the next option, -1 after the last, or '?' after
 * printing a usage error (unknown option, missing value). `shortopts` must begin with ':'. Non-option
 * arguments are moved to the end (GNU order), so "show FILE --top 3" works. */
struct option;
int as_getopt(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *longopts);

/* A decimal integer in [0, max], all of the text (no sign, no spaces). */
bool as_parse_u64(const char *text, uint64_t max, uint64_t *out);
/* A byte count: an integer with an optional binary suffix K, M, G, T (or KiB, MiB, GiB, TiB), e.g.
 * "80G", "512MiB", "1048576". False on anything else or on overflow. */
bool as_parse_bytes(const char *text, uint64_t *out);

/* A byte count as the subcommands write it (src/common/text.h's formatter): the count alone with
 * --bytes (`exact`), else binary units with two decimals ("7.53 GiB", "512 B"). Returns buf. */
enum { AS_SIZE_BUF = CL_BYTES_BUF };
static inline char *as_fmt_size(char buf[AS_SIZE_BUF], uint64_t bytes, bool exact) {
  return cl_format_bytes(buf, bytes, exact ? CL_BYTES_EXACT : CL_BYTES_BINARY);
}
/* A signed change ("+2.00 MiB", "-512 B", "0 B"). */
char *as_fmt_delta(char buf[AS_SIZE_BUF], uint64_t before, uint64_t after, bool exact);

/* Adds a and b, saturating at UINT64_MAX: totals over hostile inputs never wrap around. */
static inline uint64_t as_sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* A text table: rows of cells printed with aligned columns. Columns listed in right_align (a string of
 * 'l'/'r', one per column) are right-aligned. Cells are copied. A host allocation failure makes the
 * table inert and as_table_print() return false. */
typedef struct {
  size_t n_cols, n_rows, cap_rows;
  char **cells; /* n_rows x n_cols */
  const char *align;
  bool oom;
} as_table;

void as_table_init(as_table *t, size_t n_cols, const char *align);
/* Appends one row of n_cols cells. */
void as_table_row(as_table *t, const char *const *cells);
/* Prints the table to stdout with `indent` spaces before every row; false after an allocation failure. */
bool as_table_print(const as_table *t, int indent);
void as_table_free(as_table *t);

/* Flushes stdout and reports a write error (a full disk, a closed pipe) as a failure of `cmd`. */
int as_finish_stdout(const char *cmd, int status);

/* Writes `len` bytes of `text` and a newline to `path`: standard output for "-", gzip'ed when the name
 * ends in ".gz", else a plain file; a regular file is replaced atomically, anything else written through
 * (common/outfile.h). AS_EXIT_OK, or AS_EXIT_FAILURE after a message naming the path. In output.c, apart
 * from the helpers above, which the snapshot fuzzer links without it. */
/* A snapshot file's name: its format from the extension under any ".gz" (1 pickle: .pickle or .pkl; 0
 * JSON: .json; -1 neither), and in *stem the length of the name without those extensions (convert's OUT,
 * summary's ranks). */
int as_snapshot_name(const char *name, size_t *stem);

int as_write_output(const char *cmd, const char *path, const char *text, size_t len);
/* The same for any bytes, with the trailing newline or without (a pickle). */
int as_write_file(const char *cmd, const char *path, const void *bytes, size_t len, bool newline);

#endif
