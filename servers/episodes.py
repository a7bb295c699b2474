"""Episode operations shared by wire API v1 and the OpenEnv protocol (one rule set, two shapes)."""

from __future__ import annotations

from typing import Any

from agentgym.core import TextEnv
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
