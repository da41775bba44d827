#!/usr/bin/env bash
# Writes a minimal root filesystem built from busybox-static into DIR: the small base layer that
# `make run` publishes as base:default and that tests use. Usage: busybox-rootfs.sh DIR
set -euo pipefail
dir=${1:?usage: busybox-rootfs.sh DIR}
bb=$(command -v busybox)
file -L "$bb" 2>/dev/null | grep -q 'statically linked' || { echo "busybox-rootfs: $bb is not static (apt-get install busybox-static)" >&2; exit 1; }
mkdir -p "$dir"/{bin,sbin,etc,root,tmp,home,proc,sys,dev,run,var/tmp,usr/bin,usr/sbin,workspace}
chmod 1777 "$dir/tmp" "$dir/var/tmp"
chmod 0700 "$dir/root"
cp "$bb" "$dir/bin/busybox"
for applet in $("$bb" --list); do
  [ "$applet" = busybox ] || [ -e "$dir/bin/$applet" ] || ln -s busybox "$dir/bin/$applet"
done
cat > "$dir/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
agent:x:1000:1000:agent:/home/agent:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
P
cat > "$dir/etc/group" <<'G'
root:x:0:
agent:x:1000:
nogroup:x:65534:
G
mkdir -p "$dir/home/agent" && chown 1000:1000 "$dir/home/agent"
echo 'corral' > "$dir/etc/hostname"
