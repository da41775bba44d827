"""What the tests share: the server under test, from the environment, and the harness link.

The tests run against a real `corral up`: CORRAL_URL and CORRAL_TOKEN (an admin token) name it
and CORRAL_TEST_BASE a published base layer with busybox (internal/e2e's TestPythonSDK starts
one and sets them). Without them the server tests skip. CORRAL_TEST_CONTROL="R,W" are two file
descriptors to the harness: a test writes "restart" to W and reads "ok" from R once the harness
has killed corral with SIGKILL and started it again on the same data dir.
"""

from __future__ import annotations

import os
import sys
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import corral  # noqa: E402

URL = os.environ.get("CORRAL_URL", "")
TOKEN = os.environ.get("CORRAL_TOKEN", "")
BASE = os.environ.get("CORRAL_TEST_BASE", "")


def need_server(case: unittest.TestCase) -> None:
    """Skip the test unless a server to test against is configured."""
    if not (URL and TOKEN and BASE):
        case.skipTest("needs a Corral server: set CORRAL_URL, CORRAL_TOKEN and CORRAL_TEST_BASE "
                      "(go test ./internal/e2e -run TestPythonSDK does)")


def uniq(prefix: str) -> str:
    """A name no other test uses."""
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def restart_corral() -> None:
    """Ask the harness to kill -9 corral and start it again; return once it is healthy."""
    spec = os.environ.get("CORRAL_TEST_CONTROL", "")
    if not spec:
        raise unittest.SkipTest("needs the harness to restart corral (CORRAL_TEST_CONTROL)")
    r, w = (int(x) for x in spec.split(","))
    os.write(w, b"restart\n")
    got = b""
    while not got.endswith(b"\n"):
        b = os.read(r, 64)
        if not b:
            raise RuntimeError("harness closed the control channel")
        got += b
    if got.strip() != b"ok":
        raise RuntimeError("harness answered %r" % got)


def can_restart() -> bool:
    """Whether the harness can restart corral."""
    return bool(os.environ.get("CORRAL_TEST_CONTROL"))
