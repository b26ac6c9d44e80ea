#!/usr/bin/env bash
# Set-up, build, then the whole test suite: on this machine (Debian 12, LibTorch 1.13), then the
# same suite against LibTorch 2.6 in a Debian 13 chroot (scripts/test-debian13.sh); each leg's
# time is printed. REMAT_TEST_LEGS=host runs the first leg only.
set -euo pipefail
cd "$(dirname "$0")/.."
leg() {  # leg NAME COMMAND...
  local name=$1 start=$SECONDS
  shift
  echo "=== test leg: $name ==="
  "$@"
  echo "=== test leg: $name passed in $((SECONDS - start)) s ==="
}
host_leg() {
  scripts/build.sh
  ctest --test-dir build --output-on-failure -j "$(nproc)"
}
leg "Debian 12, LibTorch 1.13" host_leg
[ "${REMAT_TEST_LEGS:-all}" = host ] || leg "Debian 13, LibTorch 2.6 (scripts/test-debian13.sh)" scripts/test-debian13.sh
