#!/usr/bin/env bash
# `make run`: start Corral on its embedded defaults (if it is not already up), publish a Debian
# base layer (base:debian-12, tagged base:default) if there is no base yet, and show sandboxes
# being created and used.
# Corral stays up afterwards; its log is in $DATA_DIR/corral.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/bin:$PATH"
DATA_DIR=${DATA_DIR:-/var/lib/corral}
export CORRAL_URL=${CORRAL_URL:-http://127.0.0.1:7070}
# step prints a command the way one would type it (single quotes where needed), then runs it.
step() {
  local out='$' a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@+-]+$ ]]; then out+=" $a"; else out+=" '${a//\'/\'\\\'\'}'"; fi
  done
  printf '\n\033[1m%s\033[0m\n' "$out"
  "$@"
}

if ! curl -fsS "$CORRAL_URL/healthz" >/dev/null 2>&1; then
  mkdir -p "$DATA_DIR"
  echo "starting corral up (data dir $DATA_DIR, log $DATA_DIR/corral.log)"
  # The log may hold what sandboxes print: root's alone (corral up closes it too).
  umask 077
  nohup corral up --data-dir "$DATA_DIR" >>"$DATA_DIR/corral.log" 2>&1 &
  for _ in $(seq 100); do curl -fsS "$CORRAL_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS "$CORRAL_URL/healthz" >/dev/null || { echo "corral did not come up; see $DATA_DIR/corral.log" >&2; tail -20 "$DATA_DIR/corral.log" >&2; exit 1; }
fi
export CORRAL_TOKEN=$(cat "$DATA_DIR/admin.token")

if ! corral layer ls -o json | grep -q '"name": *"base"'; then
  # A real Debian base (shell, coreutils, python3, git), built once and cached; busybox if that
  # cannot be built here (no Debian mirror reachable).
  if tarball=$(scripts/debian-base.sh); then
    step corral layer import base:debian-12 --kind base --tar "$tarball" --public
    step corral layer tag base:default debian-12
  else
    echo "could not build the Debian base; publishing a busybox one instead" >&2
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    scripts/busybox-rootfs.sh "$tmp/rootfs"
    step corral layer import base:default --kind base --dir "$tmp/rootfs" --public
  fi
