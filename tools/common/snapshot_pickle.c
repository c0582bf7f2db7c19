/* The pickle reader of snapshot_pickle.h: a first pass over the opcodes (what may run, lengths, the
 * end), then a pickle machine for plain data that makes the cJSON tree. */
#include "snapshot_pickle.h"
#include "snapshot_pickle_ops.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bits of a node's type that cJSON leaves alone (it masks types with 0xff and tests 256 and 512
 * only), for what the machine must know of a value while it runs; cleared before the tree is handed
 * over. Containers keep their height (for the nesting bound) in valueint, which cJSON does not use for
 * them; reset too. */
enum {
  F_MEMO = 1 << 12,   /* the memo points at it: never freed before the end */
  F_SHARED = 1 << 13, /* a GET copied it or made it: changing it would break the copy */
  F_FROZEN = 1 << 14, /* a tuple or frozenset: nothing adds to it */
  F_SET = 1 << 15,    /* a set: ADDITEMS adds to it, APPEND does not */
  F_FLOAT = 1 << 16,  /* made by BINFLOAT: not a dict key */
  F_MINE = F_MEMO | F_SHARED | F_FROZEN | F_SET | F_FLOAT
};



typedef struct {
  const char *name;
  char *err;
  const unsigned char *d;
  size_t len;
  cJSON **stack; /* values; each is the root of its own tree */
  size_t sp, stack_cap;
  size_t *marks; /* stack heights at each MARK */
  size_t n_marks, marks_cap;
  cJSON **memo; /* borrowed: a value on the stack, inside one, or orphaned */
  size_t memo_cap, memo_len;
  cJSON **orphans; /* values off the stack that the memo may still point into: freed at the end */
  size_t n_orphans, orphans_cap;
  size_t nodes, max_nodes, copied_bytes, max_bytes;
} pk;

/* -1 with "NAME: message" in the reader's err. */
#define fail(p, ...) as_read_fail((p)->name, (p)->err, __VA_ARGS__)

static int count_nodes(pk *p, size_t n, size_t at) {
  if (n > p->max_nodes - p->nodes)
    return fail(p, "the pickle expands to more than %zu values (at byte %zu; a memo bomb?): refused", p->max_nodes,
                at);
  p->nodes += n;
  return 0;
}

/* Bytes of strings and keys a memo GET copies. */
static int count_bytes(pk *p, size_t n, size_t at) {
  if (n > p->max_bytes - p->copied_bytes)
    return fail(p, "the pickle expands to more than %zu MiB of strings (at byte %zu; a memo bomb?): refused",
                p->max_bytes >> 20, at);
  p->copied_bytes += n;
  return 0;
}

/* A new value of a cJSON type (a string's text set by the caller). */
static cJSON *new_node(pk *p, int type, size_t at) {
  if (count_nodes(p, 1, at) != 0)
    return NULL;
  cJSON *n = cJSON_CreateNull();
  if (n == NULL) {
    fail(p, "out of host memory at byte %zu", at);
    return NULL;
  }
  n->type = type;
  return n;
}

static int push(pk *p, cJSON *v, size_t at) {
  if (v == NULL)
    return -1;
  if (p->sp == p->stack_cap) {
    size_t cap = p->stack_cap ? p->stack_cap * 2 : 64;
    cJSON **s = realloc(p->stack, cap * sizeof *s);
    if (s == NULL) {
      cJSON_Delete(v);
      return fail(p, "out of host memory at byte %zu", at);
    }
    p->stack = s;
    p->stack_cap = cap;
  }
  p->stack[p->sp++] = v;
  return 0;
}

/* Off the stack, kept until the end: the memo may point at it or into it. */
static int orphan(pk *p, cJSON *v, size_t at) {
  if (p->n_orphans == p->orphans_cap) {
    size_t cap = p->orphans_cap ? p->orphans_cap * 2 : 64;
    cJSON **o = realloc(p->orphans, cap * sizeof *o);
    if (o == NULL) {
      cJSON_Delete(v); /* nothing can GET it: the parse ends with this error */
      return fail(p, "out of host memory at byte %zu", at);
    }
    p->orphans = o;
    p->orphans_cap = cap;
  }
  p->orphans[p->n_orphans++] = v;
  return 0;
}

