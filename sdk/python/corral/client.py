"""The synchronous client: :class:`Corral` and :class:`Sandbox`.

It sends the requests :mod:`corral._api` describes over :mod:`http.client` connections kept in a
small thread-safe pool; retries, errors and streams follow :mod:`corral._core`.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _api, _tario, errors
from ._core import (Call, Duration, Endpoint, NDJSONSplitter, OutputState, Request, RetryPolicy,
                    USER_AGENT, decode_error, event_line, resolve, watch_line)
from .models import (AuditEntry, BlockedAttempt, Build, CallResult, CodeContext, Command, Environment, Event,
                     Execution, LifecycleEvent, MetricSample,
                     ExecResult, Exit, FileInfo, FncallEnv, Grant, Layer, NetworkService, Node,
                     Principal, Project, ProjectQuota, SandboxInfo, ServerInfo, Token,
                     TrajectoryEntry, Volume, WatchEvent, Whoami)

__all__ = ["Corral", "Sandbox", "ExecStream", "WatchStream"]

_CONN_ERRORS = (OSError, http.client.HTTPException)


class _Response:
    """An answer whose body is still to be read (streams)."""

    def __init__(self, transport: "_Transport", conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        self._t, self._conn, self._resp = transport, conn, resp
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}
        self._closed = False

    def read1(self) -> bytes:
        """Return the next bytes of the body; b"" at its end."""
        b = self._resp.read1(64 << 10)
        if not b:
            self.close(clean=True)
        return b

    def read_all(self) -> bytes:
        """Read the rest of the body."""
        b = self._resp.read()
        self.close(clean=True)
        return b

    def close(self, clean: bool = False) -> None:
        """Release the connection: back to the pool after a complete body, else closed."""
        if self._closed:
            return
        self._closed = True
        if clean and not self._resp.isclosed():
            # The server ends a stream right after its last event: read that end, so the
            # connection can carry the next request instead of being dialled again.
            try:
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(5)
                for _ in range(16):
                    if not self._resp.read(64 << 10):
                        break
            except _CONN_ERRORS:
                pass
        if clean and self._resp.isclosed() and not self._resp.will_close:
            self._t._put(self._conn)
        else:
            self._resp.close()
            self._conn.close()


class _Transport:
    """Sends Requests with retries over a pool of keep-alive connections; thread-safe."""

    def __init__(self, url: str, token: str, timeout: float, retry: RetryPolicy,
                 max_idle: int, ssl_context: Optional[ssl.SSLContext], user_agent: str) -> None:
        self.ep = Endpoint.parse(url)
        self.token, self.timeout, self.retry = token, timeout, retry
        self.max_idle, self.user_agent = max_idle, user_agent
        self.ssl_context = ssl_context
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _get(self) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                conn = self._idle.pop()
                if conn.sock is not None:
                    conn.sock.settimeout(self.timeout)
                return conn, True
        if self.ep.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.ep.host, self.ep.port, timeout=self.timeout,
                context=self.ssl_context or ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.ep.host, self.ep.port, timeout=self.timeout)
        return conn, False

    def _put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def open(self, req: Request) -> _Response:
        """Send req and return its answer once the status is below 400, retrying as the policy
        allows; raise the APIError (or TransportError) otherwise."""
        attempt = 0
        while True:
            attempt += 1
            conn, reused = self._get()
            sent = False
            try:
                target = req.target(self.ep)
                headers, body = req.encode(self.ep, self.token, self.user_agent)
                conn.putrequest(req.method, target, skip_host=True, skip_accept_encoding=True)
                for k, v in headers.items():
                    conn.putheader(k, v)
                conn.endheaders(body)
                sent = True
                resp = conn.getresponse()
            except _CONN_ERRORS as e:
                conn.close()
                # A reused connection the server had closed never carried the request.
                stale = reused and isinstance(e, (http.client.RemoteDisconnected,
                                                  ConnectionResetError, BrokenPipeError))
                if stale and attempt <= self.retry.retries + 1:
                    continue
                if self.retry.should_retry_error(req, attempt, sent):
                    time.sleep(self.retry.delay(attempt))
                    continue
                raise errors.TransportError("%s %s: %s" % (req.method, req.path, e)) from e
            r = _Response(self, conn, resp)
            if r.status < 400:
                if req.stream and conn.sock is not None:
                    # Output can pause for as long as the command is quiet.
                    conn.sock.settimeout(None)
                return r
            try:
                data = r._resp.read(64 << 10)
            except _CONN_ERRORS:
                data = b""
            r.close(clean=False)
            err = decode_error(r.status, r.headers, data)
            if self.retry.should_retry_status(req, r.status, attempt):
                time.sleep(self.retry.delay(attempt, err.retry_after))
                continue
            raise err

    def do(self, call: Call) -> Any:
        """Send a call and return its parsed answer (the body read whole)."""
        attempt = 0
        while True:
            attempt += 1
            r = self.open(call.request)
            try:
                body = r.read_all()
            except _CONN_ERRORS as e:
                r.close()
                if self.retry.should_retry_error(call.request, attempt, True):
                    time.sleep(self.retry.delay(attempt))
                    continue
                raise errors.TransportError("%s %s: read answer: %s"
                                            % (call.request.method, call.request.path, e)) from e
            return call.parse(r.status, r.headers, body)


class ExecStream:
    """A command's output as an iterator of :class:`~corral.models.Event`.

    Iterating yields "start" (exec only), "stdout"/"stderr" data, "truncated" and finally
    "exit"; after iteration ``exit`` holds how the command ended. When the connection breaks
    mid-stream (the server restarted, a proxy cut it), the stream re-attaches to the command
    from the byte it had reached, up to the retry policy's limit, so no output is lost or
    repeated. Closing the stream (or leaving a ``with`` block) does not stop the command.
    """

    def __init__(self, transport: _Transport, req: Request, state: OutputState,
                 resume: bool = True) -> None:
        self._t, self._req, self.state, self._resume = transport, req, state, resume
        self._resp: Optional[_Response] = None
        self._split = NDJSONSplitter()
        self._pending: List[Any] = []
        self._closed = False
        self._ended = False

    def _open(self) -> None:
        self._resp = self._t.open(self._req)
        self._split = NDJSONSplitter()

    def start(self) -> "ExecStream":
        """Send the request now (iteration does it otherwise) and read up to the command ID."""
        if self._resp is None and not self._ended:
            self._open()
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

    def __iter__(self) -> "ExecStream":
        return self

    def __next__(self) -> Event:
        while True:
            if self._closed:
                raise StopIteration
            if self._pending:
                ev = self.state.accept(self._pending.pop(0))
                if ev is not None:
                    return ev
                continue
            if self._ended or self.state.done:
                self.close(clean=True)
                raise StopIteration
            if self._resp is None:
                self._open()
            assert self._resp is not None
            try:
                data = self._resp.read1()
            except _CONN_ERRORS as e:
                self._broken(e)
                continue
            if data:
                self._pending.extend(self._split.feed(data))
                continue
            self._pending.extend(self._split.finish())
            if self._pending:
                continue
            if self.state.want_exit and not self.state.done:
                self._broken(None)
                continue
            self._ended = True

    def _broken(self, cause: Optional[BaseException]) -> None:
        """The stream broke before its end: re-attach from the offset reached, or raise."""
        if self._resp is not None:
            self._resp.close()
            self._resp = None
        self._pending.clear()
        if self._resume and self.state.can_resume():
            self._req = self.state.resume_request()
        elif not (self._resume and self._req.idempotent and not self.state.done):
            self._closed = True
            if cause is None:
                self.state.ended()
            raise errors.StreamError("output stream broke: %s" % (cause,)) from cause
        # Else the command's ID was not read yet, but the request is safe to send again (an
        # exec with a step_id attaches to its command); repeated output is dropped by offset.
        attempt = 0
        while True:
            attempt += 1
            try:
                self._open()
                return
            except errors.TransportError:
                if attempt > self._t.retry.retries:
                    raise
                time.sleep(self._t.retry.delay(attempt))

    def collect(self) -> ExecResult:
        """Read the stream to its end and return the collected result."""
        out, err = bytearray(), bytearray()
        try:
            for ev in self:
                if ev.type == "stdout":
                    out += ev.data
                elif ev.type == "stderr":
                    err += ev.data
        finally:
            self.close()
        ex = self.state.exit or Exit()
        return ExecResult(ex.code, bytes(out), bytes(err), ex, self.state.command_id,
                          self.state.replayed, self.state.dropped)

    def close(self, clean: bool = False) -> None:
        """End the stream; the command keeps running."""
        self._closed = True
        if self._resp is not None:
            self._resp.close(clean=clean)
            self._resp = None

    def __del__(self) -> None:
        # A stream abandoned without close must not keep its connection open.
        if getattr(self, "_resp", None) is not None:
            self.close()

    def __enter__(self) -> "ExecStream":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class WatchStream:
    """An open watch of a directory tree: iterate it for :class:`~corral.models.WatchEvent`.

    It ends when the watched directory goes away (its own remove or rename is the last event) or
    when closed; a watch the server ended raises the APIError it sent.
    """

    def __init__(self, resp: _Response) -> None:
        self._resp = resp
        self._split = NDJSONSplitter()
        self._pending: List[Any] = []
        self._gone = False
        self._closed = False

    def __iter__(self) -> "WatchStream":
        return self

    def __next__(self) -> WatchEvent:
        while True:
            if self._closed:
                raise StopIteration
            if self._pending:
                ev = watch_line(self._pending.pop(0), self._resp.status)
                if not ev.name and ev.type in ("remove", "rename"):
                    self._gone = True
                return ev
            try:
                data = self._resp.read1()
            except _CONN_ERRORS as e:
                if self._closed:
                    raise StopIteration
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
            raise StopIteration

    def close(self) -> None:
        """End the watch."""
        self._closed = True
        self._resp.close()

    def __enter__(self) -> "WatchStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EventStream:
    """The event stream (:meth:`Corral.events`): iterate it for
    :class:`~corral.models.LifecycleEvent`. Without follow it ends after the past events; with
    it, it runs until closed. A follower the server dropped for falling behind raises
    :class:`~corral.errors.QuotaExceeded` (code exhausted; reconnect with ``since`` = the last event's ``at``)."""

    def __init__(self, resp: _Response) -> None:
        self._resp = resp
        self._split = NDJSONSplitter()
        self._pending: List[Any] = []
        self._closed = False

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> LifecycleEvent:
        while True:
            if self._closed:
                raise StopIteration
            if self._pending:
                return event_line(self._pending.pop(0), self._resp.status)
            try:
                data = self._resp.read1()
            except _CONN_ERRORS as e:
                if self._closed:
                    raise StopIteration
                raise errors.StreamError("read event stream: %s" % e) from e
            if data:
                self._pending.extend(self._split.feed(data))
                continue
            self._pending.extend(self._split.finish())
            if self._pending:
                continue
            self._closed = True
            raise StopIteration

    def close(self) -> None:
        """End the stream."""
        self._closed = True
        self._resp.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox:
    """A handle on one sandbox: run commands in it, move files, pause it, delete it.

    ``record`` is the :class:`~corral.models.SandboxInfo` the last call that returned one gave
    (``info()`` fetches a fresh one). Used as a context manager, the sandbox is deleted when the
    block ends.
    """

    def __init__(self, client: "Corral", record: SandboxInfo) -> None:
        self._c = client
        self.id: str = record.id
        self.record: SandboxInfo = record

    def __repr__(self) -> str:
        return "Sandbox(%r, state=%r)" % (self.id, self.record.state)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.delete()
        except errors.NotFound:
            pass

    def _keep(self, info: SandboxInfo) -> SandboxInfo:
        self.record = info
        return info

    # -- lifecycle --

    def info(self, wait_running: bool = False) -> SandboxInfo:
        """Return the sandbox's current state; ``wait_running`` resumes a paused one first."""
        return self._keep(self._c._do(_api.get(self.id, wait_running)))

    def delete(self) -> SandboxInfo:
        """Stop the sandbox, killing its commands, and remove it (idempotent)."""
        return self._keep(self._c._do(_api.delete(self.id)))

    def pause(self) -> SandboxInfo:
        """Freeze the sandbox and give its memory back to the host; any later use resumes it."""
        return self._keep(self._c._do(_api.pause(self.id)))

    def resume(self) -> SandboxInfo:
        """Bring a paused sandbox back to running."""
        return self._keep(self._c._do(_api.resume(self.id)))

    def set_ttl(self, ttl: Duration) -> SandboxInfo:
        """Make the sandbox expire ``ttl`` from now ("10m", seconds or a timedelta)."""
        return self._keep(self._c._do(_api.set_ttl(self.id, ttl)))

    def fork(self, count: int = 1, labels: Optional[Mapping[str, str]] = None,
             disk_only: bool = False, ttl: Optional[Duration] = None) -> List["Sandbox"]:
        """Make ``count`` sandboxes (1 to 64) that go on from this one's state now: on gVisor its
        memory, processes and disk; with ``disk_only`` (the only fork of a runc sandbox) its disk
        alone. Each copy then diverges; this one runs on. ``labels`` are set on every copy over
        this one's; ``ttl`` is the copies' lifetime (default: they expire with this one). All or
        nothing: a quota that admits fewer copies makes none."""
        infos = self._c._do(_api.fork(self.id, count, labels, disk_only, ttl))
        return [Sandbox(self._c, i) for i in infos]

    def snapshot(self, name: str, version: Optional[str] = None,
                 exclude: Optional[Sequence[str]] = None) -> Layer:
        """Publish the sandbox's changes as snapshot layer ``name`` ("NAME" or "NAME:VERSION";
        the version defaults to the current UTC time); ``create(from_snapshot=layer.ref)``
        starts sandboxes from it. Changes under ``exclude`` paths are left out."""
        return self._c._do(_api.snapshot(self.id, name, version, exclude))

    def network(self, allow: Optional[Sequence[str]] = None, deny: Optional[Sequence[str]] = None,
                mode: Optional[str] = None) -> SandboxInfo:
        """Replace the sandbox's egress policy: ``mode`` "none", "allowlist" (the default with
        ``allow`` rules) or "open", minus the ``deny`` rules; open connections follow at once."""
        pol: Dict[str, Any] = {}
        if mode:
            pol["mode"] = mode
        if allow:
            pol["allow"] = list(allow)
        if deny:
            pol["deny"] = list(deny)
        if not pol:
            pol["mode"] = "none"
        return self._keep(self._c._do(_api.set_network(self.id, pol)))

    def blocked_attempts(self) -> List[BlockedAttempt]:
        """The sandbox's latest blocked egress attempts, oldest first."""
        return self._c._do(_api.blocked(self.id))

    def metrics(self, since: Any = None) -> List[MetricSample]:
        """The sandbox's resource samples, oldest first (``since``: a datetime, or a duration back
        from now such as "10m" or seconds). Reading them is not activity."""
        return self._c._do(_api.sandbox_metrics(self.id, since))

    def fetch_stats(self) -> Dict[str, Any]:
        """How the sandbox's layer data reaches its node (lazy fetching counters)."""
        return self._c._do(_api.fetch_stats(self.id))

    def trajectory(self, after: int = 0) -> List[TrajectoryEntry]:
        """The sandbox's trajectory: every exec and file-changing call, in order (those with a
        sequence number above ``after``)."""
        return self._c._do(_api.trajectory(self.id, after))

    # -- commands --

    def stream(self, argv: Union[Sequence[str], str], env: Any = None, cwd: Optional[str] = None,
               user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
               timeout: Optional[Duration] = None, step_id: Optional[str] = None,
               exclusive: bool = False, resume: bool = True) -> ExecStream:
        """Run a command and return its output as an :class:`ExecStream` of events.

        ``argv`` is a list, or a string run with ``/bin/sh -c``. ``env`` (a dict or KEY=VALUE
        list) is added to the sandbox's; ``stdin`` is fed then closed; ``timeout`` kills the
        command. A ``step_id`` names the call in the trajectory: calling again with a finished
        step's ID replays its result without running anything, with a running one attaches to
        it. ``exclusive`` runs the command alone (no other command of the sandbox runs
        meanwhile). A stream that breaks re-attaches from its offset unless ``resume`` is False.
        A command the server cannot start raises InvalidRequest (``field`` argv, cwd or user).
        """
        body = _api.exec_body(argv, env, cwd, user, stdin, timeout, step_id, exclusive)
        return ExecStream(self._c._t, _api.exec_stream(self.id, body), OutputState(self.id),
                          resume)

    # -- code (a code-interpreter sandbox: corral env install code-interpreter) --

    def run_code(self, code: str, context: Optional[str] = None, language: Optional[str] = None,
                 timeout: Optional[Duration] = None, env: Optional[Dict[str, str]] = None) -> Execution:
        """Run ``code`` in the sandbox's stateful kernel (variables stay between runs of one
        context) and return its :class:`~corral.models.Execution`: ``stdout``, ``stderr``,
        ``results`` (``text``, ``png``, ``html``...; ``.text`` is the last expression's value),
        ``error`` (the exception, by ``name``). ``timeout`` (default 5m) interrupts the kernel,
        not the sandbox. A sandbox without the code server raises :class:`Conflict`."""
        return self._c._do(_api.run_code(self.id, code, language, context, timeout, env))

    def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None) -> CodeContext:
        """Start a separate kernel; pass its ``id`` as ``run_code(..., context=)``."""
        return self._c._do(_api.create_code_context(self.id, language, cwd))

    def code_contexts(self) -> List[CodeContext]:
        """The sandbox's contexts, the default one included."""
        return self._c._do(_api.code_contexts(self.id))

    def restart_code_context(self, context: str) -> None:
        """Replace a context's kernel with a new one (its variables are gone)."""
        self._c._do(_api.restart_code_context(self.id, context))

    def delete_code_context(self, context: str) -> None:
        """Stop a context's kernel and forget it."""
        self._c._do(_api.delete_code_context(self.id, context))


    def exec(self, argv: Union[Sequence[str], str], env: Any = None, cwd: Optional[str] = None,
             user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
             timeout: Optional[Duration] = None, step_id: Optional[str] = None,
             exclusive: bool = False) -> ExecResult:
        """Run a command to completion and return its :class:`~corral.models.ExecResult`
        (``exit_code``, ``stdout``, ``stderr``, ``stdout_bytes``, ``stderr_bytes``).

        The arguments are those of :meth:`stream`. A non-zero exit is not an error (use
        ``.check()``). With a ``step_id`` the call is safe to repeat after any failure: a
        restarted worker gets the recorded result of a finished step without running it again.
        """
        return self.stream(argv, env, cwd, user, stdin, timeout, step_id, exclusive).collect()

    def start(self, argv: Union[Sequence[str], str], env: Any = None, cwd: Optional[str] = None,
              user: Optional[str] = None, stdin: Union[bytes, str, None] = None,
              timeout: Optional[Duration] = None, step_id: Optional[str] = None,
              open_stdin: bool = False, tty: bool = False, rows: int = 0,
              cols: int = 0) -> Command:
        """Start a command in the background and return it at once; read its output with
        :meth:`attach`, feed it with :meth:`write_stdin` (``open_stdin=True`` keeps its stdin
        open for that), stop it with :meth:`signal`."""
        body = _api.exec_body(argv, env, cwd, user, stdin, timeout, step_id, False,
                              open_stdin=open_stdin, tty=tty, rows=rows, cols=cols)
        return self._c._do(_api.start_command(self.id, body))

    def attach(self, command_id: str, offset: int = 0, follow: bool = True) -> ExecStream:
        """Stream a command's output from byte ``offset`` (stdout and stderr counted together).
        With ``follow`` the stream lasts until the command exits; without, it ends at the output
        produced so far."""
        return ExecStream(self._c._t, _api.attach(self.id, command_id, offset, follow),
                          OutputState(self.id, command_id, follow, offset), follow)

    def write_stdin(self, command_id: str, data: Union[bytes, str], eof: bool = False) -> None:
        """Write to a background command's stdin; ``eof`` closes it afterwards."""
        self._c._do(_api.write_stdin(self.id, command_id, data, eof))

    def signal(self, command_id: str, sig: Union[str, int] = "SIGTERM") -> None:
        """Send a signal ("SIGTERM", "KILL", 9) to a command's process group."""
        self._c._do(_api.signal(self.id, command_id, sig))

    def resize(self, command_id: str, rows: int, cols: int) -> None:
        """Resize a TTY command's terminal."""
        self._c._do(_api.resize(self.id, command_id, rows, cols))

    def commands(self) -> List[Command]:
        """The sandbox's commands, running and recently exited."""
        return self._c._do(_api.commands(self.id))

    def command(self, command_id: str) -> Command:
        """One command of the sandbox."""
        return self._c._do(_api.command(self.id, command_id))

    # -- files --

    def read_file(self, path: str) -> bytes:
        """Return the content of the regular file at ``path``."""
        return self._c._do(_api.read_file(self.id, path))

    def write_file(self, path: str, data: Union[bytes, str], mode: Optional[int] = 0o644,
                   user: Optional[str] = None, parents: bool = False,
                   append: bool = False) -> FileInfo:
        """Create or replace the file at ``path`` with ``data`` (a str is written as UTF-8);
        ``parents`` creates missing directories, ``append`` adds to the end instead."""
        return self._c._do(_api.write_file(self.id, path, data, mode, user, parents, append))

    def stat(self, path: str) -> FileInfo:
        """Describe the file at ``path``."""
        return self._c._do(_api.stat(self.id, path))

    def list(self, path: str) -> List[FileInfo]:
        """Describe the entries of the directory at ``path``."""
        return self._c._do(_api.list_dir(self.id, path))

    def exists(self, path: str) -> bool:
        """Whether something exists at ``path``."""
        try:
            self.stat(path)
            return True
        except errors.NotFound:
            return False

    def mkdir(self, path: str, mode: Optional[int] = None, parents: bool = False,
              user: Optional[str] = None) -> FileInfo:
        """Create a directory (``parents``: with its missing parents, and no error if it exists)."""
        return self._c._do(_api.mkdir(self.id, path, mode, parents, user))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a file or empty directory (``recursive``: a directory with its contents)."""
        self._c._do(_api.remove(self.id, path, recursive))

    def move(self, source: str, destination: str) -> FileInfo:
        """Rename ``source`` to ``destination`` (within one filesystem, as rename(2))."""
        return self._c._do(_api.move(self.id, source, destination))

    def upload(self, local_dir: str, remote_dir: str) -> None:
        """Copy the contents of the local directory ``local_dir`` into ``remote_dir``."""
        self._c._do(_api.tar_in(self.id, remote_dir, _tario.pack_dir(local_dir)))

    def upload_tar(self, remote_dir: str, data: bytes) -> None:
        """Extract the tar archive ``data`` into ``remote_dir``."""
        self._c._do(_api.tar_in(self.id, remote_dir, data))

    def download_tar(self, remote_path: str) -> bytes:
        """Return a tar archive of the tree at ``remote_path``."""
        return self._c._t.open(_api.tar_out(self.id, remote_path)).read_all()

    def download(self, remote_path: str, local_dir: str) -> None:
        """Copy the tree at ``remote_path`` into the local directory ``local_dir``."""
        _tario.unpack(self.download_tar(remote_path), local_dir)

    def watch(self, path: str, recursive: bool = False) -> WatchStream:
        """Watch the directory ``path`` (``recursive``: and every directory below it); returns
        once the watch is in place, so every later change is reported. Close it when done."""
        resp = self._c._t.open(_api.watch(self.id, path, recursive))
        ws = WatchStream(resp)
        try:
            first = next(ws)
        except StopIteration:
            raise errors.StreamError("watch stream ended before it began") from None
        except BaseException:
            ws.close()
            raise
        if first.type != "start":
            ws.close()
            raise errors.StreamError("watch stream began with %r, want 'start'" % first.type)
        return ws

    # -- vm sandboxes --

    def screenshot(self) -> bytes:
        """A PNG of the sandbox's display (a vm's, or a desktop container's X display)."""
        return self._c._do(_api.screenshot(self.id))

    def input(self, *events: Mapping[str, Any]) -> Dict[str, Any]:
        """Send keyboard and mouse events to the sandbox's display ({"type": "text", "text": "hi"}, ...)."""
        return self._c._do(_api.input_events(self.id, events))

    def power(self, action: str, force: bool = False) -> SandboxInfo:
        """Turn a vm sandbox's machine "on" or "off" (``force``: pull the plug), or "reboot" it."""
        return self._keep(self._c._do(_api.power(self.id, action, force)))

    def console(self, nbytes: int = 0) -> bytes:
        """The end of a vm sandbox's serial console output (at most ``nbytes``; 0: 1 MiB)."""
        return self._c._do(_api.console(self.id, nbytes))


