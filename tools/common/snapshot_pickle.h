/* PyTorch's memory snapshots as pickles (torch.cuda.memory._dump_snapshot() pickles _snapshot()): read
 * into the same cJSON tree that snapshot JSON gives, so the schema checks of snapshot_reader.c run on
 * either, and written back from such a tree.
 *
 * The reader is a pickle machine for plain data only (protocols 2 to 5): dicts, lists, tuples and sets
 * (the last two as arrays), strings, integers, floats, booleans and None, and the memo. Every opcode
 * that imports, calls or builds an object (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ,
 * NEWOBJ_EX, PERSID, BINPERSID, EXT1/2/4) is refused, naming the opcode and its byte offset, by a first
 * pass over the opcodes that runs before any value is made; so are bytes, out-of-band buffers and the
 * text opcodes of protocols 0 and 1. That pass also checks every length against the bytes left, that
 * the pickle ends with STOP and nothing after it.
 *
 * The second pass makes the tree. A memo GET copies what the memo holds (a cJSON node has one parent),
 * so shared objects (PyTorch's frames) are expanded, within bounds that grow with the pickle's size: at
 * most AS_PICKLE_NODES_PER_BYTE values per byte of it (AS_PICKLE_MIN_NODES to AS_PICKLE_MAX_NODES) and
 * AS_PICKLE_BYTES_PER_BYTE bytes of copied strings and keys per byte (AS_PICKLE_MIN_BYTES to
 * AS_MAX_INPUT_BYTES), so that a memo bomb ends there, nesting at most CJSON_NESTING_LIMIT deep as in JSON. Data a tree cannot hold is refused: a container changed after a
 * GET copied it (a cycle), a dict key that is not a string or an integer (integer keys become their
 * decimal text, as json.dumps writes them), an integer a double cannot hold exactly (the JSON path keeps
 * numbers as doubles; its value is named), NaN and infinities (JSON has none), strings that are not
 * UTF-8 or hold a NUL. A key repeated in one dict, which Python's pickler never writes, is kept twice
 * as the JSON reader keeps a repeated JSON key. */
#ifndef TOOLS_COMMON_SNAPSHOT_PICKLE_H
#define TOOLS_COMMON_SNAPSHOT_PICKLE_H

#include <stdbool.h>
#include <stddef.h>

#include "snapshot_reader.h"

/* The most values a pickle may expand to through its memo (each one a cJSON node of 64 bytes): 16 per
 * byte of the pickle, at least 2^20 and at most 2^25. */
#define AS_PICKLE_NODES_PER_BYTE ((size_t)16)
#define AS_PICKLE_MIN_NODES ((size_t)1 << 20)
#define AS_PICKLE_MAX_NODES ((size_t)1 << 25)
/* The most bytes of strings and dict keys GETs may copy: 128 per byte of the pickle (PyTorch's shared
 * frames copy a few dozen), at least 64 MiB and at most AS_MAX_INPUT_BYTES. */
#define AS_PICKLE_BYTES_PER_BYTE ((size_t)128)
#define AS_PICKLE_MIN_BYTES ((size_t)64 << 20)

/* True when data looks like a pickle (protocol 2 or later starts with the PROTO opcode, 0x80). */
static inline bool as_is_pickle(const char *data, size_t len) { return len > 0 && (unsigned char)data[0] == 0x80; }

/* The tree of the pickle in data[0..len), or NULL with "NAME: message" in err. The snapshot reader's
 * as_json_parse calls this for data as_is_pickle takes, so every reader of snapshots reads pickles. */
cJSON *as_pickle_parse(const char *name, const char *data, size_t len, char err[AS_ERR_LEN]);

/* The tree as a protocol 4 pickle (no frames; Python 3.4 and later read it): objects as dicts (items
 * in SETITEMS batches), arrays as lists (APPENDS batches), whole numbers in [-2^63, 2^64) as exact
 * integers, other numbers as BINFLOAT, strings as UTF-8 with each byte that is not UTF-8 (JSON text may
 * hold them) as U+FFFD, counted in *not_utf8. 0 with a malloc'ed buffer in *out, or -1 when host memory
 * ran out. */
int as_pickle_write(const cJSON *root, unsigned char **out, size_t *out_len, size_t *not_utf8);

#endif
