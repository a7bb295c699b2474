"""AgentGym-compatible routes, so existing AgentGym clients work unchanged.

AgentGym's servers differ per environment; an env picks its dialect with the class
attribute ``compat_dialect``:

* ``sciworld``: ``/create`` answers ``{"id": N}``; requests carry ``id``.
* ``webshop``: ``/create`` answers a bare integer; requests carry ``env_idx``.
* ``generic`` (envs AgentGym never had): ``/create`` answers ``{"id": N}``; requests may
  carry ``id`` or ``env_idx``.

Every dialect accepts both id fields, so a client of one never trips on the other.
``/reset``'s ``data_idx`` indexes all tasks, split after split in ``/metadata`` order,
unless the env maps it itself with ``compat_task_id(data_idx) -> task_id`` (to match the
numbering of AgentGym's server). An env may also add or override response fields of
``/reset`` and ``/step`` with ``compat_fields(route) -> dict`` (e.g. AgentGym's score scale).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictStr

from agentgym.core import Task, TextEnv
from agentgym.errors import SchemaError, UnknownTask
from agentgym.servers.sessions import Session, SessionManager


class _CompatBody(BaseModel):
    model_config = ConfigDict(extra="ignore")  # AgentGym clients send extra keys freely
    id: int = Field(validation_alias=AliasChoices("id", "env_idx"))


class CompatStep(_CompatBody):
    action: StrictStr


class CompatReset(_CompatBody):
    data_idx: int = Field(0, ge=0)


CREATE_RESPONSES = {
    "generic": lambda compat_id: {"id": compat_id},
    "sciworld": lambda compat_id: {"id": compat_id},
    "webshop": lambda compat_id: compat_id,
}


def compat_router(catalog: TextEnv, sessions: SessionManager) -> APIRouter:
    router = APIRouter(tags=["agentgym-compat"])
    dialect = getattr(catalog, "compat_dialect", "generic")
    create_response = CREATE_RESPONSES[dialect]

    def session_for(compat_id: int) -> Session:
        return sessions.get_compat(compat_id)

    @router.post("/create")
    async def create() -> Any:
        """Open a session with no episode yet; answers its integer id in this env's dialect."""
        session = await sessions.open()
        return create_response(session.compat_id)

    @router.post("/reset")
    async def reset(body: CompatReset) -> dict[str, Any]:
        """Start task number ``data_idx`` (all splits in /metadata order) in session ``id``."""
        session = session_for(body.id)
        task = _task_by_data_idx(catalog, body.data_idx)
        observation, info = await sessions.call(
            session, session.env.reset, task_id=task.task_id, deadline=sessions.reset_deadline
        )
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
        session = session_for(body.id)
        observation, reward, terminated, truncated, info = await sessions.call(
            session, session.env.step, action
        )
        response = {
            "observation": observation,
            "reward": reward,
            "score": info["score"],
            "done": terminated or truncated,
            "info": info,
        }
        return response | _env_fields(session.env, "step")

    @router.get("/observation")
    async def observation(id: int | None = Query(None), env_idx: int | None = Query(None)) -> str:
        """The last observation of session ``id`` (or ``env_idx``)."""
        return session_for(_either(id, env_idx)).env.last_observation

    @router.get("/available_actions")
    async def available_actions(id: int | None = Query(None), env_idx: int | None = Query(None)) -> list[str]:
        """The actions valid now in session ``id`` (or ``env_idx``)."""
        session = session_for(_either(id, env_idx))
        return await sessions.call(session, lambda: session.env.available_actions() or [])

    @router.post("/close")
    async def close(body: _CompatBody) -> dict[str, Any]:
        """Close session ``id`` and free its engine."""
        await sessions.close(session_for(body.id).session_id)
        return {"closed": True, "id": body.id}

    return router


def _either(id_: int | None, env_idx: int | None) -> int:
    if id_ is None and env_idx is None:
        raise SchemaError("query parameter 'id' (or 'env_idx') is required")
    return id_ if id_ is not None else env_idx  # type: ignore[return-value]


def _env_fields(env: TextEnv, route: str) -> dict[str, Any]:
    """The env's own compat response fields for ``route`` (none unless it defines them)."""
    fields = getattr(env, "compat_fields", None)
    return fields(route) if fields else {}


def _task_by_data_idx(catalog: TextEnv, data_idx: int) -> Task:
    if hasattr(catalog, "compat_task_id"):
        return catalog.task(catalog.compat_task_id(data_idx))
    remaining = data_idx
    for split, count in catalog.splits().items():
        if remaining < count:
            return catalog.task_at(split, remaining)
        remaining -= count
    raise UnknownTask(f"data_idx {data_idx} is out of range ({sum(catalog.splits().values())} tasks)")
