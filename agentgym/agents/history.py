"""The history window: which messages a text-level policy is shown each turn."""

from __future__ import annotations

from agentgym.policies.base import Message


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