/* The stack height of the innermost MARK (0 without one): values above it are this level's. */
static size_t base(const pk *p) { return p->n_marks ? p->marks[p->n_marks - 1] : 0; }

static int need_items(pk *p, size_t n, const char *op, size_t at) {
  if (p->sp - base(p) < n)
    return fail(p, "%s at byte %zu needs %zu value%s on the stack, there %s %zu: a damaged pickle", op, at, n,
                n == 1 ? "" : "s", p->sp - base(p) == 1 ? "is" : "are", p->sp - base(p));
  return 0;
}

/* Pops the innermost MARK: the values above it are p->stack[*from .. sp). */
static int pop_mark(pk *p, const char *op, size_t at, size_t *from) {
  if (p->n_marks == 0)
    return fail(p, "%s at byte %zu without a MARK before it: a damaged pickle", op, at);
  *from = p->marks[--p->n_marks];
  return 0;
}

static bool container(const cJSON *v) { return cJSON_IsArray(v) || cJSON_IsObject(v); }
static int height(const cJSON *v) { return container(v) ? v->valueint : 0; }
/* The values in v's tree: containers count theirs in valuedouble, which cJSON does not use for them. */
static size_t tree_size(const cJSON *v) { return 1 + (container(v) ? (size_t)v->valuedouble : 0); }

/* Appends child to parent (an array, or an object with `key`, which it then owns). */
static int attach(pk *p, cJSON *parent, cJSON *child, char *key, size_t at) {
  int h = height(child) + 1;
  if (h > parent->valueint) {
    if (h > CJSON_NESTING_LIMIT) {
      free(key);
      orphan(p, child, at);
      return fail(p, "nested deeper than %d levels at byte %zu", CJSON_NESTING_LIMIT, at);
    }
    parent->valueint = h;
  }
  parent->valuedouble += (double)tree_size(child);
  child->string = key;
  child->next = NULL;
  if (parent->child == NULL) {
    parent->child = child;
    child->prev = child;
  } else {
    cJSON *last = parent->child->prev; /* cJSON keeps the last child in the first one's prev */
    last->next = child;
    child->prev = last;
    parent->child->prev = child;
  }
  return 0;
}

/* A container that values may be added to by `op`: a dict for SETITEM(S), a list for APPEND(S), a set
 * for ADDITEMS, and none that a GET copied (Python would change the one object both name). */
static int open_container(pk *p, const cJSON *c, int want, const char *op, size_t at) {
  bool ok = want == cJSON_Object ? cJSON_IsObject(c)
                                 : cJSON_IsArray(c) && !(c->type & F_FROZEN) &&
                                       (want == F_SET) == ((c->type & F_SET) != 0);
  if (!ok)
    return fail(p, "%s at byte %zu adds to something that is not a %s: a damaged pickle", op, at,
                want == cJSON_Object ? "dict" : want == F_SET ? "set" : "list");
  if (c->type & F_SHARED)
    return fail(p, "%s at byte %zu changes a container after the memo shared it (a cycle, or one object "
                   "built in pieces): not data a tree holds",
                op, at);
  return 0;
}

/* A dict key as text: a string's own, an integer's decimal digits (as json.dumps writes them). The
 * key's node is freed or, when the memo holds it, kept. NULL after a message. */
static char *key_text(pk *p, cJSON *k, size_t at) {
  char *text = NULL;
  if (cJSON_IsString(k)) {
    if (k->type & F_MEMO) {
      text = strdup(k->valuestring);
    } else {
      text = k->valuestring;
      k->valuestring = NULL;
    }
  } else if (cJSON_IsNumber(k) && !(k->type & F_FLOAT)) {
    char buf[32];
    double d = k->valuedouble; /* exact by construction: see make_int */
    if (d < 0)
      snprintf(buf, sizeof buf, "%lld", (long long)d);
    else
      snprintf(buf, sizeof buf, "%llu", (unsigned long long)d);
    text = strdup(buf);
  } else {
    fail(p, "a dict key at byte %zu is %s, not a string or an integer: not data a snapshot holds", at,
         cJSON_IsNumber(k) ? "a float" : cJSON_IsBool(k) ? "a boolean" : cJSON_IsNull(k) ? "None" : "a tuple");
    orphan(p, k, at);
    return NULL;
  }
  if (text == NULL)
    fail(p, "out of host memory at byte %zu", at);
  if (k->type & F_MEMO)
    orphan(p, k, at);
  else
    cJSON_Delete(k);
  return text;
}

