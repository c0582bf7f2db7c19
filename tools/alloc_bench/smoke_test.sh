#!/usr/bin/env bash
# Smoke test of alloc_bench (meson suite 'cli'; no GPU needed, a few seconds): the command line, every
# workload on the simulated device with tiny sizes, the host workload's figures and its PyTorch row's
# protocol (through a stand-in for python3), the CSV / JSON / SVG outputs and `alloc_bench svg`, and
# where the replay workload finds its traces (the source tree's traces/, TRACES).
# Usage: smoke_test.sh ALLOC_BENCH WORKDIR TRACES
set -u -o pipefail
export LC_ALL=C # strerror texts and glob's order, the same everywhere
bench=$1
dir=$2
traces=$3
rm -rf "$dir"
mkdir -p "$dir"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# --help: exit 0, the usage on stdout
"$bench" --help >"$dir/help.txt" 2>&1 || fail "--help exited $?"
grep -q '^usage: alloc_bench' "$dir/help.txt" || fail "--help prints no usage line"

# usage errors: exit 2 with a message naming the problem
for args in "--no-such-flag" "--ops" "--ops 0" "--host-ops 0" "--workload nope" "--allocators nope" "--threads x" \
  "--pin x" "stray"; do
  # shellcheck disable=SC2086
  "$bench" $args >"$dir/bad.out" 2>"$dir/bad.err"
  rc=$?
  [ "$rc" = 2 ] || fail "'$args' exited $rc, expected 2"
  grep -q '^alloc_bench: ' "$dir/bad.err" || fail "'$args' printed no message on stderr"
done
# Lists that name nothing and a bad --conf are usage errors, before anything runs (issue 17 item 12:
# -w "" and -w ,, ran nothing and exited 0; --conf garbage failed every cachalot row with exit 1, where
# alloc_snapshot replay --conf garbage exits 2).
for list in "" ",,"; do
  "$bench" --workload "$list" >"$dir/bad.out" 2>"$dir/bad.err"
  rc=$?
  [ "$rc" = 2 ] || fail "--workload '$list' exited $rc, expected 2"
  grep -q '^alloc_bench: --workload names no workload' "$dir/bad.err" || fail "--workload '$list': $(cat "$dir/bad.err")"
  [ -s "$dir/bad.out" ] && fail "--workload '$list' ran: $(head -3 "$dir/bad.out")"
done
"$bench" --allocators cachalot-sim --workload pair --ops 20 --repeat 1 --conf garbage >"$dir/bad.out" 2>"$dir/bad.err"
rc=$?
[ "$rc" = 2 ] || fail "--conf garbage exited $rc, expected 2 (as alloc_snapshot replay --conf garbage)"
grep -q "^alloc_bench: --conf: CACHALOT_ALLOC_CONF: unknown key 'garbage'" "$dir/bad.err" ||
  fail "--conf garbage: $(head -c 300 "$dir/bad.err")"
[ -s "$dir/bad.out" ] && fail "--conf garbage ran: $(head -3 "$dir/bad.out")"
"$bench" --allocators cachalot-sim --workload pair --ops 20 --repeat 1 --conf max_split_size_mb:20 >/dev/null 2>&1 ||
  fail "--conf max_split_size_mb:20 exited $?"
# replay without a trace says that no trace was found, not that every allocator was skipped.
mkdir -p "$dir/no_traces"
"$bench" --allocators cachalot-sim --workload replay --trace-dir "$dir/no_traces" >"$dir/notrace.out" 2>&1 ||
  fail "replay without a trace exited $?"
grep -q "^(no row ran: no trace found in $dir/no_traces: give --trace FILE or --trace-dir DIR)" "$dir/notrace.out" ||
  fail "replay without a trace: $(cat "$dir/notrace.out")"
