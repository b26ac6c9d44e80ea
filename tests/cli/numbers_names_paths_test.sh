#!/usr/bin/env bash
# Issue 39's findings on the command line, each a clear error before any work: numbers in decimal
# only and in range, names with invalid UTF-8 or C1 controls escaped, an output that is an input
# refused, a `latest` folder found before training, and sizes beyond the machine refused before
# anything is allocated.
source "$(dirname "$0")/lib.sh"

# Numbers: decimal only. 010 is ten (not octal 8); 0x10 and 0x3 are refused, not read as hexadecimal.
out=$("$remat" train "${tiny[@]}" --steps 1 --sample 0 --seed 010 2>&1) || fail "--seed 010 refused: $out"
grep -q "seed 10$" <<< "$out" || fail "--seed 010 was not read as 10: $(grep seed <<< "$out")"
expect_error "--steps: a whole number from -9223372036854775808 to 9223372036854775807 in decimal digits, got '0x3'" \
  "$remat" train "${tiny[@]}" --steps 0x3 > /dev/null
expect_error "--seed: a whole number from 0 to 18446744073709551615 in decimal digits, got '0x10'" \
  "$remat" train "${tiny[@]}" --seed 0x10 > /dev/null
expect_error "(hexadecimal, octal and binary are not read)" "$remat" plan "${tiny[@]}" --layers 0x2 > /dev/null
# Beyond int64: refused with the range, not clamped to its largest value.
expect_error "--warmup: a whole number from -9223372036854775808 to 9223372036854775807, got '999999999999999999999'" \
  "$remat" train "${tiny[@]}" --warmup 999999999999999999999 > /dev/null
expect_error "--threads: a whole number from 1 to 1000000, got '99999999999'" \
  "$remat" train "${tiny[@]}" --threads 99999999999 > /dev/null
expect_error "--lr: a number in decimal notation (like 3, 0.5 or 3e-4), got '0x1p-3'" \
  "$remat" train "${tiny[@]}" --lr 0x1p-3 > /dev/null

# Names: invalid UTF-8 as \xNN, C1 controls (U+009B is a terminal's CSI) as \u009b, never raw.
c1=$'\xc2\x9b'
no_raw() {  # no_raw OUTPUT WHAT: none of the raw bytes reached the output
  if LC_ALL=C grep -q $'\xc2\x9b\|\xff' <<< "$1"; then fail "raw bytes in the message for $2: $1"; fi
}
out=$(expect_error '\u009b31m' "$remat" train "${tiny[@]}" --steps 1 --data "$work/no${c1}31m")
no_raw "$out" --data
out=$(expect_error '\xffx' "$remat" train "${tiny[@]}" --steps 1 --data "$work/no"$'\xff'"x")
no_raw "$out" --data
out=$(expect_error "budget '5\\u009b' has an unknown unit" "$remat" plan "${tiny[@]}" --budget "5${c1}")
no_raw "$out" --budget
out=$(expect_error '\xff' "$remat" train "${tiny[@]}" --steps 1 --resume "$work/"$'\xff'"${c1}")
no_raw "$out" --resume

# An output that is an input: refused, by any spelling or through a link, and the input kept.
"$remat" profile "${tiny[@]}" --repeats 1 --save-profile "$work/p.json" > /dev/null 2>&1 || fail "profile failed"
before=$(cksum < "$work/p.json")
expect_error "--save-plan '$work/p.json' is the file that --profile '$work/p.json' reads" \
  "$remat" plan "${tiny[@]}" --budget 50% --profile "$work/p.json" --save-plan "$work/p.json" > /dev/null
ln -s p.json "$work/link.json"
expect_error "is the file that --profile" \
  "$remat" plan "${tiny[@]}" --budget 50% --profile "$work/p.json" --save-plan "$work/link.json" > /dev/null
expect_error "is the file that --profile" \
  "$remat" plan "${tiny[@]}" --budget 50% --profile "$work/p.json" --save-plan "$work/./p.json" > /dev/null
[ "$(cksum < "$work/p.json")" = "$before" ] || fail "the profile read was overwritten"
mkdir -p "$work/bench"
cp "$work/p.json" "$work/bench/profile.json"
expect_error "--out '$work/bench/profile.json' is the file that --profile" \
  "$remat" bench "${tiny[@]}" --profile "$work/bench/profile.json" --out "$work/bench" > /dev/null
echo "some text to train on, long enough for a batch of sixteen-byte sequences and more" > "$work/text.txt"
expect_error "--export '$work/text.txt' is the file that --data" \
  "$remat" worker "${tiny[@]}" --data "$work/text.txt" --export "$work/text.txt" > /dev/null < /dev/null

# A folder where the state folder's `latest` file goes: refused before the first step, not after.
mkdir -p "$work/state/latest"
out=$(expect_error "its 'latest' is a folder" "$remat" train "${tiny[@]}" --steps 3 --sample 0 --save-state "$work/state")
if grep -q "loss" <<< "$out"; then fail "the run trained before refusing the state folder: $out"; fi

# Sizes beyond the machine: the estimate's clear error, never LibTorch's allocator's.
expect_error "a residual stack of layers 1024, hidden 65536, batch 65536, seq 1048576 needs about" \
  "$remat" demo --layers 1024 --hidden 65536 --batch 65536 --seq 1048576 > /dev/null
echo "numbers, names and paths ok"
