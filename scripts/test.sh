#!/usr/bin/env bash
# Installs what is needed and runs every test tier that runs without a GPU:
#   1. gcc build (CUDA backend when the toolkit is there): unit, stress and gpu suites (gpu skips, 77)
#   2. the unit suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   3. the stress test and the lanes unit test (threads on their own streams) under ThreadSanitizer
#   4. clang build, and a build with -Dcuda=disabled (simulated backend only), with their tests
#   5. the Python package, pip-installed into a virtual environment, and its tests without torch
#   6. the libFuzzer targets of tests/fuzz (clang, AddressSanitizer + UndefinedBehaviorSanitizer), a fixed
#      number of executions each from their seed corpora
#   7. the README's quick starts, read out of README.md and run as written (tests/quickstart)
# Each build uses -Wall -Wextra -Werror. A step that fails is named with the last lines of its log, and
# the failed steps are listed again at the end. Prints 'N passed, N failed' last.
set -u -o pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh || { echo "scripts/test.sh: installing the dependencies failed"; exit 1; }
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
passed=0
failed=0
skipped=0
failed_steps=""
step() { # step NAME COMMAND... (a command that exits 77 was skipped)
  local name=$1 rc
  shift
  echo "=== $name"
  "$@"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "--- $name: ok"
  elif [ "$rc" -eq 77 ]; then
    skipped=$((skipped + 1))
    echo "--- $name: skipped"
  else
    failed=$((failed + 1))
    failed_steps="$failed_steps  $name"$'\n'
    echo "--- $name: FAILED"
  fi
}
build() { # build DIR [meson options...]
  local dir=$1
  shift
  rm -rf "$dir" && meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 && ninja -C "$dir" >"$dir.build.log" 2>&1 ||
    { tail -40 "$dir.setup.log" "$dir.build.log" 2>/dev/null; return 1; }
  rm -f "$dir.setup.log" "$dir.build.log"
}
suite() { # suite DIR meson-test-args...
  local dir=$1
  shift
  meson test -C "$dir" --print-errorlogs "$@"
}
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:halt_on_error=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

t_gcc() { build build-test -Dtests=enabled && suite build-test; }
t_asan() { build build-asan -Dtests=enabled -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false && suite build-asan --suite unit --suite cli; }
t_tsan() { CC=clang build build-tsan -Dtests=enabled -Db_sanitize=thread -Db_lundef=false -Dcuda=disabled &&
  suite build-tsan --suite stress && suite build-tsan lanes; }
t_clang() { CC=clang build build-clang -Dtests=enabled && suite build-clang --no-suite gpu --no-suite explorer; }
t_nocuda() { build build-nocuda -Dtests=enabled -Dcuda=disabled -Dlibdw=disabled && suite build-nocuda --no-suite explorer &&
  build-nocuda/tools/cachalot_demo >/dev/null; }
# The Python package as a user installs it (pip, meson-python, no network) into a fresh virtual environment,
# then its tests that need no torch and no GPU (import, version, the route install() takes).
t_python() {
  rm -rf build-python && /usr/bin/python3 -m venv --system-site-packages build-python/venv &&
    build-python/venv/bin/pip install -q --no-build-isolation --no-index . >build-python.log 2>&1 ||
    { tail -40 build-python.log; return 1; }
  rm -f build-python.log
  build-python/venv/bin/python tests/python/test_package.py
}
t_fuzz() { CC=clang build build-fuzz -Dtests=enabled -Dfuzz=enabled -Dcuda=disabled -Db_sanitize=address,undefined \
  -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link && suite build-fuzz --suite fuzz; }
# Skipped (77) where it cannot make its mount namespace (not root).
t_quickstart() { bash tests/quickstart/readme_test.sh . build-quickstart; }

step "gcc: unit, stress, gpu (skipped without a GPU)" t_gcc
step "asan+ubsan: unit and cli suites" t_asan
step "tsan: stress test, lanes test" t_tsan
step "clang: unit, stress" t_clang
step "cuda disabled: unit, stress, demo" t_nocuda
step "python package: pip install, import, version, route selection" t_python
step "fuzzers: config, environment, snapshot reader, socket, API sequences" t_fuzz
step "README quick starts, as written" t_quickstart
echo
[ -n "$failed_steps" ] && printf 'failed steps:\n%s' "$failed_steps"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
