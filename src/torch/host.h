// Private to the PyTorch backend: cachalot's host cache as PyTorch's CUDA host (pinned memory) allocator.
#pragma once

#include <cachalot/cachalot.h>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// Makes the host cache of the allocator get() returns (made on first use) the CUDA host allocator PyTorch
// pins through (at::setHostAllocator); the one it replaces still answers for the memory it pinned before.
// Once per process; later calls do nothing.
void install_host_allocator(cachalot_allocator* (*get)());
bool host_allocator_installed();

} // namespace cachalot_torch

#pragma GCC visibility pop
