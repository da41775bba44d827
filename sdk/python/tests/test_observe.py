"""Metrics and the event stream, sync and async, against a real corral."""

from __future__ import annotations

import datetime
import time
import unittest

from support import BASE, TOKEN, URL, corral, need_server


class ObserveTest(unittest.TestCase):
    def setUp(self) -> None:
        need_server(self)
        self.c = corral.Corral(URL, TOKEN)
        self.addCleanup(self.c.close)

    def test_events_follow_and_replay(self) -> None:
        since = datetime.datetime.now(datetime.timezone.utc)
        # Opened first, read after: what happens meanwhile waits in the stream. (A sync stream is
        # read and closed by one thread.)
        stream = self.c.events(follow=True, types=["created", "deleted"])
        self.addCleanup(stream.close)
        sb = self.c.create(base=BASE, ttl="10m")
        sb.delete()
        got = []
        for ev in stream:
            if ev.sandbox == sb.id:
                got.append(ev)
            if len(got) == 2:
                break
        self.assertEqual([e.type for e in got], ["created", "deleted"])
        self.assertTrue(got[0].id and got[0].node and got[0].at is not None)
        stream.close()
        # Replay: since a datetime, and since a duration.
        with self.c.events(since=since) as past:
            types = [e.type for e in past if e.sandbox == sb.id]
        self.assertEqual(types[0], "created")
        self.assertEqual(types[-1], "deleted")
        with self.c.events(since="10m", types=["started"]) as past:
            self.assertIn(sb.id, [e.sandbox for e in past])
        with self.assertRaises(corral.InvalidRequest):
            with self.c.events(types=["exploded"]) as bad:
                list(bad)

    def test_metrics(self) -> None:
        sb = self.c.create(base=BASE, ttl="10m")
        self.addCleanup(sb.delete)
        sb.exec(["true"])
        samples = []
        deadline = time.time() + 30
        while time.time() < deadline and not samples:
            samples = sb.metrics()
            time.sleep(0.2)
        self.assertTrue(samples, "no sample within 30s (is --sample-interval short?)")
        s = samples[-1]
        self.assertIsInstance(s, corral.MetricSample)
        self.assertGreater(s.memory_bytes, 0)
        self.assertGreater(s.pids, 0)
        # since keeps later samples only (a datetime has microseconds; samples, nanoseconds).
        later = sb.metrics(since=s.at + datetime.timedelta(milliseconds=1))
        self.assertTrue(all(x.at > s.at for x in later), later)
        with self.assertRaises(corral.InvalidRequest):
            sb.metrics(since="yesterday")

    def test_report_and_webhooks(self) -> None:
        sb = self.c.create(base=BASE, ttl="10m")
        sb.exec(["true"])
        sb.delete()
        rep = self.c.report(since="1h")
        self.assertGreaterEqual(rep["sandboxes"], 1)
        self.assertIn("blocked_per_1000_actions", rep)
        self.assertTrue(rep["setup"], rep)
        with self.assertRaises(corral.InvalidRequest):
            self.c.report(since="last week")
        # This server refuses private targets (no --webhook-allow-private): the guard answers,
        # and nothing is kept.
        with self.assertRaises(corral.InvalidRequest):
            self.c.add_webhook("http://127.0.0.1:9/hook", events=["created"])
        with self.assertRaises(corral.InvalidRequest):
            self.c.add_webhook("ftp://hooks.test/x")
        self.assertEqual(self.c.webhooks(), [])
        with self.assertRaises(corral.NotFound):
            self.c.webhook_deliveries("wh-nope")
        with self.assertRaises(corral.NotFound):
            self.c.test_webhook("wh-nope")

    def test_async(self) -> None:
        import asyncio

        async def run() -> None:
            async with corral.AsyncCorral(URL, TOKEN) as c:
                sb = await c.create(base=BASE, ttl="10m")
                try:
                    stream = await c.events(since="5m", types=["created"])
                    ids = [e.sandbox async for e in stream]
                    await stream.close()
                    self.assertIn(sb.id, ids)
                    deadline = time.time() + 30
                    samples = []
                    while time.time() < deadline and not samples:
                        samples = await sb.metrics()
                        await asyncio.sleep(0.2)
                    self.assertTrue(samples)
                finally:
                    await sb.delete()

        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
