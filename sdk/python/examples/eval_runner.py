"""An evaluation runner: each task gets a fresh sandbox, its files, a command and a check.

Tasks run in a thread pool with the sync client (one Corral client shared by all threads); a
task that fails to run is reported, not fatal. The sandboxes are deleted by their `with` blocks.

    python3 eval_runner.py --base base:default --parallel 8
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import time
from typing import Dict, List

import corral

TASKS: List[Dict[str, object]] = [
    {"name": "sum", "files": {"/task/in.txt": b"1 2 3 4\n"},
     "run": "tr ' ' '\\n' < /task/in.txt | awk '{s+=$1} END {print s}'", "expect": "10"},
    {"name": "reverse", "files": {"/task/in.txt": b"abc\n"},
     "run": "rev /task/in.txt", "expect": "cba"},
    {"name": "count", "files": {"/task/in.txt": b"a\nb\nc\n"},
     "run": "wc -l < /task/in.txt", "expect": "3"},
]


def run_task(c: corral.Corral, base: str, task: Dict[str, object]) -> Dict[str, object]:
    t0 = time.monotonic()
    try:
        with c.create(base=base, ttl="10m", memory="256M", labels={"eval": str(task["name"])}) as sb:
            for path, data in dict(task["files"]).items():  # type: ignore[arg-type]
                sb.write_file(path, data, parents=True)
            r = sb.exec(["/bin/sh", "-c", str(task["run"])], timeout="60s")
            passed = r.exit_code == 0 and r.stdout.strip() == task["expect"]
            return {"task": task["name"], "passed": passed, "stdout": r.stdout.strip(),
                    "seconds": round(time.monotonic() - t0, 3)}
    except corral.APIError as e:
        return {"task": task["name"], "passed": False, "error": "%s: %s" % (e.code, e.message)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="base:default")
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()
    c = corral.Corral()
    with cf.ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda t: run_task(c, args.base, t), TASKS))
    for r in results:
        print(r)
    print("passed %d/%d" % (sum(bool(r["passed"]) for r in results), len(results)))


if __name__ == "__main__":
    main()
