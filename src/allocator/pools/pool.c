/* Private pools (PyTorch's private pools): ids, use counts, routing by filter, freeable pools
 * (checkpoint/restore is in pool_state.c).
 *
 * A device's private pools live in its `pools` table. Routing is a short stack of (pool, filter):
 * malloc asks the filters most recent first, so a nested capture's pool wins over an outer one. */
#include "pools.h"

#include <stdlib.h>
#include <limits.h>
#include <string.h>


cachalot_mempool_id cl_capture_pool_id(cachalot_allocator *a) {
  return (cachalot_mempool_id){atomic_fetch_add(&a->next_capture_pool, 1), 0};
}

cachalot_mempool_id cachalot_graph_pool_handle(cachalot_allocator *a) {
  if (!a)
    return (cachalot_mempool_id){0, 0};
  return (cachalot_mempool_id){0, atomic_fetch_add(&a->next_pool_handle, 1)};
}

cl_pool *cl_find_pool_locked(cl_device *d, cachalot_mempool_id id) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pool *p = NULL;
  HASH_FIND(hh, d->pools, &id, sizeof id, p);
  return p;
}

cl_pool *cl_route_pool_locked(cl_device *d, cachalot_stream s) {
  CL_ASSERT_EXCLUSIVE(d);
  for (int i = d->n_routes - 1; i >= 0; i--)
    if (d->routes[i].filter(s, d->routes[i].ctx))
      return d->routes[i].pool;
  return &d->default_pool;
}

static void pool_free(cl_device *d, cl_pool *p) {
  const cachalot_segment_source *src = cl_pool_source(d, p);
  if (src && src->release) /* none of its segments is left: the source's owner may let go of it */
    src->release(src->ctx);
  cl_bins *bins, *tmp;
  HASH_ITER(hh, p->bins, bins, tmp) {
    HASH_DEL(p->bins, bins);
    cl_vranges_release_locked(d, bins);
    free(bins);
  }
  free(p);
}

static bool routed_locked(const cl_device *d, const cl_pool *p) {
  CL_ASSERT_EXCLUSIVE(d);
  for (int i = 0; i < d->n_routes; i++)
    if (d->routes[i].pool == p)
      return true;
  return false;
}

/* A pool still routed to stays, released or not: mallocs are sent to it until end_allocate_to_pool,
 * which collects it then. */
void cl_pools_collect_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pool *p, *tmp;
  HASH_ITER(hh, d->pools, p, tmp) {
    if (p->use_count == 0 && p->n_segments == 0 && !routed_locked(d, p) && !((cl_private_pool *)p)->holds) {
      HASH_DELETE(hh, d->pools, p);
      pool_free(d, p);
    }
  }
}

void cl_pool_unhold_locked(cl_device *d, cl_pool *p) {
  CL_ASSERT_EXCLUSIVE(d);
  if (cl_pool_is_default(d, p))
    return;
  if (--((cl_private_pool *)p)->holds == 0 && p->use_count == 0)
    cl_pools_collect_locked(d); /* released meanwhile, and now without a segment: it goes */
}

void cl_pools_destroy_locked(cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pool *p, *tmp;
  HASH_ITER(hh, d->pools, p, tmp) {
    HASH_DELETE(hh, d->pools, p);
    pool_free(d, p);
  }
  free(d->routes);
  d->routes = NULL;
  d->n_routes = d->cap_routes = 0;
}

uint64_t cl_private_pool_free_bytes_locked(const cl_device *d) {
  CL_ASSERT_EXCLUSIVE(d);
  uint64_t sum = 0;
  for (const cl_pool *p = d->pools; p; p = p->hh.next)
    for (const cl_bins *b = p->bins; b; b = b->hh.next)
      sum += cl_bins_free_bytes(b);
  return sum;
}

cachalot_status cl_check_private_id(cachalot_mempool_id id, const char *who) {
  if (cl_pool_id_is_default(id) || (id.first != 0 && id.second != 0))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "%s: pool id " CL_POOL_ID_FMT " is not a private pool id (exactly one half must be non-zero)", who,
                   CL_POOL_ID_ARGS(id));
  return CACHALOT_OK;
}

