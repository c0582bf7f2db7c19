// alloc_bench's PyTorch rows (tools/alloc_bench/torch_host.py drives them through ctypes): timed loops over
// the pinned-memory allocator PyTorch's pin_memory=True uses, the CUDA hooks' getPinnedMemoryAllocator() (the
// host workload), and over PyTorch's CUDA caching allocator (the device workloads). Here, in the one C++
// layer, rather than built at run time beside the tool; the loops are C++ so that the time is the
// allocator's alone, as alloc_bench's own rows are. Nothing here installs cachalot: the allocators timed are
// whichever PyTorch uses.
#include "convert.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime_api.h>

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

// The device sequence: per operation its size (0 frees), slot, stream and record (0, or 1 + the stream
// the block is marked used on before its free), and whether an allocation's block will be recorded (it is
// then taken as a DataPtr, which recordStream needs; the others through raw_alloc_with_stream, PyTorch's
// leanest call). The streams are made once and kept: a stream per request is the streams workload.
struct DeviceOp {
  int64_t size, slot, stream, record;
  bool keep;
};
std::vector<DeviceOp> dev_ops;
std::vector<void*> dev_raw;
std::vector<c10::DataPtr> dev_kept;
std::vector<cudaStream_t> dev_streams;

void release_device() {
  for (auto& d : dev_kept)
    d.clear();
  for (auto& p : dev_raw) {
    if (p != nullptr)
      c10::cuda::CUDACachingAllocator::raw_delete(p);
    p = nullptr;
  }
}

// The frame of a timed pass: `body(i, error)` runs the loop from operation i on (a failure throws, or
// names itself in `error`), timed with the steady clock around it alone. Its ns, or -1 with *done the
// failed operation's index and the reason, after `release` gave back what the pass left live.
template <typename Body>
int64_t timed_pass(Body body, void (*release)(), int64_t* done, char* err, size_t len) {
  size_t i = 0;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    body(i, error);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto t1 = std::chrono::steady_clock::now();
  *done = static_cast<int64_t>(i);
  if (!error.empty()) {
    release();
    set_error(err, len, error);
    return -1;
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
}

c10::cuda::CUDAStream wrap(cudaStream_t s) {
  return c10::cuda::getStreamFromExternal(s, c10::cuda::current_device());
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
  return timed_pass(
      [](size_t& i, std::string&) {
        c10::Allocator* a = at::detail::getCUDAHooks().getPinnedMemoryAllocator();
        for (; i < sizes.size(); i++) {
          if (sizes[i] != 0)
            live[static_cast<size_t>(slot_of[i])] = a->allocate(static_cast<size_t>(sizes[i]));
          else
            live[static_cast<size_t>(slot_of[i])].clear();
        }
      },
      release_all, done, err, len);
}

// Gives back every live allocation (each DataPtr's deleter is the allocator's free).
__attribute__((visibility("default"))) void cachalot_torch_bench_host_release(void) { release_all(); }

// The device sequence of n operations on n_streams streams (made here the first time they are needed).
// 0, or -1 with the reason.
__attribute__((visibility("default"))) int cachalot_torch_bench_device_load(const int64_t* size, const int64_t* slot,
                                                                             const int64_t* stream, const int64_t* record,
                                                                             size_t n, int64_t n_streams, char* err,
                                                                             size_t len) {
  try {
    release_device();
    while (static_cast<int64_t>(dev_streams.size()) < n_streams) {
      cudaStream_t s = nullptr;
      cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        set_error(err, len, std::string("cudaStreamCreateWithFlags: ") + cudaGetErrorString(e));
        return -1;
      }
      dev_streams.push_back(s);
    }
    int64_t n_slots = 0;
    dev_ops.assign(n, DeviceOp{});
    std::vector<int64_t> last_alloc;
    for (size_t i = 0; i < n; i++) {
      if (slot[i] < 0 || size[i] < 0 || stream[i] < 0 || stream[i] >= n_streams || record[i] < 0 ||
          record[i] > n_streams) {
        set_error(err, len, "a negative slot or size, or a stream out of range");
        return -1;
      }
      dev_ops[i] = DeviceOp{size[i], slot[i], stream[i], record[i], false};
      n_slots = std::max(n_slots, slot[i] + 1);
      if (last_alloc.size() < static_cast<size_t>(n_slots))
        last_alloc.resize(static_cast<size_t>(n_slots), -1);
      const auto k = static_cast<size_t>(slot[i]);
      if (size[i] != 0) {
        last_alloc[k] = static_cast<int64_t>(i);
      } else if (record[i] != 0 && last_alloc[k] >= 0) {
        dev_ops[static_cast<size_t>(last_alloc[k])].keep = true;
      }
    }
    dev_raw.assign(static_cast<size_t>(n_slots), nullptr);
    dev_kept.clear();
    dev_kept.resize(static_cast<size_t>(n_slots));
    return 0;
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
    return -1;
  }
}

// One timed pass, stream 0 synchronized at its end (as alloc_bench does for its own rows): its ns, or -1
// with *done the failed operation's index and the reason (what the pass left live is given back first).
__attribute__((visibility("default"))) int64_t cachalot_torch_bench_device_run(int64_t* done, char* err, size_t len) {
  return timed_pass(
      [](size_t& i, std::string& error) {
        c10::cuda::CUDACachingAllocator::CUDAAllocator* a = c10::cuda::CUDACachingAllocator::get();
        for (; i < dev_ops.size(); i++) {
          const DeviceOp& o = dev_ops[i];
          const auto k = static_cast<size_t>(o.slot);
          if (o.size != 0 && !o.keep) {
            dev_raw[k] =
                a->raw_alloc_with_stream(static_cast<size_t>(o.size), dev_streams[static_cast<size_t>(o.stream)]);
          } else if (o.size != 0) {
            c10::cuda::CUDAStreamGuard guard(wrap(dev_streams[static_cast<size_t>(o.stream)]));
            dev_kept[k] = a->allocate(static_cast<size_t>(o.size));
          } else if (o.record != 0) {
            a->recordStream(dev_kept[k], wrap(dev_streams[static_cast<size_t>(o.record - 1)]));
            dev_kept[k].clear();
          } else {
            a->raw_delete(dev_raw[k]);
            dev_raw[k] = nullptr;
          }
        }
        cudaError_t e = cudaStreamSynchronize(dev_streams.empty() ? nullptr : dev_streams[0]);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          error = std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e);
        }
      },
      release_device, done, err, len);
}

// Gives back every live device allocation.
__attribute__((visibility("default"))) void cachalot_torch_bench_device_release(void) { release_device(); }

} // extern "C"
