#!/usr/bin/env bash
# The README's quick starts, run as written: the commands and the program are read out of README.md, not
# copied here, so that the README cannot drift from what works.
#   C: a copy of the source tree is built and installed with the README's commands (`sudo meson install`,
#   `sudo ldconfig`: into /usr/local and /etc, which are overlaid with scratch layers in a mount namespace
#   of this test's own, so nothing outside it changes; in a chroot, where no such namespace can be made,
#   the install is real and uninstalled at the end), then the README's program is compiled both ways
#   and run; ldd says the first finds libcachalot.so.0 by the cache ldconfig wrote and the second has no
#   libcachalot.so at all.
#   Who holds the memory, without a GPU: the demo writes its snapshot where the variables say and says so,
#   the explorer page is written, and the folded stacks add up and name the demo's holders.
#   PyTorch: in a fresh venv of Debian's python3 (no system packages), `pip install --no-build-isolation .`
#   first fails with the one line that names meson-python; then the README's lines run in order. Where no
#   package index can be reached (CI), its `pip install meson-python meson ninja` is answered from Debian's
#   python3-mesonpy, meson and ninja (a .pth file, said in the log). The package then imports, its
#   alloc_snapshot command runs, and `import cachalot.torch` without torch says what to install.
# Needs root (the mounts); skipped (exit 77) otherwise. Usage: readme_test.sh SOURCE_DIR SCRATCH_DIR
set -eu -o pipefail
src=$(cd "$1" && pwd)
scratch=$2
[ "$(id -u)" -eq 0 ] || { echo "readme_test: needs root for its mount namespace: skipped"; exit 77; }
command -v unshare >/dev/null || { echo "readme_test: no unshare: skipped"; exit 77; }
rm -rf "$scratch"
mkdir -p "$scratch"
scratch=$(cd "$scratch" && pwd)

# section TITLE LANG: the first ```LANG block under the README heading that starts with TITLE
section() {
  python3 - "$src/README.md" "$1" "$2" <<'PY'
import sys
text, title, lang = open(sys.argv[1], encoding="utf-8").read(), sys.argv[2], sys.argv[3]
part = text.split("\n## " + title, 1)[1].split("\n## ", 1)[0]
print(part.split("```" + lang + "\n", 1)[1].split("```", 1)[0], end="")
PY
}
section "Quick start: C" sh >"$scratch/c.sh"
section "Quick start: C" c >"$scratch/app.c"
section "Quick start: who holds the memory" sh >"$scratch/debug.sh"
section "Quick start: PyTorch" sh >"$scratch/torch.sh"
echo "--- the README's commands"
cat "$scratch/c.sh"

# The tree as a checkout has it (tracked and untracked files that git does not ignore), without builds.
mkdir "$scratch/src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) |
    tar -xf - -C "$scratch/src"
else
  tar -C "$src" --exclude='./build*' -cf - . | tar -xf - -C "$scratch/src"
fi
cp "$scratch/app.c" "$scratch/src/app.c"

