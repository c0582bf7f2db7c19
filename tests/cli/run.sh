#!/usr/bin/env bash
# CLI tests of alloc_snapshot: runs each case in a scratch copy of fixtures/ (so file names in messages
# are short and stable), checks the exit status, and compares stdout and stderr with golden/NAME.out and
# golden/NAME.err. Replay summaries' "wall time" lines are dropped and trace times replaced by T before
# comparing (they vary from run to run).
#
#   run.sh TOOL DIR          DIR is tests/cli (fixtures/ and golden/ inside)
#   CLI_UPDATE=1 run.sh ...  rewrites the goldens from the tool's output (review the diff!)
set -u -o pipefail
tool=$(realpath "$1")
dir=$(realpath "$2")
export LC_ALL=C # strerror texts and sorting, the same everywhere
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$dir/fixtures/." "$work/"
cd "$work" || exit 1

passed=0
failed=0

# check NAME WANT_STATUS STDIN ARGS...: one case.
check() {
  local name=$1 want=$2 input=$3
  shift 3
  local got
  "$tool" "$@" <"$input" >"$work/.out" 2>"$work/.err"
  got=$?
  sed -i -e '/wall time:/d' -e 's/"time_us":[0-9]*/"time_us":T/g' "$work/.out" "$work/.err"
  local ok=1
  if [ "$got" != "$want" ]; then
    echo "FAIL $name: exit status $got, expected $want (alloc_snapshot $*)"
    sed 's/^/  stderr: /' "$work/.err" | head -5
    ok=0
  fi
  for stream in out err; do
    local golden="$dir/golden/$name.$stream"
    if [ "${CLI_UPDATE:-}" = 1 ]; then
      if [ -s "$work/.$stream" ]; then cp "$work/.$stream" "$golden"; else rm -f "$golden"; fi
    elif [ -f "$golden" ]; then
      if ! diff -u "$golden" "$work/.$stream" >"$work/.diff"; then
        echo "FAIL $name: std$stream differs from golden/$name.$stream (alloc_snapshot $*)"
        head -40 "$work/.diff"
        ok=0
      fi
    elif [ -s "$work/.$stream" ]; then
      echo "FAIL $name: unexpected std$stream, no golden/$name.$stream (alloc_snapshot $*)"
      head -10 "$work/.$stream"
      ok=0
    fi
  done
  if [ $ok = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

# t NAME WANT_STATUS ARGS...: a case with no standard input.
t() {
  local name=$1 want=$2
  shift 2
  check "$name" "$want" /dev/null "$@"
}

# --- usage and help (exit status 2 for usage errors, 0 for help) ---
t usage_none 2
t usage_unknown_command 2 frobnicate
t dump_no_socket 1 dump --socket /nonexistent/cachalot.sock
t usage_plot 2 plot cachalot_small.json -o out.html
t help 0 --help
t help_show 0 show --help
t help_segments 0 segments -h
t help_diff 0 help diff
t help_replay 0 replay --help
t usage_show_no_file 2 show
t usage_show_two_files 2 show cachalot_small.json cachalot_after.json
t usage_show_bad_top 2 show cachalot_small.json --top x
t usage_show_bad_option 2 show cachalot_small.json --bogus
t usage_show_missing_value 2 show cachalot_small.json --top
t usage_segments_bad_device 2 segments cachalot_small.json --device -1
t usage_segments_bad_pool 2 segments cachalot_small.json --pool 1
t usage_segments_bad_stream 2 segments cachalot_small.json --stream 0x10
t usage_diff_one_file 2 diff cachalot_small.json
t usage_replay_bad_backend 2 replay trace_small.json --backend tpu
t usage_replay_bad_capacity 2 replay trace_small.json --capacity 12X
t usage_replay_capacity_cuda 2 replay trace_small.json --backend cuda --capacity 1G
t usage_replay_bad_conf 2 replay trace_small.json --conf bogus_key:1
t usage_replay_two_stdout 2 replay trace_small.json -o - --stats-json

# --- show ---
t show_cachalot 0 show cachalot_small.json
t show_cachalot_top1 0 show --top 1 cachalot_small.json
t show_torch_gz_bytes 0 show torch_small.json.gz --bytes
t show_trace_only 0 show trace_small.json
t show_no_trace 0 show no_trace.json --top 0
check show_stdin 0 cachalot_after.json show -

# --- segments ---
t segments_all 0 segments cachalot_small.json
t segments_device 0 segments cachalot_small.json --device 1
t segments_pool 0 segments --pool 1,0 cachalot_small.json
t segments_stream 0 segments cachalot_small.json --stream 140000000000000
t segments_pool_stream 0 segments cachalot_small.json --pool 0,0 --stream 0 --device 0
t segments_none 0 segments cachalot_small.json --device 7
t segments_torch 0 segments torch_small.json.gz

# --- diff ---
t diff 0 diff cachalot_small.json cachalot_after.json
t diff_reverse_bytes 0 diff --bytes cachalot_after.json cachalot_small.json
t diff_same 0 diff cachalot_small.json cachalot_small.json
t diff_torch 0 diff torch_small.json.gz cachalot_small.json

# --- replay (simulated device; its addresses are deterministic, its stream handles are not, so the
#     round trips through -o use a trace on stream 0 only) ---
t replay_cachalot 0 replay cachalot_small.json
t replay_torch_oom 0 replay torch_small.json.gz --capacity 64M
t replay_stats_json 0 replay trace_small.json --stats-json --conf max_split_size_mb:20
t replay_out 0 replay trace_small.json -o out.json
t replay_out_show 0 show out.json
t replay_out_segments 0 segments out.json --device 0
t replay_out_diff 0 diff trace_small.json out.json
t replay_out_gz 0 replay trace_small.json -o out.json.gz --capacity 1G
t replay_out_gz_show 0 show out.json.gz --top 1
t replay_out_stdout 0 replay trace_small.json -o -
t replay_no_trace 1 replay no_trace.json

# The cuda backend: fails cleanly (1) without a GPU or CUDA, replays (0) with one; never crashes.
"$tool" replay trace_small.json --backend cuda >/dev/null 2>"$work/.err"
status=$?
if [ $status = 0 ] || { [ $status = 1 ] && grep -q "cannot use the cuda backend" "$work/.err"; }; then
  passed=$((passed + 1))
else
  echo "FAIL replay_cuda: exit status $status"
  cat "$work/.err"
  failed=$((failed + 1))
fi

# --- bad files: exit status 1 with a message naming the file and the problem ---
t missing_file 1 show no_such_file.json
t directory 1 show .
t empty 1 show empty.json
t blank 1 segments blank.json
t not_json 1 show not_json.txt
t truncated 1 show truncated.json
t truncated_gz 1 show truncated.json.gz
t trailing 1 show trailing.json
t top_array 1 show top_array.json
t no_segments 1 show no_segments.json
t deep_nesting 1 show deep_nesting.json
for f in bad_*.json; do
  t "${f%.json}" 1 show "$f"
done
t bad_in_diff_b 1 diff cachalot_small.json bad_state.json
t bad_in_segments 1 segments bad_pool_id.json
t bad_in_replay 1 replay bad_missing_size.json

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
