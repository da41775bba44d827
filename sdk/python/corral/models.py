"""The objects the Corral API returns, as dataclasses.

Each model is built from the server's JSON with :meth:`Model.from_json`; fields the server adds
later and this package does not know yet stay reachable in ``raw`` (the JSON object as received).
Times are timezone-aware :class:`datetime.datetime` (None where the server sent none); byte
contents are :class:`bytes`.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional

__all__ = [
    "Model", "Exit", "Event", "ExecResult", "Command", "SandboxInfo", "Limits", "NetworkPolicy",
    "FileInfo", "WatchEvent", "Layer", "Environment", "FncallEnv", "CallResult",
    "TrajectoryEntry", "Build", "BuildStep", "Project", "ProjectQuota", "Principal", "Grant", "Token", "Whoami",
    "AuditEntry", "ServerInfo", "BlockedAttempt", "NetworkService", "Node", "e2b_key",
]

_TIME_RE = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|z|[+-]\d\d:\d\d)$")


def parse_time(s: Any) -> Optional[_dt.datetime]:
    """Parse an RFC 3339 time as Go writes it (nanoseconds, "Z"); Go's zero time is None."""
    if not isinstance(s, str) or not s:
        return None
    m = _TIME_RE.match(s)
    if not m:
        return None
    y, mo, d, h, mi, sec, frac, tz = m.groups()
    if y == "0001":
        return None
    us = int((frac or "0")[:6].ljust(6, "0"))
    if tz in ("Z", "z"):
        tzinfo = _dt.timezone.utc
    else:
        sign = 1 if tz[0] == "+" else -1
        tzinfo = _dt.timezone(sign * _dt.timedelta(hours=int(tz[1:3]), minutes=int(tz[4:6])))
    return _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), us, tzinfo)


def b64(data: Optional[str]) -> bytes:
    """Decode a base64 JSON string (Go's []byte encoding); None or "" is b""."""
    return base64.b64decode(data) if data else b""


class Model:
    """Base of every API object: construction from JSON with nested models, times and bytes.

    Subclasses name their special fields in class attributes: ``_models`` (field -> model
    class, for an object or a list of objects), ``_bytes`` (base64 strings), ``_bytes_maps``
    (maps of base64 strings) and ``_times`` (extra time fields; every ``*_at`` field is one).
    """

    _models: ClassVar[Dict[str, type]] = {}
    _bytes: ClassVar[tuple] = ()
    _bytes_maps: ClassVar[tuple] = ()
    _times: ClassVar[tuple] = ()

    @classmethod
    def from_json(cls, d: Any) -> Any:
        """Build the model from a decoded JSON object (None stays None)."""
        if d is None:
            return None
        if not isinstance(d, dict):
            raise TypeError("%s: want a JSON object, got %s" % (cls.__name__, type(d).__name__))
        kw: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == "raw":
                kw["raw"] = d
                continue
            if f.name not in d:
                continue
            v = d[f.name]
            sub = cls._models.get(f.name)
            if sub is not None and v is not None:
                v = [sub.from_json(x) for x in v] if isinstance(v, list) else sub.from_json(v)
            elif f.name in cls._bytes:
                v = b64(v)
            elif f.name in cls._bytes_maps:
                v = {k: b64(x) for k, x in (v or {}).items()}
            elif f.name.endswith("_at") or f.name in cls._times:
                v = parse_time(v)
            kw[f.name] = v
        return cls(**kw)  # type: ignore[call-arg]


