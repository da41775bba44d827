"""The asyncio client: :class:`AsyncCorral` and :class:`AsyncSandbox`.

The same routes, errors, retries and stream handling as the sync client (they come from
:mod:`corral._api` and :mod:`corral._core`), sent over HTTP/1.1 connections written with asyncio
streams. Connections come from a bounded pool (``max_connections``), so one client can drive
hundreds of sandboxes at once: calls beyond the bound wait for a free connection.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _api, _tario, errors
from ._core import (Call, Duration, Endpoint, NDJSONSplitter, OutputState, Request, RetryPolicy,
                    USER_AGENT, decode_error, event_line, resolve, watch_line)
from .models import (AuditEntry, BlockedAttempt, Build, CallResult, CodeContext, Command, Environment, Event,
                     Execution, LifecycleEvent, MetricSample,
                     ExecResult, Exit, FileInfo, FncallEnv, Grant, Layer, NetworkService, Node,
                     Principal, Project, ProjectQuota, SandboxInfo, ServerInfo, Token,
                     TrajectoryEntry, Volume, WatchEvent, Whoami)

__all__ = ["AsyncCorral", "AsyncSandbox", "AsyncExecStream", "AsyncWatchStream"]

_CONN_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, EOFError)


class _Conn:
    """One HTTP/1.1 connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken socket
            pass


class _Response:
    """An answer: status, headers and a body read as it comes (Content-Length, chunked or to
    the end of the connection)."""

    def __init__(self, pool: "_Pool", conn: _Conn, status: int, headers: Dict[str, str],
                 head_only: bool) -> None:
        self._pool, self._conn = pool, conn
        self.status, self.headers = status, headers
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._left: Optional[int] = int(cl) if cl is not None and not self._chunked else None
        self._keep = headers.get("connection", "").lower() != "close" and (
            self._chunked or self._left is not None or head_only)
        self._chunk_left = 0
        self._done = head_only or self._left == 0
        self._released = False
        if self._done:
            self.release(clean=True)

    async def read1(self) -> bytes:
        """The next bytes of the body; b"" at its end."""
        if self._done:
            return b""
        r = self._conn.reader
        if self._chunked:
            if self._chunk_left == 0:
                line = await r.readuntil(b"\r\n")
                n = int(line.split(b";", 1)[0].strip(), 16)
                if n == 0:
                    while (await r.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    self._finish()
                    return b""
                self._chunk_left = n
            data = await r.read(min(self._chunk_left, 64 << 10))
            if not data:
                raise EOFError("connection closed inside a chunk")
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                await r.readexactly(2)
            return data
        if self._left is not None:
            data = await r.read(min(self._left, 64 << 10))
            if not data:
                raise EOFError("connection closed %d bytes before the end of the body" % self._left)
            self._left -= len(data)
            if self._left == 0:
                self._finish()
            return data
        data = await r.read(64 << 10)
        if not data:
            self._finish()
        return data

    def _finish(self) -> None:
        self._done = True
        self.release(clean=True)

    async def read_all(self) -> bytes:
        """Read the rest of the body."""
        parts = []
        while True:
            b = await self.read1()
            if not b:
                return b"".join(parts)
            parts.append(b)

    async def drain(self) -> None:
        """Read the (short) rest of a stream the server is ending, then give the connection
        back: reused when the end came within a few seconds, else closed."""
        try:
            await asyncio.wait_for(self.read_all(), 5)
        except (_CONN_ERRORS + (asyncio.TimeoutError,)):
            pass
        self.release(clean=True)

    def release(self, clean: bool = False) -> None:
        """Give the connection back: to the pool after a complete body, else closed."""
        if self._released:
            return
        self._released = True
        self._pool.put(self._conn, clean and self._done and self._keep)


class _Pool:
    """A bounded pool of connections to one server: at most ``size`` in use at once."""

    def __init__(self, ep: Endpoint, size: int, ssl_context: Optional[ssl.SSLContext],
                 connect_timeout: float) -> None:
        self.ep, self.connect_timeout = ep, connect_timeout
        self._sem = asyncio.Semaphore(size)
        self._idle: List[_Conn] = []
        self._max_idle = size
        self._ssl = ssl_context if ssl_context is not None else (
            ssl.create_default_context() if ep.scheme == "https" else None)

    async def get(self) -> Tuple[_Conn, bool]:
        await self._sem.acquire()
        while self._idle:
            c = self._idle.pop()
            if not c.reader.at_eof() and not c.writer.is_closing():
                return c, True
            c.close()
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(self.ep.host, self.ep.port, ssl=self._ssl,
                                        limit=1 << 20),
                self.connect_timeout)
        except BaseException:
            self._sem.release()
            raise
        return _Conn(r, w), False

    def put(self, conn: _Conn, reusable: bool) -> None:
        if reusable and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        self._sem.release()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()


