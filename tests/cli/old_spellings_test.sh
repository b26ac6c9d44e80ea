#!/usr/bin/env bash
# The old spellings of renamed flags (remat 0.1 kept them for a while) are gone: each is refused
# as an unknown flag, before anything runs, and the new spelling works (docs/cli.md lists them).
source "$(dirname "$0")/lib.sh"
refused() {  # refused OLD command...: the command fails, naming OLD
  local old="$1"; shift
  if "$@" > "$work/out" 2> "$work/err"; then fail "$old was accepted"; fi
  grep -qF -- "$old" "$work/err" || { cat "$work/err" >&2; fail "$old: the error does not name it"; }
}
refused --save "$remat" train "${tiny[@]}" --steps 1 --sample 0 --save "$work/state"
[ ! -e "$work/state" ] || fail "train --save wrote a state"
refused --compare-steps "$remat" train "${tiny[@]}" --steps 1 --sample 0 --compare --compare-steps 1
refused --save "$remat" plan "${tiny[@]}" --policy block --save "$work/plan.json"
refused --save "$remat" profile "${tiny[@]}" --repeats 1 --save "$work/profile.json"
refused --budgets "$remat" trace "${tiny[@]}" --repeats 1 --policies none --budgets 90% --no-plots --out "$work/trace"
refused --steps "$remat" bench "${tiny[@]}" --repeats 1 --policies none --budget 90% --no-plots --no-trace --steps 1 \
  --out "$work/bench"
refused --channels "$remat" demo --layers 2 --channels 16 --seq 8 --batch 2 --measure-steps 1
refused --tokens "$remat" demo --layers 2 --hidden 16 --tokens 8 --batch 2 --measure-steps 1
refused --steps "$remat" demo --layers 2 --hidden 16 --seq 8 --batch 2 --steps 2
"$remat" plan "${tiny[@]}" --policy block --save-plan "$work/plan.json" > /dev/null || fail "plan --save-plan failed"
[ -s "$work/plan.json" ] || fail "plan --save-plan wrote no plan"
echo "old spellings: all checks passed"
