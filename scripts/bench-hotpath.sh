#!/usr/bin/env bash
# Issue 24's hot-path figures for one build, on a throwaway `corral up` of its own: exec round
# trip and create→first exec (corral-bench container; TTI=N samples, default 10, SETTLE=D between
# samples, default 250ms; ALONE=N samples first with no other sandbox on the node, default 10; EXEC_GAP=D between a sample's create and its first exec; THROUGHPUT=N creates at concurrency 8, default 16), E2B
# commands.run vs Corral's exec (the pinned e2b SDK), fncall calls/s. Usage:
# scripts/bench-hotpath.sh [BIN_DIR] (default bin/; corral and corral-agent are taken from there,
# corral-bench from bin/). Run it for two builds back to back
# and compare the ratios, which carry their own baselines. UP_ARGS adds flags to its corral up. JSON goes to bench-out/hotpath-*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bindir=$(cd "${1:-bin}" && pwd)
tag=${HOTPATH_TAG:-$(basename "$(dirname "$bindir")")}
mkdir -p bench-out
work=$(mktemp -d /tmp/crl-hotpath-XXXX)
port=${BENCH_PORT:-7291}
export CORRAL_URL=http://127.0.0.1:$port
# corral up starts in a cgroup of its own, beside its sandboxes' parent, so that fncall can report
# the CPU time the whole Corral spent per call (cgroup v2, or v1's cpuacct hierarchy); as root on
# cgroup v2 it moves itself (and lazyd) into its reserved control cgroup, corral-hp-ctl, counted
# too.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then cgroot=/sys/fs/cgroup; else cgroot=/sys/fs/cgroup/cpuacct; fi
upcg=$cgroot/corral-hp-up
cleanup() {
  [ -n "${pid:-}" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  # What corral up leaves for its next start on purpose (LXCFS, lazyd and their mounts).
  "$bindir/corral" down --data-dir "$work/data" >/dev/null 2>&1 || echo "bench-hotpath: corral down of $work/data failed" >&2
  rmdir /sys/fs/cgroup/corral-hp /sys/fs/cgroup/*/corral-hp /sys/fs/cgroup/corral-hp-ctl /sys/fs/cgroup/*/corral-hp-ctl "$upcg" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# HOTPATH_PERF=FILE records corral up's CPU profile (perf record -g) for the run.
perf=()
[ -n "${HOTPATH_PERF:-}" ] && perf=(perf record -q -F 999 -g -o "$HOTPATH_PERF" --)
mkdir -p "$upcg"
(echo $BASHPID >"$upcg/cgroup.procs"; exec "${perf[@]}" "$bindir/corral" up --data-dir "$work/data" --listen "127.0.0.1:$port" --e2b-listen "127.0.0.1:$((port + 1))" \
  --cgroup-parent /corral-hp --disk-pool 4 --net-tag hp --net-pool 10.252.7.0/24 ${UP_ARGS:-} >"$work/corral.log" 2>&1) &
pid=$!
for _ in $(seq 200); do curl -fsS "$CORRAL_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
export CORRAL_TOKEN=$(cat "$work/data/admin.token")
scripts/busybox-rootfs.sh "$work/rootfs"
"$bindir/corral" layer import base:bench --kind base --dir "$work/rootfs" >/dev/null
out=bench-out/hotpath-$tag
if [ "${HOTPATH_ONLY:-exec}" = exec ]; then
  bin/corral-bench container --base base:bench --tti ${TTI:-10} --settle ${SETTLE:-250ms} --exec-gap ${EXEC_GAP:-0s} --execs ${EXECS:-500} --throughput ${THROUGHPUT:-16} --alone ${ALONE:-10} --idle 0 -o json >"$out-container.json"
  jq -c '{exec: .exec_true_round_trip, runc_exec: .exec_baseline_runc_exec_true, ratio: .exec_ratio_p50, tti: .tti_create_to_first_exec, tti_ratio: .tti_ratio_p50, create: .tti_create.p50_ms, first_exec: .tti_first_exec.p50_ms, second_exec: .tti_second_exec.p50_ms, alone: .tti_alone_create_to_first_exec, alone_ratio: .tti_alone_ratio_p50, alone_create: .tti_alone_create.p50_ms, alone_first_exec: .tti_alone_first_exec.p50_ms}' "$out-container.json"
fi
# HOTPATH_ONLY=warm (not part of the default run): warm pools, corral-bench warm (TTI from a full
# pool, a burst of BURST from a pool of BURST, SUSTAINED create-then-delete steps with the pool
# refilling); pass UP_ARGS="--disk-pool 1 --sandbox-disk 64M" so that the pool's disks fit.
if [ "${HOTPATH_ONLY:-}" = warm ]; then
  bin/corral-bench warm --base base:bench --burst ${BURST:-64} --concurrency 8 --tti ${TTI:-50} --sustained ${SUSTAINED:-500} -o json >"$out-warm.json"
  jq -c '.' "$out-warm.json" | head -c 3000; echo
fi
if [ "${HOTPATH_ONLY:-e2b}" = e2b ]; then
  sdk=$(scripts/e2b-sdk.sh)
  bin/corral-bench e2b --base base:bench --e2b-url "http://127.0.0.1:$((port + 1))" --sdk-dir "$sdk" --script test/e2b/bench.mjs \
    --creates 3 --runs ${E2B_RUNS:-200} --builds 0 -o json >"$out-e2b.json"
  jq -c '{sdk_run: .e2b_sdk.run_true, corral_run: .corral_api.run_true, ratio: .run_true_ratio_p50, corral_login_shell: .corral_api.run_login_shell_true, login_shell_ratio: .run_true_vs_login_shell_ratio_p50, argv: .login_shell_argv}' "$out-e2b.json"
fi
if [ "${HOTPATH_ONLY:-fncall}" = fncall ]; then
  cpucgs="$upcg,$cgroot/corral-hp"
  # On cgroup v2 corral up moved itself into its control cgroup (v1: the cpu and memory
  # hierarchies only, so cpuacct still finds it in corral-hp-up).
  [ -d "$cgroot/corral-hp-ctl" ] && cpucgs="$cpucgs,$cgroot/corral-hp-ctl"
  bin/corral-bench fncall --base base:bench --calls 100 --throughput ${FNCALLS:-1000} \
    --cpu-cgroups "$cpucgs" -o json >"$out-fncall.json"
  jq -c '.' "$out-fncall.json" | head -c 1500; echo
fi
