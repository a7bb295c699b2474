"""The checks ``agentgym check-env`` runs (:mod:`agentgym.conformance.runner` runs them), in order.

Each check is a function of the run's state registered with :func:`check`; it returns a
summary of what it saw or raises :class:`CheckFailed` saying how the server broke wire API
v1 (docs/api.md) or the AgentGym-compatible routes.
"""

from __future__ import annotations

import contextlib
import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

TIMEOUT_S = 120.0
"""Per request: creating a session may build a game or start a JVM."""
FALLBACK_ACTION = "look"
"""Played when the server offers neither an expert action nor a list of valid actions."""
REWARD_TOLERANCE = 1e-6


class CheckFailed(Exception):
    """Raised inside a check: the server broke the contract in the way the message says."""


def require(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


# ----- shared state and the check registry -----------------------------------------


@dataclass
class CheckRun:
    """What one checker run has learned so far, plus the sessions it must close."""

    http: httpx.Client
    token: str | None
    requested_task: str | None
    task_id: str = ""
    """The task being played, once ``create session`` chose it."""
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    first_info: dict[str, Any] = field(default_factory=dict)
    open_sessions: list[str] = field(default_factory=list)
    compat_id: int | None = None

    def create_session(self, body: dict[str, Any]) -> httpx.Response:
        """POST /sessions, remembering any session the server opened (even by mistake)."""
        response = self.http.post("/sessions", json=body)
        with contextlib.suppress(ValueError, AttributeError):
            session_id = response.json().get("session_id")
            if response.is_success and isinstance(session_id, str):
                self.open_sessions.append(session_id)
        return response

    def close_all(self) -> None:
        """Best effort: the run is over, a failure to clean up must not hide the report."""
        for session_id in self.open_sessions:
            with contextlib.suppress(httpx.HTTPError):
                self.http.delete(f"/sessions/{session_id}")
        if self.compat_id is not None:
            with contextlib.suppress(httpx.HTTPError):
                self.http.post("/close", json=_compat_body(self.compat_id))


CheckFn = Callable[[CheckRun], str]


@dataclass(frozen=True)
class Check:
    name: str
    run: CheckFn
    needs: tuple[str, ...]
    applies: Callable[[CheckRun], bool]


CHECKS: list[Check] = []


def check(
    name: str, *, needs: tuple[str, ...] = (), applies: Callable[[CheckRun], bool] = lambda _: True
) -> Callable[[CheckFn], CheckFn]:
    """Register a check; checks run in registration order, so ``needs`` point backwards."""

    def add(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(name, fn, needs, applies))
        return fn

    return add


# ----- reading replies -------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _snippet(response: httpx.Response) -> str:
    return response.text[:200].replace("\n", " ")


def _json(response: httpx.Response, status: int = 200) -> Any:
    """The JSON body of a reply that must have ``status``."""
    require(
        response.status_code == status,
        f"{response.request.method} {response.request.url.path}: expected HTTP {status}, "
        f"got {response.status_code}: {_snippet(response)}",
    )
    try:
        return response.json()
    except ValueError:
        raise CheckFailed(f"{response.request.url.path}: body is not JSON: {_snippet(response)}") from None


def _object(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    body = _json(response, status)
    require(isinstance(body, dict), f"{response.request.url.path}: expected a JSON object, got {body!r:.200}")
    return body


def _fields(body: dict[str, Any], where: str, **kinds: Callable[[object], bool]) -> None:
    """Require each named field to be present and to satisfy its type predicate."""
    for key, ok in kinds.items():
        require(key in body, f"{where}: field {key!r} is missing")
        require(ok(body[key]), f"{where}: field {key!r} has the wrong type: {body[key]!r:.100}")


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)


def _error(response: httpx.Response, status: int, code: str | None = None) -> str:
    """Require an error reply: ``status`` and a ``{"error": {"code", "message"}}`` body."""
    body = _object(response, status)
    error = body.get("error")
    require(isinstance(error, dict), f"error body lacks an 'error' object: {body!r:.200}")
    _fields(error, "error body", code=_is_str, message=_is_str)
    if code is not None:
        require(error["code"] == code, f"expected error code {code!r}, got {error['code']!r}")
    return f"{status} {error['code']}"


def _check_info(info: object, where: str, task_id: str, turn: int) -> dict[str, Any]:
    if not isinstance(info, dict):
        raise CheckFailed(f"{where}: info is not an object")
    _fields(info, f"{where} info", task_id=_is_str, turn=_is_int, score=_is_number, success=_is_bool)
    require(info["task_id"] == task_id, f"{where}: info.task_id is {info['task_id']!r}, expected {task_id!r}")
    require(info["turn"] == turn, f"{where}: info.turn is {info['turn']}, expected {turn}")
    require(0.0 <= info["score"] <= 1.0, f"{where}: info.score {info['score']} is outside [0, 1]")
    return info


def _compat_body(compat_id: int | None, **extra: Any) -> dict[str, Any]:
    # AgentGym's servers name the id `id` (SciWorld) or `env_idx` (WebShop); send both.
    return {"id": compat_id, "env_idx": compat_id, **extra}


# ----- the checks: service ---------------------------------------------------------


@check("health")
def check_health(run: CheckRun) -> str:
    body = _object(run.http.get("/health"))
    _fields(body, "/health", status=_is_str, env=_is_str, sessions=_is_int, capacity=_is_int)
    require(body["sessions"] >= 0 and body["capacity"] >= 1, f"/health: nonsense counts {body!r:.200}")
    return f"env {body['env']!r}, status {body['status']!r}, {body['sessions']}/{body['capacity']} sessions"


@check("auth", applies=lambda run: bool(run.token))
def check_auth(run: CheckRun) -> str:
    response = httpx.get(f"{run.http.base_url}/metadata", timeout=TIMEOUT_S)
    return "without the token: " + _error(response, 401, "unauthorized")


@check("metadata")
def check_metadata(run: CheckRun) -> str:
    body = _object(run.http.get("/metadata"))
    texts = dict.fromkeys(("name", "version", "description", "instruction", "action_format"), _is_str)
    _fields(body, "/metadata", **texts, splits=_is_dict, max_turns=_is_int, reward_range=_is_pair)
    splits = body["splits"]
    require(splits, "/metadata: splits is empty")
    require(all(_is_int(n) and n >= 0 for n in splits.values()), f"/metadata: split sizes {splits!r}")
    require(body["max_turns"] >= 1, f"/metadata: max_turns is {body['max_turns']}")
    low, high = body["reward_range"]
    require(low <= high, f"/metadata: reward_range {body['reward_range']} is inverted")
    run.metadata = body
    return f"{body['name']} {body['version']}: splits {splits}, max_turns {body['max_turns']}"


def _is_pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_is_number(v) for v in value)


