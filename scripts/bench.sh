#!/usr/bin/env bash
# `make bench`: start a throwaway `corral up` on its own data dir and port, publish the busybox
# base, run `corral bench container`, print the figures (and keep them as JSON in bench-out/),
# then stop corral and remove its data. The numbers go into docs/BENCHMARKS.md by hand, with the
# date and this command.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/bin:$PATH"
mkdir -p bench-out
# BENCH_ONLY=iam needs no server (authorisation and quota admission on a store of its own), so it
# runs first, and alone it stops here.
if [ "${BENCH_ONLY:-iam}" = iam ]; then
  corral bench iam ${BENCH_IAM_ARGS:-} -o json | tee bench-out/iam.json
  if [ "${BENCH_ONLY:-}" = iam ]; then exit 0; fi
fi
# BENCH_ONLY=placement needs no server either (the placement engine on simulated edges).
if [ "${BENCH_ONLY:-placement}" = placement ]; then
  corral bench placement ${BENCH_PLACEMENT_ARGS:-} -o json | tee bench-out/placement.json
  if [ "${BENCH_ONLY:-}" = placement ]; then exit 0; fi
fi
# BENCH_ONLY=trace: create→first exec and exec with and without OTLP trace export (two corral
# up of its own, one exporting to a local sink; scripts/bench-trace.sh).
if [ "${BENCH_ONLY:-trace}" = trace ]; then
  TTI=${TTI:-60} EXEC=${EXEC:-300} scripts/bench-trace.sh
  if [ "${BENCH_ONLY:-}" = trace ]; then exit 0; fi
fi
# BENCH_ONLY=cluster starts its own PostgreSQL, 2 servers, 3 edges and two `corral up`s (and
# stops them all), so it needs only a base rootfs.
if [ "${BENCH_ONLY:-cluster}" = cluster ]; then
  cwork=$(mktemp -d /tmp/crl-bench-XXXX)
  trap 'rm -rf "$cwork"' EXIT
  scripts/busybox-rootfs.sh "$cwork/rootfs"
  corral bench cluster --rootfs "$cwork/rootfs" ${BENCH_CLUSTER_ARGS:-} -o json | tee bench-out/cluster.json
  rm -rf "$cwork"
  trap - EXIT
  if [ "${BENCH_ONLY:-}" = cluster ]; then exit 0; fi
fi
# BENCH_ONLY=lazy starts its own S3 server (versitygw, built once by scripts/install-versitygw.sh),
# a delaying proxy in front of it and a fresh `corral up` per cell (and stops them all), so it
# needs only a base rootfs. About 15 minutes; JSON on stdout, the summary on stderr.
if [ "${BENCH_ONLY:-lazy}" = lazy ]; then
  lwork=$(mktemp -d /tmp/crl-bench-XXXX)
  trap 'rm -rf "$lwork"' EXIT
  scripts/busybox-rootfs.sh "$lwork/rootfs"
  corral bench lazy --rootfs "$lwork/rootfs" --versitygw "$(scripts/install-versitygw.sh)" ${BENCH_LAZY_ARGS:-} -o json | tee bench-out/lazy.json
  rm -rf "$lwork"
  trap - EXIT
  if [ "${BENCH_ONLY:-}" = lazy ]; then exit 0; fi
fi
# BENCH_ONLY=console: the web console's sandbox list with BENCH_CONSOLE_N (1000) sandboxes, loaded
# in headless Chromium, against the API's list call in the same run (a go test with its own
# corral up; needs chromium, which make setup installs).
if [ "${BENCH_ONLY:-console}" = console ]; then
  CORRAL_BIN="$PWD/bin" CORRAL_BENCH_CONSOLE="${BENCH_CONSOLE_N:-1000}" go test ./internal/e2e \
    -run 'TestConsoleListLoad$' -count=1 -v -timeout 60m | grep -E 'console list|sandbox records|^(--- |ok|FAIL)'
  if [ "${BENCH_ONLY:-}" = console ]; then exit 0; fi
