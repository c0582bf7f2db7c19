#!/usr/bin/env bash
# Installs the build into a scratch root and builds clients of it three ways:
#   1. with `pkg-config --cflags --libs cachalot` against the installed cachalot.pc, headers and library;
#   2. with `pkg-config --cflags --libs cachalot-static` against libcachalot.a (when the build installs
#      it; and with `pkg-config --static` of cachalot.pc, every private library linked), then runs that
#      program with CACHALOT_SNAPSHOT_AT_EXIT set: the snapshot must be written at exit; and each static
#      libs line must name exactly what libcachalot.a needs, no more and no less;
#   3. as a Meson project that takes this source tree as a subproject (dependency('cachalot')): the parent
#      must get the library and nothing else (no tools, plug-ins, tests, examples), with no -Werror forced
#      on cachalot's own code.
# Also: every header of include/cachalot/ is installed and compiles on its own from the installed tree,
# and libcachalot.so links nothing beyond libc, libpthread, libdl and the CUDA runtime.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR SCRATCH_DIR [DEPS_DIR [libdw|dladdr]]
#        (libdw, the default: the build has libdw's loader, dladdr: -Dlibdw=disabled)
#        (exits 77, skipped, without pkg-config or python3)
set -eu -o pipefail
command -v pkg-config >/dev/null || { echo "pkg-config not found: skipped"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
deps_dir=${4:-}
symbolizer=${5:-libdw}
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
scratch=$3
rm -rf "$scratch"
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd)
dest=$scratch/root

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$scratch/install.log" 2>&1 ||
  { cat "$scratch/install.log"; exit 1; }
pc=$(find "$dest" -name cachalot.pc | head -1)
[ -n "$pc" ] || { echo "no cachalot.pc installed"; exit 1; }
echo "--- installed cachalot.pc"
cat "$pc"
echo "---"
# No path of the build machine in it: every absolute path is under the prefix (${prefix}-relative) or
# the CUDA toolkit's library folder (-L of -lcudart).
if grep -E '(^|[[:space:]])/[^[:space:]]*\.(so|a)([[:space:]]|$)' "$pc"; then
  echo "cachalot.pc names a library file by its path"; exit 1
fi
if grep -F "$build" "$pc" || grep -F "$src" "$pc"; then
  echo "cachalot.pc names the build or source tree"; exit 1
fi

# The .pc as installed, read from the scratch root: its prefix is moved there. (Not PKG_CONFIG_SYSROOT_DIR,
# which would also move -L of the CUDA toolkit, a path outside the install.)
prefix=$(sed -n 's/^prefix=//p' "$pc")
pkgconf() { PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$dest$prefix" "$@"; }
flags=$(pkgconf --cflags --libs cachalot)
echo "pkg-config --cflags --libs cachalot: $flags"

# Every header of the source tree is installed, and each compiles first and alone in its translation unit
# with the installed include folder only.
for h in "$src"/include/cachalot/*.h; do
  name=$(basename "$h")
  installed=$(find "$dest" -path "*/include/cachalot/$name" | head -1)
  [ -n "$installed" ] || { echo "header cachalot/$name not installed"; exit 1; }
  printf '#include <cachalot/%s>\n#include <cachalot/%s>\nint main(void) { return 0; }\n' "$name" "$name" \
    >"$scratch/header.c"
  cc -std=c11 -Wall -Wextra -Werror -fsyntax-only $(pkgconf --cflags cachalot) "$scratch/header.c" ||
    { echo "installed header cachalot/$name does not compile on its own"; exit 1; }
done

cc -std=c11 -Wall -Wextra -Werror "$src/tests/install/client.c" $flags -o "$scratch/client"
libdir=$(dirname "$(find "$dest" -name 'libcachalot.so' | head -1)")
LD_LIBRARY_PATH=$libdir "$scratch/client"

# The library links nothing beyond libc, libpthread, libdl and the CUDA runtime (libdw, for the frames'
# files and lines, is opened at run time).
so=$(find "$dest" -name 'libcachalot.so.*.*.*' -type f | head -1)
needed=$(readelf -d "$so" | sed -n 's/^.*(NEEDED).*\[\(.*\)\]$/\1/p')
echo "libcachalot.so needs: ${needed//$'\n'/ }"
for n in $needed; do
  case $n in
    libc.so.* | ld-linux*.so.* | libpthread.so.* | libdl.so.* | libcudart.so.*) ;;
    *) echo "libcachalot.so links $n: only libc, libpthread, libdl and the CUDA runtime may be linked"; exit 1 ;;
  esac
done

