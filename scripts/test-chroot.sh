#!/usr/bin/env bash
# A test leg against another Debian's LibTorch, in a chroot of that suite:
#   scripts/test-chroot.sh forky [ctest arguments]    LibTorch 2.14, g++ 16, C++20 (the newest line)
#   scripts/test-chroot.sh trixie [ctest arguments]   LibTorch 2.6, g++ 14 (Debian 13)
# The chroot is made once with debootstrap and reused while it is there (/var/cache/remat/<suite>,
# or $REMAT_CHROOT_ROOT: outside the checkout, so a fresh clone finds it); packages are installed by
# the project's own scripts/setup.sh inside it; the build goes to build-<suite>/ ($REMAT_CHROOT_BUILD;
# trixie keeps its old build-debian13/). Arguments after the suite go to ctest (-R Checkpoint).
# REMAT_CHROOT_COMMAND replaces the build-and-test command (run from the checkout in the chroot).
# Needs root (debootstrap, chroot, mount).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
suite=${1:-}
case "$suite" in
  trixie) default_build=build-debian13 ;;
  forky) default_build=build-forky ;;
  *) echo "test-chroot: the first argument names the Debian suite: forky (LibTorch 2.14) or trixie (LibTorch 2.6), got '$suite'" >&2; exit 2 ;;
esac
shift
root=${REMAT_CHROOT_ROOT:-/var/cache/remat/$([ "$suite" = trixie ] && echo debian13 || echo "$suite")}
mirror=${REMAT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
build_dir=${REMAT_CHROOT_BUILD:-$default_build}

[ "$(id -u)" -eq 0 ] || { echo "test-chroot: needs root (debootstrap, chroot and bind mounts); run it with sudo" >&2; exit 2; }

if [ ! -e "$root/.remat-debootstrap-complete" ]; then
  command -v debootstrap > /dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap > /dev/null
  }
  # Debian 12's debootstrap predates forky: testing is made as sid is.
  script=/usr/share/debootstrap/scripts/$suite
  [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
  echo "test-chroot: creating the $suite chroot in $root (once)" >&2
  rm -rf "$root.partial"
  mkdir -p "$(dirname "$root")"
  # contrib: libtorch-cuda-dev, for scripts/check-cuda-build.sh.
  debootstrap --variant=minbase --components=main,contrib "$suite" "$root.partial" "$mirror" "$script" \
    > "$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log" >&2; echo "test-chroot: debootstrap failed (log: $root.debootstrap.log)" >&2; exit 1; }
  # A mirror is a snapshot: a testing suite's Release expires days after it was signed, and apt
  # would refuse it (debootstrap does not check).
  echo 'Acquire::Check-Valid-Until "false";' > "$root.partial/etc/apt/apt.conf.d/99remat-mirror-snapshot"
  rm -rf "$root"
  mv "$root.partial" "$root"
  touch "$root/.remat-debootstrap-complete"
fi

if [ -n "${REMAT_CHROOT_COMMAND:-}" ]; then
  command=$REMAT_CHROOT_COMMAND
else
  command="scripts/setup.sh && cmake -S . -B $build_dir -DCMAKE_BUILD_TYPE=Release > /dev/null &&
    cmake --build $build_dir -j \$(nproc) && ctest --test-dir $build_dir --output-on-failure -j \$(nproc) $(printf '%q ' "$@")"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true
# The mounts live in a mount namespace of this run's own: they vanish with it, whatever way it ends,
# and runs side by side do not unmount each other's.
export root repo command
exec unshare --mount --propagation private /bin/bash -euo pipefail -c '
  mount --bind /proc "$root/proc"; for dir in /sys /dev; do mount --rbind "$dir" "$root$dir"; done
  mkdir -p "$root/remat" && mount --bind "$repo" "$root/remat"
  exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "cd /remat && $command"'
