#!/usr/bin/env bash
# The recipe of `corral vm-image build` (internal/vmimage embeds it and runs it with bash).
# Builds (once, cached under /var/cache/corral/vm-image/<key>/disk.qcow2, keyed by its inputs;
# $CORRAL_CACHE replaces /var/cache/corral) the disk of a full-machine VM: Debian (bookworm) with
# Debian's generic kernel (linux-image-amd64: VGA console, PS/2 keyboard, virtio), systemd and
# GRUB in the MBR, so that QEMU's default firmware (SeaBIOS) boots it on -M q35 with no -kernel.
# Prints the path of disk.qcow2 on stdout, progress on stderr. Fast when cached; concurrent runs
# wait on a lock. As root (loop devices, mounts, chroot); a few minutes once.
#
# Run VMs on a copy-on-write overlay, never on the cached file itself:
#   qemu-img create -f qcow2 -F qcow2 -b /var/cache/corral/vm-image/<key>/disk.qcow2 top.qcow2
# SeaBIOS boots the first disk only: with more than one disk give this one bootindex=0
#   (-drive file=top.qcow2,if=none,id=root -device virtio-blk-pci,drive=root,bootindex=0).
#
# The image:
#   disk        raw 4 GiB ($VM_IMAGE_SIZE) converted to qcow2; MBR, one ext4 partition labelled
#               corral-root (the root, by UUID in grub.cfg, by label in /etc/fstab)
#   boot        GRUB (i386-pc) with no menu (timeout 0); kernel command line
#               console=ttyS0,115200 console=tty0 quiet (tty0 last: the screen is /dev/console)
#   screen      tty1 logs root in by itself (a root shell on the screen); a serial getty on ttyS0
#               (systemd's, from console=ttyS0). root's password is locked: no password logins.
#   power       dbus, so that systemd-logind turns the ACPI power button (QMP system_powerdown,
#               corral power ID off) into a clean shutdown
#   network     left unconfigured (no ifupdown, no networkd config): the agent sets up the NIC
#   trimmed     no recommends, docs, man pages, translations or apt lists; no kernel modules for
#               hardware a QEMU machine does not have (sound, media, wireless, bluetooth, the big
#               GPU drivers: $prune below); periodic timers, networkd and the tty2-6 gettys masked
#   /etc/corral-vm-image   recipe=<recipe> and suite=<suite>: what the VM was built from
#
# The agent disk and service (the contract with the host):
#   The host attaches the agent, a static ELF binary padded with zero bytes to a multiple of
#   4096, as an extra read-only virtio-blk disk whose serial is "corral-agent"
#   (QEMU: -drive file=agent.img,if=none,id=ag,format=raw,readonly=on
#          -device virtio-blk-pci,drive=ag,serial=corral-agent).
#   udev (/etc/udev/rules.d/90-corral-agent.rules) sees that disk (ID_SERIAL=corral-agent, link
#   /dev/disk/by-id/virtio-corral-agent) and pulls in corral-agent.service, which loads
#   qemu_fw_cfg, copies the disk to /run/corral/agent (a tmpfs of its own mounted there, mode
#   0700: /run itself is noexec) and runs `/run/corral/agent vm` as root, restarting it a second
#   after it exits, for ever. The unit is not enabled: a VM booted without the agent disk never
#   starts it.
set -euo pipefail
suite=${DEBIAN_SUITE:-bookworm}
pkgs=${VM_IMAGE_PACKAGES:-linux-image-amd64,systemd-sysv,udev,grub-pc,kbd,e2fsprogs,procps,iproute2,ca-certificates,python3,less,zstd,dbus}
size=${VM_IMAGE_SIZE:-4G}
# The recipe: change it when this script changes what it builds (it is part of the cache key).
recipe=vm-image-3
# Kernel module directories (under /lib/modules/<release>/kernel) for hardware no QEMU machine has.
prune='sound drivers/media drivers/net/wireless net/wireless net/mac80211 drivers/bluetooth
  net/bluetooth drivers/infiniband drivers/staging drivers/iio drivers/isdn drivers/gpu/drm/amd
  drivers/gpu/drm/radeon drivers/gpu/drm/nouveau drivers/gpu/drm/i915'
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
key=$(printf '%s\n' "$suite" "$pkgs" "$recipe" | sha256sum | cut -c1-16)
root=${CORRAL_CACHE:-/var/cache/corral}/vm-image
out="$root/$key/disk.qcow2"
if [ -s "$out" ]; then
  echo "$out"; exit 0
