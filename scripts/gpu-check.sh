#!/usr/bin/env bash
# The check on a machine with a CUDA GPU and PyTorch (a pip or conda install of a CUDA build; no
# Debian LibTorch there): builds remat's library and tests against that PyTorch's LibTorch, runs every
# *_CUDA test (each in its own process, one at a time: some time the device) and the checkpoint
# suites (in parallel), and measures the reference GPT on the GPU: remat's policies, fused option and
# 50% plan (a *_CUDA test), then PyTorch's checkpoint, SAC and SDPA (bench/pytorch_gpu_reference.py).
# Logs and figures (8 files: the log, the build's, each test run's, a JUnit file, both sides' figures
# as JSON, a summary) go to $OUT
# when it is set, else build-gpu/out. About 5 minutes on an H200 with 16 cores; exits non-zero when
# anything fails.
#
#   scripts/gpu-check.sh --stage [ROOT]   on a Debian machine with scripts/setup.sh's packages: copies
#                                         what the build needs besides PyTorch (GoogleTest's source,
#                                         nlohmann-json's and CLI11's headers, Gloo's headers) from
#                                         ROOT (default /; e.g. a Debian 13 chroot) into build-gpu-deps/
#   scripts/gpu-check.sh                  on the GPU machine; uses build-gpu-deps/ for what CMake does
#                                         not find there (a machine that cannot download needs it
#                                         carried along: it is ignored by git, ~5 MB)
#
# Only the library and remat_tests are built: the command-line program, the examples and the
# benchmarks need CLI11 and fmt and add nothing device-specific (the program has no device option).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
deps=$repo/build-gpu-deps

if [ "${1:-}" = --stage ]; then
  root=${2:-/}
  rm -rf "$deps"
  mkdir -p "$deps/include" "$deps/gloo"
  for needed in usr/src/googletest usr/include/nlohmann usr/include/CLI usr/include/gloo; do
    [ -e "$root/$needed" ] || { echo "gpu-check: $root/$needed is missing; run scripts/setup.sh there first" >&2; exit 1; }
  done
  cp -a "$root/usr/src/googletest" "$deps/googletest"
  cp -a "$root/usr/include/nlohmann" "$root/usr/include/CLI" "$deps/include/"
  cp -a "$root/usr/include/gloo" "$deps/gloo/"
  for package in googletest nlohmann-json3-dev libcli11-dev libgloo-dev libgloo-cuda-dev; do
    dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Status} ${Package} ${Version}\n' "$package" 2> /dev/null |
      sed -n 's/^install ok installed //p'
  done > "$deps/VERSIONS"
  echo "gpu-check: staged $(du -sh "$deps" | cut -f1) in $deps:" $(cat "$deps/VERSIONS") >&2
  exit 0
fi

build=$repo/build-gpu
out=${OUT:-$build/out}
mkdir -p "$build" "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
start=$SECONDS
step() { echo "gpu-check [$((SECONDS - start)) s]: $*"; }
fail() { echo "gpu-check: $*" >&2; exit 1; }

# PyTorch: where its CMake config is, its C++ ABI, its CUDA, the device.
read -r torch_version torch_cuda torch_prefix torch_include abi < <(python3 - <<'EOF'
import os, torch
print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path,
      os.path.join(os.path.dirname(torch.__file__), "include"), int(torch._C._GLIBCXX_USE_CXX11_ABI))
EOF
) || fail "python3 has no torch"
[ "$torch_cuda" != None ] || fail "torch $torch_version is not a CUDA build"
gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")')
[ -n "$gpu" ] || fail "torch $torch_version sees no CUDA device"
# Torch's CMake config enables CUDA through nvcc.
if ! command -v nvcc > /dev/null; then
  for cuda in /usr/local/cuda/bin /opt/cuda/bin; do [ -x "$cuda/nvcc" ] && PATH=$cuda:$PATH; done
fi
command -v nvcc > /dev/null || fail "no nvcc: the CMake config of a CUDA PyTorch needs the CUDA toolkit"
command -v cmake > /dev/null || fail "no cmake"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
jobs=$(nproc)
step "torch $torch_version (CUDA $torch_cuda, C++11 ABI $abi) on $gpu; $(nvcc --version | tail -1); $(cmake --version | head -1); $jobs cores"

