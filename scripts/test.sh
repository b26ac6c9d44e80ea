#!/usr/bin/env bash
# Set-up, build, then the whole test suite, one leg per LibTorch line, each leg's time printed:
#   host    Debian 12, LibTorch 1.13, g++ 12 (this machine)
#   forky   Debian forky, LibTorch 2.14, g++ 16, C++20 (scripts/test-chroot.sh forky)
#   trixie  Debian 13, LibTorch 2.6, g++ 14 (scripts/test-chroot.sh trixie)
# REMAT_TEST_LEGS picks them, comma-separated: host,forky by default (the oldest and the newest line:
# the three together take longer than CI's 90 minutes comfortably allow); all = host,forky,trixie.
set -euo pipefail
cd "$(dirname "$0")/.."
legs=${REMAT_TEST_LEGS:-host,forky}
[ "$legs" = all ] && legs=host,forky,trixie
for name in ${legs//,/ }; do
  case "$name" in
    host | forky | trixie) ;;
    *) echo "test: REMAT_TEST_LEGS names host, forky, trixie or all, comma-separated; got '$name'" >&2; exit 2 ;;
  esac
done
failed=()
leg() {  # leg NAME COMMAND...: a failed leg is reported at the end, after the other legs ran
  local name=$1 start=$SECONDS status=0
  shift
  echo "=== test leg: $name ==="
  "$@" || status=$?
  if [ "$status" = 0 ]; then
    echo "=== test leg: $name passed in $((SECONDS - start)) s ==="
  else
    echo "=== test leg: $name FAILED (exit $status) after $((SECONDS - start)) s ==="
    failed+=("$name")
  fi
}
host_leg() {  # (errexit is off inside a command tested with ||: hence &&)
  scripts/build.sh && ctest --test-dir build --output-on-failure -j "$(nproc)"
}
for name in ${legs//,/ }; do
  case "$name" in
    host) leg "Debian 12, LibTorch 1.13" host_leg ;;
    forky) leg "Debian forky, LibTorch 2.14 (scripts/test-chroot.sh forky)" scripts/test-chroot.sh forky ;;
    trixie) leg "Debian 13, LibTorch 2.6 (scripts/test-chroot.sh trixie)" scripts/test-chroot.sh trixie ;;
  esac
done
if ((${#failed[@]})); then
  printf '=== failed legs: %s ===\n' "${failed[*]}"
  exit 1
fi
