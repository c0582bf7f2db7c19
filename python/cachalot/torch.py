"""cachalot as PyTorch's CUDA allocator.

    import cachalot.torch
    cachalot.torch.install()          # before anything allocates CUDA memory

install() makes cachalot the allocator behind every CUDA tensor. Two routes:

- "backend" (the default where it was built): libcachalot_torch_backend, a complete PyTorch CUDAAllocator
  compiled against this torch's headers. Tensor.record_stream, torch.cuda.empty_cache, memory_stats,
  memory_summary, reset_peak_memory_stats, set_per_process_memory_fraction (torch.OutOfMemoryError),
  _record_memory_history + _snapshot / _dump_snapshot (with Python frames), torch.cuda.graph and MemPool
  pools, and torch.compile(mode="reduce-overhead") all reach cachalot.
- "pluggable" (the fallback, e.g. for a torch other than the one the backend was built against):
  PyTorch's CUDAPluggableAllocator, which passes malloc and free only (see cachalot._pluggable for what it
  lacks: record_stream above all).

Config, on the backend route: PYTORCH_ALLOC_CONF (else PYTORCH_CUDA_ALLOC_CONF), then install(conf=...) or
CACHALOT_ALLOC_CONF, later keys winning; cachalot's own keys are accepted in either. They are read when
PyTorch first uses CUDA, as native reads its config, and torch.cuda.memory._set_allocator_settings reaches
cachalot at run time. install() touches no CUDA (a program may fork workers before its first CUDA use)
and raises on a malformed config.

PyTorch versions: 2.0 or newer, else importing this module raises ImportError (ModuleNotFoundError where
there is no torch) with a message that says what to do. The pluggable route needs
torch.cuda.memory.CUDAPluggableAllocator and change_current_allocator, first released in 2.0; the backend
is built only against torch 2.11 or newer (its allocator interfaces and at::setHostAllocator). Tested: 2.11.
"""
import ctypes
import json
import os
import re
import sys
import warnings

from . import _build, _library, check_config, library_path

OLDEST_TORCH = (2, 0)  # the pluggable route's torch.cuda.memory.CUDAPluggableAllocator first shipped in 2.0.0
OLDEST_TORCH_BACKEND = tuple(int(x) for x in _build.TORCH_OLDEST.split("."))  # meson.build's torch_oldest
_NEEDS = ("cachalot.torch needs PyTorch %d.%d or newer (%d.%d or newer for its backend route; tested with 2.11)"
          % (OLDEST_TORCH + OLDEST_TORCH_BACKEND))
_THEN = ("then reinstall cachalot from its checkout (`pip install --no-build-isolation .`) so that its backend is "
         "built against that torch")


