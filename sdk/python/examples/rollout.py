"""An RL-style rollout: N sandboxes from one saved environment, driven concurrently with asyncio.

Each episode runs its steps with a step_id, so a worker that crashes (or a Corral that restarts)
and runs the episode again gets the recorded result of every finished step instead of running it
twice, and attaches to a step still running. Sandboxes carry a label naming the run, so a
restarted worker finds its episodes' sandboxes again instead of making new ones. The reward comes
from a grader run with exclusive=True: nothing else runs in the sandbox while it looks.

    CORRAL_URL=... CORRAL_TOKEN=... python3 rollout.py --env my-task --episodes 16 --run run-7
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Dict, List

import corral

# The "policy": in a real rollout these actions come from the model being trained.
ACTIONS = [
    "echo 'def add(a, b): return a + b' > /tmp/solution.py",
    "echo 'print(add(2, 3))' >> /tmp/solution.py",
    "cat /tmp/solution.py | wc -l",
]
GRADER = "test -f /tmp/solution.py && grep -q 'return a + b' /tmp/solution.py && echo 1 || echo 0"


async def sandbox_for(ac: corral.AsyncCorral, env: str, run: str, episode: int) -> corral.AsyncSandbox:
    """The episode's sandbox: the one a previous attempt made, or a new one."""
    labels = {"run": run, "episode": str(episode)}
    found = await ac.list(labels=labels, state="running")
    if found:
        return found[0]
    # The idempotency key makes a create retried after a lost answer return the same sandbox.
    return await ac.create(environment=env, labels=labels, ttl="30m", memory="512M",
                           idempotency_key="%s-%d" % (run, episode))


async def episode(ac: corral.AsyncCorral, env: str, run: str, i: int) -> Dict[str, object]:
    sb = await sandbox_for(ac, env, run, i)
    replayed = 0
    for n, action in enumerate(ACTIONS):
        r = await sb.exec(["/bin/sh", "-c", action], step_id="step-%d" % n, timeout="60s")
        replayed += r.replayed
        if r.exit_code != 0:
            break
    # Exclusive: every other process of the sandbox is stopped while the grader runs, so
    # nothing the agent left behind can touch its output or exit status.
    grade = await sb.exec(["/bin/sh", "-c", GRADER], step_id="grade", exclusive=True)
    reward = float(grade.stdout.strip() or 0)
    await sb.delete()
    return {"episode": i, "sandbox": sb.id, "reward": reward, "replayed_steps": replayed}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", required=True, help="saved environment (corral env create)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--run", default="rollout", help="run name; rerun with the same to resume")
    args = ap.parse_args()
    async with corral.AsyncCorral(max_connections=64) as ac:
        results: List[Dict[str, object]] = await asyncio.gather(
            *(episode(ac, args.env, args.run, i) for i in range(args.episodes)))
    for r in results:
        print(json.dumps(r))
    print("mean reward", sum(float(r["reward"]) for r in results) / len(results))


if __name__ == "__main__":
    asyncio.run(main())
