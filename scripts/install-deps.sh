#!/usr/bin/env bash
# Installs what building and testing cachalot needs on Debian 12 (as root, or through sudo): everything
# any test tier compiles or links, static linking included. The CUDA toolkit is optional: with
# /usr/local/cuda present the CUDA backend and the gpu suite are built.
set -eu
# The build: compilers, Meson, the headers and libraries the library, tools and tests use.
pkgs="meson ninja-build pkg-config gcc clang libclang-rt-14-dev uthash-dev libcmocka-dev libcjson-dev zlib1g-dev"
# libdw1: the library opens libdw.so.1 at run time to name the frames of recorded stacks with files and
# lines, which the snapshot and install tests expect where it opens; libdw-dev only for its headers, which
# a test build compiles src/stats/symbolize.c's own declarations of libdw against. Nothing links libdw.
pkgs="$pkgs libdw1 libdw-dev"
# The Python package (pip, meson-python) and the scripts' helpers; sudo so that the README's install
# commands run as written on a machine where only root exists
pkgs="$pkgs python3 python3-venv python3-mesonpy locales sudo"
# headless Chromium for the explorer suite (tests/explorer: alloc_snapshot plot's page, driven in a browser)
pkgs="$pkgs chromium"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: apt-get install$missing"
log=$(mktemp)
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq $missing; } >"$log" 2>&1; then
  echo "install-deps: apt-get failed; its last lines:" >&2
  tail -20 "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
