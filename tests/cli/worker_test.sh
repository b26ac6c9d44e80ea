#!/usr/bin/env bash
# `remat worker`: exports a file, answers each request line with measured steps (the same loss for
# the same seed), runs plans sent as JSON as it runs policies, and answers bad requests with an
# error line instead of exiting.
source "$(dirname "$0")/lib.sh"
tiny=(--layers 2 --hidden 32 --heads 2 --seq 16 --batch 2)
ffn_plan=$("$remat" plan "${tiny[@]}" --policy ffn --json | tr -d '\n')
printf '%s\n' '{"policy": "block", "steps": 2, "seed": 5}' '{"policy": "none", "seed": 5}' '{"policy": "blocks"}' \
  'not json' '{"policy": "ffn", "steps": 0}' '{"policy": "ffn", "steps": 2.5}' '{"policy": "ffn", "seed": -1}' '{"policy": "attn", "seed": 5, "trace": "'"$work"'/attn.csv"}' \
  '{"plan": '"$ffn_plan"', "seed": 5}' '{"plan": ["embed"]}' '{"plan": {"format": "remat-plan", "version": 1}}' \
  '{"policy": "ffn", "plan": '"$ffn_plan"'}' |
  "$remat" worker "${tiny[@]}" --export "$work/model.pt" > "$work/out.jsonl"
[ -s "$work/model.pt" ] || fail "no export written"
[ "$(wc -l < "$work/out.jsonl")" -eq 13 ] || fail "expected a ready line and 12 replies"
sed -n 1p "$work/out.jsonl" | grep -q '"ready":true' || fail "no ready line"
sed -n 1p "$work/out.jsonl" | grep -q '"requests":\["policy","plan"\]' || fail "the ready line does not list plan requests"
block=$(sed -n 2p "$work/out.jsonl" | grep -o '"loss":\[[^]]*\]')
none=$(sed -n 3p "$work/out.jsonl" | grep -o '"loss":\[[^]]*\]' | tr -d '[]' | cut -d: -f2)
[ "$block" = "\"loss\":[$none,$none]" ] || fail "checkpointed and plain losses differ for one seed: $block vs $none"
sed -n 4p "$work/out.jsonl" | grep -q "unknown policy 'blocks'" || fail "bad policy not reported"
sed -n 5p "$work/out.jsonl" | grep -q "malformed request" || fail "bad JSON not reported"
sed -n 6p "$work/out.jsonl" | grep -q '"steps\\" must be a whole number in \[1, 1000\], got 0' || fail "bad steps not reported"
sed -n 7p "$work/out.jsonl" | grep -q 'got 2.5' || fail "fractional steps not reported"
sed -n 8p "$work/out.jsonl" | grep -q '"seed\\" must be a whole number >= 0, got -1' || fail "negative seed not reported"
sed -n 10p "$work/out.jsonl" | grep -q '"plan":"embed attn0 \[mlp0\]' || fail "the plan request ran another plan"
[ "$(sed -n 10p "$work/out.jsonl" | grep -o '"loss":\[[^]]*\]')" = "\"loss\":[$none]" ] ||
  fail "a plan sent as JSON gave another loss than the plain run for one seed"
sed -n 11p "$work/out.jsonl" | grep -q 'must be a plan as a JSON object' || fail "a plan that is no object not reported"
sed -n 12p "$work/out.jsonl" | grep -q "the request's plan" || fail "a malformed plan not reported"
sed -n 13p "$work/out.jsonl" | grep -q 'either a \\"policy\\" name or a \\"plan\\"' || fail "policy and plan together not refused"
grep -q ",recompute$" "$work/attn.csv" || fail "trace of attn has no recompute phase"
echo "worker: all checks passed"
