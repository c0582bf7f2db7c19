"""cachalot: a caching CUDA device-memory allocator.

    import cachalot
    cachalot.__version__          # the same as the C library's cachalot_version()

    import cachalot.torch
    cachalot.torch.install()      # cachalot becomes PyTorch's CUDA allocator (see cachalot.torch)
"""
import ctypes
import os

from ._build import VERSION as __version__

__all__ = ["__version__", "version", "library_path", "check_config"]

_here = os.path.dirname(os.path.abspath(__file__))
_lib = None


def library_path(name="cachalot"):
    """The path of one of the package's libraries: "cachalot" (the C library), "cachalot_torch" (the
    pluggable-allocator plug-in) or "cachalot_torch_backend" (the PyTorch backend). The C library's file
    is named as its SONAME, libcachalot.so.MAJOR."""
    if name == "cachalot":
        return os.path.join(_here, "libcachalot.so.%s" % __version__.split(".")[0])
    return os.path.join(_here, "lib%s.so" % name)


def _library():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        lib.cachalot_version.restype = ctypes.c_char_p
        lib.cachalot_last_error.restype = ctypes.c_char_p
        lib.cachalot_status_name.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def version():
    """The bundled C library's version (cachalot_version())."""
    return _library().cachalot_version().decode()


def check_config(conf):
    """Raises ValueError with the C library's reason unless conf (a str) is a config string
    cachalot_create would take (cachalot_check_config); creates nothing."""
    if not isinstance(conf, str):
        raise TypeError("conf must be a str, not %s" % type(conf).__name__)
    lib = _library()
    if lib.cachalot_check_config(conf.encode()) != 0:
        raise ValueError(lib.cachalot_last_error().decode())
