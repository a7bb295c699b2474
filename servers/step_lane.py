"""A short path for the hot request, ``POST /sessions/{id}/step`` with a plain ``{"action":
"..."}`` body: the same checks and the same answer as the FastAPI route, without FastAPI's
per-request machinery. :class:`~agentgym.servers.app.EnvServerApp` hands such a request to
the lane before FastAPI's middleware stack (error and telemetry wrappers, then ours), behind
only the guards of :func:`~agentgym.servers.middleware.guards` (bearer token, body size).
The route's dependency solving and body validation cost about a third of the server's CPU
per step, and the middleware stack about a fifth of what was left (bench/RESULTS.md, issue
18); on 2 cores that CPU is taken from the engines.

Any other step request (another content type, a body that is not exactly one string
``action``, JSON the parser refuses) goes on, body and all, to the whole app, so every
error and its code stay the route's. The route stays the one in the OpenAPI document, and
the lane counts its requests in the route's metrics.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym.contract.errors import AgentGymError
from agentgym.servers.metrics import ServerMetrics
from agentgym.servers.middleware import error_response, replay, unexpected_error_response

STEP_PATH = re.compile(r"/sessions/([^/]+)/step")
JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8"})

Step = Callable[[str, object], Awaitable[dict[str, Any]]]
"""(session id, action as sent) -> the step result; raises AgentGymError."""


def is_json_step(scope: Scope) -> bool:
    """Whether a request is a JSON ``POST`` to a session's step route: the lane's to answer
    (it can still hand the request on, once it has read the body)."""
    return (
        scope["type"] == "http"
        and scope["method"] == "POST"
        and STEP_PATH.fullmatch(scope["path"]) is not None
        and dict(scope["headers"]).get(b"content-type", b"").lower() in JSON_TYPES
    )


class StepLane:
    """Pure ASGI app for the requests :func:`is_json_step` accepts. ``step`` is the route's own
    body (validation, session lookup, play), ``route_path`` the route's template (the
    metrics label), ``app`` what answers every body the lane does not take."""

    def __init__(
        self, app: ASGIApp, step: Step, route_path: str, result_type: type, metrics: ServerMetrics
    ) -> None:
        self.app = app
        self.step = step
        self.route_path = route_path
        self.result = TypeAdapter(result_type)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        action = plain_action(message)
        if action is None:
            await self.app(scope, replay(message, receive), send)
            return
        start, status = time.perf_counter(), 500
        try:
            response = await self._answer(STEP_PATH.fullmatch(scope["path"])[1], action)
            status = response.status_code
            await response(scope, receive, send)
        finally:
            self.metrics.observe(self.route_path, "POST", status, time.perf_counter() - start)

    async def _answer(self, session_id: str, action: str) -> Response:
        try:
            result = self.result.validate_python(await self.step(session_id, action))
            return Response(self.result.dump_json(result), media_type="application/json")
        except AgentGymError as exc:
            return error_response(exc)
        except Exception as exc:  # what the route's catch-all handler answers
            return unexpected_error_response(exc)


def plain_action(message: Message) -> object | None:
    """The ``action`` of a whole body that is exactly ``{"action": <string>}``, else None."""
    if message["type"] != "http.request" or message.get("more_body", False):
        return None
    try:
        body = json.loads(message.get("body", b""))
    except (ValueError, RecursionError):
        return None
    if type(body) is dict and len(body) == 1 and type(body.get("action")) is str:
        return body["action"]
    return None
