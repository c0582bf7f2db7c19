/* CACHALOT_ALLOC_CONF parser (PyTorch's PYTORCH_CUDA_ALLOC_CONF grammar).
 *
 * The string is read token by token straight from the caller's buffer, with no heap and no token array:
 * the parser runs before the allocator exists, may be fed anything by a fuzzer, and must not leak on any
 * of its error paths. Everything is parsed into a local copy that reaches *out only on success, so a
 * failed parse leaves *out untouched and `out == base` is safe.
 *
 * Grammar (PyTorch's PYTORCH_CUDA_ALLOC_CONF):
 *   conf  := "" | pair ("," pair)* ","?
 *   pair  := key ":" value
 *   value := word | "[" (entry ("," entry)* ","?)? "]"      (lists only for roundup_power2_divisions)
 *   entry := word ":" word
 * where "[", "]", ",", ":" are one-character tokens, a word is a run of anything else except white
 * space, and white space only separates tokens. */
#include "config.h"

#include "../../common/c_locale.h"
#include "../../common/error.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONF "CACHALOT_ALLOC_CONF: "

enum {
  MIB = 1024 * 1024,
  MIN_MB = 20,  /* kLargeBuffer in MiB: smaller split limits would split 20 MiB segments */
  MAX_PAGE_MB = 1024, /* expandable_page_mb: pages are whole multiples of the 2 MiB mapping granularity of
                          current GPUs, and larger ones would only hold more memory per growth */
  WORD_MAX = 64 /* longer than any key or number we accept; bounds the stack copy strtod needs */
};

/* Largest power of two an unsigned holds: larger division counts cannot be stored. */
#define DIV_MAX (UINT_MAX / 2u + 1u)

typedef enum { TK_END, TK_WORD, TK_LBRACKET, TK_RBRACKET, TK_COMMA, TK_COLON } tok_kind;

/* A token points into the input; n is an int so it can go straight into "%.*s". */
typedef struct {
  tok_kind kind;
  const char *p;
  int n;
} tok;

typedef struct {
  const char *cur;
} lexer;

/* The C locale's white space, spelled out so the tokenizer does not depend on setlocale. */
static int is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static int is_punct(char ch) { return ch == '[' || ch == ']' || ch == ',' || ch == ':'; }

static cachalot_status lex_next(lexer *lx, tok *t) {
  const char *p = lx->cur;
  while (is_space(*p))
    p++;
  t->p = p;
  t->n = 1;
  switch (*p) {
  case '\0': t->kind = TK_END; t->n = 0; lx->cur = p; return CACHALOT_OK;
  case '[': t->kind = TK_LBRACKET; lx->cur = p + 1; return CACHALOT_OK;
  case ']': t->kind = TK_RBRACKET; lx->cur = p + 1; return CACHALOT_OK;
  case ',': t->kind = TK_COMMA; lx->cur = p + 1; return CACHALOT_OK;
  case ':': t->kind = TK_COLON; lx->cur = p + 1; return CACHALOT_OK;
  default: break;
  }
  int n = 0;
  while (p[n] != '\0' && !is_space(p[n]) && !is_punct(p[n])) {
    /* Fail before scanning the rest: the message shows only the first WORD_MAX characters anyway. */
    if (n == WORD_MAX)
      return cl_fail(CACHALOT_ERROR_CONFIG, CONF "'%.*s...' (truncated) is longer than %d characters",
                     WORD_MAX, p, WORD_MAX);
    n++;
  }
  t->kind = TK_WORD;
  t->n = n;
  lx->cur = p + n;
  return CACHALOT_OK;
}

/* The token as it reads in a "got ..." clause. */
static const char *describe(const tok *t, char *buf, size_t cap) {
  if (t->kind == TK_END)
    return "end of string";
  snprintf(buf, cap, "'%.*s'", t->n, t->p);
  return buf;
}

