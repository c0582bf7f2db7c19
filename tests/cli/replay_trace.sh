#!/usr/bin/env bash
# Replays a real PyTorch trace (traces/*.snapshot.json.gz) on the simulated device and checks that it
# completes with no OOM and reports its reserved/requested peak ratio, which must stay at most
# MAX_RATIO, with the CACHALOT_ALLOC_CONF string CONF (default: none), over PASSES passes in a row on
# one allocator (default 1: the ratio of all of them is checked). With PLAN, the summary's step plan line
# must show a plan formed, no malloc it expected missed, at least one clean lap and no device call while
# a plan was in force. Skips (77) where the trace is absent.
#   replay_trace.sh TOOL TRACE MAX_RATIO [CONF [PASSES [PLAN]]]
set -u -o pipefail
tool=$1 trace=$2 max=$3 conf=${4:-} passes=${5:-1} plan=${6:-}
if [ ! -f "$trace" ]; then
  echo "SKIP: $trace not found"
  exit 77
fi
out=$("$tool" replay "$trace" --backend sim --conf "$conf" --passes "$passes" 2>&1)
status=$?
echo "$out"
if [ $status != 0 ]; then
  echo "FAIL: alloc_snapshot replay exited with $status"
  exit 1
fi
ooms=$(echo "$out" | sed -n 's/^OOMs: *\([0-9]*\).*/\1/p')
ratio=$(echo "$out" | sed -n 's/^ *reserved\/requested peak ratio\(, [0-9]* passes\)\{0,1\}: *\([0-9.]*\)$/\2/p' | head -1)
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
if [ -n "$plan" ]; then
  line=$(echo "$out" | grep '^ *step plan:')
  formed=$(echo "$line" | sed -n 's/.* \([0-9]*\) plans formed.*/\1/p')
  missed=$(echo "$line" | sed -n 's/.* \([0-9]*\) missed.*/\1/p')
  clean=$(echo "$line" | sed -n 's/.* \([0-9]*\) clean laps.*/\1/p')
  calls=$(echo "$line" | sed -n 's/.* \([0-9]*\) device calls in force.*/\1/p')
  if [ -z "$formed" ] || [ "$formed" -lt 1 ] || [ "$missed" != 0 ] || [ "$clean" -lt 1 ] || [ "$calls" != 0 ]; then
    echo "FAIL: the step plan: formed '$formed', missed '$missed', clean laps '$clean', device calls in force '$calls'"
    exit 1
  fi
fi
echo "ok: 0 OOMs, reserved/requested peak ratio $ratio (at most $max)"
