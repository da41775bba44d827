#!/usr/bin/env bash
# Builds (once, cached under /var/cache/corral/debian-base/<key>/, keyed by its inputs) a Debian
# root filesystem with a shell, coreutils, python3, git and ca-certificates from Debian's packages
# (debootstrap), and prints the path of its tarball, ready for
#   corral layer import base:debian-12 --kind base --tar "$(scripts/debian-base.sh)"
# /dev, /proc and /sys are left empty (the runtime mounts them; layers carry no device nodes).
set -euo pipefail
suite=${DEBIAN_SUITE:-bookworm}
pkgs=${DEBIAN_PACKAGES:-python3,git,ca-certificates,procps,iproute2,netcat-openbsd,less}
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
key=$(printf '%s\n' "$suite" "$pkgs" "recipe-1" | sha256sum | cut -c1-16)
root=${CORRAL_CACHE:-/var/cache/corral}/debian-base
out="$root/$key/rootfs.tar.gz"
if [ -s "$out" ]; then
  echo "$out"; exit 0
fi
if ! command -v debootstrap >/dev/null; then
  echo "debian-base: installing debootstrap" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
fi
mkdir -p "$root"
work=$(mktemp -d "$root/build-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "debian-base: debootstrap $suite ($pkgs) from $mirror, once (a few minutes)" >&2
debootstrap --variant=minbase --include="$pkgs" "$suite" "$work/rootfs" "$mirror" >&2
r="$work/rootfs"
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb \
  "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/var/log/*
# An unprivileged user for commands that should not run as root.
chroot "$r" useradd --create-home --uid 1000 --shell /bin/bash agent >&2 || true
tar -C "$r" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -czf "$work/rootfs.tar.gz" .
mkdir -p "$root/$key"
mv "$work/rootfs.tar.gz" "$out"
echo "$out"