def _tasks(run: CheckRun, **params: Any) -> dict[str, Any]:
    body = _object(run.http.get("/tasks", params=params))
    _fields(body, "/tasks", tasks=lambda v: isinstance(v, list), total=_is_int)
    for task in body["tasks"]:
        require(isinstance(task, dict), f"/tasks: entry {task!r:.100} is not an object")
        _fields(task, "/tasks entry", task_id=_is_str, split=_is_str)
    return body


@check("tasks: paging", needs=("metadata",))
def check_tasks_paging(run: CheckRun) -> str:
    expected = sum(run.metadata["splits"].values())
    first = _tasks(run, offset=0, limit=2)
    require(first["total"] == expected, f"total {first['total']} != sum of split sizes {expected}")
    require(len(first["tasks"]) == min(2, expected), f"limit=2 returned {len(first['tasks'])} tasks")
    if expected >= 2:
        second = _tasks(run, offset=1, limit=1)["tasks"]
        require(
            [t["task_id"] for t in second] == [first["tasks"][1]["task_id"]],
            "offset=1&limit=1 does not return the second task of offset=0&limit=2",
        )
    past_end = _tasks(run, offset=expected, limit=1)
    require(past_end["tasks"] == [], f"offset={expected} (past the end) returned tasks")
    require(past_end["total"] == expected, "total changes with offset")
    return f"{expected} tasks; limit/offset consistent"


@check("tasks: split filter", needs=("metadata",))
def check_tasks_split(run: CheckRun) -> str:
    for split, size in run.metadata["splits"].items():
        body = _tasks(run, split=split, offset=0, limit=3)
        require(body["total"] == size, f"split={split}: total {body['total']} != /metadata size {size}")
        require(
            all(task["split"] == split for task in body["tasks"]),
            f"split={split}: the listing contains tasks of other splits",
        )
    return f"{len(run.metadata['splits'])} splits filter correctly"


@check("openapi.json")
def check_openapi(run: CheckRun) -> str:
    body = _object(run.http.get("/openapi.json"))
    _fields(body, "/openapi.json", openapi=_is_str, paths=_is_dict)
    require("/sessions" in body["paths"], "/openapi.json does not describe /sessions")
    return f"OpenAPI {body['openapi']}, {len(body['paths'])} paths"


