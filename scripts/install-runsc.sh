#!/usr/bin/env bash
# Builds gVisor's runsc from its Go module once, caches it under
# /var/cache/corral/runsc/<version>/runsc and prints that path.
# gVisor's Go module is its `go` branch, which has no release tags: the version is a module
# pseudo-version (a commit of that branch). Debian's runsc is a 2022 build; Corral does not use it.
set -euo pipefail
# Keep in step with runc.DefaultRunsc (internal/runtime/runc), which is where Corral looks first.
version="${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
cache="${CORRAL_CACHE:-/var/cache/corral}/runsc/${version}"
bin="$cache/runsc"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod
go mod init corral.local/runscbuild >&2 2>/dev/null
go get "gvisor.dev/gvisor/runsc@${version}" >&2
mkdir -p "$cache"
echo "install-runsc: building runsc ${version} (a few minutes, once)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-X gvisor.dev/gvisor/runsc/version.version=${version}" \
  -o "$bin.tmp" gvisor.dev/gvisor/runsc >&2
mv "$bin.tmp" "$bin"
echo "$bin"
