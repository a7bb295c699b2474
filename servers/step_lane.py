"""A short path for the hot request, ``POST /sessions/{id}/step`` with a plain ``{"action":
"..."}`` body: the same checks and the same answer as the FastAPI route, without FastAPI's
per-request machinery (dependency solving, body validation, exception middleware), which
cost about a third of the server's CPU per step (bench/RESULTS.md, issue 18). On 2 cores
that CPU is taken from the engines.

Any other step request (another content type, a body that is not exactly one string
``action``, JSON the parser refuses) goes on to the route, so every error and its code stay
the route's. The route stays the one in the OpenAPI document.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym.errors import AgentGymError
from agentgym.servers.middleware import error_response, replay, unexpected_error_response

STEP_PATH = re.compile(r"/sessions/([^/]+)/step")
JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8"})

Step = Callable[[str, object], Awaitable[dict[str, Any]]]
"""(session id, action as sent) -> the step result; raises AgentGymError."""


class StepLane:
    """Pure ASGI middleware; ``step`` is the route's own body (validation, session lookup,
    play), ``route`` the route it stands in for (metrics label requests by its path)."""

    def __init__(self, app: ASGIApp, step: Step, route: BaseRoute, result_type: type) -> None:
        self.app = app
        self.step = step
        self.route = route
        self.result = TypeAdapter(result_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = (
            STEP_PATH.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if matched is None or dict(scope["headers"]).get(b"content-type", b"").lower() not in JSON_TYPES:
            await self.app(scope, receive, send)
            return
        message = await receive()
        action = plain_action(message)
        if action is None:
            await self.app(scope, replay(message, receive), send)
            return
        scope["route"] = self.route
        try:
            result = self.result.validate_python(await self.step(matched[1], action))
            response = Response(self.result.dump_json(result), media_type="application/json")
        except AgentGymError as exc:
            response = error_response(exc)
        except Exception as exc:  # what the route's catch-all handler answers
            response = unexpected_error_response(exc)
        await response(scope, receive, send)


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
