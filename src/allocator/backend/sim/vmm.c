/* Simulated virtual memory (for expandable segments): reservations of address space and mappings inside
 * them, which count against the device's capacity like allocations. */
#include "sim.h"

#include <stdlib.h>

#define SIM_GRANULARITY ((uint64_t)2 << 20)

cachalot_status cl_sim_va_granularity(cachalot_backend *b, int device, size_t *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_granularity: out is NULL");
  *out = 0;
  cachalot_status st = sim_check_device(sim_of(b), device, "simulated va_granularity");
  if (st == CACHALOT_OK)
    *out = (size_t)SIM_GRANULARITY;
  return st;
}

static bool granular(uint64_t x) { return (x & (SIM_GRANULARITY - 1)) == 0; }

/* Adds the range [addr, addr + size) of `device` to `table` (lock held). OUT_OF_MEMORY on host OOM. */
static cachalot_status add_range_held(struct sim_range **table, uint64_t addr, size_t size, int device) {
  struct sim_range *r = calloc(1, sizeof *r);
  bool oom = !r;
  if (r) {
    *r = (struct sim_range){.addr = addr, .size = size, .device = device};
    HASH_ADD(hh, *table, addr, sizeof r->addr, r);
  }
  if (oom) {
    free(r);
    return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "host out of memory");
  }
  return CACHALOT_OK;
}

/* The range of `table` that is exactly [addr, addr + size) of `device`, or NULL (lock held). */
static struct sim_range *exact_range_held(struct sim_range *table, uint64_t addr, size_t size, int device) {
  struct sim_range *r = NULL;
  HASH_FIND(hh, table, &addr, sizeof addr, r);
  return r && r->size == size && r->device == device ? r : NULL;
}

cachalot_status cl_sim_va_reserve(cachalot_backend *b, int device, size_t size, void **base) {
  struct sim_backend *sim = sim_of(b);
  if (!base)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_reserve: base is NULL");
  *base = NULL;
  if (size == 0 || !granular(size))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_reserve: %zu bytes is not a positive multiple of "
                   "the granularity", size);
  cachalot_status st = sim_check_device(sim, device, "simulated va_reserve");
  if (st != CACHALOT_OK)
    return st;
  sim_lock(sim);
  struct sim_device *dev = &sim->dev[device];
  const uint64_t start = (dev->bump + SIM_GRANULARITY - 1) & ~(SIM_GRANULARITY - 1);
  const uint64_t addr = ((uint64_t)(device + 1) << SIM_RANGE_SHIFT) + start;
  if (start > SIM_RANGE || (uint64_t)size > SIM_RANGE - start) {
    st = cl_fail(CACHALOT_ERROR_DEVICE, "simulated va_reserve: address space exhausted");
  } else if ((st = add_range_held(&sim->reservations, addr, size, device)) == CACHALOT_OK) {
    dev->bump = start + size; /* addresses are never reused, reserved or allocated */
    *base = (void *)(uintptr_t)addr;
  }
  sim_unlock(sim);
  return st;
}

/* The mapping overlapping [addr, addr + size), if any (lock held). */
static struct sim_range *overlapping_mapping_held(struct sim_backend *sim, uint64_t addr, size_t size) {
  struct sim_range *m, *tmp;
  HASH_ITER(hh, sim->mappings, m, tmp)
  if (m->addr < addr + size && addr < m->addr + m->size)
    return m;
  return NULL;
}

cachalot_status cl_sim_va_release(cachalot_backend *b, int device, void *base, size_t size) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated va_release");
  if (st != CACHALOT_OK)
    return st;
  const uint64_t key = (uint64_t)(uintptr_t)base;
  sim_lock(sim);
  struct sim_range *r = exact_range_held(sim->reservations, key, size, device);
  if (!r)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_release: 0x%" PRIx64 " (%zu bytes) is not a "
                 "reservation of device %d", key, size, device);
  else if (overlapping_mapping_held(sim, key, size))
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE, "simulated va_release: the reservation at 0x%" PRIx64
                 " still has mapped memory", key);
  else {
    HASH_DEL(sim->reservations, r);
    free(r);
  }
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_va_map(cachalot_backend *b, int device, void *addr, size_t size) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated va_map");
  if (st != CACHALOT_OK)
    return st;
  const uint64_t a = (uint64_t)(uintptr_t)addr;
  if (size == 0 || !granular(size) || !granular(a))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_map: 0x%" PRIx64 " (%zu bytes) is not aligned to "
                   "the granularity", a, size);
  sim_lock(sim);
  struct sim_range *r, *tmp, *in = NULL;
  HASH_ITER(hh, sim->reservations, r, tmp)
  if (r->device == device && r->addr <= a && a - r->addr <= r->size && size <= r->size - (a - r->addr))
    in = r;
  struct sim_device *dev = &sim->dev[device];
  if (!in)
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_map: 0x%" PRIx64 " (%zu bytes) is not inside a "
                 "reservation of device %d", a, size, device);
  else if (overlapping_mapping_held(sim, a, size))
    st = cl_fail(CACHALOT_ERROR_INVALID_STATE, "simulated va_map: 0x%" PRIx64 " is mapped already", a);
  else if (cl_sim_inject_held(sim))
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "injected device allocation failure (map)");
  else if (size > sim->capacity - dev->used)
    st = cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "simulated device %d out of memory: %zu bytes to map, %zu free",
                 device, size, sim->capacity - dev->used);
  else if ((st = add_range_held(&sim->mappings, a, size, device)) == CACHALOT_OK)
    dev->used += size;
  sim_unlock(sim);
  return st;
}

cachalot_status cl_sim_va_unmap(cachalot_backend *b, int device, void *addr, size_t size) {
  struct sim_backend *sim = sim_of(b);
  cachalot_status st = sim_check_device(sim, device, "simulated va_unmap");
  if (st != CACHALOT_OK)
    return st;
  const uint64_t key = (uint64_t)(uintptr_t)addr;
  sim_lock(sim);
  struct sim_range *m = exact_range_held(sim->mappings, key, size, device);
  if (!m) {
    st = cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "simulated va_unmap: 0x%" PRIx64 " (%zu bytes) is not a mapping "
                 "of device %d", key, size, device);
  } else {
    sim->dev[device].used -= size;
    HASH_DEL(sim->mappings, m);
    free(m);
  }
  sim_unlock(sim);
  return st;
}