def _torch_version(text):
    """(major, minor) of a torch version string ("2.11.0+cu130", "1.13.1", "2.1.0a0+git1234567"), or None."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _import_torch():
    """torch, or an ImportError that names the versions cachalot supports and what to install."""
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":  # torch is there but one of its own imports is not: its error says which
            raise
        raise ModuleNotFoundError("%s, and this Python (%s) has no torch: install it (`pip install torch`), %s"
                                  % (_NEEDS, sys.executable, _THEN), name="torch") from None
    version = getattr(torch, "__version__", "unknown")
    parsed = _torch_version(version)
    cuda_memory = getattr(getattr(torch, "cuda", None), "memory", None)
    if (parsed is not None and parsed < OLDEST_TORCH) or (
            parsed is None and not hasattr(cuda_memory, "CUDAPluggableAllocator")):
        where = os.path.dirname(getattr(torch, "__file__", None) or "?")
        raise ImportError("%s, and this is torch %s (%s): upgrade it (`pip install --upgrade torch`), %s"
                          % (_NEEDS, version, where, _THEN), name="torch")
    return torch


_torch = _import_torch()

__all__ = ["install", "route", "memory_stats", "snapshot", "annotate", "empty_cache", "reset_peak_stats",
           "release_capture_pools", "backend_unavailable"]

_route = None
_conf = None  # install()'s conf
_handle = None  # () -> the cachalot_allocator* the installed route serves from
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]


def backend_unavailable():
    """Why the backend route cannot be used here (a sentence), or None when it can."""
    if not _build.TORCH_BACKEND:
        return ("this cachalot was built without the PyTorch backend (the build found no torch %d.%d or newer "
                "with its headers, or no CUDA toolkit; `pip install -v --no-build-isolation .` shows which)"
                % OLDEST_TORCH_BACKEND)
    if _build.TORCH_VERSION != _torch.__version__:
        return "the backend was built against torch %s, this is torch %s" % (_build.TORCH_VERSION, _torch.__version__)
    if not os.path.exists(library_path("cachalot_torch_backend")):
        return "%s is missing" % library_path("cachalot_torch_backend")
    return None


def install(conf=None, route="auto", pinned=True):
    """Makes cachalot PyTorch's CUDA allocator and returns the route in force ("backend" or "pluggable").

    conf: a CACHALOT_ALLOC_CONF string (None: the environment variable's; see above for
    PYTORCH_CUDA_ALLOC_CONF). route: "auto" (the backend
    where it can be used, else the pluggable fallback, with a warning that says why), "backend" or
    "pluggable". pinned: on the backend route, also make cachalot's host cache PyTorch's pinned-memory
    allocator (pin_memory(), DataLoader's pinning, torch.cuda.host_memory_stats()); the pluggable route
    leaves pinned memory to PyTorch. Call it before anything allocates CUDA memory; calling it again
    returns the route (with another conf it raises RuntimeError). A conf cachalot would refuse raises
    ValueError before anything is installed."""
    global _route, _handle, _conf
    if route not in ("auto", "backend", "pluggable"):
        raise ValueError("route must be 'auto', 'backend' or 'pluggable', not %r" % (route,))
    if _route is not None:
        if route not in ("auto", _route):
            raise RuntimeError("cachalot is already installed on the %s route" % _route)
        if conf is not None and conf != _conf:
            raise RuntimeError("cachalot is already installed with conf=%r; to change settings at run time use "
                               "torch.cuda.memory._set_allocator_settings(%r)" % (_conf, conf))
        return _route
    if conf is not None:  # refused before anything is installed or put in the environment
        check_config(conf)
    why = backend_unavailable() if route != "pluggable" else "the pluggable route was asked for"
    if why is None:
        lib = ctypes.CDLL(library_path("cachalot_torch_backend"))
        lib.cachalot_torch_backend_install.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.cachalot_torch_backend_allocator.restype = ctypes.c_void_p
        err = ctypes.create_string_buffer(1024)
        if lib.cachalot_torch_backend_install(conf.encode() if conf is not None else None, err, len(err)) != 0:
            raise RuntimeError(err.value.decode())
        _route, _handle, _conf = "backend", lib.cachalot_torch_backend_allocator, conf  # installed, whatever follows
        if pinned:
            lib.cachalot_torch_host_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            if lib.cachalot_torch_host_install(err, len(err)) != 0:
                raise RuntimeError(err.value.decode())
        return _route
    if route == "backend":
        raise RuntimeError("cachalot: the PyTorch backend cannot be used: " + why)
    plugin = library_path("cachalot_torch")
    if not os.path.exists(plugin):  # both routes need the CUDA backend, built only with the CUDA toolkit
        raise RuntimeError("cachalot: %s; and the pluggable route cannot be used either: %s is missing (this "
                           "cachalot was built without the CUDA toolkit: install it, e.g. in /usr/local/cuda, "
                           "then `pip install --no-build-isolation .` again)" % (why, plugin))
    if route == "auto":
        warnings.warn("cachalot: %s; using the pluggable route, which lacks record_stream, empty_cache, "
                      "torch.cuda's memory statistics and snapshots, and torch.compile's CUDA graphs" % why)
    from . import _pluggable

    _lib_pluggable, _handle = _pluggable.install(conf)
    _route, _conf = "pluggable", conf
    return _route


def route():
    """The route in force: "backend", "pluggable", or None before install()."""
    return _route


def _allocator():
    if _handle is None:
        raise RuntimeError("cachalot.torch.install() first")
    a = _handle()
    if not a:
        raise RuntimeError("cachalot could not start: " + _library().cachalot_last_error().decode())
    return a


def _check(status, what):
    if status != 0:
        raise RuntimeError("%s: %s" % (what, _library().cachalot_last_error().decode()))


def _json(name, *args):
    lib = _library()
    fn = getattr(lib, name)
    out = ctypes.c_void_p()
    _check(fn(*args, ctypes.byref(out)), name)
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        _libc.free(out)


def _device(device):
    """A device index from None (the current device), an int, "cuda:1" or a torch.device."""
    if device is None:
        return _torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = _torch.device(device)
    return d.index if d.index is not None else _torch.cuda.current_device()


def memory_stats(device=None):
    """cachalot's own stats of `device`, with torch.cuda.memory_stats()'s keys (on the backend route
    torch.cuda.memory_stats() gives the same figures)."""
    return _json("cachalot_memory_stats_json", ctypes.c_void_p(_allocator()), ctypes.c_int(_device(device)))


def snapshot():
    """cachalot's snapshot (segments, traces, settings) in torch.cuda.memory._snapshot()'s schema, with C
    frames where stacks are recorded."""
    return _json("cachalot_snapshot_json", ctypes.c_void_p(_allocator()))


def annotate(text, device=None):
    """Marks a moment of the program on `device`'s memory timeline: a "user_defined" trace entry whose
    "name" is `text` (cachalot_annotate; cut to 1023 bytes of UTF-8). Nothing is recorded while memory
    history is off."""
    a = _allocator()
    lib = _library()
    lib.cachalot_annotate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    _check(lib.cachalot_annotate(ctypes.c_void_p(a), ctypes.c_int(_device(device)),
                                 str(text).encode("utf-8")), "cachalot_annotate")


class _Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("current", "peak", "allocated", "freed")]


class _Duration(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("total", "max", "min", "count")]


class _HostStats(ctypes.Structure):  # cachalot_host_stats (include/cachalot/host.h)
    _fields_ = [("allocations", _Stat), ("allocated_bytes", _Stat), ("active_requests", _Stat),
                ("active_bytes", _Stat), ("host_alloc_time", _Duration), ("host_free_time", _Duration),
                ("num_host_alloc", ctypes.c_int64), ("num_host_free", ctypes.c_int64)]


def host_memory_stats():
    """cachalot's host cache stats, with torch.cuda.host_memory_stats()'s keys (its own figures, whichever
    allocator PyTorch pins through)."""
    st = _HostStats()
    _check(_library().cachalot_host_memory_stats(ctypes.c_void_p(_allocator()), ctypes.byref(st)),
           "cachalot_host_memory_stats")
    out = {}
    for name, _ in _HostStats._fields_:
        v = getattr(st, name)
        if isinstance(v, int):
            out[name] = v
            continue
        for field, _ in v._fields_:
            out["%s.%s" % (name, field)] = getattr(v, field)
        if isinstance(v, _Duration):
            out[name + ".avg"] = v.total // v.count if v.count else 0
    return dict(sorted(out.items()))


def empty_cache():
    """Gives every whole free cached segment back to the device."""
    _check(_library().cachalot_empty_cache(ctypes.c_void_p(_allocator())), "cachalot_empty_cache")


def reset_peak_stats(device=None):
    _check(_library().cachalot_reset_peak_stats(ctypes.c_void_p(_allocator()), ctypes.c_int(_device(device))),
           "cachalot_reset_peak_stats")


def release_capture_pools(device=None):
    """Pluggable route: gives up the private pools of graph captures that are over (once their graphs are
    destroyed). The backend route releases a graph's pool when the graph goes, as PyTorch does."""
    _check(_library().cachalot_release_capture_pools(ctypes.c_void_p(_allocator()), ctypes.c_int(_device(device))),
           "cachalot_release_capture_pools")
