"""The sans-I/O core shared by the sync and async clients.

Nothing here touches a socket. It resolves the server and token as the CLI does, describes each
HTTP exchange as a :class:`Request`, turns error answers into :class:`~corral.errors.APIError`,
decides what to retry and after how long (:class:`RetryPolicy`), splits NDJSON streams into
objects (:class:`NDJSONSplitter`) and keeps the state of a command's output stream, so that a
broken stream can be resumed from the byte it stopped at (:class:`OutputState`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import random
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import errors
from .models import Event, Exit

DEFAULT_URL = "http://127.0.0.1:7070"
"""The server the CLI talks to when neither an argument nor $CORRAL_URL names one."""

DEFAULT_TOKEN_FILE = "/var/lib/corral/admin.token"
"""The token file a local `corral up` writes, read when no token is given otherwise."""

USER_AGENT = "corral-python/0.1.0"

MAX_ERROR_BODY = 64 << 10


def resolve(url: Optional[str] = None, token: Optional[str] = None,
            token_file: Optional[str] = None,
            environ: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """Return the (url, token) a client uses, found as the CLI finds them.

    The URL is ``url``, else $CORRAL_URL, else http://127.0.0.1:7070. The token is ``token``,
    else the content of ``token_file`` (as ``--token-file``; an unreadable one is an error),
    else $CORRAL_TOKEN, else the content of /var/lib/corral/admin.token when readable, else ""
    (the server then answers 401).
    """
    env = os.environ if environ is None else environ
    u = url or env.get("CORRAL_URL") or DEFAULT_URL
    if token:
        return u, token
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return u, f.read().strip()
    if env.get("CORRAL_TOKEN"):
        return u, env["CORRAL_TOKEN"]
    try:
        with open(DEFAULT_TOKEN_FILE, encoding="utf-8") as f:
            return u, f.read().strip()
    except OSError:
        return u, ""


@dataclass
class Endpoint:
    """A parsed server URL: scheme, host, port and path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> "Endpoint":
        """Parse ``url``; anything but an http or https URL with a host is a ValueError."""
        p = urllib.parse.urlsplit(url.rstrip("/"))
        if p.scheme not in ("http", "https"):
            raise ValueError("server URL %r: scheme must be http or https" % url)
        if not p.hostname:
            raise ValueError("server URL %r: no host" % url)
        port = p.port or (443 if p.scheme == "https" else 80)
        return cls(p.scheme, p.hostname, port, p.path)

    @property
    def host_header(self) -> str:
        """The Host header value."""
        h = "[%s]" % self.host if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return h if self.port == default else "%s:%d" % (h, self.port)


Query = List[Tuple[str, str]]


