#!/usr/bin/env bash
# Fetches the kernel that microvm sandboxes boot: Debian's current cloud kernel
# (linux-image-cloud-amd64 -> linux-image-<release>) with the few modules the guest needs, and
# caches it under /var/cache/corral/guest-kernel/<package>_<version>/ ($CORRAL_CACHE replaces
# /var/cache/corral, as in install-runc.sh):
#   vmlinuz          the bzImage QEMU boots with -kernel
#   config           the kernel's build config
#   VERSION          line 1 the kernel release (6.1.0-57-cloud-amd64), line 2 the package version
#   modules/*.ko     the guest's modules (plus the modules they depend on)
#   modules/order    their names (file names without .ko), one a line, dependencies first
#   .done            written last: the directory is complete
# and points /var/cache/corral/guest-kernel/current at it (internal/guestimage reads that).
# The package is downloaded and unpacked, never installed: installing would touch /boot and the
# bootloader. Idempotent and fast when cached (one apt-cache call, about a second); concurrent runs
# wait on a lock. Older kernel directories are kept. As root. Prints one line saying what it did.
set -euo pipefail

root="${CORRAL_CACHE:-/var/cache/corral}/guest-kernel"
meta=linux-image-cloud-amd64
# The guest's modules, as the guest loads them. The order here is only a preference: each module's
# dependencies (from its .modinfo) always come before it. Names compare with - and _ as equal, as
# the kernel does. A module built into this kernel (modules.builtin; rng-core in Debian's) needs no
# file and is left out.
wanted=(failover net_failover virtio_ring virtio virtio_mmio virtio_net virtio_blk virtio_console
  libcrc32c erofs overlay rng-core virtio-rng qemu_fw_cfg virtio_balloon)

die() { echo "guest-kernel: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it writes $root)"
for c in apt-cache apt-get dpkg-deb flock; do command -v "$c" >/dev/null || die "$c is missing (Debian's apt and dpkg)"; done

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9

# resolve sets pkg and version to the kernel package that linux-image-cloud-amd64's candidate
# depends on. One apt-cache call: the meta package pins its kernel with "(= version)", and each
# apt-cache run costs about a second where apt keeps no pkgcache (Debian's container images).
resolve() {
  local dep
  dep=$(apt-cache show --no-all-versions "$meta" 2>/dev/null |
    awk -F': ' '$1 == "Depends" { n = split($2, d, /, /); for (i = 1; i <= n; i++) if (d[i] ~ /^linux-image-/) { print d[i]; exit } }')
  pkg=${dep%% *}
  [ -n "$pkg" ] || return 1
  version=
  if [[ "$dep" =~ \(=\ ([^\)]+)\) ]]; then version=${BASH_REMATCH[1]}; fi
  if [ -z "$version" ]; then
    version=$(apt-cache policy "$pkg" 2>/dev/null | awk '$1 == "Candidate:" { print $2; exit }')
  fi
  [ -n "$version" ] && [ "$version" != "(none)" ]
}

point_current() {
  ln -sfn "$1" "$root/.current.tmp"
  mv -T "$root/.current.tmp" "$root/current"
}

if ! resolve; then
  apt-get update -qq >&2 || true
  if ! resolve; then
    if [ -f "$root/current/.done" ]; then
      echo "guest-kernel: cannot resolve $meta with apt; keeping $(readlink "$root/current")" >&2
      echo "guest-kernel: kept $(readlink -f "$root/current")"
      exit 0
    fi
    die "cannot resolve $meta to a kernel package with apt-cache (no apt lists or no mirror?)"
  fi
fi

name="${pkg}_${version}"
dest="$root/$name"
if [ -f "$dest/.done" ]; then
  point_current "$name"
  echo "guest-kernel: cached $dest (current)"
  exit 0
fi