/* Adds stack[from..sp) to container c: key-value pairs for a dict, values otherwise. */
static int add_items(pk *p, cJSON *c, size_t from, size_t at) {
  size_t n = p->sp - from;
  if (cJSON_IsObject(c) && n % 2 != 0)
    return fail(p, "a dict's items at byte %zu are %zu values, not pairs: a damaged pickle", at, n);
  int r = 0;
  size_t i = from;
  for (; i < p->sp && r == 0;) {
    char *key = NULL;
    if (cJSON_IsObject(c)) {
      key = key_text(p, p->stack[i], at);
      p->stack[i++] = NULL;
      if (key == NULL) {
        r = -1;
        break;
      }
    }
    cJSON *v = p->stack[i];
    p->stack[i++] = NULL;
    r = attach(p, c, v, key, at);
  }
  for (; i < p->sp; i++) /* after an error: what was not added */
    if (p->stack[i] != NULL)
      orphan(p, p->stack[i], at);
  p->sp = from;
  return r;
}

/* An integer as a number node. cJSON holds numbers as doubles, so an integer a double cannot hold
 * exactly (above 2^53 with low bits set) would silently become another: refused, naming it. */
static cJSON *make_int(pk *p, bool neg, uint64_t mag, size_t at) {
  int bits = mag ? 64 - __builtin_clzll(mag) : 0;
  if (bits > 53 && (mag & ((UINT64_C(1) << (bits - 53)) - 1)) != 0) {
    fail(p, "the integer %s%llu at byte %zu cannot be held exactly: snapshot numbers are doubles, exact to 2^53",
         neg ? "-" : "", (unsigned long long)mag, at);
    return NULL;
  }
  cJSON *n = new_node(p, cJSON_Number, at);
  if (n != NULL) {
    double d = neg ? -(double)mag : (double)mag;
    cJSON_SetNumberValue(n, d);
  }
  return n;
}

/* LONG1 and LONG4: a little-endian two's complement integer of n bytes, held if it fits 64 bits
 * (as unsigned when positive, signed when negative) once the sign bytes Python never writes are cut. */
static cJSON *make_long(pk *p, const unsigned char *b, size_t n, size_t at) {
  while (n > 1 && ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xff && (b[n - 2] & 0x80))))
    n--;
  bool neg = n > 0 && (b[n - 1] & 0x80);
  if ((!neg && (n > 9 || (n == 9 && b[8] != 0))) || (neg && n > 8)) {
    fail(p, "an integer of %zu bytes at byte %zu is wider than 64 bits: not a snapshot number", n, at);
    return NULL;
  }
  uint64_t raw = as_pickle_le(b, n > 8 ? 8 : n);
  uint64_t mag = !neg ? raw : n == 8 ? ~raw + 1 : (UINT64_C(1) << (8 * n)) - raw;
  return make_int(p, neg, mag, at);
}

static cJSON *make_float(pk *p, const unsigned char *b, size_t at) {
  uint64_t bits = 0;
  for (int i = 0; i < 8; i++)
    bits = bits << 8 | b[i]; /* big-endian */
  double d;
  memcpy(&d, &bits, sizeof d);
  if (d != d || d - d != 0) {
    fail(p, "a float at byte %zu is %s: JSON has no such number, and snapshots hold none", at,
         d != d ? "NaN" : "infinite");
    return NULL;
  }
  cJSON *n = new_node(p, cJSON_Number | F_FLOAT, at);
  if (n != NULL)
    cJSON_SetNumberValue(n, d);
  return n;
}

static cJSON *make_string(pk *p, const unsigned char *s, size_t n, size_t at) {
  size_t bad = as_utf8_bad(s, n);
  if (bad != SIZE_MAX) {
    fail(p, "the string at byte %zu %s at its byte %zu: not text a snapshot holds", at,
         s[bad] == 0 ? "holds a NUL" : "is not valid UTF-8", bad);
    return NULL;
  }
  char *text = malloc(n + 1);
  cJSON *v = text ? new_node(p, cJSON_String, at) : NULL;
  if (v == NULL) {
    if (text == NULL)
      fail(p, "out of host memory at byte %zu", at);
    free(text);
    return NULL;
  }
  memcpy(text, s, n);
  text[n] = '\0';
  v->valuestring = text;
  return v;
}

