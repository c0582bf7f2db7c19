"""Prints what building the PyTorch backend against the importable torch needs, one item a line: its
include directories (';'-joined), its library directory, its _GLIBCXX_USE_CXX11_ABI and its version.
When that torch cannot be built against, prints one line saying why on standard error and exits 1: no
torch, a torch older than the backend supports, or headers that are missing or dangling links (Debian's
python3-torch ships its include folders as links to a package it does not depend on).

usage: torch-build-info.py OLDEST   (MAJOR.MINOR, the oldest torch the backend supports: meson.build's
torch_oldest, which the package's _build.py carries too)"""
import os
import re
import sys


def fail(why):
    print(why, file=sys.stderr)
    sys.exit(1)


if len(sys.argv) != 2 or not re.fullmatch(r"\d+\.\d+", sys.argv[1]):
    fail("usage: torch-build-info.py MAJOR.MINOR (the oldest torch the backend supports)")
OLDEST = tuple(int(x) for x in sys.argv[1].split("."))


try:
    import torch
    import torch.utils.cpp_extension as ext
except Exception as e:  # no torch, or one without its C++ side
    fail("no importable torch (%s: %s)" % (type(e).__name__, e))

version = getattr(torch, "__version__", "unknown")
m = re.match(r"(\d+)\.(\d+)", str(version))
if not m or (int(m.group(1)), int(m.group(2))) < OLDEST:
    fail("torch %s at %s is older than %d.%d, the oldest the backend supports"
         % (version, os.path.dirname(torch.__file__), OLDEST[0], OLDEST[1]))
try:
    includes = ext.include_paths()
    libdir = ext.library_paths()[0]
except Exception as e:
    fail("torch %s does not say where its headers are (%s: %s)" % (version, type(e).__name__, e))
for path in includes:
    if not os.path.isdir(path):
        what = "a dangling link" if os.path.islink(path) else "missing"
        fail("torch %s's include folder %s is %s" % (version, path, what))
header = os.path.join("c10", "cuda", "CUDACachingAllocator.h")
if not any(os.path.isfile(os.path.join(p, header)) for p in includes):
    fail("torch %s has no %s in %s" % (version, header, ";".join(includes)))
if not os.path.isdir(libdir):
    fail("torch %s's library folder %s is missing" % (version, libdir))

print(";".join(includes))
print(libdir)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(version)
