#!/usr/bin/env bash
# Assembles a toolkit layer tree holding the host's fio (scripts/setup.sh installs Debian's) with
# every library it loads, under /opt/fio, and prints the directory, ready for
#   corral layer import fio:host --kind toolkit --dir "$(scripts/fio-toolkit.sh DIR)"
# Run it as /opt/fio/lib/ld-linux-x86-64.so.2 --library-path /opt/fio/lib /opt/fio/fio ... (the
# base need not have a loader). `corral bench volumes --fio fio:host` uses it.
set -euo pipefail
out=${1:?usage: fio-toolkit.sh DIR}
fio=$(command -v fio) || { echo "fio-toolkit: no fio on PATH (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$out/opt/fio/lib"
cp -L "$fio" "$out/opt/fio/fio"
ldd "$fio" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | while read -r lib; do
  [ -n "$lib" ] && cp -L "$lib" "$out/opt/fio/lib/"
done
echo "$out"