/* A deep copy of what the memo holds, counted against the bounds. */
static cJSON *copy(pk *p, const cJSON *src, size_t at) {
  cJSON *c = new_node(p, src->type & ~(F_MEMO | F_SHARED), at);
  if (c == NULL)
    return NULL;
  if (!container(src)) { /* a container's height and size grow back as its children are attached */
    c->valueint = src->valueint;
    c->valuedouble = src->valuedouble;
  }
  if (src->valuestring != NULL) {
    size_t n = strlen(src->valuestring);
    if (count_bytes(p, n, at) != 0) {
      cJSON_Delete(c);
      return NULL;
    }
    c->valuestring = malloc(n + 1);
    if (c->valuestring == NULL) {
      fail(p, "out of host memory at byte %zu", at);
      cJSON_Delete(c);
      return NULL;
    }
    memcpy(c->valuestring, src->valuestring, n + 1);
  }
  for (const cJSON *e = src->child; e != NULL; e = e->next) {
    cJSON *ce = copy(p, e, at);
    if (ce != NULL && e->string && count_bytes(p, strlen(e->string), at) != 0) {
      cJSON_Delete(ce);
      cJSON_Delete(c);
      return NULL;
    }
    char *key = e->string ? strdup(e->string) : NULL;
    if (ce == NULL || (e->string && key == NULL)) {
      if (ce != NULL)
        fail(p, "out of host memory at byte %zu", at);
      cJSON_Delete(ce);
      cJSON_Delete(c);
      return NULL;
    }
    attach(p, c, ce, key, at); /* no deeper than src */
  }
  return c;
}

static int memo_put(pk *p, uint64_t key, size_t at) {
  if (p->sp == base(p))
    return fail(p, "a memo store at byte %zu with nothing on the stack: a damaged pickle", at);
  if (key >= p->memo_cap)
    return fail(p, "memo key %llu at byte %zu is out of range (the pickle stores %zu values)",
                (unsigned long long)key, at, p->memo_cap);
  if (p->memo[key] == NULL)
    p->memo_len++;
  p->memo[key] = p->stack[p->sp - 1];
  p->memo[key]->type |= F_MEMO;
  return 0;
}

static int memo_get(pk *p, uint64_t key, size_t at) {
  if (key >= p->memo_cap || p->memo[key] == NULL)
    return fail(p, "memo key %llu at byte %zu was never stored: a damaged pickle", (unsigned long long)key, at);
  cJSON *src = p->memo[key];
  src->type |= F_SHARED;
  /* Counted whole before any of it is made, so that a memo bomb stops at its first copy too large. */
  size_t n = tree_size(src);
  if (count_nodes(p, n, at) != 0)
    return -1;
  p->nodes -= n;
  cJSON *c = copy(p, src, at);
  if (c != NULL)
    c->type |= F_SHARED;
  return push(p, c, at);
}

/* A container made of the values above the innermost MARK (DICT, LIST, TUPLE, FROZENSET). */
static int from_mark(pk *p, int type, const char *op, size_t at) {
  size_t from = 0;
  if (pop_mark(p, op, at, &from) != 0)
    return -1;
  cJSON *c = new_node(p, type, at);
  if (c == NULL)
    return -1;
  if (add_items(p, c, from, at) != 0) {
    orphan(p, c, at);
    return -1;
  }
  return push(p, c, at);
}

/* TUPLE1, TUPLE2, TUPLE3: the top n values as one array. */
static int tuple_n(pk *p, size_t n, const char *op, size_t at) {
  if (need_items(p, n, op, at) != 0)
    return -1;
  cJSON *c = new_node(p, cJSON_Array | F_FROZEN, at);
  if (c == NULL)
    return -1;
  if (add_items(p, c, p->sp - n, at) != 0) {
    orphan(p, c, at);
    return -1;
  }
  return push(p, c, at);
}

