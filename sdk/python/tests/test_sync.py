"""The sync client against a real corral: every public method."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
import unittest

from support import BASE, TOKEN, URL, corral, need_server, uniq


class SyncTest(unittest.TestCase):
    c: corral.Corral

    def setUp(self) -> None:
        need_server(self)
        self.c = corral.Corral(URL, TOKEN)
        self.addCleanup(self.c.close)

    def sandbox(self, **kw) -> corral.Sandbox:
        kw.setdefault("base", BASE)
        kw.setdefault("ttl", "10m")
        sb = self.c.create(**kw)
        self.addCleanup(lambda: sb.delete())
        return sb

    def test_discovery_from_environment(self) -> None:
        old = dict(os.environ)
        try:
            os.environ["CORRAL_URL"], os.environ["CORRAL_TOKEN"] = URL, TOKEN
            c = corral.Corral()
            self.assertEqual((c.url, c.token), (URL, TOKEN))
            self.assertTrue(c.health())
            self.assertTrue(c.server_info().version)
            self.assertEqual(c.whoami().principal.name,
                             corral.Corral(URL, TOKEN).whoami().principal.name)
        finally:
            os.environ.clear()
            os.environ.update(old)
        with self.assertRaises(corral.Unauthorized):
            corral.Corral(URL, "crl_wrong").server_info()

    def test_volumes(self) -> None:
        name = uniq("vol")
        v = self.c.create_volume(name, "32M")
        self.assertEqual((v.name, v.size_bytes), (name, 32 << 20))
        self.assertIn(name, [x.name for x in self.c.volumes()])
        a = self.sandbox(volumes=[name + ":/data"])
        self.assertEqual(a.info().volumes[0].path, "/data")
        a.exec("echo kept > /data/f && sync")
        with self.assertRaises(corral.Conflict):
            self.sandbox(volumes=[(name, "/data", True)])
        with self.assertRaises(corral.Conflict):
            self.c.delete_volume(name)
        self.assertEqual([x.sandbox for x in self.c.volume(name).attached_to], [a.id])
        a.delete()
        b = self.sandbox(volumes=[{"name": name, "path": "/v", "read_only": True}])
        self.assertEqual(b.exec("cat /v/f").stdout, "kept\n")
        self.assertNotEqual(b.exec("touch /v/x").exit.code, 0)
        b.delete()
        self.c.delete_volume(name)
        with self.assertRaises(corral.NotFound):
            self.c.volume(name)

    def test_lifecycle(self) -> None:
        label = uniq("run")
        with self.c.create(base=BASE, ttl="10m", labels={"run": label}, memory="256M", cpus=1,
                           env={"GREETING": "hi"}) as sb:
            self.assertTrue(sb.id)
            self.assertEqual(sb.record.state, "running")
            self.assertEqual(sb.record.limits.memory_bytes, 256 << 20)
            self.assertEqual(self.c.get(sb.id).id, sb.id)
            self.assertEqual([s.id for s in self.c.list(labels={"run": label})], [sb.id])
            self.assertEqual([s.id for s in self.c.list(labels={"run": label}, state="running")],
                             [sb.id])
            self.assertEqual(self.c.list(labels={"run": label}, state="paused"), [])
            self.assertEqual(sb.exec("echo $GREETING").stdout, "hi\n")
            before = sb.info().expires_at
            sb.set_ttl("1h")
            self.assertGreater(sb.info().expires_at, before)
            self.assertEqual(sb.pause().state, "paused")
            self.assertEqual(sb.info().state, "paused")
            self.assertEqual(sb.resume().state, "running")
            self.assertEqual(sb.exec(["echo", "back"]).stdout, "back\n")
        # The with block deleted it: "deleting" until its host cleanup ended, then "stopped".
        deadline = time.monotonic() + 30
        info = self.c.get(sb.id).info()
        while info.state == "deleting" and time.monotonic() < deadline:
            time.sleep(0.05)
            info = self.c.get(sb.id).info()
        self.assertEqual((info.state, info.reason), ("stopped", "deleted"))
        with self.assertRaises(corral.NotFound):
            self.c.get("sb-local-aaaaaaaaaaaaaaaa")

    def test_exec(self) -> None:
        sb = self.sandbox()
        r = sb.exec(["sh", "-c", "echo out; echo err >&2; printf '\\377'; exit 3"])
        self.assertEqual(r.exit_code, 3)
        self.assertEqual(r.stdout_bytes, b"out\n\xff")
        self.assertEqual(r.stdout, "out\n\ufffd")
        self.assertEqual(r.stderr, "err\n")
        self.assertFalse(r.ok)
        with self.assertRaises(corral.CommandFailed):
            r.check()
        r = sb.exec(["cat"], stdin=b"fed\x00in")
        self.assertEqual(r.stdout_bytes, b"fed\x00in")
        r = sb.exec(["sh", "-c", "pwd; id -u; echo $A"], env={"A": "x"}, cwd="/tmp", user="nobody")
        self.assertEqual(r.stdout.split(), ["/tmp", "65534", "x"])
        r = sb.exec(["sleep", "30"], timeout="300ms")
        self.assertTrue(r.exit.timed_out)
        with self.assertRaises(corral.InvalidRequest) as cm:
            sb.exec(["/no/such/program"])
        self.assertEqual(cm.exception.field, "argv")
        # step_id: a finished step is replayed, not run again.
        r1 = sb.exec("echo x >> /tmp/count; wc -l < /tmp/count", step_id="s1")
        r2 = sb.exec("echo x >> /tmp/count; wc -l < /tmp/count", step_id="s1")
        self.assertEqual((r1.stdout, r1.replayed), ("1\n", False))
        self.assertEqual((r2.stdout, r2.replayed), ("1\n", True))
        with self.assertRaises(corral.Conflict):
            sb.exec(["echo", "another request"], step_id="s1")
        r = sb.exec(["echo", "alone"], exclusive=True)
        self.assertEqual(r.stdout, "alone\n")
        self.assertTrue(any(s.exclusive for s in sb.trajectory() if s.request.get("argv") == ["echo", "alone"]))

    def test_stream(self) -> None:
        sb = self.sandbox()
        types, out = [], b""
        with sb.stream(["sh", "-c", "echo a; echo b >&2; exit 5"]) as st:
            for ev in st:
                types.append(ev.type)
                if ev.type in ("stdout", "stderr"):
                    self.assertIsInstance(ev.data, bytes)
                    out += ev.data
                if ev.type == "exit":
                    self.assertEqual(ev.exit_code, 5)
            self.assertEqual(st.exit_code, 5)
            self.assertTrue(st.command_id)
        self.assertEqual(types[0], "start")
        self.assertEqual(types[-1], "exit")
        self.assertEqual(sorted(out.split()), [b"a", b"b"])

    def test_stream_cut_and_reattach(self) -> None:
        sb = self.sandbox()
        st = sb.stream(["sh", "-c", "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.2; done"])
        got = b""
        for ev in st:
            if ev.type == "stdout":
                got += ev.data
                if b"line2" in got:
                    break
        # The client hangs up mid-stream; the command goes on.
        st.close()
        cid, off = st.command_id, st.next_offset
        self.assertEqual(off, len(got))
        with sb.attach(cid, offset=off) as rest:
            for ev in rest:
                if ev.type == "stdout":
                    got += ev.data
            self.assertEqual(rest.exit_code, 0)
        self.assertEqual(got, b"".join(b"line%d\n" % i for i in range(1, 7)))
        # Without follow: what there is so far, ending with the exit of a finished command.
        whole = b"".join(ev.data for ev in sb.attach(cid, 0, follow=False))
        self.assertEqual(whole, got)

    def test_background_commands(self) -> None:
        sb = self.sandbox()
        cmd = sb.start(["sh", "-c", "read x; echo got $x; sleep 60"], open_stdin=True)
        self.assertEqual(cmd.state, "running")
        sb.write_stdin(cmd.id, b"hello\n", eof=True)
        with sb.attach(cmd.id) as st:
            for ev in st:
                if ev.type == "stdout":
                    self.assertEqual(ev.data, b"got hello\n")
                    break
        self.assertIn(cmd.id, [c.id for c in sb.commands()])
        sb.signal(cmd.id, "KILL")
        deadline = time.time() + 30
        while sb.command(cmd.id).state != "exited":
            self.assertLess(time.time(), deadline, "command still running after SIGKILL")
            time.sleep(0.05)
        self.assertEqual(sb.command(cmd.id).exit.signal, "SIGKILL")
        tty = sb.start(["sh", "-c", "sleep 0.5; stty size"], tty=True, rows=10, cols=20)
        sb.resize(tty.id, 30, 100)
        text = b"".join(ev.data for ev in sb.attach(tty.id))
        self.assertIn(b"30 100", text)

    def test_files(self) -> None:
        sb = self.sandbox()
        fi = sb.write_file("/tmp/a.txt", b"hello", mode=0o600)
        self.assertEqual((fi.size, fi.permissions), (5, 0o600))
        self.assertEqual(sb.read_file("/tmp/a.txt"), b"hello")
        sb.write_file("/tmp/a.txt", " world", append=True)
        self.assertEqual(sb.read_file("/tmp/a.txt"), b"hello world")
        self.assertEqual(sb.stat("/tmp/a.txt").size, 11)
        sb.write_file("/tmp/deep/er/b.txt", b"b", parents=True)
        self.assertTrue(sb.mkdir("/tmp/d", mode=0o700).is_dir)
        self.assertEqual(sorted(f.name for f in sb.list("/tmp")), ["a.txt", "d", "deep"])
        sb.move("/tmp/a.txt", "/tmp/d/moved.txt")
        self.assertFalse(sb.exists("/tmp/a.txt"))
        self.assertTrue(sb.exists("/tmp/d/moved.txt"))
        with self.assertRaises(corral.NotFound):
            sb.read_file("/tmp/a.txt")
        sb.remove("/tmp/deep", recursive=True)
        self.assertFalse(sb.exists("/tmp/deep"))
        # Directory upload and download.
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            os.makedirs(os.path.join(src, "pkg"))
            with open(os.path.join(src, "pkg", "m.py"), "w") as f:
                f.write("x = 1\n")
            with open(os.path.join(src, "top.txt"), "wb") as f:
                f.write(b"\x00\x01")
            sb.upload(src, "/work")
            self.assertEqual(sb.read_file("/work/pkg/m.py"), b"x = 1\n")
            sb.download("/work", dst)
            with open(os.path.join(dst, "top.txt"), "rb") as f:
                self.assertEqual(f.read(), b"\x00\x01")
            with open(os.path.join(dst, "pkg", "m.py")) as f:
                self.assertEqual(f.read(), "x = 1\n")
        names = tarfile.open(fileobj=io.BytesIO(sb.download_tar("/work"))).getnames()
        self.assertIn("pkg/m.py", names)

    def test_watch(self) -> None:
        sb = self.sandbox()
        sb.mkdir("/tmp/w")
        with sb.watch("/tmp/w", recursive=True) as w:
            sb.exec("echo x > /tmp/w/new.txt; mkdir /tmp/w/sub; echo y > /tmp/w/sub/f")
            seen = set()
            for ev in w:
                seen.add((ev.type, ev.name))
                if ("create", "sub/f") in seen:
                    break
        self.assertIn(("create", "new.txt"), seen)
        self.assertIn(("create", "sub"), seen)

    def test_trajectory_and_snapshot(self) -> None:
        sb = self.sandbox()
        sb.exec(["sh", "-c", "echo snap > /root/state"], step_id="write-state")
        sb.write_file("/root/f", b"f")
        steps = sb.trajectory()
        self.assertEqual([s.kind for s in steps], ["exec", "write_file"])
        self.assertEqual(steps[0].step_id, "write-state")
        self.assertEqual(steps[0].state, "done")
        self.assertEqual(sb.trajectory(after=steps[0].seq)[0].kind, "write_file")
        name = uniq("snap")
        layer = sb.snapshot(name)
        self.assertEqual((layer.kind, layer.name), ("snapshot", name))
        child = self.sandbox(base="", from_snapshot=layer.ref)
        self.assertEqual(child.read_file("/root/state"), b"snap\n")

    def test_fork(self) -> None:
        sb = self.sandbox(labels={"run": "f"})
        sb.write_file("/root/f", b"forked")
        with self.assertRaises(corral.errors.Conflict):
            sb.fork(count=2)  # runc: processes cannot be checkpointed; disk_only can
        copies = sb.fork(count=2, disk_only=True, labels={"branch": "b"}, ttl="5m")
        for cp in copies:
            self.addCleanup(cp.delete)
        self.assertEqual(len(copies), 2)
        for cp in copies:
            self.assertEqual(cp.record.forked_from, sb.id)
            self.assertEqual(cp.record.labels, {"run": "f", "branch": "b"})
            self.assertEqual(cp.read_file("/root/f"), b"forked")
        with self.assertRaises(corral.errors.InvalidRequest):
            sb.fork(count=0)

    def test_network(self) -> None:
        sb = self.sandbox(network=["198.51.100.7:80/tcp"])
        self.assertEqual(sb.record.network.allow, ["198.51.100.7:80/tcp"])
        info = sb.network(allow=["198.51.100.8:443/tcp"])
        self.assertEqual(info.network.allow, ["198.51.100.8:443/tcp"])
        self.assertIsInstance(sb.blocked_attempts(), list)
        self.assertIsInstance(self.c.network_services(), list)
        self.assertIsInstance(sb.fetch_stats(), dict)

    def test_layers_and_environments(self) -> None:
        name = uniq("ws")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "hello.txt"), "w") as f:
                f.write("from a workspace\n")
            layer = self.c.import_layer(name, "v1", "workspace", d)
        self.assertEqual((layer.name, layer.version, layer.kind), (name, "v1", "workspace"))
        self.assertEqual(self.c.layer(name, "v1").digest, layer.digest)
        self.assertEqual([l.version for l in self.c.layers(name)], ["v1"])
        self.assertIn("latest", self.c.tag_layer(name, "latest", "v1").tags)
        self.assertIsInstance(self.c.layer_stats(name, "v1"), dict)
        self.assertEqual(self.c.set_layer_fill_rate(name, "v1", -1).fill_rate, -1)
        env = uniq("env")
        self.assertEqual(self.c.save_environment(env, BASE, workspace=name + ":latest").name, env)
        self.assertIn(env, [e.name for e in self.c.environments()])
        self.assertEqual(self.c.environment(env).base, BASE)
        sb = self.sandbox(base="", environment=env)
        self.assertEqual(sb.exec(["cat", "/hello.txt"]).stdout, "from a workspace\n")
        sb.delete()
        self.c.delete_environment(env)
        with self.assertRaises(corral.NotFound):
            self.c.environment(env)
        self.c.delete_tag(name, "latest")
        self.assertEqual(self.c.delete_layer(name, "v1").name, name)
        self.assertIn("removed", self.c.gc_layers())

    def test_fncall(self) -> None:
        name = uniq("fn")
        env = self.c.create_fncall_env(name, BASE, pool_min=1, pool_max=2, timeout="20s")
        self.addCleanup(lambda: self.c.delete_fncall_env(name))
        self.assertEqual(env.name, name)
        self.assertIn(name, [e.name for e in self.c.fncall_envs()])
        r = self.c.call(name, ["sh", "-c", "read n < in.txt; echo $((n*2)) | tee out.txt"],
                        files={"in.txt": b"21\n"}, outputs=["out.txt"])
        self.assertEqual((r.exit_code, r.text, r.outputs["out.txt"]), (0, "42\n", b"42\n"))
        r = self.c.call(name, script="echo $0 >&2; exit 4")
        self.assertEqual(r.exit_code, 4)
        # Python code: busybox has no interpreter, so the call reports that it could not run.
        r = self.c.call(name, python="print(1)")
        self.assertTrue(r.exit_code != 0 or r.exit.error)
        evs = list(self.c.call_stream(name, ["sh", "-c", "echo one; echo two"]))
        self.assertEqual(b"".join(e.data for e in evs if e.type == "stdout"), b"one\ntwo\n")
        self.assertEqual(evs[-1].type, "exit")
        self.assertGreaterEqual(self.c.fncall_env(name).pool["calls"], 3)

    def test_projects_tokens_audit(self) -> None:
        proj = uniq("team")
        p = self.c.create_project(proj)
        self.assertEqual(p.path, proj)
        self.assertEqual(self.c.project(proj).path, proj)
        self.assertIn(proj, [x.path for x in self.c.projects()])
        self.c.create_project(proj + "/sub")
        self.assertEqual(self.c.move_project(proj + "/sub", proj + "/sub2").path, proj + "/sub2")
        pr = self.c.create_principal(uniq("bot"), kind="agent", project=proj)
        self.assertIn(pr.name, [x.name for x in self.c.principals(proj)])
        g = self.c.grant(proj, pr.name, "user")
        self.assertEqual(g.role, "user")
        self.assertIn(pr.name, [x.principal for x in self.c.grants(proj)])
        tok = self.c.create_token(proj, "user", principal=pr.name, ttl="1h")
        self.assertTrue(tok.token.startswith("crl_"))
        self.assertIn(tok.id, [t.id for t in self.c.tokens()])
        as_bot = corral.Corral(URL, tok.token)
        self.assertEqual(as_bot.whoami().principal.name, pr.name)
        with self.assertRaises(corral.PermissionDenied):
            as_bot.create_project(proj + "/nope")
        # The token's E2B alias (the only key shape E2B's Python SDK accepts) is the token.
        self.assertRegex(tok.e2b_key, r"^e2b_[0-9a-f]+$")
        as_alias = corral.Corral(URL, tok.e2b_key)
        self.assertEqual(as_alias.whoami().token.id, tok.id)
        self.assertIsNotNone(self.c.revoke_token(tok.id).revoked_at)
        with self.assertRaises(corral.Unauthorized):
            as_bot.whoami()
        with self.assertRaises(corral.Unauthorized):
            as_alias.whoami()
        self.c.revoke(proj, pr.name, "user")
        q = self.c.set_quota(proj, sandboxes=5, memory_bytes="4G")
        self.assertEqual((q.limit["sandboxes"], q.limit["memory_bytes"]), (5, 4 << 30))
        self.assertEqual(self.c.quota(proj).limit["sandboxes"], 5)
        self.assertIsInstance(self.c.placement(proj), dict)
        self.assertTrue(self.c.audit(action="project."))
        self.c.delete_project(proj, force=True)
        with self.assertRaises(corral.NotFound):
            self.c.project(proj)

    def test_quota_refusal(self) -> None:
        proj = uniq("quota")
        self.c.create_project(proj)
        self.c.set_quota(proj, sandboxes=1)
        self.addCleanup(lambda: self.c.delete_project(proj, force=True))
        tok = self.c.create_token(proj, "user", name=uniq("q"))
        qc = corral.Corral(URL, tok.token)
        first = qc.create(base=BASE, ttl="5m")
        self.addCleanup(lambda: self.c.get(first.id).delete())
        with self.assertRaises(corral.QuotaExceeded) as cm:
            qc.create(base=BASE, ttl="5m")
        e = cm.exception
        self.assertEqual((e.status, e.code), (429, "exhausted"))
        self.assertEqual((e.quota["resource"], e.quota["limit"]), ("sandboxes", 1))
        self.assertEqual(len(qc.list()), 1)

    def test_operator_and_vm_routes(self) -> None:
        self.assertIn("corral_sandboxes", self.c.metrics())
        svcs = self.c.set_network_services({"services": {"pyidx": {"domains": ["pypi.org"]}}})
        self.assertEqual([(s.name, s.domains) for s in svcs], [("pyidx", ["pypi.org"])])
        self.assertEqual([s.name for s in self.c.network_services()], ["pyidx"])
        proj = uniq("place")
        self.c.create_project(proj)
        self.addCleanup(lambda: self.c.delete_project(proj))
        p = self.c.set_placement(proj, pin=[{"pool": "a"}], avoid=[{"gpu": "none"}])
        self.assertEqual((p["pin"], p["avoid"]), ([{"pool": "a"}], [{"gpu": "none"}]))
        self.assertEqual(self.c.placement(proj)["effective"]["pin"], [{"pool": "a"}])
        # Nodes are a cluster server's routes; a single corral up has none.
        with self.assertRaises(corral.NotFound):
            self.c.nodes()
        with self.assertRaises(corral.NotFound):
            self.c.node_action("edge1", "cordon")
        # The vm tier's routes answer for a container sandbox by naming the tier; screen and
        # input drive a container's X display, and one without a desktop is a conflict.
        sb = self.sandbox()
        for call in (lambda: sb.power("reboot"), sb.console):
            with self.assertRaises(corral.InvalidRequest) as cm:
                call()
            self.assertIn("not a vm sandbox", cm.exception.message)
        for call in (sb.screenshot, lambda: sb.input({"type": "text", "text": "x"})):
            with self.assertRaises(corral.Conflict) as cm:
                call()
            self.assertIn("has no desktop", cm.exception.message)
        # A tar archive as it is.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            ti = tarfile.TarInfo("t.txt")
            ti.size = 2
            tf.addfile(ti, io.BytesIO(b"ok"))
        sb.upload_tar("/up", buf.getvalue())
        self.assertEqual(sb.read_file("/up/t.txt"), b"ok")

    def test_idempotent_create(self) -> None:
        key = uniq("idem")
        a = self.sandbox(idempotency_key=key)
        b = self.c.create(base=BASE, ttl="10m", idempotency_key=key)
        self.assertEqual(a.id, b.id)
        with self.assertRaises(corral.Conflict):
            self.c.create(base=BASE, ttl="20m", idempotency_key=key)


if __name__ == "__main__":
    unittest.main()