grep -q "allocator was skipped" "$dir/notrace.out" && fail "replay without a trace blames the allocators"
# The default trace folder is the source tree's traces/: a --trace NAME is looked for there, and one that
# is not there is an error (exit 1, nothing run) that names the folder and the traces it holds.
names=$(for f in "$traces"/*.json.gz "$traces"/*.json; do [ -f "$f" ] && basename "$f"; done |
  sed -e 's/\.gz$//' -e 's/\.json$//' -e 's/\.snapshot$//' | paste -sd, - | sed 's/,/, /g')
"$bench" --allocators cachalot-sim --workload replay --trace no_such_trace >"$dir/bad.out" 2>"$dir/bad.err"
rc=$?
[ "$rc" = 1 ] || fail "--trace no_such_trace exited $rc, expected 1"
[ "$(cat "$dir/bad.err")" = "alloc_bench: --trace no_such_trace: no such file, nor a trace of that name in $traces (the traces there: $names)" ] ||
  fail "--trace no_such_trace: $(cat "$dir/bad.err")"
[ -s "$dir/bad.out" ] && fail "--trace no_such_trace ran: $(head -3 "$dir/bad.out")"
for t in kv_generate llm_serving lm_train moe_train seg_multires var_inference; do
  case ", $names, " in *", $t, "*) ;; *) fail "traces/ lacks $t (it has: $names)" ;; esac
done
"$bench" --allocators cachalot-sim --workload replay --trace var_inference --repeat 1 --json "$dir/named.json" \
  >"$dir/named.txt" 2>&1 || fail "--trace var_inference exited $?: $(tail -3 "$dir/named.txt")"
grep -q "\"traces\": \[\"$traces/var_inference.snapshot.json.gz\"\]" "$dir/named.json" ||
  fail "--trace var_inference did not replay $traces/var_inference.snapshot.json.gz: $(head -c 400 "$dir/named.json")"
grep -Eq '"workload": "replay-var_inference", "allocator": "cachalot-sim", "status": "(ok|skipped)"' "$dir/named.json" ||
  fail "no replay-var_inference row"
"$bench" --allocators cachalot-sim --workload replay --trace "$dir/no_such.json" >"$dir/bad.out" 2>"$dir/bad.err"
rc=$?
[ "$rc" = 1 ] && [ "$(cat "$dir/bad.err")" = "alloc_bench: --trace $dir/no_such.json: No such file or directory" ] ||
  fail "--trace of a missing path: exit $rc: $(cat "$dir/bad.err")"
# An allocator named for workloads it has no rows in is a usage error, not a run of nothing.
for args in "-a cudaHostAlloc -w pair" "-a cudaMalloc -w host" "-a cudaMallocAsync -w host"; do
  # shellcheck disable=SC2086
  "$bench" $args >"$dir/bad.out" 2>"$dir/bad.err"
  rc=$?
  [ "$rc" = 2 ] || fail "'$args' exited $rc, expected 2"
  grep -q "^alloc_bench: .* has no rows in the selected workloads: " "$dir/bad.err" ||
    fail "'$args': $(cat "$dir/bad.err")"
  [ -s "$dir/bad.out" ] && fail "'$args' ran: $(head -3 "$dir/bad.out")"
done
"$bench" svg only-one-arg >/dev/null 2>&1
[ $? = 2 ] || fail "svg with one argument: expected exit 2"

# --pin: the first CPU this process may use; pair and mt (2 threads) run pinned and say so
cpu=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*\([0-9]*\).*/\1/p' /proc/self/status)
"$bench" --allocators cachalot-sim --workload pair,mt --ops 200 --repeat 1 --threads 2 --pin "$cpu" \
  >"$dir/pin.txt" 2>"$dir/pin.err" || fail "--pin $cpu exited $?"
grep -q "^Pinned: single-thread rows on CPU $cpu," "$dir/pin.txt" || fail "--pin $cpu: no 'Pinned' line"
grep -q '^mt-2 ' "$dir/pin.txt" || fail "--pin $cpu: no mt-2 row"
[ -s "$dir/pin.err" ] && fail "--pin $cpu warned: $(cat "$dir/pin.err")"

# A tiny trace in PyTorch's snapshot schema: two allocations, a free of an addr from before the trace,
# one allocation left live at the end.
cat >"$dir/tiny.json" <<'EOF'
{"segments": [], "device_traces": [[
  {"action": "alloc", "addr": 4096, "size": 1000, "stream": 0, "time_us": 1},
  {"action": "alloc", "addr": 8192, "size": 3000000, "stream": 0, "time_us": 2},
  {"action": "free_requested", "addr": 4096, "size": 1000, "stream": 0, "time_us": 3},
  {"action": "free_completed", "addr": 4096, "size": 1000, "stream": 0, "time_us": 3},
  {"action": "free_requested", "addr": 12288, "size": 512, "stream": 0, "time_us": 4},
  {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 5}
]]}
EOF

# A --trace NAME in --trace-dir: the file NAME.json there.
"$bench" --allocators cachalot-sim --workload replay --trace tiny --trace-dir "$dir" --repeat 1 --csv "$dir/tiny.csv" \
  >/dev/null 2>&1 || fail "--trace tiny --trace-dir exited $?"
grep -q '^replay-tiny,cachalot-sim,' "$dir/tiny.csv" || fail "--trace tiny --trace-dir: $(cat "$dir/tiny.csv")"

# Every workload on the simulated device, small.
"$bench" --allocators cachalot-sim --workload all --ops 300 --repeat 1 --threads 2 --graph-ops 50 --replays 5 \
  --host-ops 30 --stream-requests 50 --trace "$dir/tiny.json" --csv "$dir/out.csv" --json "$dir/out.json" --svg "$dir/out.svg" \
  >"$dir/table.txt" 2>"$dir/stderr.txt"
rc=$?
[ "$rc" = 0 ] || { fail "the sim run exited $rc"; cat "$dir/stderr.txt"; }
for f in out.csv out.json out.svg; do
  [ -s "$dir/$f" ] || fail "$f was not written"
done
head -1 "$dir/out.csv" | grep -q '^workload,allocator,status,unit,' || fail "out.csv has no header"
for w in pair-256B pair-4KiB pair-512KiB pair-2MiB pair-32MiB cross-4 cross-64 history-4KiB history-stacks-4KiB \
  streams-50 random-1MiB random-64MiB mt-1 mt-2 graph-capture graph-replay host-4KiB-64MiB; do
  grep -q "^$w,cachalot-sim,ok,ns/" "$dir/out.csv" || fail "out.csv has no ok row $w for cachalot-sim"
  grep -q "^$w " "$dir/table.txt" || fail "the table has no row $w"
done
# replay: ok, or skipped in a build without cJSON / zlib
grep -Eq '^replay-tiny,cachalot-sim,(ok,|skipped,.*replay unavailable)' "$dir/out.csv" ||
  fail "out.csv has no replay-tiny row"
if grep -q '^replay-tiny,cachalot-sim,ok,' "$dir/out.csv"; then
  # 3 allocs + 3 frees; the most live at once is 1000 + 3000000 requested bytes
  grep -q '^replay-tiny,cachalot-sim,ok,ns/op,6,1,1,1,[0-9.]*,[0-9.]*,[0-9.]*,[0-9]*,[0-9]*,3001000,' "$dir/out.csv" ||
    fail "replay-tiny: expected 6 ops and a requested peak of 3001000 bytes"
fi
n_rows=$(($(wc -l <"$dir/out.csv") - 1))
[ "$n_rows" = 18 ] || fail "out.csv has $n_rows rows, expected 18"
# streams-50: 50 requests, each a stream of its own: 50 streams, and a small segment each (the warm-up's)
grep -q '^streams-50,cachalot-sim,ok,ns/req,50,1,1,50,' "$dir/out.csv" || fail "streams-50: expected 50 requests on 50 streams"
grep -q '^streams-50,cachalot-sim,ok,.*,104857600,' "$dir/out.csv" || fail "streams-50: expected 50 x 2 MiB reserved"
grep -q '"tool": "alloc_bench"' "$dir/out.json" || fail "out.json is not alloc_bench's"
if command -v python3 >/dev/null; then
  python3 -m json.tool "$dir/out.json" >/dev/null || fail "out.json is not valid JSON"
fi
grep -q '^<svg ' "$dir/out.svg" && tail -1 "$dir/out.svg" | grep -q '^</svg>$' || fail "out.svg is not an SVG document"

# The host workload on the simulated device: every block a power of two that the cache pinned once, in the
# warm-up pass, and served from its cache after. The sequence is alloc+free pairs, one block live at a
# time, so: peak allocated is the largest request rounded up to a power of two; peak reserved is the sum
# of the distinct blocks, each a power of two from 4 KiB to 64 MiB, so its bits count the pinnings.
"$bench" --allocators cachalot-sim --workload host --host-ops 200 --repeat 2 --csv "$dir/host.csv" \
  >"$dir/host.txt" 2>"$dir/host.err" || fail "-w host exited $?: $(cat "$dir/host.err")"
grep -q '^host-4KiB-64MiB  *cachalot-sim  *ns/pair ' "$dir/host.txt" ||
  fail "-w host: no table row: $(cat "$dir/host.txt")"
row=$(grep '^host-4KiB-64MiB,cachalot-sim,' "$dir/host.csv")
IFS=, read -r _ _ status unit units repeats _ _ median _ _ reserved allocated requested pins _ <<<"$row"
if [ "$status,$unit,$units,$repeats" != "ok,ns/pair,200,2" ]; then
  fail "-w host: row $row"
else
  awk -v m="$median" 'BEGIN { exit !(m > 0) }' || fail "-w host: median $median"
  [ "$requested" -ge 4096 ] && [ "$requested" -le $((64 << 20)) ] || fail "-w host: peak requested $requested"
  [ $((allocated & (allocated - 1))) = 0 ] && [ "$allocated" -ge "$requested" ] &&
    [ "$allocated" -lt $((2 * requested)) ] ||
    fail "-w host: peak allocated $allocated for a largest request of $requested"
  bits=0
  for ((k = 12; k <= 26; k++)); do bits=$((bits + (reserved >> k & 1))); done
  [ $((reserved & 4095)) = 0 ] && [ "$reserved" -lt $((1 << 27)) ] && [ "$bits" = "$pins" ] && [ "$pins" -ge 2 ] ||
    fail "-w host: $pins pinnings for a peak of $reserved pinned bytes"
fi
# The rows that cannot run here say why above the table: PyTorch's without python3 on the PATH; no device
# allocator is named (they have no host rows).
PATH=/nonexistent "$bench" --workload host --host-ops 20 --repeat 1 >"$dir/host-all.txt" 2>&1 ||
  fail "-w host with the default allocators exited $?: $(cat "$dir/host-all.txt")"
grep -q '^skipped (left out of the table): PyTorch: cannot run python3 (No such file or directory): not in PATH$' \
  "$dir/host-all.txt" || fail "-w host without python3: $(grep PyTorch "$dir/host-all.txt")"
for a in cachalot cudaHostAlloc; do
  grep -Eq "^(skipped \(left out of the table\): $a: .|host-4KiB-64MiB  *$a  *ns/pair )" "$dir/host-all.txt" ||
    fail "-w host: neither a row nor a reason for $a"
done
grep -q '^host-4KiB-64MiB  *cachalot-sim ' "$dir/host-all.txt" || fail "-w host: no cachalot-sim row by default"
grep -Eq 'cudaMalloc|cudaMallocAsync' "$dir/host-all.txt" && fail "-w host names a device allocator"

# The PyTorch row's side of its protocol (alloc_torch.c; the driver's side needs torch and CUDA, so a
# stand-in for python3 plays it): 'pass' answers the time of the loop, 'stats' the figures (-1: unknown,
# an empty field), 'check' a verdict.
mkdir -p "$dir/fakepy"
cat >"$dir/fakepy/python3" <<'EOF'
#!/usr/bin/env bash
# A stand-in for `python3 torch_host.py MODE`; FAKE_FAIL=pass makes every pass fail at op 3.
case $2 in
probe) echo "ok 0.0+stand-in" ;;
serve)
  echo "ready 0.0+stand-in"
  while read -r cmd n; do
    case $cmd in
    ops) for ((i = 0; i < n; i++)); do read -r _ _; done; echo loaded ;;
    pass) if [ "${FAKE_FAIL:-}" = pass ]; then echo "error 3 pinning failed: out of memory"; else echo "ok 5000"; fi ;;
    stats) echo "stats 12288 -1 2" ;;
    check) echo ok ;;
    dops) # (n is "N STREAMS"); each op "SIZE SLOT STREAM RECORD": the records and streams are counted
      recs=0 top=0
      for ((i = 0; i < ${n% *}; i++)); do
        read -r _ _ st rec
        [ "$rec" != 0 ] && recs=$((recs + 1))
        [ "$st" -gt "$top" ] && top=$st
      done
      echo loaded
      echo "$recs $top ${n#* }" >>"$FAKE_LOG" ;;
    dpass) echo "ok 2000" ;;
    dstats) echo "stats 2097152 4096 1" ;;
    dcheck) echo ok ;;
    history) echo "history $n" >>"$FAKE_LOG"; echo ok ;;
    *) echo "error unknown command $cmd" ;;
    esac
  done
  ;;
