// alloc_bench's PyTorch row of the host workload (tools/alloc_bench/torch_host.py drives it through
// ctypes): a timed loop over the pinned-memory allocator PyTorch's pin_memory=True uses, the CUDA hooks'
// getPinnedMemoryAllocator(). Here, in the one C++ layer, rather than built at run time beside the tool;
// the loop is C++ so that the time is the allocator's alone, as alloc_bench's own rows are. Nothing here
// installs cachalot: the allocator timed is whichever PyTorch pins through.
#include "convert.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

using cachalot_torch::set_error;

// The sequence (size 0 frees its slot), and what each slot holds: an empty DataPtr when nothing.
std::vector<int64_t> sizes, slot_of;
std::vector<c10::DataPtr> live;

void release_all() {
  for (auto& d : live)
    d.clear();
}

} // namespace

extern "C" {

// The sequence of n operations: size > 0 allocates into slots[i], 0 frees it. 0, or -1 with the reason.
__attribute__((visibility("default"))) int cachalot_torch_bench_host_load(const int64_t* size, const int64_t* slot,
                                                                           size_t n, char* err, size_t len) {
  try {
    int64_t n_slots = 0;
    for (size_t i = 0; i < n; i++) {
      if (slot[i] < 0 || size[i] < 0) {
        set_error(err, len, "a negative slot or size");
        return -1;
      }
      n_slots = std::max(n_slots, slot[i] + 1);
    }
    release_all();
    sizes.assign(size, size + n);
    slot_of.assign(slot, slot + n);
    live.clear();
    live.resize(static_cast<size_t>(n_slots));
    return 0;
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
    return -1;
  }
}

// One timed pass: its ns, or -1 with *done the failed operation's index and the reason (what the pass
// left live is given back first).
__attribute__((visibility("default"))) int64_t cachalot_torch_bench_host_run(int64_t* done, char* err, size_t len) {
  size_t i = 0;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c10::Allocator* a = at::detail::getCUDAHooks().getPinnedMemoryAllocator();
    for (; i < sizes.size(); i++) {
      if (sizes[i] != 0)
        live[static_cast<size_t>(slot_of[i])] = a->allocate(static_cast<size_t>(sizes[i]));
      else
        live[static_cast<size_t>(slot_of[i])].clear();
    }
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto t1 = std::chrono::steady_clock::now();
  *done = static_cast<int64_t>(i);
  if (!error.empty()) {
    release_all();
    set_error(err, len, error);
    return -1;
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
}

// Gives back every live allocation (each DataPtr's deleter is the allocator's free).
__attribute__((visibility("default"))) void cachalot_torch_bench_host_release(void) { release_all(); }

} // extern "C"
