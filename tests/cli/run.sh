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

# tmem NAME WANT_STATUS KIB ARGS...: a case under `ulimit -v KIB`, the readers' bound on memory; without
# the limit where the tool cannot start under it (a sanitizer build reserves terabytes of address space).
tmem() {
  local name=$1 want=$2 kib=$3 saved=$tool
  shift 3
  if (ulimit -v "$kib" && "$tool" --version) >/dev/null 2>&1; then
    tool=$work/.limited
    printf '#!/usr/bin/env bash\nulimit -v %s && exec %q "$@"\n' "$kib" "$saved" >"$tool"
    chmod +x "$tool"
  else
    echo "note: $name runs without ulimit -v $kib (the tool cannot start under it)"
  fi
  check "$name" "$want" /dev/null "$@"
  tool=$saved
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
t help_plot 0 plot --help
t help_plot_via_help 0 help plot
t help 0 --help
t help_show 0 show --help
t help_segments 0 segments -h
t help_diff 0 help diff
t help_replay 0 replay --help
t usage_show_no_file 2 show
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
t usage_replay_passes_zero 2 replay trace_small.json --passes 0
t usage_replay_passes_many 2 replay trace_small.json --passes 1001
t usage_replay_passes_word 2 replay trace_small.json --passes six

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
# The segments are written again through cl_json: a string that is not UTF-8 comes out as U+FFFD (the text
# is JSON a strict reader takes), numbers keep their values (-0 its sign; an integer past 2^53 is the double
# the parser made of it), and a segment as deep as the writer takes (31 levels, the segment's own object
# the first) is printed, one level more refused with its place rather than called a lack of memory.
seg=$(printf '{"segments":[{"device":0,"address":0,"total_size":2097152,"blocks":[],"note":"x\377y","n":[')
printf '%s' "$seg" '0.5,-0,1e300,9007199254740993]}]}' >segments_not_utf8.json
t segments_not_utf8 0 segments segments_not_utf8.json
if command -v python3 >/dev/null; then
  "$tool" segments segments_not_utf8.json | python3 -c 'import json, sys
s = json.loads(sys.stdin.buffer.read().decode("utf-8"))[0]
sys.exit(s["note"] != "x\ufffdy" or s["n"] != [0.5, -0.0, 1e300, 9007199254740992])' &&
    passed=$((passed + 1)) || {
    echo "FAIL segments_not_utf8_parse: not strict JSON, or other values"
    failed=$((failed + 1))
  }
fi
# nest K: a segment whose "deep" member is K arrays, one inside the other
nest() { printf '%s9],"deep":%s0%s}]}' "$seg" "$(printf "%$1s" | sed 's/ /[/g')" "$(printf "%$1s" | sed 's/ /]/g')"; }
nest 30 >segments_deep.json
nest 31 >segments_too_deep.json
t segments_deep 0 segments segments_deep.json
t segments_too_deep 1 segments segments_too_deep.json

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
# preset:low_fragmentation: the snapshot's allocator_settings show the keys it set
t replay_preset_settings 0 replay trace_small.json --conf preset:low_fragmentation -o -
# Six passes in a row on one allocator (what a pass leaves live is freed before the next): the steady state
# beside the first pass. kv_generate is where they part: with the preset 1.042 once, 1.101 over six.
t replay_passes 0 replay trace_small.json --passes 6
cp "$dir/../../traces/kv_generate.snapshot.json.gz" "$work/"
t replay_passes_kv 0 replay kv_generate.snapshot.json.gz --passes 6 --conf preset:low_fragmentation
t replay_passes_out 0 replay trace_small.json --passes 2 -o out2.json
t replay_passes_out_show 0 show out2.json
t replay_no_trace 1 replay no_trace.json

# The cuda backend: fails cleanly (1) without a GPU or CUDA, replays (0) with one; never crashes. Its
# message names the flag that works here, --backend sim, not the C API's cachalot_backend_sim() (issue 17).
"$tool" replay trace_small.json --backend cuda >/dev/null 2>"$work/.err"
status=$?
if [ $status = 0 ] || { [ $status = 1 ] && grep -q "cannot use the cuda backend" "$work/.err" &&
  grep -q -- "; --backend sim replays on a simulated device$" "$work/.err" &&
  ! grep -q "cachalot_backend_sim" "$work/.err"; }; then
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
# Not JSON, though cJSON alone took each of them (issue 17 item 11): control bytes between tokens or raw
# in a string (an escape sequence for the terminal), a NUL escaped into a string (which cut
# "small\u0000large" to "small"), a number with a leading zero. The bad_block_*, bad_allocated_size and
# bad_segment_wraps fixtures are snapshots whose blocks do not fit their segment (`show` said 1 TiB was
# allocated in a 2 MiB segment).
printf '{"segments": [\000]}' >bad_control_byte.json
printf '{"segments": [],\f"device_traces": []}' >bad_form_feed.json
printf '{"segments": [], "allocator_settings": {"CACHALOT_ALLOC_CONF": "max_split_size_mb:40\033[2J"}}' \
  >bad_control_in_string.json
printf '%s' '{"segments": [{"device": 0, "address": 0, "total_size": 2097152, "segment_type": "small\u0000large", "blocks": []}]}' \
  >bad_nul_escape.json
printf '%s' '{"segments": [{"device": 01, "address": 0, "total_size": 2097152, "blocks": []}]}' >bad_leading_zero.json
for f in bad_*.json; do
  t "${f%.json}" 1 show "$f"
done
# gzip: data after the last member is refused (zlib's gzread dropped it silently); members one after
# another (cat a.gz b.gz) are one file.
# gz_trailing.json.gz is cachalot_small.json gzip'ed and "garbage", gz_zeros.json.gz the same with 512
# zero bytes (tar's padding), gz_members.json.gz its first 1000 bytes and the rest, each gzip'ed.
t gz_trailing 1 show gz_trailing.json.gz
t gz_zeros 1 show gz_zeros.json.gz
t gz_members 0 show gz_members.json.gz
# Memory in proportion to the input (issue 30: a 0.9 MB .json.gz of "0," took 3 GiB): a gzip'ed file
# inflates to at most 256 times its size (at least 64 MiB), JSON text holds at most a value per 4 bytes
# (at least 2^20, at most 2^25); each refused with the limit it hit, under a limit of address space a
# reader without those bounds passes.
yes '0,' | tr -d '\n' | head -c 100000000 | { printf '{"segments":['; cat; printf '0]}'; } | gzip -9 >bomb_ratio.json.gz
{ printf '{"segments":['; yes '0,' | tr -d '\n' | head -c 3000000; printf '0]}'; } >bomb_values.json
tmem bomb_ratio 1 400000 show bomb_ratio.json.gz
tmem bomb_values 1 400000 show bomb_values.json
t bad_in_diff_b 1 diff cachalot_small.json bad_state.json
t bad_in_segments 1 segments bad_pool_id.json
t bad_in_replay 1 replay bad_missing_size.json
# more streams than the replay makes (4,096): refused before replaying, not after the work up to the
# 4,097th (20,000 streams took 9 s and 206 MB to be refused)
if command -v python3 >/dev/null; then
  python3 -c 'import json
json.dump({"segments": [], "device_traces": [[{"action": "alloc", "addr": 4096 * (i + 1), "size": 512,
           "stream": i + 1} for i in range(4097)]]}, open("many_streams.json", "w"))'
  t replay_too_many_streams 1 replay many_streams.json
fi

# --- plot: the page is checked for what a person relies on, and the small fixture's page is golden ---
# fail NAME MESSAGE: counts a failed check.
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
}

