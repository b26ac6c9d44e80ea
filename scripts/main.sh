#!/usr/bin/env bash
# The main job: set-up, build, then show what checkpointing saves on a real training step.
# Extra arguments go to `remat demo` (see `build/tools/remat demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh > /dev/null
build/tools/remat demo "$@"
