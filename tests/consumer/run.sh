#!/usr/bin/env bash
# Installs remat from the build tree into a scratch prefix, then builds and runs a separate CMake
# project against it with find_package(remat). That project also compiles, against the installed
# headers only: each public header alone, and every ```cpp block of README.md and docs/library.md
# as a file of its own (so the documented code cannot drift from the API). Before building, it
# checks that <remat/remat.h> includes every installed header.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$source_dir/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build_dir" --prefix "$scratch/prefix" > /dev/null

headers=$(cd "$scratch/prefix/include" && find remat -name '*.h' | sort)
[ -n "$headers" ] || { echo "consumer: no headers installed" >&2; exit 1; }
missing=""
for header in $headers; do
  [ "$header" = remat/remat.h ] && continue
  grep -qF "#include \"$header\"" "$scratch/prefix/include/remat/remat.h" || missing="$missing $header"
done
[ -z "$missing" ] || { echo "consumer: <remat/remat.h> does not include:$missing" >&2; exit 1; }
mkdir -p "$scratch/units"
for header in $headers; do  # twice: its include guard is tested too
  printf '#include <%s>\n#include <%s>\n' "$header" "$header" > "$scratch/units/header_$(echo "$header" | tr '/.' '__').cpp"
done
for doc in README.md docs/library.md; do
  awk -v out="$scratch/units/snippet_$(echo "$doc" | tr '/.' '__')" '
    /^```cpp/ { n++; file = out "_" n ".cpp"; printf "// %s, block %d (line %d)\n", FILENAME, n, NR > file; next }
    /^```/ { file = ""; next }
    file != "" { print > file }' "$repo/$doc"
done
echo "consumer: $(echo "$headers" | wc -w) installed headers alone, $(ls "$scratch/units" | grep -c '^snippet_') documented snippets"

cmake -S "$source_dir" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release \
  -DREMAT_CONSUMER_UNITS="$scratch/units" > /dev/null
cmake --build "$scratch/build" -j "$(nproc)" > "$scratch/build.log" 2>&1 || { tail -60 "$scratch/build.log" >&2; exit 1; }
"$scratch/build/consumer"
