#!/usr/bin/env bash
# The debugging quick start on cachalot_demo, without a GPU (docs/tools.md):
#   CACHALOT_RECORD_HISTORY=100000,stacks CACHALOT_SNAPSHOT_AT_EXIT=demo.json cachalot_demo
# must write the snapshot, the library say where in one line on stderr, and the snapshot hold the demo's
# three allocations, each with the frames of the function that made it (with libdw: its name,
# cachalot_demo.c and the line of its cachalot_malloc call). Its stats are in MiB. alloc_snapshot folded
# reads the file back.
#   demo_snapshot.sh CACHALOT_DEMO ALLOC_SNAPSHOT SOURCE_OF_THE_DEMO libdw|dladdr
# (libdw: the library has libdw's loader; the frames are then libdw's where libdw.so.1 opens here, and
# dladdr's where libdw1 is not installed, as on the GPU machine)
set -u -o pipefail
demo=$(realpath "$1") snap=$(realpath "$2") source=$(realpath "$3") symbolizer=$4
. "$(dirname "$0")/checks.sh"
if [ "$symbolizer" = libdw ] && command -v python3 >/dev/null &&
  ! python3 -c 'import ctypes; ctypes.CDLL("libdw.so.1")' 2>/dev/null; then
  echo "libdw.so.1 does not open here: the frames must be dladdr's"
  symbolizer=dladdr
fi
unset CACHALOT_RECORD_HISTORY CACHALOT_SNAPSHOT_AT_EXIT CACHALOT_SNAPSHOT_ON_OOM CACHALOT_SNAPSHOT_SOCKET

# Without the variables: no snapshot, no allocation held, and the byte stats in MiB.
"$demo" --sim >plain.out 2>plain.err || fail plain "exited $?: $(cat plain.err)"
grep -q '^cachalot_demo: OK$' plain.out && ok || fail plain "no OK line"
grep -Eq 'snapshot|holding' plain.out && fail plain "speaks of a snapshot: $(grep -E 'snapshot|holding' plain.out)"
[ "$(grep -Ec '^  (allocated|reserved|requested|inactive_split)_bytes +[0-9]+\.[0-9]{2} MiB +[0-9]+\.[0-9]{2} MiB$' plain.out)" = 12 ] &&
  ok || fail plain_units "not 12 byte rows in MiB: $(grep _bytes plain.out | head -4)"
