#!/usr/bin/env bash
# Runs a libFuzzer target for RUNS executions (fixed seed) from the inputs in CORPUS, growing a scratch
# copy so that the checkout is never written to. A crash, leak or failed check exits non-zero; its input
# is kept in the scratch directory's crash file, printed by libFuzzer.
# Memory: 2 GiB in all and 256 MiB in one allocation, what the readers' bounds allow an input of the fuzzers'
# sizes (docs/tools.md) with the sanitizers' overhead; more is a finding (oom-*).
#   run.sh FUZZER CORPUS RUNS
set -u -o pipefail
fuzzer=$(realpath "$1") corpus=$(realpath "$2") runs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
"$fuzzer" -runs="$runs" -seed=1 -error_exitcode=1 -entropic=0 -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=256 -print_final_stats=1 \
  -artifact_prefix="$work/" "$work" "$corpus" 2>&1 | tail -25
status=${PIPESTATUS[0]}
for f in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
  [ -e "$f" ] && { echo "finding: $f"; od -A x -t x1z "$f" | head -20; }
done
exit "$status"
