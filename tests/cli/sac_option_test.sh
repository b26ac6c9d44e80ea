#!/usr/bin/env bash
# The generic stage option sac trains from the command line (issue 39): `remat train --policy sac`
# and a plan file whose stages use sac were refused before running ("cost table has no option 'sac'")
# by the pre-run estimate; the analytic estimator now prices sac on every stage, as profiles do.
source "$(dirname "$0")/lib.sh"
demo=(--preset demo "${tiny[@]}" --steps 3 --sample 0)

"$remat" train "${demo[@]}" --policy sac > "$work/policy.out" 2> "$work/policy.err" \
  || { cat "$work/policy.err" >&2; fail "train --policy sac failed"; }
grep -q "activation peak" "$work/policy.out" || { cat "$work/policy.out" >&2; fail "train --policy sac printed no peak"; }

# A plan file of the sac policy (blocks sac), and one with every stage sac (embedding and head too).
"$remat" plan "${tiny[@]}" --policy sac --save-plan "$work/sac.json" > /dev/null 2> "$work/plan.err" \
  || { cat "$work/plan.err" >&2; fail "plan --policy sac --save-plan failed"; }
grep -q '"sac"' "$work/sac.json" || fail "the saved plan has no stage option sac"
sed 's/"full"/"sac"/g' "$work/sac.json" > "$work/all-sac.json"
for plan in sac all-sac; do
  "$remat" train "${demo[@]}" --plan "$work/$plan.json" > "$work/$plan.out" 2> "$work/$plan.err" \
    || { cat "$work/$plan.err" >&2; fail "train --plan $plan.json failed"; }
  grep -q "activation peak" "$work/$plan.out" || { cat "$work/$plan.out" >&2; fail "train --plan $plan.json printed no peak"; }
done
grep -q "sac" "$work/all-sac.out" || { cat "$work/all-sac.out" >&2; fail "the all-sac run does not show its plan"; }
# The GPT's Megatron-style option was once named "selective", a word that names per-operator
# checkpointing (sac) too: the old name is refused, in a flag and in a plan file, naming the new one.
if "$remat" train "${demo[@]}" --policy selective > /dev/null 2> "$work/old.err"; then fail "--policy selective was accepted"; fi
grep -q "now 'core-attn'" "$work/old.err" || { cat "$work/old.err" >&2; fail "--policy selective does not name core-attn"; }
"$remat" plan "${tiny[@]}" --policy core-attn --save-plan "$work/core.json" > /dev/null 2> "$work/core.err" \
  || { cat "$work/core.err" >&2; fail "plan --policy core-attn --save-plan failed"; }
sed 's/"core-attn"/"selective"/g' "$work/core.json" > "$work/old.json"
if "$remat" train "${demo[@]}" --plan "$work/old.json" > /dev/null 2> "$work/oldplan.err"; then fail "a plan with option selective was accepted"; fi
grep -q "core-attn" "$work/oldplan.err" || { cat "$work/oldplan.err" >&2; fail "a plan with option selective does not name core-attn"; }
echo "sac option: all checks passed"