grep -Eq '[0-9] (M|MB|G|GB)( |$)' plain.out && fail plain_units "a size not in KiB/MiB/GiB: $(grep -E '[0-9] (M|MB|G|GB)( |$)' plain.out)"
ls ./*.json >/dev/null 2>&1 && fail plain "a file was written: $(ls)"

# The quick start.
CACHALOT_RECORD_HISTORY=100000,stacks CACHALOT_SNAPSHOT_AT_EXIT=demo.json "$demo" --sim >demo.out 2>demo.err
status=$?
[ "$status" = 0 ] && ok || fail quick_start "exited $status: $(cat demo.err)"
[ "$(cat demo.err)" = "cachalot: CACHALOT_SNAPSHOT_AT_EXIT: snapshot written to demo.json" ] && ok ||
  fail quick_start_line "stderr: $(cat demo.err)"
grep -q '^cachalot_demo: holding for the snapshot at exit: load_weights 64.00 MiB, grow_kv_cache 24.00 MiB, make_scratch 0.50 MiB$' \
  demo.out && ok || fail quick_start_holding "$(grep holding demo.out)"
[ -s demo.json ] && ok || fail quick_start "demo.json was not written"

if command -v python3 >/dev/null; then
  python3 - "$source" "$symbolizer" <<'EOF' && ok || fail quick_start_json "the snapshot's content (above)"
import json, sys
source, symbolizer = sys.argv[1], sys.argv[2]
lines = open(source).read().split("\n")
d = json.load(open("demo.json"))
problems = []
def want(cond, what):
    if not cond:
        problems.append(what)
want(len(d["segments"]) > 0, "no segments")
want(len(d["device_traces"]) == 1 and len(d["device_traces"][0]) > 0, "no trace of device 0")
allocs = [e for e in d["device_traces"][0] if e["action"] == "alloc"]
want(len(allocs) == 19, "%d alloc entries, expected 2 rounds of 8 and 3 held" % len(allocs))
want(all(e["frames"] for e in allocs), "an alloc entry without frames")
held = sorted((b for s in d["segments"] for b in s["blocks"] if b["state"] == "active_allocated"),
              key=lambda b: -b["requested_size"])
want([b["requested_size"] for b in held] == [64 << 20, 24 << 20, 512 << 10],
     "held blocks: %s" % [b["requested_size"] for b in held])
for b, fn in zip(held, ["load_weights", "grow_kv_cache", "make_scratch"]):
    frames = b["frames"]
    want(len(frames) >= 3, "%s: frames %s" % (fn, frames))
    if symbolizer != "libdw" or len(frames) < 3:
        continue
    inner, caller = frames[0], frames[1]
    want(inner["name"] == fn and caller["name"] == "hold_for_snapshot" and frames[2]["name"] == "main",
         "%s: frames named %s" % (fn, [f["name"] for f in frames[:3]]))
    for f in frames[:3]:
        want(f["filename"].endswith("cachalot_demo.c") and f["line"] > 0, "%s: frame %s" % (fn, f))
    line = inner["line"]
    want(0 < line <= len(lines) and "cachalot_malloc" in lines[line - 1],
         "%s: line %d of cachalot_demo.c is not its cachalot_malloc call" % (fn, line))
if symbolizer == "libdw":
    want(any(f["name"] == "main" and f["filename"].endswith("cachalot_demo.c") for f in allocs[0]["frames"]),
         "the first round's alloc entries do not name main in cachalot_demo.c")
for p in problems:
    print("  " + p)
sys.exit(1 if problems else 0)
EOF
else
  echo "skip quick_start_json: no python3"
fi

# alloc_snapshot folded: the trace's peak is the held allocations (88.50 MiB, above the rounds' 83.10),
# one stack each.
"$snap" folded demo.json --device 0 >demo.folded 2>folded.err || fail folded "exited $?: $(cat folded.err)"
[ "$(wc -l <demo.folded)" = 3 ] && ok || fail folded "$(wc -l <demo.folded) stacks: $(cat demo.folded)"
[ "$(awk '{ n += $NF } END { print n }' demo.folded)" = $(((64 << 20) + (24 << 20) + (512 << 10))) ] && ok ||
  fail folded "the stacks do not add up to the held bytes: $(cat demo.folded)"
grep -q '^peak: 88.50 MiB (92798976 B) live in 3 allocations, 3 stacks; after entry' folded.err && ok ||
  fail folded "$(cat folded.err)"
if [ "$symbolizer" = libdw ]; then
  for fn in "load_weights 67108864" "grow_kv_cache 25165824" "make_scratch 524288"; do
    grep -Eq "^[^ ].*;main \([^)]*cachalot_demo.c:[0-9]+\);hold_for_snapshot \([^)]*cachalot_demo.c:[0-9]+\);${fn% *} \([^)]*cachalot_demo.c:[1-9][0-9]*\) ${fn#* }\$" \
      demo.folded && ok || fail folded "no stack main;hold_for_snapshot;$fn: $(cat demo.folded)"
  done
fi

# %p in the path: the line names the file the library wrote.
CACHALOT_SNAPSHOT_AT_EXIT='demo-%p.json' "$demo" --sim >pid.out 2>pid.err || fail pid_path "exited $?"
written=$(sed -n 's/^cachalot: CACHALOT_SNAPSHOT_AT_EXIT: snapshot written to \(demo-[0-9]*\.json\)$/\1/p' pid.err)
[ -n "$written" ] && [ -s "$written" ] && ok || fail pid_path "$(cat pid.err); files: $(ls)"

# A path the library cannot write: its warning, no note; the demo itself succeeded.
CACHALOT_SNAPSHOT_AT_EXIT=no_such_dir/demo.json "$demo" --sim >nodir.out 2>nodir.err || fail no_dir "exited $?"
grep -q '^cachalot: warning: could not write the snapshot to no_such_dir/demo.json: No such file or directory$' \
  nodir.err && ok || fail no_dir "stderr: $(cat nodir.err)"
grep -q 'snapshot written' nodir.err && fail no_dir "a note of a file not written: $(cat nodir.err)"

finish "demo snapshot"
