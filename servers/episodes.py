"""Episode operations shared by wire API v1, the OpenEnv protocol and MCP (one rule set,
several shapes)."""

from __future__ import annotations

import contextlib
from typing import Any

from agentgym.contract.core import TextEnv, resolve_split
from agentgym.contract.errors import AgentGymError, UnknownTask
from agentgym.servers.metrics import ServerMetrics
from agentgym.servers.sessions import Session, SessionManager
from agentgym.wire import CreateSessionRequest, ResetRequest


def reset_kwargs(catalog: TextEnv, body: CreateSessionRequest | ResetRequest | None) -> dict[str, Any]:
    """Map a create/reset body onto ``TextEnv.reset`` keyword arguments, its options
    checked by the env's rules (SchemaError, 422) so no engine sees a bad one."""
    if body is None:
        return {}
    options = catalog.check_options(body.options)
    if body.split is not None:
        options["split"] = body.split
    if body.index is not None:
        options["index"] = body.index
    return {"task_id": body.task_id, "seed": body.seed, "options": options}


async def play_step(
    sessions: SessionManager, metrics: ServerMetrics, session: Session, action: str
) -> dict[str, Any]:
    """Play one already-validated action in ``session``; v1's step result as a dict."""
    observation, reward, terminated, truncated, info = await sessions.call(session, "step", action)
    if terminated or truncated:
        metrics.episode_finished(terminated, bool(info.get("success")))
    return {
        "observation": observation,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "info": info,
    }


def task_page(catalog: TextEnv, split: str | None, offset: int, limit: int) -> dict[str, Any]:
    """v1's ``GET /tasks`` body: the tasks of one split or all (split after split), paged."""
    splits = catalog.splits()
    split = None if split is None else resolve_split(split, splits)  # dev: validation
    if split is not None and split not in splits:
        raise UnknownTask(f"unknown split {split!r}; splits are {sorted(splits)}")
    chosen = [t for s in ([split] if split else splits) for t in catalog.tasks(s)]
    return {"tasks": [t.to_dict() for t in chosen[offset : offset + limit]], "total": len(chosen)}


async def start_session(
    sessions: SessionManager, kwargs: dict[str, Any], *, client: str | None, owner: str | None = None
) -> tuple[Session, str, dict[str, Any]]:
    """Open a session and reset it with ``kwargs``: (session, observation, info). A reset
    that fails closes the session again, so a bad task costs no slot."""
    session = await sessions.open(client=client, owner=owner)
    try:
        observation, info = await sessions.call(session, "reset", deadline=sessions.reset_deadline, **kwargs)
    except BaseException:
        with contextlib.suppress(AgentGymError):
            await sessions.close(session.session_id, owner)
        raise
    return session, observation, info
