#!/usr/bin/env bash
# alloc_snapshot convert against Python's pickle and json modules (issue 19):
#  - cachalot's own snapshot files (replay -o, CACHALOT_SNAPSHOT_AT_EXIT) come back byte for byte from
#    JSON -> pickle -> JSON;
#  - for every JSON file given, pickle.load of its pickle equals json.load of it, and the pickle
#    converts back to the JSON convert writes of the file;
#  - for every pickle fixture, json.load of its JSON equals pickle.load of it with tuples and sets as
#    lists and integer keys as strings (what json.dumps makes of them).
#   pickle_roundtrip.sh TOOL FIXTURES_DIR FILE...      (skips, 77, without python3)
set -u -o pipefail
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }
tool=$(realpath "$1") fixtures=$(realpath "$2")
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

"$tool" replay "$fixtures/trace_small.json" -o "$work/own.json" >/dev/null || fail "replay -o"
"$tool" replay "$fixtures/torch_small.json.gz" -o "$work/own2.json.gz" >/dev/null || fail "replay -o .gz"
gunzip -f "$work/own2.json.gz"
owns=("$work/own.json" "$work/own2.json")
# and a CACHALOT_SNAPSHOT_AT_EXIT file, which the library writes (the demo beside the tool, where built)
demo=$(dirname "$tool")/cachalot_demo
if [ -x "$demo" ]; then
  CACHALOT_SNAPSHOT_AT_EXIT="$work/exit.json" "$demo" >/dev/null 2>&1 || fail "the demo with CACHALOT_SNAPSHOT_AT_EXIT"
  owns+=("$work/exit.json")
fi
for own in "${owns[@]}"; do
  "$tool" convert "$own" "$work/own.pickle" && "$tool" convert "$work/own.pickle" "$work/back.json" &&
    cmp "$own" "$work/back.json" || fail "$(basename "$own"): JSON -> pickle -> JSON is not byte-identical"
done

for f in "$@"; do
  name=$(basename "$f")
  case "$name" in
  *.pickle | *.pickle.gz)
    "$tool" convert "$f" "$work/p.json" || { fail "$name: convert to JSON"; continue; }
    python3 - "$f" "$work/p.json" <<'PY' || fail "$name: json.load of its JSON is not pickle.load of it"
import gzip, json, pickle, sys
def plain(v):
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [plain(x) for x in v]
    return v
f = sys.argv[1]
got = pickle.load((gzip.open if f.endswith(".gz") else open)(f, "rb"))
sys.exit(plain(got) != json.load(open(sys.argv[2])))
PY
    ;;
  *)
    "$tool" convert "$f" "$work/j.pickle.gz" && "$tool" convert "$work/j.pickle.gz" "$work/j2.json" &&
      "$tool" convert "$f" "$work/j1.json" || { fail "$name: convert"; continue; }
    cmp -s "$work/j1.json" "$work/j2.json" || fail "$name: the pickle converts back to other JSON"
    python3 - "$f" "$work/j.pickle.gz" <<'PY' || fail "$name: pickle.load of its pickle is not json.load of it"
import gzip, json, pickle, sys
f = sys.argv[1]
want = json.load((gzip.open if f.endswith(".gz") else open)(f, "rt"))
sys.exit(pickle.load(gzip.open(sys.argv[2], "rb")) != want)
PY
    ;;
  esac
done
echo "pickle round trips: $# files, $failed failed"
[ "$failed" -eq 0 ]
