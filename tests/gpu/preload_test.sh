#!/usr/bin/env bash
# The LD_PRELOAD interposer on a real GPU: preload_app.cu built with the shared CUDA runtime must print
# the same under libcachalot_preload.so as without it, with far fewer device allocations; built with the
# static runtime (nvcc's default) the interposer cannot reach it, and cachalot reports nothing allocated.
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
if [ "$static_out" = "$native" ] && ! grep -q "[1-9][0-9]* device allocations" "$out/static.err"; then
  echo "PASS static runtime: not interposed (as the README says), output unchanged"
else
  echo "FAIL static runtime"
  fail=1
fi
exit $fail