/* SETITEMS, APPENDS, ADDITEMS: the values above the innermost MARK into the container below it. */
static int add_from_mark(pk *p, int want, const char *op, size_t at) {
  size_t from = 0;
  if (pop_mark(p, op, at, &from) != 0)
    return -1;
  if (from == base(p))
    return fail(p, "%s at byte %zu has no container below its MARK: a damaged pickle", op, at);
  cJSON *c = p->stack[from - 1];
  if (open_container(p, c, want, op, at) != 0)
    return -1;
  return add_items(p, c, from, at);
}

/* SETITEM and APPEND: the top one or two values into the container below them. */
static int add_top(pk *p, int want, size_t n, const char *op, size_t at) {
  if (need_items(p, n + 1, op, at) != 0)
    return -1;
  cJSON *c = p->stack[p->sp - n - 1];
  if (open_container(p, c, want, op, at) != 0)
    return -1;
  return add_items(p, c, p->sp - n, at);
}

static int mark(pk *p, size_t at) {
  if (p->n_marks == p->marks_cap) {
    size_t cap = p->marks_cap ? p->marks_cap * 2 : 16;
    size_t *m = realloc(p->marks, cap * sizeof *m);
    if (m == NULL)
      return fail(p, "out of host memory at byte %zu", at);
    p->marks = m;
    p->marks_cap = cap;
  }
  p->marks[p->n_marks++] = p->sp;
  return 0;
}

/* POP (Python drops the innermost MARK when its level is empty) and POP_MARK. */
static int pop(pk *p, bool to_mark, size_t at) {
  size_t to = p->sp - 1;
  if (to_mark) {
    if (pop_mark(p, "POP_MARK", at, &to) != 0)
      return -1;
  } else if (p->sp == base(p)) {
    if (p->n_marks == 0)
      return fail(p, "POP at byte %zu with nothing on the stack: a damaged pickle", at);
    p->n_marks--;
    return 0;
  }
  while (p->sp > to)
    if (orphan(p, p->stack[--p->sp], at) != 0)
      return -1;
  return 0;
}

/* One opcode at byte `at` (its argument right after it, checked by scan). */
static int step(pk *p, size_t at) {
  const unsigned char *a = p->d + at + 1;
  unsigned op = p->d[at];
  switch (op) {
  case OP_PROTO:
  case OP_FRAME: /* the first pass checked its length; frames only group the opcodes */
    return 0;
  case OP_MARK: return mark(p, at);
  case OP_POP: return pop(p, false, at);
  case OP_POP_MARK: return pop(p, true, at);
  case OP_NONE: return push(p, new_node(p, cJSON_NULL, at), at);
  case OP_NEWTRUE: return push(p, new_node(p, cJSON_True, at), at);
  case OP_NEWFALSE: return push(p, new_node(p, cJSON_False, at), at);
  case OP_BININT1: return push(p, make_int(p, false, a[0], at), at);
  case OP_BININT2: return push(p, make_int(p, false, as_pickle_le(a, 2), at), at);
  case OP_BININT: {
    int32_t v = (int32_t)(uint32_t)as_pickle_le(a, 4);
    return push(p, make_int(p, v < 0, v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v, at), at);
  }
  case OP_LONG1: return push(p, make_long(p, a + 1, a[0], at), at);
  case OP_LONG4: return push(p, make_long(p, a + 4, as_pickle_le(a, 4), at), at);
  case OP_BINFLOAT: return push(p, make_float(p, a, at), at);
  case OP_SHORT_BINUNICODE: return push(p, make_string(p, a + 1, a[0], at), at);
  case OP_BINUNICODE: return push(p, make_string(p, a + 4, as_pickle_le(a, 4), at), at);
  case OP_BINUNICODE8: return push(p, make_string(p, a + 8, as_pickle_le(a, 8), at), at);
  case OP_EMPTY_DICT: return push(p, new_node(p, cJSON_Object, at), at);
  case OP_EMPTY_LIST: return push(p, new_node(p, cJSON_Array, at), at);
  case OP_EMPTY_TUPLE: return push(p, new_node(p, cJSON_Array | F_FROZEN, at), at);
  case OP_EMPTY_SET: return push(p, new_node(p, cJSON_Array | F_SET, at), at);
  case OP_DICT: return from_mark(p, cJSON_Object, "DICT", at);
  case OP_LIST: return from_mark(p, cJSON_Array, "LIST", at);
  case OP_TUPLE: return from_mark(p, cJSON_Array | F_FROZEN, "TUPLE", at);
  case OP_FROZENSET: return from_mark(p, cJSON_Array | F_FROZEN, "FROZENSET", at);
  case OP_TUPLE1: return tuple_n(p, 1, "TUPLE1", at);
  case OP_TUPLE2: return tuple_n(p, 2, "TUPLE2", at);
  case OP_TUPLE3: return tuple_n(p, 3, "TUPLE3", at);
  case OP_SETITEM: return add_top(p, cJSON_Object, 2, "SETITEM", at);
  case OP_APPEND: return add_top(p, cJSON_Array, 1, "APPEND", at);
  case OP_SETITEMS: return add_from_mark(p, cJSON_Object, "SETITEMS", at);
  case OP_APPENDS: return add_from_mark(p, cJSON_Array, "APPENDS", at);
  case OP_ADDITEMS: return add_from_mark(p, F_SET, "ADDITEMS", at);
  case OP_MEMOIZE: return memo_put(p, p->memo_len, at);
  case OP_BINPUT: return memo_put(p, a[0], at);
  case OP_LONG_BINPUT: return memo_put(p, as_pickle_le(a, 4), at);
  case OP_BINGET: return memo_get(p, a[0], at);
  case OP_LONG_BINGET: return memo_get(p, as_pickle_le(a, 4), at);
  default: return fail(p, "opcode 0x%02x at byte %zu is not read", op, at); /* scan let none else by */
  }
}

