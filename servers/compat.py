"""AgentGym-compatible routes, so AgentGym's own clients work unchanged.

AgentGym runs one server per environment and they differ; an env declares the dialect of
AgentGym's server for it as its class attribute ``compat_dialect`` (an
``agentgym.contract.dialects.Dialect`` kept in the env's folder; the map of what each answers is in
``docs/environments.md``). Rules of every dialect:

* A request names its session by ``env_idx`` or ``id``. When it carries both,
  ``env_idx`` names the session: AgentGym's SearchQA client sends its task index as
  ``id`` beside it. (The gateway reads the same field.)
* That integer is ``/create``'s answer: random in [1, 2^53), never counted, so no client
  can reach another's session by trying ids, nor by keeping one across a restart. It names
  only sessions created by ``/create``: a v1, OpenEnv or ``/ws`` session has none, and an
  unknown or stale id is 404 ``session_not_found``.
* ``/reset``'s task index is read from the field AgentGym's server reads for that env
  (``Dialect.task_field``) and numbered as it numbers tasks: the env's own
  ``compat_task_id(index) -> task_id`` when it has one, else ``Dialect.task_order``.
* ``data_idx`` is also our own extension (webshop, search, envs AgentGym never had): it
  numbers all tasks split after split in ``/metadata`` order, and its ``/reset`` answers
  our reset object. A webshop or search ``/reset`` with ``env_idx`` and no ``data_idx``
  is AgentGym's request and gets AgentGym's answer (``Dialect.native_reset``).
* An env may add or override fields of the ``/reset`` and ``/step`` objects with
  ``compat_fields(route) -> dict`` (e.g. SciWorld's 0-100 score).
"""

from __future__ import annotations

from typing import Any, Self

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from agentgym.contract.core import Task, TextEnv
from agentgym.contract.dialects import GENERIC, Dialect
from agentgym.contract.errors import SchemaError, UnknownTask
from agentgym.servers.middleware import ClientOf
from agentgym.servers.sessions import Session, SessionManager


class _CompatBody(BaseModel):
    model_config = ConfigDict(extra="ignore")  # AgentGym clients send extra keys freely
    id: int | None = None
    env_idx: int | None = None

    @model_validator(mode="after")
    def _names_a_session(self) -> Self:
        if self.id is None and self.env_idx is None:
            raise ValueError("'env_idx' (or 'id') is required")
        return self

    @property
    def session(self) -> int:
        """The session's integer id: ``env_idx`` when given, else ``id``."""
        return _either(self.id, self.env_idx)


class CompatStep(_CompatBody):
    action: StrictStr


class CompatReset(_CompatBody):
    data_idx: int | None = Field(None, ge=0)
    session_id: int | None = Field(None, ge=0)
    """AgentGym's WebShop: the goal index."""


class CompatCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int | None = Field(None, ge=0)
    """AgentGym's SearchQA: the item to load."""