enum { GOT_CAP = WORD_MAX + 3 };

static int word_is(const tok *t, const char *s) {
  return t->kind == TK_WORD && (size_t)t->n == strlen(s) && memcmp(t->p, s, (size_t)t->n) == 0;
}

typedef enum { NUM_OK, NUM_BAD, NUM_RANGE } num_result;

/* Decimal digits only: strtoul would take signs, leading white space and hex, which PyTorch's users
 * could not have meant for a size. */
static num_result word_u64(const tok *t, uint64_t *out) {
  if (t->kind != TK_WORD || t->n == 0)
    return NUM_BAD;
  uint64_t v = 0;
  for (int i = 0; i < t->n; i++) {
    unsigned char ch = (unsigned char)t->p[i];
    if (ch < '0' || ch > '9')
      return NUM_BAD;
    unsigned d = ch - '0';
    if (v > (UINT64_MAX - d) / 10)
      return NUM_RANGE;
    v = v * 10 + d;
  }
  *out = v;
  return NUM_OK;
}

/* Finite decimal floats only. The character filter keeps strtod away from "nan", "inf" and hex floats,
 * which it would otherwise accept. */
static int word_double(const tok *t, double *out) {
  if (t->kind != TK_WORD || t->n == 0)
    return 0;
  for (int i = 0; i < t->n; i++) {
    char ch = t->p[i];
    if (!((ch >= '0' && ch <= '9') || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-'))
      return 0;
  }
  char buf[WORD_MAX + 1];
  memcpy(buf, t->p, (size_t)t->n);
  buf[t->n] = '\0';
  char *end = NULL;
  double v = cl_strtod_c(buf, &end);
  if (end != buf + t->n || !isfinite(v))
    return 0;
  *out = v == 0 ? 0.0 : v; /* -0 would read as "negative" to anyone testing the sign */
  return 1;
}

static int is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

static unsigned log2_pow2(uint64_t v) {
  unsigned i = 0;
  while (v > 1) {
    v >>= 1;
    i++;
  }
  return i;
}

static const char *range_note(num_result r) { return r == NUM_RANGE ? " (out of range)" : ""; }

/* ---- one function per kind of value ---------------------------------------------------------- */

static cachalot_status parse_mib(const char *key, const tok *v, size_t *out) {
  uint64_t mb = 0;
  num_result r = word_u64(v, &mb);
  if (r != NUM_OK || mb < MIN_MB) {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG, CONF "%s must be an integer >= %d (MiB), got %s%s", key, MIN_MB,
                   describe(v, got, sizeof got), range_note(r));
  }
  /* Past INT64_MAX bytes the stats (int64, as PyTorch's) cannot show the limit: treat it as "no limit",
   * which they show as -1. */
  *out = mb > (uint64_t)INT64_MAX / MIB ? SIZE_MAX : (size_t)mb * MIB;
  return CACHALOT_OK;
}

static cachalot_status parse_bool(const char *key, const tok *v, bool *out) {
  if (word_is(v, "True")) {
    *out = true;
  } else if (word_is(v, "False")) {
    *out = false;
  } else {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG, CONF "%s must be True or False, got %s", key,
                   describe(v, got, sizeof got));
  }
  return CACHALOT_OK;
}

static cachalot_status parse_max_split(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_mib("max_split_size_mb", v, &c->max_split_size);
}

static cachalot_status parse_max_non_split(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_mib("max_non_split_rounding_mb", v, &c->max_non_split_rounding);
}

static cachalot_status parse_gc(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  double d = 0;
  if (!word_double(v, &d) || !(d > 0 && d < 1)) {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "garbage_collection_threshold must be a number strictly between 0 and 1, got %s",
                   describe(v, got, sizeof got));
  }
  c->gc_threshold = d;
  return CACHALOT_OK;
}

