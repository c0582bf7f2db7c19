// What PyTorch's observers of allocations see of cachalot's (observe.h).
#include "observe.h"

#include <c10/core/Allocator.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <utility>

namespace cachalot_torch {

namespace {

bool totals(cachalot_allocator* a, c10::DeviceIndex device, int64_t* allocated, int64_t* reserved) {
  cachalot_device_stats s;
  if (cachalot_memory_stats(a, device, &s) != CACHALOT_OK)
    return false;
  *allocated = s.allocated_bytes[CACHALOT_STAT_ALL].current;
  *reserved = s.reserved_bytes[CACHALOT_STAT_ALL].current;
  return true;
}

void report(cachalot_allocator* a, c10::DeviceIndex device, void* p, int64_t mark) {
  int64_t allocated = 0, reserved = 0;
  if (mark >= 0 && totals(a, device, &allocated, &reserved))
    c10::reportMemoryUsageToProfiler(p, allocated - mark, static_cast<size_t>(allocated),
                                     static_cast<size_t>(reserved), c10::Device(c10::DeviceType::CUDA, device));
}

} // namespace

bool profiling_memory() { return c10::memoryProfilingEnabled(); }

int64_t profiler_mark(cachalot_allocator* a, c10::DeviceIndex device) {
  int64_t allocated = 0, reserved = 0;
  if (C10_LIKELY(!c10::memoryProfilingEnabled()) || !totals(a, device, &allocated, &reserved))
    return -1;
  return allocated;
}

void observed_malloc(cachalot_allocator* a, c10::DeviceIndex device, void* p, int64_t mark) {
  if (const c10::impl::PyInterpreter* trace = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(trace))
    (*trace)->trace_gpu_memory_allocation(c10::kCUDA, reinterpret_cast<uintptr_t>(p));
  if (C10_UNLIKELY(mark >= 0))
    report(a, device, p, mark);
}

void observing_free(void* p) {
  if (const c10::impl::PyInterpreter* trace = c10::impl::GPUTrace::get_trace(); C10_UNLIKELY(trace))
    (*trace)->trace_gpu_memory_deallocation(c10::kCUDA, reinterpret_cast<uintptr_t>(p));
}

c10::DeviceIndex device_of(void* p) {
  cudaPointerAttributes at{};
  const cudaError_t err = cudaPointerGetAttributes(&at, p);
  if (err == cudaSuccess && at.type == cudaMemoryTypeDevice)
    return static_cast<c10::DeviceIndex>(at.device);
  if (err != cudaSuccess) // its own error only: one the program has not read yet stays
    (void)cudaGetLastError();
  return c10::cuda::current_device();
}

void observed_free(cachalot_allocator* a, c10::DeviceIndex device, void* p, int64_t mark) {
  if (C10_UNLIKELY(mark >= 0))
    report(a, device, p, mark);
}

void OomObservers::attach(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver o) {
  std::lock_guard<std::mutex> g(mu_);
  observers_.push_back(std::move(o));
}

void OomObservers::call(int device, size_t alloc_size, size_t limit, size_t device_free, void* self) {
  auto* me = static_cast<OomObservers*>(self);
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> obs;
  {
    std::lock_guard<std::mutex> g(me->mu_);
    obs = me->observers_;
  }
  // An exception must not cross cachalot's C frames (the call would not finish): the failure is reported
  // as an out-of-memory error anyway, and the observer's own error as a warning.
  for (const auto& o : obs) {
    try {
      o(static_cast<int64_t>(device), alloc_size, limit, device_free);
    } catch (const std::exception& e) {
      TORCH_WARN("cachalot: an out-of-memory observer raised: ", e.what());
    } catch (...) {
      TORCH_WARN("cachalot: an out-of-memory observer raised");
    }
  }
}

} // namespace cachalot_torch