work=$(mktemp -d "$root/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/deb" "$work/x" "$work/out" "$work/out/modules"
# apt-get download drops privileges to _apt when _apt can reach and write the target directory
# (else it warns and downloads as root).
if getent passwd _apt >/dev/null; then chmod 711 "$work"; chown _apt "$work/deb"; fi
if ! (cd "$work/deb" && apt-get download -qq "$pkg=$version" >/dev/null 2>"$work/download.err"); then
  # The lists may name a version the mirror has already replaced: refresh them once and retry.
  apt-get update -qq >&2 || true
  resolve || die "cannot resolve $meta after apt-get update"
  name="${pkg}_${version}"
  dest="$root/$name"
  if [ -f "$dest/.done" ]; then
    point_current "$name"
    echo "guest-kernel: cached $dest (current)"
    exit 0
  fi
  (cd "$work/deb" && apt-get download -qq "$pkg=$version" >/dev/null 2>"$work/download.err") ||
    die "apt-get download $pkg=$version failed: $(cat "$work/download.err")"
fi
debs=("$work"/deb/*.deb)
[ ${#debs[@]} = 1 ] && [ -f "${debs[0]}" ] || die "apt-get download $pkg=$version left no single .deb"
dpkg-deb -x "${debs[0]}" "$work/x"

release=${pkg#linux-image-}
mods="$work/x/lib/modules/$release"
[ -f "$work/x/boot/vmlinuz-$release" ] || die "$pkg has no boot/vmlinuz-$release"
[ -f "$work/x/boot/config-$release" ] || die "$pkg has no boot/config-$release"
[ -d "$mods/kernel" ] || die "$pkg has no lib/modules/$release/kernel"

# Index every module file by its normalized name.
declare -A path=()
while IFS= read -r -d '' f; do
  b=${f##*/}
  b=${b%.ko}
  n=${b//-/_}
  [ -z "${path[$n]:-}" ] || die "two modules named $n in $pkg: ${path[$n]#"$work/x/"} and ${f#"$work/x/"}"
  path[$n]=$f
done < <(find "$mods/kernel" -name '*.ko' -type f -print0)
[ ${#path[@]} -gt 0 ] || die "$pkg has no uncompressed .ko modules (compressed modules are not supported)"

is_builtin() { [ -f "$mods/modules.builtin" ] && sed 's,.*/,,; s,\.ko$,,; s,-,_,g' "$mods/modules.builtin" | grep -qx "$1"; }

# Depth-first, dependencies first; a module is added once. state: 1 visiting, 2 done.
declare -A state=()
order=()
visit() {
  local n=$1 from=$2 deps d
  case "${state[$n]:-0}" in
    2) return ;;
    1) die "module dependency cycle at $n" ;;
  esac
  if [ -z "${path[$n]:-}" ]; then
    if is_builtin "$n"; then state[$n]=2; return; fi
    die "module $n${from:+ (needed by $from)} is neither in $pkg as a .ko nor built in"
  fi
  state[$n]=1
  deps=$(tr '\0' '\n' <"${path[$n]}" | grep -a '^depends=' | head -n1 | cut -d= -f2-) ||
    die "module $n (${path[$n]#"$work/x/"}) has no depends= in its .modinfo"
  local IFS=,
  for d in $deps; do [ -n "$d" ] && visit "${d//-/_}" "$n"; done
  state[$n]=2
  d=${path[$n]##*/}
  order+=("${d%.ko}")
}
for w in "${wanted[@]}"; do visit "${w//-/_}" ""; done

out="$work/out"
cp "$work/x/boot/vmlinuz-$release" "$out/vmlinuz"
cp "$work/x/boot/config-$release" "$out/config"
printf '%s\n%s\n' "$release" "$version" >"$out/VERSION"
for m in "${order[@]}"; do cp "${path[${m//-/_}]}" "$out/modules/$m.ko"; done
printf '%s\n' "${order[@]}" >"$out/modules/order"
chmod -R u=rwX,go=rX "$out"
sync -f "$out/vmlinuz" 2>/dev/null || true

# A directory without .done is a leftover of an interrupted run: replace it.
rm -rf "$dest"
mv -T "$out" "$dest"
touch "$dest/.done"
point_current "$name"
echo "guest-kernel: fetched $pkg $version into $dest (${#order[@]} modules: ${order[*]}; current)"
