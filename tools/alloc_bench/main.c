/* alloc_bench: the entry point: `alloc_bench svg`, or a run: the settings (args.c), the allocators
 * that can run here, the workloads (workloads.c) and the report (output.c). */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int cmd_svg(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    fputs("usage: alloc_bench svg IN.csv OUT.svg\n"
          "Draws the medians of a CSV written by alloc_bench --csv as a grouped horizontal bar chart (one\n"
          "group per row name, one bar per allocator, log scale, whiskers from min to max).\n",
          stdout);
    return AB_EXIT_OK;
  }
  if (argc != 3)
    return ab_usage_error("svg wants IN.csv and OUT.svg");
  ab_results res = {0};
  char err[AB_ERR_LEN];
  int rc = AB_EXIT_OK;
  if (ab_read_csv(argv[1], &res, err) != 0 || ab_write_svg(argv[2], &res, argv[1], err) != 0) {
    fprintf(stderr, "alloc_bench svg: %s\n", err);
    rc = AB_EXIT_FAILURE;
  }
  ab_results_free(&res);
  return rc;
}

/* Which of the selected allocators can run here (c->skip says why not), and the GPU's name when one
 * that uses it can. */
static void probe_allocators(config *c, char *device, size_t len) {
  for (int i = 0; i < c->n_alloc; i++)
    if (c->alloc[i]->probe(c->skip[i]) != 0 && c->skip[i][0] == '\0')
      snprintf(c->skip[i], sizeof c->skip[i], "cannot run here");
  device[0] = '\0';
#ifdef ALLOC_BENCH_HAVE_CUDA
  for (int i = 0; i < c->n_alloc; i++)
    if (c->skip[i][0] == '\0' && c->alloc[i] != &ab_cachalot_sim) {
      ab_cuda_device_name(device, len);
      break;
    }
#else
  (void)len;
#endif
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "svg") == 0)
    return cmd_svg(argc - 1, argv + 1);
  config c;
  int rc = ab_parse_args(argc, argv, &c);
  if (rc != AB_GO_ON)
    return rc;
  if (c.pin >= 0 && !ab_pin_thread(&c, 0)) {
    fprintf(stderr, "alloc_bench: warning: cannot pin to CPU %d (%s); running unpinned\n", c.pin, strerror(errno));
    c.pin = -1;
  }
  char device[256];
  probe_allocators(&c, device, sizeof device);
  ab_results res = {0};
  ab_run_workloads(&res, &c);
  ab_report(&c, &res, device);
  ab_results_free(&res);
  ab_config_free(&c);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "alloc_bench: cannot write standard output\n");
    ab_failed = true;
  }
  return ab_failed ? AB_EXIT_FAILURE : AB_EXIT_OK;
}
