#!/usr/bin/env bash
# The layers speak only their own words: the core (src/, include/remat/) names no model of ours —
# no GPT, attention or MLP halves, no GPT stage options (core-attn, matmul-inputs; selective
# checkpointing per operator is the core's own) — and no message thrown below tools/
# (src/, include/, models/, train/) names a command-line flag: the CLI maps fields to flags.
set -u
# The rooms: include/remat/<room>/ mirrored by src/<room>/; see may_include below.
root=${1:?usage: layering_test.sh SOURCE_DIR}
status=0
model_words=$(grep -rniE 'gpt|attn|ffn|\bmlp\b|matmul-inputs|"half"' "$root/src" "$root/include/remat")
if [ -n "$model_words" ]; then
  echo "GPT vocabulary in the core:"; echo "$model_words"; status=1
fi
flag_words=$(grep -rnE '"[^"]*--[a-z]' "$root/src" "$root/include" "$root/models" "$root/train")
if [ -n "$flag_words" ]; then
  echo "command-line flags in library strings:"; echo "$flag_words"; status=1
fi
# The rooms (include/remat/<room>/ and src/<room>/, each a subsystem), bottom to top: a room
# includes only itself and rooms below it. Written once, here; remat/remat.h includes all.
rooms=(base internal memory checkpoint ops distributed chain planning measure graph autoplan)
# Which of the rooms below each one it uses, public headers and private ones alike.
declare -A may_include=(
  [base]="base"
  [internal]="base internal"
  [memory]="base internal memory"
  [checkpoint]="base memory checkpoint"
  [ops]="base ops"
  [distributed]="base distributed"
  [chain]="base memory checkpoint chain"
  [planning]="base memory internal checkpoint chain planning"
  [measure]="base memory internal checkpoint chain planning measure"
  [graph]="base memory checkpoint planning graph"
  [autoplan]="base memory internal checkpoint chain planning measure graph autoplan"
)
# The table itself goes only downwards: a room allowed to include one above it would let a cycle
# in (memory and internal once included each other).
declare -A level=()
for i in "${!rooms[@]}"; do level[${rooms[$i]}]=$i; done
for room in "${rooms[@]}"; do
  for target in ${may_include[$room]}; do
    if [ "${level[$target]:-999}" -gt "${level[$room]}" ]; then
      echo "tests/layering_test.sh: room $room may include room $target, which is above it"; status=1
    fi
  done
done
# A room's private headers (src/<room>/*.h) are its own; other rooms use its public contract
# (remat/<room>/*.h). The exceptions: base's (the LibTorch compatibility header, JSON fields,
# tensor text: every room's footing), and the checkpoint mechanism's RNG and recompute state, on
# which the chain's plan executor is built, and its operator interception, on which the step
# recorder of graph is built.
declare -A may_include_private=(
  [chain]="checkpoint"
  [graph]="checkpoint"
)
room_of() {  # an include's room: remat/<room>/x.h (public) or <room>/x.h (private, under src/)
  local path=${1#remat/}
  [[ $path == */* ]] && echo "${path%%/*}"
}
for dir in "$root"/include/remat/*/ "$root"/src/*/; do
  room=$(basename "$dir")
  if [ -z "${may_include[$room]+set}" ]; then
    echo "room $room has no rule in tests/layering_test.sh"; status=1; continue
  fi
  while IFS=: read -r file _ include; do
    target=$(room_of "$(sed -E 's/^#include "([^"]+)".*/\1/' <<<"$include")")
    [ -z "$target" ] && continue
    if [ -z "${may_include[$target]+set}" ]; then
      [[ $include == *'"remat/'* ]] && { echo "$file: $include names no room"; status=1; }
      continue
    fi
    case " ${may_include[$room]} " in
      *" $target "*) ;;
      *) echo "$file: room $room may not include room $target: $include"; status=1; continue ;;
    esac
    if [[ $include != *'"remat/'* && $target != "$room" && $target != base ]]; then
      case " ${may_include_private[$room]:-} " in
        *" $target "*) ;;
        *) echo "$file: room $room reaches into room $target's private header: $include"; status=1 ;;
      esac
    fi
  done < <(grep -rnE '^#include "' "$dir")
done
# Every public header lives in a room: nothing but the one include at the top.
stray=$(find "$root/include/remat" -maxdepth 1 -name '*.h' ! -name remat.h)
[ -n "$stray" ] && { echo "public headers outside any room:"; echo "$stray"; status=1; }
# The examples are written as users write them: only installed headers (include/remat/), never
# the project's own helpers (remat/internal/, src/internal/) nor a room's private headers.
for file in $(grep -rlE '^#include "' "$root/examples"); do
  while IFS= read -r include; do
    header=$(sed -E 's/^#include "([^"]+)".*/\1/' <<<"$include")
    [[ $header == support/* ]] && continue  # the examples' own shared code
    if [ ! -f "$root/include/$header" ]; then
      echo "$file: $include is not an installed header"; status=1
    fi
  done < <(grep -E '^#include "' "$file")
done
[ $status -eq 0 ] && echo "layering ok"
exit $status
