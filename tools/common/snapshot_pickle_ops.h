/* The pickle opcodes the snapshot reader knows, and its first pass over them (snapshot_pickle_scan.c),
 * shared by the two halves of the reader (snapshot_pickle.c runs the second). */
#ifndef TOOLS_COMMON_SNAPSHOT_PICKLE_OPS_H
#define TOOLS_COMMON_SNAPSHOT_PICKLE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot_reader.h"

enum {
  OP_MARK = '(', OP_STOP = '.', OP_POP = '0', OP_POP_MARK = '1', OP_BININT = 'J', OP_BININT1 = 'K',
  OP_BININT2 = 'M', OP_NONE = 'N', OP_BINUNICODE = 'X', OP_APPEND = 'a', OP_DICT = 'd', OP_EMPTY_DICT = '}',
  OP_APPENDS = 'e', OP_BINGET = 'h', OP_LONG_BINGET = 'j', OP_LIST = 'l', OP_EMPTY_LIST = ']', OP_BINPUT = 'q',
  OP_LONG_BINPUT = 'r', OP_SETITEM = 's', OP_TUPLE = 't', OP_EMPTY_TUPLE = ')', OP_SETITEMS = 'u',
  OP_BINFLOAT = 'G', OP_GLOBAL = 'c', OP_INST = 'i', OP_PROTO = 0x80, OP_TUPLE1 = 0x85, OP_TUPLE2 = 0x86,
  OP_TUPLE3 = 0x87, OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89, OP_LONG1 = 0x8a, OP_LONG4 = 0x8b,
  OP_SHORT_BINUNICODE = 0x8c, OP_BINUNICODE8 = 0x8d, OP_EMPTY_SET = 0x8f, OP_ADDITEMS = 0x90,
  OP_FROZENSET = 0x91, OP_MEMOIZE = 0x94, OP_FRAME = 0x95
};

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) and no NUL, which would
 * cut a C string short: the offset of the first bad byte of s[0..n), or SIZE_MAX. */
size_t as_utf8_bad(const unsigned char *s, size_t n);

/* n bytes at b as a little-endian unsigned integer (n <= 8). */
uint64_t as_pickle_le(const unsigned char *b, size_t n);

/* The first pass over d[0..len): protocol 2 to 5, every opcode known and plain data, every argument
 * inside the data, STOP at the end and nothing after it. Counts the memo's stores (*memo_ops), which
 * bound its keys. 0, or -1 with "NAME: message" in err. */
int as_pickle_scan(const char *name, const unsigned char *d, size_t len, size_t *memo_ops, char err[AS_ERR_LEN]);

/* The size of the opcode at d[at] with its argument (as_pickle_scan checked that it fits). */
size_t as_pickle_op_size(const unsigned char *d, size_t at);

#endif