# A static libs line says exactly what libcachalot.a needs: every object of the archive (--whole-archive)
# links with it, so nothing is missing, and each library it names is one the link keeps (--as-needed drops
# one that no object uses, as glibc 2.34's empty libdl and libpthread), so nothing is extra. The program
# is then run with stacks recorded: linked with no libdw, its frames name client.c and a line where
# libdw.so.1 opens here (and the build has the loader), dladdr's names elsewhere.
exact_static_line() { # LABEL LIBS
  local label=$1 libs=$2 tok archive kept n args=() names=() whole=0
  archive=$(find "$dest" -name 'libcachalot.a' | head -1)
  for tok in $libs; do
    case $tok in
      -lcachalot | -l:libcachalot.a) args+=("-Wl,--whole-archive" "$archive" "-Wl,--no-whole-archive"); whole=1 ;;
      -l:*) echo "$label: $tok: a library by file name other than libcachalot.a"; exit 1 ;;
      -l*) args+=("$tok"); names+=("${tok#-l}") ;;
      -L* | -pthread) args+=("$tok") ;;
      *) echo "$label: $tok is none of -L, -l and -pthread"; exit 1 ;;
    esac
  done
  [ "$whole" = 1 ] || { echo "$label: names no libcachalot"; exit 1; }
  # shellcheck disable=SC2046
  cc -std=c11 -g -Wall -Wextra -Werror $(pkgconf --cflags cachalot) "$src/tests/install/client.c" \
    -Wl,--as-needed "${args[@]}" -o "$scratch/client-exact" ||
    { echo "$label: libcachalot.a does not link with this line alone"; exit 1; }
  kept=$(readelf -d "$scratch/client-exact" | sed -n 's/^.*(NEEDED).*\[\(.*\)\]$/\1/p')
  for n in "${names[@]}"; do
    grep -qx "lib$n\.so.*" <<<"$kept" || { echo "$label: names -l$n, which no object of libcachalot.a needs"; exit 1; }
  done
  if grep -q libdw <<<"$kept"; then echo "$label: the program links libdw"; exit 1; fi
  rm -f "$scratch/exact.json"
  CACHALOT_RECORD_HISTORY=100,stacks CACHALOT_SNAPSHOT_AT_EXIT="$scratch/exact.json" \
    "$scratch/client-exact" --leave-live 2>/dev/null || { echo "$label: the program failed"; exit 1; }
  python3 - "$scratch/exact.json" "$label" "$symbolizer" <<'PY'
import ctypes, json, sys
try:
    ctypes.CDLL("libdw.so.1")
    libdw = sys.argv[3] == "libdw"
except OSError:
    libdw = False
frames = [f for e in json.load(open(sys.argv[1]))["device_traces"][0] if e["action"] == "alloc" for f in e["frames"]]
mains = [f for f in frames if f["name"] == "main" and f["filename"].endswith("client.c") and f["line"] > 0]
assert frames, "no frames recorded"
assert bool(mains) == libdw, "expected the frames of %s: %s" % ("libdw" if libdw else "dladdr", frames)
print("%s: links alone, needs no more; its frames by %s" % (sys.argv[2], "libdw, main at client.c:%d" % mains[0]["line"]
                                                          if libdw else "dladdr"))
PY
}

# Static: cachalot-static.pc links libcachalot.a (-l:libcachalot.a, although libcachalot.so lies beside it)
# with what the archive needs; and `pkg-config --static` of cachalot.pc, with -lcachalot, links too.
if [ -n "$(find "$dest" -name 'libcachalot.a' | head -1)" ]; then
  static_flags=$(pkgconf --cflags --libs cachalot-static)
  echo "pkg-config --cflags --libs cachalot-static: $static_flags"
  # shellcheck disable=SC2086
  cc -std=c11 -Wall -Wextra -Werror "$src/tests/install/client.c" $static_flags -o "$scratch/client-static"
  if readelf -d "$scratch/client-static" | grep -q 'libcachalot\.so'; then
    echo "the static client still needs libcachalot.so"; exit 1
  fi
  all_static=$(pkgconf --static --cflags --libs cachalot)
  echo "pkg-config --static --cflags --libs cachalot: $all_static"
  # shellcheck disable=SC2086
  cc -std=c11 -Wall -Wextra -Werror "$src/tests/install/client.c" $all_static -o "$scratch/client-private" ||
    { echo "linking with every private library of pkg-config --static failed"; exit 1; }
  exact_static_line "pkg-config --static --libs cachalot" "$(pkgconf --static --libs cachalot)"
  exact_static_line "pkg-config --libs cachalot-static" "$(pkgconf --libs cachalot-static)"
  env -u LD_LIBRARY_PATH "$scratch/client-static"
  # The snapshot at exit (src/process/export.c) from the statically linked program, %p expanded to its pid.
  rm -f "$scratch"/exit-*.json
  CACHALOT_SNAPSHOT_AT_EXIT="$scratch/exit-%p.json" "$scratch/client-static" --leave-live
  snap=$(find "$scratch" -maxdepth 1 -name 'exit-*.json' | head -1)
  [ -n "$snap" ] || { echo "CACHALOT_SNAPSHOT_AT_EXIT: no snapshot written at exit"; exit 1; }
  # A program that destroys its allocator before exit: no snapshot, and a warning that says why.
  CACHALOT_SNAPSHOT_AT_EXIT="$scratch/none.json" "$scratch/client-static" 2>"$scratch/none.err"
  [ ! -e "$scratch/none.json" ] || { echo "CACHALOT_SNAPSHOT_AT_EXIT: a snapshot with no allocator live"; exit 1; }
  grep -q "^cachalot: warning: CACHALOT_SNAPSHOT_AT_EXIT: no snapshot written to $scratch/none.json: no allocator was live at exit" \
    "$scratch/none.err" || { echo "CACHALOT_SNAPSHOT_AT_EXIT: no warning without a live allocator: $(cat "$scratch/none.err")"; exit 1; }
  echo "destroyed before exit: $(cat "$scratch/none.err")"
  python3 - "$snap" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