class Corral:
    """A client of one Corral server; safe to share between threads.

    ``url`` defaults to $CORRAL_URL, then http://127.0.0.1:7070; ``token`` to the content of
    ``token_file``, then $CORRAL_TOKEN, then /var/lib/corral/admin.token when readable (as the
    CLI does). ``timeout`` bounds connecting and each read of ordinary calls (output streams
    wait as long as a command is quiet). ``retry`` sets the retry policy; ``max_idle`` how many
    idle connections are kept.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 token_file: Optional[str] = None, timeout: float = 300.0,
                 retry: Optional[RetryPolicy] = None, max_idle: int = 16,
                 ssl_context: Optional[ssl.SSLContext] = None,
                 user_agent: str = USER_AGENT) -> None:
        self.url, self.token = resolve(url, token, token_file)
        self._t = _Transport(self.url, self.token, timeout, retry or RetryPolicy(), max_idle,
                             ssl_context, user_agent)

    def __repr__(self) -> str:
        return "Corral(%r)" % self.url

    def close(self) -> None:
        """Close the idle connections (the client stays usable)."""
        self._t.close()

    def __enter__(self) -> "Corral":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _do(self, call: Call) -> Any:
        return self._t.do(call)

    # -- server --

    def health(self) -> bool:
        """True when the server answers its health check."""
        self._do(_api.health())
        return True

    def server_info(self) -> ServerInfo:
        """What the server says about itself: version, node, runtimes, tiers."""
        return self._do(_api.info())

    def metrics(self) -> str:
        """The server's Prometheus metrics (operator)."""
        return self._do(_api.metrics())

    # -- sandboxes --

    def create(self, base: str = "", workspace: str = "", toolkits: Optional[Sequence[str]] = None,
               env: Any = None, ttl: Optional[Duration] = None,
               labels: Optional[Mapping[str, str]] = None, memory: Union[str, int, None] = None,
               cpus: Optional[float] = None, network: Any = None, tier: str = "",
               runtime: str = "", environment: str = "", *, disk: Union[str, int, None] = None,
               pids: Optional[int] = None, idle_ttl: Optional[Duration] = None,
               hostname: str = "", from_snapshot: str = "",
               auto_pause_after: Optional[Duration] = None,
               pause_keeps_ttl: Optional[bool] = None, project: str = "",
               node_selector: Optional[Mapping[str, str]] = None, fetch: str = "",
               image: str = "", idempotency_key: Optional[str] = None,
               volumes: Any = None) -> Sandbox:
        """Create a sandbox and return it once it runs.

        ``base``, ``workspace`` and ``toolkits`` are layers ("NAME:VERSION" or tags), or give a
        saved ``environment`` or ``from_snapshot`` instead. ``env`` is a dict or KEY=VALUE list;
        ``ttl`` the hard lifetime ("10m", seconds, timedelta); ``memory`` and ``disk`` sizes
        ("512M", bytes); ``network`` an egress policy (a mode "open"/"none", a list of allow
        rules, a dict or NetworkPolicy); ``tier`` container, microvm or vm; ``runtime`` runc or
        gvisor; ``volumes`` volumes of the sandbox's project to mount ("NAME:/path" or
        "NAME:/path:ro", tuples, dicts or VolumeMount). Every create carries an idempotency key (``idempotency_key``, else a fresh one),
        so a create retried after a lost answer never makes a second sandbox. A quota refusal
        raises QuotaExceeded.
        """
        body = _api.create_body(base, workspace, toolkits, env, ttl, labels, memory, cpus, network,
                                tier, runtime, environment, disk, pids, idle_ttl, hostname,
                                from_snapshot, auto_pause_after, pause_keeps_ttl, project,
                                node_selector, fetch, image, volumes=volumes)
        return Sandbox(self, self._do(_api.create(body, idempotency_key)))

    def get(self, id: str) -> Sandbox:
        """Return the sandbox with this ID (NotFound if there is none)."""
        return Sandbox(self, self._do(_api.get(id)))

    def list(self, labels: Optional[Mapping[str, str]] = None,
             state: Union[str, Sequence[str], None] = None, project: str = "") -> List[Sandbox]:
        """The sandboxes carrying all these ``labels``, in this ``state`` (or any of these
        states), in ``project``'s subtree, oldest first."""
        return [Sandbox(self, i) for i in self._do(_api.list_sandboxes(labels, state, project))]

    # -- fncall --

    def create_fncall_env(self, name: str, base: str, workspace: str = "",
                          toolkits: Optional[Sequence[str]] = None, **kw: Any) -> FncallEnv:
        """Define an fncall environment and start its pool of warm containers. Keywords:
        project, memory, cpus, pool_min, pool_max, timeout, queue_depth, queue_wait, network,
        warm_imports (modules a warm Python interpreter imports ahead), interpreter,
        files_bytes."""
        return self._do(_api.create_fncall_env(
            _api.fncall_env_body(name, base, workspace, toolkits, **kw)))

    def fncall_envs(self) -> List[FncallEnv]:
        """The fncall environments with their pools' state."""
        return self._do(_api.fncall_envs())

    def fncall_env(self, name: str) -> FncallEnv:
        """One fncall environment with its pool's state."""
        return self._do(_api.fncall_env(name))

    def delete_fncall_env(self, name: str) -> None:
        """Remove an fncall environment and destroy its pool."""
        self._do(_api.delete_fncall_env(name))

    def call(self, name: str, argv: Union[Sequence[str], str, None] = None,
             files: Optional[Mapping[str, Union[bytes, str]]] = None,
             python: Optional[str] = None, *, script: Optional[str] = None,
             stdin: Union[bytes, str, None] = None, env: Any = None, cwd: Optional[str] = None,
             timeout: Optional[Duration] = None, outputs: Optional[Sequence[str]] = None,
             keep: Optional[Sequence[str]] = None, file_refs: Optional[Mapping[str, str]] = None,
             output_limit: Union[str, int, None] = None) -> CallResult:
        """Run one stateless call in the fncall environment ``name``: ``argv``, a shell
        ``script``, or ``python`` code (run by a warm interpreter; ``argv`` becomes sys.argv[1:]).
        ``files`` (path -> content) are written first; ``outputs`` are files returned in
        ``result.outputs``. A call that cannot get a container in time raises QuotaExceeded."""
        body = _api.call_body(argv, files, python, script, stdin, env, cwd, timeout, outputs, keep,
                              file_refs, output_limit)
        return self._do(_api.call(name, body))

    def call_stream(self, name: str, argv: Union[Sequence[str], str, None] = None,
                    files: Optional[Mapping[str, Union[bytes, str]]] = None,
                    python: Optional[str] = None, **kw: Any) -> ExecStream:
        """:meth:`call` with the output streamed as it is produced; the exit event's ``result``
        (also ``stream.state.result``) holds the rest of the call's result."""
        body = _api.call_body(argv, files, python, **kw)
        return ExecStream(self._t, _api.call_stream(name, body), OutputState(), resume=False)

    # -- layers and environments --

    def import_layer(self, name: str, version: str, kind: str, source: Union[bytes, str], *,
                     image_config: Optional[Mapping[str, Any]] = None,
                     below: Sequence[str] = (), project: str = "",
                     private: bool = False) -> Layer:
        """Publish a layer NAME:VERSION of ``kind`` (base, workspace, toolkit) from ``source``:
        a tar archive (bytes, plain, gzip or zstd) or a local directory path."""
        data = _tario.pack_dir(source) if isinstance(source, str) else source
        return self._do(_api.import_layer(name, version, kind, data, image_config, below, project,
                                          private))

    def layers(self, name: str = "") -> List[Layer]:
        """The published layers (only ``name``'s versions when given)."""
        return self._do(_api.layers(name))

    def layer(self, name: str, version: str) -> Layer:
        """One published layer version."""
        return self._do(_api.layer(name, version))

    def layer_stats(self, name: str, version: str, node: str = "") -> Dict[str, Any]:
        """A layer version's storage and fetch statistics on a node."""
        return self._do(_api.layer_stats(name, version, node))

    def set_layer_fill_rate(self, name: str, version: str, rate: int) -> Layer:
        """Set how fast nodes fetch the rest of a layer in the background (bytes/s; 0 the
        node's default; -1 never)."""
        return self._do(_api.set_layer_fill_rate(name, version, rate))

    def delete_layer(self, name: str, version: str) -> Layer:
        """Delete a published version (refused while a tag, environment or snapshot uses it)."""
        return self._do(_api.delete_layer(name, version))

    def tag_layer(self, name: str, tag: str, version: str) -> Layer:
        """Point the movable name NAME:TAG at NAME:VERSION."""
        return self._do(_api.tag_layer(name, tag, version))

    def delete_tag(self, name: str, tag: str) -> None:
        """Remove the tag NAME:TAG."""
        self._do(_api.delete_tag(name, tag))

    def gc_layers(self) -> Dict[str, Any]:
        """Remove layer contents nothing uses (operator)."""
        return self._do(_api.gc_layers())

    def create_volume(self, name: str, size: Union[str, int], project: str = "") -> Volume:
        """Make a volume of ``size`` ("10G", bytes), charged to ``project``'s disk quota."""
        return self._do(_api.create_volume(name, size, project))

    def volumes(self, project: str = "") -> List[Volume]:
        """The volumes of ``project``'s subtree (default the token's project)."""
        return self._do(_api.volumes(project))

    def volume(self, name: str, project: str = "") -> Volume:
        """One volume, with the sandboxes it is mounted into."""
        return self._do(_api.volume(name, project))

    def delete_volume(self, name: str, project: str = "") -> None:
        """Delete a volume and its data (Conflict while a sandbox has it mounted)."""
        self._do(_api.delete_volume(name, project))

    def add_webhook(self, url: str, events: Optional[Sequence[str]] = None,
                  project: str = "") -> Dict[str, Any]:
        """Send ``project``'s events (``events`` types, default all) to ``url``, signed; the answer
        carries the webhook's ``secret``, shown only here."""
        return self._do(_api.add_webhook(project, url, events))

    def webhooks(self, project: str = "") -> List[Dict[str, Any]]:
        """The webhooks of ``project`` (default the token's), without their secrets."""
        return self._do(_api.webhooks(project))

    def remove_webhook(self, id: str) -> None:
        """Stop a webhook's deliveries and forget it."""
        self._do(_api.remove_webhook(id))

    def test_webhook(self, id: str) -> Dict[str, Any]:
        """Sends the webhook one event of type "test" now, whatever events it subscribes to, and
        returns the attempt (logged with its deliveries, never retried): event, attempt, status,
        result, error."""
        return self._do(_api.test_webhook(id))

    def webhook_deliveries(self, id: str) -> List[Dict[str, Any]]:
        """A webhook's recent deliveries, newest last: event, attempt, status, result, error."""
        return self._do(_api.webhook_deliveries(id))

    def report(self, project: str = "", since: Any = None) -> Dict[str, Any]:
        """The weekly instruments for ``project`` since ``since`` (a duration such as "7d" or a
        datetime; default the server's, 7 days): setup time, time and tokens per task, blocked
        egress per 1000 actions, TTL outcomes."""
        return self._do(_api.report(project, since))

    def save_environment(self, name: str, base: str, workspace: str = "",
                         toolkits: Sequence[str] = (), microvm_template: bool = False, *,
                         warm: int = 0, runtime: str = "",
                         network: Optional[Dict[str, Any]] = None,
                         tier: str = "") -> Environment:
        """Save a named composition of layers; ``create(environment=name)`` uses it.

        ``tier`` ("container" or "microvm"), ``runtime`` and ``network`` (a policy dict) are the
        defaults of its sandboxes; ``warm`` keeps that many started sandboxes (booted VMs for
        the microvm tier) ready on each node, claimed by creates that match their shape."""
        return self._do(_api.save_environment(name, base, workspace, toolkits, microvm_template,
                                              warm, runtime, network, tier))

    def set_environment_warm(self, name: str, warm: int) -> Environment:
        """Change a saved environment's warm pool size (0 drains it)."""
        return self._do(_api.update_environment(name, warm))

    def build_environment(self, name: str, dockerfile: str, context_tar: bytes = b"",
                          build_args: Sequence[str] = (), network: Any = None,
                          runtime: str = "", project: str = "", no_cache: bool = False) -> Build:
        """Start building the environment ``name`` from a Dockerfile (``context_tar``: the build
        context as a tar); follow it with ``build(id)`` or ``build_logs(id, follow=True)``."""
        return self._do(_api.start_build(name, dockerfile, context_tar, build_args, network,
                                          runtime, project, no_cache))

    def build(self, build_id: str) -> Build:
        """A build job."""
        return self._do(_api.build(build_id))

    def cancel_build(self, build_id: str) -> Build:
        """End a running build (it fails, cancelled; nothing is saved)."""
        return self._do(_api.cancel_build(build_id))

    def builds(self) -> List[Build]:
        """The build jobs the server remembers."""
        return self._do(_api.builds())

    def build_logs(self, build_id: str, follow: bool = False) -> List[Dict[str, Any]]:
        """A build's events (step, log, end); with follow, read until the build ends."""
        return self._do(_api.build_logs(build_id, follow))

    def environments(self) -> List[Environment]:
        """The saved environments."""
        return self._do(_api.environments())

    def environment(self, name: str) -> Environment:
        """One saved environment."""
        return self._do(_api.environment(name))

    def delete_environment(self, name: str) -> None:
        """Remove a saved environment (its sandboxes are not affected)."""
        self._do(_api.delete_environment(name))

    # -- network --

    def network_services(self) -> List[NetworkService]:
        """The operator's catalog of services that policy rules may name."""
        return self._do(_api.network_services())

    def set_network_services(self, catalog: Any) -> List[NetworkService]:
        """Replace the service catalog ({"services": {NAME: {"domains": [...]}}}; operator)."""
        return self._do(_api.set_network_services(catalog))

    # -- cluster --

    def nodes(self) -> List[Node]:
        """A cluster's nodes (operator)."""
        return self._do(_api.nodes())

    def node_action(self, name: str, action: str) -> Node:
        """Cordon, drain or uncordon a node."""
        return self._do(_api.node_action(name, action))

    # -- projects and access --

    def whoami(self) -> Whoami:
        """The caller's principal, token and permissions."""
        return self._do(_api.whoami())

    def create_project(self, path: str) -> Project:
        """Create the project at ``path`` ("team-a/rollout-17"); its parent must exist."""
        return self._do(_api.create_project(path))

    def projects(self, under: str = "") -> List[Project]:
        """The projects in ``under``'s subtree that the caller can see, parents first."""
        return self._do(_api.projects(under))

    def project(self, path: str) -> Project:
        """One project."""
        return self._do(_api.project(path))

    def delete_project(self, path: str, force: bool = False) -> None:
        """Delete a project and its subtree (``force``: deleting its live sandboxes first)."""
        self._do(_api.delete_project(path, force))

    def move_project(self, source: str, destination: str, force: bool = False) -> Project:
        """Move the subtree at ``source`` to ``destination``."""
        return self._do(_api.move_project(source, destination, force))

    def quota(self, project: str) -> ProjectQuota:
        """A project's limits, usage and delegations."""
        return self._do(_api.quota(project))

    def set_quota(self, project: str, *, sandboxes: Optional[int] = None,
                  cpus: Optional[float] = None, memory_bytes: Union[str, int, None] = None,
                  disk_bytes: Union[str, int, None] = None,
                  creates_per_minute: Optional[int] = None,
                  tiers: Optional[Mapping[str, int]] = None) -> ProjectQuota:
        """Replace a project's limits (None: no limit of its own); needs quota.delegate on the
        parent."""
        return self._do(_api.set_quota(project, {
            "sandboxes": sandboxes, "cpus": cpus, "memory_bytes": memory_bytes,
            "disk_bytes": disk_bytes, "creates_per_minute": creates_per_minute,
            "tiers": dict(tiers) if tiers else None}))

    def placement(self, project: str) -> Dict[str, Any]:
        """A project's node placement and the one in effect."""
        return self._do(_api.placement(project))

    def set_placement(self, project: str, pin: Sequence[Mapping[str, str]] = (),
                      avoid: Sequence[Mapping[str, str]] = ()) -> Dict[str, Any]:
        """Set a project's placement (operator)."""
        return self._do(_api.set_placement(project, pin, avoid))

    def create_principal(self, name: str, kind: str = "", project: str = "") -> Principal:
        """Create a principal (user, service or agent) in a project."""
        return self._do(_api.create_principal(name, kind, project))

    def principals(self, project: str = "") -> List[Principal]:
        """The principals created in ``project``'s subtree."""
        return self._do(_api.principals(project))

    def grant(self, project: str, principal: str, role: str) -> Grant:
        """Give a principal a role (viewer, user, admin, owner) on a project."""
        return self._do(_api.grant(project, principal, role))

    def revoke(self, project: str, principal: str, role: str = "") -> None:
        """Remove a grant (every role of the principal there when ``role`` is empty)."""
        self._do(_api.revoke(project, principal, role))

    def grants(self, project: str = "") -> List[Grant]:
        """The grants on ``project``'s subtree."""
        return self._do(_api.grants(project))

    def create_token(self, project: str, role: str = "", *, permissions: Sequence[str] = (),
                     ttl: Optional[Duration] = None, principal: str = "", kind: str = "",
                     name: str = "") -> Token:
        """Mint a token scoped to ``project`` with a ``role`` (or ``permissions``); ``token``
        holds the secret, shown only now (``e2b_key`` gives it in the ``e2b_<hex>`` shape E2B's
        SDKs require)."""
        return self._do(_api.create_token(project, role, permissions, ttl, principal, kind, name))

    def tokens(self) -> List[Token]:
        """The tokens the caller may manage."""
        return self._do(_api.tokens())

    def revoke_token(self, id: str) -> Token:
        """Revoke a token and every token minted from it."""
        return self._do(_api.revoke_token(id))

    def events(self, project: str = "", since: Any = None, types: Optional[Sequence[str]] = None,
               follow: bool = False) -> EventStream:
        """The event stream of ``project``'s subtree (default: the token's project): past events
        after ``since`` (a datetime, or a duration back from now; default the last hour, or none
        with ``follow``), then with ``follow`` new ones as they happen. Close it when done."""
        return EventStream(self._t.open(_api.events(project, since, types, follow)))

    def audit(self, project: str = "", action: str = "", before: int = 0,
              limit: int = 0) -> List[AuditEntry]:
        """Audit entries of ``project``'s subtree, newest first (``action``: exact, or a prefix
        ending in ".")."""
        return self._do(_api.audit(project, action, before, limit))
