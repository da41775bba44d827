#!/usr/bin/env bash
# Installs the e2b SDK pinned in test/e2b (package.json + package-lock.json) from the npm registry
# into a cache dir keyed by the lock file, once, and prints that dir. Its node_modules is what
# test/e2b's scripts import (ES modules ignore NODE_PATH: link it beside the script).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v npm >/dev/null || { echo "e2b-sdk.sh: npm is missing (scripts/setup.sh installs nodejs and npm)" >&2; exit 1; }
key=$(cat "$root/test/e2b/package.json" "$root/test/e2b/package-lock.json" | sha256sum | cut -c1-16)
cache="${CORRAL_CACHE:-/var/cache/corral}/e2b-sdk/$key"
if [ ! -d "$cache/node_modules/e2b" ]; then
  tmp=$(mktemp -d "${cache%/*}.tmp.XXXX" 2>/dev/null || { mkdir -p "${cache%/*}"; mktemp -d "${cache%/*}/.tmp.XXXX"; })
  cp "$root/test/e2b/package.json" "$root/test/e2b/package-lock.json" "$tmp/"
  (cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error >&2)
  mkdir -p "${cache%/*}"
  rm -rf "$cache"
  mv "$tmp" "$cache"
fi
echo "$cache"
