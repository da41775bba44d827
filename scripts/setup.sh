#!/usr/bin/env bash
# Installs what a fresh Debian host lacks to build, run and test Corral (run as root), then builds
# (once, cached under /var/cache/corral) a current runc. Safe to run again: it only installs what
# is missing.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (it installs Debian packages and builds runc into /var/cache/corral)" >&2
  exit 1
fi
command -v go >/dev/null || { echo "setup: Go 1.24 or newer is required on PATH (https://go.dev/doc/install)" >&2; exit 1; }

# command-or-file -> Debian package
declare -A want=(
  [busybox]=busybox-static
  [mkfs.ext4]=e2fsprogs
  [losetup]=mount
  [gcc]=gcc
  [pkg-config]=pkg-config
  [/usr/include/seccomp.h]=libseccomp-dev
  [tar]=tar
  [curl]=curl
)
missing=()
for what in "${!want[@]}"; do
  if [[ "$what" == /* ]]; then [ -e "$what" ] && continue; else command -v "$what" >/dev/null && continue; fi
  missing+=("${want[$what]}")
done
# busybox must be the static build: it is copied into sandbox layers.
if command -v busybox >/dev/null && ! file -L "$(command -v busybox)" 2>/dev/null | grep -q 'statically linked'; then
  missing+=(busybox-static)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" file >/dev/null
fi
modprobe overlay 2>/dev/null || true
modprobe loop 2>/dev/null || true
grep -qw overlay /proc/filesystems || { echo "setup: this kernel has no overlayfs" >&2; exit 1; }
"$(dirname "$0")/install-runc.sh" >/dev/null
echo "setup: ok (runc: $("$(dirname "$0")/install-runc.sh"))"
