#!/usr/bin/env bash
# alloc_snapshot dump against a live process serving CACHALOT_SNAPSHOT_SOCKET.
# usage: dump_test.sh ALLOC_SNAPSHOT LIVE_PROCESS
set -u
tool=$1 live=$2
dir=$(mktemp -d)
trap 'exec 3>&-; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkfifo "$dir/in"
CACHALOT_SNAPSHOT_SOCKET="$dir/sock" "$live" <"$dir/in" >"$dir/out" &
exec 3>"$dir/in"
for _ in $(seq 100); do grep -q ready "$dir/out" 2>/dev/null && break; sleep 0.05; done
grep -q ready "$dir/out" || fail "the live process did not start"

"$tool" dump --socket "$dir/sock" -o "$dir/snap.json" || fail "dump exited $?"
grep -q '"device_traces":\[\[{"action":"segment_alloc"' "$dir/snap.json" || fail "no trace in the dumped snapshot"
"$tool" show "$dir/snap.json" >/dev/null || fail "show cannot read the dumped snapshot"
# '-' is standard output, not a file named '-'
abs_tool=$(realpath "$tool")
(cd "$dir" && "$abs_tool" dump --socket sock -o - >stdout.json) || fail "dump -o - exited $?"
grep -q '"device_traces":\[\[{"action":"segment_alloc"' "$dir/stdout.json" && [ ! -e "$dir/-" ] ||
  fail "dump -o -: $(head -c 200 "$dir/stdout.json"); $(ls "$dir")"
"$tool" dump --socket "$dir/sock" --stats 0 >"$dir/stats.json" || fail "dump --stats exited $?"
grep -q '"allocation.all.current":2' "$dir/stats.json" || fail "stats: $(head -c 200 "$dir/stats.json")"
"$tool" dump --socket "$dir/sock" -o "$dir/snap.json.gz" || fail "dump to .gz"
gzip -t "$dir/snap.json.gz" || fail "not gzip"
"$tool" dump --socket "$dir/sock" --allocator 3 >/dev/null 2>"$dir/err"
[ $? -eq 1 ] && grep -q "answered" "$dir/err" || fail "a missing allocator: $(cat "$dir/err")"
"$tool" dump --socket "$dir/nowhere" >/dev/null 2>"$dir/err"
[ $? -eq 1 ] && grep -q "cannot connect" "$dir/err" || fail "no socket: $(cat "$dir/err")"
"$tool" dump >/dev/null 2>"$dir/err"
[ $? -eq 2 ] && grep -q -- "--socket PATH is required" "$dir/err" || fail "usage: $(cat "$dir/err")"
[ "$(stat -c %a "$dir/sock")" = 600 ] || fail "socket mode $(stat -c %a "$dir/sock")"
# Another user gets nothing: the socket's mode keeps them out, and with the mode loosened the server's
# credential check (SO_PEERCRED) still does. Needs root to act as another user (nobody, 65534).
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && as_nobody "$tool" --help >/dev/null 2>&1; then
  chmod 755 "$dir"
  as_nobody "$tool" dump --socket "$dir/sock" -o - >"$dir/other.json" 2>"$dir/err"
  [ $? -ne 0 ] && [ ! -s "$dir/other.json" ] || fail "another user read the socket: $(cat "$dir/err")"
  chmod 666 "$dir/sock"
  as_nobody "$tool" dump --socket "$dir/sock" -o - >"$dir/other.json" 2>"$dir/err"
  [ $? -ne 0 ] && [ ! -s "$dir/other.json" ] || fail "another user passed the credential check: $(cat "$dir/err")"
  chmod 600 "$dir/sock"
  "$tool" dump --socket "$dir/sock" -o "$dir/snap2.json" || fail "the owner is refused after another user tried"
  echo "other users refused: by the socket's mode, and by the credential check ($(head -c 160 "$dir/err"))"
else
  echo "SKIP other-user checks: they need root, setpriv and a tool that user nobody can run"
fi
# --- memory history turned on and off from outside (the socket's "record" request) ---
made=0
alloc() { # one more allocation in the live process, waited for
  made=$((made + 1))
  echo "alloc $1" >&3
  for _ in $(seq 100); do grep -q "^allocated $made\$" "$dir/out" && return; sleep 0.05; done
  fail "the live process did not allocate $1 bytes"
}
count() { grep -o -- "$1" "$2" | wc -l; }
"$tool" dump --socket "$dir/sock" --record 50 >"$dir/rec" || fail "--record 50 exited $?"
[ "$(cat "$dir/rec")" = '{"record":50,"stacks":false}' ] || fail "--record 50 replied $(cat "$dir/rec")"
alloc 4096
alloc 8192
"$tool" dump --socket "$dir/sock" -o "$dir/h1.json" || fail "dump after --record exited $?"
# the ring was cleared: two allocs and the dump's own snapshot entry, no frames without stacks
[ "$(count '"action":' "$dir/h1.json")" = 3 ] && [ "$(count '"action":"alloc"' "$dir/h1.json")" = 2 ] &&
  [ "$(count '"size":8192,"stream"' "$dir/h1.json")" = 1 ] && [ "$(count '"frames":\[{' "$dir/h1.json")" = 0 ] ||
  fail "history after --record 50: $(grep -o '"device_traces".*' "$dir/h1.json" | head -c 600)"
"$tool" dump --socket "$dir/sock" --record 20,stacks >"$dir/rec" || fail "--record 20,stacks exited $?"
[ "$(cat "$dir/rec")" = '{"record":20,"stacks":true}' ] || fail "--record 20,stacks replied $(cat "$dir/rec")"
alloc 4096
"$tool" dump --socket "$dir/sock" -o "$dir/h2.json" || fail "dump with stacks exited $?"
# one alloc entry with frames, and the block it handed out with the same frames: two frame lists in all
[ "$(count '"action":' "$dir/h2.json")" = 2 ] && [ "$(count '"frames":\[{"name"' "$dir/h2.json")" = 2 ] ||
  fail "history with stacks: $(grep -o '"device_traces".*' "$dir/h2.json" | head -c 600)"
"$tool" dump --socket "$dir/sock" --record off >"$dir/rec" || fail "--record off exited $?"
[ "$(cat "$dir/rec")" = '{"record":0,"stacks":false}' ] || fail "--record off replied $(cat "$dir/rec")"
alloc 4096
"$tool" dump --socket "$dir/sock" -o "$dir/h3.json" || fail "dump after --record off exited $?"
grep -q '"device_traces":\[\[\]\]' "$dir/h3.json" && [ "$(count '"frames":\[{' "$dir/h3.json")" = 0 ] ||
  fail "history after --record off: $(grep -o '"device_traces".*' "$dir/h3.json" | head -c 300)"
for bad in 0 100000001 5,stack x off,stacks; do
  "$tool" dump --socket "$dir/sock" --record "$bad" >/dev/null 2>"$dir/err"
  [ $? -eq 2 ] && grep -q -- "--record expects" "$dir/err" || fail "--record $bad: $(cat "$dir/err")"
done
"$tool" dump --socket "$dir/sock" --record 5 --stats 0 >/dev/null 2>"$dir/err"
[ $? -eq 2 ] && grep -q "give one" "$dir/err" || fail "--record with --stats: $(cat "$dir/err")"
"$tool" dump --socket "$dir/sock" --allocator 3 --record 5 >/dev/null 2>"$dir/err"
[ $? -eq 1 ] && grep -q "answered: record: no allocator 3 (1 live)" "$dir/err" || fail "record, no allocator: $(cat "$dir/err")"
exec 3>&-
wait
echo "dump: 1 passed, 0 failed"