async def _read_head(r: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
    while True:
        line = await r.readuntil(b"\r\n")
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise errors.TransportError("bad status line %r" % line[:80])
        status = int(parts[1])
        headers: Dict[str, str] = {}
        while True:
            h = await r.readuntil(b"\r\n")
            if h == b"\r\n":
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if status != 100:
            return status, headers


class _Transport:
    """Sends Requests with retries over the pool."""

    def __init__(self, url: str, token: str, timeout: float, retry: RetryPolicy,
                 max_connections: int, ssl_context: Optional[ssl.SSLContext],
                 user_agent: str) -> None:
        self.ep = Endpoint.parse(url)
        self.token, self.timeout, self.retry, self.user_agent = token, timeout, retry, user_agent
        self._max, self._ssl = max_connections, ssl_context
        self._pool: Optional[_Pool] = None

    @property
    def pool(self) -> _Pool:
        # Made on first use, inside the running loop.
        if self._pool is None:
            self._pool = _Pool(self.ep, self._max, self._ssl, self.timeout)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    async def _exchange(self, req: Request, wire: bytes) -> Tuple[_Response, bool, bool]:
        """Send one request; return the answer, whether the connection was reused, and raise
        (with ``sent`` in the exception's args) on failure."""
        conn, reused = await self.pool.get()
        sent = False
        try:
            conn.writer.write(wire)
            await conn.writer.drain()
            sent = True
            # Even a stream's head comes at once; only its body may pause for long.
            status, headers = await asyncio.wait_for(_read_head(conn.reader), self.timeout)
        except BaseException as e:
            self.pool.put(conn, False)
            if isinstance(e, (_CONN_ERRORS + (asyncio.TimeoutError, errors.TransportError))):
                raise _SendError(e, sent, reused) from e
            raise
        # HEAD answers, 204 and 304 have no body whatever their headers say (RFC 9112 6.3).
        bodiless = req.method == "HEAD" or status in (204, 304)
        return _Response(self.pool, conn, status, headers, bodiless), reused, sent

    async def open(self, req: Request) -> _Response:
        """Send req and return its answer once the status is below 400, retrying as the policy
        allows; raise the APIError (or TransportError) otherwise."""
        wire = req.wire(self.ep, self.token, self.user_agent)
        attempt = 0
        while True:
            attempt += 1
            try:
                r, _, _ = await self._exchange(req, wire)
            except _SendError as e:
                stale = e.reused and not isinstance(e.cause, asyncio.TimeoutError)
                if stale and attempt <= self.retry.retries + 1:
                    continue
                if self.retry.should_retry_error(req, attempt, e.sent):
                    await asyncio.sleep(self.retry.delay(attempt))
                    continue
                raise errors.TransportError("%s %s: %s" % (req.method, req.path, e.cause)) from e.cause
            if r.status < 400:
                return r
            try:
                data = await asyncio.wait_for(r.read_all(), self.timeout)
            except (_CONN_ERRORS + (asyncio.TimeoutError,)):
                data = b""
                r.release()
            err = decode_error(r.status, r.headers, data)
            if self.retry.should_retry_status(req, r.status, attempt):
                await asyncio.sleep(self.retry.delay(attempt, err.retry_after))
                continue
            raise err

    async def do(self, call: Call) -> Any:
        """Send a call and return its parsed answer."""
        attempt = 0
        while True:
            attempt += 1
            r = await self.open(call.request)
            try:
                body = await asyncio.wait_for(r.read_all(), self.timeout)
            except (_CONN_ERRORS + (asyncio.TimeoutError,)) as e:
                r.release()
                if self.retry.should_retry_error(call.request, attempt, True):
                    await asyncio.sleep(self.retry.delay(attempt))
                    continue
                raise errors.TransportError("%s %s: read answer: %s"
                                            % (call.request.method, call.request.path, e)) from e
            except BaseException:
                r.release()
                raise
            return call.parse(r.status, r.headers, body)


class _SendError(Exception):
    def __init__(self, cause: BaseException, sent: bool, reused: bool) -> None:
        super().__init__(str(cause))
        self.cause, self.sent, self.reused = cause, sent, reused


class AsyncExecStream:
    """A command's output as an async iterator of :class:`~corral.models.Event`
    (``async for ev in sb.stream(...)``); the asyncio form of :class:`corral.ExecStream`, with
    the same re-attach on a broken connection. Close it (``await s.close()`` or ``async with``)
    when leaving early: it holds a pooled connection."""

    def __init__(self, transport: _Transport, req: Request, state: OutputState,
                 resume: bool = True) -> None:
        self._t, self._req, self.state, self._resume = transport, req, state, resume
        self._resp: Optional[_Response] = None
        self._split = NDJSONSplitter()
        self._pending: List[Any] = []
        self._closed = False
        self._ended = False

    async def _open(self) -> None:
        self._resp = await self._t.open(self._req)
        self._split = NDJSONSplitter()

    async def start(self) -> "AsyncExecStream":
        """Send the request now (iteration does it otherwise)."""
        if self._resp is None and not self._ended:
            await self._open()
        return self

    @property
    def command_id(self) -> str:
        """The ID of the command ('' before the start event was read)."""
        return self.state.command_id

    @property
    def exit(self) -> Optional[Exit]:
        """How the command ended, once the exit event was read."""
        return self.state.exit

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code, once the exit event was read."""
        return self.state.exit.code if self.state.exit else None

    @property
    def next_offset(self) -> int:
        """The output offset after the last byte delivered: attach from here to continue."""
        return self.state.next_offset

    def __aiter__(self) -> "AsyncExecStream":
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                ev = self.state.accept(self._pending.pop(0))
                if ev is not None:
                    return ev
                continue
            if self._ended or self.state.done:
                await self.close(clean=True)
                raise StopAsyncIteration
            if self._resp is None:
                await self._open()
            assert self._resp is not None
            try:
                data = await self._resp.read1()
            except _CONN_ERRORS as e:
                await self._broken(e)
                continue
            if data:
                self._pending.extend(self._split.feed(data))
                continue
            self._pending.extend(self._split.finish())
            if self._pending:
                continue
            if self.state.want_exit and not self.state.done:
                await self._broken(None)
                continue
            self._ended = True

    async def _broken(self, cause: Optional[BaseException]) -> None:
        if self._resp is not None:
            self._resp.release()
            self._resp = None
        self._pending.clear()
        if self._resume and self.state.can_resume():
            self._req = self.state.resume_request()
        elif not (self._resume and self._req.idempotent and not self.state.done):
            self._closed = True
            if cause is None:
                self.state.ended()
            raise errors.StreamError("output stream broke: %s" % (cause,)) from cause
        # Else sent again as it was (see ExecStream._broken).
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._open()
                return
            except errors.TransportError:
                if attempt > self._t.retry.retries:
                    raise
                await asyncio.sleep(self._t.retry.delay(attempt))

    async def collect(self) -> ExecResult:
        """Read the stream to its end and return the collected result."""
        out, err = bytearray(), bytearray()
        try:
            async for ev in self:
                if ev.type == "stdout":
                    out += ev.data
                elif ev.type == "stderr":
                    err += ev.data
        finally:
            await self.close()
        ex = self.state.exit or Exit()
        return ExecResult(ex.code, bytes(out), bytes(err), ex, self.state.command_id,
                          self.state.replayed, self.state.dropped)

    async def close(self, clean: bool = False) -> None:
        """End the stream; the command keeps running."""
        self._closed = True
        if self._resp is not None:
            r, self._resp = self._resp, None
            if clean:
                await r.drain()
            else:
                r.release()

    def __del__(self) -> None:
        # A stream abandoned without close must give its pooled connection back.
        r = getattr(self, "_resp", None)
        if r is not None:
            self._resp = None
            r.release()

    async def __aenter__(self) -> "AsyncExecStream":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncEventStream:
    """The event stream (:meth:`AsyncCorral.events`): ``async for`` it for LifecycleEvents;
    close it when done."""

    def __init__(self, resp: _Response) -> None:
        self._resp = resp
        self._split = NDJSONSplitter()
        self._pending: List[Any] = []
        self._closed = False

    def __aiter__(self) -> "AsyncEventStream":
        return self

    async def __anext__(self) -> LifecycleEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                return event_line(self._pending.pop(0), self._resp.status)
            try:
                data = await self._resp.read1()
            except _CONN_ERRORS as e:
                raise errors.StreamError("read event stream: %s" % e) from e
            if data:
                self._pending.extend(self._split.feed(data))
                continue
            self._pending.extend(self._split.finish())
            if self._pending:
                continue
            self._closed = True
            raise StopAsyncIteration

    async def close(self) -> None:
        """End the stream."""
        self._closed = True
        self._resp.release()

    def __del__(self) -> None:
        r = getattr(self, "_resp", None)
        if r is not None and not self._closed:
            r.release()


class AsyncWatchStream:
    """An open watch of a directory tree: ``async for`` it for WatchEvents; close it when done."""

    def __init__(self, resp: _Response) -> None:
        self._resp = resp
        self._split = NDJSONSplitter()
        self._pending: List[Any] = []
        self._gone = False
        self._closed = False

    def __aiter__(self) -> "AsyncWatchStream":
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                ev = watch_line(self._pending.pop(0), self._resp.status)
                if not ev.name and ev.type in ("remove", "rename"):
                    self._gone = True
                return ev
            try:
                data = await self._resp.read1()
            except _CONN_ERRORS as e:
                raise errors.StreamError("read watch stream: %s" % e) from e
            if data:
                self._pending.extend(self._split.feed(data))
                continue
            self._pending.extend(self._split.finish())
            if self._pending:
                continue
            self._closed = True
            if not self._gone:
                raise errors.StreamError("watch stream ended before its directory went away")
            raise StopAsyncIteration

    async def close(self) -> None:
        """End the watch."""
        self._closed = True
        self._resp.release()

    def __del__(self) -> None:
        r = getattr(self, "_resp", None)
        if r is not None and not self._closed:
            r.release()

    async def __aenter__(self) -> "AsyncWatchStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSandbox:
    """The asyncio form of :class:`corral.Sandbox`: the same methods as coroutines (``stream``
    and ``attach`` return async iterators). ``async with`` deletes the sandbox at the end."""

    def __init__(self, client: "AsyncCorral", record: SandboxInfo) -> None:
        self._c = client
        self.id: str = record.id
        self.record: SandboxInfo = record

    def __repr__(self) -> str:
        return "AsyncSandbox(%r, state=%r)" % (self.id, self.record.state)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.delete()
        except errors.NotFound:
            pass

    async def _keep(self, call: Call) -> SandboxInfo:
        self.record = await self._c._do(call)
        return self.record

    async def info(self, wait_running: bool = False) -> SandboxInfo:
        """Return the sandbox's current state; ``wait_running`` resumes a paused one first."""
        return await self._keep(_api.get(self.id, wait_running))

    async def delete(self) -> SandboxInfo:
        """Stop the sandbox and remove it (idempotent)."""
        return await self._keep(_api.delete(self.id))

    async def pause(self) -> SandboxInfo:
        """Freeze the sandbox and give its memory back; any later use resumes it."""
        return await self._keep(_api.pause(self.id))

    async def resume(self) -> SandboxInfo:
        """Bring a paused sandbox back to running."""
        return await self._keep(_api.resume(self.id))

    async def set_ttl(self, ttl: Duration) -> SandboxInfo:
        """Make the sandbox expire ``ttl`` from now."""
        return await self._keep(_api.set_ttl(self.id, ttl))

    async def fork(self, count: int = 1, labels: Optional[Mapping[str, str]] = None,
                   disk_only: bool = False, ttl: Optional[Duration] = None) -> List["AsyncSandbox"]:
        """Make ``count`` copies that go on from this sandbox's state now (see
        :meth:`corral.Sandbox.fork`)."""
        infos = await self._c._do(_api.fork(self.id, count, labels, disk_only, ttl))
        return [AsyncSandbox(self._c, i) for i in infos]

    async def snapshot(self, name: str, version: Optional[str] = None,
                       exclude: Optional[Sequence[str]] = None) -> Layer:
        """Publish the sandbox's changes as a snapshot layer (see :meth:`corral.Sandbox.snapshot`)."""
        return await self._c._do(_api.snapshot(self.id, name, version, exclude))

    async def network(self, allow: Optional[Sequence[str]] = None,
                      deny: Optional[Sequence[str]] = None,
                      mode: Optional[str] = None) -> SandboxInfo:
        """Replace the sandbox's egress policy (see :meth:`corral.Sandbox.network`)."""
        pol: Dict[str, Any] = {}
        if mode:
            pol["mode"] = mode
        if allow:
            pol["allow"] = list(allow)
        if deny:
            pol["deny"] = list(deny)
        if not pol:
            pol["mode"] = "none"
        return await self._keep(_api.set_network(self.id, pol))

    async def blocked_attempts(self) -> List[BlockedAttempt]:
        """The sandbox's latest blocked egress attempts."""
        return await self._c._do(_api.blocked(self.id))

    async def metrics(self, since: Any = None) -> List[MetricSample]:
        """The sandbox's resource samples (see :meth:`corral.Sandbox.metrics`)."""
        return await self._c._do(_api.sandbox_metrics(self.id, since))

    async def fetch_stats(self) -> Dict[str, Any]:
        """How the sandbox's layer data reaches its node."""
        return await self._c._do(_api.fetch_stats(self.id))

    async def trajectory(self, after: int = 0) -> List[TrajectoryEntry]:
        """The sandbox's trajectory steps with a sequence number above ``after``."""
        return await self._c._do(_api.trajectory(self.id, after))

    def stream(self, argv: Union[Sequence[str], str], env: Any = None, cwd: Optional[str] = None,
               user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
               timeout: Optional[Duration] = None, step_id: Optional[str] = None,
               exclusive: bool = False, resume: bool = True) -> AsyncExecStream:
        """Run a command and return its output as an async iterator of events (see
        :meth:`corral.Sandbox.stream`). The request is sent on first iteration."""
        body = _api.exec_body(argv, env, cwd, user, stdin, timeout, step_id, exclusive)
        return AsyncExecStream(self._c._t, _api.exec_stream(self.id, body), OutputState(self.id),
                               resume)

    # -- code (a code-interpreter sandbox: corral env install code-interpreter) --

    async def run_code(self, code: str, context: Optional[str] = None, language: Optional[str] = None,
                 timeout: Optional[Duration] = None, env: Optional[Dict[str, str]] = None) -> Execution:
        """Run ``code`` in the sandbox's stateful kernel (variables stay between runs of one
        context) and return its :class:`~corral.models.Execution`: ``stdout``, ``stderr``,
        ``results`` (``text``, ``png``, ``html``...; ``.text`` is the last expression's value),
        ``error`` (the exception, by ``name``). ``timeout`` (default 5m) interrupts the kernel,
        not the sandbox. A sandbox without the code server raises :class:`Conflict`."""
        return await self._c._do(_api.run_code(self.id, code, language, context, timeout, env))

    async def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None) -> CodeContext:
        """Start a separate kernel; pass its ``id`` as ``run_code(..., context=)``."""
        return await self._c._do(_api.create_code_context(self.id, language, cwd))

    async def code_contexts(self) -> List[CodeContext]:
        """The sandbox's contexts, the default one included."""
        return await self._c._do(_api.code_contexts(self.id))

    async def restart_code_context(self, context: str) -> None:
        """Replace a context's kernel with a new one (its variables are gone)."""
        await self._c._do(_api.restart_code_context(self.id, context))

    async def delete_code_context(self, context: str) -> None:
        """Stop a context's kernel and forget it."""
        await self._c._do(_api.delete_code_context(self.id, context))


    async def exec(self, argv: Union[Sequence[str], str], env: Any = None,
                   cwd: Optional[str] = None, user: Optional[str] = None,
                   stdin: Union[bytes, str, None] = None, timeout: Optional[Duration] = None,
                   step_id: Optional[str] = None, exclusive: bool = False) -> ExecResult:
        """Run a command to completion (see :meth:`corral.Sandbox.exec`)."""
        return await self.stream(argv, env, cwd, user, stdin, timeout, step_id,
                                 exclusive).collect()

    async def start(self, argv: Union[Sequence[str], str], env: Any = None,
                    cwd: Optional[str] = None, user: Optional[str] = None,
                    stdin: Union[bytes, str, None] = None, timeout: Optional[Duration] = None,
                    step_id: Optional[str] = None, open_stdin: bool = False, tty: bool = False,
                    rows: int = 0, cols: int = 0) -> Command:
        """Start a background command (see :meth:`corral.Sandbox.start`)."""
        body = _api.exec_body(argv, env, cwd, user, stdin, timeout, step_id, False,
                              open_stdin=open_stdin, tty=tty, rows=rows, cols=cols)
        return await self._c._do(_api.start_command(self.id, body))

    def attach(self, command_id: str, offset: int = 0, follow: bool = True) -> AsyncExecStream:
        """Stream a command's output from byte ``offset`` (see :meth:`corral.Sandbox.attach`)."""
        return AsyncExecStream(self._c._t, _api.attach(self.id, command_id, offset, follow),
                               OutputState(self.id, command_id, follow, offset), follow)

    async def write_stdin(self, command_id: str, data: Union[bytes, str],
                          eof: bool = False) -> None:
        """Write to a background command's stdin; ``eof`` closes it afterwards."""
        await self._c._do(_api.write_stdin(self.id, command_id, data, eof))

    async def signal(self, command_id: str, sig: Union[str, int] = "SIGTERM") -> None:
        """Send a signal to a command's process group."""
        await self._c._do(_api.signal(self.id, command_id, sig))

    async def resize(self, command_id: str, rows: int, cols: int) -> None:
        """Resize a TTY command's terminal."""
        await self._c._do(_api.resize(self.id, command_id, rows, cols))

    async def commands(self) -> List[Command]:
        """The sandbox's commands."""
        return await self._c._do(_api.commands(self.id))

    async def command(self, command_id: str) -> Command:
        """One command of the sandbox."""
        return await self._c._do(_api.command(self.id, command_id))

    async def read_file(self, path: str) -> bytes:
        """Return the content of the file at ``path``."""
        return await self._c._do(_api.read_file(self.id, path))

    async def write_file(self, path: str, data: Union[bytes, str], mode: Optional[int] = 0o644,
                         user: Optional[str] = None, parents: bool = False,
                         append: bool = False) -> FileInfo:
        """Create or replace the file at ``path`` (see :meth:`corral.Sandbox.write_file`)."""
        return await self._c._do(_api.write_file(self.id, path, data, mode, user, parents, append))

    async def stat(self, path: str) -> FileInfo:
        """Describe the file at ``path``."""
        return await self._c._do(_api.stat(self.id, path))

    async def list(self, path: str) -> List[FileInfo]:
        """Describe the entries of a directory."""
        return await self._c._do(_api.list_dir(self.id, path))

    async def exists(self, path: str) -> bool:
        """Whether something exists at ``path``."""
        try:
            await self.stat(path)
            return True
        except errors.NotFound:
            return False

    async def mkdir(self, path: str, mode: Optional[int] = None, parents: bool = False,
                    user: Optional[str] = None) -> FileInfo:
        """Create a directory."""
        return await self._c._do(_api.mkdir(self.id, path, mode, parents, user))

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a file or directory."""
        await self._c._do(_api.remove(self.id, path, recursive))

    async def move(self, source: str, destination: str) -> FileInfo:
        """Rename ``source`` to ``destination``."""
        return await self._c._do(_api.move(self.id, source, destination))

    async def upload(self, local_dir: str, remote_dir: str) -> None:
        """Copy the contents of a local directory into ``remote_dir``."""
        await self._c._do(_api.tar_in(self.id, remote_dir, _tario.pack_dir(local_dir)))

    async def upload_tar(self, remote_dir: str, data: bytes) -> None:
        """Extract a tar archive into ``remote_dir``."""
        await self._c._do(_api.tar_in(self.id, remote_dir, data))

    async def download_tar(self, remote_path: str) -> bytes:
        """A tar archive of the tree at ``remote_path``."""
        r = await self._c._t.open(_api.tar_out(self.id, remote_path))
        try:
            return await r.read_all()
        finally:
            r.release()

    async def download(self, remote_path: str, local_dir: str) -> None:
        """Copy the tree at ``remote_path`` into a local directory."""
        _tario.unpack(await self.download_tar(remote_path), local_dir)

    async def watch(self, path: str, recursive: bool = False) -> AsyncWatchStream:
        """Watch a directory; returns once the watch is in place (see :meth:`corral.Sandbox.watch`)."""
        ws = AsyncWatchStream(await self._c._t.open(_api.watch(self.id, path, recursive)))
        try:
            first = await ws.__anext__()
        except StopAsyncIteration:
            raise errors.StreamError("watch stream ended before it began") from None
        except BaseException:
            await ws.close()
            raise
        if first.type != "start":
            await ws.close()
            raise errors.StreamError("watch stream began with %r, want 'start'" % first.type)
        return ws

    async def screenshot(self) -> bytes:
        """A PNG of the sandbox's display (a vm's, or a desktop container's X display)."""
        return await self._c._do(_api.screenshot(self.id))

    async def input(self, *events: Mapping[str, Any]) -> Dict[str, Any]:
        """Send keyboard and mouse events to the sandbox's display."""
        return await self._c._do(_api.input_events(self.id, events))

    async def power(self, action: str, force: bool = False) -> SandboxInfo:
        """Power a vm sandbox's machine on, off or reboot it."""
        return await self._keep(_api.power(self.id, action, force))

    async def console(self, nbytes: int = 0) -> bytes:
        """The end of a vm sandbox's serial console output."""
        return await self._c._do(_api.console(self.id, nbytes))