# page_ok NAME FILE [PATTERN...]: FILE is a whole explorer page (issue 19): one file that refers to nothing
# outside itself (no http:// or https://, no src= or href=, no @import or url()), the snapshot's data in
# one JSON element, ending with </html>, every PATTERN (grep -F) present, and no temporary file left
# beside it. tests/explorer drives the page in a browser.
page_ok() {
  local name=$1 file=$2 ok=1 pat
  shift 2
  if [ ! -s "$file" ]; then
    fail "$name" "$file was not written"
    return
  fi
  if grep -Eiq 'https?://|[[:space:]](src|href)=|@import|url\(' "$file"; then
    fail "$name" "$file refers to something outside itself:"
    grep -Eio '.{0,40}(https?://|[[:space:]](src|href)=|@import|url\().{0,40}' "$file" | head -3
    ok=0
  fi
  [ "$(grep -c '<script type="application/json" id="snapshot-data">' "$file")" = 1 ] || { fail "$name" "not one data element"; ok=0; }
  tail -c 8 "$file" | grep -q '</html>' || { fail "$name" "$file does not end with </html>"; ok=0; }
  for pat in "$@"; do grep -qF -- "$pat" "$file" || { fail "$name" "$file lacks '$pat'"; ok=0; }; done
  if ls "$file".tmp.* >/dev/null 2>&1; then
    fail "$name" "temporary file left: $(ls "$file".tmp.*)"
    ok=0
  fi
  [ $ok = 1 ] && passed=$((passed + 1))
}

# data_golden NAME FILE: the page FILE's data element, the JSON document alone, must be golden/NAME.json
# (the script and style around it are the embedded sources, not the snapshot's). CLI_UPDATE=1 rewrites it.
data_golden() {
  local golden="$dir/golden/$1.json"
  sed -n 's/^<script type="application\/json" id="snapshot-data">\(.*\)<\/script>$/\1/p' "$2" >"$work/.data"
  if [ "${CLI_UPDATE:-}" = 1 ]; then
    cp "$work/.data" "$golden"
  elif [ -s "$work/.data" ] && diff -u "$golden" "$work/.data" >"$work/.diff"; then
    passed=$((passed + 1))
  else
    fail "$1" "the data element of $2 differs from golden/$1.json"
    head -c 2000 "$work/.diff"
  fi
}

