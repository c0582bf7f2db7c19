"""cachalot as PyTorch's CUDA allocator.

    import cachalot_torch
    cachalot_torch.install("/path/to/libcachalot_torch.so")   # before the first CUDA allocation
    ...
    cachalot_torch.memory_stats()      # torch.cuda.memory_stats()'s keys, from cachalot
    cachalot_torch.snapshot()          # torch.cuda.memory._snapshot()'s schema
    cachalot_torch.empty_cache()

install() plugs the library in with torch.cuda.memory.CUDAPluggableAllocator and
change_current_allocator. PyTorch's own stats, snapshot and empty_cache calls do not reach a pluggable
allocator: use these. The library turns cachalot's capture detection on (unless CACHALOT_ALLOC_CONF names
detect_captures), so torch.cuda.graph captures get private pools; release_capture_pools() gives those up
once the graphs are gone. PyTorch does not pass Tensor.record_stream to a pluggable allocator: a tensor
used on another stream must be kept alive by the program until that stream is done with it.
"""
import ctypes
import json
import os

_lib = None
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]


def _default_path():
    return os.environ.get("CACHALOT_TORCH_LIB", "libcachalot_torch.so")


def install(path=None):
    """Makes cachalot PyTorch's CUDA allocator (call before anything allocates CUDA memory)."""
    global _lib
    import torch

    path = os.path.abspath(path) if path and os.path.exists(path) else (path or _default_path())
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "cachalot_torch_malloc", "cachalot_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    _load(path)
    return alloc


def _load(path):
    global _lib
    lib = ctypes.CDLL(path)  # the library PyTorch loaded: the same process-wide allocator
    lib.cachalot_torch_allocator.restype = ctypes.c_void_p
    lib.cachalot_last_error.restype = ctypes.c_char_p
    lib.cachalot_memory_stats_json.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.cachalot_snapshot_json.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.cachalot_empty_cache.argtypes = [ctypes.c_void_p]
    lib.cachalot_release_capture_pools.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.cachalot_reset_peak_stats.argtypes = [ctypes.c_void_p, ctypes.c_int]
    _lib = lib


def _allocator():
    if _lib is None:
        raise RuntimeError("cachalot_torch.install() first")
    a = _lib.cachalot_torch_allocator()
    if not a:
        raise RuntimeError("cachalot could not start: " + _lib.cachalot_last_error().decode())
    return a


def _check(status, what):
    if status != 0:
        raise RuntimeError("%s: %s" % (what, _lib.cachalot_last_error().decode()))


def _json(call, *args):
    out = ctypes.c_void_p()
    _check(call(*args, ctypes.byref(out)), call.__name__)
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        _libc.free(out)


def _device(device):
    """A device index from None (the current device), an int, \"cuda:1\" or a torch.device."""
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def memory_stats(device=None):
    """cachalot's stats of `device` with torch.cuda.memory_stats()'s keys."""
    return _json(_lib.cachalot_memory_stats_json, _allocator(), _device(device))


def snapshot():
    """Segments, traces and settings in torch.cuda.memory._snapshot()'s schema."""
    return _json(_lib.cachalot_snapshot_json, _allocator())


def empty_cache():
    """Gives every whole free segment back to the device."""
    _check(_lib.cachalot_empty_cache(_allocator()), "cachalot_empty_cache")


def reset_peak_stats(device=None):
    _check(_lib.cachalot_reset_peak_stats(_allocator(), _device(device)), "cachalot_reset_peak_stats")


def release_capture_pools(device=None):
    """Gives up the private pools of graph captures that are over (once their graphs are destroyed)."""
    _check(_lib.cachalot_release_capture_pools(_allocator(), _device(device)), "cachalot_release_capture_pools")
