// Private to the PyTorch backend: torch.cuda.caching_allocator_enable(False), an allocator that does not
// cache. As native's: each allocation is a cudaMalloc of its own, given back with cudaFree when freed, and
// counted in no statistic.
#pragma once

#include <cstddef>

#pragma GCC visibility push(hidden)

namespace cachalot_torch {

// A cudaMalloc of nbytes on the current device (a CUDA error raises, as native's).
void* uncached_malloc(size_t nbytes);

// Whether any such allocation is live (one relaxed load: the free path asks it first).
bool uncached_any();

// Gives p back with cudaFree if it is one of them: true then, false when p is not one.
bool uncached_free(void* p);

// Their DataPtrs' deleter: the GPU trace hook, then uncached_free (no exception: a deleter must not throw).
void uncached_delete(void* p);

} // namespace cachalot_torch

#pragma GCC visibility pop