fi
step corral info
step corral layer ls
id=$(corral create --base base:default --memory 256M --ttl 10m --label demo=make-run -o json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
echo "created sandbox $id"
step corral exec "$id" -- uname -a
step corral exec "$id" -- sh -c 'echo "hello from $(hostname), I am $(id -un)"; ls /'
echo 'print me' > /tmp/corral-demo.txt
step corral cp /tmp/corral-demo.txt "$id:/root/demo.txt"
step corral exec "$id" -- cat /root/demo.txt
step corral exec "$id" --user agent --cwd /tmp -- sh -c 'id; pwd'
set +e
step corral exec "$id" -- sh -c 'echo to stderr >&2; exit 3'
echo "(exit code $?)"
set -e
# The base's file data came from the blob store in chunks, only as the sandbox read it.
step corral layer stats base:default
step corral ttl "$id" 30m
step corral ls --state running
step corral rm "$id"
step corral get "$id"
if corral info -o json | grep -q '"network_pool"'; then
  # Egress policy: default deny; this sandbox may reach one address and port, nothing else.
  net=$(corral create --net-allow 203.0.113.7:443/tcp --ttl 10m --label demo=make-run -o json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
  echo "created networked sandbox $net"
  step corral exec "$net" -- sh -c 'ip -4 addr show eth0 | grep inet; cat /etc/resolv.conf | grep nameserver'
  step corral exec "$net" -- sh -c 'nc -w 1 198.51.100.1 80 </dev/null; getent hosts example.com || echo "example.com: not resolved"; echo "(both blocked)"'
  step corral net log "$net"
  step corral rm "$net"
fi
if corral info -o json | grep -q '"gvisor"'; then
  gv=$(corral create --runtime gvisor --ttl 10m --label demo=make-run -o json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
  echo "created gVisor sandbox $gv"
  step corral exec "$gv" -- sh -c 'dmesg | head -1; echo state > /root/kept'
  step corral pause "$gv"
  step corral exec "$gv" -- cat /root/kept
  step corral rm "$gv"
fi
if corral info -o json | grep -q '"microvm_accelerator"'; then
  # microvm: a VM with a kernel of its own per sandbox (QEMU; on KVM, or on TCG where KVM is
  # missing, which takes seconds to boot). Pause saves its memory to a file and ends QEMU.
  vm=$(corral create --tier microvm --memory 256M --ttl 10m --label demo=make-run -o json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
  echo "created microvm sandbox $vm (accelerator $(corral get "$vm" -o json | sed -n 's/.*"accelerator": *"\([^"]*\)".*/\1/p'))"
  step corral exec "$vm" -- sh -c 'echo "kernel $(uname -r) (the host runs $0)"; echo state > /root/kept' "$(uname -r)"
  step corral pause "$vm"
  step corral exec "$vm" -- cat /root/kept
  step corral rm "$vm"
fi
# Fncall: stateless calls in warm containers; nothing of one call is there for the next.
corral fncall rm demo 2>/dev/null || true
step corral fncall create demo --base base:default --pool-min 1 --pool-max 2 --timeout 10s
step corral call demo --file /tmp/corral-demo.txt=in.txt -- sh -c 'cat in.txt; echo secret > /root/left; sleep 300 & echo "left a file and a process"'
step corral call demo -- sh -c 'ls /root/left 2>&1; echo "sleep processes: $(grep -l ^sleep /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"'
step corral fncall ls
step corral fncall rm demo
rm -f /tmp/corral-demo.txt

# A code interpreter (Python, a Jupyter kernel, numpy, pandas, matplotlib, scipy), when installed:
# `corral env install code-interpreter` builds it once per host from Debian's packages (minutes).
if corral env get code-interpreter >/dev/null 2>&1; then
  ci=$(corral create --env code-interpreter --ttl 10m --label demo=make-run)
  echo "created code-interpreter sandbox $ci"
  step corral code "$ci" -c 'import numpy as np; xs = np.arange(10); print("squares:", xs ** 2)'
  step corral code "$ci" -c 'int(xs.sum())'
  step corral code "$ci" -c '1 / 0' || echo "(the traceback above; the kernel is still there)"
  step corral rm "$ci"
else
  echo; echo "(a code interpreter: corral env install code-interpreter, then make run shows it)"
fi

# Identity: a harness token for a project, a rollout subproject with 2 sandboxes of quota, and an
# agent token scoped to it. The agent works there, is refused the third sandbox, and sees nothing else.
echo; echo "== projects, tokens and quotas"
corral project rm --force demo-team 2>/dev/null || true
step corral project create demo-team
# as NAME CMD...: run CMD with the token in $NAME (printed by name, not by secret).
as() { local who=$1; shift; printf '\n\033[1m$ CORRAL_TOKEN=$%s %s\033[0m\n' "$who" "$*"; CORRAL_TOKEN=${!who} "$@"; }
HARNESS=$(corral token create --project demo-team --role owner --kind service --name demo-harness --ttl 1h 2>/dev/null)
echo '$ HARNESS=$(corral token create --project demo-team --role owner --kind service --name demo-harness --ttl 1h)'
as HARNESS corral project create demo-team/rollout-1
as HARNESS corral quota set demo-team/rollout-1 --sandboxes 2
AGENT=$(CORRAL_TOKEN=$HARNESS corral token create --project demo-team/rollout-1 --role user --kind agent --ttl 30m 2>/dev/null)
echo '$ AGENT=$(CORRAL_TOKEN=$HARNESS corral token create --project demo-team/rollout-1 --role user --kind agent --ttl 30m)'
as AGENT corral whoami
a1=$(CORRAL_TOKEN=$AGENT corral create --ttl 10m)
CORRAL_TOKEN=$AGENT corral create --ttl 10m >/dev/null
as AGENT corral exec "$a1" -- echo "agent in its own project"
as AGENT corral create --ttl 10m || echo "(refused: the rollout's quota is 2)"
as AGENT corral ls
other=$(corral create --ttl 5m)
as AGENT corral get "$other" || echo "(refused: $other is outside the agent's project)"
corral rm "$other" >/dev/null
step corral project tree
as HARNESS corral audit --project demo-team --limit 5
step corral project rm --force demo-team
# `corral up` runs as bin/corrald (the lean CLI execs it, same pid).
pid=$(pgrep -f "corrald? up --data-dir $DATA_DIR" | head -1)
printf '\nCorral is running at %s (pid %s); stop it with: kill %s (its sandboxes keep running),\nor remove it and everything it runs from this host with: corral down --data-dir %s\n' "$CORRAL_URL" "$pid" "$pid" "$DATA_DIR"
printf 'Try: export CORRAL_TOKEN=$(cat %s/admin.token); corral run -- echo hi\n' "$DATA_DIR"
printf 'The web console: open %s/ui/ and sign in with the token in %s/admin.token\n' "$CORRAL_URL" "$DATA_DIR"
