#!/usr/bin/env bash
# What preset:low_fragmentation costs on the GPU (issue 20): alloc_bench's replay rows of every trace
# with the defaults and with the preset, interleaved trace by trace in one run, then each trace replayed
# once more through CUDA with the preset, history on, to count the device map / unmap calls of a replay
# (each segment_map / segment_unmap entry is one growth or one unmap, of whole 2 MiB pages).
#   tests/gpu/preset_bench.sh BUILD_DIR OUT_DIR TRACE...
set -u -o pipefail
build=$1 out=$2
shift 2
mkdir -p "$out"
preset=preset:low_fragmentation
rc=0
for t in "$@"; do
  n=$(basename "$t" .snapshot.json.gz)
  for conf in "" "$preset"; do
    tag=${conf:+preset}
    "$build/tools/alloc_bench" --workload replay --allocators cachalot --trace "$t" --repeat 5 \
      ${conf:+--conf "$conf"} --csv "$out/replay-$n-${tag:-defaults}.csv" >"$out/replay-$n-${tag:-defaults}.txt" 2>&1 || rc=1
  done
  "$build/tools/alloc_snapshot" replay "$t" --backend cuda --conf "$preset" \
    -o "$out/maps-$n.json" >"$out/maps-$n.txt" 2>&1 || rc=1
done
python3 - "$out" "$@" <<'PY' || rc=1
import csv, json, os, sys
out = sys.argv[1]
print("%-14s %12s %12s %7s %9s %9s %8s %8s" % ("trace", "ns/call def", "ns/call pre", "x", "ratio def", "ratio pre",
                                               "maps", "unmaps"))
for t in sys.argv[2:]:
    n = os.path.basename(t).replace(".snapshot.json.gz", "")
    rows = {}
    for tag in ("defaults", "preset"):
        with open(os.path.join(out, "replay-%s-%s.csv" % (n, tag))) as f:
            rows[tag] = next(r for r in csv.DictReader(f) if r["allocator"] == "cachalot")
    maps = unmaps = mb = ub = 0
    p = os.path.join(out, "maps-%s.json" % n)
    if os.path.exists(p):
        snap = json.load(open(p))
        for tr in snap["device_traces"]:
            for e in tr:
                if e["action"] == "segment_map":
                    maps, mb = maps + 1, mb + e["size"]
                elif e["action"] == "segment_unmap":
                    unmaps, ub = unmaps + 1, ub + e["size"]
        os.remove(p)
    d, q = float(rows["defaults"]["median_ns"]), float(rows["preset"]["median_ns"])
    ratio = {k: int(r["peak_reserved_bytes"]) / int(r["peak_requested_bytes"]) for k, r in rows.items()}
    print("%-14s %12.1f %12.1f %7.2f %9.3f %9.3f %8d %8d  (pages of 2 MiB: %d mapped, %d unmapped)" % (
        n, d, q, q / d, ratio["defaults"], ratio["preset"], maps, unmaps, mb >> 21, ub >> 21))
PY
exit $rc
