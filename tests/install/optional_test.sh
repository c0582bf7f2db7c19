#!/usr/bin/env bash
# Optional components never fail the build: with a torch that cannot be built against on the path, the
# build skips the PyTorch backend with one line that says why, and builds everything else.
#   1. a stand-in torch 2.11.0 whose include folders are dangling links (what Debian's python3-torch
#      ships): `meson setup` succeeds, says "PyTorch backend not built: ... is a dangling link", and
#      ninja builds; the same for the Python package's configuration (-Dpython_package=true), which is
#      what `pip install .` runs;
#   2. a stand-in torch 1.13.1 (Debian 12's) that warns on import: the line says it is older than the
#      oldest supported (the probe's last line, not the warning);
#   3. a stand-in whose import ends the interpreter with no word: the line says the probe said nothing.
# Usage: optional_test.sh SOURCE_DIR SCRATCH_DIR [DEPS_DIR]
set -eu -o pipefail
src=$(cd "$1" && pwd)
scratch=$2
deps_dir=${3:-}
rm -rf "$scratch"
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd)

# stand_in DIR VERSION [PRELUDE]: a torch package with what scripts/torch-build-info.py asks of torch,
# whose include folder is a link to a folder that does not exist; PRELUDE is Python run first on import.
stand_in() {
  local dir=$1 version=$2 prelude=${3:-}
  mkdir -p "$dir/torch/utils" "$dir/torch/lib"
  ln -s /nonexistent/torch-include "$dir/torch/include"
  cat >"$dir/torch/__init__.py" <<PY
$prelude
__version__ = "$version"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
PY
  cat >"$dir/torch/utils/__init__.py" <<'PY'
PY
  cat >"$dir/torch/utils/cpp_extension.py" <<'PY'
import os
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
def include_paths():
    return [os.path.join(_root, "include"), os.path.join(_root, "include", "torch", "csrc", "api", "include")]
def library_paths():
    return [os.path.join(_root, "lib")]
PY
}

# expect_skip NAME PYTHONPATH PATTERN [meson options...]: setup succeeds and prints PATTERN on the
# backend's line (the reason on that one line: a torch that warns first must not push it to the next)
expect_skip() {
  local name=$1 pypath=$2 pattern=$3
  shift 3
  local build=$scratch/build-$name
  if ! PYTHONPATH=$pypath meson setup "$build" "$src" -Dtests=disabled -Dexamples=disabled -Ddeps_dir="$deps_dir" "$@" \
      >"$scratch/$name.log" 2>&1; then
    tail -20 "$scratch/$name.log"
    echo "$name: meson setup failed with an unusable torch on the path"
    exit 1
  fi
  local line
  line=$(grep 'PyTorch backend not built' "$scratch/$name.log" || true)
  if ! printf '%s\n' "$line" | grep -q -- "$pattern"; then
    echo "$name: expected a line 'PyTorch backend not built: ...$pattern...', got: '$line'"
    exit 1
  fi
  echo "$name: $line"
}

stand_in "$scratch/dangling" 2.11.0
stand_in "$scratch/old" 1.13.1 'import sys; print("UserWarning: a warning of the stand-in", file=sys.stderr)'
stand_in "$scratch/crash" 2.11.0 'import os; os._exit(3)'
expect_skip dangling "$scratch/dangling" "include folder .* is a dangling link"
if ! ninja -C "$scratch/build-dangling" >"$scratch/dangling-build.log" 2>&1; then
  tail -20 "$scratch/dangling-build.log"
  echo "dangling: ninja failed"
  exit 1
fi
[ -f "$scratch/build-dangling/libcachalot.so" ] || { echo "dangling: no libcachalot.so built"; exit 1; }
[ ! -e "$scratch/build-dangling/libcachalot_torch_backend.so" ] || { echo "dangling: a backend was built"; exit 1; }
echo "dangling: built without the backend"
expect_skip package "$scratch/dangling" "is a dangling link" -Dpython_package=true
expect_skip old "$scratch/old" "torch 1.13.1 .* is older than 2.11"
expect_skip crash "$scratch/crash" "scripts/torch-build-info.py exited 3 saying nothing"
echo "optional_test: ok"