# no_file NAME FILE: FILE (or a temporary file of it) must not exist after a failed plot.
no_file() {
  if [ -e "$2" ] || ls "$2".tmp.* >/dev/null 2>&1; then
    fail "$1" "$2 or a temporary file of it exists after a failure"
  else
    passed=$((passed + 1))
  fi
}

t usage_plot_no_output 2 plot cachalot_small.json
t usage_plot_no_file 2 plot -o out.html
t usage_plot_two_files 2 plot cachalot_small.json cachalot_after.json -o out.html
t usage_plot_bad_device 2 plot cachalot_small.json -o out.html --device x
t usage_plot_empty_output 2 plot cachalot_small.json -o ''
t usage_plot_bad_option 2 plot cachalot_small.json -o out.html --log
t usage_plot_same_file 2 plot cachalot_small.json -o cachalot_small.json
cmp -s cachalot_small.json "$dir/fixtures/cachalot_small.json" && passed=$((passed + 1)) ||
  fail usage_plot_same_file "the input was changed"
t plot_missing_device 1 plot cachalot_small.json -o missing.html --device 7
no_file plot_missing_device missing.html
t plot_bad_state 1 plot bad_state.json -o bad.html
no_file plot_bad_state bad.html
t plot_not_json 1 plot not_json.txt -o bad.html
t plot_truncated_gz 1 plot truncated.json.gz -o bad.html
t plot_missing_file 1 plot no_such_file.json -o bad.html
no_file plot_missing_file bad.html
t plot_no_such_dir 1 plot cachalot_small.json -o no_such_dir/out.html
t plot_onto_directory 1 plot cachalot_small.json -o .
if ls ./.tmp.* >/dev/null 2>&1; then fail plot_onto_directory "temporary file left"; else passed=$((passed + 1)); fi

# OUT that is not a regular file is written through, never replaced by a renamed temporary file (issue 17
# item 10; as root, -o /dev/full turned the device into a regular file): a symbolic link stays a link and
# its file gets the page, a FIFO stays a FIFO and its reader gets the page, and a write that fails (a
# link to /dev/full) exits 1 with the reason. The same for replay's -o, plain and gzip'ed.
# is_link NAME PATH TARGET: PATH must still be a symbolic link to TARGET.
is_link() {
  if [ -L "$2" ] && [ "$(readlink "$2")" = "$3" ]; then
    passed=$((passed + 1))
  else
    fail "$1" "$2 is no longer a link to $3 but a $(stat -c %F "$2" 2>/dev/null)"
  fi
}
echo old >linked.html
ln -s linked.html link.html
t plot_through_link 0 plot cachalot_small.json -o link.html
is_link plot_through_link link.html linked.html
page_ok plot_through_link_page linked.html '"dev":[{"d":0,'
mkfifo fifo.html
timeout 60 cat fifo.html >from_fifo.html &
reader=$!
t plot_into_fifo 0 plot cachalot_small.json -o fifo.html
if [ -p fifo.html ]; then
  wait $reader
  passed=$((passed + 1))
  page_ok plot_into_fifo_page from_fifo.html '"dev":[{"d":0,'
else
  kill $reader 2>/dev/null
  wait $reader 2>/dev/null
  fail plot_into_fifo "fifo.html is no longer a FIFO but a $(stat -c %F fifo.html)"
fi
echo old >replayed_target.json
ln -s replayed_target.json replayed_link.json
t replay_out_through_link 0 replay trace_small.json -o replayed_link.json
is_link replay_out_through_link replayed_link.json replayed_target.json
grep -q '"segments"' replayed_target.json && passed=$((passed + 1)) ||
  fail replay_out_through_link "replayed_target.json does not hold the snapshot"
