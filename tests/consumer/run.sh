#!/usr/bin/env bash
# Installs remat from the build tree into a scratch prefix, then builds and runs a separate CMake
# project against it with find_package(remat).
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build_dir" --prefix "$scratch/prefix" > /dev/null
cmake -S "$source_dir" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$scratch/build" > /dev/null
"$scratch/build/consumer"
