"""The fallback route: cachalot through PyTorch's pluggable-allocator ABI (CUDAPluggableAllocator).

PyTorch tells a pluggable allocator about malloc and free only. So on this route: Tensor.record_stream does
not reach cachalot (a tensor used on another stream must be kept alive by the program until that stream is
done with it); torch.cuda.empty_cache, memory_stats, memory_summary, _snapshot and _record_memory_history
raise or do nothing (use cachalot.torch's own functions); graph captures are found by cachalot's capture
detection (turned on here unless CACHALOT_ALLOC_CONF names detect_captures), and their pools are given
up by cachalot.torch.release_capture_pools(); torch.compile(mode="reduce-overhead") fails.
"""
import ctypes
import os

from . import library_path


def install(conf):
    """Plugs libcachalot_torch in with change_current_allocator; returns the ctypes handle of the library."""
    import torch

    if conf is not None:  # the plug-in makes cachalot_default(), which reads the environment
        os.environ["CACHALOT_ALLOC_CONF"] = conf
    path = library_path("cachalot_torch")
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "cachalot_torch_malloc", "cachalot_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    lib = ctypes.CDLL(path)  # the library PyTorch loaded: the same process-wide allocator
    lib.cachalot_torch_allocator.restype = ctypes.c_void_p
    return lib, lib.cachalot_torch_allocator