static cachalot_status parse_fraction(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  double d = 0;
  if (!word_double(v, &d) || !(d >= 0 && d <= 1)) {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "per_process_memory_fraction must be a number in [0, 1], got %s",
                   describe(v, got, sizeof got));
  }
  c->memory_fraction = d;
  return CACHALOT_OK;
}

static cachalot_status parse_expandable(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("expandable_segments", v, &c->expandable_segments);
}

static cachalot_status parse_release_lock(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("release_lock_on_cudamalloc", v, &c->release_lock_on_cudamalloc);
}

static cachalot_status parse_capture_reuse(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("graph_capture_record_stream_reuse", v, &c->capture_reuse);
}

static cachalot_status parse_detect_captures(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("detect_captures", v, &c->detect_captures);
}

static cachalot_status parse_expandable_compact(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("expandable_compact", v, &c->expandable_compact);
}

static cachalot_status parse_expandable_plan(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("expandable_plan", v, &c->expandable_plan);
}

static cachalot_status parse_expandable_page(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  uint64_t mb = 0;
  num_result r = word_u64(v, &mb);
  if (r != NUM_OK || mb < 2 || mb > MAX_PAGE_MB || mb % 2) {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "expandable_page_mb must be an even integer from 2 to %d (MiB), got %s%s", MAX_PAGE_MB,
                   describe(v, got, sizeof got), range_note(r));
  }
  c->expandable_page = (size_t)mb * MIB;
  return CACHALOT_OK;
}

static cachalot_status parse_pinned_register(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  return parse_bool("pinned_use_cuda_host_register", v, &c->pinned_use_host_register);
}

static cachalot_status parse_pinned_threads(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  uint64_t n = 0;
  num_result r = word_u64(v, &n);
  if (r != NUM_OK || n < 1 || n > CL_MAX_REGISTER_THREADS || (n & (n - 1))) {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "pinned_num_register_threads must be a power of two from 1 to %d, got %s%s",
                   CL_MAX_REGISTER_THREADS, describe(v, got, sizeof got), range_note(r));
  }
  c->pinned_num_register_threads = (unsigned)n;
  return CACHALOT_OK;
}

/* A preset is a name for a set of keys, applied where it stands in the string: keys after it override
 * what it set. low_fragmentation is the config the README recommends where memory is tight. */
static cachalot_status parse_preset(lexer *lx, const tok *v, cl_config *c) {
  (void)lx;
  if (!word_is(v, "low_fragmentation")) {
    char got[GOT_CAP];
    return cl_fail(CACHALOT_ERROR_CONFIG, CONF "preset must be low_fragmentation, got %s",
                   describe(v, got, sizeof got));
  }
  c->expandable_segments = true;
  c->expandable_compact = true;
  c->expandable_plan = true;
  c->expandable_page = 2 * MIB;
  c->keys_set |= CL_KEY_EXPANDABLE | CL_KEY_EXPANDABLE_COMPACT | CL_KEY_EXPANDABLE_PLAN | CL_KEY_EXPANDABLE_PAGE;
  return CACHALOT_OK;
}

static cachalot_status roundup_unbalanced(void) {
  return cl_fail(CACHALOT_ERROR_CONFIG,
                 CONF "roundup_power2_divisions: unbalanced '[' (reached the end of the string before ']')");
}

/* A single N: the same divisions for every interval. */
static cachalot_status roundup_all(const tok *v, cl_config *c) {
  char got[GOT_CAP];
  uint64_t n = 0;
  num_result r = word_u64(v, &n);
  if (r != NUM_OK || !is_pow2(n) || n > DIV_MAX)
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "roundup_power2_divisions must be a power of 2 (at most %u) or a list "
                        "[interval_mb:divisions,...,>:divisions], got %s%s",
                   DIV_MAX, describe(v, got, sizeof got), range_note(r));
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
    c->roundup_divisions[i] = (unsigned)n;
  return CACHALOT_OK;
}

