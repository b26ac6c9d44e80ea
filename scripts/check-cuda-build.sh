#!/usr/bin/env bash
# Compiles and links all of remat (library, tools, tests, examples, benchmarks) against Debian 13's
# CUDA build of LibTorch 2.6 (libtorch-cuda-dev, contrib), on a machine without a GPU: the code only a
# CUDA LibTorch compiles (src/memory/cuda_memory.cpp, CUDA paths of the tests) is built before a GPU
# runs it. Nothing is run. Needs root (chroot, mounts); arguments are passed to cmake --build.
#
# Its own trixie chroot, $REMAT_DEBIAN13_CUDA_ROOT (default /var/cache/remat/debian13-cuda): a copy of
# scripts/test-chroot.sh's trixie chroot where that exists, else one that script makes; the build goes to
# build-debian13-cuda/. CUDA's libraries come from non-free, which the copy's sources gain. What it
# installs downloads 2.4 GB and takes 6 GB installed (most of it nvidia-cuda-dev and LibTorch).
#
# cuDNN: Debian's nvidia-cudnn only downloads it from NVIDIA when installed, which a build machine
# often cannot reach; remat calls no cuDNN, so without it an empty placeholder package stands in, and
# executables link with --allow-shlib-undefined (cuDNN's symbols stay unresolved inside libtorch_cuda).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --in-chroot ]; then  # the part that runs inside the chroot, from the checkout
  build_dir=$2
  shift 2
  if ! grep -q '^deb .* trixie .*non-free' /etc/apt/sources.list; then
    sed -i '/^deb .* trixie /s/$/ non-free/' /etc/apt/sources.list
  fi
  placeholder=""
  if ! dpkg-query -W -f='${Status}' nvidia-cudnn 2>/dev/null | grep -q "install ok installed"; then
    deb=$(mktemp -d)
    mkdir -p "$deb/DEBIAN"
    cat > "$deb/DEBIAN/control" <<'EOF'
Package: nvidia-cudnn
Version: 9.0.0.312~cuda12+remat.placeholder
Architecture: amd64
Maintainer: remat <remat@localhost>
Description: placeholder for cuDNN, installed by remat's scripts/check-cuda-build.sh
 Lets libtorch-cuda-2.6 install where NVIDIA's download cannot be reached. Holds no
 library: enough to compile and link against LibTorch, not to run it.
EOF
    dpkg-deb --build "$deb" "$deb/nvidia-cudnn-placeholder.deb" > /dev/null
    dpkg -i "$deb/nvidia-cudnn-placeholder.deb" > /dev/null
    apt-mark hold nvidia-cudnn > /dev/null
    rm -rf "$deb"
  fi
  if dpkg-query -W -f='${Version}' nvidia-cudnn | grep -q remat.placeholder; then
    placeholder="-Wl,--allow-shlib-undefined"
    echo "check-cuda-build: cuDNN is a placeholder (not installed): link only, nothing can run" >&2
  fi
  REMAT_TORCH_PACKAGE=libtorch-cuda-dev scripts/setup.sh
  mkdir -p "$build_dir"
  # Tests are listed when ctest runs, not after linking: the binaries cannot start here.
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXE_LINKER_FLAGS="$placeholder" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST > "$build_dir/configure.log" 2>&1 ||
    { tail -30 "$build_dir/configure.log" >&2; echo "check-cuda-build: cmake failed (log: $build_dir/configure.log)" >&2; exit 1; }
  # CMakeLists.txt picks the CUDA sources when the Torch package defines the torch_cuda target.
  grep -q "src/memory/cuda_memory.cpp" "$build_dir/CMakeFiles/remat.dir/build.make" ||
    { echo "check-cuda-build: this LibTorch defines no torch_cuda target: CMakeLists.txt would compile no CUDA code" >&2; exit 1; }
  # The linker's notes about the missing cuDNN, once per executable, are noise here; the log has all.
  set +e
  cmake --build "$build_dir" -j "$(nproc)" "$@" 2>&1 | tee "$build_dir/build.log" | grep -v "libcudnn.so.9, needed by"
  status=${PIPESTATUS[0]}
  set -e
  [ "$status" -eq 0 ] || { echo "check-cuda-build: the build failed (log: $build_dir/build.log)" >&2; exit "$status"; }
  warnings=$(grep "warning:" "$build_dir/build.log" | grep -vc "libcudnn.so.9, needed by" || true)
  cuda_tests=$(nm -C "$build_dir/tests/remat_tests" | grep -c "_CUDA_Test::TestBody()$" || true)
  allocator_symbols=$(nm -C "$build_dir/libremat.a" 2>/dev/null | grep -c " U .*CUDACachingAllocator" || true)
  echo "check-cuda-build: built against $(dpkg-query -W -f='${Package} ${Version}' libtorch-cuda-dev):" \
    "$cuda_tests *_CUDA tests in remat_tests; libremat.a uses $allocator_symbols CUDACachingAllocator symbol(s);" \
    "$warnings compiler warnings (log: $build_dir/build.log)"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || { echo "check-cuda-build: needs root (chroot and bind mounts); run it with sudo" >&2; exit 2; }
root=${REMAT_DEBIAN13_CUDA_ROOT:-/var/cache/remat/debian13-cuda}
base=${REMAT_DEBIAN13_ROOT:-/var/cache/remat/debian13}
build_dir=${REMAT_DEBIAN13_CUDA_BUILD:-build-debian13-cuda}
start=$SECONDS
if [ ! -e "$root/.remat-debootstrap-complete" ] && [ -e "$base/.remat-debootstrap-complete" ]; then
  echo "check-cuda-build: copying $base to $root (once)" >&2
  rm -rf "$root.partial"
  mkdir -p "$root.partial"
  for entry in "$base"/* "$base"/.[!.]*; do
    [ -e "$entry" ] || continue
    # test-chroot.sh binds /proc, /sys, /dev and the checkout there while it runs: not copied.
    if mountpoint -q "$entry"; then mkdir -p "$root.partial/$(basename "$entry")"; else cp -a "$entry" "$root.partial/"; fi
  done
  rm -rf "$root"
  mv "$root.partial" "$root"
fi
# test-chroot.sh makes the chroot where none exists, mounts, and runs the command inside.
arguments=""
[ $# -eq 0 ] || arguments=$(printf '%q ' "$@")
status=0
REMAT_CHROOT_ROOT=$root REMAT_CHROOT_COMMAND="scripts/check-cuda-build.sh --in-chroot $build_dir $arguments" \
  scripts/test-chroot.sh trixie || status=$?
echo "check-cuda-build: $((SECONDS - start)) s in all (exit $status)" >&2
exit "$status"
