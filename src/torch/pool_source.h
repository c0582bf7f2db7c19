// Private to the PyTorch backend: MemPool(allocator=...), a pool whose segments come from the MemPool's
// own CUDAAllocator (a CUDAPluggableAllocator: ncclMemAlloc, cudaMallocManaged, ...).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cachalot/cachalot.h>

#include <memory>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// Makes `allocator` the source of pool `id`'s segments on `device` (cachalot_pool_set_source): each
// segment is its raw_alloc_with_stream, given back with its raw_delete; the pool keeps the allocator alive
// until the pool and its last segment are gone, as PyTorch's PrivatePool does.
void set_pool_source(cachalot_allocator* a, c10::DeviceIndex device, cachalot_mempool_id id,
                     std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator);

} // namespace cachalot_torch

#pragma GCC visibility pop
