// CUDA tensors shared between processes (ipc.h). The handle is PyTorch's: a version byte, a type byte ('c':
// an allocation of cudaMalloc's, followed by its cudaIpcMemHandle_t), so that a cachalot process and a
// native one can exchange tensors either way.
#include "ipc.h"

#include "convert.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>

namespace cachalot_torch {

namespace {

// PyTorch's format (CUDACachingAllocator.cpp in 2.11): version 2; older versions wrote the same 'c' form.
constexpr char kHandleVersion = 2;
constexpr char kCudaMalloc = 'c';
constexpr char kExpandable = 'e';
constexpr size_t kIpcHandleSize = sizeof(cudaIpcMemHandle_t);

std::mutex opened_mu;
std::map<std::string, std::weak_ptr<void>> opened; // by handle: one open mapping per allocation

} // namespace

c10::cuda::CUDACachingAllocator::ShareableHandle share_ipc_handle(cachalot_allocator* a, void* ptr) {
  unsigned char h[64];
  size_t offset = 0;
  static_assert(sizeof h == kIpcHandleSize, "cudaIpcMemHandle_t is 64 bytes");
  check(cachalot_ipc_handle(a, ptr, h, &offset), "shareIpcHandle");
  std::string out;
  out.reserve(2 + kIpcHandleSize);
  out.push_back(kHandleVersion);
  out.push_back(kCudaMalloc);
  out.append(reinterpret_cast<const char*>(h), kIpcHandleSize);
  return {static_cast<ptrdiff_t>(offset), out};
}

std::shared_ptr<void> open_ipc_handle(const std::string& handle) {
  // A bare 64-byte handle is the oldest form; else a version byte, a type and the payload.
  const bool bare = handle.size() == kIpcHandleSize;
  if (!bare) {
    TORCH_CHECK(!handle.empty() && handle[0] <= kHandleVersion,
                "cachalot: getIpcDevPtr: received a sharable handle from a future version of torch that this "
                "version does not know how to handle");
    TORCH_CHECK(handle.size() >= 2 && handle[1] != kExpandable,
                "cachalot: getIpcDevPtr: the tensor lives in an expandable segment of the sending process; "
                "cachalot opens only handles of cudaMalloc'd allocations (send it from a process without "
                "expandable_segments)");
    TORCH_CHECK(handle[1] == kCudaMalloc && handle.size() == 2 + kIpcHandleSize,
                "cachalot: getIpcDevPtr: not a CUDA IPC handle PyTorch writes");
  }
  std::lock_guard<std::mutex> g(opened_mu);
  auto it = opened.find(handle);
  if (it != opened.end())
    if (auto live = it->second.lock())
      return live;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data() + (bare ? 0 : 2), kIpcHandleSize);
  void* dev = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&dev, h, cudaIpcMemLazyEnablePeerAccess));
  const c10::DeviceIndex device = c10::cuda::current_device();
  std::shared_ptr<void> sp(dev, [handle, device](void* p) {
    {
      std::lock_guard<std::mutex> g2(opened_mu);
      auto e = opened.find(handle);
      if (e != opened.end() && e->second.expired())
        opened.erase(e);
    }
    c10::cuda::CUDAGuard guard(device);
    if (cudaIpcCloseMemHandle(p) != cudaSuccess)
      (void)cudaGetLastError(); // a deleter must not throw; the mapping goes with the process anyway
  });
  opened[handle] = sp;
  return sp;
}

} // namespace cachalot_torch