if [ -c /dev/full ]; then
  ln -s /dev/full full.html
  t plot_full_device 1 plot cachalot_small.json -o full.html
  is_link plot_full_device full.html /dev/full
  ln -s /dev/full full.json
  t replay_out_full_device 1 replay trace_small.json -o full.json
  is_link replay_out_full_device full.json /dev/full
  ln -s /dev/full full.json.gz
  t replay_out_gz_full_device 1 replay trace_small.json -o full.json.gz
  is_link replay_out_gz_full_device full.json.gz /dev/full
  if ls ./*.tmp.* >/dev/null 2>&1; then fail plot_full_device "temporary file left: $(ls ./*.tmp.*)"; fi
else
  echo "skip plot_full_device: no /dev/full"
fi

t plot_cachalot 0 plot cachalot_small.json -o out.html
page_ok plot_cachalot_page out.html 'Memory snapshot: <span class="mono">cachalot_small.json</span>' \
  'allocator settings: <code>"max_split_size_mb:40"</code>' '{"v":1,"file":"cachalot_small.json","conf":"max_split_size_mb:40"' \
  '"dev":[{"d":0,' '},{"d":1,' '"oom":[13,1073741824]' '"streams":["0","140000000000000"]'
# Written again over the old page: replaced, not appended to, and the file keeps its mode.
chmod 600 out.html
t plot_cachalot_again 0 plot cachalot_small.json -o out.html
[ "$(grep -c '<!DOCTYPE html>' out.html)" = 1 ] && passed=$((passed + 1)) || fail plot_cachalot_again "not replaced"
[ "$(stat -c %a out.html)" = 600 ] && passed=$((passed + 1)) ||
  fail plot_cachalot_again "the mode of out.html became $(stat -c %a out.html)"
# The whole page of the small fixture, to standard output: the same page, its data golden.
"$tool" plot cachalot_small.json -o - >stdout.html 2>"$work/.err" && [ ! -s "$work/.err" ] && cmp -s stdout.html out.html &&
  passed=$((passed + 1)) || fail plot_cachalot_html "-o - did not write the page of -o out.html, alone"
data_golden plot_cachalot_data out.html
t plot_device1 0 plot cachalot_small.json --device 1 -o d1.html
page_ok plot_device1_page d1.html '"dev":[{"d":1,'
grep -q '{"d":0,' d1.html && fail plot_device1_page "device 0 drawn with --device 1"
check plot_stdin 0 cachalot_after.json plot - -o stdin.html
page_ok plot_stdin_page stdin.html 'Memory snapshot: <span class="mono">&lt;stdin&gt;</span>' '"file":"\u003cstdin\u003e"'
t plot_torch_gz 0 plot torch_small.json.gz -o torch.html
page_ok plot_torch_page torch.html '"dev":[{"d":0,'
t plot_trace_only 0 plot trace_small.json -o trace.html
page_ok plot_trace_only_page trace.html '"dev":[{"d":0,' '"segs":[]}]'
t plot_no_trace 0 plot no_trace.json -o none.html
page_ok plot_no_trace_page none.html '"dev":[]'
# An oom entry says the device's free bytes as "device_free" (PyTorch's key, and cachalot's now) or, in
# cachalot's older files, as "addr": both are read.
sed 's/"addr": 1073741824,/"device_free": 1073741824,/' cachalot_after.json >torch_oom.json
for f in cachalot_after.json torch_oom.json; do
  t "plot_oom_${f%.json}" 0 plot "$f" -o "oom_${f%.json}.html"
  page_ok "plot_oom_${f%.json}_page" "oom_${f%.json}.html" '"oom":[13,1073741824]' '85899345920'
done
t plot_replayed 0 plot out.json -o replayed.html
page_ok plot_replayed_page replayed.html '"dev":[{"d":0,'
# An empty trace, and a device without one: the devices are there, with no entries.
t plot_empty_trace 0 plot segments_empty_trace.json -o empty_trace.html
page_ok plot_empty_trace_page empty_trace.html '"dev":[{"d":0,"n":0,' '},{"d":1,"n":0,'

# Text from the input is escaped: a file name full of markup stays text, in the page and in its data.
cp cachalot_small.json "x<b>&\"'.json"
t plot_explorer_escaped 0 plot "x<b>&\"'.json" -o explorer_escaped.html
page_ok plot_explorer_escaped_page explorer_escaped.html '"file":"x\u003cb\u003e\u0026\"'"'"'.json"' \
  'Memory snapshot: <span class="mono">x&lt;b&gt;&amp;&quot;&#39;.json</span>'
grep -q 'x<b>' explorer_escaped.html && fail plot_explorer_escaped_page "the file name was not escaped"
# --static, the script-free page of earlier versions, is refused with a message naming the explorer,
# whatever the order of the options; nothing is written.
t usage_plot_static 2 plot --static cachalot_small.json -o static.html
no_file usage_plot_static static.html
t usage_plot_static_last 2 plot cachalot_small.json -o static.html --static
no_file usage_plot_static_last static.html

# A real trace (PyTorch's gpt_train in traces/), where present.
real_trace="$dir/../../traces/gpt_train.snapshot.json.gz"
if [ -f "$real_trace" ]; then
  if "$tool" plot "$real_trace" -o gpt.html >/dev/null 2>"$work/.err"; then
    # its peaks are checked in the browser (tests/explorer); here: the page holds the whole trace and
    # stays small (the trace's columns, its stacks and addresses once each)
    page_ok plot_gpt_page gpt.html '"n":27266,'
    size=$(wc -c <gpt.html)
    [ "$size" -lt 1000000 ] && passed=$((passed + 1)) || fail plot_gpt "the page is $size bytes"
  else
    fail plot_gpt "alloc_snapshot plot failed: $(head -3 "$work/.err")"
  fi
else
  echo "skip plot_gpt: $real_trace not found"
fi

# --- dump against a fake process: the whole reply must be one JSON object (issue 17 item 11: a reply
#     was cut at its first NUL, and anything after the object was ignored, and the rest written out) ---
# serve_once SOCKET HEX: answers one request on SOCKET with the bytes HEX, in the background ($server).
serve_once() {
  python3 -c '
import os, socket, sys
path, reply = sys.argv[1], bytes.fromhex(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.bind(path + ".tmp")
s.listen(1)
os.rename(path + ".tmp", path)  # there only once it listens
s.settimeout(30)
c, _ = s.accept()
c.recv(4096)
c.sendall(reply)
c.close()
os.unlink(path)
' "$1" "$2" &
  server=$!
  for _ in $(seq 200); do [ -S "$1" ] && break; sleep 0.05; done
}
if command -v python3 >/dev/null; then
  hex() { printf '%s' "$1" | od -An -v -tx1 | tr -d ' \n'; }
  serve_once fake.sock "$(hex '{"segments": []}')00$(hex 'garbage')"
  t dump_reply_nul 1 dump --socket fake.sock -o reply_nul.json
  wait $server
  no_file dump_reply_nul reply_nul.json
  serve_once fake.sock "$(hex '{"segments": []} {"error": "second"}')"
  t dump_reply_trailing 1 dump --socket fake.sock -o reply_trailing.json
  wait $server
  no_file dump_reply_trailing reply_trailing.json
  # a process that accepts and never answers: dump gives up after its time limit, with a message
  python3 -c '
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind("silent.sock.tmp")
s.listen(1)
os.rename("silent.sock.tmp", "silent.sock")
s.settimeout(30)
c, _ = s.accept()
time.sleep(4)
os.unlink("silent.sock")
' &
  silent=$!
  for _ in $(seq 200); do [ -S silent.sock ] && break; sleep 0.05; done
  t dump_silent 1 dump --socket silent.sock --timeout 1 -o silent.json
  grep -q "no reply for 1 s: gave up" "$work/.err" && passed=$((passed + 1)) ||
    fail dump_silent "no 'gave up' message: $(head -c 200 "$work/.err")"
  wait $silent
  no_file dump_silent silent.json
  t dump_bad_timeout 2 dump --socket silent.sock --timeout 0
  serve_once fake.sock "$(hex '{"segments": [], "device_traces": []}')0a"
  t dump_reply_ok 0 dump --socket fake.sock -o reply_ok.json
  wait $server
  cmp -s reply_ok.json <(printf '{"segments": [], "device_traces": []}\n\n') && passed=$((passed + 1)) ||
    fail dump_reply_ok "reply_ok.json is not the reply: $(head -c 100 reply_ok.json)"
else
  echo "skip dump_reply_*: no python3"
fi

# --- pickles (issue 19): PyTorch's .pickle snapshots read by every subcommand, convert, hostile pickles ---
# The fixtures pk_*.pickle* come from tests/cli/make_pickle_fixtures.py (Python's pickle module).
for f in pk_p2.pickle pk_p2.pickle.gz pk_p4.pickle pk_p4.pickle.gz pk_p5.pickle; do
  t "pickle_show_${f//./_}" 0 show "$f"
done
t pickle_show_torch 0 show pk_torch.pickle
t pickle_show_shared 0 show pk_shared.pickle

check pickle_show_stdin 0 pk_p4.pickle.gz show -
t pickle_segments_shared 0 segments pk_shared.pickle --device 0
t pickle_diff 0 diff cachalot_small.json pk_p4.pickle
t pickle_replay 0 replay pk_torch.pickle
t pickle_plot 0 plot pk_p5.pickle -o pk.html
page_ok pickle_plot_page pk.html 'Memory snapshot: <span class="mono">pk_p5.pickle</span>'
# convert: JSON to a pickle and back; the pickle is what Python's pickle.load takes for json.load's value
t pickle_convert_to 0 convert cachalot_small.json cs.pickle
t pickle_convert_back 0 convert cs.pickle cs.json
t pickle_convert_gz 0 convert cs.pickle cs2.pickle.gz
t pickle_convert_stdout 0 convert --to json cs2.pickle.gz -
t pickle_convert_torch 0 convert pk_torch.pickle torch_pk.json
t pickle_convert_shared 0 convert pk_shared.pickle -  --to json
cmp -s cs.json <("$tool" convert cachalot_small.json --to json -) &&
  passed=$((passed + 1)) || fail pickle_convert_back "cs.json is not what convert writes of cachalot_small.json"
if command -v python3 >/dev/null; then
  python3 -c '
import gzip, json, pickle, sys
want = json.load(open("cachalot_small.json"))
for f in ("cs.pickle", "cs2.pickle.gz"):
    got = pickle.load((gzip.open if f.endswith(".gz") else open)(f, "rb"))
    if got != want:
        sys.exit(f + ": pickle.load differs from json.load of cachalot_small.json")
if json.load(open("torch_pk.json")) != json.load(gzip.open("torch_small.json.gz")):
    sys.exit("torch_pk.json differs from torch_small.json.gz")
' && passed=$((passed + 1)) || fail pickle_python_load "Python reads another value"
else
  echo "skip pickle_python_load: no python3"
fi
# JSON text that is not UTF-8 (a file name cachalot wrote as the system gave it): each such byte becomes
# U+FFFD in the pickle, with a warning, so that Python and the pickle reader take it
printf '{"segments":[],"device_traces":[[{"action":"user_defined","addr":0,"size":0,"stream":0,"name":"x\377\376y \303\251"}]]}' >not_utf8.json
t pickle_convert_not_utf8 0 convert not_utf8.json not_utf8.pickle
t pickle_convert_not_utf8_back 0 convert not_utf8.pickle --to json -
# a memo bomb through a dict's key: one 64 KiB key, its dict fetched 1,100 times (72 MB of keys from a
# 70 kB file), refused at the copy bound (64 MiB for a file this small) before memory runs out
if command -v python3 >/dev/null; then
  python3 -c 'import struct, sys
k = b"k" * 65536
sys.stdout.buffer.write(b"\x80\x04}q\x00(X" + struct.pack("<I", len(k)) + k + b"Nu](" + b"h\x00" * 1100 + b"e.")' >keybomb.pickle
  tmem pickle_key_bomb 1 400000 show keybomb.pickle
fi
t pickle_convert_usage_args 2 convert cs.pickle
t pickle_convert_usage_stdout 2 convert cs.pickle -
t pickle_convert_usage_name 2 convert cs.pickle cs.txt
t pickle_convert_usage_to 2 convert cs.pickle x.json --to yaml
t pickle_convert_bad_in 1 convert bad_state.json bad.pickle
no_file pickle_convert_bad_in bad.pickle
t pickle_convert_missing 1 convert no_such.pickle x.json
t pickle_not_either 1 convert not_json.txt x.pickle
# hostile and damaged pickles: each a message and exit 1, nothing run, nothing written
for f in evil_global stack_global build persid bytes memo_bomb deep lying proto6 bad_utf8 huge_long inexact nan \
  list cycle trailing truncated; do
  if [ "$f" = memo_bomb ]; then # the pickle reader's bounds, under a limit of address space too
    tmem "pickle_$f" 1 400000 convert "pk_$f.pickle" "out_$f.json"
  else
    t "pickle_$f" 1 convert "pk_$f.pickle" "out_$f.json"
  fi
  no_file "pickle_$f" "out_$f.json"
done
[ -e pwned ] && fail pickle_evil_global "the hostile pickle ran" || passed=$((passed + 1))
t pickle_plot_evil 1 plot pk_evil_global.pickle -o evil.html
# the pickle cut right after each kind of opcode it holds: a message saying it ends early, exit 1
if command -v python3 >/dev/null; then
  python3 -c '
import pickletools
data = open("pk_shared.pickle", "rb").read()
seen = set()
for op, arg, pos in pickletools.genops(data):
    if op.name not in seen and op.name != "STOP":
        seen.add(op.name)
        open("cut_%s.pickle" % op.name, "wb").write(data[:pos + 1])
'
  for f in cut_*.pickle; do
    "$tool" show "$f" >/dev/null 2>"$work/.err"
    rc=$?
    if [ $rc = 1 ] && grep -Eq "^alloc_snapshot show: $f: (not a whole pickle: it ends inside [A-Z_0-9]+ at byte [0-9]+ \(truncated file\?\)|not a whole pickle: it ends without STOP \(truncated file\?\)|FRAME at byte 2 says [0-9]+ bytes follow, but [0-9]+ do \(truncated or damaged file\?\))$" "$work/.err"; then
      passed=$((passed + 1))
    else
      fail "pickle_$f" "exit $rc: $(head -c 300 "$work/.err")"
    fi
  done
fi

# === summary over ranks and diff --match (issue 19, ranks) ===
# job_r0..3.json: one snapshot per rank, made by hand (job_r2 gzip'ed), each with a 20 MiB segment that
# held a 10 MiB and a 4000000 B allocation at once (peak requested 14485760, allocated 14486016, both
# allocations rounded to 512 B); job_r1's trace begins after its 6 MiB allocation (a wrapped ring:
# peak requested 6291456 + 4000000), job_r2 adds a 2 MiB small segment holding 1000 B (1024 B), job_r3 a
# 16 MiB segment allocated and freed (peak reserved 37748736, 16 MiB over its current 20971520) and an
# oom entry; job_notrace.json is job_r0's segments without a trace. The expected peaks were computed
# apart from the tool too, by walking each trace backwards from the snapshot's end state in Python.
t help_summary 0 summary --help
t usage_summary_no_file 2 summary
t usage_summary_two_stdin 2 summary - job_r0.json -
t usage_diff_bad_match 2 diff --match size job_r0.json job_r1.json
t summary_ranks 0 summary job_r3.json job_r1.json job_r2.json.gz job_r0.json
t summary_ranks_bytes 0 summary --bytes job_r0.json job_r1.json job_r2.json.gz job_r3.json
t summary_ranks_json 0 summary --json job_r2.json.gz job_r0.json job_notrace.json
# Until summary --json was written with cl_json (one line), cJSON_Print wrote it tab-indented; that text is
# kept as golden/summary_ranks_json.cjson: the two must be the same JSON value, members in the same order.
# A file name that is not UTF-8 (a byte 0xff) is written as U+FFFD: the output stays JSON a strict reader
# takes (cJSON wrote the byte as it was).
cp job_r0.json "$(printf 'job_\377r7.json')"
cp job_notrace.json "$(printf 'n\377.json')"
t summary_json_not_utf8 0 summary --json "$(printf 'job_\377r7.json')" "$(printf 'n\377.json')"
if command -v python3 >/dev/null; then
  python3 -c 'import json, sys
load = lambda path: json.load(open(path, encoding="utf-8"), object_pairs_hook=list)
sys.exit(load(sys.argv[1]) != load(sys.argv[2]))' "$dir/golden/summary_ranks_json.out" \
    "$dir/golden/summary_ranks_json.cjson" && passed=$((passed + 1)) ||
    fail summary_ranks_json_same "golden/summary_ranks_json.out is not the JSON value of summary_ranks_json.cjson"
  "$tool" summary --json "$(printf 'job_\377r7.json')" "$(printf 'n\377.json')" | python3 -c 'import json, sys
r = json.loads(sys.stdin.buffer.read().decode("utf-8"))
sys.exit([(x["rank"], x["file"]) for x in r["ranks"]] != [(7, "job_\ufffdr7.json"), ("n\ufffd", "n\ufffd.json")] or
         r["worst"]["file"] != "job_\ufffdr7.json")' && passed=$((passed + 1)) ||
    fail summary_json_not_utf8_parse "summary --json with a name that is not UTF-8: not strict JSON, or other names"
else
  echo "skip summary_ranks_json_same, summary_json_not_utf8_parse: no python3"
fi
t summary_no_trace 0 summary --bytes job_notrace.json job_r0.json
t summary_one 0 summary job_r3.json
# show with several files prints the same table (its golden is summary_ranks'), --top is for one file
t show_ranks 0 show job_r3.json job_r1.json job_r2.json.gz job_r0.json
cmp -s "$dir/golden/show_ranks.out" "$dir/golden/summary_ranks.out" && passed=$((passed + 1)) ||
  fail show_ranks_same "show A B C differs from summary A B C"
t usage_show_ranks_top 2 show --top 3 job_r0.json job_r1.json
check summary_stdin 0 job_r1.json summary --bytes - job_r0.json
# Bad files are reported each with its name, the others still summarised, and the status is 1.
head -c 300 job_r1.json >job_r4.json
t summary_bad_files 1 summary --bytes job_r0.json job_r4.json job_r5.json . job_r3.json
t summary_all_bad 1 summary job_r4.json
# hist_recording.json: a trace replayed on the simulated device with its addresses moved as another
# device might hand them out: the second 20 MiB segment created lies below the first. Its replay here
# has the same layout at other addresses: history pairs all three (and auto picks history), address
# pairs none, and without its segment_alloc entries (hist_no_creation.json) history falls back to
# address order and pairs the two 20 MiB segments the wrong way round.
t diff_hist_replay 0 replay hist_recording.json -o hist_replay.json
t diff_history_auto 0 diff hist_recording.json hist_replay.json
t diff_history_address 0 diff --match address hist_recording.json hist_replay.json
t diff_history_no_creation 0 diff --match history hist_no_creation.json hist_replay.json
t diff_history_same 0 diff --match history cachalot_small.json cachalot_small.json
t diff_torch_address 0 diff --match address torch_small.json.gz cachalot_small.json
# PyTorch's recording of gpt_train (traces/) against its replay, where present.
if [ -f "$real_trace" ]; then
  "$tool" replay "$real_trace" -o gpt_replay.json.gz >/dev/null 2>"$work/.err" &&
    "$tool" diff "$real_trace" gpt_replay.json.gz >gpt_diff.txt 2>>"$work/.err"
  if grep -qx 'segments matched by history (size, order of creation): 137 of 137; auto: only 0 matched by address' gpt_diff.txt &&
    grep -qx 'segments added: 0' gpt_diff.txt && grep -qx 'segments removed: 0' gpt_diff.txt; then
    passed=$((passed + 1))
  else
    fail diff_gpt_history "$(grep '^segments' gpt_diff.txt | tr '\n' ' ') $(head -3 "$work/.err")"
  fi
else
  echo "skip diff_gpt_history: $real_trace not found"
fi
# === end of summary over ranks and diff --match ===

# --- folded: who held the memory at the peak, as folded stacks for flame graphs ---
# folded_stacks.json, made by hand: device 0 frees 2000 B allocated before its trace, then allocates
# 1000 and 3000 B under main;alloc_a, 500 B under a frame whose name holds ';', a newline and a tab
# (its file a ';'), 700 B without frames; its peak is there. Then it frees the 3000 B, frees 800 B
# allocated before the trace and allocates 100 B. Its snapshot holds a 1500 B block the trace never
# allocated (frames: setup) and a block pending free. Device 1 holds 2048 B from before device 0's
# peak to after it. Live at device 0's peak: 4000 under main;alloc_a, 500, 700 under [no stack], 800
# under [allocated before the trace], 1500 under setup: 7500 B; with device 1's 2048 B, 9548 B in all.
# job_r1.json's trace began after its 6 MiB allocation (a wrapped ring).
t help_folded 0 folded --help
t folded 0 folded folded_stacks.json
t folded_device0 0 folded folded_stacks.json --device 0
t folded_device1 0 folded --device 1 folded_stacks.json -o dev1.folded
cmp -s dev1.folded <(printf 'main (g.c:9);gpu1_work (g.c:1) 2048\n') && passed=$((passed + 1)) ||
  fail folded_device1 "dev1.folded: $(cat dev1.folded)"
check folded_stdin 0 folded_stacks.json folded - --device 0
t folded_no_trace 0 folded no_trace.json
t folded_wrapped 0 folded job_r1.json
t folded_torch 0 folded torch_small.json.gz
t folded_missing_device 1 folded folded_stacks.json --device 2
t folded_bad_file 1 folded bad_state.json
t usage_folded_no_file 2 folded
t usage_folded_two_files 2 folded folded_stacks.json job_r1.json
t usage_folded_bad_device 2 folded folded_stacks.json --device x
t usage_folded_empty_output 2 folded folded_stacks.json -o ''
# folded_dup_free.json, made by hand, is a damaged trace that frees two blocks from before it twice
# each: 2000 B at 65536 before the peak and 600 B at 131072 after it. It allocates 4000 B (load), frees
# the 2000 B twice, allocates 3000 B (grow) and frees it, then frees the 600 B twice. Each block was held
# once, so the peak is after grow's alloc (entry 3): 4000 + 3000 + 600 = 7600 B. Counting every free
# put it after entry 0 with 9200 B (the 2000 and 600 B twice each under [allocated before the trace]).
# summary counts every free, so its peak_requested is no check here.
t folded_dup_free 0 folded folded_dup_free.json
sum=$("$tool" folded folded_dup_free.json 2>/dev/null | awk '{ n += $NF } END { print n + 0 }')
[ "$sum" = 7600 ] && passed=$((passed + 1)) || fail folded_dup_free_total "the stacks add up to $sum B, not 7600"
# Memory in proportion to the output: 10000 distinct stacks print about 300 KB, and must fit a 256 MiB
# address space (the tool needs about 25 MiB here); a buffer per line (64 KiB each at least) took 640 MiB.
# A sanitizer's runtime reserves far more address space than that at start: the probe skips it then.
awk -v n=10000 'BEGIN {
  printf "{\"segments\": [], \"device_traces\": [[\n"
  for (k = 1; k <= n; k++)
    printf "%s{\"action\": \"alloc\", \"addr\": %d, \"size\": 100, \"stream\": 0, \"time_us\": %d, \"frames\": [{\"name\": \"f%d\", \"filename\": \"g.c\", \"line\": %d}]}\n",
      (k > 1 ? "," : ""), k * 512, k, k, k
  print "]], \"allocator_settings\": {}}"
}' >many_stacks.json
"$tool" folded many_stacks.json >many_unbounded.folded 2>/dev/null
if (ulimit -v 262144 && "$tool" --help >/dev/null 2>&1); then
  (ulimit -v 262144 && "$tool" folded many_stacks.json >many.folded 2>many.err)
  [ $? = 0 ] && [ "$(wc -l <many.folded)" = 10000 ] && cmp -s many.folded many_unbounded.folded &&
    passed=$((passed + 1)) || fail folded_many_stacks "in 256 MiB: $(head -3 many.err) $(wc -l <many.folded) lines"
else
  [ "$(wc -l <many_unbounded.folded)" = 10000 ] && passed=$((passed + 1)) ||
    fail folded_many_stacks "$(wc -l <many_unbounded.folded) lines"
  echo "skip folded_many_stacks's memory bound: the tool does not start in a 256 MiB address space (a sanitizer?)"
fi
# The lines add up to the peak that summary finds (its peak_requested) for every file with a trace.
for f in folded_stacks.json job_r0.json job_r1.json job_r2.json.gz job_r3.json torch_small.json.gz trace_small.json; do
  sum=$("$tool" folded "$f" 2>/dev/null | awk '{ n += $NF } END { print n + 0 }')
  peak=$("$tool" summary --json "$f" | grep -o '"peak_requested":[0-9]*' | head -1 | cut -d: -f2)
  [ -n "$peak" ] && [ "$sum" = "$peak" ] && passed=$((passed + 1)) ||
    fail "folded_total_${f%%.*}" "the stacks add up to $sum B, summary's peak_requested is $peak"
done

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
