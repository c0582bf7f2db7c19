#!/usr/bin/env bash
# Copies what the GPU machine lacks (uthash's headers, CMocka's headers and library) from this Debian
# machine into .device/ (git-ignored), to be carried along with a device run.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.device/include" "$root/.device/lib"
cp /usr/include/ut*.h /usr/include/cmocka*.h "$root/.device/include/"
cp -a /usr/lib/x86_64-linux-gnu/libcmocka.so* "$root/.device/lib/"
echo "prepared $root/.device"
