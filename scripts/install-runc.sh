#!/usr/bin/env bash
# Builds a current runc from its Go module once, caches it under
# /var/cache/corral/runc/<version>/runc and prints that path.
# Debian's runc 1.1.5 predates the 2025 escape fixes (CVE-2025-31133 and friends), so Corral
# never uses it unless CORRAL_RUNC points at it explicitly.
set -euo pipefail
# Keep in step with runc.DefaultRunc (internal/runtime/runc), which is where Corral looks first.
version="${RUNC_VERSION:-v1.5.3}"
cache="${CORRAL_CACHE:-/var/cache/corral}/runc/${version}"
bin="$cache/runc"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
need=()
for p in gcc pkg-config; do command -v "$p" >/dev/null || need+=("$p"); done
[ -f /usr/include/seccomp.h ] || need+=(libseccomp-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-runc: installing ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod
go mod init corral.local/runcbuild >&2 2>/dev/null
go get "github.com/opencontainers/runc@${version}" >&2
mkdir -p "$cache"
CGO_ENABLED=1 go build -trimpath -tags seccomp \
  -ldflags "-X main.version=${version#v}" \
  -o "$bin.tmp" github.com/opencontainers/runc >&2
mv "$bin.tmp" "$bin"
echo "$bin"
