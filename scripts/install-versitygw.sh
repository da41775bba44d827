#!/usr/bin/env bash
# Builds the versitygw S3 gateway from its Go module once, caches it under
# /var/cache/corral/versitygw/<version>/versitygw and prints that path.
# The blobstore tests start it (posix backend over a temporary directory) as a real S3 server on
# 127.0.0.1; they skip when it is missing.
set -euo pipefail
# Keep in step with versitygwVersion in internal/blobstore/s3_test.go, which is where the tests look.
version="${VERSITYGW_VERSION:-v1.8.0}"
cache="${CORRAL_CACHE:-/var/cache/corral}/versitygw/${version}"
bin="$cache/versitygw"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod
go mod init corral.local/versitygwbuild >&2 2>/dev/null
go get "github.com/versity/versitygw@${version}" >&2
mkdir -p "$cache"
echo "install-versitygw: building versitygw ${version} (a minute or two, once)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-X main.Version=${version}" -o "$bin.tmp" github.com/versity/versitygw/cmd/versitygw >&2
mv "$bin.tmp" "$bin"
echo "$bin"
