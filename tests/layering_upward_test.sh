#!/usr/bin/env bash
# The layering test fails on an upward include: a copy of the sources in which a low room
# (memory) includes a high one (autoplan), and one in which a room reaches into another's private
# header, must each be refused, naming the file and both rooms.
set -u
root=${1:?usage: layering_upward_test.sh SOURCE_DIR}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
expect_refusal() {  # expect_refusal NAME FILE INCLUDE MESSAGE
  local name=$1 file=$2 include=$3 message=$4 copy="$scratch/$1"
  mkdir -p "$copy"
  cp -r "$root/src" "$root/include" "$root/examples" "$root/models" "$root/train" "$copy/"
  sed -i "0,/^#include \"/s||#include \"$include\"\n#include \"|" "$copy/$file"
  local output
  output=$("$root/tests/layering_test.sh" "$copy" 2>&1) && { echo "$name: the layering test passed"; status=1; return; }
  grep -qF "$message" <<<"$output" || { echo "$name: expected '$message' in:"; echo "$output"; status=1; }
}
expect_refusal upward src/memory/memory_timeline.cpp remat/autoplan/make_plan.h \
  "room memory may not include room autoplan"
expect_refusal private src/measure/profiler.cpp checkpoint/forward_state.h \
  "room measure reaches into room checkpoint's private header"
[ $status -eq 0 ] && echo "upward and private includes refused"
exit $status
