"""Streams broken mid-way: the client resumes from the offset it reached, sync and async."""

from __future__ import annotations

import asyncio
import unittest

from support import BASE, TOKEN, URL, CuttingProxy, corral, need_server

SCRIPT = "for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 0.15; done; echo tail >&2; exit 7"
WANT = b"".join(b"line%d\n" % i for i in range(1, 9))


class BrokenStreamTest(unittest.TestCase):
    def setUp(self) -> None:
        need_server(self)
        self.proxy = CuttingProxy(URL)
        self.addCleanup(self.proxy.close)
        self.admin = corral.Corral(URL, TOKEN)
        self.addCleanup(self.admin.close)
        self.sb = self.admin.create(base=BASE, ttl="5m")
        self.addCleanup(self.sb.delete)

    def test_sync_stream_resumes_after_cut(self) -> None:
        c = corral.Corral(self.proxy.url, TOKEN)
        sb = c.get(self.sb.id)
        out, err, cut = b"", b"", False
        st = sb.stream(["sh", "-c", SCRIPT])
        for ev in st:
            if ev.type == "stdout":
                out += ev.data
                if b"line2" in out and not cut:
                    self.proxy.cut()
                    cut = True
            elif ev.type == "stderr":
                err += ev.data
        self.assertTrue(cut)
        # The rest came over a new connection: the stream re-attached.
        self.assertGreaterEqual(self.proxy.accepted, 2)
        self.assertEqual((out, err, st.exit_code), (WANT, b"tail\n", 7))

    def test_sync_exec_resumes_after_cut(self) -> None:
        c = corral.Corral(self.proxy.url, TOKEN)
        sb = c.get(self.sb.id)
        cmd = sb.start(["sh", "-c", "sleep 0.3; " + SCRIPT])
        st = sb.attach(cmd.id)
        first = next(ev for ev in st if ev.type == "stdout")
        self.proxy.cut()
        rest = b"".join(ev.data for ev in st if ev.type == "stdout")
        self.assertEqual(first.data + rest, WANT)
        self.assertEqual(st.exit_code, 7)

    def test_no_resume_raises(self) -> None:
        c = corral.Corral(self.proxy.url, TOKEN)
        st = c.get(self.sb.id).stream(["sh", "-c", SCRIPT], resume=False)
        with self.assertRaises(corral.StreamError):
            for ev in st:
                if ev.type == "stdout":
                    self.proxy.cut()

    def test_async_stream_resumes_after_cut(self) -> None:
        async def main() -> None:
            async with corral.AsyncCorral(self.proxy.url, TOKEN) as ac:
                sb = await ac.get(self.sb.id)
                out, cut = b"", False
                st = sb.stream(["sh", "-c", SCRIPT])
                async for ev in st:
                    if ev.type == "stdout":
                        out += ev.data
                        if b"line3" in out and not cut:
                            self.proxy.cut()
                            cut = True
                self.assertTrue(cut)
                self.assertEqual((out, st.exit_code), (WANT, 7))
                # Closing mid-way and attaching again from the offset reached.
                st = sb.stream(["sh", "-c", SCRIPT])
                got = b""
                async for ev in st:
                    if ev.type == "stdout":
                        got += ev.data
                        if b"line4" in got:
                            break
                await st.close()
                async with sb.attach(st.command_id, offset=st.next_offset) as rest:
                    async for ev in rest:
                        if ev.type == "stdout":
                            got += ev.data
                self.assertEqual((got, rest.exit_code), (WANT, 7))
        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
