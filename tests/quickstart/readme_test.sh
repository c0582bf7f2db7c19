#!/usr/bin/env bash
# The README's quick starts, run as written: the commands and the program are read out of README.md, not
# copied here, so that the README cannot drift from what works.
#   C: a copy of the source tree is built and installed with the README's commands (`sudo meson install`,
#   `sudo ldconfig`: into /usr/local and /etc, which are overlaid with scratch layers in a mount namespace
#   of this test's own, so nothing outside it changes), then the README's program is compiled both ways
#   and run; ldd says the first finds libcachalot.so.0 by the cache ldconfig wrote and the second has no
#   libcachalot.so at all.
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
echo "--- the README's commands"
cat "$scratch/c.sh"

# The tree as a checkout has it (tracked and untracked files that git does not ignore), without builds.
mkdir "$scratch/src"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - 2>/dev/null) |
    tar -xf - -C "$scratch/src"
else
  tar -C "$src" --exclude='./build*' -cf - . | tar -xf - -C "$scratch/src"
fi
cp "$scratch/app.c" "$scratch/src/app.c"

cat >"$scratch/inside.sh" <<'SH'
set -eu -o pipefail
scratch=$1
mount -t tmpfs tmpfs "$scratch/layers"
for d in usr/local etc; do
  n=${d//\//_}
  mkdir -p "$scratch/layers/$n-up" "$scratch/layers/$n-work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$scratch/layers/$n-up,workdir=$scratch/layers/$n-work" "/$d"
done
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
SH
mkdir "$scratch/layers"
unshare -m --propagation private bash "$scratch/inside.sh" "$scratch"
echo "readme_test: ok"
