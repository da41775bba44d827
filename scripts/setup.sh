#!/usr/bin/env bash
# Installs what a fresh Debian host lacks to build, run and test Corral (run as root), then builds
# (once, cached under /var/cache/corral) a current runc. Safe to run again: it only installs what
# is missing.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (it installs Debian packages and builds runc into /var/cache/corral)" >&2
  exit 1
fi
# Go: the module needs Go 1.26 (see go.mod). A Go of 1.21 or newer fetches that toolchain by itself
# through the module proxy (GOTOOLCHAIN=auto); Debian's own golang-go (1.19) is too old for that.
command -v go >/dev/null || { echo "setup: Go is required on PATH: install Go 1.26 or newer (https://go.dev/doc/install)" >&2; exit 1; }
go version >/dev/null 2>&1 || { echo "setup: 'go version' failed; Corral needs Go 1.26 (go.mod)" >&2; exit 1; }

# command-or-file -> Debian package
declare -A want=(
  [busybox]=busybox-static
  [/usr/bin/python3]=python3
  # The Python SDK (sdk/python) installs into a venv: python3 -m venv --system-site-packages, then
  # pip install --no-build-isolation --no-index ./sdk/python (Debian's setuptools and wheel).
  [/usr/share/doc/python3-venv]=python3-venv
  [/usr/share/doc/python3-wheel]=python3-wheel
  [/usr/share/doc/python3-pip]=python3-pip
  [mkfs.ext4]=e2fsprogs
  [losetup]=mount
  [gcc]=gcc
  [pkg-config]=pkg-config
  [/usr/include/seccomp.h]=libseccomp-dev
  [tar]=tar
  [curl]=curl
  [file]=file
  # PostgreSQL: the store's conformance suite runs against a throwaway cluster of it
  # (internal/store/pgtest); `corral up --store postgres://...` uses any PostgreSQL 13+.
  [/usr/lib/postgresql]=postgresql
  # Node.js (20+) and npm: the E2B compatibility test drives Corral with the real e2b SDK
  # (test/e2b). Some Node.js builds bring npm along; Debian's own needs the npm package (below).
  [node]=nodejs
  # QEMU: the microvm tier boots each sandbox as a `-M microvm` VM (internal/guestimage).
  [qemu-system-x86_64]=qemu-system-x86
  [qemu-img]=qemu-utils
  # The vm tier: SeaBIOS boots its q35 machines; `corral vm-image build` makes the project's
  # Debian image (debootstrap, sfdisk) once, cached in /var/cache/corral/vm-image.
  [/usr/share/seabios/bios-256k.bin]=seabios
  [debootstrap]=debootstrap
  [sfdisk]=fdisk
  # LXCFS gives container sandboxes their own /proc/meminfo, cpuinfo, uptime, ... (internal/lxcfs).
  # corral up runs its own per data dir; Debian's lxcfs.service is disabled below.
  [lxcfs]=lxcfs
  # podman: the image check (internal/e2e/podman_test.go) builds Containerfiles with Debian's
  # podman and imports what `podman save --format docker-archive|oci-archive` writes.
  [podman]=podman
  # fio: the volume benchmark (docs/BENCHMARKS.md) runs the host's fio, copied with its
  # libraries into a toolkit layer, in a volume and in the sandbox's writable layer.
  [fio]=fio
  # Headless Chromium: the web console's tests (internal/e2e TestConsole*) drive it with chromedp;
  # DejaVu gives its screenshots legible text.
  [chromium]=chromium
  [/usr/share/fonts/truetype/dejavu]=fonts-dejavu-core
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
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Installing lxcfs enables Debian's lxcfs.service (a host-wide LXCFS on /var/lib/lxcfs): Corral
# starts and supervises its own, so turn that one off (no-op without systemd).
if [ -e /etc/systemd/system/multi-user.target.wants/lxcfs.service ]; then
  systemctl disable --now lxcfs >/dev/null 2>&1 || rm -f /etc/systemd/system/multi-user.target.wants/lxcfs.service
fi
if ! command -v npm >/dev/null; then
  echo "setup: installing npm" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
modprobe overlay 2>/dev/null || true
modprobe loop 2>/dev/null || true
modprobe erofs 2>/dev/null || true
modprobe fuse 2>/dev/null || true
grep -qw erofs /proc/filesystems || { echo "setup: this kernel has no EROFS (layers are EROFS images; Linux 5.4+ with CONFIG_EROFS_FS)" >&2; exit 1; }
grep -qw overlay /proc/filesystems || { echo "setup: this kernel has no overlayfs" >&2; exit 1; }
# Layer data reaches sandboxes through corral lazyd's FUSE mount (no fusermount needed: it mounts as root).
[ -c /dev/fuse ] || { echo "setup: /dev/fuse is missing (layer data is served through FUSE; CONFIG_FUSE_FS)" >&2; exit 1; }
"$(dirname "$0")/install-runc.sh" >/dev/null
# mkfs.erofs 1.8.6 for layer images (built once, ~1 minute, cached like runc).
"$(dirname "$0")/install-erofs-utils.sh" >/dev/null
# gVisor's runsc for `--runtime gvisor` (built once, ~2 minutes, cached like runc).
"$(dirname "$0")/install-runsc.sh" >/dev/null
# versitygw: the S3 server the blob store's S3 tests run against (built once, cached like runc).
"$(dirname "$0")/install-versitygw.sh" >/dev/null
# The microvm tier's guest kernel and modules (downloaded, not installed; cached per version).
"$(dirname "$0")/guest-kernel.sh" >&2
# Pause pushes a sandbox's memory to swap; without swap it can only return page cache.
"$(dirname "$0")/swap.sh" >&2 || echo "setup: no swap (pause will return page cache only)" >&2
echo "setup: ok (runc: $("$(dirname "$0")/install-runc.sh"), runsc: $("$(dirname "$0")/install-runsc.sh"))"
