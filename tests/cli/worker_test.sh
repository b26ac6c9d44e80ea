#!/usr/bin/env bash
# `remat worker`: exports a file, answers each request line with measured steps (the same loss for
# the same seed), and answers bad requests with an error line instead of exiting.
set -euo pipefail
remat="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
printf '%s\n' '{"policy": "block", "steps": 2, "seed": 5}' '{"policy": "none", "seed": 5}' '{"policy": "blocks"}' \
  'not json' '{"policy": "ffn", "steps": 0}' '{"policy": "attn", "seed": 5, "trace": "'"$work"'/attn.csv"}' |
  "$remat" worker --layers 2 --hidden 32 --heads 2 --seq 16 --batch 2 --export "$work/model.pt" > "$work/out.jsonl"
[ -s "$work/model.pt" ] || fail "no export written"
[ "$(wc -l < "$work/out.jsonl")" -eq 7 ] || fail "expected a ready line and 6 replies"
sed -n 1p "$work/out.jsonl" | grep -q '"ready":true' || fail "no ready line"
block=$(sed -n 2p "$work/out.jsonl" | grep -o '"loss":\[[^]]*\]')
none=$(sed -n 3p "$work/out.jsonl" | grep -o '"loss":\[[^]]*\]' | tr -d '[]' | cut -d: -f2)
[ "$block" = "\"loss\":[$none,$none]" ] || fail "checkpointed and plain losses differ for one seed: $block vs $none"
sed -n 4p "$work/out.jsonl" | grep -q "unknown policy 'blocks'" || fail "bad policy not reported"
sed -n 5p "$work/out.jsonl" | grep -q "malformed request" || fail "bad JSON not reported"
sed -n 6p "$work/out.jsonl" | grep -q '"steps\\" must be in \[1, 1000\]' || fail "bad steps not reported"
grep -q ",recompute$" "$work/attn.csv" || fail "trace of attn has no recompute phase"
echo "worker: all checks passed"
