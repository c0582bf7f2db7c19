/* The simulated device's pinned host memory: real host memory, so that tests can write and check it,
 * counted by kind (allocated by the backend, or registered memory of the caller's), with injected
 * failures. */
#include "sim.h"

#include <stdlib.h>

/* Whether this pinning is to fail by fault injection; counts it (lock held). */
static bool inject_host_held(struct sim_backend *sim) {
  if (sim->fail_host <= 0)
    return false;
  sim->fail_host--;
  return true;
}

/* cudaFreeHost synchronizes the device (every device: the memory may be in use by any of them). */
static void complete_all_held(struct sim_backend *sim) {
  for (int d = 0; d < sim->base.device_count; d++)
    sim_complete_device_held(sim, d);
}

/* Any live range that [p, p + size) overlaps (lock held). The ranges are few: a linear scan. */
static struct sim_host *overlap_held(struct sim_backend *sim, const char *p, size_t size) {
  struct sim_host *h, *tmp;
  HASH_ITER(hh, sim->host, h, tmp) {
    const char *q = h->ptr;
    if (p < q + h->size && q < p + size)
      return h;
  }
  return NULL;
}

static cachalot_status add_held(struct sim_backend *sim, void *ptr, size_t size, bool registered) {
  struct sim_host *h = malloc(sizeof *h);
  if (!h)
    return host_oom("simulated host pinning");
  *h = (struct sim_host){.ptr = ptr, .size = size, .registered = registered};
  bool oom = false;
  HASH_ADD_PTR(sim->host, ptr, h);
  if (oom) {
    free(h);
    return host_oom("simulated host pinning");
  }
  if (registered)
    sim->host_registered += size;
  else
    sim->host_allocated += size;
  return CACHALOT_OK;
}

/* The live range that starts at ptr, of the kind asked for; NULL after setting the error. */
static struct sim_host *find_held(struct sim_backend *sim, void *ptr, bool registered, const char *fn) {
  struct sim_host *h = NULL;
  HASH_FIND_PTR(sim->host, &ptr, h);
  if (!h || h->registered != registered) {
    (void)cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: %p is not %s", fn, ptr,
                  registered ? "a registered host range" : "pinned host memory from host_alloc");
    return NULL;
  }
  return h;
}

static void remove_held(struct sim_backend *sim, struct sim_host *h) {
  HASH_DEL(sim->host, h);
  if (h->registered)
    sim->host_registered -= h->size;
  else
    sim->host_allocated -= h->size;
  free(h);
}

cachalot_status cl_sim_host_alloc(cachalot_backend *b, size_t size, void **ptr) {
  struct sim_backend *sim = sim_of(b);
  if (!ptr)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated host allocation: ptr is NULL");
  *ptr = NULL;
  if (size == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated host allocation of 0 bytes");
  sim_lock(sim);
  cachalot_status st = CACHALOT_OK;
  void *p = NULL;
  if (cl_sim_unsafe_call_prohibited_held(sim)) /* cudaErrorStreamCaptureUnsupported */
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s", MSG_UNSUPPORTED);
  else if (inject_host_held(sim))
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "injected host allocation failure");
  else if (!(p = malloc(size)))
    st = host_oom("simulated host allocation");
  else if ((st = add_held(sim, p, size, false)) != CACHALOT_OK)
    free(p);
  else
    *ptr = p;
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_host_free(cachalot_backend *b, void *ptr) {
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  cachalot_status st = CACHALOT_OK;
  struct sim_host *h = find_held(sim, ptr, false, "simulated host free");
  if (!h) {
    st = CACHALOT_ERROR_INVALID_ARGUMENT;
  } else if (cl_sim_unsafe_call_prohibited_held(sim)) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s", MSG_UNSUPPORTED);
  } else {
    complete_all_held(sim);
    free(h->ptr);
    remove_held(sim, h);
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_host_register(cachalot_backend *b, void *ptr, size_t size) {
  struct sim_backend *sim = sim_of(b);
  if (!ptr || size == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated host register: %s",
                   ptr ? "size is 0" : "ptr is NULL");
  sim_lock(sim);
  cachalot_status st = CACHALOT_OK;
  if (overlap_held(sim, ptr, size))
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated host register: [%p, +%zu) is already pinned", ptr,
                 size);
  else if (cl_sim_unsafe_call_prohibited_held(sim))
    st = cl_fail(CACHALOT_ERROR_DEVICE, "%s", MSG_UNSUPPORTED);
  else if (inject_host_held(sim))
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "injected host register failure");
  else
    st = add_held(sim, ptr, size, true);
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_host_unregister(cachalot_backend *b, void *ptr) {
  struct sim_backend *sim = sim_of(b);
  sim_lock(sim);
  struct sim_host *h = find_held(sim, ptr, true, "simulated host unregister");
  if (h)
    remove_held(sim, h);
  sim_unlock(sim);
  return h ? CACHALOT_OK : CACHALOT_ERROR_INVALID_ARGUMENT;
}

void cl_sim_host_destroy_held(struct sim_backend *sim) {
  struct sim_host *h, *tmp;
  HASH_ITER(hh, sim->host, h, tmp) {
    if (!h->registered)
      free(h->ptr); /* the backend's own; registered memory is its owner's to free */
    remove_held(sim, h);
  }
}
