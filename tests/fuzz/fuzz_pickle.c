/* libFuzzer target: the pickle reader (tools/common/snapshot_pickle.c) and writer. Any bytes must be
 * read or refused with a message, never crash, hang or leak; a tree that was read must write back to a
 * pickle that reads to the same tree (reader -> writer -> reader), and that pickle must write back to
 * the same bytes. Inputs are taken as pickles whatever their first byte, so the whole input space
 * reaches the reader's first pass. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/snapshot_pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The same tree, children in order: cJSON_Compare looks object keys up by name, so two trees with a
 * key repeated in one dict (kept twice, as the JSON reader keeps one) compare unequal to themselves. */
static bool same(const cJSON *a, const cJSON *b) {
  if ((a->type & 0xff) != (b->type & 0xff) || (a->string == NULL) != (b->string == NULL) ||
      (a->string != NULL && strcmp(a->string, b->string) != 0))
    return false;
  if (cJSON_IsNumber(a) && a->valuedouble != b->valuedouble)
    return false;
  if (cJSON_IsString(a) && strcmp(a->valuestring, b->valuestring) != 0)
    return false;
  const cJSON *x = a->child, *y = b->child;
  for (; x != NULL && y != NULL; x = x->next, y = y->next)
    if (!same(x, y))
      return false;
  return x == NULL && y == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[AS_ERR_LEN];
  cJSON *tree = as_pickle_parse("fuzz", (const char *)data, size, err);
  if (tree == NULL) {
    if (!err[0]) {
      fprintf(stderr, "fuzz_pickle: refused without a message\n");
      abort();
    }
    return 0;
  }
  unsigned char *out = NULL, *out2 = NULL;
  size_t len = 0, len2 = 0, not_utf8 = 0;
  if (as_pickle_write(tree, &out, &len, &not_utf8) != 0) {
    cJSON_Delete(tree);
    return 0; /* host memory ran out */
  }
  if (not_utf8 != 0) { /* the reader takes strict UTF-8 only */
    fprintf(stderr, "fuzz_pickle: %zu bytes of read text written as U+FFFD\n", not_utf8);
    abort();
  }
  cJSON *again = as_pickle_parse("fuzz-again", (const char *)out, len, err);
  if (again == NULL) {
    fprintf(stderr, "fuzz_pickle: the written pickle is refused: %s\n", err);
    abort();
  }
  if (!same(tree, again)) {
    fprintf(stderr, "fuzz_pickle: the written pickle reads to another tree\n");
    abort();
  }
  if (as_pickle_write(again, &out2, &len2, &not_utf8) == 0 && (len2 != len || memcmp(out, out2, len) != 0)) {
    fprintf(stderr, "fuzz_pickle: writing the tree again gives other bytes\n");
    abort();
  }
  free(out);
  free(out2);
  cJSON_Delete(tree);
  cJSON_Delete(again);
  return 0;
}
