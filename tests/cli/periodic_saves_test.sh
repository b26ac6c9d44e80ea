#!/usr/bin/env bash
# `remat train --save-every N --keep-last K`: a state every N steps and at the end, the newest K
# kept, `latest` naming the newest; --resume continues from it; a changed digit in meta.json is
# caught by its checksum, with an error that quotes no more than a short excerpt.
source "$(dirname "$0")/lib.sh"
tiny+=(--sample 0)
"$remat" train "${tiny[@]}" --steps 5 --save-state "$work/run" --save-every 2 --keep-last 2 > "$work/out" 2>&1 ||
  { cat "$work/out" >&2; fail "training with periodic saves failed"; }
[ "$(ls "$work/run" | grep -c '^step-')" -eq 2 ] || fail "expected 2 states kept, found: $(ls "$work/run")"
[ -d "$work/run/step-000004" ] && [ -d "$work/run/step-000005" ] || fail "expected steps 4 and 5, found: $(ls "$work/run")"
[ "$(cat "$work/run/latest")" = "step-000005" ] || fail "latest is $(cat "$work/run/latest")"
"$remat" train "${tiny[@]}" --steps 1 --resume "$work/run" --save-state "$work/run" > "$work/out" 2>&1 ||
  { cat "$work/out" >&2; fail "resume failed"; }
grep -q "resumed at step 5" "$work/out" || fail "did not resume from the newest state"
[ "$(cat "$work/run/latest")" = "step-000006" ] || fail "the resumed run did not save step 6"
# A flipped digit in meta.json: the step number.
sed -i 's/"step": 6/"step": 7/' "$work/run/step-000006/meta.json"
grep -q '"step": 7' "$work/run/step-000006/meta.json" || fail "the test did not change meta.json"
if "$remat" train "${tiny[@]}" --steps 1 --resume "$work/run" > "$work/out" 2>&1; then fail "a changed meta.json was accepted"; fi
grep -q "meta.json' does not match its checksum" "$work/out" || { cat "$work/out" >&2; fail "no checksum error"; }
[ "$(wc -c < "$work/out")" -lt 1000 ] || fail "the error quotes too much: $(wc -c < "$work/out") bytes"
if "$remat" train "${tiny[@]}" --steps 1 --save-every 2 > "$work/out" 2>&1; then fail "--save-every without --save-state was accepted"; fi
grep -q -- "--save-every needs --save-state" "$work/out" || { cat "$work/out" >&2; fail "no clear error for --save-every alone"; }
echo "periodic saves: all checks passed"
