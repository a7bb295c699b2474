"""Agent formats: how a model phrases its replies and how the action is read from them.

``get_format("react")`` (the default), ``"json"`` or ``"plain"``; see ``docs/rollout.md``.
"""

from __future__ import annotations

from agentgym.agents.base import AgentFormat, ParsedReply
from agentgym.agents.formats import JsonCallFormat, PlainFormat, ReActFormat
from agentgym.agents.history import ACTION_ORDERS, shown_order, window, with_actions

FORMATS: dict[str, type[AgentFormat]] = {cls.name: cls for cls in (ReActFormat, JsonCallFormat, PlainFormat)}
DEFAULT_FORMAT = "react"


def get_format(name: str) -> AgentFormat:
    """The format registered as ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"unknown agent format {name!r}; formats are {sorted(FORMATS)}") from None


__all__ = [
    "ACTION_ORDERS",
    "DEFAULT_FORMAT",
    "FORMATS",
    "AgentFormat",
    "JsonCallFormat",
    "ParsedReply",
    "PlainFormat",
    "ReActFormat",
    "get_format",
    "shown_order",
    "window",
    "with_actions",
]
