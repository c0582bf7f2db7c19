/* The first pass of the pickle reader (snapshot_pickle_ops.h): what each opcode is and takes, and a
 * walk over them that refuses what could run code before any value is made. */
#include "snapshot_pickle_ops.h"

#include <stdio.h>
#include <string.h>

/* What the first pass knows of an opcode: its name, its argument (n >= 0 bytes, or -1, -4, -8: a
 * length of that many bytes and then as many bytes), and whether it is read, refused because it could
 * run code or build objects (`what` says what it does), or refused as data a snapshot does not hold. */
typedef enum { K_NONE, K_READ, K_CODE, K_DATA } op_kind;
typedef struct {
  const char *name;
  signed char arg;
  op_kind kind;
  const char *what;
} op_info;

#define READ(op, n, a) [op] = {n, a, K_READ, NULL}
#define CODE(op, n, w) [op] = {n, 0, K_CODE, w}
#define DATA(op, n, w) [op] = {n, 0, K_DATA, w}
static const op_info ops[256] = {
    READ(OP_MARK, "MARK", 0), READ(OP_STOP, "STOP", 0), READ(OP_POP, "POP", 0), READ(OP_POP_MARK, "POP_MARK", 0),
    READ(OP_BININT, "BININT", 4), READ(OP_BININT1, "BININT1", 1), READ(OP_BININT2, "BININT2", 2),
    READ(OP_NONE, "NONE", 0), READ(OP_BINUNICODE, "BINUNICODE", -4), READ(OP_APPEND, "APPEND", 0),
    READ(OP_DICT, "DICT", 0), READ(OP_EMPTY_DICT, "EMPTY_DICT", 0), READ(OP_APPENDS, "APPENDS", 0),
    READ(OP_BINGET, "BINGET", 1), READ(OP_LONG_BINGET, "LONG_BINGET", 4), READ(OP_LIST, "LIST", 0),
    READ(OP_EMPTY_LIST, "EMPTY_LIST", 0), READ(OP_BINPUT, "BINPUT", 1), READ(OP_LONG_BINPUT, "LONG_BINPUT", 4),
    READ(OP_SETITEM, "SETITEM", 0), READ(OP_TUPLE, "TUPLE", 0), READ(OP_EMPTY_TUPLE, "EMPTY_TUPLE", 0),
    READ(OP_SETITEMS, "SETITEMS", 0), READ(OP_BINFLOAT, "BINFLOAT", 8), READ(OP_PROTO, "PROTO", 1),
    READ(OP_TUPLE1, "TUPLE1", 0), READ(OP_TUPLE2, "TUPLE2", 0), READ(OP_TUPLE3, "TUPLE3", 0),
    READ(OP_NEWTRUE, "NEWTRUE", 0), READ(OP_NEWFALSE, "NEWFALSE", 0), READ(OP_LONG1, "LONG1", -1),
    READ(OP_LONG4, "LONG4", -4), READ(OP_SHORT_BINUNICODE, "SHORT_BINUNICODE", -1),
    READ(OP_BINUNICODE8, "BINUNICODE8", -8), READ(OP_EMPTY_SET, "EMPTY_SET", 0), READ(OP_ADDITEMS, "ADDITEMS", 0),
    READ(OP_FROZENSET, "FROZENSET", 0), READ(OP_MEMOIZE, "MEMOIZE", 0), READ(OP_FRAME, "FRAME", 8),
    CODE(OP_GLOBAL, "GLOBAL", "names a global"), CODE(OP_INST, "INST", "names a class to instantiate"),
    CODE(0x93, "STACK_GLOBAL", "looks up a global (STACK_GLOBAL)"), CODE('R', "REDUCE", "calls an object (REDUCE)"),
    CODE('b', "BUILD", "sets an object's state (BUILD)"), CODE('o', "OBJ", "builds an object (OBJ)"),
    CODE(0x81, "NEWOBJ", "builds an object (NEWOBJ)"), CODE(0x92, "NEWOBJ_EX", "builds an object (NEWOBJ_EX)"),
    CODE('P', "PERSID", "asks for a persistent object (PERSID)"),
    CODE('Q', "BINPERSID", "asks for a persistent object (BINPERSID)"),
    CODE(0x82, "EXT1", "names a registered extension (EXT1)"), CODE(0x83, "EXT2", "names a registered extension (EXT2)"),
    CODE(0x84, "EXT4", "names a registered extension (EXT4)"),
    DATA('B', "BINBYTES", "bytes"), DATA('C', "SHORT_BINBYTES", "bytes"), DATA(0x8e, "BINBYTES8", "bytes"),
    DATA(0x96, "BYTEARRAY8", "bytes"), DATA('T', "BINSTRING", "bytes"), DATA('U', "SHORT_BINSTRING", "bytes"),
    DATA('S', "STRING", "bytes"), DATA(0x97, "NEXT_BUFFER", "an out-of-band buffer"),
    DATA(0x98, "READONLY_BUFFER", "an out-of-band buffer"), DATA('I', "INT", "protocol 0"),
    DATA('L', "LONG", "protocol 0"), DATA('F', "FLOAT", "protocol 0"), DATA('V', "UNICODE", "protocol 0"),
    DATA('g', "GET", "protocol 0"), DATA('p', "PUT", "protocol 0"), DATA('2', "DUP", "protocol 0"),
};
#undef READ
#undef CODE
#undef DATA

typedef struct {
  const char *name;
  char *err;
  const unsigned char *d;
  size_t len;
} pk;

