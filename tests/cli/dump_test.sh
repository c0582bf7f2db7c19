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
exec 3>&-
wait
echo "dump: 1 passed, 0 failed"
