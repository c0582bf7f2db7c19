/* libFuzzer target: the CACHALOT_ALLOC_CONF parser, through the public API. Any byte string is a config
 * string: it must be accepted or refused with CACHALOT_ERROR_CONFIG and a message, never crash, and a
 * refused one must change nothing (cachalot_set_settings applies all of it or none: max_split_size stays,
 * and pinned blocks are still pinned the default way, not registered). An accepted one is then used: a few
 * allocations under it, device and pinned host (pinned the way its keys say), cachalot_check after each
 * step, and everything given back. */
#include <cachalot/cachalot.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, what)                                                                                    \
  do {                                                                                                         \
    if (!(cond)) {                                                                                             \
      fprintf(stderr, "fuzz_config: %s (last error: %s)\n", what, cachalot_last_error());                      \
      abort();                                                                                                 \
    }                                                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *conf = malloc(size + 1);
  if (!conf)
    return 0;
  memcpy(conf, data, size);
  conf[size] = '\0'; /* a NUL inside ends the string early, as it would for a caller */
  cachalot_sim_options o = {.device_count = 1, .capacity_bytes = (size_t)256 << 20, .complete_immediately = true};
  cachalot_backend *b = NULL;
  REQUIRE(cachalot_backend_sim(&o, &b) == CACHALOT_OK, "sim backend");
  cachalot_allocator *a = NULL;
  cachalot_status rc = cachalot_create(b, conf, &a);
  REQUIRE(rc == CACHALOT_OK || rc == CACHALOT_ERROR_CONFIG, "create: a status other than OK or CONFIG");
  REQUIRE(rc == CACHALOT_OK ? a != NULL : a == NULL && cachalot_last_error()[0], "create: result and status disagree");
  if (rc != CACHALOT_OK) {
    /* refused at create: then at run time too, and the allocator keeps its settings */
    REQUIRE(cachalot_create(b, "", &a) == CACHALOT_OK, "create with defaults");
    cachalot_device_stats before, after;
    REQUIRE(cachalot_memory_stats(a, 0, &before) == CACHALOT_OK, "stats");
    REQUIRE(cachalot_set_settings(a, conf) == CACHALOT_ERROR_CONFIG, "set_settings accepts what create refused");
    REQUIRE(cachalot_memory_stats(a, 0, &after) == CACHALOT_OK, "stats");
    REQUIRE(before.max_split_size == after.max_split_size, "a refused config changed max_split_size");
  }
  const bool refused = rc != CACHALOT_OK;
  static const size_t sizes[] = {1, 512, 1 << 20, (1 << 20) + 1, 10 << 20, 21 << 20, 100 << 20};
  void *p[sizeof sizes / sizeof sizes[0]] = {0};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    rc = cachalot_malloc(a, 0, sizes[i], NULL, &p[i]);
    REQUIRE(rc == CACHALOT_OK || rc == CACHALOT_ERROR_OUT_OF_MEMORY, "malloc: unexpected status");
    REQUIRE(cachalot_check(a) == CACHALOT_OK, "check after malloc");
  }
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    REQUIRE(cachalot_free(a, p[i]) == CACHALOT_OK, "free");
  REQUIRE(cachalot_empty_cache(a) == CACHALOT_OK, "empty_cache");
  REQUIRE(cachalot_check(a) == CACHALOT_OK, "check after empty_cache");
  size_t used = 1;
  REQUIRE(cachalot_sim_device_used(b, 0, &used) == CACHALOT_OK && used == 0, "memory left on the device");
  /* pinned host blocks, small so that each input stays cheap: 1 B, 12 KiB (a block of 4 pages, shared by up
   * to 4 register threads), and 1 B again, which reuses the first block */
  static const size_t host_sizes[] = {1, 12 << 10, 1};
  void *h[sizeof host_sizes / sizeof host_sizes[0]] = {0};
  for (size_t i = 0; i < sizeof host_sizes / sizeof host_sizes[0]; i++) {
    rc = cachalot_host_malloc(a, host_sizes[i], &h[i]);
    REQUIRE(rc == CACHALOT_OK && h[i], "host_malloc");
    memset(h[i], 0x42, host_sizes[i]);
    REQUIRE(cachalot_check(a) == CACHALOT_OK, "check after host_malloc");
    if (i == 0) {
      REQUIRE(cachalot_host_free(a, h[0]) == CACHALOT_OK, "host_free");
      h[0] = NULL;
    }
  }
  REQUIRE(h[2] != NULL, "host_malloc");
  size_t pinned = 1, registered = 1;
  REQUIRE(cachalot_sim_host_pinned(b, &pinned, &registered) == CACHALOT_OK && pinned + registered == (16 << 10) + 1,
          "pinned host bytes");
  REQUIRE(!refused || registered == 0, "a refused config changed how host memory is pinned");
  for (size_t i = 0; i < sizeof host_sizes / sizeof host_sizes[0]; i++)
    REQUIRE(cachalot_host_free(a, h[i]) == CACHALOT_OK, "host_free");
  cachalot_host_stats hs;
  REQUIRE(cachalot_host_memory_stats(a, &hs) == CACHALOT_OK && hs.num_host_alloc == 2, "one pinning per size");
  REQUIRE(cachalot_host_empty_cache(a) == CACHALOT_OK, "host_empty_cache");
  REQUIRE(cachalot_check(a) == CACHALOT_OK, "check after host_empty_cache");
  REQUIRE(cachalot_sim_host_pinned(b, &pinned, &registered) == CACHALOT_OK && pinned + registered == 0,
          "pinned host memory left");
  cachalot_destroy(a);
  cachalot_backend_destroy(b);
  free(conf);
  return 0;
}
