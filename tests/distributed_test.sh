#!/usr/bin/env bash
# Data parallel over real processes on loopback: 2 ranks with batch b and 1 process with batch 2b on
# the same samples end with the same parameters after 5 optimiser steps (fp32; the sums run in
# another order, so to a stated tolerance), for remat's GPT under none, block, every:2 and a
# budget's DP plan (block and every:2 also non-reentrant, whose gradients reach the synchroniser's
# hooks as they come), and for a model checkpointing one module twice; each rank's activation peak is
# the single process's at batch b, to the byte.
set -euo pipefail  # pipefail: a failed compare fails its pipeline
worker="$1"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2> /dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
two_ranks() {  # two_ranks NAME args...: rank 0's output in NAME.out
  local name="$1"; shift
  local port; port=$(free_port)
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port REMAT_DIST_TIMEOUT=60 "$worker" "$@" > /dev/null 2> "$work/$name.err1" &
  local other=$!
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port REMAT_DIST_TIMEOUT=60 "$worker" "$@" > "$work/$name.out" 2> "$work/$name.err0" ||
    { cat "$work/$name.err0" "$work/$name.err1" >&2; fail "$name: rank 0 failed"; }
  wait $other || { cat "$work/$name.err1" >&2; fail "$name: rank 1 failed"; }
}
# Tolerance: AdamW divides by sqrt(v), so the last bits of the summed gradients show in the updates.
tolerance=2e-5

two_ranks net net 2 "$work/net-2.pt"
"$worker" net 1 "$work/net-1.pt" > /dev/null
"$worker" compare "$work/net-1.pt" "$work/net-2.pt" "$tolerance" | sed "s/^/net: /" || fail "net: 2 ranks and 1 process differ"
grep -q "during backward, 0 again" "$work/net.out" || fail "net: buckets reduced again, or none reported"
grep -q "step 4: [0-9]* buckets, [1-9]" "$work/net.out" || fail "net: no bucket overlapped backward: $(cat "$work/net.out")"

two_ranks accumulate net-accumulate 2 "$work/acc-2.pt"
"$worker" net-accumulate 1 "$work/acc-1.pt" > /dev/null
"$worker" compare "$work/acc-1.pt" "$work/acc-2.pt" "$tolerance" | sed "s/^/no_sync accumulation: /" ||
  fail "gradient accumulation under no_sync: 2 ranks and 1 process differ"

# A parameter unused in the first (learning) step and used from step 2 on: its gradient fires more
# often than expected, and still arrives averaged (its bucket reduced at finish, or again, whole).
two_ranks dynamic net-dynamic 2 "$work/dyn-2.pt"
"$worker" net-dynamic 1 "$work/dyn-1.pt" > /dev/null
"$worker" compare "$work/dyn-1.pt" "$work/dyn-2.pt" "$tolerance" | sed "s/^/a parameter first used in step 2: /" ||
  fail "a parameter first used in step 2: 2 ranks and 1 process differ"

for how in none block every:2 budget:50% non-reentrant:block non-reentrant:every:2; do
  name="gpt-${how//[:%]/_}"
  two_ranks "$name" gpt 2 "$work/$name-2.pt" "$how"
  "$worker" gpt 1 "$work/$name-1.pt" "$how" > "$work/$name-single.out"
  "$worker" compare "$work/$name-1.pt" "$work/$name-2.pt" "$tolerance" | sed "s/^/$how: /" || fail "$how: 2 ranks and 1 process differ"
  # Each rank's activation peaks against one process at the per-rank batch (2): the same bytes.
  [ "$how" = "budget:50%" ] && continue  # (each run profiles anew: timing noise may choose another plan)
  "$worker" gpt 1 "$work/$name-b.pt" "$how" 2 > "$work/$name-b.out"
  diff <(grep -o "peak [0-9]*" "$work/$name.out") <(grep -o "peak [0-9]*" "$work/$name-b.out") ||
    fail "$how: a rank's activation peaks differ from one process's at its batch"
done
echo "distributed: all checks passed"
