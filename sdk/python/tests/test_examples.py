"""The examples in sdk/python/examples run against the server and do what they say."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

from support import BASE, TOKEN, URL, corral, need_server, uniq

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")


def run(name: str, *args: str) -> str:
    env = dict(os.environ, CORRAL_URL=URL, CORRAL_TOKEN=TOKEN,
               PYTHONPATH=os.path.join(HERE, ".."))
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)] + list(args), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    if p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s" % (name, p.returncode, p.stdout.decode()))
    return p.stdout.decode()


class ExamplesTest(unittest.TestCase):
    def setUp(self) -> None:
        need_server(self)

    def test_rollout(self) -> None:
        env = uniq("rollout-env")
        c = corral.Corral(URL, TOKEN)
        c.save_environment(env, BASE)
        self.addCleanup(lambda: c.delete_environment(env))
        out = run("rollout.py", "--env", env, "--episodes", "3", "--run", uniq("run"))
        self.assertIn("mean reward 1.0", out)

    def test_eval_runner(self) -> None:
        self.assertIn("passed 3/3", run("eval_runner.py", "--base", BASE))

    def test_fncall(self) -> None:
        out = run("fncall.py", "--base", BASE, "--name", uniq("fnex"))
        self.assertIn("stdout 42", out)
        self.assertIn("streamed tick 3", out)


if __name__ == "__main__":
    unittest.main()
