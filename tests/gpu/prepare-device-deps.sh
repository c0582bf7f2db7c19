#!/usr/bin/env bash
# Copies what the GPU machine lacks (uthash's headers, CMocka's headers and library) from this Debian
# machine into .device/ (git-ignored), to be carried along with a device run. Also, for alloc_bench's
# replay workload (tools/meson.build looks for them in deps_dir): cJSON's header and library, and zlib's
# headers with its static library (linked into the tool, so no libz.so of Debian's shadows the GPU
# machine's own through LD_LIBRARY_PATH); both are optional.
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
echo "prepared $root/.device"
