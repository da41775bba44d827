"""Corral's Python SDK: sandboxes for AI agents, from sync code and from asyncio.

Quick start::

    import corral

    c = corral.Corral()                      # $CORRAL_URL, $CORRAL_TOKEN, as the CLI
    with c.create(base="python:3.12", ttl="10m") as sb:
        r = sb.exec(["python3", "-c", "print(6*7)"])
        print(r.exit_code, r.stdout)

    async with corral.AsyncCorral() as ac:
        sb = await ac.create(base="python:3.12")
        r = await sb.exec(["echo", "hi"])

Errors are :class:`APIError` subclasses (:class:`NotFound`, :class:`Conflict`,
:class:`QuotaExceeded`, ...); see :mod:`corral.errors`.
"""

from __future__ import annotations

from ._core import DEFAULT_URL, RetryPolicy, resolve
from .aio import AsyncCorral, AsyncEventStream, AsyncExecStream, AsyncSandbox, AsyncWatchStream
from .client import Corral, EventStream, ExecStream, Sandbox, WatchStream
from .errors import (APIError, Conflict, CorralError, InvalidRequest, NotFound, PayloadTooLarge,
                     PermissionDenied, QuotaExceeded, ServerError, StreamError, TransportError,
                     Unauthorized, Unavailable)
from .models import (AuditEntry, BlockedAttempt, CallResult, CodeContext, CodeError, CodeResult,
                     Command, CommandFailed, Environment, Execution,
                     Event, ExecResult, Exit, FileInfo, FncallEnv, Grant, Layer, LifecycleEvent,
                     Limits, MetricSample,
                     NetworkPolicy, NetworkService, Node, Principal, Project, ProjectQuota,
                     SandboxInfo, ServerInfo, Token, TrajectoryEntry, Volume, VolumeAttachment,
                     VolumeMount, WatchEvent, Whoami, e2b_key)

__version__ = "0.1.0"

__all__ = [
    "Corral", "Sandbox", "ExecStream", "WatchStream", "EventStream",
    "AsyncCorral", "AsyncSandbox", "AsyncExecStream", "AsyncWatchStream", "AsyncEventStream",
    "RetryPolicy", "resolve", "DEFAULT_URL",
    "CorralError", "APIError", "TransportError", "StreamError", "InvalidRequest",
    "PayloadTooLarge", "Unauthorized", "PermissionDenied", "NotFound", "Conflict",
    "QuotaExceeded", "Unavailable", "ServerError", "CommandFailed",
    "AuditEntry", "BlockedAttempt", "CallResult", "Command", "Environment", "Event",
    "CodeContext", "CodeError", "CodeResult", "Execution",
    "LifecycleEvent", "MetricSample",
    "ExecResult", "Exit", "FileInfo", "FncallEnv", "Grant", "Layer", "Limits", "NetworkPolicy",
    "NetworkService", "Node", "Principal", "Project", "ProjectQuota", "SandboxInfo",
    "ServerInfo", "Token", "TrajectoryEntry", "Volume", "VolumeAttachment", "VolumeMount",
    "WatchEvent", "Whoami", "e2b_key",
]
