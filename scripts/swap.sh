#!/usr/bin/env bash
# Makes sure the host has swap, which `corral pause` needs to hand a paused sandbox's memory back
# to the host (without swap a pause returns page cache only). If the host has no swap at all,
# creates and enables a swap file: path $1 (default /var/cache/corral/swapfile), size
# $CORRAL_SWAP_SIZE (default 4G, as fallocate and numfmt --from=iec read it). Idempotent: a host
# with any swap is left alone, and a swap file already at the path is enabled as it is. Prints
# what it did. As root. Not made permanent: the script prints the /etc/fstab line for that.
set -euo pipefail
file="${1:-/var/cache/corral/swapfile}"
size="${CORRAL_SWAP_SIZE:-4G}"

if [ -n "$(tail -n +2 /proc/swaps)" ]; then
  echo "swap: the host has swap already, nothing to do:"
  swapon --show
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "swap: the host has no swap, and making a swap file needs root" >&2
  exit 1
fi

# mkswap writes SWAPSPACE2 at the end of the first page.
is_swap_file() {
  [ -f "$1" ] && [ "$(dd if="$1" bs=1 skip=$(( $(getconf PAGESIZE) - 10 )) count=10 status=none 2>/dev/null)" = SWAPSPACE2 ]
}
if is_swap_file "$file"; then
  chmod 600 "$file"
  swapon "$file"
  echo "swap: enabled the swap file already at $file ($(du -h --apparent-size "$file" | cut -f1))"
  exit 0
fi
if [ -e "$file" ]; then
  echo "swap: $file exists and is not a swap file: remove it or name another path" >&2
  exit 1
fi

# fallocate is instant, but some filesystems refuse swap on fallocated extents (swapon fails):
# then the file is written out in full. btrfs needs `btrfs filesystem mkswapfile` instead.
make_swap() {
  rm -f "$file"
  if [ "$1" = fallocate ]; then
    fallocate -l "$size" "$file" || return 1
  else
    dd if=/dev/zero of="$file" bs=1M count=$(( ($(numfmt --from=iec "$size") + (1 << 20) - 1) >> 20 )) status=none || return 1
  fi
  chmod 600 "$file"
  mkswap -q "$file" && swapon "$file"
}
mkdir -p "$(dirname "$file")"
if make_swap fallocate 2>/dev/null; then
  how=fallocate
elif make_swap dd; then
  how=dd
else
  rm -f "$file"
  echo "swap: could not enable a swap file at $file: the filesystem under it may not hold one" >&2
  exit 1
fi
echo "swap: created and enabled a $size swap file at $file (written with $how)"
echo "swap: to keep it across reboots, add to /etc/fstab: $file none swap sw 0 0"
