#!/usr/bin/env bash
# Installs remat from the build tree into a scratch prefix, then builds and runs a separate CMake
# project against it with find_package(remat). That project also compiles, against the installed
# headers only, each public header alone, and builds and runs every ```cpp block of README.md and
# docs/*.md as a program of its own (so the documented code cannot drift from the API, nor dangle):
# a block is followed by an HTML comment, invisible where Markdown is rendered,
#   <!-- run: C++ statements calling what the block defines; DOC_CHECK(condition) asserts -->
# which becomes the program's main; a block with its own main needs none. Compiler and linker flags
# are the build tree's (a sanitizer build's examples run sanitized). Before building, it checks that
# <remat/remat.h> includes every installed header.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
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
mkdir -p "$scratch/units" "$scratch/snippets"
for header in $headers; do  # twice: its include guard is tested too
  printf '#include <%s>\n#include <%s>\n' "$header" "$header" > "$scratch/units/header_$(echo "$header" | tr '/.' '__').cpp"
done
docs=$(cd "$repo" && ls README.md docs/*.md)
for doc in $docs; do
  (cd "$repo" && awk -v out="$scratch/snippets/$(echo "$doc" | tr '/.' '__')" '
    function finish_block() {
      if (file == "") return
      if (!has_main) { print FILENAME ":" start ": a cpp block without a <!-- run: ... --> comment after it" > "/dev/stderr"; bad = 1 }
      close(file); file = ""
    }
    /^```cpp/ { finish_block(); n++; file = out "_" n ".cpp"; start = NR; has_main = 0; inside = 1
                printf "// %s, block %d (line %d)\n", FILENAME, n, NR > file; next }
    inside && /^```/ { inside = 0; next }
    inside { if ($0 ~ /^int main\(/) has_main = 1; print > file; next }
    file != "" && /^<!-- run:/ { running = 1; sub(/^<!-- run:/, "") ; has_main = 1
      print "\n#include <cstdlib>\n#include <exception>\n#include <iostream>\n#include <stdexcept>" > file
      print "#define DOC_CHECK(condition) \\\n  if (!(condition)) throw std::runtime_error(\"DOC_CHECK failed: \" #condition)" > file
      print "int main() {\n  try {" > file }
    running { line = $0; ends = sub(/-->[ \t]*$/, "", line); print "    " line > file
              if (ends) { running = 0
                print "  } catch (const std::exception& e) {\n    std::cerr << \"" FILENAME " block " n ": \" << e.what() << \"\\n\";\n    return 1;\n  }\n  return 0;\n}" > file
                finish_block() }
              next }
    file != "" && /[^ \t]/ { finish_block() }
    END { finish_block(); exit bad }' "$doc") || exit 1
done
snippets=$(ls "$scratch/snippets" | wc -l)
echo "consumer: $(echo "$headers" | wc -w) installed headers alone, $snippets documented snippets built and run"

flags=$(sed -n 's/^CMAKE_CXX_FLAGS:STRING=//p' "$build_dir/CMakeCache.txt")
link_flags=$(sed -n 's/^CMAKE_EXE_LINKER_FLAGS:STRING=//p' "$build_dir/CMakeCache.txt")
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build_dir/CMakeCache.txt")
cmake -S "$source_dir" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE="${build_type:-Release}" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$link_flags" \
  -DREMAT_CONSUMER_UNITS="$scratch/units" -DREMAT_CONSUMER_SNIPPETS="$scratch/snippets" > /dev/null
cmake --build "$scratch/build" -j "$(nproc)" > "$scratch/build.log" 2>&1 || { tail -60 "$scratch/build.log" >&2; exit 1; }
"$scratch/build/consumer"
mkdir -p "$scratch/run"
failed=0
for program in "$scratch"/build/snippet_*; do
  name=$(basename "$program")
  start=$(date +%s%N)
  if (cd "$scratch/run" && "$program" > "$scratch/run/$name.log" 2>&1); then
    echo "consumer: $name ran ($(( ($(date +%s%N) - start) / 1000000 )) ms)"
  else
    echo "consumer: $name FAILED:" >&2
    tail -40 "$scratch/run/$name.log" >&2
    failed=1
  fi
done
exit $failed
