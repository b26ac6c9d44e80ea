#!/usr/bin/env bash
# remat configured with REMAT_DISTRIBUTED=OFF, as on a LibTorch without c10d's Gloo group (Conan's):
# configure says so in one line, the library and the CLI build, one-process training runs, and every
# data-parallel entry point (--nproc, a launched rank, the library's join) fails with the reason.
# Builds the library and the CLI once more in a scratch folder: a few minutes.
set -euo pipefail
source_dir="$1"
shift  # the rest: cmake arguments of the calling build (compiler, prefix path)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake -S "$source_dir" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DREMAT_DISTRIBUTED=OFF -DREMAT_BUILD_TESTS=OFF \
  -DREMAT_BUILD_EXAMPLES=OFF -DREMAT_BUILD_BENCHMARKS=OFF -DREMAT_INSTALL=OFF "$@" > "$work/configure.out" 2>&1 ||
  { cat "$work/configure.out" >&2; fail "configure failed"; }
grep -q "remat: data-parallel training not built (REMAT_DISTRIBUTED=OFF)" "$work/configure.out" ||
  { cat "$work/configure.out" >&2; fail "configure did not say that data-parallel training is off"; }
[ "$(grep -c "data-parallel" "$work/configure.out")" = 1 ] || fail "more than one configure line on data parallel"
cmake --build "$work/build" --target remat_cli -j "${REMAT_TEST_JOBS:-2}" > "$work/build.out" 2>&1 ||
  { tail -40 "$work/build.out" >&2; fail "the library or the CLI did not build without data parallel"; }
! grep -q "warning:" "$work/build.out" || { grep -A3 "warning:" "$work/build.out" >&2; fail "warnings"; }
remat="$work/build/tools/remat"
tiny=(train --layers 2 --hidden 32 --heads 2 --seq 16 --batch 2 --steps 2 --sample 0)

"$remat" "${tiny[@]}" --json > "$work/one.json" 2> "$work/one.err" || { cat "$work/one.err" >&2; fail "one-process training failed"; }
grep -q '"final_loss"' "$work/one.json" || fail "no final loss from one-process training"

expect_refusal() {  # expect_refusal NAME COMMAND...: exit 1 and the reason, no crash
  local name=$1 status=0
  shift
  "$@" > "$work/$name.out" 2> "$work/$name.err" || status=$?
  [ "$status" = 1 ] || { cat "$work/$name.err" >&2; fail "$name: exit status $status, expected 1"; }
  grep -q "built without data-parallel training (REMAT_DISTRIBUTED=OFF)" "$work/$name.err" ||
    { cat "$work/$name.err" >&2; fail "$name: the error does not say why"; }
}
expect_refusal nproc "$remat" "${tiny[@]}" --nproc 2
# A rank started by another launcher (torchrun) fails when it joins, before training.
expect_refusal rank env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 "$remat" "${tiny[@]}"
grep -q "step" "$work/rank.out" && fail "the rank trained without its group"
echo "without data parallel: all checks passed"
