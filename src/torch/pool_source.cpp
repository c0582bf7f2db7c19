// MemPool(allocator=...): a MemPool's own allocator as the source of its pool's segments (pool_source.h).
#include "pool_source.h"

#include "convert.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <utility>

namespace cachalot_torch {

namespace {

struct Source {
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator;
};

// No exception may cross cachalot's C frames: a failing allocator gives no memory (the malloc then fails
// as out of memory, with the allocator's message as a warning), a failing free is a warning.
void* source_alloc(size_t size, int device, cachalot_stream stream, void* ctx) {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    return static_cast<Source*>(ctx)->allocator->raw_alloc_with_stream(size, stream);
  } catch (const std::exception& e) {
    TORCH_WARN("cachalot: a MemPool's allocator failed to allocate ", size, " bytes: ", e.what());
    return nullptr;
  }
}

void source_free(void* ptr, size_t, int device, cachalot_stream, void* ctx) {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    static_cast<Source*>(ctx)->allocator->raw_delete(ptr);
  } catch (const std::exception& e) {
    TORCH_WARN("cachalot: a MemPool's allocator failed to free ", ptr, ": ", e.what());
  }
}

void source_release(void* ctx) { delete static_cast<Source*>(ctx); }

} // namespace

void set_pool_source(cachalot_allocator* a, c10::DeviceIndex device, cachalot_mempool_id id,
                     std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator) {
  auto* src = new Source{std::move(allocator)};
  const cachalot_segment_source s = {&source_alloc, &source_free, &source_release, src};
  const cachalot_status rc = cachalot_pool_set_source(a, device, id, &s);
  if (rc != CACHALOT_OK) {
    delete src;
    fail("createOrIncrefPool", rc);
  }
}

} // namespace cachalot_torch
