#!/usr/bin/env bash
# The second test leg: the same suite built against Debian 13's LibTorch 2.6, in a trixie chroot.
# The chroot is made once with debootstrap and reused while it is there ($REMAT_DEBIAN13_ROOT,
# default /var/cache/remat/debian13: outside the checkout, so a fresh clone finds it); packages are
# installed by the project's own scripts/setup.sh inside it; the build goes to build-debian13/.
# Arguments are passed to ctest (scripts/test-debian13.sh -R checkpoint). Needs root (chroot, mount).
# REMAT_DEBIAN13_COMMAND replaces the build-and-test command (run from the checkout in the chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
root=${REMAT_DEBIAN13_ROOT:-/var/cache/remat/debian13}
mirror=${REMAT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
build_dir=${REMAT_DEBIAN13_BUILD:-build-debian13}

[ "$(id -u)" -eq 0 ] || { echo "test-debian13: needs root (debootstrap, chroot and bind mounts); run it with sudo" >&2; exit 2; }

if [ ! -e "$root/.remat-debootstrap-complete" ]; then
  command -v debootstrap > /dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap > /dev/null
  }
  echo "test-debian13: creating the Debian 13 chroot in $root (once)" >&2
  rm -rf "$root.partial"
  mkdir -p "$(dirname "$root")"
  # contrib: libtorch-cuda-dev, for scripts/check-cuda-build.sh.
  debootstrap --variant=minbase --components=main,contrib trixie "$root.partial" "$mirror" > "$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log" >&2; echo "test-debian13: debootstrap failed (log: $root.debootstrap.log)" >&2; exit 1; }
  rm -rf "$root"
  mv "$root.partial" "$root"
  touch "$root/.remat-debootstrap-complete"
fi

if [ -n "${REMAT_DEBIAN13_COMMAND:-}" ]; then
  command=$REMAT_DEBIAN13_COMMAND
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
