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


class CuttingProxy:
    """A TCP proxy in front of the server whose connections the test can cut at will, to break
    streams mid-way the way a crashed proxy or a restarted server does."""

    def __init__(self, target_url: str) -> None:
        import socket
        import threading
        import urllib.parse
        u = urllib.parse.urlsplit(target_url)
        self._target = (u.hostname, u.port)
        self._lsock = socket.socket()
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(64)
        self.url = "http://127.0.0.1:%d" % self._lsock.getsockname()[1]
        self._conns: list = []
        self._lock = threading.Lock()
        self.cuts = 0
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading
        while True:
            try:
                c, _ = self._lsock.accept()
            except OSError:
                return
            s = socket.create_connection(self._target)
            with self._lock:
                self._conns += [c, s]
                self.accepted += 1
            for a, b in ((c, s), (s, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        import socket
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Break every open connection."""
        import socket
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.cuts += 1

    def close(self) -> None:
        """Stop accepting and cut what is open."""
        self._lsock.close()
        self.cut()
