#!/usr/bin/env bash
# Copies what the GPU machine lacks (uthash's headers, CMocka's headers and library) from this Debian
# machine into .device/ (git-ignored), to be carried along with a device run. Also, for alloc_bench's
# replay workload (tools/meson.build looks for them in deps_dir): cJSON's header and library, and zlib's
# headers with its static library (linked into the tool, so no libz.so of Debian's shadows the GPU
# machine's own through LD_LIBRARY_PATH); both are optional. Needs: uthash-dev libcmocka-dev libcjson-dev
# zlib1g-dev python3-mesonpy (scripts/install-deps.sh installs them).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.device/include" "$root/.device/lib"
cp /usr/include/ut*.h /usr/include/cmocka*.h "$root/.device/include/"
cp -a /usr/lib/x86_64-linux-gnu/libcmocka.so* "$root/.device/lib/"
if [ -f /usr/include/cjson/cJSON.h ] && [ -f /usr/include/zlib.h ] && [ -f /usr/lib/x86_64-linux-gnu/libz.a ]; then
  mkdir -p "$root/.device/include/cjson"
  cp /usr/include/cjson/cJSON.h "$root/.device/include/cjson/"
  cp -a /usr/lib/x86_64-linux-gnu/libcjson.so* "$root/.device/lib/"
  cp /usr/include/zlib.h /usr/include/zconf.h "$root/.device/include/"
  cp /usr/lib/x86_64-linux-gnu/libz.a "$root/.device/lib/"
else
  echo "note: libcjson-dev or zlib1g-dev missing here: alloc_bench will be built without replay there"
fi
# meson-python and what it imports (pure Python, from Debian's python3-mesonpy, python3-pyproject-metadata
# and python3-packaging): the GPU machine builds the Python package with them on PYTHONPATH.
if [ -d /usr/lib/python3/dist-packages/mesonpy ]; then
  mkdir -p "$root/.device/py"
  for m in mesonpy pyproject_metadata packaging; do
    rm -rf "$root/.device/py/$m"
    cp -r "/usr/lib/python3/dist-packages/$m" "$root/.device/py/"
  done
else
  echo "note: python3-mesonpy missing here: the GPU machine cannot build the Python package"
fi
echo "prepared $root/.device"
