"""The Python SDK's overhead against the Go SDK, measured in one run against one server.

    CORRAL_URL=... CORRAL_TOKEN=... python3 sdk/python/bench/bench.py --base base:bench

It runs the Go side (sdk/python/bench/gosdk, built with `go build`) and the same measurements
with corral.Corral and corral.AsyncCorral, then prints a Markdown table for docs/BENCHMARKS.md:
create -> first exec and exec round trip (p50/p99, ratio to Go), and a fleet of sandboxes created,
exec'd in and deleted concurrently (wall time and the client's CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import corral  # noqa: E402


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sync_side(base: str, creates: int, execs: int) -> Dict[str, List[float]]:
    c = corral.Corral()
    out: Dict[str, List[float]] = {"create_exec_ms": [], "exec_ms": []}
    for _ in range(creates):
        t0 = time.perf_counter()
        sb = c.create(base=base, ttl="10m")
        sb.exec(["true"]).check()
        out["create_exec_ms"].append((time.perf_counter() - t0) * 1000)
        sb.delete()
    sb = c.create(base=base, ttl="10m")
    for _ in range(execs):
        t0 = time.perf_counter()
        sb.exec(["true"]).check()
        out["exec_ms"].append((time.perf_counter() - t0) * 1000)
    sb.delete()
    c.close()
    return out


async def async_side(base: str, creates: int, execs: int, fleet: int,
                     pool: int) -> Dict[str, object]:
    out: Dict[str, object] = {}
    async with corral.AsyncCorral(max_connections=pool) as ac:
        ce, ex = [], []
        for _ in range(creates):
            t0 = time.perf_counter()
            sb = await ac.create(base=base, ttl="10m")
            (await sb.exec(["true"])).check()
            ce.append((time.perf_counter() - t0) * 1000)
            await sb.delete()
        sb = await ac.create(base=base, ttl="10m")
        for _ in range(execs):
            t0 = time.perf_counter()
            (await sb.exec(["true"])).check()
            ex.append((time.perf_counter() - t0) * 1000)
        await sb.delete()
        out["create_exec_ms"], out["exec_ms"] = ce, ex
        if fleet:
            async def one() -> None:
                async with await ac.create(base=base, ttl="10m") as s:
                    (await s.exec(["true"])).check()
            c0, t0 = cpu(), time.perf_counter()
            await asyncio.gather(*(one() for _ in range(fleet)))
            out["fleet_wall_s"], out["fleet_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="base:bench")
    ap.add_argument("--creates", type=int, default=30)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--fleet", type=int, default=256)
    ap.add_argument("--pool", type=int, default=128, help="AsyncCorral max_connections")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the clients")
    args = ap.parse_args()

    repo = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    with tempfile.TemporaryDirectory() as d:
        gobin = os.path.join(d, "gosdk")
        subprocess.run(["go", "build", "-o", gobin, "./sdk/python/bench/gosdk"], cwd=repo,
                       check=True)
        # Rounds alternate the three clients, so that the host's load drifting during the run
        # (the machine is shared) weighs on each alike.
        go: Dict[str, object] = {"create_exec_ms": [], "exec_ms": []}
        py: Dict[str, List[float]] = {"create_exec_ms": [], "exec_ms": []}
        apy: Dict[str, object] = {"create_exec_ms": [], "exec_ms": []}
        n_c, n_e = max(1, args.creates // args.rounds), max(1, args.execs // args.rounds)
        for r in range(args.rounds):
            fleet = args.fleet if r == args.rounds - 1 else 0
            g = json.loads(subprocess.run(
                [gobin, "-base", args.base, "-creates", str(n_c), "-execs", str(n_e),
                 "-fleet", str(fleet)], check=True, stdout=subprocess.PIPE).stdout)
            p = sync_side(args.base, n_c, n_e)
            a = asyncio.run(async_side(args.base, n_c, n_e, fleet, args.pool))
            for k in ("create_exec_ms", "exec_ms"):
                go[k] += g[k]  # type: ignore[operator]
                py[k] += p[k]
                apy[k] += a[k]  # type: ignore[operator]
            if fleet:
                go.update({k: g[k] for k in ("fleet_wall_s", "fleet_cpu_s")})
                apy.update({k: a[k] for k in ("fleet_wall_s", "fleet_cpu_s")})

    def row(name: str, key: str) -> None:
        g = go[key]  # type: ignore[index]
        cells = ["%.2f / %.2f ms" % (pct(g, 50), pct(g, 99))]
        for side in (py, apy):
            v = side[key]  # type: ignore[index]
            cells.append("%.2f / %.2f ms (%.2fx)" % (pct(v, 50), pct(v, 99), pct(v, 50) / pct(g, 50)))
        print("| %s | %s |" % (name, " | ".join(cells)))

    print("| measure | Go SDK p50 / p99 | Corral (sync) p50 / p99 (ratio) | AsyncCorral p50 / p99 (ratio) |")
    print("|---|---|---|---|")
    row("create -> first `true` exec (n=%d)" % args.creates, "create_exec_ms")
    row("exec `true` round trip (n=%d)" % args.execs, "exec_ms")
    if args.fleet:
        print()
        print("| %d sandboxes created, exec'd in, deleted at once | wall | client CPU |" % args.fleet)
        print("|---|---|---|")
        print("| Go SDK, one goroutine each | %.2f s | %.2f s |" % (go["fleet_wall_s"], go["fleet_cpu_s"]))
        print("| AsyncCorral (max_connections=%d), one task each | %.2f s (%.2fx) | %.2f s (%.2fx) |" % (
            args.pool, apy["fleet_wall_s"], apy["fleet_wall_s"] / go["fleet_wall_s"],  # type: ignore[operator]
            apy["fleet_cpu_s"], apy["fleet_cpu_s"] / go["fleet_cpu_s"]))  # type: ignore[operator]


if __name__ == "__main__":
    main()
