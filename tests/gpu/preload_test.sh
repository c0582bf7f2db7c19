#!/usr/bin/env bash
# The LD_PRELOAD interposer on a real GPU: preload_app.cu built with the shared CUDA runtime must print
# the same under libcachalot_preload.so as without it, with far fewer device allocations, and with every
# default-flag cudaMallocHost / cudaHostAlloc served by the host cache (far fewer pinnings), also when it
# pins with cudaHostRegister; built with the static runtime (nvcc's default) the interposer cannot reach
# it, and cachalot reports nothing allocated.
# Usage: tests/gpu/preload_test.sh BUILD_DIR OUT_DIR
set -u -o pipefail
build=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
src=$(cd "$(dirname "$0")" && pwd)
lib=$build/libcachalot_preload.so
nvcc -O2 -cudart shared -o "$out/app_shared" "$src/preload_app.cu" || exit 1
nvcc -O2 -o "$out/app_static" "$src/preload_app.cu" || exit 1
fail=0
native=$("$out/app_shared") || { echo "FAIL: the app fails natively"; exit 1; }
under=$(CACHALOT_PRELOAD_STATS=1 LD_PRELOAD=$lib "$out/app_shared" 2>"$out/preload.err") ||
  { echo "FAIL: the app fails under the interposer"; cat "$out/preload.err"; exit 1; }
echo "native:            $native"
echo "under cachalot:    $under"
echo "cachalot says:     $(cat "$out/preload.err")"
[ "$native" = "$under" ] && echo "PASS identical output" || { echo "FAIL output differs"; fail=1; }
calls=$(echo "$native" | sed -n 's/.* after \([0-9]*\) allocation calls.*/\1/p')
echo "$under" | grep -q "back to where it started" && echo "PASS cudaMemGetInfo counts cachalot's cached memory as free" ||
  { echo "FAIL cudaMemGetInfo under the interposer"; fail=1; }
devallocs=$(sed -n 's/.*: \([0-9]*\) device allocations.*/\1/p' "$out/preload.err")
if [ -n "$devallocs" ] && [ -n "$calls" ] && [ "$devallocs" -gt 0 ] && [ $((devallocs * 10)) -le "$calls" ]; then
  echo "PASS $devallocs device allocations for $calls allocation calls"
else
  echo "FAIL device allocations: '$devallocs' for '$calls' calls"
  fail=1
fi
# Pinned memory: the app's default-flag calls, each served by the host cache (its stats, printed at exit),
# with few pinnings; the data copied asynchronously from a block freed and pinned again at once intact.
pinned_calls=$(echo "$native" | sed -n 's/.*pinned: \([0-9]*\) default-flag calls.*/\1/p')
# check_host STDERR_FILE LABEL: the stats line in STDERR_FILE shows every such call served
check_host() {
  local served pinnings
  served=$(sed -n 's/.*host: \([0-9]*\) pinned requests served.*/\1/p' "$1")
  pinnings=$(sed -n 's/.* served, \([0-9]*\) pinnings.*/\1/p' "$1")
  if [ -n "$served" ] && [ -n "$pinned_calls" ] && [ "$served" = "$pinned_calls" ] && [ -n "$pinnings" ] &&
    [ "$pinnings" -gt 0 ] && [ $((pinnings * 4)) -le "$served" ]; then
    echo "PASS $2: the host cache served all $served default-flag pinned calls with $pinnings pinnings"
  else
    echo "FAIL $2: host cache served '$served' of '$pinned_calls' default-flag pinned calls, '$pinnings' pinnings"
    fail=1
  fi
}
check_host "$out/preload.err" "cudaHostAlloc"
echo "$under" | grep -q "pinned: [0-9]* default-flag calls, 0 mismatches" &&
  echo "PASS pinned memory freed right after an asynchronous copy and pinned again: the copy read the first contents" ||
  { echo "FAIL pinned memory reused before the copy from it ran"; fail=1; }
echo "$under" | grep -q "second cudaFreeHost refused" && echo "PASS a second cudaFreeHost is refused" ||
  { echo "FAIL second cudaFreeHost"; fail=1; }
reg_out=$(CACHALOT_PRELOAD_STATS=1 CACHALOT_ALLOC_CONF=pinned_use_cuda_host_register:True LD_PRELOAD=$lib \
  "$out/app_shared" 2>"$out/register.err")
if [ "$reg_out" = "$native" ]; then
  echo "PASS identical output with pinned_use_cuda_host_register:True"
  check_host "$out/register.err" "cudaHostRegister"
else
  echo "FAIL output differs with pinned_use_cuda_host_register:True: $reg_out $(cat "$out/register.err")"
  fail=1
fi
# CACHALOT_ALLOC_CONF and the snapshot variables work under the interposer; a bad config is reported
# and the program keeps the runtime's allocator.
conf_out=$(CACHALOT_ALLOC_CONF=max_split_size_mb:40 CACHALOT_SNAPSHOT_AT_EXIT=$out/snap.json LD_PRELOAD=$lib \
  "$out/app_shared" 2>"$out/conf.err")
if [ "$conf_out" = "$native" ] && grep -q '"max_split_size":41943040' "$out/snap.json" 2>/dev/null &&
  grep -q '"segments"' "$out/snap.json"; then
  echo "PASS CACHALOT_ALLOC_CONF (max_split_size 40 MiB) and CACHALOT_SNAPSHOT_AT_EXIT under the interposer"
else
  echo "FAIL config / snapshot variables under the interposer: $(head -c 300 "$out/snap.json" 2>&1) $(cat "$out/conf.err")"
  fail=1
fi
bad_out=$(CACHALOT_ALLOC_CONF=bogus_key:1 LD_PRELOAD=$lib "$out/app_shared" 2>"$out/bad.err")
if [ "$bad_out" = "$native" ] && grep -q "bogus_key" "$out/bad.err"; then
  echo "PASS a bad CACHALOT_ALLOC_CONF is reported ($(head -c 160 "$out/bad.err")...) and the program runs on"
else
  echo "FAIL bad config under the interposer: $(cat "$out/bad.err")"
  fail=1
fi
static_out=$(CACHALOT_PRELOAD_STATS=1 LD_PRELOAD=$lib "$out/app_static" 2>"$out/static.err")
echo "static runtime:    $static_out; cachalot says: $(cat "$out/static.err")"
if [ "$static_out" = "$native" ] && ! grep -q "[1-9][0-9]* device allocations" "$out/static.err" &&
  ! grep -q "[1-9][0-9]* pinned requests served" "$out/static.err"; then
  echo "PASS static runtime: not interposed (as the README says), output unchanged"
else
  echo "FAIL static runtime"
  fail=1
fi
# A multi-threaded program that forks: the children's CUDA calls answer (an error), never hang, natively
# and under the interposer (whose own locks a thread of the parent may hold at the fork).
if nvcc -O2 -std=c++17 -cudart shared -o "$out/fork_app" "$src/preload_fork.cu"; then
  fork_native=$("$out/fork_app")
  fork_native_rc=$?
  fork_under=$(LD_PRELOAD=$lib "$out/fork_app" 2>"$out/fork.err")
  fork_under_rc=$?
  echo "fork natively:     $fork_native"
  echo "fork interposed:   $fork_under"
  if [ "$fork_under_rc" -eq 0 ]; then
    echo "PASS fork under load: no child hangs or dies under the interposer"
  else
    echo "FAIL fork under load under the interposer: $(head -c 300 "$out/fork.err")"
    fail=1
  fi
else
  echo "FAIL fork app: does not build"
  fail=1
fi
exit $fail
