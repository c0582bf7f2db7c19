#!/usr/bin/env bash
# Installs the build into a scratch root and builds clients of it two ways:
#   1. with `pkg-config --cflags --libs cachalot` against the installed cachalot.pc, headers and library;
#   2. as a Meson project that takes this source tree as a subproject (dependency('cachalot')).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR SCRATCH_DIR [DEPS_DIR]   (exits 77, skipped, without pkg-config)
set -eu -o pipefail
command -v pkg-config >/dev/null || { echo "pkg-config not found: skipped"; exit 77; }
deps_dir=${4:-}
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd)
dest=$scratch/root

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$scratch/install.log" 2>&1 ||
  { cat "$scratch/install.log"; exit 1; }
pc=$(find "$dest" -name cachalot.pc | head -1)
[ -n "$pc" ] || { echo "no cachalot.pc installed"; exit 1; }
for h in cachalot status backend allocator stats pool graph snapshot; do
  find "$dest" -path "*/include/cachalot/$h.h" | grep -q . || { echo "header cachalot/$h.h not installed"; exit 1; }
done
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dest
flags=$(pkg-config --cflags --libs cachalot)
echo "pkg-config --cflags --libs cachalot: $flags"
cc -std=c11 -Wall -Wextra -Werror "$src/tests/install/client.c" $flags -o "$scratch/client"
libdir=$(dirname "$(find "$dest" -name 'libcachalot.so' | head -1)")
LD_LIBRARY_PATH=$libdir "$scratch/client"

# As a subproject: a project of its own whose subprojects/cachalot is this tree.
proj=$scratch/subproject-client
mkdir -p "$proj/subprojects"
ln -s "$src" "$proj/subprojects/cachalot"
cp "$src/tests/install/client.c" "$proj/"
cat >"$proj/meson.build" <<'MESON'
project('cachalot-client', 'c', default_options: ['c_std=c11', 'warning_level=2', 'werror=true'])
subproject('cachalot', default_options: ['tests=disabled', 'deps_dir=@DEPS_DIR@'])
executable('client', 'client.c', dependencies: dependency('cachalot'))
MESON
sed -i "s|@DEPS_DIR@|$deps_dir|" "$proj/meson.build"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
meson setup "$proj/build" "$proj" >"$scratch/sub-setup.log" 2>&1 || { tail -30 "$scratch/sub-setup.log"; exit 1; }
ninja -C "$proj/build" client >"$scratch/sub-build.log" 2>&1 || { tail -30 "$scratch/sub-build.log"; exit 1; }
"$proj/build/client"
echo "install_test: ok"