/* A list entry's key k: '>' (*rest), or an interval in MiB whose index is *index (clamped to the last). */
static cachalot_status roundup_interval(const tok *k, bool *rest, unsigned *index) {
  char got[GOT_CAP];
  if (k->kind != TK_WORD)
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "roundup_power2_divisions: expected an interval (a power of 2 in MiB) or '>' in "
                        "the list, got %s",
                   describe(k, got, sizeof got));
  *rest = word_is(k, ">");
  *index = 0;
  if (!*rest) {
    uint64_t mb = 0;
    num_result r = word_u64(k, &mb);
    if (r != NUM_OK || !is_pow2(mb))
      return cl_fail(CACHALOT_ERROR_CONFIG,
                     CONF "roundup_power2_divisions interval %s is not a power of 2 (a size in MiB) or "
                          "'>'%s",
                     describe(k, got, sizeof got), range_note(r));
    *index = log2_pow2(mb);
    if (*index > CL_ROUNDUP_INTERVALS - 1)
      *index = CL_ROUNDUP_INTERVALS - 1;
  }
  return CACHALOT_OK;
}

/* The rest of the entry of key k: ':' and its divisions (token *d), 0 or a power of 2. */
static cachalot_status roundup_divisions(lexer *lx, const tok *k, tok *d, uint64_t *div) {
  char got[GOT_CAP];
  cachalot_status st;
  tok colon;
  if ((st = lex_next(lx, &colon)) != CACHALOT_OK)
    return st;
  if (colon.kind != TK_COLON)
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "roundup_power2_divisions: expected ':' after interval '%.*s', got %s", k->n, k->p,
                   describe(&colon, got, sizeof got));

  if ((st = lex_next(lx, d)) != CACHALOT_OK)
    return st;
  *div = 0;
  num_result r = word_u64(d, div);
  if (r != NUM_OK || (*div != 0 && !is_pow2(*div)) || *div > DIV_MAX)
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "roundup_power2_divisions: divisions for interval '%.*s' must be 0 or a power of "
                        "2 (at most %u), got %s%s",
                   k->n, k->p, DIV_MAX, describe(d, got, sizeof got), range_note(r));
  return CACHALOT_OK;
}

/* Where an entry's divisions go, by the fill rules parse_roundup describes. */
static void roundup_fill(cl_config *c, bool rest, unsigned index, uint64_t div, unsigned *last_index,
                         bool *first_explicit) {
  if (rest) {
    for (unsigned i = *last_index + 1; i < CL_ROUNDUP_INTERVALS; i++)
      c->roundup_divisions[i] = (unsigned)div;
  } else {
    if (*first_explicit) {
      for (unsigned i = 0; i < index; i++)
        c->roundup_divisions[i] = (unsigned)div;
      *first_explicit = false;
    }
    c->roundup_divisions[index] = (unsigned)div;
    *last_index = index;
  }
}

/* Either one N for every interval, or `[k:v,...,>:v]`. The list keeps PyTorch's fill rules, which
 * users' existing strings depend on: the first explicit k also covers every interval below it, and
 * `>` covers every interval above the previous entry's (above interval 0 when it comes first), as torch
 * 2.11 fills them (earlier releases filled from the previous entry's interval inclusive). Intervals no
 * entry reaches keep the base's value, as in PyTorch where a list updates the current settings. */