class AsyncCorral:
    """The asyncio form of :class:`corral.Corral`: the same methods as coroutines.

    ``max_connections`` bounds the connections open at once (calls beyond it wait; an open
    output stream holds one). Use it with ``async with`` or ``await ac.close()``, within one
    event loop (its pool belongs to the loop it is first used in).
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 token_file: Optional[str] = None, timeout: float = 300.0,
                 retry: Optional[RetryPolicy] = None, max_connections: int = 128,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 user_agent: str = USER_AGENT) -> None:
        self.url, self.token = resolve(url, token, token_file)
        self._t = _Transport(self.url, self.token, timeout, retry or RetryPolicy(),
                             max_connections, ssl_context, user_agent)

    def __repr__(self) -> str:
        return "AsyncCorral(%r)" % self.url

    async def close(self) -> None:
        """Close the pooled connections."""
        self._t.close()

    async def __aenter__(self) -> "AsyncCorral":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _do(self, call: Call) -> Any:
        return await self._t.do(call)

    async def health(self) -> bool:
        """True when the server answers its health check."""
        await self._do(_api.health())
        return True

    async def server_info(self) -> ServerInfo:
        """What the server says about itself."""
        return await self._do(_api.info())

    async def metrics(self) -> str:
        """The server's Prometheus metrics (operator)."""
        return await self._do(_api.metrics())

    async def create(self, base: str = "", workspace: str = "",
                     toolkits: Optional[Sequence[str]] = None, env: Any = None,
                     ttl: Optional[Duration] = None, labels: Optional[Mapping[str, str]] = None,
                     memory: Union[str, int, None] = None, cpus: Optional[float] = None,
                     network: Any = None, tier: str = "", runtime: str = "",
                     environment: str = "", *, disk: Union[str, int, None] = None,
                     pids: Optional[int] = None, idle_ttl: Optional[Duration] = None,
                     hostname: str = "", from_snapshot: str = "",
                     auto_pause_after: Optional[Duration] = None,
                     pause_keeps_ttl: Optional[bool] = None, project: str = "",
                     node_selector: Optional[Mapping[str, str]] = None, fetch: str = "",
                     image: str = "", idempotency_key: Optional[str] = None,
                     volumes: Any = None) -> AsyncSandbox:
        """Create a sandbox (see :meth:`corral.Corral.create`)."""
        body = _api.create_body(base, workspace, toolkits, env, ttl, labels, memory, cpus, network,
                                tier, runtime, environment, disk, pids, idle_ttl, hostname,
                                from_snapshot, auto_pause_after, pause_keeps_ttl, project,
                                node_selector, fetch, image, volumes=volumes)
        return AsyncSandbox(self, await self._do(_api.create(body, idempotency_key)))

    async def get(self, id: str) -> AsyncSandbox:
        """Return the sandbox with this ID."""
        return AsyncSandbox(self, await self._do(_api.get(id)))

    async def list(self, labels: Optional[Mapping[str, str]] = None,
                   state: Union[str, Sequence[str], None] = None,
                   project: str = "") -> List[AsyncSandbox]:
        """The sandboxes matching ``labels``, ``state`` and ``project``."""
        return [AsyncSandbox(self, i)
                for i in await self._do(_api.list_sandboxes(labels, state, project))]

    async def create_fncall_env(self, name: str, base: str, workspace: str = "",
                                toolkits: Optional[Sequence[str]] = None, **kw: Any) -> FncallEnv:
        """Define an fncall environment (see :meth:`corral.Corral.create_fncall_env`)."""
        return await self._do(_api.create_fncall_env(
            _api.fncall_env_body(name, base, workspace, toolkits, **kw)))

    async def fncall_envs(self) -> List[FncallEnv]:
        """The fncall environments."""
        return await self._do(_api.fncall_envs())

    async def fncall_env(self, name: str) -> FncallEnv:
        """One fncall environment."""
        return await self._do(_api.fncall_env(name))

    async def delete_fncall_env(self, name: str) -> None:
        """Remove an fncall environment."""
        await self._do(_api.delete_fncall_env(name))

    async def call(self, name: str, argv: Union[Sequence[str], str, None] = None,
                   files: Optional[Mapping[str, Union[bytes, str]]] = None,
                   python: Optional[str] = None, **kw: Any) -> CallResult:
        """Run one stateless call (see :meth:`corral.Corral.call`)."""
        return await self._do(_api.call(name, _api.call_body(argv, files, python, **kw)))

    def call_stream(self, name: str, argv: Union[Sequence[str], str, None] = None,
                    files: Optional[Mapping[str, Union[bytes, str]]] = None,
                    python: Optional[str] = None, **kw: Any) -> AsyncExecStream:
        """:meth:`call` with the output streamed."""
        body = _api.call_body(argv, files, python, **kw)
        return AsyncExecStream(self._t, _api.call_stream(name, body), OutputState(), resume=False)

    async def import_layer(self, name: str, version: str, kind: str, source: Union[bytes, str], *,
                           image_config: Optional[Mapping[str, Any]] = None,
                           below: Sequence[str] = (), project: str = "",
                           private: bool = False) -> Layer:
        """Publish a layer from a tar archive or a local directory."""
        data = _tario.pack_dir(source) if isinstance(source, str) else source
        return await self._do(_api.import_layer(name, version, kind, data, image_config, below,
                                                project, private))

    async def layers(self, name: str = "") -> List[Layer]:
        """The published layers."""
        return await self._do(_api.layers(name))

    async def layer(self, name: str, version: str) -> Layer:
        """One published layer version."""
        return await self._do(_api.layer(name, version))

    async def layer_stats(self, name: str, version: str, node: str = "") -> Dict[str, Any]:
        """A layer version's storage and fetch statistics."""
        return await self._do(_api.layer_stats(name, version, node))

    async def set_layer_fill_rate(self, name: str, version: str, rate: int) -> Layer:
        """Set a layer's background fill rate."""
        return await self._do(_api.set_layer_fill_rate(name, version, rate))

    async def delete_layer(self, name: str, version: str) -> Layer:
        """Delete a published version."""
        return await self._do(_api.delete_layer(name, version))

    async def tag_layer(self, name: str, tag: str, version: str) -> Layer:
        """Point NAME:TAG at NAME:VERSION."""
        return await self._do(_api.tag_layer(name, tag, version))

    async def delete_tag(self, name: str, tag: str) -> None:
        """Remove a tag."""
        await self._do(_api.delete_tag(name, tag))

    async def gc_layers(self) -> Dict[str, Any]:
        """Remove unused layer contents (operator)."""
        return await self._do(_api.gc_layers())

    async def create_volume(self, name: str, size: Union[str, int], project: str = "") -> Volume:
        """Make a volume of ``size`` ("10G", bytes), charged to ``project``'s disk quota."""
        return await self._do(_api.create_volume(name, size, project))

    async def volumes(self, project: str = "") -> List[Volume]:
        """The volumes of ``project``'s subtree (default the token's project)."""
        return await self._do(_api.volumes(project))

    async def volume(self, name: str, project: str = "") -> Volume:
        """One volume, with the sandboxes it is mounted into."""
        return await self._do(_api.volume(name, project))

    async def delete_volume(self, name: str, project: str = "") -> None:
        """Delete a volume and its data (Conflict while a sandbox has it mounted)."""
        await self._do(_api.delete_volume(name, project))

    async def add_webhook(self, url: str, events: Optional[Sequence[str]] = None,
                  project: str = "") -> Dict[str, Any]:
        """Send ``project``'s events (``events`` types, default all) to ``url``, signed; the answer
        carries the webhook's ``secret``, shown only here."""
        return await self._do(_api.add_webhook(project, url, events))

    async def webhooks(self, project: str = "") -> List[Dict[str, Any]]:
        """The webhooks of ``project`` (default the token's), without their secrets."""
        return await self._do(_api.webhooks(project))

    async def remove_webhook(self, id: str) -> None:
        """Stop a webhook's deliveries and forget it."""
        await self._do(_api.remove_webhook(id))

    async def test_webhook(self, id: str) -> Dict[str, Any]:
        """Sends the webhook one event of type "test" now, whatever events it subscribes to, and
        returns the attempt (logged with its deliveries, never retried): event, attempt, status,
        result, error."""
        return await self._do(_api.test_webhook(id))

    async def webhook_deliveries(self, id: str) -> List[Dict[str, Any]]:
        """A webhook's recent deliveries, newest last: event, attempt, status, result, error."""
        return await self._do(_api.webhook_deliveries(id))

    async def report(self, project: str = "", since: Any = None) -> Dict[str, Any]:
        """The weekly instruments for ``project`` since ``since`` (a duration such as "7d" or a
        datetime; default the server's, 7 days): setup time, time and tokens per task, blocked
        egress per 1000 actions, TTL outcomes."""
        return await self._do(_api.report(project, since))

    async def save_environment(self, name: str, base: str, workspace: str = "",
                               toolkits: Sequence[str] = (),
                               microvm_template: bool = False, *, warm: int = 0,
                               runtime: str = "",
                               network: Optional[Dict[str, Any]] = None,
                               tier: str = "") -> Environment:
        """Save a named composition of layers (see :meth:`corral.Corral.save_environment`)."""
        return await self._do(_api.save_environment(name, base, workspace, toolkits,
                                                    microvm_template, warm, runtime, network,
                                                    tier))

    async def set_environment_warm(self, name: str, warm: int) -> Environment:
        """Change a saved environment's warm pool size (0 drains it)."""
        return await self._do(_api.update_environment(name, warm))

    async def build_environment(self, name: str, dockerfile: str, context_tar: bytes = b"",
                          build_args: Sequence[str] = (), network: Any = None,
                          runtime: str = "", project: str = "", no_cache: bool = False) -> Build:
        """Start building the environment ``name`` from a Dockerfile (``context_tar``: the build
        context as a tar); follow it with ``build(id)`` or ``build_logs(id, follow=True)``."""
        return await self._do(_api.start_build(name, dockerfile, context_tar, build_args, network,
                                          runtime, project, no_cache))

    async def build(self, build_id: str) -> Build:
        """A build job."""
        return await self._do(_api.build(build_id))

    async def cancel_build(self, build_id: str) -> Build:
        """End a running build (it fails, cancelled; nothing is saved)."""
        return await self._do(_api.cancel_build(build_id))

    async def builds(self) -> List[Build]:
        """The build jobs the server remembers."""
        return await self._do(_api.builds())

    async def build_logs(self, build_id: str, follow: bool = False) -> List[Dict[str, Any]]:
        """A build's events (step, log, end); with follow, read until the build ends."""
        return await self._do(_api.build_logs(build_id, follow))

    async def environments(self) -> List[Environment]:
        """The saved environments."""
        return await self._do(_api.environments())

    async def environment(self, name: str) -> Environment:
        """One saved environment."""
        return await self._do(_api.environment(name))

    async def delete_environment(self, name: str) -> None:
        """Remove a saved environment."""
        await self._do(_api.delete_environment(name))

    async def network_services(self) -> List[NetworkService]:
        """The operator's service catalog."""
        return await self._do(_api.network_services())

    async def set_network_services(self, catalog: Any) -> List[NetworkService]:
        """Replace the service catalog (operator)."""
        return await self._do(_api.set_network_services(catalog))

    async def nodes(self) -> List[Node]:
        """A cluster's nodes."""
        return await self._do(_api.nodes())

    async def node_action(self, name: str, action: str) -> Node:
        """Cordon, drain or uncordon a node."""
        return await self._do(_api.node_action(name, action))

    async def whoami(self) -> Whoami:
        """The caller's principal, token and permissions."""
        return await self._do(_api.whoami())

    async def create_project(self, path: str) -> Project:
        """Create a project."""
        return await self._do(_api.create_project(path))

    async def projects(self, under: str = "") -> List[Project]:
        """The projects under ``under``."""
        return await self._do(_api.projects(under))

    async def project(self, path: str) -> Project:
        """One project."""
        return await self._do(_api.project(path))

    async def delete_project(self, path: str, force: bool = False) -> None:
        """Delete a project and its subtree."""
        await self._do(_api.delete_project(path, force))

    async def move_project(self, source: str, destination: str, force: bool = False) -> Project:
        """Move a project subtree."""
        return await self._do(_api.move_project(source, destination, force))

    async def quota(self, project: str) -> ProjectQuota:
        """A project's limits and usage."""
        return await self._do(_api.quota(project))

    async def set_quota(self, project: str, **limits: Any) -> ProjectQuota:
        """Replace a project's limits (keywords as :meth:`corral.Corral.set_quota`)."""
        return await self._do(_api.set_quota(project, limits))

    async def placement(self, project: str) -> Dict[str, Any]:
        """A project's placement."""
        return await self._do(_api.placement(project))

    async def set_placement(self, project: str, pin: Sequence[Mapping[str, str]] = (),
                            avoid: Sequence[Mapping[str, str]] = ()) -> Dict[str, Any]:
        """Set a project's placement (operator)."""
        return await self._do(_api.set_placement(project, pin, avoid))

    async def create_principal(self, name: str, kind: str = "", project: str = "") -> Principal:
        """Create a principal."""
        return await self._do(_api.create_principal(name, kind, project))

    async def principals(self, project: str = "") -> List[Principal]:
        """The principals of a subtree."""
        return await self._do(_api.principals(project))

    async def grant(self, project: str, principal: str, role: str) -> Grant:
        """Give a principal a role on a project."""
        return await self._do(_api.grant(project, principal, role))

    async def revoke(self, project: str, principal: str, role: str = "") -> None:
        """Remove a grant."""
        await self._do(_api.revoke(project, principal, role))

    async def grants(self, project: str = "") -> List[Grant]:
        """The grants of a subtree."""
        return await self._do(_api.grants(project))

    async def create_token(self, project: str, role: str = "", *,
                           permissions: Sequence[str] = (), ttl: Optional[Duration] = None,
                           principal: str = "", kind: str = "", name: str = "") -> Token:
        """Mint a token (see :meth:`corral.Corral.create_token`)."""
        return await self._do(_api.create_token(project, role, permissions, ttl, principal, kind,
                                                name))

    async def tokens(self) -> List[Token]:
        """The tokens the caller may manage."""
        return await self._do(_api.tokens())

    async def revoke_token(self, id: str) -> Token:
        """Revoke a token."""
        return await self._do(_api.revoke_token(id))

    async def events(self, project: str = "", since: Any = None,
                     types: Optional[Sequence[str]] = None, follow: bool = False) -> AsyncEventStream:
        """The event stream (see :meth:`corral.Corral.events`)."""
        return AsyncEventStream(await self._t.open(_api.events(project, since, types, follow)))

    async def audit(self, project: str = "", action: str = "", before: int = 0,
                    limit: int = 0) -> List[AuditEntry]:
        """Audit entries, newest first."""
        return await self._do(_api.audit(project, action, before, limit))
