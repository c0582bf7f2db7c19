/* Private pools (SPEC.md §5): ids, use counts, routing by filter, freeable pools, checkpoint/restore.
 *
 * A device's private pools live in its `pools` table. Routing is a short stack of (pool, filter):
 * malloc asks the filters most recent first, so a nested capture's pool wins over an outer one. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define ID_FMT "{%llu, %llu}"
#define ID_ARGS(id) (unsigned long long)(id).first, (unsigned long long)(id).second

cachalot_mempool_id cl_capture_pool_id(cachalot_allocator *a) {
  return (cachalot_mempool_id){atomic_fetch_add(&a->next_capture_pool, 1), 0};
}

cachalot_mempool_id cachalot_graph_pool_handle(cachalot_allocator *a) {
  if (!a)
    return (cachalot_mempool_id){0, 0};
  return (cachalot_mempool_id){0, atomic_fetch_add(&a->next_pool_handle, 1)};
}

static cl_pool *find_pool_locked(cl_device *d, cachalot_mempool_id id) {
  cl_pool *p = NULL;
  HASH_FIND(hh, d->pools, &id, sizeof id, p);
  return p;
}

cl_pool *cl_route_pool_locked(cl_device *d, cachalot_stream s) {
  for (int i = d->n_routes - 1; i >= 0; i--)
    if (d->routes[i].filter(s, d->routes[i].ctx))
      return d->routes[i].pool;
  return &d->default_pool;
}

static void pool_free(cl_pool *p) {
  cl_bins *bins, *tmp;
  HASH_ITER(hh, p->bins, bins, tmp) {
    HASH_DEL(p->bins, bins);
    free(bins);
  }
  free(p);
}

void cl_pools_collect_locked(cl_device *d) {
  cl_pool *p, *tmp;
  HASH_ITER(hh, d->pools, p, tmp) {
    if (p->use_count == 0 && p->n_segments == 0) {
      HASH_DELETE(hh, d->pools, p);
      pool_free(p);
    }
  }
}

void cl_pools_destroy_locked(cl_device *d) {
  cl_pool *p, *tmp;
  HASH_ITER(hh, d->pools, p, tmp) {
    HASH_DELETE(hh, d->pools, p);
    pool_free(p);
  }
  free(d->routes);
  d->routes = NULL;
  d->n_routes = d->cap_routes = 0;
}

void cl_pools_for_each_locked(cl_device *d, void (*fn)(cl_pool *p, void *ctx), void *ctx) {
  fn(&d->default_pool, ctx);
  for (cl_pool *p = d->pools; p; p = p->hh.next)
    fn(p, ctx);
}

static void sum_free_bytes(cl_block *t, uint64_t *sum) {
  for (; t; t = t->right) {
    *sum += t->size;
    sum_free_bytes(t->left, sum);
  }
}

uint64_t cl_private_pool_free_bytes_locked(const cl_device *d) {
  uint64_t sum = 0;
  for (const cl_pool *p = d->pools; p; p = p->hh.next)
    for (const cl_bins *b = p->bins; b; b = b->hh.next)
      for (int k = 0; k < 2; k++)
        sum_free_bytes(b->root[k], &sum);
  return sum;
}

static bool id_is_default(cachalot_mempool_id id) { return id.first == 0 && id.second == 0; }

cachalot_status cachalot_begin_allocate_to_pool(cachalot_allocator *a, int device, cachalot_mempool_id id,
                                                cachalot_stream_filter filter, void *ctx) {
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_begin_allocate_to_pool");
  if (rc != CACHALOT_OK)
    return rc;
  if (!filter)
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT, "cachalot_begin_allocate_to_pool: filter is NULL");
  if (id_is_default(id) || (id.first != 0 && id.second != 0))
    return cl_fail(CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_begin_allocate_to_pool: pool id " ID_FMT " is not a private pool id (exactly one "
                   "half must be non-zero)", ID_ARGS(id));
  cl_device *d = &a->devices[device];
  pthread_mutex_lock(&d->lock);
  for (int i = 0; i < d->n_routes; i++) {
    if (!memcmp(&d->routes[i].pool->id, &id, sizeof id)) {
      pthread_mutex_unlock(&d->lock);
      return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                     "cachalot_begin_allocate_to_pool: already allocating to pool " ID_FMT, ID_ARGS(id));
    }
  }
  cl_pool *p = find_pool_locked(d, id);
  if (p && p->use_count == 0) {
    pthread_mutex_unlock(&d->lock);
    return cl_fail(CACHALOT_ERROR_INVALID_STATE,
                   "cachalot_begin_allocate_to_pool: pool " ID_FMT " was released (use count 0) and cannot be "
                   "used again", ID_ARGS(id));
  }
  if (d->n_routes == d->cap_routes) {
    int cap = d->cap_routes ? d->cap_routes * 2 : 4;
    cl_route *r = realloc(d->routes, (size_t)cap * sizeof *r);
    if (!r) {
      pthread_mutex_unlock(&d->lock);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_begin_allocate_to_pool: host out of memory");
    }
    d->routes = r;
    d->cap_routes = cap;
  }
  if (!p) {
    p = calloc(1, sizeof *p);
    bool hash_oom = !p;
    if (p) {
      p->id = id;
      HASH_ADD(hh, d->pools, id, sizeof p->id, p);
    }
    if (hash_oom) {
      free(p);
      pthread_mutex_unlock(&d->lock);
      return cl_fail(CACHALOT_ERROR_OUT_OF_MEMORY, "cachalot_begin_allocate_to_pool: host out of memory");
    }
  }
  p->use_count++;
  d->routes[d->n_routes++] = (cl_route){p, filter, ctx};
  pthread_mutex_unlock(&d->lock);
  return CACHALOT_OK;
}

cachalot_status cachalot_end_allocate_to_pool(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_end_allocate_to_pool");
  if (rc != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  pthread_mutex_lock(&d->lock);
  for (int i = 0; i < d->n_routes; i++) {
    if (!memcmp(&d->routes[i].pool->id, &id, sizeof id)) {
      memmove(&d->routes[i], &d->routes[i + 1], (size_t)(d->n_routes - i - 1) * sizeof *d->routes);
      d->n_routes--;
      pthread_mutex_unlock(&d->lock);
      return CACHALOT_OK;
    }
  }
  pthread_mutex_unlock(&d->lock);
  return cl_fail(CACHALOT_ERROR_INVALID_STATE, "cachalot_end_allocate_to_pool: not allocating to pool " ID_FMT,
                 ID_ARGS(id));
}

cachalot_status cachalot_release_pool(cachalot_allocator *a, int device, cachalot_mempool_id id) {
  cachalot_status rc = cl_check_device_arg(a, device, "cachalot_release_pool");
  if (rc != CACHALOT_OK)
    return rc;
  cl_device *d = &a->devices[device];
  pthread_mutex_lock(&d->lock);
  cl_pool *p = find_pool_locked(d, id);
  if (!p || p->use_count == 0) {
    pthread_mutex_unlock(&d->lock);
    return cl_fail(p ? CACHALOT_ERROR_INVALID_STATE : CACHALOT_ERROR_INVALID_ARGUMENT,
                   "cachalot_release_pool: %s pool " ID_FMT, p ? "already released" : "no such", ID_ARGS(id));
  }
  if (--p->use_count == 0)
    cl_pools_collect_locked(d); /* an empty pool disappears at once; one with segments when they go */
  pthread_mutex_unlock(&d->lock);
  return CACHALOT_OK;
}