@check("metrics")
def check_metrics(run: CheckRun) -> str:
    response = run.http.get("/metrics")
    require(response.status_code == 200, f"/metrics: HTTP {response.status_code}")
    content_type = response.headers.get("content-type", "")
    require(content_type.startswith("text/plain"), f"/metrics: content-type {content_type!r}")
    try:
        families = list(text_string_to_metric_families(response.text))
    except Exception as exc:  # the parser raises plain ValueError/KeyError/IndexError alike
        raise CheckFailed(f"/metrics is not Prometheus text: {exc}") from None
    require(families, "/metrics exposes no metrics")
    return f"{len(families)} metric families"


# ----- the checks: one episode -----------------------------------------------------


def _default_task(run: CheckRun) -> str:
    split = "test" if "test" in run.metadata["splits"] else next(iter(run.metadata["splits"]))
    tasks = _tasks(run, split=split, offset=0, limit=1)["tasks"]
    require(tasks, f"split {split!r} lists no tasks to play")
    return tasks[0]["task_id"]


@check("create session", needs=("metadata",))
def check_create(run: CheckRun) -> str:
    run.task_id = run.requested_task or _default_task(run)
    body = _object(run.create_session({"task_id": run.task_id}), 201)
    _fields(body, "POST /sessions", session_id=_is_str, observation=_is_str)
    require(body["observation"].strip(), "POST /sessions: the first observation is empty")
    run.first_info = _check_info(body.get("info"), "POST /sessions", run.task_id, turn=0)
    run.session_id = body["session_id"]
    return f"session on task {run.task_id!r}"


@check("session state", needs=("create session",))
def check_state(run: CheckRun) -> str:
    body = _object(run.http.get(f"/sessions/{run.session_id}"))
    _fields(body, "GET /sessions/{id}", session_id=_is_str, turn=_is_int, done=_is_bool, observation=_is_str)
    require(body["session_id"] == run.session_id, "GET /sessions/{id}: another session_id")
    require(body.get("task_id") == run.task_id, f"GET /sessions/{{id}}: task_id {body.get('task_id')!r}")
    require(body["turn"] == 0 and not body["done"], "a fresh session is not at turn 0 and running")
    return "turn 0, not done"


def _next_action(info: dict[str, Any], rng: random.Random) -> str:
    """The expert's move where offered, else a valid action, else a fixed one."""
    if isinstance(info.get("expert_action"), str):
        return info["expert_action"]
    actions = info.get("available_actions")
    if isinstance(actions, list) and actions and all(isinstance(a, str) for a in actions):
        return rng.choice(actions)
    return FALLBACK_ACTION


def _step(run: CheckRun, action: str, turn: int) -> dict[str, Any]:
    """One step of the checked session, its reply validated field by field."""
    where = f"step {turn}"
    body = _object(run.http.post(f"/sessions/{run.session_id}/step", json={"action": action}))
    _fields(body, where, observation=_is_str, reward=_is_number, terminated=_is_bool, truncated=_is_bool)
    _check_info(body.get("info"), where, run.task_id, turn)
    low, high = run.metadata["reward_range"]
    require(
        low - REWARD_TOLERANCE <= body["reward"] <= high + REWARD_TOLERANCE,
        f"{where}: reward {body['reward']} is outside reward_range [{low}, {high}]",
    )
    return body


@check("episode", needs=("create session",))
def check_episode(run: CheckRun) -> str:
    """Play to the end within max_turns; following the expert must end in success."""
    max_turns = run.metadata["max_turns"]
    expert = isinstance(run.first_info.get("expert_action"), str)
    info, rng, total = run.first_info, random.Random(0), 0.0
    for turn in range(1, max_turns + 1):
        body = _step(run, _next_action(info, rng), turn)
        info, total = body["info"], total + body["reward"]
        if body["terminated"] or body["truncated"]:
            break
    else:
        raise CheckFailed(f"neither terminated nor truncated after max_turns={max_turns} steps")
    end = "terminated" if body["terminated"] else "truncated"
    if expert:
        require(body["terminated"], f"following info.expert_action, the episode was {end}")
        require(info["success"] is True, "following info.expert_action, info.success is false at the end")
    policy = "expert" if expert else "scripted"
    return f"{policy} episode {end} after {turn} turns, return {total:.3g}, success {info['success']}"


@check("step after end", needs=("episode",))
def check_step_after_end(run: CheckRun) -> str:
    response = run.http.post(f"/sessions/{run.session_id}/step", json={"action": FALLBACK_ACTION})
    return _error(response, 409, "episode_over")


