#!/usr/bin/env bash
# Every subcommand with --json writes exactly one JSON document on stdout (progress, logs and the
# human report go to stderr), so `remat <command> --json | jq` always works.
source "$(dirname "$0")/lib.sh"
one_document() {  # one_document NAME KEY command...: stdout parses as one JSON object holding KEY
  local name="$1" key="$2"; shift 2
  "$@" > "$work/$name.json" 2> "$work/$name.err" || { cat "$work/$name.err" >&2; fail "$name exited with $?"; }
  python3 -c 'import json, sys
doc = json.load(open(sys.argv[1]))
assert isinstance(doc, dict), "not an object"
assert sys.argv[2] in doc, "no key " + sys.argv[2]' "$work/$name.json" "$key" ||
    { head -c 600 "$work/$name.json" >&2; fail "$name --json: stdout is not one JSON document with '$key'"; }
}
one_document train final_loss "$remat" train "${tiny[@]}" --steps 2 --sample 4 --json
one_document plan-policy stages "$remat" plan "${tiny[@]}" --policy block --json
one_document plan-budget results "$remat" plan "${tiny[@]}" --repeats 1 --budget 60%,90% --json
one_document policies policies "$remat" policies --json
one_document profile stages "$remat" profile "${tiny[@]}" --repeats 1 --json
one_document estimate per_layer_bytes "$remat" estimate --preset 7b --json
one_document demo strategies "$remat" demo --layers 2 --hidden 16 --seq 8 --batch 2 --measure-steps 1 --json
one_document bench strategies "$remat" bench "${tiny[@]}" --repeats 1 --measure-steps 1 --budget 60% --no-plots --no-trace \
  --out "$work/bench" --json
one_document trace strategies "$remat" trace "${tiny[@]}" --policies none block --no-plots --out "$work/trace" --json
one_document worker ready "$remat" worker "${tiny[@]}" --export "$work/model.pt" --json < /dev/null
# The human report went to stderr instead.
grep -q "optimal 60%" "$work/bench.err" || fail "bench's table is not on stderr under --json"
grep -q "published per-layer figure" "$work/estimate.err" || fail "estimate's report is not on stderr under --json"
# A budget's plan says what its costs were timed under (remat's programs arrange the threads) and
# carries its prediction's spread.
grep -q "timed under 1 LibTorch intra-op" "$work/plan-budget.err" || grep -q "timed under [0-9]* LibTorch intra-op threads on" \
  "$work/plan-budget.err" || fail "plan --budget does not say what its costs were timed under"
python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
assert "intra-op" in r["timed_under"] and "oversubscribed" not in r["timed_under"], r["timed_under"]
assert r["predicted_overhead_spread"] >= 0' "$work/plan-budget.json" || fail "plan --budget --json lacks timed_under or the spread"
echo "json: all checks passed"