@dataclass
class Request:
    """One HTTP exchange with the server, before it is sent.

    ``path`` is already escaped. ``body`` is sent as is (``json_body``, when not None, is encoded
    and sent instead). ``idempotent`` says the request may be sent again after a connection
    error or a 5xx answer; ``stream`` that the answer is read incrementally.
    """

    method: str
    path: str
    query: Query = field(default_factory=list)
    json_body: Any = None
    body: Optional[bytes] = None
    content_type: str = ""
    headers: Dict[str, str] = field(default_factory=dict)
    auth: bool = True
    idempotent: bool = False
    stream: bool = False

    def __post_init__(self) -> None:
        if self.method in ("GET", "HEAD", "PUT", "DELETE"):
            self.idempotent = True

    def target(self, ep: Endpoint) -> str:
        """The request target: path prefix, path and encoded query."""
        t = ep.prefix + self.path
        if self.query:
            t += "?" + urllib.parse.urlencode(self.query)
        return t

    def encode(self, ep: Endpoint, token: str, user_agent: str) -> Tuple[Dict[str, str], bytes]:
        """Return the headers and body to send."""
        body = self.body or b""
        ctype = self.content_type
        if self.json_body is not None:
            body = json.dumps(self.json_body, separators=(",", ":")).encode()
            ctype = "application/json"
        h = {"Host": ep.host_header, "User-Agent": user_agent, "Accept-Encoding": "identity"}
        if ctype:
            h["Content-Type"] = ctype
        if self.auth and token:
            h["Authorization"] = "Bearer " + token
        h.update(self.headers)
        h["Content-Length"] = str(len(body))
        return h, body

    def wire(self, ep: Endpoint, token: str, user_agent: str) -> bytes:
        """The whole request as HTTP/1.1 bytes (for transports that write sockets themselves)."""
        h, body = self.encode(ep, token, user_agent)
        lines = ["%s %s HTTP/1.1" % (self.method, self.target(ep))]
        lines += ["%s: %s" % kv for kv in h.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    v = headers.get("retry-after") or headers.get("Retry-After")
    if not v:
        return None
    try:
        return max(0.0, float(v))
    except ValueError:
        return None


def decode_error(status: int, headers: Mapping[str, str], body: bytes) -> errors.APIError:
    """Build the APIError (of the subclass its code selects) for an answer of 400 or above."""
    code = message = field_ = permission = ""
    quota = None
    try:
        wire = json.loads(body[:MAX_ERROR_BODY].decode("utf-8"))
    except ValueError:
        wire = None
    if isinstance(wire, dict) and (wire.get("code") or wire.get("message")):
        code = str(wire.get("code") or "")
        message = str(wire.get("message") or "")
        field_ = str(wire.get("field") or "")
        permission = str(wire.get("permission") or "")
        quota = wire.get("quota")
    else:
        message = body[:512].decode("utf-8", "replace").strip()
    if not code:
        code = errors.code_for_status(status)
    cls = errors.error_class(code)
    if cls is errors.APIError and status >= 500:
        cls = errors.ServerError
    return cls(status, code, message, field_, quota, permission, _retry_after(headers))


@dataclass
class RetryPolicy:
    """When and after how long a request is sent again.

    A request marked idempotent (GET, PUT, DELETE, a create with an idempotency key, an exec
    with a step_id, ...) is retried after a connection error and after a 5xx answer (502, 503,
    504, 500), up to ``retries`` times, waiting ``backoff * 2**n`` seconds (at most
    ``max_backoff``, with jitter) or what a Retry-After header asks for. Other requests are
    retried only when they certainly never reached the server (a reused connection the server
    had closed). 4xx answers are never retried: a quota refusal is final.
    """

    retries: int = 6
    backoff: float = 0.25
    max_backoff: float = 8.0
    statuses: Tuple[int, ...] = (500, 502, 503, 504)

    def delay(self, attempt: int, retry_after: Optional[float] = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1 for the first)."""
        if retry_after is not None:
            return min(retry_after, 60.0)
        d = min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))
        return d * (0.5 + random.random() / 2)

    def should_retry_status(self, req: Request, status: int, attempt: int) -> bool:
        """Whether an answer with ``status`` to ``req`` is retried at attempt ``attempt``."""
        return req.idempotent and status in self.statuses and attempt <= self.retries

    def should_retry_error(self, req: Request, attempt: int, sent: bool) -> bool:
        """Whether a connection error is retried; ``sent`` says the request may have reached
        the server."""
        if attempt > self.retries:
            return False
        return req.idempotent or not sent


class NDJSONSplitter:
    """Splits a byte stream of newline-delimited JSON into decoded objects."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[Any]:
        """Add data and return the objects of every line it completed."""
        self._buf += data
        out = []
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                return out
            line = bytes(self._buf[:i]).strip()
            del self._buf[:i + 1]
            if line:
                out.append(json.loads(line))

    def finish(self) -> List[Any]:
        """Return the object of an unterminated last line (the stream ended)."""
        line = bytes(self._buf).strip()
        self._buf.clear()
        return [json.loads(line)] if line else []


class OutputState:
    """The state of one command's output stream (exec, attach, call stream).

    It records the command ID, the offset after the last byte delivered, the exit, and the
    bytes reported dropped; it drops events a resumed stream repeats, and it says how to
    resume a stream that broke (attach from :attr:`next_offset`).
    """

    def __init__(self, sandbox: str = "", command_id: str = "", want_exit: bool = True,
                 offset: int = 0) -> None:
        self.sandbox = sandbox
        self.command_id = command_id
        self.want_exit = want_exit
        self.next_offset = offset
        self.exit: Optional[Exit] = None
        self.result: Optional[Dict[str, Any]] = None
        self.replayed = False
        self.dropped = 0

    @property
    def done(self) -> bool:
        """True once the exit event was seen."""
        return self.exit is not None

    def accept(self, obj: Any) -> Optional[Event]:
        """Interpret one decoded line: return the event to deliver, or None for a duplicate.

        An "error" event raises StreamError."""
        ev = Event.from_json(obj)
        t = ev.type
        if t == "start":
            if ev.command_id:
                self.command_id = ev.command_id
            self.replayed = self.replayed or ev.replayed
        elif t in ("stdout", "stderr"):
            end = ev.offset + len(ev.data)
            if end <= self.next_offset:
                return None
            if ev.offset < self.next_offset:
                # Part of it was delivered before the stream was resumed.
                cut = self.next_offset - ev.offset
                ev.data, ev.offset = ev.data[cut:], self.next_offset
            self.next_offset = end
        elif t == "truncated":
            self.dropped += ev.dropped
            if ev.offset > self.next_offset:
                self.next_offset = ev.offset
        elif t == "exit":
            if ev.exit is None:
                ev.exit = Exit()
            self.exit, self.result = ev.exit, ev.result
        elif t == "error":
            raise errors.StreamError("output stream failed on the server: %s"
                                     % ev.data.decode("utf-8", "replace"))
        return ev

    def ended(self) -> None:
        """Called at the end of the stream: raises StreamError when it ended too soon."""
        if self.want_exit and self.exit is None:
            raise errors.StreamError("output stream ended before the command exited")

    def can_resume(self) -> bool:
        """Whether a broken stream can be picked up again by attaching to the command."""
        return bool(self.sandbox and self.command_id) and self.exit is None

    def resume_request(self) -> Request:
        """The attach request that continues the stream where it broke."""
        return Request("GET", sandbox_path(self.sandbox, "commands", self.command_id, "output"),
                       query=[("offset", str(self.next_offset)), ("follow", "true")], stream=True)


def watch_line(obj: Any, status: int = 200):
    """Interpret one line of a watch stream: a WatchEvent, or raise the APIError it carries."""
    from .models import WatchEvent
    if isinstance(obj, dict) and obj.get("type") == "error":
        code = str(obj.get("code") or "internal")
        raise errors.error_class(code)(status, code, str(obj.get("message") or ""))
    return WatchEvent.from_json(obj)


def event_line(obj: Any, status: int = 200):
    """Interpret one line of the event stream: a LifecycleEvent, or raise the APIError it carries
    (a follower dropped for falling behind gets code exhausted)."""
    from .models import LifecycleEvent
    if isinstance(obj, dict) and obj.get("code") and not obj.get("type"):
        code = str(obj.get("code"))
        raise errors.error_class(code)(status, code, str(obj.get("message") or ""))
    return LifecycleEvent.from_json(obj)


# ---- helpers for building requests ----

def esc(s: str) -> str:
    """Escape one path element."""
    return urllib.parse.quote(s, safe="")


def sandbox_path(id: str, *sub: str) -> str:
    """The escaped path of a sandbox, followed by the escaped elements of sub."""
    return "/".join(["/v1/sandboxes", esc(id)] + [esc(s) for s in sub])


def project_path(p: str) -> str:
    """Escape a project path for a URL: each name on its own ("" or "/" is the root)."""
    p = p.strip("/")
    return "/".join(esc(s) for s in p.split("/")) if p else ""


Duration = Union[str, int, float, _dt.timedelta]


def duration(d: Optional[Duration]) -> str:
    """A Go duration string from "10m", a number of seconds or a timedelta ("" for None)."""
    if d is None or d == "":
        return ""
    if isinstance(d, str):
        return d
    if isinstance(d, _dt.timedelta):
        d = d.total_seconds()
    if isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0:
        raise ValueError("duration %r: want a string such as '10m', seconds or a timedelta" % (d,))
    return ("%d" % d if float(d).is_integer() else "%.3f" % d) + "s"


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.I)


