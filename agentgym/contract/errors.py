"""Errors shared by environments, servers and clients.

Every error the wire API can return has one exception class here with its HTTP status
and machine-readable ``code``. Servers turn them into ``{"error": {"code", "message"}}``;
clients turn that body back into the same class, so callers catch one type whether the
environment runs in-process or behind HTTP.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import ClassVar


def did_you_mean(given: Iterable[str], choices: Iterable[str]) -> str:
    """`` (did you mean A, B?)`` for the choices nearest to the names ``given``; empty when
    none is near (a typo's hint in every "unknown X" message)."""
    choices = list(choices)
    near = sorted({m for name in given for m in difflib.get_close_matches(name, choices, n=3)})
    return f" (did you mean {', '.join(near)}?)" if near else ""


class AgentGymError(Exception):
    """Base class: ``status`` is the HTTP status, ``code`` the stable error code."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def to_body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidPayload(AgentGymError):
    """The request body is not a JSON object: malformed or not UTF-8, nested too deeply,
    a number too long to parse, or a value that is not an object."""

    status = 400
    code = "invalid_payload"


class InvalidPath(AgentGymError):
    """The request path holds a dot segment or an encoded separator (``%2F``): refused by
    the gateway before routing, so no path resolves past the one asked for."""

    status = 400
    code = "invalid_path"


class InvalidAction(AgentGymError):
    """The action breaks the env's input rules (empty, too long, a control character, a lone
    surrogate, a character its engine cannot take) or the env cannot parse it. The session is
    unchanged: the turn did not happen."""

    status = 400
    code = "invalid_action"


class UnknownSession(AgentGymError):
    """No such session: never created, deleted, expired after its idle TTL, or closed by an engine failure."""

    status = 404
    code = "session_not_found"


class UnknownTask(AgentGymError):
    """No such task id, split, or index within the split."""

    status = 404
    code = "task_not_found"


class UnknownEnv(AgentGymError):
    """No environment registered under that name."""

    status = 404
    code = "env_not_found"


class NotFound(AgentGymError):
    """A route that does not exist."""

    status = 404
    code = "not_found"


class MethodNotAllowed(AgentGymError):
    """The route exists but not with this HTTP method."""

    status = 405
    code = "method_not_allowed"


class EpisodeOver(AgentGymError):
    """``step`` was called after the episode terminated or was truncated; reset first."""

    status = 409
    code = "episode_over"


class PayloadTooLarge(AgentGymError):
    """The request body exceeds the server's ``--max-body-bytes``."""

    status = 413
    code = "payload_too_large"


class RequestTimeout(AgentGymError):
    """The request did not arrive in time: its head or its body stalled, or the body was
    shorter than its ``Content-Length`` (``ServerConfig.request_timeout``)."""

    status = 408
    code = "request_timeout"


class SchemaError(AgentGymError):
    """Fields, or reset options such as ``options.max_turns``, are missing, of the wrong type,
    out of range, or not allowed."""

    status = 422
    code = "validation_error"


class AtCapacity(AgentGymError):
    """The server holds its maximum number of sessions, or the client its quota
    (``ServerConfig.max_sessions_per_client``); retry after ``retry_after`` s."""

    status = 429
    code = "at_capacity"


class HeadersTooLarge(AgentGymError):
    """The request's head (request line and header fields) exceeds the server's limits
    (``ServerConfig.max_header_bytes`` or ``max_header_fields``)."""

    status = 431
    code = "headers_too_large"


class Unauthorized(AgentGymError):
    """The server requires a bearer token and the request lacked the right one."""

    status = 401
    code = "unauthorized"


class EngineError(AgentGymError):
    """The environment engine failed; the session that hit it is closed."""

    status = 503
    code = "engine_failed"


ERRORS_BY_CODE: dict[str, type[AgentGymError]] = {
    cls.code: cls for cls in AgentGymError.__subclasses__() if cls.__module__ == __name__
}
"""Every error a server sends, by its ``code`` (each class above)."""


def error_from_body(status: int, body: object, retry_after: float | None = None) -> AgentGymError:
    """Rebuild the exception a server sent (used by the clients)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code") in ERRORS_BY_CODE:
        return ERRORS_BY_CODE[error["code"]](str(error.get("message", "")), retry_after=retry_after)
    exc = AgentGymError(f"HTTP {status}: {body!r}"[:500], retry_after=retry_after)
    exc.status = status  # type: ignore[misc]  # keep the real status on the generic error
    return exc


class UsageError(ValueError):
    """A bad argument of the Python API or the CLI (unknown policy, unreachable or wrong
    server, ...), found before any engine sees it: the CLI exits 2."""
