"""A Corral restart (kill -9, then started again on the same data dir) in the middle of a
rollout: the output stream in flight resumes from its offset, and a worker that starts over
replays the finished steps by step_id instead of running them again."""

from __future__ import annotations

import asyncio
import unittest

from support import BASE, TOKEN, URL, can_restart, corral, need_server, restart_corral

STEPS = [
    ("s1", "echo step1 >> /root/log; echo one"),
    ("s2", "echo step2 >> /root/log; echo two"),
    # The step in flight when corral dies: it outlives corral and finishes while the client
    # waits for the server to come back.
    ("s3", "echo started; sleep 2; echo step3 >> /root/log; echo three"),
    ("s4", "echo step4 >> /root/log; cat /root/log"),
]


class RestartTest(unittest.TestCase):
    def setUp(self) -> None:
        need_server(self)
        if not can_restart():
            self.skipTest("needs the harness to restart corral (CORRAL_TEST_CONTROL; run "
                          "go test ./internal/e2e -run TestPythonSDK)")

    def test_rollout_survives_restart(self) -> None:
        c = corral.Corral(URL, TOKEN)
        sb = c.create(base=BASE, ttl="10m", labels={"test": "restart"})
        self.addCleanup(lambda: corral.Corral(URL, TOKEN).get(sb.id).delete())
        for step, script in STEPS[:2]:
            self.assertEqual(sb.exec(script, step_id=step).exit_code, 0)

        # Step 3 runs; corral is killed and restarted while its output streams.
        step, script = STEPS[2]
        st = sb.stream(script, step_id=step)
        first = next(ev for ev in st if ev.type == "stdout")
        self.assertEqual(first.data, b"started\n")
        restart_corral()
        rest = b"".join(ev.data for ev in st if ev.type == "stdout")
        self.assertEqual(first.data + rest, b"started\nthree\n")
        self.assertEqual(st.exit_code, 0)

        # A worker that crashed starts the rollout over, from another process's client (here:
        # asyncio): every finished step is replayed, none runs again.
        async def worker() -> list:
            async with corral.AsyncCorral(URL, TOKEN) as ac:
                asb = await ac.get(sb.id)
                results = []
                for step, script in STEPS:
                    results.append(await asb.exec(script, step_id=step))
                return results
        results = asyncio.run(worker())
        self.assertEqual([r.replayed for r in results], [True, True, True, False])
        self.assertEqual([r.stdout for r in results[:3]], ["one\n", "two\n", "started\nthree\n"])
        self.assertEqual(results[3].stdout, "step1\nstep2\nstep3\nstep4\n")
        steps = [s.step_id for s in sb.trajectory() if s.step_id]
        self.assertEqual(steps, ["s1", "s2", "s3", "s4"])


if __name__ == "__main__":
    unittest.main()