segs = s["segments"]
assert len(segs) == 1 and segs[0]["total_size"] == 2 << 20, segs
assert "device_traces" in s and "allocator_settings" in s, list(s)
print("snapshot at exit: %s, %d segment of %d bytes" % (sys.argv[1].rsplit("/", 1)[1], len(segs),
                                                        segs[0]["total_size"]))
PY
else
  echo "libcachalot.a not installed (default_library=shared): static client skipped"
fi

# As a subproject: a project of its own whose subprojects/cachalot is this tree. The parent passes cachalot
# nothing but deps_dir, so what cachalot builds there is what its options' defaults give a parent. The
# parent leaves the builtin werror at its default (a werror=true of the parent's project() would reach
# its subprojects too: Meson's choice, not cachalot's) and turns warnings into errors for its own target.
proj=$scratch/subproject-client
mkdir -p "$proj/subprojects"
ln -s "$src" "$proj/subprojects/cachalot"
cp "$src/tests/install/client.c" "$proj/"
cat >"$proj/meson.build" <<'MESON'
project('cachalot-client', 'c', default_options: ['c_std=c11', 'warning_level=2'])
subproject('cachalot', default_options: ['deps_dir=@DEPS_DIR@'])
executable('client', 'client.c', dependencies: dependency('cachalot'), override_options: ['werror=true'])
MESON
sed -i "s|@DEPS_DIR@|$deps_dir|" "$proj/meson.build"
meson setup "$proj/build" "$proj" >"$scratch/sub-setup.log" 2>&1 || { tail -30 "$scratch/sub-setup.log"; exit 1; }
ninja -C "$proj/build" >"$scratch/sub-build.log" 2>&1 || { tail -30 "$scratch/sub-build.log"; exit 1; }
"$proj/build/client"
meson introspect --targets "$proj/build" >"$scratch/sub-targets.json"
meson introspect --tests "$proj/build" >"$scratch/sub-tests.json"
meson introspect --buildoptions "$proj/build" >"$scratch/sub-options.json"
python3 - "$scratch" "$proj" <<'PY'
import json, os, sys
scratch, proj = sys.argv[1], sys.argv[2]
targets = json.load(open(os.path.join(scratch, "sub-targets.json")))
ours = sorted((t["name"], t["type"]) for t in targets if t.get("subproject") == "cachalot")
print("targets of the cachalot subproject:", ours)
names = {n for n, _ in ours}
assert names == {"cachalot"}, "the parent builds more of cachalot than its library: %s" % sorted(names)
tests = json.load(open(os.path.join(scratch, "sub-tests.json")))
assert not tests, "tests of the subproject are defined: %s" % [t["name"] for t in tests]
opts = {}
for o in json.load(open(os.path.join(scratch, "sub-options.json"))):
    sp, name = o.get("subproject") or "", o["name"]
    if ":" in name:  # Meson 1.0 lists a subproject's options as "cachalot:werror"
        sp, name = name.split(":", 1)
    opts[(sp, name)] = o["value"]
for key in [("cachalot", "werror"), ("cachalot", "fatal_warnings"), ("cachalot", "tools"), ("cachalot", "tests")]:
    print("%s:%s = %s" % (key[0], key[1], opts.get(key)))
# Newer Meson lists a subproject's builtin option only where it differs from the parent's: then the parent's
# value (here the default, false) is the subproject's.
werror = opts.get(("cachalot", "werror"), opts.get(("", "werror")))
assert werror is False, "werror on the subproject: %s" % werror
# The compile commands of cachalot's sources carry no -Werror; the parent's client.c does (its override).
cmds = json.load(open(os.path.join(proj, "build", "compile_commands.json")))
mine = [c for c in cmds if "subprojects/cachalot/" in c["file"]]
assert mine, "no compile command of the subproject's sources"
forced = [c["file"] for c in mine if "-Werror" in c["command"].split()]
assert not forced, "-Werror forced on the subproject's sources: %s" % forced
client = [c for c in cmds if c["file"].endswith("client.c") and c not in mine]
assert client and "-Werror" in client[0]["command"].split(), "the parent's werror=true did not reach client.c"
print("subproject: library only (%d targets), %d sources compiled without -Werror" % (len(ours), len(mine)))
PY
echo "install_test: ok"
