#!/usr/bin/env bash
# Issue 30's hostile findings, each now a clear error (or a victim file left alone), never a hang:
# saved state behind links and FIFOs, thread counts beyond the machine, a plan file of a million
# stage names, and messages that quote what the user gave.
source "$(dirname "$0")/lib.sh"
now_ms() { date +%s%3N; }
error_seconds=20  # every refusal here is meant to be immediate

# A link planted as `latest` is replaced, never written through: the victim outside is untouched.
echo precious > "$work/victim.txt"
mkdir -p "$work/c"
ln -s ../victim.txt "$work/c/latest"
"$remat" train "${tiny[@]}" --steps 2 --save-state "$work/c" > /dev/null 2>&1 || fail "train --save-state failed"
[ "$(cat "$work/victim.txt")" = precious ] || fail "the file the planted link named was overwritten"
[ ! -L "$work/c/latest" ] && [ "$(cat "$work/c/latest")" = step-000002 ] || fail "'latest' is not the new state's name"

# A FIFO as `latest` returns at once.
mkdir -p "$work/f"
mkfifo "$work/f/latest"
start=$(now_ms)
expect_error "is a FIFO" "$remat" train "${tiny[@]}" --steps 1 --resume "$work/f" > /dev/null
echo "FIFO as latest refused in $(( $(now_ms) - start )) ms"

# Threads beyond the machine's CPUs: a clear error, also under a limited address space.
out=$(ulimit -v 6000000; expect_error "CPU threads asked for, but this process may run on" \
      "$remat" train "${tiny[@]}" --threads 100000 --steps 2)
grep -q "100000 CPU threads asked for" <<< "$out" || fail "the thread count is not named: $out"

# A plan of 10^6 stage names for a model of 4 stages.
awk 'BEGIN { printf "{\"format\": \"remat-plan\", \"version\": 1, \"granularity\": \"block\", \"stages\": [";
             for (i = 0; i < 1000000; i++) printf "%s\"s%d\"", (i ? "," : ""), i;
             printf "], \"options\": ["; for (i = 0; i < 1000000; i++) printf "%s\"full\"", (i ? "," : "");
             printf "], \"plan\": ["; for (i = 0; i < 1000000; i++) printf "%s\"s%d\"", (i ? "," : ""), i; print "]}" }' \
  > "$work/huge-plan.json"
start=$(now_ms)
expect_error "lists more than 6 entries, but this model's chains have at most 6 stages" "$remat" train "${tiny[@]}" --steps 1 --plan "$work/huge-plan.json" > /dev/null
echo "plan of 10^6 stage names refused in $(( $(now_ms) - start )) ms"

# Messages: long values cut, control characters escaped, ranges in words, out of range refused.
long=$(head -c 131000 /dev/zero | tr '\0' a)
for flag in --policy --preset --data; do
  out=$(expect_error "more characters)" "$remat" train "${tiny[@]}" --steps 1 "$flag" "$long")
  [ "${#out}" -lt 1000 ] || fail "$flag: a 131 kB value echoed in ${#out} characters"
done
out=$(expect_error "more characters)" "$remat" train "--$long" 1)
[ "${#out}" -lt 1000 ] || fail "an unknown 131 kB flag echoed in ${#out} characters"
printf '{"format": "remat-plan", "version": 1, "granularity": "block", "stages": ["\\u001b[31membed"], "options": ["full"], "plan": ["\\u001b[31membed"]}' > "$work/ansi.json"
out=$(expect_error '\x1b[31membed' "$remat" train "${tiny[@]}" --steps 1 --plan "$work/ansi.json")
if grep -q $'\x1b' <<< "$out"; then fail "an escape character reached the terminal"; fi
expect_error "--save-every: a whole number from 0, got '-1'" "$remat" train "${tiny[@]}" --save-every -1 > /dev/null
expect_error "--seed: a whole number from 0 to 18446744073709551615, got '18446744073709551616'" \
  "$remat" train "${tiny[@]}" --seed 18446744073709551616 > /dev/null
expect_error "--profile has no effect with --policy" "$remat" plan "${tiny[@]}" --policy block --profile "$work/none.json" > /dev/null
expect_error "--profile has no effect without --budget" "$remat" trace "${tiny[@]}" --policies block --budget '' \
  --profile "$work/none.json" --out "$work/trace" > /dev/null
expect_error "WORLD_SIZE='1' is set" env WORLD_SIZE=1 RANK=0 "$remat" train "${tiny[@]}" --steps 1 --nproc 2 > /dev/null
expect_error "The budgets planned for come from --budget" "$remat" bench "${tiny[@]}" --policies none --measure-steps 1 \
  --no-plots --no-trace --out "$work/bench" > /dev/null
# Sequence lengths: malformed, reversed, huge, or beyond the model's sequence.
expect_error "is not a length" "$remat" train "${tiny[@]}" --steps 1 --lengths 8:x > /dev/null
expect_error "give MIN <= MAX" "$remat" train "${tiny[@]}" --steps 1 --lengths 16:8 > /dev/null
expect_error "more than 4096 lengths" "$remat" train "${tiny[@]}" --steps 1 --lengths 1:16000000:1 > /dev/null
expect_error "--lengths: a length of 17 lies outside [1, --seq = 16]" "$remat" train "${tiny[@]}" --steps 1 \
  --lengths 8,17 > /dev/null
expect_error "is not a length" "$remat" train "${tiny[@]}" --steps 1 --lengths 8,,16 > /dev/null
out=$("$remat" train "${tiny[@]}" --steps 3 --lengths 8,16 --sample 0) || fail "train --lengths 8,16 failed"
grep -q "per sequence length" <<< "$out" || fail "no per-length table: $out"
echo "hostile inputs: all refused as expected"
