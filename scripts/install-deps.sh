#!/usr/bin/env bash
# Installs what building and testing cachalot needs on Debian 12 (as root, or through sudo).
# The CUDA toolkit is optional: with /usr/local/cuda present the CUDA backend and the gpu suite are built.
set -eu
pkgs="meson ninja-build pkg-config gcc clang libclang-rt-14-dev uthash-dev libcmocka-dev libcjson-dev libdw-dev zlib1g-dev
  python3 python3-venv python3-mesonpy locales"
# headless Chromium for the explorer suite (tests/explorer: alloc_snapshot plot's page, driven in a browser)
pkgs="$pkgs chromium"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq $missing >/dev/null