fi
work=$(mktemp -d /tmp/crl-bench-XXXX)
# Free ports, and host resources of this run's own (the host registry gives the data dir a
# network tag, address pool and NFLOG group no other Corral holds), so two benches, a `make
# run` and tests can share the host.
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=${BENCH_PORT:-$(freeport)}
e2bport=${BENCH_E2B_PORT:-$(freeport)}
cgparent=/corral-$(basename "$work")
export CORRAL_URL=http://127.0.0.1:$port
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  # The cgroup parent corral made (empty once its sandboxes are gone).
  rmdir /sys/fs/cgroup"$cgparent" /sys/fs/cgroup/*"$cgparent" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
corral up --data-dir "$work/data" --listen "127.0.0.1:$port" --e2b-listen "127.0.0.1:$e2bport" --cgroup-parent "$cgparent" --disk-pool ${DISK_POOL:-8} >"$work/corral.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -fsS "$CORRAL_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
export CORRAL_TOKEN=$(cat "$work/data/admin.token")
scripts/busybox-rootfs.sh "$work/rootfs"
corral layer import base:bench --kind base --dir "$work/rootfs" >/dev/null
# BENCH_ONLY=container, warm, vm, microvm, lifecycle, fork, compose, rebuild, build, import, fncall, e2b, exclusive, volumes, observe, network, iam, placement, cluster or lazy runs one of them.
if [ "${BENCH_ONLY:-container}" = container ]; then
  corral bench container --base base:bench ${BENCH_ARGS:-} -o json | tee bench-out/container.json
fi
if [ "${BENCH_ONLY:-warm}" = warm ]; then
  corral bench warm --base base:bench ${BENCH_WARM_ARGS:-} -o json | tee bench-out/warm.json
fi
if [ "${BENCH_ONLY:-vm}" = vm ]; then
  # The project's Debian image: built once per machine (cached in /var/cache/corral/vm-image).
  corral vm-image build debian-vm:bench >/dev/null
  corral bench vm --image debian-vm:bench --base base:bench ${BENCH_VM_ARGS:-} | tee bench-out/vm.json
fi
if [ "${BENCH_ONLY:-desktop}" = desktop ]; then
  # BENCH_ONLY=desktop runs this one alone. The desktop recipe's layer: built once per machine
  # (cached in /var/cache/corral/recipes).
  corral env install desktop >/dev/null
  corral vm-image build debian-vm:bench >/dev/null
  corral bench desktop --vm-image debian-vm:bench ${BENCH_DESKTOP_ARGS:-} -o json | tee bench-out/desktop.json
fi
if [ "${BENCH_ONLY:-microvm}" = microvm ]; then
  corral bench microvm --base base:bench ${BENCH_MICROVM_ARGS:-} | tee bench-out/microvm.json
  # Claims from a warm pool of booted VMs against booted VMs of the same shape, in turn.
  corral bench microvm --warm --base base:bench ${BENCH_MICROVM_ARGS:-} | tee bench-out/microvm-warm.json
  # Restores from a template need a corral up with --microvm-templates: a second one, alone.
  kill "$pid" && wait "$pid" 2>/dev/null || true
  corral up --data-dir "$work/data" --listen "127.0.0.1:$port" --cgroup-parent "$cgparent" --no-net --microvm-templates >"$work/corral-templates.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -fsS "$CORRAL_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  corral bench microvm --templates --base base:bench ${BENCH_MICROVM_ARGS:-} | tee bench-out/microvm-templates.json
fi
if [ "${BENCH_ONLY:-lifecycle}" = lifecycle ]; then
  corral bench lifecycle --base base:bench ${BENCH_LIFECYCLE_ARGS:-} | tee bench-out/lifecycle.json
fi
if [ "${BENCH_ONLY:-fork}" = fork ]; then
  corral bench fork --base base:bench ${BENCH_FORK_ARGS:-} -o json | tee bench-out/fork.json
fi
if [ "${BENCH_ONLY:-compose}" = compose ]; then
  corral bench compose --base base:bench ${BENCH_COMPOSE_ARGS:-} | tee bench-out/compose.json
fi
if [ "${BENCH_ONLY:-rebuild}" = rebuild ]; then
  corral bench rebuild --base base:bench --rootfs "$work/rootfs" ${BENCH_REBUILD_ARGS:-} | tee bench-out/rebuild.json
fi
if [ "${BENCH_ONLY:-build}" = build ]; then
  corral bench build --base base:bench --rootfs "$work/rootfs" ${BENCH_BUILD_ARGS:-} | tee bench-out/build.json
fi
if [ "${BENCH_ONLY:-import}" = import ]; then
  corral bench import ${BENCH_IMPORT_ARGS:-} | tee bench-out/import.json
fi
if [ "${BENCH_ONLY:-fncall}" = fncall ]; then
  scripts/host-python-toolkit.sh "$work/py" && corral layer import py:host --kind toolkit --dir "$work/py" >/dev/null
  corral bench fncall --base base:bench --python-toolkit py:host ${BENCH_FNCALL_ARGS:-} | tee bench-out/fncall.json
fi
if [ "${BENCH_ONLY:-e2b}" = e2b ]; then
  # The real e2b SDK (test/e2b, from the npm registry) through the E2B gateway vs the own API.
  sdk=$(scripts/e2b-sdk.sh)
  corral bench e2b --base base:bench --e2b-url "http://127.0.0.1:$e2bport" --sdk-dir "$sdk" --script test/e2b/bench.mjs ${BENCH_E2B_ARGS:-} -o json | tee bench-out/e2b.json
fi
if [ "${BENCH_ONLY:-exclusive}" = exclusive ]; then
  corral bench exclusive --base base:bench ${BENCH_EXCLUSIVE_ARGS:-} | tee bench-out/exclusive.json
fi
if [ "${BENCH_ONLY:-volumes}" = volumes ]; then
  # fio (Debian's, with its libraries) as a toolkit layer over the busybox base.
  scripts/fio-toolkit.sh "$work/fio" >/dev/null
  corral layer import fio:host --kind toolkit --dir "$work/fio" >/dev/null
  corral bench volumes --base base:bench --fio fio:host ${BENCH_VOLUMES_ARGS:-} | tee bench-out/volumes.json
fi
if [ "${BENCH_ONLY:-network}" = network ]; then
  # Starts its own lab internet (203.0.113.0/24 in a namespace) and its own corral up.
  corral bench network --rootfs "$work/rootfs" ${BENCH_NETWORK_ARGS:-} | tee bench-out/network.json
fi
echo
echo "corral up log: $(grep -c . "$work/corral.log") lines; errors:"; grep -c 'level=ERROR' "$work/corral.log" || true