fi

die() { echo "vm-image: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (loop devices, mounts, chroot)"
# The host's tools, from Debian's packages where one is missing.
need=()
for c in debootstrap:debootstrap sfdisk:fdisk losetup:mount partx:util-linux blkid:util-linux \
  mkfs.ext4:e2fsprogs qemu-img:qemu-utils flock:util-linux; do
  command -v "${c%%:*}" >/dev/null || need+=("${c#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "vm-image: installing ${need[*]}" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

mkdir -p "$root"
exec 9>"$root/.lock"
flock -n 9 || { echo "vm-image: waiting for another build (lock $root/.lock)" >&2; flock 9; }
if [ -s "$out" ]; then # built by the run we waited for
  echo "$out"; exit 0
fi

work=$(mktemp -d "$root/build-XXXXXX")
mnt="$work/mnt"
dev=
# cleanup undoes whatever got done, in reverse: the chroot's mounts, the partition's, the loop
# device, the build directory. On success too (everything but the moved qcow2 goes). It never
# removes through a mount that is still there (the chroot's /dev is the host's).
cleanup() {
  local m
  for m in "$mnt/sys" "$mnt/proc" "$mnt/dev/pts" "$mnt/dev" "$mnt"; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" 2>/dev/null || umount -l "$m" || true; fi
  done
  if [ -n "$dev" ]; then losetup -d "$dev" 2>/dev/null || true; fi
  if awk -v w="$work/" 'index($5 "/", w) == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    echo "vm-image: $work still has mounts; left in place" >&2
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "vm-image: building a $size Debian $suite VM disk ($pkgs) from $mirror, once (a few minutes)" >&2
raw="$work/disk.raw"
truncate -s "$size" "$raw"
# MBR, one bootable Linux partition from 1 MiB (the gap before it holds GRUB's core.img).
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$raw" >&2
dev=$(losetup -f -P --show "$raw")
part="${dev}p1"
# losetup -P does not always scan the table (some kernels, containers): partx adds the partition.
for _ in 1 2 3 4 5 6 7 8 9 10; do
  [ -b "$part" ] && break
  partx -a "$dev" 2>/dev/null || true
  sleep 0.2
done
if [ ! -b "$part" ] && [ -r "/sys/class/block/${part#/dev/}/dev" ]; then # no devtmpfs node
  IFS=: read -r maj min < "/sys/class/block/${part#/dev/}/dev"
  mknod "$part" b "$maj" "$min"
fi
[ -b "$part" ] || die "no partition device $part on $dev"
# Inode tables and journal zeroed now, not by the guest's ext4lazyinit on every VM's first boot.
# No orphan_file or metadata_csum_seed: bookworm's GRUB 2.06 cannot read them.
mkfs_opts=(-q -L corral-root -E lazy_itable_init=0,lazy_journal_init=0)
mkfs.ext4 "${mkfs_opts[@]}" -O ^orphan_file,^metadata_csum_seed "$part" 2>/dev/null ||
  mkfs.ext4 "${mkfs_opts[@]}" -O ^metadata_csum_seed "$part" >&2
uuid=$(blkid -s UUID -o value "$part")
[ -n "$uuid" ] || die "no UUID on $part"
mkdir -p "$mnt"
mount "$part" "$mnt"

echo "vm-image: debootstrap" >&2
# INITRD=No: the kernel's postinst makes no initramfs (one is made below, once, after pruning).
# grub-pc's postinst installs GRUB nowhere (no devices chosen): it goes into the MBR below.
INITRD=No debootstrap --variant=minbase --include="$pkgs" "$suite" "$mnt" "$mirror" >&2
echo "vm-image: configuring" >&2
for m in dev dev/pts proc sys; do
  mkdir -p "$mnt/$m"
  case $m in
    dev | dev/pts) mount --bind "/$m" "$mnt/$m" ;;
    proc) mount -t proc proc "$mnt/proc" ;;
    sys) mount -t sysfs sysfs "$mnt/sys" ;;
  esac