static cachalot_status parse_roundup(lexer *lx, const tok *v, cl_config *c) {
  char got[GOT_CAP];
  if (v->kind == TK_WORD)
    return roundup_all(v, c);
  if (v->kind != TK_LBRACKET)
    return cl_fail(CACHALOT_ERROR_CONFIG,
                   CONF "roundup_power2_divisions must be a power of 2 or a list "
                        "[interval_mb:divisions,...,>:divisions], got %s",
                   describe(v, got, sizeof got));

  unsigned last_index = 0;
  bool first_explicit = true;
  for (;;) {
    cachalot_status st;
    tok k, d, sep;
    if ((st = lex_next(lx, &k)) != CACHALOT_OK)
      return st;
    if (k.kind == TK_RBRACKET) /* "[]" or a trailing comma, both accepted as PyTorch does */
      return CACHALOT_OK;
    if (k.kind == TK_END)
      return roundup_unbalanced();
    bool rest = false;
    unsigned index = 0;
    uint64_t div = 0;
    if ((st = roundup_interval(&k, &rest, &index)) != CACHALOT_OK ||
        (st = roundup_divisions(lx, &k, &d, &div)) != CACHALOT_OK)
      return st;
    roundup_fill(c, rest, index, div, &last_index, &first_explicit);

    if ((st = lex_next(lx, &sep)) != CACHALOT_OK)
      return st;
    if (sep.kind == TK_RBRACKET)
      return CACHALOT_OK;
    if (sep.kind == TK_END)
      return roundup_unbalanced();
    if (sep.kind != TK_COMMA)
      return cl_fail(CACHALOT_ERROR_CONFIG,
                     CONF "roundup_power2_divisions: expected ',' or ']' after '%.*s:%.*s', got %s", k.n, k.p,
                     d.n, d.p, describe(&sep, got, sizeof got));
  }
}

typedef cachalot_status (*value_parser)(lexer *lx, const tok *v, cl_config *c);

/* Each key once: its name, its CL_KEY_* bit and its value's parser. */
#define CL_KEYS(X)                                                                                       \
  X("max_split_size_mb", CL_KEY_MAX_SPLIT, parse_max_split)                                              \
  X("max_non_split_rounding_mb", CL_KEY_MAX_NON_SPLIT_ROUNDING, parse_max_non_split)                     \
  X("garbage_collection_threshold", CL_KEY_GC_THRESHOLD, parse_gc)                                       \
  X("roundup_power2_divisions", CL_KEY_ROUNDUP, parse_roundup)                                           \
  X("expandable_segments", CL_KEY_EXPANDABLE, parse_expandable)                                          \
  X("release_lock_on_cudamalloc", CL_KEY_RELEASE_LOCK, parse_release_lock)                               \
  X("per_process_memory_fraction", CL_KEY_FRACTION, parse_fraction)                                      \
  X("detect_captures", CL_KEY_DETECT_CAPTURES, parse_detect_captures)                                    \
  X("expandable_compact", CL_KEY_EXPANDABLE_COMPACT, parse_expandable_compact)                           \
  X("expandable_page_mb", CL_KEY_EXPANDABLE_PAGE, parse_expandable_page)                                 \
  X("pinned_use_cuda_host_register", CL_KEY_PINNED_REGISTER, parse_pinned_register)                      \
  X("pinned_num_register_threads", CL_KEY_PINNED_THREADS, parse_pinned_threads)                          \
  X("preset", CL_KEY_PRESET, parse_preset)                                                               \
  X("graph_capture_record_stream_reuse", CL_KEY_CAPTURE_REUSE, parse_capture_reuse)                     \
  X("expandable_plan", CL_KEY_EXPANDABLE_PLAN, parse_expandable_plan)

#define KEY_ENTRY(name, bit, parse) {name, bit, parse},
#define KEY_NAME(name, bit, parse) name,

static const struct {
  const char *name;
  unsigned bit;
  value_parser parse;
} keys[] = {CL_KEYS(KEY_ENTRY)};

static const char *const key_names[] = {CL_KEYS(KEY_NAME) NULL};

/* The names for messages, from the same table: ", a, b, ..." (KEY_LIST skips the first separator). */
#define KEY_LISTED(name, bit, parse) ", " name
static const char key_listed[] = "" CL_KEYS(KEY_LISTED);
#define KEY_LIST (key_listed + 2)

