#!/usr/bin/env bash
# Builds one recipe's toolkit layer (internal/envinstall runs it, as root): the Debian base
# tarball unpacked as the lower directory of an overlay, a chroot of the overlay installs the
# recipe's Debian packages with apt (from the base's Debian mirror), the recipe's files are
# copied in, its check runs; what changed is then the overlay's upper directory, $WORK/upper,
# which the caller archives as the layer (whiteouts included).
# Inputs (environment): BASE_TAR, WORK (an empty directory), PACKAGES (space-separated), FILES
# (a directory copied over /, or empty), CHECK (a shell command run in the chroot, or empty).
set -euo pipefail
: "${BASE_TAR:?}" "${WORK:?}"
lower=$WORK/lower upper=$WORK/upper work=$WORK/work root=$WORK/root
mkdir -p "$lower" "$upper" "$work" "$root"
cleanup() {
  for m in "$root/etc/resolv.conf" "$root/dev" "$root/proc" "$root"; do
    if mountpoint -q "$m" 2>/dev/null; then umount -R "$m" 2>/dev/null || umount -lR "$m" || true; fi
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo "unpacking the Debian base"
tar -C "$lower" --numeric-owner -xzf "$BASE_TAR"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$root"
mount -t proc proc "$root/proc"
# apt's gpgv and dpkg need /dev/null and friends; the host's, read-only in spirit, for the build.
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
touch "$root/etc/resolv.conf"
mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }
if [ -n "${PACKAGES:-}" ]; then
  echo "apt-get update"
  in_root apt-get update -q
  echo "apt-get install $PACKAGES"
  # shellcheck disable=SC2086
  in_root apt-get install -y -q --no-install-recommends $PACKAGES
  in_root apt-get clean
fi
if [ -n "${FILES:-}" ]; then
  echo "adding the recipe's files"
  cp -a --no-preserve=ownership "$FILES/." "$root/"
fi
if [ -n "${CHECK:-}" ]; then
  echo "checking: $CHECK"
  in_root /bin/sh -c "$CHECK"
fi
echo "built"
