# The counting harness of the cli suite's check scripts, sourced after they have made their arguments
# absolute paths: a scratch folder to work in (removed at exit), C messages, and pass/fail counters.
#   fail NAME WHY   a failed check, said      ok   a passed one      finish TITLE   the counts, the status
export LC_ALL=C
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
passed=0 failed=0
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
}
ok() { passed=$((passed + 1)); }
finish() {
  echo "$1: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
