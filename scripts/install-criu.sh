#!/usr/bin/env bash
# Builds CRIU (checkpoint/restore in user space, what `runc checkpoint` and `runc restore` run)
# once from Debian's source tarball and caches it under /var/cache/corral/criu/<version>/criu;
# prints that path. Not part of scripts/setup.sh: Corral does not use CRIU yet (runc sandboxes
# fork their disk only; docs/ARCHITECTURE.md, "Fork", says what stops a process fork).
# Why not Debian 12's criu (3.17.1): kernels from 6.13 map the vDSO's data as two areas
# ([vvar] and [vvar_vclock]) and 3.17 refuses them ("vdso: Unexpected rt vDSO area bounds"),
# so it cannot checkpoint anything there. CRIU 4.1 reads the new layout. The tarball is the one
# Debian unstable ships (4.2.1; Debian 13 ships 4.1.1: CRIU_VERSION=4.1.1 with its SHA-256 below),
# checked against the SHA-256 in Debian's Sources index.
# runc 1.3 runs the `criu` it finds on PATH (its --criu flag is ignored): put this file's
# directory first on runc's PATH to use it.
set -euo pipefail
version="${CRIU_VERSION:-4.2.1}"
case "$version" in
4.2.1) want=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9 ;;
4.1.1) want=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe ;;
*) want="" ;;
esac
sha256="${CRIU_SHA256:-$want}"
if [ -z "$sha256" ]; then
  echo "install-criu: no SHA-256 known for CRIU $version: set CRIU_SHA256 (Debian's Sources index has it)" >&2
  exit 1
fi
cache="${CORRAL_CACHE:-/var/cache/corral}/criu/${version}"
bin="$cache/criu"
# The cache is keyed by the tarball too: a different CRIU_SHA256 rebuilds.
if [ -x "$bin" ] && [ "$(cat "$cache/source.sha256" 2>/dev/null)" = "$sha256" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
# Build dependencies (the runtime libraries come with them): protobuf-c for CRIU's image
# format, libnl and libnet for network state, libnftables for its network lock, libcap,
# libbsd and uuid. No GnuTLS (only for page-server TLS).
need=()
for p in gcc make pkg-config curl xz-utils libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
  libprotobuf-dev libnl-3-dev libnet1-dev libcap-dev libbsd-dev libnftables-dev uuid-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "install-criu: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball="$work/criu_${version}.orig.tar.xz"
curl -fsSL -o "$tarball" "http://deb.debian.org/debian/pool/main/c/criu/criu_${version}.orig.tar.xz" || {
  echo "install-criu: CRIU $version is no longer in Debian's pool: pick the version a current suite ships (CRIU_VERSION, CRIU_SHA256)" >&2
  exit 1
}
echo "$sha256  $tarball" | sha256sum -c --quiet - >&2 || { echo "install-criu: checksum mismatch for $tarball" >&2; exit 1; }
tar -C "$work" -xJf "$tarball"
cd "$work/criu-${version}"
echo "install-criu: building CRIU ${version} (about three minutes on 2 CPUs, once)" >&2
make -j"$(nproc)" criu NO_GNUTLS=1 >"$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache"
cp criu/criu "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$sha256" >"$cache/source.sha256"
echo "$bin"
