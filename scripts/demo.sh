#!/usr/bin/env bash
# The main job: install what is needed, build, and run the demo (on the GPU if there is one, else on the
# simulated device). A step that fails is named, with the last lines of its log.
set -u -o pipefail
cd "$(dirname "$0")/.."
fail() { # fail STEP LOG
  echo "scripts/demo.sh: $1 failed; the last lines of $2:" >&2
  tail -30 "$2" >&2
  exit 1
}
scripts/install-deps.sh || { echo "scripts/demo.sh: installing the dependencies failed" >&2; exit 1; }
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
mkdir -p build-logs
if [ ! -f build/build.ninja ]; then
  meson setup build >build-logs/setup.log 2>&1 || fail "meson setup build" build-logs/setup.log
  # the optional parts that were skipped, one line each
  grep -E '^Message: .*not (built|used)' build-logs/setup.log | sed 's/^Message: /scripts\/demo.sh: /'
fi
ninja -C build >build-logs/build.log 2>&1 || fail "ninja -C build" build-logs/build.log
exec build/tools/cachalot_demo "$@"