# What CMake needs besides Torch: found on the machine, or made from build-gpu-deps/.
prefix=$build/deps
prefixes="$torch_prefix"
if [ -d "$deps" ]; then
  if [ ! -e "$prefix/.complete" ]; then
    step "building GoogleTest from build-gpu-deps ($(grep -h googletest "$deps/VERSIONS" || echo 'version unknown'))"
    cmake -S "$deps/googletest" -B "$build/googletest" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_GMOCK=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi" > "$build/googletest.log" 2>&1 &&
      cmake --build "$build/googletest" -j "$jobs" >> "$build/googletest.log" 2>&1 &&
      cmake --install "$build/googletest" >> "$build/googletest.log" 2>&1 ||
      { tail -20 "$build/googletest.log"; fail "GoogleTest did not build (log: $build/googletest.log)"; }
    # Header-only libraries: a config file each, naming the target the project links.
    for package in nlohmann_json:nlohmann_json::nlohmann_json CLI11:CLI11::CLI11; do
      name=${package%%:*} target=${package#*:}
      mkdir -p "$prefix/lib/cmake/$name"
      cat > "$prefix/lib/cmake/$name/${name}Config.cmake" <<EOF
if(NOT TARGET $target)
  add_library($target INTERFACE IMPORTED)
  set_target_properties($target PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$deps/include")
endif()
EOF
    done
    touch "$prefix/.complete"
  fi
  prefixes="$prefix;$prefixes"  # first: Torch's prefix may hold other packages' configs (Debian's does)
fi
# c10d's ProcessGroupGloo.hpp (src/distributed/process_group.cpp) includes Gloo's headers; wheels ship them, but
# where they are missing the staged ones stand in.
cxx_flags=""
if [ ! -e "$torch_include/gloo/algorithm.h" ]; then
  [ -e "$deps/gloo/gloo/algorithm.h" ] || fail "$torch_include has no Gloo headers and build-gpu-deps/ none either"
  step "Gloo's headers from build-gpu-deps ($torch_include has none)"
  cxx_flags="-isystem $deps/gloo"
fi

step "configuring"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefixes" \
  -DCMAKE_CXX_FLAGS="$cxx_flags" \
  -DREMAT_BUILD_TOOLS=OFF -DREMAT_BUILD_EXAMPLES=OFF -DREMAT_BUILD_BENCHMARKS=OFF -DREMAT_INSTALL=OFF \
  > "$build/configure.log" 2>&1 || { tail -40 "$build/configure.log"; fail "cmake failed (log: $build/configure.log)"; }
# CMakeLists.txt compiles the CUDA sources when the Torch found defines the torch_cuda target.
grep -rqs "cuda_memory.cpp" "$build/build.ninja" "$build/CMakeFiles/remat.dir/build.make" ||
  fail "the Torch found defines no torch_cuda target: remat would be built without CUDA"

step "building the library and remat_tests ($jobs jobs)"
set +e
cmake --build "$build" --target remat_tests -j "$jobs" > "$out/build.log" 2>&1
status=$?
set -e
grep -E "warning:|error:" "$out/build.log" | sort | uniq -c | sort -rn | head -20
[ "$status" -eq 0 ] || { tail -40 "$out/build.log"; fail "the build failed (log: build.log)"; }

failed=0
step "the *_CUDA tests, one process each, one at a time (the reference GPT comes last)"
ctest --test-dir "$build" -R '_CUDA$' -E ReferenceWorkload -j 1 --output-on-failure --output-junit "$out/cuda-tests.xml" \
  > "$out/cuda-tests.log" 2>&1 || failed=1
tail -25 "$out/cuda-tests.log"
cuda_count=$(grep -c "Test *#" "$out/cuda-tests.log" || true)
[ "$cuda_count" -gt 0 ] || { failed=1; echo "gpu-check: no *_CUDA test ran (did test_main.cpp see no device?)"; }

step "the checkpoint suites ($jobs at a time)"
ctest --test-dir "$build" -R '^(Modes/Checkpoint(Sequential|ed)?|NonReentrantCheckpoint)\.' -j "$jobs" \
  --output-on-failure > "$out/checkpoint-tests.log" 2>&1 || failed=1
tail -6 "$out/checkpoint-tests.log"

step "the reference GPT on the device"
"$build/tests/remat_tests" --gtest_filter='CudaGpt.ReferenceWorkloadPeaksAndStepTimes_CUDA' \
  --gtest_output="json:$out/reference-gpt.json" > "$build/reference-gpt.txt" 2>&1 || failed=1
grep -A8 "^reference GPT" "$build/reference-gpt.txt" || tail -20 "$build/reference-gpt.txt"

step "PyTorch's checkpoint, SAC and SDPA on the same GPT and device (bench/pytorch_gpu_reference.py)"
python3 bench/pytorch_gpu_reference.py --json "$out/pytorch-reference.json" > "$build/pytorch-reference.txt" 2>&1 || failed=1
cat "$build/pytorch-reference.txt"

{
  echo "torch $torch_version, CUDA $torch_cuda, $gpu"
  grep -h "tests passed" "$out/cuda-tests.log" "$out/checkpoint-tests.log" || true
  grep -A8 "^reference GPT" "$build/reference-gpt.txt" || true
  cat "$build/pytorch-reference.txt" 2> /dev/null || true
  echo "total $((SECONDS - start)) s, $([ "$failed" -eq 0 ] && echo "all passed" || echo "FAILURES: see the logs")"
} > "$out/summary.txt"
step "done"
cat "$out/summary.txt"
exit "$failed"
