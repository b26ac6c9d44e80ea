#!/usr/bin/env bash
# The main job: set-up, build, then train a small GPT on the fortunes corpus with every block
# checkpointed, and compare its activation memory and step time with the unchecked run.
# Extra arguments go to `remat train` (see `build/tools/remat train --help`), e.g. --policy core-attn.
set -euo pipefail
cd "$(dirname "$0")/.."
# The build's progress, compact: one line per finished target (a fresh machine takes minutes here);
# compiler errors still reach the terminal in full.
echo "remat: set-up and build (a fresh machine needs ~15 minutes; targets as they finish)"
scripts/build.sh | sed -un 's/^\[ *\([0-9]*\)%\] Built target \(.*\)/  [\1%] built \2/p'
build/tools/remat train --preset demo --policy block --compare "$@"
