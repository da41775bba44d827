#!/usr/bin/env bash
# Two corral up on this host, one with user namespaces (default) and one with --no-userns; then
# corral bench userns against them.
set -euo pipefail
P1PORT=$((20000 + RANDOM % 20000)); P2PORT=$((P1PORT + 1))
B=${CORRAL:-$(dirname "$0")/../bin/corral}
D1=$(mktemp -d /tmp/bu1-XXXX); D2=$(mktemp -d /tmp/bu2-XXXX); R=$(mktemp -d /tmp/burf-XXXX)
/work/wt/userns/scripts/busybox-rootfs.sh $R >/dev/null
$B up --data-dir $D1 --listen 127.0.0.1:$P1PORT --disk-pool 4 --log-level warn > $D1.log 2>&1 &
P1=$!
$B up --data-dir $D2 --listen 127.0.0.1:$P2PORT --disk-pool 4 --no-userns --log-level warn > $D2.log 2>&1 &
P2=$!
trap 'kill $P1 $P2; wait; $B down --data-dir $D1 >/dev/null 2>&1; $B down --data-dir $D2 --no-userns >/dev/null 2>&1; rm -rf $D1 $D2 $R' EXIT
for i in $(seq 100); do [ -f $D1/admin.token ] && [ -f $D2/admin.token ] && curl -sf 127.0.0.1:$P1PORT/healthz >/dev/null && curl -sf 127.0.0.1:$P2PORT/healthz >/dev/null && break; sleep 0.2; done
sleep 1 # the token file may be written before the store has the token
for port in $P1PORT $P2PORT; do d=$D1; [ $port = $P2PORT ] && d=$D2
  CORRAL_URL=http://127.0.0.1:$port CORRAL_TOKEN=$(cat $d/admin.token) $B layer import base:bench --kind base --dir $R --public >/dev/null
done
uptime
CORRAL_URL=http://127.0.0.1:$P1PORT CORRAL_TOKEN=$(cat $D1/admin.token) $B bench userns --base base:bench --tti ${TTI:-50} --exec ${EXEC:-200} \
  --without-url http://127.0.0.1:$P2PORT --without-token-file $D2/admin.token
uptime
