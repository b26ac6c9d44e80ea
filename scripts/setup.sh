#!/usr/bin/env bash
# Installs the Debian 12 packages remat builds and runs with; installs nothing that is already there.
# libopenblas0-pthread matters: without it LibTorch falls back to reference BLAS (~40x slower).
set -euo pipefail
packages=(cmake g++ make libtorch-dev libopenblas0-pthread libgtest-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libgloo-dev  # headers of c10d's ProcessGroupGloo (remat/distributed.h); the code is in libtorch_cpu
  fortunes-min fortunes  # the default training corpus (English text)
  gnuplot-nox fonts-dejavu-core  # remat bench's and remat trace's plots (PNG and SVG)
  python3-torch)  # bench/pytorch_side_by_side.py: the same LibTorch from Python, for comparisons
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "remat setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
