#!/usr/bin/env bash
# alloc_bench of two versions side by side in one run on the GPU machine: OLD_SRC (a source tree of the
# earlier version, e.g. `git archive REV | tar -x -C build-oldsrc`, carried along) against this tree.
# Each version is built the same way (release, CUDA backend); then the rows run alternately, old, new,
# old, new, pinned to one CPU, so that drift of the host shows in both. Results (CSV, JSON, logs) go to
# OUTDIR. Usage: [ROUNDS=N] tests/gpu/bench-old-new.sh OLD_SRC OUTDIR [alloc_bench options...] (2 rounds default)
set -u -o pipefail
old_src=$(cd "$1" && pwd)
out=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH="$root/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
build() { # build NAME SRC
  rm -rf "$root/build-bench-$1"
  meson setup "$root/build-bench-$1" "$2" -Dbuildtype=release -Dcuda=enabled -Dtests=disabled \
    -Ddeps_dir=.device >"$out/setup-$1.log" 2>&1 &&
    ninja -C "$root/build-bench-$1" tools/alloc_bench >"$out/build-$1.log" 2>&1 ||
    { tail -20 "$out/setup-$1.log" "$out/build-$1.log"; return 1; }
}
# deps_dir is a folder inside the source tree: the old tree gets its own copy
[ -d "$old_src/.device" ] || cp -r "$root/.device" "$old_src/.device"
build old "$old_src" || exit 1
build new "$root" || exit 1
traces=()
for t in "$root"/.device/traces/*.json.gz "$root"/traces/*.json.gz; do
  [ -f "$t" ] && traces+=(--trace "$t")
done
rc=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in old new; do
    echo "=== round $round: $v"
    "$root/build-bench-$v/tools/alloc_bench" -a cachalot,cachalot-sim "${traces[@]}" --pin 2 \
      --csv "$out/$v-$round.csv" --json "$out/$v-$round.json" "$@" 2>&1 | tee "$out/$v-$round.log" || rc=1
  done
done
exit $rc
