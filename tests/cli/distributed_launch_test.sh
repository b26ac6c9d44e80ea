#!/usr/bin/env bash
# The ways `remat train` runs data-parallel: ranks it starts itself (--nproc), and ranks started by
# torchrun, whose agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True: every rank a client,
# keys under /worker/attempt_<restart>) — emulated here with Python's TCPStore, as torchrun's agent
# does, because Debian's torchrun 1.13 fails under Python 3.11 before starting any program.
source "$(dirname "$0")/lib.sh"
trap 'kill $(jobs -p) 2> /dev/null || true; rm -rf "$work"' EXIT
run=(train "${tiny[@]}" --sample 0 --dropout 0 --dist-timeout 60)
run3=("${run[@]}" --steps 3)
loss_of() { /usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["ranks"], "%.4f" % d["final_loss"])' "$1"; }

"$remat" "${run3[@]}" --nproc 2 --json > "$work/nproc.json" 2> "$work/nproc.err" || { cat "$work/nproc.err" >&2; fail "--nproc 2 failed"; }
read -r ranks loss2 <<< "$(loss_of "$work/nproc.json")"
[ "$ranks" = 2 ] || fail "--nproc 2 ran $ranks ranks"
grep -q "tok/s over all ranks" "$work/nproc.err" || fail "no throughput over all ranks reported"
# The global batch's loss, as one process with the whole batch (4) sees it.
"$remat" train --layers 2 --hidden 32 --heads 2 --seq 16 --batch 4 --steps 3 --sample 0 --dropout 0 --json > "$work/one.json" 2> /dev/null
read -r _ loss1 <<< "$(loss_of "$work/one.json")"
close() { /usr/bin/python3 -c 'import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 1e-3)' "$1" "$2"; }
close "$loss1" "$loss2" || fail "2 ranks report loss $loss2, one process with their batch $loss1"

# Rank 0 alone saves; every rank resumes from the saved state.
"$remat" "${run3[@]}" --nproc 2 --save-state "$work/state" > /dev/null 2> "$work/save.err" || { cat "$work/save.err" >&2; fail "saving failed"; }
[ "$(cat "$work/state/latest")" = "step-000003" ] || fail "2 ranks did not save step 3"
"$remat" "${run[@]}" --nproc 2 --resume "$work/state" --steps 1 > "$work/resume.out" 2> "$work/resume.err" ||
  { cat "$work/resume.err" >&2; fail "resuming 2 ranks failed"; }
grep -q "resumed at step 3" "$work/resume.out" || fail "the ranks did not resume at step 3"

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
/usr/bin/python3 -c "
import datetime, time, torch.distributed as d
args = ('127.0.0.1', $port, 3, True, datetime.timedelta(seconds=60))
try:  # PyTorch 2.x defaults to the libuv backend, which Debian's build lacks; 1.13 has no such option
    store = d.TCPStore(*args, wait_for_workers=False, use_libuv=False)
except TypeError:
    store = d.TCPStore(*args, wait_for_workers=False)
time.sleep(60)" &
sleep 2
export TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
RANK=1 "$remat" "${run3[@]}" > /dev/null 2> "$work/agent1.err" &
other=$!
RANK=0 "$remat" "${run3[@]}" --json > "$work/agent.json" 2> "$work/agent0.err" || { cat "$work/agent0.err" >&2; fail "rank 0 under an agent store failed"; }
wait $other || { cat "$work/agent1.err" >&2; fail "rank 1 under an agent store failed"; }
read -r ranks loss_agent <<< "$(loss_of "$work/agent.json")"
[ "$ranks" = 2 ] && close "$loss_agent" "$loss2" || fail "under an agent store: $ranks ranks, loss $loss_agent (expected $loss2)"
echo "distributed launch: all checks passed"