void cl_config_defaults(cl_config *c) {
  memset(c, 0, sizeof *c);
  c->max_split_size = SIZE_MAX;
  c->max_non_split_rounding = (size_t)MIN_MB * MIB;
  c->gc_threshold = 0.0;
  c->expandable_segments = false;
  c->release_lock_on_cudamalloc = true;
  c->memory_fraction = -1.0;
  c->plain_rounding = true;
  c->expandable_page = (size_t)MIN_MB * MIB; /* kLargeBuffer, PyTorch's page of the large kind */
  c->pinned_use_host_register = false;
  c->pinned_num_register_threads = 1;
  c->keys_set = 0;
}

void cl_config_reset_per_call(cl_config *c) {
  cl_config d;
  cl_config_defaults(&d);
  c->max_split_size = d.max_split_size;
  c->gc_threshold = d.gc_threshold;
  memcpy(c->roundup_divisions, d.roundup_divisions, sizeof c->roundup_divisions);
}

const char *const *cl_config_keys(void) { return key_names; }

/* The fields derived from others, set wherever a config is made. */
static void finish(cl_config *c) {
  c->plain_rounding = true;
  for (int i = 0; i < CL_ROUNDUP_INTERVALS; i++)
    if (c->roundup_divisions[i] > 1)
      c->plain_rounding = false;
}

cachalot_status cl_config_parse(const char *s, const cl_config *base, cl_config *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cl_config_parse: out is NULL");
  cl_config c;
  if (base)
    c = *base;
  else
    cl_config_defaults(&c);
  c.keys_set = 0;
  if (!s) {
    finish(&c);
    *out = c;
    return CACHALOT_OK;
  }

  lexer lx = {s};
  char got[GOT_CAP];
  cachalot_status st;
  tok t;
  if ((st = lex_next(&lx, &t)) != CACHALOT_OK)
    return st;
  while (t.kind != TK_END) {
    if (t.kind != TK_WORD)
      return cl_fail(CACHALOT_ERROR_CONFIG, CONF "expected a key (one of %s), got %s%s", KEY_LIST,
                     describe(&t, got, sizeof got), t.kind == TK_RBRACKET ? " (unbalanced ']')" : "");
    size_t k = 0;
    while (k < sizeof keys / sizeof keys[0] && !word_is(&t, keys[k].name))
      k++;
    if (k == sizeof keys / sizeof keys[0])
      return cl_fail(CACHALOT_ERROR_CONFIG, CONF "unknown key '%.*s' (expected one of %s)", t.n, t.p,
                     KEY_LIST);
    const char *key = keys[k].name;

    tok colon, v, sep;
    if ((st = lex_next(&lx, &colon)) != CACHALOT_OK)
      return st;
    if (colon.kind != TK_COLON)
      return cl_fail(CACHALOT_ERROR_CONFIG, CONF "expected ':' after '%s', got %s", key,
                     describe(&colon, got, sizeof got));
    if ((st = lex_next(&lx, &v)) != CACHALOT_OK)
      return st;
    if (v.kind == TK_END)
      return cl_fail(CACHALOT_ERROR_CONFIG, CONF "missing value for %s after ':'", key);
    if ((st = keys[k].parse(&lx, &v, &c)) != CACHALOT_OK)
      return st;
    c.keys_set |= keys[k].bit;

    if ((st = lex_next(&lx, &sep)) != CACHALOT_OK)
      return st;
    if (sep.kind == TK_END)
      break;
    if (sep.kind != TK_COMMA)
      return cl_fail(CACHALOT_ERROR_CONFIG, CONF "expected ',' or the end after the value of %s, got %s%s",
                     key, describe(&sep, got, sizeof got),
                     sep.kind == TK_RBRACKET ? " (unbalanced ']')" : "");
    /* An END here is one trailing comma, which PyTorch accepts. */
    if ((st = lex_next(&lx, &t)) != CACHALOT_OK)
      return st;
  }
  finish(&c);
  *out = c;
  return CACHALOT_OK;
}