esac
EOF
chmod +x "$dir/fakepy/python3"
PATH="$dir/fakepy:$PATH" "$bench" -a PyTorch -w host --host-ops 50 --repeat 2 --csv "$dir/torch.csv" \
  >"$dir/torch.txt" 2>&1 || fail "the PyTorch row with a stand-in exited $?: $(cat "$dir/torch.txt")"
grep -q '^host-4KiB-64MiB,PyTorch,ok,ns/pair,50,2,1,1,100.000,100.000,100.000,12288,,[0-9]*,2,torch 0.0+stand-in$' \
  "$dir/torch.csv" || fail "the PyTorch row with a stand-in: $(cat "$dir/torch.csv")"
# The device rows: the child gets each sequence with its streams and records, and turns history on and off.
: >"$dir/fake.log"
PATH="$dir/fakepy:$PATH" FAKE_LOG="$dir/fake.log" "$bench" -a PyTorch -w pair,cross,history,streams,mt,graph \
  --ops 8 --stream-requests 5 --repeat 1 --csv "$dir/torchdev.csv" >"$dir/torchdev.txt" 2>&1 ||
  fail "the PyTorch device rows with a stand-in exited $?: $(cat "$dir/torchdev.txt")"
grep -q '^pair-4KiB,PyTorch,ok,ns/pair,8,1,1,1,250.000,250.000,250.000,2097152,4096,4096,1,torch 0.0+stand-in$' \
  "$dir/torchdev.csv" ||
  fail "pair-4KiB on PyTorch with a stand-in: $(grep pair-4KiB "$dir/torchdev.csv")"
