#!/usr/bin/env bash
# What every tool's command line promises (a new user's first hour): --version prints "TOOL VERSION"
# and exits 0; --help and -h print the usage on standard output and exit 0, for alloc_snapshot's every
# subcommand and alloc_bench's svg too; a usage error exits 2 with its message on standard error and
# nothing on standard output; and '-' as an output file is standard output, never a file named '-'.
#   tool_options.sh CACHALOT_DEMO ALLOC_SNAPSHOT ALLOC_BENCH VERSION FIXTURES
set -u -o pipefail
demo=$(realpath "$1") snap=$(realpath "$2") bench=$(realpath "$3") version=$4 fixtures=$(realpath "$5")
. "$(dirname "$0")/checks.sh"

# expect NAME STATUS STDOUT_PATTERN STDERR_PATTERN CMD...: the exit status, and each stream matching its
# pattern (grep -E on the whole text; '' wants the stream empty, '*' takes anything).
expect() {
  local name=$1 want=$2 out_pat=$3 err_pat=$4
  shift 4
  "$@" >out.txt 2>err.txt </dev/null
  local got=$? bad=0
  [ "$got" = "$want" ] || { fail "$name" "exit status $got, expected $want ($*)"; bad=1; }
  for s in out err; do
    local pat=$out_pat
    [ $s = err ] && pat=$err_pat
    if [ "$pat" = '*' ]; then
      continue
    elif [ -z "$pat" ]; then
      [ -s $s.txt ] && { fail "$name" "unexpected std$s: $(head -c 200 $s.txt)"; bad=1; }
    elif ! grep -Eq -- "$pat" $s.txt; then
      fail "$name" "std$s does not match '$pat': $(head -c 300 $s.txt)"
      bad=1
    fi
  done
  [ $bad = 0 ] && ok
}

# --- --version, --help, -h and usage errors ---
for tool in cachalot_demo alloc_snapshot alloc_bench; do
  case $tool in
  cachalot_demo) exe=$demo ;;
  alloc_snapshot) exe=$snap ;;
  alloc_bench) exe=$bench ;;
  esac
  expect "${tool}_version" 0 "^$tool $version\$" '' "$exe" --version
  [ "$(wc -l <out.txt)" = 1 ] && ok || fail "${tool}_version" "more than one line: $(cat out.txt)"
  expect "${tool}_help" 0 "^usage: $tool" '' "$exe" --help
  expect "${tool}_h" 0 "^usage: $tool" '' "$exe" -h
  expect "${tool}_usage" 2 '' "^$tool.*--no-such-option" "$exe" --no-such-option
done
for cmd in show segments summary diff replay dump plot convert folded; do
  expect "alloc_snapshot_${cmd}_help" 0 "^usage: alloc_snapshot $cmd" '' "$snap" "$cmd" --help
  expect "alloc_snapshot_${cmd}_h" 0 "^usage: alloc_snapshot $cmd" '' "$snap" "$cmd" -h
  expect "alloc_snapshot_${cmd}_usage" 2 '' "^alloc_snapshot $cmd: unknown option" "$snap" "$cmd" --no-such-option
done
expect alloc_snapshot_help_cmd 0 '^usage: alloc_snapshot folded' '' "$snap" help folded
expect alloc_snapshot_no_command 2 '' '^usage: alloc_snapshot' "$snap"
expect alloc_bench_svg_help 0 '^usage: alloc_bench svg' '' "$bench" svg --help
expect alloc_bench_svg_h 0 '^usage: alloc_bench svg' '' "$bench" svg -h
expect alloc_bench_svg_usage 2 '' '^alloc_bench: svg wants' "$bench" svg only-one
expect cachalot_demo_stray 2 '' "^cachalot_demo: unknown argument 'stray'" "$demo" stray

# --- '-' is standard output, for every output a tool names ---
# stdout_only NAME PATTERN CMD...: exit 0, PATTERN on standard output, and no file named '-'.
stdout_only() {
  local name=$1 pat=$2
  shift 2
  rm -f ./-
  expect "$name" 0 "$pat" '*' "$@"
  [ -e ./- ] && fail "$name" "a file named '-' was written"
}
cp "$fixtures/trace_small.json" "$fixtures/cachalot_small.json" "$fixtures/folded_stacks.json" .
run_bench=("$bench" --allocators cachalot-sim --workload pair --ops 20 --repeat 1)
stdout_only alloc_bench_csv '^workload,allocator,status,' "${run_bench[@]}" --csv -
head -1 out.txt | grep -q '^workload,allocator,status,' && ok || fail alloc_bench_csv "stdout is not the CSV alone"
grep -q '^pair-4KiB ' err.txt && ok || fail alloc_bench_csv "the table did not go to stderr"
stdout_only alloc_bench_json '"tool": "alloc_bench"' "${run_bench[@]}" --json -
if command -v python3 >/dev/null; then
  python3 -m json.tool out.txt >/dev/null && ok || fail alloc_bench_json "stdout is not the JSON alone"
fi
stdout_only alloc_bench_svg '^<svg ' "${run_bench[@]}" --svg -
tail -1 out.txt | grep -q '^</svg>$' && ok || fail alloc_bench_svg "stdout does not end the SVG"
"${run_bench[@]}" --csv bench.csv >/dev/null
stdout_only alloc_bench_svg_cmd '^<svg ' "$bench" svg bench.csv -
expect alloc_bench_two_stdout 2 '' "only one of them may be '-'" "${run_bench[@]}" --csv - --json -
stdout_only replay_o '^\{"segments":' "$snap" replay trace_small.json -o -
stdout_only convert_out '^\{"segments":' "$snap" convert --to json cachalot_small.json -
stdout_only plot_o '</html>' "$snap" plot cachalot_small.json -o -
stdout_only folded_o '^device 0;' "$snap" folded folded_stacks.json -o -
stdout_only folded_default '^device 0;' "$snap" folded folded_stacks.json
# A standard output that cannot be written (/dev/full): exit 1, and the reason said once.
if [ -c /dev/full ]; then
  full() {
    local name=$1
    shift
    "$@" >/dev/full 2>err.txt </dev/null
    local got=$? n
    n=$(grep -c 'standard output.*No space left on device' err.txt)
    [ "$got" = 1 ] && [ "$n" = 1 ] && ok || fail "$name" "exit $got, the reason said $n times: $(grep -v '^pair' err.txt)"
  }
  full alloc_bench_json_full "${run_bench[@]}" --json -
  full replay_o_full "$snap" replay trace_small.json -o -
  full convert_out_full "$snap" convert --to json cachalot_small.json -
  full folded_o_full "$snap" folded folded_stacks.json
else
  echo "skip *_full: no /dev/full"
fi

finish "tool options"
