"""Prints what building against the importable torch needs, one item a line: its include directories
(';'-joined), its library directory, and its _GLIBCXX_USE_CXX11_ABI. Exits 1 when torch is not there."""
import sys

try:
    import torch
    import torch.utils.cpp_extension as ext
except Exception as e:  # no torch, or one without its C++ side
    print("torch not importable: %s" % e, file=sys.stderr)
    sys.exit(1)

print(";".join(ext.include_paths()))
print(ext.library_paths()[0])
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)
