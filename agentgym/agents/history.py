"""What a policy is shown each turn: the history window, and the env's valid commands."""

from __future__ import annotations

from collections.abc import Sequence

from agentgym.policies.base import Message

MAX_SHOWN_ACTIONS = 48
"""Longer command lists (ScienceWorld's run to thousands) are cut, saying how many are left out."""


def window(messages: list[Message], history_turns: int | None) -> list[Message]:
    """Keep the system prompt, the first observation and the last ``history_turns`` turns
    (a turn = the agent's reply and the observation that answered it); ``None`` keeps
    everything. ``messages`` must start ``[system, first observation]`` and alternate after."""
    if history_turns is None:
        return list(messages)
    head, turns = messages[:2], messages[2:]
    if history_turns <= 0:
        return head
    return head + turns[max(0, len(turns) - 2 * history_turns) :]


def with_actions(observation: str, actions: Sequence[str] | None) -> str:
    """``observation`` followed by the env's valid commands, one line; unchanged when the env
    reports none. Showing them turns guessing a command's wording into choosing one, which a
    small model learns from a few demonstrations (docs/rollout.md)."""
    if not actions:
        return observation
    shown = " | ".join(actions[:MAX_SHOWN_ACTIONS])
    if len(actions) > MAX_SHOWN_ACTIONS:
        shown += f" | ... ({len(actions) - MAX_SHOWN_ACTIONS} more)"
    return f"{observation}\n\nValid commands: {shown}"
