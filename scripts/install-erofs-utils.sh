#!/usr/bin/env bash
# Builds erofs-utils (mkfs.erofs, fsck.erofs) once from Debian's source tarball and caches them
# under /var/cache/corral/erofs-utils/<version>/bin; prints the mkfs.erofs path.
# Why not Debian 12's erofs-utils (1.5): it cannot store 255-byte file names (fixed in 1.8.5), and
# its xattr order follows the source filesystem. The tarball is the one Debian 13 ships, checked
# against the SHA-256 in Debian's Sources index. Uncompressed images only: no compressors needed.
set -euo pipefail
# Keep in step with erofs.DefaultMkfs (internal/erofs), which is where Corral looks first.
version="${EROFS_UTILS_VERSION:-1.8.6}"
sha256="${EROFS_UTILS_SHA256:-5b221dc3fd6d151425b30534ede46fb7a90dc233a8659cba0372796b0a066547}"
cache="${CORRAL_CACHE:-/var/cache/corral}/erofs-utils/${version}"
bin="$cache/bin/mkfs.erofs"
if [ -x "$bin" ] && "$bin" -V >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
need=()
for p in autoconf automake libtool pkg-config make gcc uuid-dev zlib1g-dev curl; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "install-erofs-utils: installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball="$work/erofs-utils_${version}.orig.tar.gz"
curl -fsSL -o "$tarball" "http://deb.debian.org/debian/pool/main/e/erofs-utils/erofs-utils_${version}.orig.tar.gz"
echo "$sha256  $tarball" | sha256sum -c --quiet - >&2 || { echo "install-erofs-utils: checksum mismatch for $tarball" >&2; exit 1; }
tar -C "$work" -xzf "$tarball"
cd "$work/erofs-utils-${version}"
echo "install-erofs-utils: building erofs-utils ${version} (about a minute, once)" >&2
./autogen.sh >"$work/build.log" 2>&1
./configure --prefix="$cache" --disable-lz4 --disable-lzma --without-libdeflate --without-libzstd \
  --disable-fuse --without-selinux --without-xxhash >>"$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; exit 1; }
make -j"$(nproc)" >>"$work/build.log" 2>&1 || { tail -20 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache/bin.tmp"
cp mkfs/mkfs.erofs fsck/fsck.erofs "$cache/bin.tmp/"
rm -rf "$cache/bin"
mv "$cache/bin.tmp" "$cache/bin"
echo "$bin"
