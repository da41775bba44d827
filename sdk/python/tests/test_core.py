"""Unit tests of the sans-I/O core: no server needed."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import unittest

from support import corral  # noqa: F401  (sets sys.path)
from corral import _api, _core, errors, models


class ResolveTest(unittest.TestCase):
    def test_order(self) -> None:
        env = {"CORRAL_URL": "http://h:1", "CORRAL_TOKEN": "crl_env"}
        self.assertEqual(_core.resolve(None, None, environ=env), ("http://h:1", "crl_env"))
        self.assertEqual(_core.resolve("http://x:2", "crl_arg", environ=env),
                         ("http://x:2", "crl_arg"))
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("crl_file\n")
        try:
            # --token-file wins over $CORRAL_TOKEN, as in the CLI.
            self.assertEqual(_core.resolve(None, None, f.name, environ=env)[1], "crl_file")
        finally:
            os.unlink(f.name)
        u, _ = _core.resolve(None, None, environ={})
        self.assertEqual(u, "http://127.0.0.1:7070")

    def test_bad_url(self) -> None:
        for u in ("ftp://h", "http://", "nonsense"):
            with self.assertRaises(ValueError, msg=u):
                corral.Corral(u, "t")


class HelpersTest(unittest.TestCase):
    def test_size(self) -> None:
        for s, want in (("512M", 512 << 20), ("1G", 1 << 30), ("256MiB", 256 << 20),
                        (1234, 1234), ("1.5g", 3 << 29), ("64k", 64 << 10)):
            self.assertEqual(_core.size(s), want, s)
        with self.assertRaises(ValueError):
            _core.size("lots")

    def test_duration(self) -> None:
        self.assertEqual(_core.duration("10m"), "10m")
        self.assertEqual(_core.duration(90), "90s")
        self.assertEqual(_core.duration(dt.timedelta(minutes=2)), "120s")
        self.assertEqual(_core.duration(1.5), "1.500s")
        with self.assertRaises(ValueError):
            _core.duration(-1)

    def test_time(self) -> None:
        t = models.parse_time("2026-12-01T20:31:40.748880123Z")
        self.assertEqual(t, dt.datetime(2026, 12, 1, 20, 31, 40, 748880, dt.timezone.utc))
        self.assertIsNone(models.parse_time("0001-01-01T00:00:00Z"))
        t = models.parse_time("2026-01-02T03:04:05+02:00")
        self.assertEqual(t.utcoffset(), dt.timedelta(hours=2))

    def test_create_body(self) -> None:
        b = _api.create_body(base="b:1", toolkits=["t:1"], env={"A": "1"}, ttl="10m",
                             labels={"k": "v"}, memory="512M", cpus=1, network=["pypi"])
        self.assertEqual(b, {"base": "b:1", "toolkits": ["t:1"], "env": ["A=1"], "ttl": "10m",
                             "labels": {"k": "v"},
                             "limits": {"cpus": 1, "memory_bytes": 512 << 20},
                             "network": {"mode": "allowlist", "allow": ["pypi"]}})
        c = _api.create(b, None)
        self.assertTrue(c.request.headers["Idempotency-Key"].startswith("py-"))
        self.assertTrue(c.request.idempotent)

    def test_exec_body_exclusive_only_when_set(self) -> None:
        self.assertNotIn("exclusive", _api.exec_body(["x"]))
        self.assertIs(_api.exec_body(["x"], exclusive=True)["exclusive"], True)
        b = _api.exec_body("echo hi", stdin=b"\x00\xff", step_id="s1", timeout=5)
        self.assertEqual(b, {"argv": ["echo hi"], "shell": True, "stdin": "AP8=",
                             "step_id": "s1", "timeout": "5s"})
        self.assertTrue(_api.exec_stream("sb", b).idempotent)
        self.assertFalse(_api.exec_stream("sb", _api.exec_body(["x"])).idempotent)

    def test_paths(self) -> None:
        self.assertEqual(_core.sandbox_path("a/b", "files", "stat"), "/v1/sandboxes/a%2Fb/files/stat")
        self.assertEqual(_core.project_path("/team a/x/"), "team%20a/x")


class E2BKeyTest(unittest.TestCase):
    def test_alias(self) -> None:
        import base64
        raw = bytes(range(32))
        tok = "crl_" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        key = corral.e2b_key(tok)
        self.assertEqual(key, "e2b_" + raw.hex())
        self.assertEqual(corral.e2b_key(key), key)
        self.assertEqual(corral.Token(token=tok).e2b_key, key)
        self.assertEqual(corral.Token().e2b_key, "")
        for bad in ("", "crl_", "crl_short", tok + "x", "ct_123", "e2b_12", "E2B_" + raw.hex()):
            with self.assertRaises(ValueError, msg=bad):
                corral.e2b_key(bad)


class ErrorsTest(unittest.TestCase):
    def test_mapping(self) -> None:
        cases = [
            (404, {"code": "not_found", "message": "no sandbox x"}, errors.NotFound),
            (409, {"code": "conflict", "message": "m"}, errors.Conflict),
            (429, {"code": "exhausted", "message": "m", "quota": {"resource": "sandboxes"}},
             errors.QuotaExceeded),
            (403, {"code": "denied", "message": "m", "permission": "sandbox.create"},
             errors.PermissionDenied),
            (401, {"code": "unauthorized", "message": "m"}, errors.Unauthorized),
            (400, {"code": "invalid", "message": "ttl: bad", "field": "ttl"},
             errors.InvalidRequest),
            (413, {"code": "too_large", "message": "m"}, errors.PayloadTooLarge),
            (503, {"code": "unavailable", "message": "m"}, errors.Unavailable),
        ]
        for status, body, cls in cases:
            e = _core.decode_error(status, {}, json.dumps(body).encode())
            self.assertIs(type(e), cls, body)
            self.assertIsInstance(e, errors.APIError)
            self.assertEqual((e.status, e.code, e.message), (status, body["code"], body["message"]))
        e = _core.decode_error(400, {}, b'{"code":"invalid","message":"ttl: bad","field":"ttl"}')
        self.assertEqual((e.field, str(e)), ("ttl", "ttl: bad"))
        e = _core.decode_error(429, {}, b'{"code":"exhausted","message":"m","quota":{"limit":1}}')
        self.assertEqual(e.quota, {"limit": 1})
        # A proxy's page: the code comes from the status.
        e = _core.decode_error(502, {"retry-after": "3"}, b"<html>bad gateway</html>")
        self.assertIsInstance(e, errors.ServerError)
        self.assertEqual((e.code, e.retry_after), ("internal", 3.0))
        self.assertIsInstance(_core.decode_error(404, {}, b""), errors.NotFound)

    def test_retry_policy(self) -> None:
        p = _core.RetryPolicy(retries=2)
        get = _core.Request("GET", "/x")
        post = _core.Request("POST", "/x")
        self.assertTrue(p.should_retry_status(get, 503, 1))
        self.assertFalse(p.should_retry_status(get, 503, 3))
        self.assertFalse(p.should_retry_status(get, 429, 1))
        self.assertFalse(p.should_retry_status(post, 503, 1))
        self.assertTrue(p.should_retry_error(post, 1, sent=False))
        self.assertFalse(p.should_retry_error(post, 1, sent=True))
        self.assertEqual(p.delay(1, retry_after=2.0), 2.0)
        self.assertLessEqual(p.delay(10), p.max_backoff)


class StreamTest(unittest.TestCase):
    def test_ndjson(self) -> None:
        s = _core.NDJSONSplitter()
        self.assertEqual(s.feed(b'{"a":1}\n{"b"'), [{"a": 1}])
        self.assertEqual(s.feed(b':2}\n\n'), [{"b": 2}])
        self.assertEqual(s.feed(b'{"c":3}'), [])
        self.assertEqual(s.finish(), [{"c": 3}])

    def test_output_state_dedupes_after_resume(self) -> None:
        st = _core.OutputState("sb", "")
        st.accept({"type": "start", "command_id": "c1"})
        ev = st.accept({"type": "stdout", "offset": 0, "data": "YWJj"})  # abc
        self.assertEqual(ev.data, b"abc")
        self.assertEqual(st.next_offset, 3)
        req = st.resume_request()
        self.assertEqual(req.query, [("offset", "3"), ("follow", "true")])
        self.assertIn("/commands/c1/output", req.path)
        # A resumed stream repeating bytes: only the new part is delivered.
        self.assertIsNone(st.accept({"type": "stdout", "offset": 0, "data": "YWJj"}))
        ev = st.accept({"type": "stderr", "offset": 2, "data": "Y2Rl"})  # cde from 2
        self.assertEqual((ev.data, ev.offset), (b"de", 3))
        ev = st.accept({"type": "exit", "exit": {"code": 4}})
        self.assertEqual((ev.exit_code, st.done, st.can_resume()), (4, True, False))
        with self.assertRaises(errors.StreamError):
            st.accept({"type": "error", "data": "Ym9vbQ=="})
        st2 = _core.OutputState("sb")
        with self.assertRaises(errors.StreamError):
            st2.ended()


class SurfaceTest(unittest.TestCase):
    """Every public name has a docstring, and both clients have the same methods."""

    def test_docstrings(self) -> None:
        missing = []
        for name in corral.__all__:
            obj = getattr(corral, name)
            if not callable(obj) and not isinstance(obj, type):
                continue
            if not (obj.__doc__ or "").strip():
                missing.append(name)
            if isinstance(obj, type):
                for attr, v in vars(obj).items():
                    if attr.startswith("_") or not callable(v) and not isinstance(v, property):
                        continue
                    if not (getattr(v, "__doc__", "") or "").strip():
                        missing.append("%s.%s" % (name, attr))
        self.assertEqual(missing, [])

    def test_async_mirrors_sync(self) -> None:
        for s, a in ((corral.Corral, corral.AsyncCorral), (corral.Sandbox, corral.AsyncSandbox),
                     (corral.ExecStream, corral.AsyncExecStream)):
            sync = {n for n in vars(s) if not n.startswith("_")}
            asyn = {n for n in vars(a) if not n.startswith("_")}
            self.assertEqual(sync - asyn, set(), s.__name__)


if __name__ == "__main__":
    unittest.main()


class RouteCoverageTest(unittest.TestCase):
    """Every operation of api/openapi.yaml has its builder in corral._api (both clients use
    them), and each builder sends the method and path the contract names."""

    # Not for an SDK: an edge registering with a cluster server, and the VNC connection upgrade.
    LEFT_OUT = {("POST", "/v1/cluster/join"), ("GET", "/v1/sandboxes/{id}/vnc")}

    def operations(self):
        import re
        spec = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "api",
                            "openapi.yaml")
        if not os.path.exists(spec):
            self.skipTest("api/openapi.yaml is not beside this checkout")
        ops, path, in_paths = set(), None, False
        with open(spec) as f:
            for line in f:
                if line.startswith("paths:"):
                    in_paths = True
                elif in_paths and re.match(r"^\S", line):
                    break
                elif in_paths and re.match(r"^  /", line):
                    path = line.strip().rstrip(":")
                elif in_paths and path and re.match(r"^    (get|post|put|delete|patch):", line):
                    ops.add((line.strip().rstrip(":").upper(), path))
        return ops

    def test_every_route(self) -> None:
        b = _api.exec_body(["true"])
        built = [
            _api.health(), _api.info(), _api.metrics(), _api.create({}, None),
            _api.list_sandboxes(None, None, ""), _api.get("i"), _api.delete("i"),
            _api.set_ttl("i", "1m"), _api.set_network("i", "none"), _api.fetch_stats("i"),
            _api.blocked("i"), _api.create_fncall_env({}), _api.fncall_envs(), _api.fncall_env("n"),
            _api.delete_fncall_env("n"), _api.call("n", {}), _api.call_stream("n", {}),
            _api.save_environment("n", "b", "", [], False), _api.environments(),
            _api.environment("n"), _api.update_environment("n", 0), _api.delete_environment("n"), _api.delete_tag("n", "t"),
            _api.tag_layer("n", "t", "v"), _api.gc_layers(), _api.set_network_services({}),
            _api.network_services(), _api.snapshot("i", "n", "v", None), _api.pause("i"),
            _api.fork("i", 2, None, False, None),
            _api.resume("i"), _api.power("i", "on", False), _api.screenshot("i"),
            _api.input_events("i", []), _api.console("i", 0), _api.exec_stream("i", b),
            _api.trajectory("i", 0), _api.start_command("i", b), _api.commands("i"),
            _api.command("i", "c"), _api.attach("i", "c", 0, True),
            _api.write_stdin("i", "c", b"", False), _api.signal("i", "c", "TERM"),
            _api.resize("i", "c", 1, 1), _api.read_file("i", "/p"),
            _api.write_file("i", "/p", b"", None, None, False, False), _api.remove("i", "/p", False),
            _api.stat("i", "/p"), _api.list_dir("i", "/p"), _api.mkdir("i", "/p", None, False, None),
            _api.move("i", "/a", "/b"), _api.watch("i", "/p", False), _api.tar_out("i", "/p"),
            _api.tar_in("i", "/p", b""), _api.import_layer("n", "v", "base", b"", None, [], "", False),
            _api.layers(""), _api.layer_stats("n", "v", ""), _api.layer("n", "v"),
            _api.set_layer_fill_rate("n", "v", 0), _api.delete_layer("n", "v"), _api.nodes(),
            _api.node_action("n", "drain"), _api.whoami(), _api.create_project("p"),
            _api.projects(""), _api.move_project("a", "b", False), _api.project("p"),
            _api.delete_project("p", False), _api.quota("p"), _api.set_quota("p", {}),
            _api.placement("p"), _api.set_placement("p", [], []),
            _api.create_principal("n", "", ""), _api.principals(""), _api.grant("p", "n", "user"),
            _api.grants(""), _api.revoke("p", "n", ""), _api.create_token("p", "user", [], None, "", "", ""),
            _api.tokens(), _api.revoke_token("t"), _api.audit("", "", 0, 0),
            _api.create_volume("n", 1 << 24, ""), _api.volumes(""), _api.volume("n", ""),
            _api.delete_volume("n", ""),
            _api.sandbox_metrics("i", None), _api.events("", None, None, False),
            _api.run_code("i", "1"), _api.code_contexts("i"), _api.create_code_context("i", None, None),
            _api.restart_code_context("i", "c"), _api.delete_code_context("i", "c"),
            _api.add_webhook("p", "https://example.com/h", None), _api.webhooks(""),
            _api.remove_webhook("w"), _api.webhook_deliveries("w"), _api.test_webhook("w"), _api.report("", "7d"),
            _api.start_build("n", "FROM b:1"), _api.builds(), _api.build("b"),
            _api.build_logs("b", True), _api.cancel_build("b"),
        ]
        import re
        reqs = [x.request if isinstance(x, _core.Call) else x for x in built]
        missing = []
        for method, tmpl in sorted(self.operations() - self.LEFT_OUT):
            pat = "^" + re.sub(r"\{[a-z]+\}", "[^/]+", tmpl) + "$"
            if not any(r.method == method and re.match(pat, r.path) for r in reqs):
                missing.append("%s %s" % (method, tmpl))
        self.assertEqual(missing, [], "routes of api/openapi.yaml without a builder in corral._api")
