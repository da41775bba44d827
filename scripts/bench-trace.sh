#!/usr/bin/env bash
# Two corral up on this host, one exporting traces over OTLP/HTTP to a local sink (a minimal
# receiver that answers every export with 200 and counts them) and one without; then corral
# bench trace against them. TTI=50 EXEC=200 by default.
set -euo pipefail
P1PORT=$((20000 + RANDOM % 20000)); P2PORT=$((P1PORT + 1)); SPORT=$((P1PORT + 2))
B=${CORRAL:-$(dirname "$0")/../bin/corral}
D1=$(mktemp -d /tmp/bt1-XXXX); D2=$(mktemp -d /tmp/bt2-XXXX); R=$(mktemp -d /tmp/btrf-XXXX)
"$(dirname "$0")"/busybox-rootfs.sh $R >/dev/null
python3 - $SPORT > $D1.sink.log 2>&1 <<'PY' &
import http.server, sys
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        global n
        body = self.rfile.read(int(self.headers.get('Content-Length', 0)))
        n += 1
        print(f"export {n} bytes {len(body)}", flush=True)
        self.send_response(200); self.send_header('Content-Type', 'application/x-protobuf'); self.send_header('Content-Length', '0'); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
PY
S=$!
$B up --data-dir $D1 --listen 127.0.0.1:$P1PORT --disk-pool 4 --log-level warn --otlp-endpoint http://127.0.0.1:$SPORT > $D1.log 2>&1 &
P1=$!
env -u OTEL_EXPORTER_OTLP_ENDPOINT $B up --data-dir $D2 --listen 127.0.0.1:$P2PORT --disk-pool 4 --log-level warn > $D2.log 2>&1 &
P2=$!
trap 'kill $P1 $P2 $S; wait; $B down --data-dir $D1 >/dev/null 2>&1; $B down --data-dir $D2 >/dev/null 2>&1; rm -rf $D1 $D2 $R' EXIT
for i in $(seq 100); do [ -f $D1/admin.token ] && [ -f $D2/admin.token ] && curl -sf 127.0.0.1:$P1PORT/healthz >/dev/null && curl -sf 127.0.0.1:$P2PORT/healthz >/dev/null && break; sleep 0.2; done
sleep 1 # the token file may be written before the store has the token
for port in $P1PORT $P2PORT; do d=$D1; [ $port = $P2PORT ] && d=$D2
  CORRAL_URL=http://127.0.0.1:$port CORRAL_TOKEN=$(cat $d/admin.token) $B layer import base:bench --kind base --dir $R --public >/dev/null
done
uptime
CORRAL_URL=http://127.0.0.1:$P1PORT CORRAL_TOKEN=$(cat $D1/admin.token) $B bench trace --base base:bench --tti ${TTI:-50} --exec ${EXEC:-200} \
  --without-url http://127.0.0.1:$P2PORT --without-token-file $D2/admin.token
uptime
sleep 2 # the last batch
echo "sink: $(wc -l < $D1.sink.log) OTLP exports, $(awk '{s+=$4} END {print s}' $D1.sink.log) bytes"