/* The flags and heights the machine kept in the tree, cleared (the tree is at most
 * CJSON_NESTING_LIMIT deep). */
static void clear_marks(cJSON *v) {
  v->type &= ~F_MINE;
  if (container(v)) {
    v->valueint = 0;
    v->valuedouble = 0;
    for (cJSON *e = v->child; e != NULL; e = e->next)
      clear_marks(e);
  }
}

cJSON *as_pickle_parse(const char *name, const char *data, size_t len, char err[AS_ERR_LEN]) {
  pk p = {.name = name, .err = err, .d = (const unsigned char *)data, .len = len};
  /* Expansion through the memo is bounded by the input's size (PyTorch's pickles expand a few values
   * per byte, sharing frames) and by AS_PICKLE_MAX_NODES. */
  p.max_nodes = len > AS_PICKLE_MAX_NODES / AS_PICKLE_NODES_PER_BYTE ? AS_PICKLE_MAX_NODES
                                                                       : len * AS_PICKLE_NODES_PER_BYTE;
  if (p.max_nodes < AS_PICKLE_MIN_NODES)
    p.max_nodes = AS_PICKLE_MIN_NODES;
  p.max_bytes = len > AS_MAX_INPUT_BYTES / AS_PICKLE_BYTES_PER_BYTE ? AS_MAX_INPUT_BYTES
                                                                      : len * AS_PICKLE_BYTES_PER_BYTE;
  if (p.max_bytes < AS_PICKLE_MIN_BYTES)
    p.max_bytes = AS_PICKLE_MIN_BYTES;
  err[0] = '\0';
  size_t memo_ops = 0, at = 0;
  int r = as_pickle_scan(name, p.d, len, &memo_ops, err);
  if (r == 0) {
    p.memo_cap = memo_ops;
    p.memo = calloc(memo_ops ? memo_ops : 1, sizeof *p.memo);
    if (p.memo == NULL)
      r = fail(&p, "out of host memory for a memo of %zu values", memo_ops);
  }
  for (; r == 0 && p.d[at] != OP_STOP; at += as_pickle_op_size(p.d, at))
    r = step(&p, at);
  cJSON *root = NULL;
  if (r == 0 && (p.sp != 1 || p.n_marks != 0))
    fail(&p, "the pickle ends (STOP at byte %zu) with %zu values and %zu MARKs on its stack, not one value", at, p.sp,
         p.n_marks);
  else if (r == 0)
    root = p.stack[--p.sp];
  while (p.sp > 0)
    cJSON_Delete(p.stack[--p.sp]);
  for (size_t i = 0; i < p.n_orphans; i++)
    cJSON_Delete(p.orphans[i]);
  free(p.stack);
  free(p.marks);
  free(p.memo);
  free(p.orphans);
  if (root != NULL)
    clear_marks(root);
  return root;
}
