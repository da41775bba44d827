#!/usr/bin/env bash
# What a node's idle sandboxes cost it, for one build, on a throwaway `corral up` of its own:
# with N idle sandboxes (64 MiB disks, so many fit), corrald's own CPU per second over 30 s
# (the reaper asks every sandbox's status every second, the sampler reads its cgroups), then
# create latency with them there (CREATES=N sequential creates through the API, each timed by
# curl, 250 ms apart) and corral-runcd's CPU per create over them. Run it with N=0 and N=300 to
# see what the sandboxes already on a node add to a create. Usage: scripts/bench-idle.sh [BIN_DIR] [N] (default bin/ and 300).
set -euo pipefail
cd "$(dirname "$0")/.."
bindir=$(cd "${1:-bin}" && pwd)
n=${2:-300}
work=$(mktemp -d /tmp/crl-idle-XXXX)
port=${BENCH_PORT:-7791}
export CORRAL_URL=http://127.0.0.1:$port
cleanup() {
  [ -n "${pid:-}" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  "$bindir/corral" down --data-dir "$work/data" >/dev/null 2>&1 || echo "bench-idle: corral down of $work/data failed" >&2
  rmdir /sys/fs/cgroup/corral-id /sys/fs/cgroup/*/corral-id 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$bindir/corral" up --data-dir "$work/data" --listen "127.0.0.1:$port" --e2b-listen "127.0.0.1:$((port + 1))" \
  --cgroup-parent /corral-id --disk-pool 2 --sandbox-disk 64M --net-tag id --net-pool 10.252.17.0/24 >"$work/corral.log" 2>&1 &
pid=$!
for _ in $(seq 200); do curl -fsS "$CORRAL_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
tok=$(cat "$work/data/admin.token")
scripts/busybox-rootfs.sh "$work/rootfs" >/dev/null
CORRAL_TOKEN=$tok "$bindir/corral" layer import base:bench --kind base --dir "$work/rootfs" >/dev/null
create() {
  curl -fsS -H "Authorization: Bearer $tok" -d '{"base":"base:bench"}' "$CORRAL_URL/v1/sandboxes" -o /dev/null -w '%{time_total}\n'
}
for _ in $(seq "$n"); do create >/dev/null; done
dpid=$(pgrep -f "corrald up --data-dir $work/data" | head -1)
sleep 5
ticks() { awk '{print $14 + $15}' "/proc/$dpid/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); sleep 30; t1=$(ticks)
cpu=$(( (t1 - t0) * 1000 / hz / 30 ))
# corral-runcd's CPU over those creates (it starts each sandbox; its work per create must not
# grow with the sandboxes already there). None when it is off.
rpid=$(pgrep -P "$dpid" -f 'corral-runcd serve' | head -1 || true)
rticks() { if [ -n "$rpid" ]; then awk '{print $14 + $15}' "/proc/$rpid/stat"; else echo 0; fi; }
r0=$(rticks)
times=$(for _ in $(seq "${CREATES:-40}"); do create; sleep 0.25; done | sort -n)
r1=$(rticks)
count=$(wc -l <<<"$times")
p50=$(sed -n "$(( (count + 1) / 2 ))p" <<<"$times")
p99=$(sed -n "$(( (count * 99 + 99) / 100 ))p" <<<"$times")
mounts=$(wc -l </proc/self/mountinfo)
printf '{"idle_sandboxes": %d, "corrald_cpu_ms_per_s": %d, "create_p50_ms": %.1f, "create_p99_ms": %.1f, "creates": %d, "host_mounts": %d, "runcd_cpu_ms_per_create": %.1f}\n' \
  "$n" "$cpu" "$(awk "BEGIN{print $p50*1000}")" "$(awk "BEGIN{print $p99*1000}")" "$count" "$mounts" "$(awk "BEGIN{print ($r1-$r0)*1000/$hz/$count}")"