@check("reset session", needs=("create session",))
def check_reset(run: CheckRun) -> str:
    response = run.http.post(f"/sessions/{run.session_id}/reset", json={"task_id": run.task_id})
    body = _object(response)
    _fields(body, "reset", observation=_is_str)
    require(body["observation"].strip(), "reset: the first observation is empty")
    _check_info(body.get("info"), "reset", run.task_id, turn=0)
    state = _object(run.http.get(f"/sessions/{run.session_id}"))
    require(
        state.get("turn") == 0 and state.get("done") is False, "after reset the state is not turn 0, running"
    )
    return "back at turn 0"


# ----- the checks: errors ----------------------------------------------------------


@check("errors: unknown session")
def check_unknown_session(run: CheckRun) -> str:
    bogus = f"agentgym-check-{uuid.uuid4().hex}"
    _error(run.http.get(f"/sessions/{bogus}"), 404, "session_not_found")
    step = run.http.post(f"/sessions/{bogus}/step", json={"action": FALLBACK_ACTION})
    return "GET and step: " + _error(step, 404, "session_not_found")


def _step_raw(run: CheckRun, **request: Any) -> httpx.Response:
    return run.http.post(f"/sessions/{run.session_id}/step", **request)


@check("errors: malformed JSON", needs=("create session",))
def check_malformed_json(run: CheckRun) -> str:
    headers = {"content-type": "application/json"}
    return _error(_step_raw(run, content=b'{"action": ', headers=headers), 400)


@check("errors: missing field", needs=("create session",))
def check_missing_field(run: CheckRun) -> str:
    return _error(_step_raw(run, json={}), 422)


@check("errors: mistyped action", needs=("create session",))
def check_mistyped_action(run: CheckRun) -> str:
    return _error(_step_raw(run, json={"action": 5}), 422)


@check("errors: unknown task")
def check_unknown_task(run: CheckRun) -> str:
    response = run.create_session({"task_id": f"agentgym-check-no-such-task-{uuid.uuid4().hex}"})
    return _error(response, 404, "task_not_found")


@check("delete session", needs=("create session",))
def check_delete(run: CheckRun) -> str:
    response = run.http.delete(f"/sessions/{run.session_id}")
    require(response.status_code == 204, f"DELETE: expected 204, got {response.status_code}")
    run.open_sessions.remove(str(run.session_id))
    _error(run.http.get(f"/sessions/{run.session_id}"), 404, "session_not_found")
    return "204, then GET: 404 session_not_found"


# ----- the checks: AgentGym-compatible routes --------------------------------------


@check("compat: create")
def check_compat_create(run: CheckRun) -> str:
    body = _json(run.http.post("/create"))
    compat_id = body.get("id") if isinstance(body, dict) else body
    require(_is_int(compat_id), f"/create: expected {{'id': N}} or a bare integer, got {body!r:.100}")
    run.compat_id = compat_id
    return f"id {compat_id}"


@check("compat: reset", needs=("compat: create",))
def check_compat_reset(run: CheckRun) -> str:
    body = _json(run.http.post("/reset", json=_compat_body(run.compat_id, data_idx=0)))
    require(isinstance(body, dict | list), f"/reset: unexpected reply {body!r:.100}")
    return "data_idx 0"


@check("compat: observation", needs=("compat: reset",))
def check_compat_observation(run: CheckRun) -> str:
    body = _json(run.http.get("/observation", params=_compat_body(run.compat_id)))
    require(
        isinstance(body, str) and body.strip(),
        f"/observation: expected a non-empty string, got {body!r:.100}",
    )
    return f"{len(body)} characters"


@check("compat: available_actions", needs=("compat: reset",))
def check_compat_actions(run: CheckRun) -> str:
    body = _json(run.http.get("/available_actions", params=_compat_body(run.compat_id)))
    actions = body.get("clickables") if isinstance(body, dict) else body  # WebShop's dialect
    require(
        isinstance(actions, list) and all(isinstance(a, str) for a in actions),
        f"/available_actions: expected a list of strings (or WebShop's clickables), got {body!r:.100}",
    )
    return f"{len(actions)} actions"


@check("compat: step", needs=("compat: reset",))
def check_compat_step(run: CheckRun) -> str:
    body = _json(run.http.post("/step", json=_compat_body(run.compat_id, action=FALLBACK_ACTION)))
    require(isinstance(body, dict | list), f"/step: unexpected reply {body!r:.100}")
    return f"action {FALLBACK_ACTION!r} accepted"


@check("compat: close", needs=("compat: create",))
def check_compat_close(run: CheckRun) -> str:
    _json(run.http.post("/close", json=_compat_body(run.compat_id)))
    run.compat_id = None
    return "closed"