grep -q '^cross-4,PyTorch,ok,ns/pair,8,1,1,2,' "$dir/torchdev.csv" || fail "no cross-4 row on PyTorch"
grep -q '^streams-5,PyTorch,ok,ns/req,5,1,1,5,400.000,' "$dir/torchdev.csv" || fail "no streams-5 row on PyTorch"
grep -q '^mt-1,PyTorch,n/a,.*runs in one thread' "$dir/torchdev.csv" || fail "mt on PyTorch is not n/a"
grep -q '^graph-capture,PyTorch,n/a,' "$dir/torchdev.csv" || fail "graph on PyTorch is not n/a"
# what the child was sent: cross-4 records 2 of 8 frees, cross-64 none; streams-5 names streams 0-4 of 5;
# history on (plain, then stacks) and off around each history row
[ "$(grep -c '^2 0 2$' "$dir/fake.log")" = 1 ] && [ "$(grep -c '^0 4 5$' "$dir/fake.log")" = 1 ] &&
  [ "$(grep -c '^history plain$' "$dir/fake.log")" = 1 ] && [ "$(grep -c '^history stacks$' "$dir/fake.log")" = 1 ] &&
  [ "$(grep -c '^history off$' "$dir/fake.log")" = 2 ] || fail "the PyTorch child was sent: $(cat "$dir/fake.log")"
