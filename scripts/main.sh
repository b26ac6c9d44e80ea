#!/usr/bin/env bash
# The main job: set-up, build, then train a small GPT on the fortunes corpus with every block
# checkpointed, and compare its activation memory and step time with the unchecked run.
# Extra arguments go to `remat train` (see `build/tools/remat train --help`), e.g. --policy selective.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh > /dev/null
build/tools/remat train --preset demo --policy block --compare "$@"
