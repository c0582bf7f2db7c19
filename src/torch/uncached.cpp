// torch.cuda.caching_allocator_enable(False): allocations that bypass the cache (uncached.h).
#include "uncached.h"

#include "observe.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

namespace cachalot_torch {

namespace {

std::mutex mu;
std::unordered_set<void*> live; // guarded by mu
std::atomic<size_t> n_live{0};

} // namespace

void* uncached_malloc(size_t nbytes) {
  void* p = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&p, nbytes));
  std::lock_guard<std::mutex> g(mu);
  live.insert(p);
  n_live.store(live.size(), std::memory_order_relaxed);
  return p;
}

bool uncached_any() { return n_live.load(std::memory_order_relaxed) != 0; }

bool uncached_free(void* p) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (!live.erase(p))
      return false;
    n_live.store(live.size(), std::memory_order_relaxed);
  }
  C10_CUDA_CHECK(cudaFree(p));
  return true;
}

void uncached_delete(void* p) {
  observing_free(p);
  try {
    (void)uncached_free(p);
  } catch (const std::exception& e) {
    TORCH_WARN("cachalot: freeing an uncached allocation: ", e.what());
  }
}

} // namespace cachalot_torch