/* Pool `id` of d, made (use count 0) if it does not exist; a released pool (use count 0) is refused. */
static cachalot_status pool_for_use_locked(cl_device *d, cachalot_mempool_id id, const char *who, cl_pool **out) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pool *p = cl_find_pool_locked(d, id);
  if (p && p->use_count == 0)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "%s: pool " CL_POOL_ID_FMT " was released (use count 0) and cannot be used again", who, CL_POOL_ID_ARGS(id));
  if (p && p->use_count == INT_MAX)
    return cl_fail(CACHALOT_ERROR_INVALID_STATE, "%s: pool " CL_POOL_ID_FMT " has %d uses, the most it can count", who,
                   CL_POOL_ID_ARGS(id), INT_MAX);
  if (!p) {
    cl_private_pool *pp = calloc(1, sizeof *pp);
    p = pp ? &pp->base : NULL;
    bool hash_oom = !p;
    if (p) {
      p->id = id;
      HASH_ADD(hh, d->pools, id, sizeof p->id, p);
    }
    if (hash_oom) {
      free(p);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "%s: host out of memory", who);
    }
  }
  *out = p;
  return CACHALOT_OK;
}

cachalot_status cl_route_begin_locked(cl_device *d, cachalot_mempool_id id, cachalot_stream_filter filter, void *ctx,
                                      const char *who) {
  CL_ASSERT_EXCLUSIVE(d);
  for (int i = 0; i < d->n_routes; i++)
    if (!memcmp(&d->routes[i].pool->id, &id, sizeof id))
      return cl_fail(CACHALOT_ERROR_INVALID_STATE, "%s: already allocating to pool " CL_POOL_ID_FMT, who, CL_POOL_ID_ARGS(id));
  if (d->n_routes == d->cap_routes) {
    int cap = d->cap_routes ? d->cap_routes * 2 : 4;
    cl_route *r = realloc(d->routes, (size_t)cap * sizeof *r);
    if (!r)
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "%s: host out of memory", who);
    d->routes = r;
    d->cap_routes = cap;
  }
  cl_pool *p = NULL;
  cachalot_status rc = pool_for_use_locked(d, id, who, &p);
  if (rc != CACHALOT_OK)
    return rc;
  p->use_count++;
  d->routes[d->n_routes++] = (cl_route){p, filter, ctx};
  return CACHALOT_OK;
}