def compat_router(catalog: TextEnv, sessions: SessionManager, client_of: ClientOf) -> APIRouter:
    router = APIRouter(tags=["agentgym-compat"])
    dialect: Dialect = getattr(catalog, "compat_dialect", GENERIC)

    def session_for(compat_id: int) -> Session:
        return sessions.get_compat(compat_id)

    async def start(session: Session, task_id: str | None) -> tuple[str, dict[str, Any]]:
        return await sessions.call(session, "reset", task_id=task_id, deadline=sessions.reset_deadline)

    def agentgym_task(index: int) -> Task:
        """Task number ``index`` as AgentGym's server of this env numbers them."""
        if hasattr(catalog, "compat_task_id"):
            return catalog.task(catalog.compat_task_id(index))
        return _task_by_number(catalog, index, dialect.task_order or tuple(catalog.splits()))

    def task_to_create(body: CompatCreate | None) -> Task | None:
        """The task ``/create`` loads: the body's ``{"id": k}``, else task 0 where AgentGym's
        server starts an episode at once, else none."""
        if dialect.create_loads_task and body and body.id is not None:
            return agentgym_task(body.id)
        return agentgym_task(0) if dialect.create_starts else None

    @router.post("/create")
    async def create(request: Request, body: CompatCreate | None = None) -> Any:
        """Open a session; its integer id (random in [1, 2^53)) names only this session.
        Where AgentGym's server of this env starts an episode at ``/create``, task 0 (or
        ``{"id": k}``: AgentGym's item ``k``) is loaded into it."""
        task = task_to_create(body)
        session = await sessions.open(client=client_of(request.scope), compat=True)
        observation = ""
        if task is not None:
            try:
                observation, _ = await start(session, task.task_id)
            except Exception:
                await sessions.close(session.session_id)
                raise
        if dialect.create_starts:
            return dialect.create_starts(session.compat_id, observation)
        return dialect.create(session.compat_id)

    @router.post("/reset")
    async def reset(body: CompatReset) -> Any:
        """Start a task in session ``env_idx`` (or ``id``): AgentGym's task index, or our
        ``data_idx`` (all splits in /metadata order)."""
        session = session_for(body.session)
        if dialect.native_reset and body.env_idx is not None and body.data_idx is None:
            index = getattr(body, dialect.task_field)
            observation, _ = await start(session, None if index is None else agentgym_task(index).task_id)
            return dialect.native_reset(observation)
        data_idx = body.data_idx or 0
        task = (
            agentgym_task(data_idx)
            if dialect.task_field == "data_idx"
            else _task_by_number(catalog, data_idx, tuple(catalog.splits()))
        )
        observation, info = await start(session, task.task_id)
        response = {
            "observation": observation,
            "info": info,
            "task_id": task.task_id,
            "reward": 0.0,
            "score": info["score"],
            "done": False,
        }
        return response | _env_fields(session.env, "reset")

    @router.post("/step")
    async def step(body: CompatStep) -> dict[str, Any]:
        """Play one action; ``done`` is terminated or truncated."""
        action = catalog.validate_action(body.action)  # before the engine thread: 400, session intact
        session = session_for(body.session)
        observation, reward, terminated, truncated, info = await sessions.call(session, "step", action)
        response = {
            "observation": observation,
            "reward": reward,
            "score": info["score"],
            "done": terminated or truncated,
            "info": info,
        }
        return response | dialect.step_fields(observation) | _env_fields(session.env, "step")

    @router.get("/observation")
    async def observation(id: int | None = Query(None), env_idx: int | None = Query(None)) -> str:
        """The last observation of session ``env_idx`` (or ``id``)."""
        return session_for(_either(id, env_idx)).env.last_observation

    @router.get("/available_actions")
    async def available_actions(id: int | None = Query(None), env_idx: int | None = Query(None)) -> Any:
        """The actions valid now in session ``env_idx`` (or ``id``), in this env's dialect."""
        session = session_for(_either(id, env_idx))
        actions = await sessions.call(session, "available_actions") or []
        return dialect.available_actions(actions)

    @router.post("/close")
    async def close(body: _CompatBody) -> Any:
        """Close session ``env_idx`` (or ``id``) and free its engine."""
        await sessions.close(session_for(body.session).session_id)
        return dialect.close(body.session)

    for route, method in dialect.getters.items():
        add_getter(router, route, method, session_for, sessions)
    return router


def add_getter(
    router: APIRouter, route: str, method: str, session_for: Any, sessions: SessionManager
) -> None:
    """``GET /<route>?id=N``: the env's ``method()`` in that session (a dialect's extra route)."""

    async def getter(id: int | None = Query(None), env_idx: int | None = Query(None)) -> Any:
        return await sessions.call(session_for(_either(id, env_idx)), method)

    router.add_api_route(
        f"/{route}", getter, methods=["GET"], summary=f"AgentGym's /{route}: the env's {method}()"
    )


def _either(id_: int | None, env_idx: int | None) -> int:
    """``env_idx`` when given, else ``id`` (see the module docstring)."""
    if env_idx is not None:
        return env_idx
    if id_ is None:
        raise SchemaError("query parameter 'env_idx' (or 'id') is required")
    return id_


def _env_fields(env: TextEnv, route: str) -> dict[str, Any]:
    """The env's own compat response fields for ``route`` (none unless it defines them)."""
    fields = getattr(env, "compat_fields", None)
    return fields(route) if fields else {}


def _task_by_number(catalog: TextEnv, number: int, splits: tuple[str, ...]) -> Task:
    """Task ``number`` counting through ``splits`` one after the other."""
    sizes = catalog.splits()
    remaining = number
    for split in splits:
        count = sizes.get(split, 0)
        if remaining < count:
            return catalog.task_at(split, remaining)
        remaining -= count
    total = sum(sizes.get(split, 0) for split in splits)
    raise UnknownTask(f"task index {number} is out of range ({total} tasks: {', '.join(splits)})")
