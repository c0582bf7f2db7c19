// Private to the PyTorch backend: CUDA tensors shared between processes (torch.multiprocessing), in
// PyTorch's handle format so that either side may be native or cachalot.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cachalot/cachalot.h>

#include <memory>
#include <string>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// PyTorch's shareIpcHandle: the handle of the device allocation that holds the block at ptr (version
// byte, 'c', the 64 bytes of cudaIpcMemHandle_t) and ptr's offset in it.
c10::cuda::CUDACachingAllocator::ShareableHandle share_ipc_handle(cachalot_allocator* a, void* ptr);

// PyTorch's getIpcDevPtr: the other process's allocation opened here (cudaIpcOpenMemHandle), once per
// handle while any pointer to it lives; closed when the last goes.
std::shared_ptr<void> open_ipc_handle(const std::string& handle);

} // namespace cachalot_torch

#pragma GCC visibility pop