cat >"$scratch/inside.sh" <<'SH'
set -eu -o pipefail
scratch=$1
mode=$2
if [ "$mode" = overlay ]; then
  mount -t tmpfs tmpfs "$scratch/layers"
  for d in usr/local etc; do
    n=${d//\//_}
    mkdir -p "$scratch/layers/$n-up" "$scratch/layers/$n-work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$scratch/layers/$n-up,workdir=$scratch/layers/$n-work" "/$d"
  done
else
  # a chroot that is thrown away after the run: the install is real, and taken back at the end
  trap 'ninja -C "$scratch/src/build" uninstall >/dev/null 2>&1; ldconfig' EXIT
fi
# root without sudo (a minimal Debian): the README's sudo is the command itself
command -v sudo >/dev/null || { sudo() { "$@"; }; export -f sudo; }
cd "$scratch/src"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if ! bash -eu -o pipefail "$scratch/c.sh" >"$scratch/c.log" 2>&1; then
  tail -30 "$scratch/c.log"
  echo "readme_test: the C quick start failed"
  exit 1
fi
grep -v '^\[\|^ninja\|^Installing\|^Compiling\|^Linking' "$scratch/c.log" | grep -E '^cachalot .*freed' || true
echo "--- ldd app"
ldd ./app | grep cachalot
ldd ./app | grep -q 'libcachalot\.so\.0 => /usr/local/lib' || { echo "readme_test: app does not find the installed libcachalot.so.0"; exit 1; }
if ldd ./app-static | grep -q libcachalot; then echo "readme_test: app-static needs libcachalot.so"; exit 1; fi
echo "--- ldd app-static: no libcachalot"
[ "$(grep -c '^cachalot .*: 1 MiB allocated and freed$' "$scratch/c.log")" -eq 2 ] ||
  { echo "readme_test: the programs did not both print their line"; exit 1; }

echo "--- who holds the memory, without a GPU"
cat "$scratch/debug.sh"
if ! bash -eu -o pipefail "$scratch/debug.sh" >"$scratch/debug.log" 2>&1; then
  tail -30 "$scratch/debug.log"; echo "readme_test: the debugging quick start failed"; exit 1
fi
grep 'snapshot written to demo.json' "$scratch/debug.log" || { echo "readme_test: the demo did not say where"; exit 1; }
# the page holds the snapshot's data: the holders' frames (the page's own script has no such name)
grep -q 'load_weights' demo.html || { echo "readme_test: demo.html does not hold the demo's frames"; exit 1; }
python3 - demo.json demo.folded <<'PY'
import json, sys
snap = json.load(open(sys.argv[1]))
lines = [l.rsplit(" ", 1) for l in open(sys.argv[2]).read().splitlines()]
total = sum(int(b) for _, b in lines)
holders = [name for name in ("load_weights", "grow_kv_cache", "make_scratch") if any(name in s for s, _ in lines)]
assert snap["device_traces"] and snap["segments"], "an empty snapshot"
assert holders == ["load_weights", "grow_kv_cache", "make_scratch"], holders
assert total >= (88 << 20), total
print("demo.folded: %d stacks, %d bytes at the peak, holders %s" % (len(lines), total, ", ".join(holders)))
PY

echo "--- PyTorch, in a venv of Debian's python3"
cat "$scratch/torch.sh"
/usr/bin/python3 -m venv "$scratch/venv"
. "$scratch/venv/bin/activate"
if pip install --no-build-isolation --no-index . >"$scratch/pip-bare.log" 2>&1; then
  echo "readme_test: the package built without meson-python"; exit 1
fi
grep -o 'cachalot: cannot build: meson-python is missing[^;]*' "$scratch/pip-bare.log" | head -1 | grep . ||
  { tail -20 "$scratch/pip-bare.log"; echo "readme_test: no one-line message for the missing meson-python"; exit 1; }
while IFS= read -r line; do
  case $line in ''|'#'*) continue ;; esac
  echo "\$ $line"
  if ! PIP_RETRIES=0 PIP_TIMEOUT=5 bash -eu -o pipefail -c "$line" >"$scratch/line.log" 2>&1; then
    case $line in
      "pip install meson-python meson ninja"*)
        # only an index that cannot be reached or offers nothing is forgiven (CI has none), not another failure
        grep -qiE 'NewConnectionError|Temporary failure in name resolution|Network is unreachable|from versions: none' \
          "$scratch/line.log" || { tail -20 "$scratch/line.log"; echo "readme_test: $line failed"; exit 1; }
        echo "  (no package index reachable: meson-python, meson and ninja from Debian's packages instead)"
        substituted=" (meson-python from Debian's packages: no package index reachable)"
        site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo /usr/lib/python3/dist-packages >"$site/debian-build-tools.pth" ;;
      *) tail -30 "$scratch/line.log"; echo "readme_test: the PyTorch quick start failed at: $line"; exit 1 ;;
    esac
  fi
done <"$scratch/torch.sh"
cd /
python -c 'import cachalot; print("cachalot", cachalot.version(), "imported from", cachalot.__file__)'
# the venv's own command, not the one the C quick start installed into /usr/local/bin
"$VIRTUAL_ENV/bin/alloc_snapshot" --version
if python -c 'import cachalot.torch' 2>"$scratch/no-torch.err"; then
  [ -n "$(python -c 'import torch' 2>&1)" ] && { echo "readme_test: cachalot.torch imported without torch"; exit 1; }
else
  tail -1 "$scratch/no-torch.err"
  grep -q 'cachalot.torch needs PyTorch' "$scratch/no-torch.err" || { echo "readme_test: no clear message without torch"; exit 1; }
fi
echo "readme_test: the PyTorch quick start ran as written${substituted:-}"
SH
mkdir "$scratch/layers"
# A chroot's root is no mount point, so no private mount namespace can be made there (unshare's
# --propagation private fails); a chroot is a scratch machine of its own (scripts/fresh-debian12.sh).
if unshare -m --propagation private true 2>/dev/null; then
  unshare -m --propagation private bash "$scratch/inside.sh" "$scratch" overlay
elif [ "$(stat -c %d:%i /)" != "$(stat -c %d:%i /proc/1/root/. 2>/dev/null)" ]; then
  echo "(in a chroot: no private mount namespace; installing into its /usr/local, and uninstalling after)"
  bash "$scratch/inside.sh" "$scratch" direct
else
  echo "readme_test: no private mount namespace here (unshare -m failed): skipped"
  exit 77
fi
echo "readme_test: ok"
