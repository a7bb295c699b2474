"""AgentGym dialects: what AgentGym's own server of an env answers, route by route.

AgentGym runs one server per environment and they differ. An env that AgentGym also
served declares that server's dialect as its class attribute ``compat_dialect`` (a
:class:`Dialect`, kept in its own folder); every other env speaks :data:`GENERIC`. The
routes that speak it are ``agentgym.servers.compat``. This module sits at the env
contract's level, so an env folder can declare its dialect without importing a server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def wrapped_id(compat_id: int) -> dict[str, int]:
    """``/create``'s ``{"id": N}``."""
    return {"id": compat_id}


def bare_id(compat_id: int) -> int:
    """``/create``'s bare ``N``."""
    return compat_id


def closed_object(compat_id: int) -> dict[str, Any]:
    return {"closed": True, "id": compat_id}


def closed_true(compat_id: int) -> bool:
    return True


def no_step_fields(observation: str) -> dict[str, Any]:
    return {}


def action_list(actions: list[str]) -> list[str]:
    return actions


@dataclass(frozen=True)
class Dialect:
    """What AgentGym's server of one env answers, route by route."""

    create: Callable[[int], Any] = wrapped_id
    """``/create``'s answer for a new session's integer id."""
    task_field: str = "data_idx"
    """The ``/reset`` field that carries AgentGym's task index."""
    task_order: tuple[str, ...] = ()
    """AgentGym's numbering of that index, unless the env has ``compat_task_id``: these
    splits one after the other (empty: all splits in ``/metadata`` order)."""
    native_reset: Callable[[str], Any] | None = None
    """AgentGym's ``/reset`` answer from the new observation, for requests in AgentGym's
    form (``env_idx``, no ``data_idx``); ``None``: our reset object for every request."""
    step_fields: Callable[[str], dict[str, Any]] = no_step_fields
    """Fields AgentGym's ``/step`` answers beyond ours, from the observation."""
    available_actions: Callable[[list[str]], Any] = action_list
    close: Callable[[int], Any] = closed_object
    create_loads_task: bool = False
    """``/create {"id": k}`` loads task ``k`` (AgentGym's SearchQA server does)."""
    create_starts: Callable[[int, str], Any] | None = None
    """AgentGym's server starts an episode at ``/create`` (task 0 in its numbering, unless
    ``create_loads_task`` and the body names one) and answers from the new id and that
    episode's first observation; ``None``: ``/create`` answers ``create(id)``."""
    getters: dict[str, str] = field(default_factory=dict)
    """Extra ``GET /<route>?id=N`` routes AgentGym's server has: route -> the name of an
    env method (no arguments, JSON-able answer) that answers it for that session."""


GENERIC = Dialect()
"""Envs AgentGym never had (textworld, math, choice): ``{"id": N}``, either id field."""
