#!/usr/bin/env bash
# Runs one of the README's two commands on a fresh minimal Debian 12, as a new machine would: a root made
# with debootstrap (--variant=minbase bookworm), nothing installed by hand, the committed tree in it.
# Usage, as root, from a checkout:
#   scripts/fresh-debian12.sh test    # scripts/test.sh, what CI runs (about 40 minutes on 2 cores)
#   scripts/fresh-debian12.sh demo    # scripts/demo.sh
# The root is made once in ${FRESH_ROOT:-/var/tmp/cachalot-fresh-root} (needs debootstrap, which is
# installed when missing, and the network to Debian's mirror; $DEBIAN_MIRROR picks one) and copied for each
# run, so every run starts from the same fresh machine. Only committed files are copied (git archive HEAD).
set -u
case ${1:-} in test) cmd=scripts/test.sh ;; demo) cmd=scripts/demo.sh ;; *) echo "usage: $0 test|demo" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "$0: run it as root (debootstrap and chroot)" >&2; exit 2; }
src=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || { echo "$0: not in a git checkout" >&2; exit 2; }
root=${FRESH_ROOT:-/var/tmp/cachalot-fresh-root}
if [ ! -f "$root/.complete" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null ||
    { echo "$0: could not install debootstrap" >&2; exit 1; }
  rm -rf "$root"
  echo "making a minimal Debian 12 root in $root (log: $root.log)"
  debootstrap --variant=minbase bookworm "$root" ${DEBIAN_MIRROR:-} >"$root.log" 2>&1 ||
    { echo "$0: debootstrap failed; the last lines of $root.log:" >&2; tail -10 "$root.log" >&2; exit 1; }
  # the host's apt sources, where it has them in the deb822 form, so that apt-get finds the same mirror
  [ -f /etc/apt/sources.list.d/debian.sources ] && cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
  touch "$root/.complete"
fi
run=$(mktemp -d /var/tmp/cachalot-fresh-run.XXXXXX)
cp -a "$root" "$run/root" || exit 1
mkdir -p "$run/root/src/cachalot"
git -C "$src" archive HEAD | tar -x -C "$run/root/src/cachalot"
mount -t proc proc "$run/root/proc" || { echo "$0: could not mount /proc in $run/root" >&2; exit 1; }
# the copy goes only once its /proc is unmounted: rm -rf must never walk into the host's /proc
trap 'umount "$run/root/proc" 2>/dev/null || umount -l "$run/root/proc" 2>/dev/null; ! mountpoint -q "$run/root/proc" && rm -rf "$run/root"' EXIT
chroot "$run/root" /bin/bash -c "cd /src/cachalot && $cmd" 2>&1 | tee "$run/log"
rc=${PIPESTATUS[0]}
echo "fresh Debian 12: $cmd exited $rc (log: $run/log)"
exit "$rc"
