#!/usr/bin/env bash
# Builds a toolkit tree in DIR from this host's Python 3: the interpreter, its standard library
# and the shared libraries it loads (by the names the loader uses), so that a base without Python
# (the busybox test base) can run Python calls. Used by the warm-interpreter test and benchmark.
set -euo pipefail
dir=${1:?usage: host-python-toolkit.sh DIR}
py=$(readlink -f /usr/bin/python3) || { echo "host-python-toolkit: no /usr/bin/python3 (apt-get install python3)" >&2; exit 1; }
ver=$(basename "$py")
mkdir -p "$dir"
libs=()
# The interpreter's libraries and those of its extension modules (_sqlite3, _ssl, ...).
for f in $(ldd "$py" /usr/lib/"$ver"/lib-dynload/*.so 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && /^[ \t]/ {print $1}' | sort -u); do
  libs+=("${f#/}")
done
cd /
cp -L --parents "${py#/}" "${libs[@]}" "$dir"
cp -a --parents "usr/lib/$ver" "$dir"
rm -rf "$dir/usr/lib/$ver/config-"*
ln -sf "$ver" "$dir/usr/bin/python3"
