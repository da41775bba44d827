"""The asyncio client against a real corral: every public method, and many sandboxes at once
over a small connection pool."""

from __future__ import annotations

import asyncio
import os
import tempfile
import unittest

from support import BASE, TOKEN, URL, corral, need_server, uniq


class AsyncTest(unittest.TestCase):
    def setUp(self) -> None:
        need_server(self)

    def run_async(self, fn) -> None:
        async def wrap() -> None:
            async with corral.AsyncCorral(URL, TOKEN) as ac:
                await fn(ac)
        asyncio.run(wrap())

    def test_lifecycle_and_exec(self) -> None:
        async def t(ac: corral.AsyncCorral) -> None:
            self.assertTrue(await ac.health())
            self.assertTrue((await ac.server_info()).version)
            label = uniq("a")
            async with await ac.create(base=BASE, ttl="10m", labels={"run": label},
                                       memory="256M", env=["K=v"]) as sb:
                self.assertEqual([s.id for s in await ac.list(labels={"run": label})], [sb.id])
                self.assertEqual((await ac.get(sb.id)).id, sb.id)
                r = await sb.exec(["sh", "-c", "echo $K; echo e >&2; exit 2"])
                self.assertEqual((r.exit_code, r.stdout, r.stderr), (2, "v\n", "e\n"))
                r = await sb.exec("cat", stdin="in")
                self.assertEqual(r.stdout, "in")
                r1 = await sb.exec("date +%N", step_id="once")
                r2 = await sb.exec("date +%N", step_id="once")
                self.assertEqual((r1.stdout, r2.replayed), (r2.stdout, True))
                types = [ev.type async for ev in sb.stream(["echo", "x"])]
                self.assertEqual((types[0], types[-1]), ("start", "exit"))
                self.assertEqual((await sb.pause()).state, "paused")
                self.assertEqual((await sb.info()).state, "paused")
                self.assertEqual((await sb.resume()).state, "running")
                await sb.set_ttl(3600)
                steps = await sb.trajectory()
                self.assertEqual([s.step_id for s in steps if s.step_id], ["once"])
                with self.assertRaises(corral.InvalidRequest):
                    await sb.exec(["/no/such/program"])
            # "deleting" until the deleted sandbox's host cleanup ended.
            self.assertIn((await (await ac.get(sb.id)).info()).state, ("deleting", "stopped"))
            with self.assertRaises(corral.NotFound):
                await ac.get("sb-local-aaaaaaaaaaaaaaaa")
        self.run_async(t)

    def test_commands_and_files(self) -> None:
        async def t(ac: corral.AsyncCorral) -> None:
            sb = await ac.create(base=BASE, ttl="10m")
            try:
                cmd = await sb.start(["sh", "-c", "read x; echo got $x; sleep 60"],
                                     open_stdin=True)
                await sb.write_stdin(cmd.id, "hi\n", eof=True)
                async with sb.attach(cmd.id) as st:
                    async for ev in st:
                        if ev.type == "stdout":
                            self.assertEqual(ev.data, b"got hi\n")
                            break
                self.assertIn(cmd.id, [c.id for c in await sb.commands()])
                await sb.signal(cmd.id, 9)
                for _ in range(600):
                    if (await sb.command(cmd.id)).state == "exited":
                        break
                    await asyncio.sleep(0.05)
                self.assertEqual((await sb.command(cmd.id)).exit.signal, "SIGKILL")
                tty = await sb.start("sleep 0.5; stty size", tty=True, rows=5, cols=5)
                await sb.resize(tty.id, 40, 90)
                out = b"".join([ev.data async for ev in sb.attach(tty.id)])
                self.assertIn(b"40 90", out)

                fi = await sb.write_file("/tmp/f", b"abc", mode=0o640)
                self.assertEqual(fi.permissions, 0o640)
                self.assertEqual(await sb.read_file("/tmp/f"), b"abc")
                self.assertEqual((await sb.stat("/tmp/f")).size, 3)
                await sb.mkdir("/tmp/a/b", parents=True)
                await sb.move("/tmp/f", "/tmp/a/b/g")
                self.assertEqual([f.name for f in await sb.list("/tmp/a/b")], ["g"])
                self.assertFalse(await sb.exists("/tmp/f"))
                await sb.remove("/tmp/a", recursive=True)
                self.assertFalse(await sb.exists("/tmp/a"))
                with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
                    with open(os.path.join(src, "x.txt"), "w") as f:
                        f.write("up")
                    await sb.upload(src, "/data")
                    self.assertEqual(await sb.read_file("/data/x.txt"), b"up")
                    await sb.download("/data", dst)
                    with open(os.path.join(dst, "x.txt")) as f:
                        self.assertEqual(f.read(), "up")
                self.assertTrue(await sb.download_tar("/data"))
                await sb.mkdir("/tmp/w")
                async with await sb.watch("/tmp/w") as w:
                    await sb.exec("touch /tmp/w/n")
                    async for ev in w:
                        if ev.name == "n":
                            self.assertEqual(ev.type, "create")
                            break
                layer = await sb.snapshot(uniq("asnap"), exclude=["/data"])
                self.assertEqual(layer.kind, "snapshot")
                info = await sb.network(mode="none")
                self.assertIsNotNone(info)
                self.assertIsInstance(await sb.blocked_attempts(), list)
                self.assertIsInstance(await sb.fetch_stats(), dict)
                for call in (lambda: sb.power("off"), sb.console):
                    with self.assertRaises(corral.InvalidRequest):
                        await call()
                # Screen and input drive a container's X display: none here, a conflict.
                for call in (sb.screenshot, lambda: sb.input({"type": "key", "key": "ret"})):
                    with self.assertRaises(corral.Conflict):
                        await call()
                await sb.upload_tar("/up", _tar({"a": b"1"}))
                self.assertEqual(await sb.read_file("/up/a"), b"1")
            finally:
                await sb.delete()
        self.run_async(t)

    def test_admin_surface(self) -> None:
        async def t(ac: corral.AsyncCorral) -> None:
            proj = uniq("aproj")
            await ac.create_project(proj)
            self.assertEqual((await ac.project(proj)).path, proj)
            self.assertIn(proj, [p.path for p in await ac.projects()])
            pr = await ac.create_principal(uniq("abot"), project=proj)
            await ac.grant(proj, pr.name, "viewer")
            self.assertIn(pr.name, [g.principal for g in await ac.grants(proj)])
            self.assertIn(pr.name, [p.name for p in await ac.principals(proj)])
            tok = await ac.create_token(proj, "viewer", principal=pr.name)
            self.assertIn(tok.id, [x.id for x in await ac.tokens()])
            await ac.revoke_token(tok.id)
            await ac.revoke(proj, pr.name)
            q = await ac.set_quota(proj, sandboxes=3)
            self.assertEqual(q.limit["sandboxes"], 3)
            self.assertEqual((await ac.quota(proj)).limit["sandboxes"], 3)
            self.assertIsInstance(await ac.placement(proj), dict)
            p = await ac.set_placement(proj, avoid=[{"zone": "b"}])
            self.assertEqual(p["avoid"], [{"zone": "b"}])
            with self.assertRaises(corral.NotFound):
                await ac.nodes()
            with self.assertRaises(corral.NotFound):
                await ac.node_action("edge1", "drain")
            svcs = await ac.set_network_services({"services": {"apyidx": {"domains": ["pypi.org"]}}})
            self.assertEqual([x.name for x in svcs], ["apyidx"])
            self.assertTrue(await ac.audit(project=proj))
            self.assertEqual((await ac.move_project(proj, proj + "-b")).path, proj + "-b")
            await ac.delete_project(proj + "-b")
            self.assertTrue((await ac.whoami()).permissions)

            name = uniq("als")
            layer = await ac.import_layer(name, "1", "toolkit", _tar({"tool.sh": b"echo t"}))
            self.assertEqual(layer.ref, name + ":1")
            self.assertEqual((await ac.layer(name, "1")).kind, "toolkit")
            self.assertEqual(len(await ac.layers(name)), 1)
            await ac.tag_layer(name, "stable", "1")
            self.assertIsInstance(await ac.layer_stats(name, "1"), dict)
            await ac.set_layer_fill_rate(name, "1", 0)
            env = uniq("aenv")
            await ac.save_environment(env, BASE, toolkits=[name + ":stable"])
            self.assertEqual((await ac.environment(env)).toolkits, [name + ":stable"])
            self.assertIn(env, [e.name for e in await ac.environments()])
            async with await ac.create(environment=env, ttl="5m") as sb:
                self.assertEqual((await sb.exec(["cat", "/tool.sh"])).stdout, "echo t")
            await ac.delete_environment(env)
            await ac.delete_tag(name, "stable")
            await ac.delete_layer(name, "1")
            self.assertIsInstance(await ac.gc_layers(), dict)
            self.assertIsInstance(await ac.network_services(), list)
            self.assertIn("corral", await ac.metrics())

            fn = uniq("afn")
            await ac.create_fncall_env(fn, BASE, pool_min=1, pool_max=1)
            try:
                r = await ac.call(fn, ["cat", "in"], files={"in": "data"})
                self.assertEqual(r.stdout, b"data")
                out = [ev async for ev in ac.call_stream(fn, script="echo s")]
                self.assertEqual(out[-1].type, "exit")
                self.assertIn(fn, [e.name for e in await ac.fncall_envs()])
                self.assertEqual((await ac.fncall_env(fn)).pool_max, 1)
            finally:
                await ac.delete_fncall_env(fn)
        self.run_async(t)

    def test_many_sandboxes_small_pool(self) -> None:
        async def main() -> None:
            # 24 sandboxes, each streaming, over at most 6 connections.
            async with corral.AsyncCorral(URL, TOKEN, max_connections=6) as ac:
                async def one(i: int) -> str:
                    async with await ac.create(base=BASE, ttl="5m", labels={"i": str(i)}) as sb:
                        r = await sb.exec(["sh", "-c", "sleep 0.2; echo %d" % i])
                        return r.stdout
                outs = await asyncio.gather(*(one(i) for i in range(24)))
                self.assertEqual(outs, ["%d\n" % i for i in range(24)])
                pool = ac._t.pool
                self.assertLessEqual(len(pool._idle), 6)
        asyncio.run(main())


class AbandonedStreamTest(unittest.TestCase):
    def setUp(self) -> None:
        need_server(self)

    def test_abandoned_stream_gives_its_connection_back(self) -> None:
        import gc

        async def main() -> None:
            async with corral.AsyncCorral(URL, TOKEN, max_connections=1) as ac:
                async with await ac.create(base=BASE, ttl="5m") as sb:
                    st = sb.stream(["sh", "-c", "echo one; sleep 30"])
                    async for ev in st:
                        if ev.type == "stdout":
                            break  # left without close: the one connection is the stream's
                    del st, ev
                    gc.collect()
                    r = await asyncio.wait_for(sb.exec(["echo", "free"]), 30)
                    self.assertEqual(r.stdout, "free\n")
        asyncio.run(main())


def _tar(files: dict) -> bytes:
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


if __name__ == "__main__":
    unittest.main()
