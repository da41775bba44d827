#!/usr/bin/env bash
# What compiling Docker's seccomp profile costs runc per start (the cost internal/seccompbpf
# takes off a runc sandbox's create): N `runc run` of /bin/true from one busybox rootfs, with no
# profile and with the profile a runc sandbox has (native architecture, Docker's default for its
# capabilities), taking turns, 3 rounds; prints CPU (user + system) and wall time per start.
# Usage: scripts/bench-seccomp-start.sh [N] (default 40; root).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-40}
runc=$(ls -d /var/cache/corral/runc/*/runc | tail -1)
work=$(mktemp -d /tmp/crl-scb-XXXX)
trap 'rm -rf "$work" "$gen"' EXIT
gen=$(mktemp -d "$PWD/.seccomp-gen-XXXX")
cat >"$gen/main.go" <<'GO'
package main

import (
	"encoding/json"
	"os"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func main() {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
		"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}
	p, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}}})
	if err != nil {
		panic(err)
	}
	p.Architectures = p.Architectures[:1]
	json.NewEncoder(os.Stdout).Encode(p)
}
GO
go run "./$(basename "$gen")" >"$work/profile.json"
scripts/busybox-rootfs.sh "$work/rootfs" >/dev/null
mkdir -p "$work/plain" "$work/profile"
(cd "$work/plain" && "$runc" spec)
jq --arg root "$work/rootfs" '.process.args=["/bin/true"] | .process.terminal=false | .root.path=$root | .root.readonly=true' \
  "$work/plain/config.json" >"$work/c" && mv "$work/c" "$work/plain/config.json"
jq --slurpfile p "$work/profile.json" '.linux.seccomp=$p[0]' "$work/plain/config.json" >"$work/profile/config.json"
starts() { # bundle: "cpu_ms wall_ms" per start
  local t0 w0 t1 w1 me=$BASHPID # the command substitution running this; runc's CPU lands here
  read -r t0 < <(awk '{print $14+$15+$16+$17}' "/proc/$me/stat")
  w0=$(date +%s%N)
  for i in $(seq "$n"); do (cd "$1" && "$runc" run "crl-scb-$me-$i" >/dev/null); done
  w1=$(date +%s%N)
  read -r t1 < <(awk '{print $14+$15+$16+$17}' "/proc/$me/stat")
  echo "$(( (t1 - t0) * 1000 / $(getconf CLK_TCK) / n )) $(( (w1 - w0) / 1000000 / n ))"
}
echo "round  no-profile cpu/wall ms  profile cpu/wall ms"
for r in 1 2 3; do
  echo "$r      $(starts "$work/plain")              $(starts "$work/profile")"
done
