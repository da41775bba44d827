#!/usr/bin/env bash
# `make fuzz`: run every Fuzz* target for FUZZTIME (default 20s) each, one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-20s}
grep -rl --include='*_test.go' '^func Fuzz' internal sdk | while read -r f; do
  pkg=./$(dirname "$f")
  # The SDK (sdk/go) is a module of its own: run each target from its package's directory.
  for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
    echo "== $pkg $target ($t)"
    # -run='^$': a running agent server reaps children process-wide, which would break fuzz workers.
    (cd "$pkg" && go test . -run='^$' -fuzz="^${target}\$" -fuzztime="$t" -fuzzminimizetime=2s)
  done
done
