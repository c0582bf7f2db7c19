#!/usr/bin/env bash
# Instructions per alloc+free pair on the simulated device, the stable CPU proxy of docs/benchmarks.md:
# builds alloc_bench (release, -O3, no CUDA) in BUILD_DIR (default build-callgrind) and prints, for each
# pair row (256 B, 4 KiB, 512 KiB, 2 MiB, 32 MiB), callgrind's Ir of its timed pass over 4,000 pairs and
# that divided by 4,000. Compare two trees by running it on each.  Needs valgrind.
set -eu -o pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-$src/build-callgrind}")
[ -d "$build" ] || meson setup "$build" "$src" -Dbuildtype=release -Doptimization=3 -Dtests=disabled \
  -Dcuda=disabled >/dev/null
ninja -C "$build" tools/alloc_bench >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && valgrind --tool=callgrind --toggle-collect=cl_run --dump-after=cl_run \
  --callgrind-out-file=cg.%p "$build/tools/alloc_bench" -a cachalot-sim -w pair -r 1 -n 4000 >/dev/null 2>&1)
# one dump per cl_run: the first is empty, then each row's warm-up pass and its timed pass
mapfile -t ir < <(for f in $(ls "$work"/cg.* | sort -V); do awk '/^(summary|totals):/ {print $2; exit}' "$f"; done)
rows=(256B 4KiB 512KiB 2MiB 32MiB)
for i in "${!rows[@]}"; do
  timed=${ir[$((2 + 2 * i))]}
  printf '%-7s %9s Ir  %s per pair\n' "${rows[$i]}" "$timed" "$(awk -v n="$timed" 'BEGIN {printf "%.1f", n / 4000}')"
done
