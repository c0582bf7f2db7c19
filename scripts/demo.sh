#!/usr/bin/env bash
# The main job: install what is needed, build, and run the demo (on the GPU if there is one, else on the
# simulated device).
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
exec build/tools/cachalot_demo "$@"
