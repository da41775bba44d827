#!/usr/bin/env bash
# Before/after of the gVisor agent channel (issue 22 item 1), in one run: `corral bench lifecycle`
# (gVisor create -> first exec, pause -> resume -> exec) against two builds, alternating rounds so
# that the host's noise hits both alike. Usage:
#
#   scripts/bench-gvisor-channel.sh BASE_BIN_DIR NEW_BIN_DIR [ROUNDS]
#
# e.g. git worktree add /tmp/gv-base 439579e && (cd /tmp/gv-base && make build) &&
#      make build && scripts/bench-gvisor-channel.sh /tmp/gv-base/bin bin 2
# Writes bench-out/gvchan-{base,new}-N.json and prints, per build, the median of its rounds' p50s
# and the worst of their p99s, with runc's create -> first exec of each round as a load control.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(realpath "$1") new=$(realpath "$2") rounds=${3:-2}
args=${BENCH_GVCHAN_ARGS:---steps 1 --snapshot-mib 1 --tti 20 --pauses 10 --pause-mib 64}
mkdir -p bench-out
port=${BENCH_PORT:-7291}
work=$(mktemp -d /tmp/crl-gvc-XXXX)
scripts/busybox-rootfs.sh "$work/rootfs" >/dev/null
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rmdir /sys/fs/cgroup/corral-gvc /sys/fs/cgroup/*/corral-gvc 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
one() { # label bindir round
  local data="$work/data-$1-$3"
  "$2/corral" up --data-dir "$data" --listen "127.0.0.1:$port" --cgroup-parent /corral-gvc --disk-pool 4 \
    --net-tag gc --net-pool 10.252.7.0/24 >"$work/corral-$1-$3.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  export CORRAL_URL=http://127.0.0.1:$port CORRAL_TOKEN=$(cat "$data/admin.token")
  "$2/corral" layer import base:bench --kind base --dir "$work/rootfs" >/dev/null
  # shellcheck disable=SC2086
  "$2/corral" bench lifecycle --base base:bench $args >"bench-out/gvchan-$1-$3.json"
  kill "$pid" && wait "$pid" 2>/dev/null || true
  pid=
  rm -rf "$data"
}
for r in $(seq "$rounds"); do
  one base "$base" "$r"
  one new "$new" "$r"
done
python3 - "$rounds" <<'PY'
import json, statistics, sys
rounds = int(sys.argv[1])
res = {l: [json.load(open(f"bench-out/gvchan-{l}-{r}.json")) for r in range(1, rounds + 1)] for l in ("base", "new")}
rows = [("create -> first exec", lambda d: d["tti_gvisor"]),
        ("pause", lambda d: d["pause_gvisor"]["pause"]),
        ("resume", lambda d: d["pause_gvisor"]["resume"]),
        ("resume -> first exec", lambda d: d["pause_gvisor"]["resume_to_first_exec"])]
# Per build: the median of its rounds' p50s and the worst of their p99s (each round is one corral
# up). The control: runc's create -> first exec in the same corral up, to show each round's load.
print(f"{'gVisor':24} {'base p50/p99 ms':>18} {'new p50/p99 ms':>18} {'p50 new/base':>12}")
for name, f in rows:
    out = []
    for l in ("base", "new"):
        s = [f(d) for d in res[l]]
        out.append((statistics.median(x["p50_ms"] for x in s), max(x["p99_ms"] for x in s)))
    print(f"{name:24} {out[0][0]:8.1f} / {out[0][1]:7.1f} {out[1][0]:8.1f} / {out[1][1]:7.1f} {out[1][0] / out[0][0]:11.2f}x")
for l in ("base", "new"):
    print(f"{l}: per round, gVisor / runc create -> first exec p50:",
          " ".join(f"{d['tti_gvisor']['p50_ms']:.0f}/{d['tti_from_base']['p50_ms']:.0f}" for d in res[l]),
          f"(median ratio {statistics.median(d['tti_gvisor']['p50_ms'] / d['tti_from_base']['p50_ms'] for d in res[l]):.2f})")
PY
