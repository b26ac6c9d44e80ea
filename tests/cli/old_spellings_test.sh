#!/usr/bin/env bash
# Every renamed flag's old spelling still works, with a note on stderr naming the new spelling.
source "$(dirname "$0")/lib.sh"
renamed() {  # renamed OLD NEW command...: the command succeeds and notes the new spelling
  local old="$1" new="$2"; shift 2
  "$@" > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; fail "$old: the command failed"; }
  grep -qF -- "remat: $old is now $new" "$work/err" || { cat "$work/err" >&2; fail "$old: no note naming $new"; }
}
renamed --save --save-state "$remat" train "${tiny[@]}" --steps 1 --sample 0 --save "$work/state"
[ -f "$work/state/latest" ] || fail "train --save wrote no state"
renamed --compare-steps --measure-steps "$remat" train "${tiny[@]}" --steps 1 --sample 0 --compare --compare-steps 1
renamed --save --save-plan "$remat" plan "${tiny[@]}" --policy block --save "$work/plan.json"
[ -s "$work/plan.json" ] || fail "plan --save wrote no plan"
renamed --save --save-profile "$remat" profile "${tiny[@]}" --repeats 1 --save "$work/profile.json"
[ -s "$work/profile.json" ] || fail "profile --save wrote no profile"
renamed --budgets --budget "$remat" trace "${tiny[@]}" --repeats 1 --policies none --budgets 90% --no-plots --out "$work/trace"
grep -q "optimal 90%" "$work/out" || fail "trace --budgets did not trace the optimal plan"
renamed --steps --measure-steps "$remat" bench "${tiny[@]}" --repeats 1 --policies none --budget 90% --no-plots --no-trace \
  --steps 1 --out "$work/bench"
renamed --channels --hidden "$remat" demo --layers 2 --channels 16 --seq 8 --batch 2 --measure-steps 1
grep -q "Linear 16->64" "$work/out" || fail "demo --channels did not set the hidden size"
renamed --tokens --seq "$remat" demo --layers 2 --hidden 16 --tokens 8 --batch 2 --measure-steps 1
grep -q "input 2x8x16" "$work/out" || fail "demo --tokens did not set the sequence length"
renamed --steps --measure-steps "$remat" demo --layers 2 --hidden 16 --seq 8 --batch 2 --steps 2
grep -q "2 measured steps" "$work/out" || fail "demo --steps did not set the measured steps"
echo "old spellings: all checks passed"
