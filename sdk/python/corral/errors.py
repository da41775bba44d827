"""Errors raised by the Corral client.

Every failure the server reports is an :class:`APIError` (or one of its subclasses, chosen by the
error's ``code``); a server that cannot be reached is a :class:`TransportError`; a stream the
server ended with an error is a :class:`StreamError`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = [
    "CorralError",
    "TransportError",
    "StreamError",
    "APIError",
    "InvalidRequest",
    "PayloadTooLarge",
    "Unauthorized",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "QuotaExceeded",
    "Unavailable",
    "ServerError",
]


class CorralError(Exception):
    """Base class of every error this package raises."""


class TransportError(CorralError):
    """The server could not be reached, or the connection broke before an answer came.

    Calls that are safe to repeat have already been retried (see :class:`RetryPolicy`) when
    this is raised.
    """


class StreamError(CorralError):
    """An output or watch stream ended abnormally: the server reported an error in it, or it
    ended before the command exited."""


class APIError(CorralError):
    """A failure reported by the server: an HTTP status of 400 or above with Corral's JSON error.

    Attributes:
        status: the HTTP status code.
        code: the machine-readable kind ("not_found", "invalid", "exhausted", ...); derived from
            the status when the body was not a Corral error.
        message: what went wrong, meant for a person.
        field: the request field that was invalid, when one is named.
        quota: for a quota refusal, the limit that refused it (project, resource, limit, usage,
            request), else None.
        permission: for a denial, the permission the caller lacks, else "".
        retry_after: seconds from the Retry-After header, when the server sent one.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str = "",
        quota: Optional[Dict[str, Any]] = None,
        permission: str = "",
        retry_after: Optional[float] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.quota = quota
        self.permission = permission
        self.retry_after = retry_after
        super().__init__(self._text())

    def _text(self) -> str:
        msg = self.message or "HTTP %d" % self.status
        if self.field and not msg.startswith(self.field + ":"):
            msg = "%s (field %r)" % (msg, self.field)
        return msg

    def __repr__(self) -> str:
        return "%s(status=%d, code=%r, message=%r, field=%r)" % (
            type(self).__name__, self.status, self.code, self.message, self.field)


class InvalidRequest(APIError):
    """The request was malformed (code "invalid", 400); ``field`` says which field, when known."""


class PayloadTooLarge(InvalidRequest):
    """The request body, or a file in it, was over a server limit (code "too_large", 413)."""


class Unauthorized(APIError):
    """The token was missing, wrong, expired or revoked (code "unauthorized", 401)."""


class PermissionDenied(APIError):
    """The token may not do this (code "denied", 403); ``permission`` names what is lacking."""


class NotFound(APIError):
    """The object does not exist, or the caller may not see it (code "not_found", 404)."""


class Conflict(APIError):
    """The request conflicts with the current state (code "conflict", 409): a sandbox that is not
    running, a layer version published with other content, an idempotency key or step_id reused
    for another request."""


class QuotaExceeded(APIError):
    """A quota or capacity is used up (code "exhausted", 429); ``quota`` names the limit when a
    project quota refused it."""


class Unavailable(APIError):
    """The server cannot serve the request now (code "unavailable", 503); retrying later may
    succeed."""


class ServerError(APIError):
    """The server failed (code "internal", 5xx)."""


_BY_CODE = {
    "invalid": InvalidRequest,
    "too_large": PayloadTooLarge,
    "unauthorized": Unauthorized,
    "denied": PermissionDenied,
    "not_found": NotFound,
    "conflict": Conflict,
    "exhausted": QuotaExceeded,
    "unavailable": Unavailable,
    "internal": ServerError,
}

_BY_STATUS = {
    400: "invalid",
    401: "unauthorized",
    403: "denied",
    404: "not_found",
    409: "conflict",
    413: "too_large",
    429: "exhausted",
    503: "unavailable",
}


def code_for_status(status: int) -> str:
    """Return the error code an HTTP status stands for, for a failure without a Corral body."""
    return _BY_STATUS.get(status, "internal")


def error_class(code: str) -> type:
    """Return the APIError subclass raised for an error code (APIError itself for unknown ones)."""
    return _BY_CODE.get(code, APIError)