def size(s: Union[str, int, None]) -> int:
    """Bytes from an int or a size such as "512M", "1G", "256MiB", "1.5g" (binary units)."""
    if s is None or s == "":
        return 0
    if isinstance(s, bool):
        raise ValueError("size %r" % (s,))
    if isinstance(s, int):
        return s
    m = _SIZE_RE.match(str(s))
    if not m:
        raise ValueError("size %r: want bytes or a number with K, M, G or T" % (s,))
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def env_list(env: Union[Mapping[str, str], Sequence[str], None]) -> List[str]:
    """KEY=VALUE strings from a mapping or a sequence of them."""
    if not env:
        return []
    if isinstance(env, Mapping):
        return ["%s=%s" % (k, v) for k, v in env.items()]
    return [str(e) for e in env]


def network_json(n: Any) -> Optional[Dict[str, Any]]:
    """The API's network policy object from a NetworkPolicy, a dict, a mode string ("open",
    "none") or a list of allow rules."""
    from .models import NetworkPolicy
    if n is None:
        return None
    if isinstance(n, NetworkPolicy):
        return n.to_json()
    if isinstance(n, str):
        return {"mode": n}
    if isinstance(n, Mapping):
        return dict(n)
    if isinstance(n, Iterable):
        return {"mode": "allowlist", "allow": list(n)}
    raise TypeError("network: want a NetworkPolicy, dict, mode string or list of rules")


def b64e(b: Union[bytes, str]) -> str:
    """Base64 of bytes (a str is encoded as UTF-8 first), as Go's []byte JSON."""
    import base64
    if isinstance(b, str):
        b = b.encode()
    return base64.b64encode(b).decode("ascii")


def parse_json(body: bytes) -> Any:
    """Decode a JSON answer body."""
    return json.loads(body.decode("utf-8")) if body else None


def parse_ndjson(body: bytes) -> List[Any]:
    """Decode an NDJSON answer body read whole."""
    s = NDJSONSplitter()
    return s.feed(body) + s.finish()


def into(cls: Any, key: Optional[str] = None) -> Callable[[int, Mapping[str, str], bytes], Any]:
    """A parser for an answer holding one model (or a list of them, under ``key`` if given)."""
    def parse(status: int, headers: Mapping[str, str], body: bytes) -> Any:
        d = parse_json(body)
        if key is not None:
            d = (d or {}).get(key) or []
        if isinstance(d, list):
            return [cls.from_json(x) for x in d]
        return cls.from_json(d)
    return parse


def nothing(status: int, headers: Mapping[str, str], body: bytes) -> None:
    """A parser for answers whose body does not matter."""
    return None


def raw_body(status: int, headers: Mapping[str, str], body: bytes) -> bytes:
    """A parser returning the body as is."""
    return body


@dataclass
class Call:
    """A request and how to turn its successful answer into a value."""

    request: Request
    parse: Callable[[int, Mapping[str, str], bytes], Any] = nothing
