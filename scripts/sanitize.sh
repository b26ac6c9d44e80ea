#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over what a user's program runs of remat: the library
# and the memory tracker built sanitized in ./build-sanitize, then the checkpoint tests (every
# checkpoint, selective and module test, and the U-Net of tests/own_model_test.cpp), the examples,
# and every documented snippet (tests/consumer/run.sh builds and runs them with the same flags).
# ASAN_OPTIONS has detect_stack_use_after_return=1: a callable that captured a caller's locals by
# reference is caught when the checkpoint's backward calls it. Any report fails the run.
#   scripts/sanitize.sh             everything above
#   REMAT_SANITIZE_TESTS='OwnModel*' scripts/sanitize.sh    a GoogleTest filter over the checkpoint tests
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
start=$SECONDS
sanitizers="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$sanitizers" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DREMAT_BUILD_TOOLS=OFF -DREMAT_BUILD_BENCHMARKS=OFF > /dev/null
cmake --build build-sanitize -j "$(nproc)" --target remat_checkpoint_tests remat_checkpoint_example remat_plan_your_model remat_unet \
  remat_encoder_decoder
echo "sanitize: built in $((SECONDS - start)) s"
# LibTorch's own registries live as long as the process: leaks are not what this looks for.
export ASAN_OPTIONS=detect_stack_use_after_return=1:detect_leaks=0:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export REMAT_THREAD_WARNING=0
build-sanitize/tests/remat_checkpoint_tests --gtest_filter="${REMAT_SANITIZE_TESTS:-*}" --gtest_brief=1
for example in checkpoint_example plan_your_model unet encoder_decoder; do
  echo "sanitize: remat_$example"
  # shellcheck disable=SC2086
  build-sanitize/examples/remat_$example > build-sanitize/example.log 2>&1 || { tail -60 build-sanitize/example.log; exit 1; }
done
tests/consumer/run.sh build-sanitize
echo "sanitize: clean in $((SECONDS - start)) s"
