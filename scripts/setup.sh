#!/usr/bin/env bash
# Installs the Debian packages (12 or 13) remat builds and runs with; installs nothing that is already there.
# libopenblas0-pthread matters: without it LibTorch falls back to reference BLAS (~40x slower).
# REMAT_TORCH_PACKAGE=libtorch-cuda-dev installs Debian's CUDA build of LibTorch instead (contrib, with
# CUDA's libraries from non-free; scripts/check-cuda-build.sh): Debian builds Gloo and PyTorch's Python
# package once per flavour, each conflicting with the other flavour's, so those follow it, and its
# CMake config finds CUDA through nvcc (nvidia-cuda-toolkit), which the package does not depend on.
set -euo pipefail
torch_packages=("${REMAT_TORCH_PACKAGE:-libtorch-dev}")
gloo_package=libgloo-dev python_torch_package=python3-torch
if [ "${torch_packages[0]}" = libtorch-cuda-dev ]; then
  torch_packages+=(nvidia-cuda-toolkit)
  gloo_package=libgloo-cuda-dev python_torch_package=python3-torch-cuda
fi
packages=(cmake g++ make "${torch_packages[@]}" libopenblas0-pthread libgtest-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  "$gloo_package"  # headers of c10d's ProcessGroupGloo (remat/distributed/data_parallel.h); the code is in libtorch_cpu
  fortunes-min fortunes  # the default training corpus (English text)
  gnuplot-nox fonts-dejavu-core  # remat bench's and remat trace's plots (PNG and SVG)
  "$python_torch_package"  # bench/pytorch_side_by_side.py: the same LibTorch from Python, for comparisons
  python3-setuptools  # torch.compile on PyTorch 2.x imports it; python3-torch does not depend on it
  libsleef-dev)  # sleef.h: without it torch.compile's CPU kernels are compiled scalar, without a word
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
