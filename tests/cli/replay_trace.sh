#!/usr/bin/env bash
# Replays a real PyTorch trace (traces/*.snapshot.json.gz) on the simulated device and checks that it
# completes with no OOM and reports its reserved/requested peak ratio, which must stay at most
# MAX_RATIO, with the CACHALOT_ALLOC_CONF string CONF (default: none). Skips (77) where the trace is
# absent.
#   replay_trace.sh TOOL TRACE MAX_RATIO [CONF]
set -u -o pipefail
tool=$1 trace=$2 max=$3 conf=${4:-}
if [ ! -f "$trace" ]; then
  echo "SKIP: $trace not found"
  exit 77
fi
out=$("$tool" replay "$trace" --backend sim --conf "$conf" 2>&1)
status=$?
echo "$out"
if [ $status != 0 ]; then
  echo "FAIL: alloc_snapshot replay exited with $status"
  exit 1
fi
ooms=$(echo "$out" | sed -n 's/^OOMs: *\([0-9]*\).*/\1/p')
ratio=$(echo "$out" | sed -n 's/^ *reserved\/requested peak ratio: *\([0-9.]*\)$/\1/p' | head -1)
if [ "$ooms" != 0 ]; then
  echo "FAIL: $ooms OOMs (expected 0)"
  exit 1
fi
if [ -z "$ratio" ]; then
  echo "FAIL: no reserved/requested peak ratio in the summary"
  exit 1
fi
if ! awk -v r="$ratio" -v m="$max" 'BEGIN { exit !(r > 0 && r <= m) }'; then
  echo "FAIL: reserved/requested peak ratio $ratio is above $max"
  exit 1
fi
echo "ok: 0 OOMs, reserved/requested peak ratio $ratio (at most $max)"
