#!/usr/bin/env bash
# `remat bench` and `remat trace` end to end on a tiny GPT: the files they promise exist and are
# what they say (PNG and SVG images, one CSV row per strategy), the Pareto flags agree with the
# measured numbers, the planner's plans stay within their budgets, and bad input gets clear errors.
source "$(dirname "$0")/lib.sh"
tiny+=(--repeats 1)

"$remat" bench "${tiny[@]}" --measure-steps 2 --budget 60%,90% --out "$work/bench" > "$work/bench.out" 2> "$work/bench.err"
for f in bench.csv bench.json report.md pareto.png pareto.svg pareto.gp pareto.dat timeline.png timeline.svg timeline.csv; do
  [ -s "$work/bench/$f" ] || fail "bench did not write $f"
done
for f in pareto.png timeline.png; do
  head -c 8 "$work/bench/$f" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || fail "$f is not a PNG"
done
grep -q "<svg" "$work/bench/pareto.svg" || fail "pareto.svg is not SVG"
grep -q "round 3/3" "$work/bench.err" || fail "no progress shown"
# Defaults that apply to 2 blocks run, those that do not are left out, and both budgets are planned.
for strategy in none block fused 'optimal 60%' 'optimal 90%'; do
  grep -qE "^\"?$strategy\"?," "$work/bench/bench.csv" || fail "bench.csv has no row for $strategy"
done
grep -qE '^"?segments:4"?,' "$work/bench/bench.csv" && fail "segments:4 does not apply to 2 blocks but ran"
grep -q '^"block,skip-ends",policy,' "$work/bench/bench.csv" || fail "names with commas are not quoted in the CSV"
# on_pareto_frontier must be 1 exactly for the rows no other row beats on both peak and time
# (columns found by their names in the header; no field of these rows holds a quoted comma but the name).
awk -F, 'NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
  { shift = NF - length(col); n++; peak[n] = $(col["activation_peak_bytes"] + shift)
    time[n] = $(col["median_step_seconds"] + shift); flag[n] = $NF }
  END { for (i = 1; i <= n; i++) { dominated = 0
          for (j = 1; j <= n; j++) if (peak[j] <= peak[i] && time[j] <= time[i] && (peak[j] < peak[i] || time[j] < time[i])) dominated = 1
          if (flag[i] != !dominated) { print "row " i " has frontier flag " flag[i]; bad = 1 } }
        exit bad }' "$work/bench/bench.csv" || fail "Pareto flags disagree with the measurements"
grep -q '"within_budget": false' "$work/bench/bench.json" && fail "a planner plan went over its budget"
[ "$(grep -c '"within_budget": true' "$work/bench/bench.json")" -eq 2 ] || fail "expected two planner rows within budget"
grep -q "optimal 60%" "$work/bench.out" || fail "no optimal plan in the table"
grep -q "!\[memory timeline\](timeline.png)" "$work/bench/report.md" || fail "report does not show the timeline"
# The timeline has all three phases; each strategy's step starts at zero activation bytes and ends
# holding only the loss (a few bytes).
for phase in forward backward recompute; do
  grep -q ",$phase\$" "$work/bench/timeline.csv" || fail "timeline has no $phase phase"
done
awk -F, 'NR > 1 { if (!($1 in first)) { first[$1] = $3; n++ } last[$1] = $3 }
  END { for (s in first) if (first[s] != 0 || last[s] < 0 || last[s] > 64) { print s ": " first[s] " -> " last[s]; bad = 1 }
        exit bad || n != 3 }' "$work/bench/timeline.csv" || fail "timelines do not start at 0 and end near 0 (or not 3 of them)"

# --lengths: every strategy again at each length, on the one model; 8 planned from the fit of 4, 12, 16.
"$remat" bench "${tiny[@]}" --measure-steps 2 --policies none block --budget 80% --lengths 4:16:4 --no-trace --no-plots \
  --out "$work/lengths" > "$work/lengths.out" 2> "$work/lengths.err"
csv="$work/lengths/lengths.csv"
[ "$(tail -n +2 "$csv" | wc -l)" -eq 12 ] || fail "lengths.csv does not have 4 lengths x 3 strategies"
[ "$(awk -F, '$3 == "fitted" { print $1 }' "$csv" | sort -u)" = 8 ] || fail "length 8 alone should be planned from the fit"
awk -F, 'NR > 1 && $2 ~ /^optimal/ && $11 != 1 { bad = 1 } END { exit bad }' "$csv" ||
  fail "a plan went over its budget at some length"
awk -F, 'NR > 1 && $2 == "none" { if ($6 <= last) bad = 1; last = $6 } END { exit bad }' "$csv" ||
  fail "the unchecked peak does not grow with the length"
grep -q '"lengths": \[' "$work/lengths/bench.json" || fail "bench.json has no per-length rows"
grep -q "## Per sequence length" "$work/lengths/report.md" || fail "report.md has no per-length section"
grep -q "batches of length 12" "$work/lengths.err" || fail "no progress per length"

"$remat" trace "${tiny[@]}" --policies none every:2 --out "$work/trace" > "$work/trace.out"
[ -s "$work/trace/timeline.png" ] || fail "trace wrote no plot"
grep -q "every:2" "$work/trace.out" || fail "trace did not report every:2"

expect_error "--trace: 'nope' is not one of the strategies" "$remat" bench "${tiny[@]}" --measure-steps 1 --budget 60% --trace nope --out "$work/b2"
expect_error "the smallest feasible budget is" "$remat" bench "${tiny[@]}" --measure-steps 1 --budget 1KiB --out "$work/b3"
expect_error "--out: cannot create the folder" "$remat" bench "${tiny[@]}" --measure-steps 1 --budget "" --out /proc/remat-bench
expect_error "was made for another model or batch" "$remat" bench --layers 2 --hidden 64 --heads 2 --seq 16 --batch 2 --measure-steps 1 --budget 60% \
  --profile "$work/bench/profile.json" --out "$work/b8"
"$remat" plan "${tiny[@]}" --profile "$work/bench/profile.json" --budget 60% > /dev/null || fail "bench's profile.json does not plan again"
expect_error "--budget lists '60%' twice" "$remat" bench "${tiny[@]}" --measure-steps 1 --budget 60%,60% --out "$work/b6"
expect_error "has an unknown unit 'parsecs'" "$remat" bench "${tiny[@]}" --measure-steps 1 --budget 12parsecs --out "$work/b7"
expect_error "lists 'block' twice" "$remat" bench "${tiny[@]}" --measure-steps 1 --policies block block --budget "" --out "$work/b4"
expect_error "unknown policy 'blocks'" "$remat" trace "${tiny[@]}" --policies blocks --out "$work/b5"
expect_error "--lengths: 32 is longer than the model's 16 positions" "$remat" bench "${tiny[@]}" --budget "" --lengths 8,32 --out "$work/b9"
expect_error "--lengths: 'x' in '4:x' is not a length" "$remat" bench "${tiny[@]}" --budget "" --lengths 4:x --out "$work/b9"
expect_error "--lengths: --profile is a profile of one length" "$remat" bench "${tiny[@]}" --budget 60% --lengths 8,16 \
  --profile "$work/bench/profile.json" --out "$work/b9"
expect_error "--lengths: at length 4: --budget 60%" "$remat" bench "${tiny[@]}" --measure-steps 1 --budget 60% --lengths 4,16 --out "$work/b9"
[ -e "$work/b9/bench.json" ] && fail "a bench that failed its plans wrote a report"
echo "bench and trace: all checks passed"
