// Private to the PyTorch backend: what PyTorch's observers of allocations see of cachalot's, as they see
// native's: torch.cuda._gpu_trace's hooks (the CUDA stream sanitizer), the profiler's memory events
// (torch.profiler.profile(profile_memory=True), which memory_viz's profile_plot draws) and the
// out-of-memory observers.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cachalot/cachalot.h>

#include <cstdint>
#include <mutex>
#include <vector>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// Whether the profiler records memory now (one thread-local read).
bool profiling_memory();

// Before a malloc or free on `device`: the device's allocated bytes while the profiler records memory,
// else -1.
int64_t profiler_mark(cachalot_allocator* a, c10::DeviceIndex device);

// After a malloc of p (mark: profiler_mark's before it): the GPU trace hook, and the profiler's event with
// the block's size (the change in allocated bytes: cachalot rounds as native does).
void observed_malloc(cachalot_allocator* a, c10::DeviceIndex device, void* p, int64_t mark);

// Before the free of p: the GPU trace hook, as native calls it.
void observing_free(void* p);

// The device of cachalot's block at p, for the profiler's free event (a driver query: only while
// profiling); the current device where the driver cannot say.
c10::DeviceIndex device_of(void* p);

// After the free of p on `device` (mark: profiler_mark's before it): the profiler's event.
void observed_free(cachalot_allocator* a, c10::DeviceIndex device, void* p, int64_t mark);

// torch._C._cuda_attach_out_of_memory_observer's observers, called at each out-of-memory failure.
class OomObservers {
 public:
  void attach(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver o);
  // cachalot's observer (cachalot_attach_oom_observer): called with no cachalot lock held; self is this.
  static void call(int device, size_t alloc_size, size_t limit, size_t device_free, void* self);

 private:
  std::mutex mu_;
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> observers_;
};

} // namespace cachalot_torch

#pragma GCC visibility pop
