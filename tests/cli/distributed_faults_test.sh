#!/usr/bin/env bash
# Data-parallel training's failures are clear and quick: a rank killed mid-run makes the survivor
# exit non-zero with a clear message within the timeout + 10 s; ranks started with different
# --layers stop at the start naming the difference; bad environments and ports are named.
source "$(dirname "$0")/lib.sh"
trap 'kill $(jobs -p) 2> /dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
run=(train --hidden 32 --heads 2 --seq 16 --batch 2 --sample 0 --dist-timeout 20)

# kill -9 of rank 1 mid-run.
port=$(free_port)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$remat" "${run[@]}" --steps 100000 > /dev/null 2>&1 &
victim=$!
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$remat" "${run[@]}" --steps 100000 > "$work/survivor.out" 2>&1 &
survivor=$!
for _ in $(seq 100); do grep -q "^step" "$work/survivor.out" 2> /dev/null && break; sleep 0.2; done
grep -q "^step" "$work/survivor.out" || { cat "$work/survivor.out" >&2; fail "the ranks never started training"; }
kill -9 $victim
start=$(date +%s)
if wait $survivor; then fail "the survivor exited 0 after its peer was killed"; fi
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -le 30 ] || fail "the survivor took $elapsed s to stop (timeout 20 s + 10)"
grep -q "Another rank probably exited or was killed" "$work/survivor.out" ||
  { tail -5 "$work/survivor.out" >&2; fail "no clear message from the survivor"; }
echo "killed rank: the survivor stopped in $elapsed s"

# Different --layers on the two ranks: both stop at the start, naming it.
port=$(free_port)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$remat" "${run[@]}" --steps 1 --layers 3 > "$work/r1.out" 2>&1 &
other=$!
if RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$remat" "${run[@]}" --steps 1 --layers 2 > "$work/r0.out" 2>&1; then
  fail "mismatched --layers were accepted"
fi
if wait $other; then fail "rank 1 accepted mismatched --layers"; fi
for out in r0 r1; do
  grep -q "the ranks disagree on the training run: rank 0 has 'model layers 2, .*', rank 1 has 'model layers 3, " "$work/$out.out" ||
    { cat "$work/$out.out" >&2; fail "$out: no error naming the difference"; }
done

expect_error() {  # expect_error "message" env... -- : runs remat train with that environment
  local message="$1"; shift
  if env "$@" "$remat" "${run[@]}" --steps 1 > "$work/err.out" 2>&1; then fail "expected an error with $*"; fi
  grep -qF -- "$message" "$work/err.out" || { cat "$work/err.out" >&2; fail "expected '$message'"; }
}
expect_error "the environment variable RANK='5' is not a whole number in [0, 1]" RANK=5 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999
expect_error "RANK must be set to a number in [0, WORLD_SIZE) = [0, 2), got nothing" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999
expect_error "MASTER_ADDR and MASTER_PORT must name rank 0's machine" RANK=0 WORLD_SIZE=2
expect_error "WORLD_SIZE='two' is not a whole number" RANK=0 WORLD_SIZE=two
# A port another program holds.
python3 -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' > "$work/port" &
for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
expect_error "rank 0 cannot host the store on port $(cat "$work/port")" RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(cat "$work/port")"
# c10d's own warnings (a line per address it failed to bind) stay off unless TORCH_CPP_LOG_LEVEL asks.
if grep -q 'c10d.*failed to bind' "$work/err.out"; then cat "$work/err.out" >&2; fail "c10d's warnings reached the terminal"; fi
expect_error "rank 0 cannot host the store" TORCH_CPP_LOG_LEVEL=INFO RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$(cat "$work/port")"
grep -q 'c10d.*failed to bind' "$work/err.out" || { cat "$work/err.out" >&2; fail "TORCH_CPP_LOG_LEVEL=INFO did not bring c10d's log back"; }
# Nobody at the master's port: rank 1 gives up after its timeout (--dist-timeout 20).
port=$(free_port)
start=$(date +%s)
expect_error "rank 1 cannot reach the store at 127.0.0.1:$port" RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
# The bound tells a report from a hang: LibTorch 2.6's store client retries with back-off, and with
# the suite's other tests loading both cores its last try has landed past the timeout + 10 s.
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -le 40 ] || fail "an unreachable master took $elapsed s to report (timeout 20 s + 20)"
# An address of no machine: rank 0 names it (whether its store or Gloo's connection fails first
# depends on the network), not "the ranks did not all meet".
expect_error "MASTER_ADDR (10.255.255.1) is " RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.255.255.1 MASTER_PORT="$(free_port)"

# kill -9 of the --nproc launcher: its ranks go with it (no orphans training on).
"$remat" "${run[@]}" --steps 100000 --nproc 2 > "$work/launcher.out" 2>&1 &
launcher=$!
for _ in $(seq 100); do grep -q "^step" "$work/launcher.out" 2> /dev/null && break; sleep 0.2; done
ranks=$(pgrep -P $launcher || true)
[ -n "$ranks" ] || { cat "$work/launcher.out" >&2; fail "the launcher started no ranks"; }
kill -9 $launcher
for _ in $(seq 50); do
  alive=0
  for pid in $ranks; do kill -0 "$pid" 2> /dev/null && alive=1; done
  [ $alive -eq 0 ] && break
  sleep 0.2
done
[ $alive -eq 0 ] || fail "ranks $ranks still run 10 s after their launcher was killed"
echo "killed launcher: its ranks stopped"
echo "distributed faults: all checks passed"