cachalot_status cl_route_begin(cachalot_allocator *a, int device, cachalot_mempool_id id, cachalot_stream_filter filter,
                               void *ctx) {
  static const char who[] = "cachalot_begin_allocate_to_pool";
  cachalot_status rc = cl_check_device_arg(a, device, who);
  if (rc != CACHALOT_OK)
    return rc;
  if (!filter)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: filter is NULL", who);
  if ((rc = cl_check_private_id(id, who)) != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  cl_enter_exclusive(d);
  rc = cl_route_begin_locked(d, id, filter, ctx, who);
  cl_leave_exclusive(d);
  return rc;
}

cachalot_status cachalot_begin_allocate_to_pool(cachalot_allocator *a, int device, cachalot_mempool_id id,
                                                cachalot_stream_filter filter, void *ctx) {
  return cl_route_begin(a, device, id, filter, ctx);
}

cachalot_status cachalot_pool_incref(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  static const char who[] = "cachalot_pool_incref";
  cachalot_status rc = cl_check_device_arg(a, device, who);
  if (rc != CACHALOT_OK)
    return rc;
  if ((rc = cl_check_private_id(id, who)) != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  cl_enter_exclusive(d);
  cl_pool *p = NULL;
  if ((rc = pool_for_use_locked(d, id, who, &p)) == CACHALOT_OK)
    p->use_count++;
  cl_leave_exclusive(d);
  return rc;
}

cachalot_status cl_route_end_locked(cl_device *d, cachalot_mempool_id id) {
  CL_ASSERT_EXCLUSIVE(d);
  for (int i = 0; i < d->n_routes; i++) {
    if (!memcmp(&d->routes[i].pool->id, &id, sizeof id)) {
      memmove(&d->routes[i], &d->routes[i + 1], (size_t)(d->n_routes - i - 1) * sizeof *d->routes);
      d->n_routes--;
      cl_pools_collect_locked(d); /* a pool released while routed to goes now, if empty */
      return CACHALOT_OK;
    }
  }
  return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_end_allocate_to_pool: not allocating to pool " CL_POOL_ID_FMT,
                 CL_POOL_ID_ARGS(id));
}

cachalot_status cl_route_end(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_end_allocate_to_pool", &d);
  if (rc != CACHALOT_OK)
    return rc;
  rc = cl_route_end_locked(d, id);
  cl_leave_exclusive(d);
  return rc;
}

cachalot_status cachalot_end_allocate_to_pool(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  return cl_route_end(a, device, id);
}

cachalot_status cl_pool_release_use_locked(cl_device *d, cachalot_mempool_id id) {
  CL_ASSERT_EXCLUSIVE(d);
  cl_pool *p = cl_find_pool_locked(d, id);
  if (!p || p->use_count == 0)
    return cl_fail(p ? CACHALOT_ERROR_INVALID_STATE : CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_release_pool: %s pool " CL_POOL_ID_FMT, p ? "already released" : "no such", CL_POOL_ID_ARGS(id));
  if (--p->use_count == 0)
    cl_pools_collect_locked(d); /* an empty pool disappears at once; one with segments when they go */
  return CACHALOT_OK;
}

cachalot_status cl_pool_release_use(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_release_pool", &d);
  if (rc != CACHALOT_OK)
    return rc;
  rc = cl_pool_release_use_locked(d, id);
  cl_leave_exclusive(d);
  return rc;
}

cachalot_status cachalot_release_pool(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  return cl_pool_release_use(a, device, id);
}

/* Private pool `id` of `device`, in use (use count > 0), its device entered into exclusive mode; else
 * the error (a malformed id, no such pool, a released one) and nothing locked. */
static cachalot_status enter_pool_in_use(cachalot_allocator *a, int device, cachalot_mempool_id id, const char *who,
                                         cl_device **d, cl_pool **p) {
  *p = NULL;
  cachalot_status rc = cl_check_private_id(id, who);
  if (rc != CACHALOT_OK || (rc = cl_enter_device(a, device, who, d)) != CACHALOT_OK)
    return rc;
  *p = cl_find_pool_locked(*d, id);
  if (*p && (*p)->use_count > 0)
    return CACHALOT_OK;
  rc = cl_fail(*p ? CACHALOT_ERROR_INVALID_STATE : CACHALOT_ERROR_INVALID_ARGUMENT, "%s: %s pool " CL_POOL_ID_FMT, who,
               *p ? "released" : "no such", CL_POOL_ID_ARGS(id));
  cl_leave_exclusive(*d);
  return rc;
}

cachalot_status cachalot_pool_set_source(cachalot_allocator *a, int device, cachalot_mempool_id id,
                                         const cachalot_segment_source *src) {
  static const char who[] = "cachalot_pool_set_source";
  if (!src || !src->alloc || !src->free)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "%s: %s", who,
                   !src ? "source is NULL" : "the source needs both alloc and free");
  cl_device *d = NULL;
  cl_pool *p = NULL;
  cachalot_status rc = enter_pool_in_use(a, device, id, who, &d, &p);
  if (rc != CACHALOT_OK)
    return rc;
  if (p->bins || ((cl_private_pool *)p)->holds || cl_pool_source(d, p)) /* bins: a malloc reached it */
    rc = cl_fail(CACHALOT_ERROR_INVALID_STATE, "%s: pool " CL_POOL_ID_FMT " %s", who, CL_POOL_ID_ARGS(id),
                 cl_pool_source(d, p) ? "already has a source" : "has already been allocated from");
  else
    ((cl_private_pool *)p)->source = *src;
  cl_leave_exclusive(d);
  return rc;
}

cachalot_status cachalot_pool_set_no_split(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  cl_device *d = NULL;
  cl_pool *p = NULL;
  cachalot_status rc = enter_pool_in_use(a, device, id, "cachalot_pool_set_no_split", &d, &p);
  if (rc != CACHALOT_OK)
    return rc;
  p->no_split = true;
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_pool_set_use_on_oom(cachalot_allocator *a, int device, cachalot_mempool_id id, bool on) {
  static const char who[] = "cachalot_pool_set_use_on_oom";
  cl_device *d = NULL;
  cl_pool *p = NULL;
  if (on) {
    cachalot_status rc = enter_pool_in_use(a, device, id, who, &d, &p);
    if (rc != CACHALOT_OK)
      return rc;
    p->use_on_oom = true;
    cl_leave_exclusive(d);
    return CACHALOT_OK;
  }
  /* off needs no pool in use: a MemPool's destructor turns it off whatever became of the pool */
  cachalot_status rc = cl_check_private_id(id, who);
  if (rc != CACHALOT_OK || (rc = cl_enter_device(a, device, who, &d)) != CACHALOT_OK)
    return rc;
  if ((p = cl_find_pool_locked(d, id)))
    p->use_on_oom = false;
  cl_leave_exclusive(d);
  return CACHALOT_OK;
}

cachalot_status cachalot_pool_use_count(cachalot_allocator *a, int device, cachalot_mempool_id id, int *out) {
  if (!out)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_pool_use_count: out is NULL");
  *out = 0;
  cl_device *d = NULL;
  cachalot_status rc = cl_enter_device(a, device, "cachalot_pool_use_count", &d);
  if (rc != CACHALOT_OK)
    return rc;
  cl_pool *p = cl_find_pool_locked(d, id);
  if (p)
    *out = p->use_count;
  cl_leave_exclusive(d);
  return p ? CACHALOT_OK
           : cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_pool_use_count: no such pool " CL_POOL_ID_FMT, CL_POOL_ID_ARGS(id));
}