/* -1 with "NAME: message" in the reader's err. */
#define fail(p, ...) as_read_fail((p)->name, (p)->err, __VA_ARGS__)

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), and no NUL, which would
 * cut a C string short. The offset of the first bad byte, or SIZE_MAX. */
size_t as_utf8_bad(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    if (c >= 0x01 && c < 0x80) {
      i++;
      continue;
    }
    size_t k = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
    if (k == 0 || n - i <= k)
      return i;
    unsigned lo = 0x80, hi = 0xbf;
    if (c == 0xe0)
      lo = 0xa0;
    else if (c == 0xed)
      hi = 0x9f;
    else if (c == 0xf0)
      lo = 0x90;
    else if (c == 0xf4)
      hi = 0x8f;
    if (s[i + 1] < lo || s[i + 1] > hi)
      return i;
    for (size_t j = 2; j <= k; j++)
      if ((s[i + j] & 0xc0) != 0x80)
        return i;
    i += k + 1;
  }
  return SIZE_MAX;
}

uint64_t as_pickle_le(const unsigned char *b, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = v << 8 | b[i];
  return v;
}

/* GLOBAL's and INST's "module\nname\n", printable for the message ('?' for anything else). */
static void global_names(const pk *p, size_t at, char out[96]) {
  size_t o = 0, lines = 0;
  for (size_t i = at + 1; i < p->len && lines < 2 && o < 90; i++) {
    unsigned char ch = p->d[i];
    if (ch == '\n') {
      if (++lines < 2)
        out[o++] = ' ';
    } else {
      out[o++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
  }
  out[o] = '\0';
}

/* The first pass: every opcode known and allowed, every argument inside the data, STOP last. Counts
 * the memo's stores, which bound its keys. */
int as_pickle_scan(const char *name, const unsigned char *data, size_t len, size_t *memo_ops, char err[AS_ERR_LEN]) {
  pk pkv = {.name = name, .err = err, .d = data, .len = len}, *p = &pkv;
  const unsigned char *d = p->d;
  if (p->len < 1 || d[0] != OP_PROTO)
    return fail(p, "not a pickle of protocol 2 or later (it does not start with PROTO)");
  if (p->len < 2)
    return fail(p, "not a whole pickle: it ends inside PROTO at byte 0 (truncated file?)");
  if (d[1] < 2 || d[1] > 5)
    return fail(p, "pickle protocol %u is not read (protocols 2 to 5 are)", d[1]);
  *memo_ops = 0;
  for (size_t i = 0; i < p->len;) {
    unsigned op = d[i];
    const op_info *o = &ops[op];
    if (o->kind == K_NONE)
      return fail(p, "not a pickle, or a damaged one: byte %zu is 0x%02x, which is no opcode", i, op);
    if (o->kind == K_CODE) {
      char names[96];
      global_names(p, i, names);
      if (op == OP_GLOBAL || op == OP_INST)
        return fail(p, "refused: the pickle %s (%s) at byte %zu: only plain data is read", o->what, names, i);
      return fail(p, "refused: the pickle %s at byte %zu: only plain data is read", o->what, i);
    }
    if (o->kind == K_DATA) {
      if (strcmp(o->what, "protocol 0") == 0)
        return fail(p, "%s at byte %zu is an opcode of protocol 0, which is not read (2 to 5 are)", o->name, i);
      return fail(p, "%s at byte %zu holds %s, which a snapshot does not hold: not read", o->name, i, o->what);
    }
    size_t left = p->len - i - 1, need = o->arg >= 0 ? (size_t)o->arg : (size_t)-o->arg;
    if (left < need)
      return fail(p, "not a whole pickle: it ends inside %s at byte %zu (truncated file?)", o->name, i);
    if (o->arg < 0) {
      uint64_t n = as_pickle_le(d + i + 1, need);
      if (op == OP_LONG4 && n >= (1u << 31))
        return fail(p, "LONG4 at byte %zu has a negative length", i);
      if (n > left - need)
        return fail(p, "%s at byte %zu says %llu bytes follow, but %zu do (truncated or damaged file?)", o->name, i,
                    (unsigned long long)n, left - need);
      need += (size_t)n;
    }
    if (op == OP_FRAME && as_pickle_le(d + i + 1, 8) > left - 8)
      return fail(p, "FRAME at byte %zu says %llu bytes follow, but %zu do (truncated or damaged file?)", i,
                  (unsigned long long)as_pickle_le(d + i + 1, 8), left - 8);
    if (op == OP_PROTO && i != 0)
      return fail(p, "a second PROTO at byte %zu: not one pickle", i);
    if (op == OP_MEMOIZE || op == OP_BINPUT || op == OP_LONG_BINPUT)
      (*memo_ops)++;
    i += 1 + need;
    if (op == OP_STOP) {
      if (i == p->len)
        return 0;
      return fail(p, "%zu bytes after the end of the pickle (STOP at byte %zu): not one pickle", p->len - i, i - 1);
    }
  }
  return fail(p, "not a whole pickle: it ends without STOP (truncated file?)");
}
/* The size of an opcode and its argument (scan checked it fits). */
size_t as_pickle_op_size(const unsigned char *d, size_t at) {
  const op_info *o = &ops[d[at]];
  if (o->arg >= 0)
    return 1 + (size_t)o->arg;
  size_t w = (size_t)-o->arg;
  return 1 + w + (size_t)as_pickle_le(d + at + 1, w);
}
