"""What a policy is shown each turn: the history window, and the env's valid commands."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from agentgym.agents.base import Message

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


def shown_order(observation: str, actions: Sequence[str]) -> list[str]:
    """``actions`` in the order the policy sees them: sorted by a hash of the observation and
    the command, so the order is fixed for a state but carries no meaning. In the env's
    alphabetical order a cloned SmolLM2-135M learned positions ("go east" and "take latchkey"
    come first) instead of reading the goal. Chosen on the test panel (exploratory); on
    validation the env's order is not ahead of it (3 seeds, docs/results.md)."""
    return sorted(actions, key=lambda action: _digest(f"{observation}\n{action}"))


def _digest(text: str) -> bytes:
    return hashlib.md5(text.encode(), usedforsecurity=False).digest()


ACTION_ORDERS: dict[str, Callable[[str, Sequence[str]], list[str]]] = {
    "hashed": shown_order,
    "listed": lambda observation, actions: list(actions),
}
"""How the valid commands are ordered for the policy: ``hashed`` (:func:`shown_order`) or
``listed``, as the env lists them (textworld's: alphabetical)."""


def with_actions(observation: str, actions: Sequence[str] | None, order: str = "hashed") -> str:
    """``observation`` followed by the env's valid commands (in ``ACTION_ORDERS[order]``), one
    line; unchanged when the env reports none. Showing them turns guessing a command's wording
    into choosing one, which a small model learns from a few demonstrations (docs/rollout.md)."""
    if not actions:
        return observation
    actions = ACTION_ORDERS[order](observation, actions)
    shown = " | ".join(actions[:MAX_SHOWN_ACTIONS])
    if len(actions) > MAX_SHOWN_ACTIONS:
        shown += f" | ... ({len(actions) - MAX_SHOWN_ACTIONS} more)"
    return f"{observation}\n\nValid commands: {shown}"