@dataclass
class Exit(Model):
    """How a command ended: its exit ``code``, or the ``signal`` that killed it; ``timed_out``
    when its timeout killed it; ``error`` when it could not run at all."""

    code: int = 0
    signal: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    error: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Event(Model):
    """One event of a command's output stream.

    ``type`` is "start" (``command_id`` known), "stdout" or "stderr" (``data`` at byte
    ``offset``, stdout and stderr counted together), "truncated" (``dropped`` bytes lost), or
    "exit" (last; ``exit`` and ``exit_code`` say how it ended).
    """

    _models: ClassVar[Dict[str, type]] = {"exit": Exit}
    _bytes: ClassVar[tuple] = ("data",)

    type: str = ""
    command_id: str = ""
    offset: int = 0
    data: bytes = b""
    dropped: int = 0
    exit: Optional[Exit] = None
    replayed: bool = False
    result: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code on an "exit" event; None on the others."""
        return self.exit.code if self.exit is not None else None


@dataclass
class ExecResult:
    """The collected result of a command run to completion (``Sandbox.exec``).

    ``stdout`` and ``stderr`` are the output decoded as UTF-8 (invalid bytes replaced);
    ``stdout_bytes`` and ``stderr_bytes`` are the raw bytes. A command that exited non-zero is
    not an error: check ``exit_code`` (or call :meth:`check`).
    """

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    exit: Exit
    command_id: str = ""
    replayed: bool = False
    dropped: int = 0

    @property
    def stdout(self) -> str:
        """The standard output as text (UTF-8, invalid bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """The standard error as text (UTF-8, invalid bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0 and not self.exit.signal and not self.exit.error

    def check(self) -> "ExecResult":
        """Return self when the command succeeded; raise :class:`CommandFailed` otherwise."""
        if not self.ok:
            raise CommandFailed(self)
        return self


class CommandFailed(Exception):
    """Raised by :meth:`ExecResult.check` for a command that did not exit 0; ``result`` holds it."""

    def __init__(self, result: ExecResult) -> None:
        self.result = result
        why = result.exit.error or (
            "signal %s" % result.exit.signal if result.exit.signal else "exit code %d" % result.exit_code)
        tail = result.stderr.strip()[-500:]
        super().__init__("command failed: %s%s" % (why, ": " + tail if tail else ""))


@dataclass
class Command(Model):
    """A command started in a sandbox (running or exited); its output spans byte offsets
    ``output_start`` to ``output_end``."""

    _models: ClassVar[Dict[str, type]] = {"exit": Exit}

    id: str = ""
    argv: List[str] = field(default_factory=list)
    pid: int = 0
    tty: bool = False
    state: str = ""
    started_at: Optional[_dt.datetime] = None
    ended_at: Optional[_dt.datetime] = None
    exit: Optional[Exit] = None
    output_start: int = 0
    output_end: int = 0
    #: True for a command started with ``exclusive=True``.
    exclusive: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Limits(Model):
    """What a sandbox may use; 0 means the server's default."""

    cpus: float = 0
    memory_bytes: int = 0
    pids: int = 0
    disk_bytes: int = 0
    open_files: int = 0
    output_bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class NetworkPolicy(Model):
    """A sandbox's egress policy: ``mode`` "none", "allowlist" or "open", with ``allow`` and
    ``deny`` rules ("pypi", "pypi.org:443", "*.example.com", "203.0.113.0/24:443/tcp")."""

    mode: str = ""
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def to_json(self) -> Dict[str, Any]:
        """The policy as the API's JSON object."""
        out: Dict[str, Any] = {}
        if self.mode:
            out["mode"] = self.mode
        if self.allow:
            out["allow"] = list(self.allow)
        if self.deny:
            out["deny"] = list(self.deny)
        return out


@dataclass
class VolumeMount(Model):
    """A volume mounted into a sandbox (``create(volumes=)``; also ``SandboxInfo.volumes``)."""

    name: str = ""
    path: str = ""
    read_only: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class SandboxInfo(Model):
    """The server's view of a sandbox (``Sandbox.info()``): its ``state`` ("creating",
    "running", "paused", "deleting", "stopped", "failed", "off"), the ``reason`` it stopped, its layers,
    limits, labels and times."""

    _models: ClassVar[Dict[str, type]] = {"limits": Limits, "network": NetworkPolicy,
                                          "volumes": VolumeMount}

    id: str = ""
    project: str = ""
    node: str = ""
    tier: str = ""
    runtime: str = ""
    state: str = ""
    reason: str = ""
    base: str = ""
    workspace: str = ""
    toolkits: List[str] = field(default_factory=list)
    image: str = ""
    limits: Optional[Limits] = None
    env: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    hostname: str = ""
    created_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    last_activity_at: Optional[_dt.datetime] = None
    ended_at: Optional[_dt.datetime] = None
    paused_at: Optional[_dt.datetime] = None
    idle_ttl_seconds: int = 0
    auto_pause_after_seconds: int = 0
    pause_keeps_ttl: bool = True
    from_snapshot: str = ""
    forked_from: str = ""
    environment: str = ""
    cwd: str = ""
    user: str = ""
    fetch: str = ""
    network: Optional[NetworkPolicy] = None
    network_address: str = ""
    volumes: List[VolumeMount] = field(default_factory=list)
    last_pause: Optional[Dict[str, Any]] = None
    egress: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class FileInfo(Model):
    """A file inside a sandbox; ``mode`` holds the permission bits (``mode & 0o7777``)."""

    name: str = ""
    path: str = ""
    size: int = 0
    mode: int = 0
    mod_time: Optional[_dt.datetime] = None
    is_dir: bool = False
    link: str = ""
    uid: int = 0
    gid: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _times: ClassVar[tuple] = ("mod_time",)

    @property
    def permissions(self) -> int:
        """The Unix permission bits (0o644, ...)."""
        return self.mode & 0o777


@dataclass
class WatchEvent(Model):
    """One change in a watched tree: ``type`` "create", "write", "remove", "rename", "chmod" or
    "overflow" (events were lost: look at the tree again); ``name`` relative to the watched
    directory ("" for the directory itself)."""

    type: str = ""
    name: str = ""
    at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _times: ClassVar[tuple] = ("at",)


@dataclass
class Layer(Model):
    """A published, immutable layer version NAME:VERSION of a ``kind`` (base, workspace,
    toolkit, snapshot, vm-image)."""

    name: str = ""
    version: str = ""
    kind: str = ""
    digest: str = ""
    size: int = 0
    files: int = 0
    labels: Dict[str, str] = field(default_factory=dict)
    created_at: Optional[_dt.datetime] = None
    tags: List[str] = field(default_factory=list)
    below: List[str] = field(default_factory=list)
    project: str = ""
    private: bool = False
    fill_rate: int = 0
    snapshot: Optional[Dict[str, Any]] = None
    image_config: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ref(self) -> str:
        """The layer's reference, "NAME:VERSION"."""
        return "%s:%s" % (self.name, self.version)


@dataclass
class Environment(Model):
    """A saved composition of layers that sandboxes are created from (``create(environment=)``)."""

    name: str = ""
    base: str = ""
    workspace: str = ""
    toolkits: List[str] = field(default_factory=list)
    created_at: Optional[_dt.datetime] = None
    _models: ClassVar[Dict[str, type]] = {"network": NetworkPolicy}

    project: str = ""
    microvm_template: bool = False
    #: The tier of its sandboxes when a create names none, and of its warm pool ("" : container).
    tier: str = ""
    runtime: str = ""
    network: Optional[NetworkPolicy] = None
    warm: int = 0
    #: This node's warm pool: sandboxes ready, the size it aims at, creates served from it,
    #: creates that named the environment while it had a pool, and hits/claims.
    warm_ready: int = 0
    warm_target: int = 0
    warm_hits: int = 0
    warm_claims: int = 0
    warm_hit_rate: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class BuildStep(Model):
    """One instruction of a Dockerfile build: its kind (config, run, copy) and state (pending,
    running, cached, done, failed)."""

    n: int = 0
    text: str = ""
    kind: str = ""
    state: str = ""
    layer: str = ""
    seconds: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Build(Model):
    """A build job (``POST /v1/builds``): a Dockerfile built into the environment ``name``."""

    _models: ClassVar[Dict[str, type]] = {"steps": BuildStep}

    id: str = ""
    name: str = ""
    project: str = ""
    state: str = ""
    error: str = ""
    steps: List[BuildStep] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    layer: str = ""
    created_at: Optional[_dt.datetime] = None
    finished_at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class VolumeAttachment(Model):
    """A sandbox a volume is mounted into."""

    sandbox: str = ""
    read_only: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Volume(Model):
    """A project's filesystem that outlives its sandboxes, charged to its disk quota."""

    _models: ClassVar[Dict[str, type]] = {"attached_to": VolumeAttachment}

    name: str = ""
    project: str = ""
    size_bytes: int = 0
    node: str = ""
    created_at: Optional[_dt.datetime] = None
    attached_to: List[VolumeAttachment] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class FncallEnv(Model):
    """An fncall environment: the layers, limits and warm pool that stateless calls run in."""

    name: str = ""
    project: str = ""
    base: str = ""
    workspace: str = ""
    toolkits: List[str] = field(default_factory=list)
    limits: Optional[Limits] = None
    pool_min: int = 0
    pool_max: int = 0
    timeout: str = ""
    queue_depth: int = 0
    queue_wait: str = ""
    network: Optional[NetworkPolicy] = None
    warm: Optional[Dict[str, Any]] = None
    files_bytes: int = 0
    created_at: Optional[_dt.datetime] = None
    pool: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _models: ClassVar[Dict[str, type]] = {"limits": Limits, "network": NetworkPolicy}


@dataclass
class CallResult(Model):
    """The result of a stateless call (``Corral.call``): output, exit, timings and the files
    asked for in ``outputs``."""

    _models: ClassVar[Dict[str, type]] = {"exit": Exit}
    _bytes: ClassVar[tuple] = ("stdout", "stderr")
    _bytes_maps: ClassVar[tuple] = ("outputs",)

    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    exit: Optional[Exit] = None
    wall_ms: float = 0
    queued_ms: float = 0
    cpu_ms: float = 0
    max_rss_bytes: int = 0
    outputs: Dict[str, bytes] = field(default_factory=dict)
    output_errors: Dict[str, str] = field(default_factory=dict)
    artifacts: Dict[str, str] = field(default_factory=dict)
    warm: bool = False
    container: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def exit_code(self) -> int:
        """The call's exit code."""
        return self.exit.code if self.exit is not None else 0

    @property
    def text(self) -> str:
        """The call's stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


@dataclass
class TrajectoryEntry(Model):
    """One step of a sandbox's trajectory: an exec or file-changing call, in order (``seq``),
    with its ``step_id``, request, ``state`` (running, done, failed), exit and output."""

    _models: ClassVar[Dict[str, type]] = {"exit": Exit, "output": Event}

    seq: int = 0
    step_id: str = ""
    kind: str = ""
    request: Any = None
    command_id: str = ""
    state: str = ""
    started_at: Optional[_dt.datetime] = None
    ended_at: Optional[_dt.datetime] = None
    exit: Optional[Exit] = None
    output: List[Event] = field(default_factory=list)
    output_truncated: bool = False
    error: str = ""
    #: True for a step run with ``exclusive=True``: every other process of the sandbox was
    #: stopped while it ran.
    exclusive: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Project(Model):
    """A node of the project tree ("team-a/rollout-17"; the root is "/")."""

    id: str = ""
    path: str = ""
    parent: str = ""
    created_at: Optional[_dt.datetime] = None
    created_by: str = ""
    sandboxes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ProjectQuota(Model):
    """A project's limits, its subtree's usage and what its children hold (JSON objects keyed
    like the API's Quota: sandboxes, cpus, memory_bytes, disk_bytes, creates_per_minute, tiers)."""

    project: str = ""
    limit: Dict[str, Any] = field(default_factory=dict)
    usage: Dict[str, Any] = field(default_factory=dict)
    delegated: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Principal(Model):
    """An identity: a user, a service or an agent."""

    name: str = ""
    kind: str = ""
    project: str = ""
    created_at: Optional[_dt.datetime] = None
    created_by: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Grant(Model):
    """A role a principal holds on a project (and its descendants)."""

    project: str = ""
    principal: str = ""
    role: str = ""
    created_at: Optional[_dt.datetime] = None
    created_by: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Token(Model):
    """An API token's record; ``token`` holds the secret only in the answer to its creation,
    and ``e2b_key`` then gives the same secret as its E2B alias (for E2B's SDKs)."""

    id: str = ""
    token: str = ""
    principal: str = ""
    project: str = ""
    role: str = ""
    permissions: List[str] = field(default_factory=list)
    parent: str = ""
    created_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    revoked_at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


    @property
    def e2b_key(self) -> str:
        """The secret as its E2B alias ("e2b_" and hex), or "" when the secret is not known."""
        return e2b_key(self.token) if self.token else ""


def e2b_key(token: str) -> str:
    """Return a Corral token's E2B alias: "e2b_" and the token's 32 secret bytes in lowercase hex,
    the only key shape E2B's Python SDK accepts (E2B_API_KEY). The alias is the same token:
    Corral and its E2B gateway take it wherever they take the token. Raises ValueError for a
    string that is not a Corral token."""
    import re
    if re.fullmatch(r"e2b_[0-9a-f]{64}", token):
        return token
    m = re.fullmatch(r"crl_([A-Za-z0-9_-]{43})", token)
    raw = base64.urlsafe_b64decode(m.group(1) + "=") if m else b""
    if len(raw) != 32 or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != (m.group(1) if m else ""):
        raise ValueError("not a Corral token (crl_ followed by 43 base64url characters)")
    return "e2b_" + raw.hex()


@dataclass
class Whoami(Model):
    """The caller: its principal, its token, and the permissions it holds on its project."""

    _models: ClassVar[Dict[str, type]] = {"principal": Principal, "token": Token}

    principal: Optional[Principal] = None
    token: Optional[Token] = None
    permissions: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class AuditEntry(Model):
    """One management action in the audit log."""

    id: int = 0
    at: Optional[_dt.datetime] = None
    principal: str = ""
    token: str = ""
    project: str = ""
    action: str = ""
    target: str = ""
    result: str = ""
    detail: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _times: ClassVar[tuple] = ("at",)


@dataclass
class MetricSample(Model):
    """One resource sample of a sandbox (GET /v1/sandboxes/{id}/metrics): CPU in percent of one
    CPU, memory and its peak, bytes in use on the writable layer, network byte totals, tasks."""

    at: Optional[_dt.datetime] = None
    cpu_percent: float = 0.0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    disk_bytes: int = 0
    net_rx_bytes: int = 0
    net_tx_bytes: int = 0
    pids: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _times: ClassVar[tuple] = ("at",)


@dataclass
class LifecycleEvent(Model):
    """One event of the event stream (GET /v1/events): what happened to a sandbox or a node."""

    id: str = ""
    at: Optional[_dt.datetime] = None
    type: str = ""
    sandbox: str = ""
    project: str = ""
    node: str = ""
    tier: str = ""
    reason: str = ""
    count: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _times: ClassVar[tuple] = ("at",)


@dataclass
class ServerInfo(Model):
    """What the server says about itself (GET /v1/info): version, node, runtimes, tiers."""

    version: str = ""
    node: str = ""
    runtime: str = ""
    runtimes: List[str] = field(default_factory=list)
    tiers: List[str] = field(default_factory=list)
    data_dir: str = ""
    sandboxes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class BlockedAttempt(Model):
    """One blocked egress attempt of a sandbox."""

    at: Optional[_dt.datetime] = None
    reason: str = ""
    name: str = ""
    dest: str = ""
    port: int = 0
    protocol: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    _times: ClassVar[tuple] = ("at",)


@dataclass
class NetworkService(Model):
    """A service of the operator's catalog that policy rules may name."""

    name: str = ""
    description: str = ""
    domains: List[str] = field(default_factory=list)
    addresses: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Node(Model):
    """A cluster node (edge)."""

    name: str = ""
    url: str = ""
    state: str = ""
    epoch: int = 0
    labels: Dict[str, str] = field(default_factory=dict)
    heartbeat_at: Optional[_dt.datetime] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class CodeResult:
    """One result of a code run: the value of its last expression (``is_main_result``) or
    something it displayed (a figure, a table), in each representation the kernel gave: ``text``,
    ``html``, ``markdown``, ``svg``, ``png`` and ``jpeg`` (base64), ``latex``, ``json``..."""

    text: str = ""
    html: str = ""
    markdown: str = ""
    svg: str = ""
    png: str = ""
    jpeg: str = ""
    pdf: str = ""
    latex: str = ""
    javascript: str = ""
    json: Any = None
    is_main_result: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CodeResult":
        names = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class CodeError:
    """The exception a code run ended with: ``name`` (``ZeroDivisionError``; ``TimeoutError``
    when its timeout interrupted the kernel; ``KernelDied`` when the kernel died and was
    replaced), ``value`` and ``traceback``."""

    name: str = ""
    value: str = ""
    traceback: str = ""


@dataclass
class Execution:
    """A finished code run (``Sandbox.run_code``): what it printed, its results, its error."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)
    results: List[CodeResult] = field(default_factory=list)
    error: Optional[CodeError] = None
    execution_count: int = 0

    @property
    def text(self) -> str:
        """The plain text of the main result ("" when there is none)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return ""

    @classmethod
    def from_events(cls, events: List[Mapping[str, Any]]) -> "Execution":
        ex = cls()
        for ev in events:
            t = ev.get("type")
            if t == "stdout":
                ex.stdout.append(ev.get("text", ""))
            elif t == "stderr":
                ex.stderr.append(ev.get("text", ""))
            elif t == "result":
                ex.results.append(CodeResult.from_json(ev))
            elif t == "error":
                ex.error = CodeError(ev.get("name", ""), ev.get("value", ""), ev.get("traceback", ""))
            elif t == "end":
                ex.execution_count = ev.get("execution_count", 0)
        return ex


@dataclass
class CodeContext:
    """A separate kernel of a sandbox's code-execution server."""

    id: str = ""
    language: str = ""
    cwd: str = ""