done
in_root() { chroot "$mnt" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

echo corral-vm > "$mnt/etc/hostname"
cat > "$mnt/etc/hosts" <<'H'
127.0.0.1	localhost
127.0.1.1	corral-vm
::1		localhost ip6-localhost ip6-loopback
H
cat > "$mnt/etc/fstab" <<'F'
# <file system>		<mount point>	<type>	<options>		<dump>	<pass>
LABEL=corral-root	/		ext4	errors=remount-ro	0	1
F
in_root passwd -l root >&2
echo 'LANG=C.UTF-8' > "$mnt/etc/default/locale"
printf 'recipe=%s\nsuite=%s\n' "$recipe" "$suite" > "$mnt/etc/corral-vm-image"

# tty1: root's shell on the screen with no login.
mkdir -p "$mnt/etc/systemd/system/getty@tty1.service.d"
cat > "$mnt/etc/systemd/system/getty@tty1.service.d/autologin.conf" <<'U'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear %I $TERM
U

# The agent: pulled in by udev when the agent disk is there (see the header), never enabled.
cat > "$mnt/etc/udev/rules.d/90-corral-agent.rules" <<'U'
# The Corral agent's disk (virtio-blk, serial corral-agent; /dev/disk/by-id/virtio-corral-agent)
# starts corral-agent.service. Not only on "add": a later "change" event must keep the systemd tag.
ACTION!="remove", SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ENV{ID_SERIAL}=="corral-agent", TAG+="systemd", ENV{SYSTEMD_WANTS}+="corral-agent.service"
U
cat > "$mnt/etc/systemd/system/corral-agent.service" <<'U'
# Started by /etc/udev/rules.d/90-corral-agent.rules when the host attaches the agent's disk.
# It runs commands for the user as root, as sshd would: no sandboxing here.
[Unit]
Description=Corral agent
Requires=dev-disk-by\x2did-virtio\x2dcorral\x2dagent.device
After=dev-disk-by\x2did-virtio\x2dcorral\x2dagent.device systemd-udevd.service systemd-modules-load.service
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStartPre=-/sbin/modprobe qemu_fw_cfg
ExecStartPre=/bin/sh -c 'install -d -m 0700 /run/corral && { mountpoint -q /run/corral || mount -t tmpfs -o mode=0700,nosuid,nodev tmpfs /run/corral; }'
ExecStartPre=/bin/sh -c 'cat /dev/disk/by-id/virtio-corral-agent > /run/corral/agent.tmp && chmod 0700 /run/corral/agent.tmp && mv /run/corral/agent.tmp /run/corral/agent'
ExecStart=/run/corral/agent vm
Restart=always
RestartSec=1
# The agent ignores the signals commands could send it; at a stop (a shutdown: corral power off)
# its commands get SIGTERM and, 3 s later, everything SIGKILL.
TimeoutStopSec=3
U
mkdir -p "$mnt/etc/modules-load.d"
echo qemu_fw_cfg > "$mnt/etc/modules-load.d/corral.conf"

# A faster boot under TCG: nothing periodic, nothing a throwaway sandbox needs. (Masked rather than
# disabled, so no preset or package can turn them back on.) Absent units are masked harmlessly.
# getty-static starts gettys on tty2-6, useless where no password logs in.
for u in apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service \
  man-db.timer e2scrub_all.timer e2scrub_all.service e2scrub_reap.service fstrim.timer \
  dpkg-db-backup.timer systemd-timesyncd.service systemd-networkd-wait-online.service \
  systemd-networkd.service systemd-networkd.socket systemd-resolved.service getty-static.service; do
  rm -f "$mnt"/etc/systemd/system/*.wants/"$u"
  ln -sfn /dev/null "$mnt/etc/systemd/system/$u"
done

# The initramfs: MODULES=most (the host that builds is not the machine that boots); no resume.
mkdir -p "$mnt/etc/initramfs-tools/conf.d"
echo 'RESUME=none' > "$mnt/etc/initramfs-tools/conf.d/resume"
kver=$(basename "$(ls -d "$mnt"/lib/modules/* | sort -V | tail -1)")
[ -f "$mnt/boot/vmlinuz-$kver" ] || die "no kernel in /boot for $kver"
for d in $prune; do rm -rf "$mnt/lib/modules/$kver/kernel/$d"; done
in_root depmod "$kver"
in_root modinfo -k "$kver" qemu_fw_cfg >/dev/null || die "kernel $kver has no qemu_fw_cfg module"
echo "vm-image: initramfs for $kver" >&2
in_root update-initramfs -c -k "$kver" >&2

# GRUB: /etc/default/grub for anyone who runs update-grub later, but grub.cfg is written here (no
# grub-probe in a chroot on a loop device), and GRUB goes into the loop device's MBR.
cmdline='console=ttyS0,115200 console=tty0 quiet'
cat > "$mnt/etc/default/grub" <<G
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_TIMEOUT_STYLE=hidden
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX="console=ttyS0,115200 console=tty0"
GRUB_TERMINAL=console
GRUB_DISABLE_OS_PROBER=true
GRUB_DISABLE_RECOVERY=true
G
mkdir -p "$mnt/boot/grub"
cat > "$mnt/boot/grub/grub.cfg" <<G
# Written by Corral's vm image recipe ($recipe).
set default=0
set timeout=0
set timeout_style=hidden
terminal_output console
insmod part_msdos
insmod ext2
search --no-floppy --fs-uuid --set=root $uuid
menuentry 'Debian GNU/Linux ($suite, Corral VM)' {
	linux /boot/vmlinuz-$kver root=UUID=$uuid ro $cmdline
	initrd /boot/initrd.img-$kver
}
G
echo "vm-image: GRUB" >&2
in_root grub-install --target=i386-pc --modules="part_msdos ext2" "$dev" >&2

# Smaller: no apt lists, caches, docs, man pages, translations or logs.
find "$mnt/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
rm -rf "$mnt"/var/lib/apt/lists/* "$mnt"/var/cache/apt/*.bin "$mnt"/var/cache/apt/archives/*.deb \
  "$mnt"/var/cache/debconf/*-old "$mnt"/usr/share/doc/* "$mnt"/usr/share/man/* \
  "$mnt"/usr/share/info/* "$mnt"/var/log/*.log "$mnt"/var/log/apt/* "$mnt"/var/log/bootstrap.log \
  "$mnt"/root/.bash_history
# Every VM its own identity: systemd makes a machine-id at first boot when the file is empty
# (dbus's is a link to it), and a fresh random seed.
: > "$mnt/etc/machine-id"
rm -f "$mnt/var/lib/dbus/machine-id" "$mnt/var/lib/systemd/random-seed"
ln -s /etc/machine-id "$mnt/var/lib/dbus/machine-id"
for m in sys proc dev/pts dev; do umount "$mnt/$m"; done
# Freed blocks go back to the sparse file (the loop device passes discards on), so they are holes,
# not stale data, in the qcow2. sync first: blocks freed in an uncommitted transaction stay.
sync -f "$mnt/etc/hostname"
fstrim "$mnt" >&2 || true
umount "$mnt"
losetup -d "$dev"
dev=

echo "vm-image: converting to qcow2" >&2
qemu-img convert -f raw -O qcow2 "$raw" "$work/disk.qcow2"
rm -f "$raw"
mkdir -p "$root/$key"
mv "$work/disk.qcow2" "$out"
echo "$out"