PATH="$dir/fakepy:$PATH" FAKE_FAIL=pass "$bench" -a PyTorch -w host --host-ops 50 --repeat 1 >"$dir/torch.txt" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a failing PyTorch pass exited $rc, expected 1"
grep -q 'FAILED: host-4KiB-64MiB on PyTorch: warm-up pass: op 3: pinning failed: out of memory$' "$dir/torch.txt" ||
  fail "a failing PyTorch pass: $(cat "$dir/torch.txt")"

# Outputs that are not regular files are written through (issue 17 item 10): a symbolic link stays a
# link, and a write that fails (a link to /dev/full) exits 1 naming the reason, for each output.
echo old >"$dir/target.csv"
ln -s target.csv "$dir/link.csv"
"$bench" --allocators cachalot-sim --workload pair --ops 20 --repeat 1 --csv "$dir/link.csv" >/dev/null 2>&1 ||
  fail "--csv through a symbolic link exited $?"
[ -L "$dir/link.csv" ] || fail "--csv replaced the symbolic link link.csv"
grep -q '^pair-4KiB,cachalot-sim,ok,' "$dir/target.csv" || fail "--csv did not write through the link"
if [ -c /dev/full ]; then
  for opt in --csv --json --svg; do
    ln -sf /dev/full "$dir/full$opt"
    "$bench" --allocators cachalot-sim --workload pair --ops 20 --repeat 1 "$opt" "$dir/full$opt" \
      >/dev/null 2>"$dir/full.err"
    rc=$?
    [ "$rc" = 1 ] || fail "$opt to /dev/full exited $rc, expected 1"
    grep -q "cannot write $dir/full$opt: No space left on device" "$dir/full.err" ||
      fail "$opt to /dev/full: $(cat "$dir/full.err")"
    [ -L "$dir/full$opt" ] || fail "$opt replaced the link to /dev/full"
  done
fi
ls "$dir"/*.tmp.* >/dev/null 2>&1 && fail "temporary files left: $(ls "$dir"/*.tmp.*)"

# The chart from the CSV.
"$bench" svg "$dir/out.csv" "$dir/from_csv.svg" || fail "alloc_bench svg exited $?"
grep -q 'graph-replay' "$dir/from_csv.svg" || fail "from_csv.svg lacks the graph-replay group"
printf 'a,b\n1,2\n' >"$dir/notours.csv"
"$bench" svg "$dir/notours.csv" "$dir/x.svg" 2>/dev/null
[ $? = 1 ] || fail "svg of a foreign CSV: expected exit 1"

# The default allocator selection runs where allocators are missing (no GPU: skipped, exit 0).
"$bench" --workload pair --ops 50 --repeat 1 >"$dir/default.txt" 2>&1 || fail "the default selection exited $?"
grep -q '^pair-4KiB ' "$dir/default.txt" || fail "the default selection printed no pair-4KiB row"
# Without a GPU, cachalot's row is skipped with the flag that runs it here, not the C API's
# cachalot_backend_sim() (issue 17).
if grep -q '^skipped (left out of the table): cachalot: ' "$dir/default.txt"; then
  grep -q '^skipped (left out of the table): cachalot: .*; -a cachalot-sim runs cachalot on a simulated device$' \
    "$dir/default.txt" || fail "no -a cachalot-sim hint: $(grep '^skipped.*: cachalot: ' "$dir/default.txt")"
  grep -q 'cachalot_backend_sim' "$dir/default.txt" && fail "the C API is advised: $(grep -m1 cachalot_backend_sim "$dir/default.txt")"
fi

if [ "$fails" = 0 ]; then
  echo "alloc_bench smoke test: OK"
  exit 0
fi
echo "alloc_bench smoke test: $fails failure(s); outputs in $dir"
exit 1
